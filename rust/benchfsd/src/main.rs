//! `benchfsd`: one BenchFS chunk server. Registers in the registry directory once it serves,
//! removes its entry and exits 0 on SIGTERM, SIGINT or SIGUSR1 (SIGUSR1 because srun forwards
//! it to its tasks, while a SIGTERM to srun kills the job step outright).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};
use signal_hook::iterator::Signals;

use benchfs_core::config;
use benchfs_core::server::{serve, ServerOptions};

#[derive(Parser, Debug)]
#[command(name = "benchfsd", version, about = "BenchFS chunk server")]
struct Args {
    /// Registry directory (default: cluster.registry_dir, $BENCHFS_REGISTRY).
    #[arg(long)]
    registry: Option<PathBuf>,
    /// Directory for this server's chunks.
    #[arg(long)]
    data_dir: PathBuf,
    /// Numeric server id, unique in the job.
    #[arg(long)]
    id: u32,
    /// Configuration file (default: $BENCHFS_CONFIG).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Node name recorded in the registry (default: $BENCHFS_NODE_NAME, else the host name).
    #[arg(long)]
    node: Option<String>,
    /// Failure domain recorded in the registry (default: $BENCHFS_DOMAIN, else the node name):
    /// copies of a chunk go to servers of distinct domains.
    #[arg(long)]
    domain: Option<String>,
    /// Override a configuration key: section.key=value (repeatable).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    overrides: Vec<String>,
    /// A benchmark's server: allows `storage.layout = "discard"`, which keeps no byte written
    /// (to measure the protocol alone; `benchfs-bench rpc` uses it). Refused without this.
    #[arg(long)]
    benchmark: bool,
}

fn run(args: Args) -> Result<(), String> {
    let config = config::resolve(args.config.as_deref(), &config::process_env(), &args.overrides)
        .map_err(|e| e.to_string())?;
    if config.storage.layout == config::DiskLayout::Discard && !args.benchmark {
        return Err(
            "storage.layout = \"discard\" keeps no byte written: it is for benchmarks of the protocol, started with --benchmark"
                .into(),
        );
    }
    let registry_dir = args
        .registry
        .or_else(|| {
            (!config.cluster.registry_dir.is_empty()).then(|| config.cluster.registry_dir.clone().into())
        })
        .ok_or("no registry directory: pass --registry or set BENCHFS_REGISTRY")?;
    let node = args
        .node
        .or_else(|| std::env::var("BENCHFS_NODE_NAME").ok())
        .unwrap_or_default();
    let mut signals = Signals::new([SIGTERM, SIGINT, SIGUSR1])
        .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let id = args.id;
    let opts = ServerOptions {
        id,
        node,
        domain: args
            .domain
            .or_else(|| std::env::var("BENCHFS_DOMAIN").ok())
            .unwrap_or_default(),
        data_dir: args.data_dir,
        registry_dir,
        config,
    };
    let stats = serve(opts, move |entry, stopper| {
        benchfs_core::warn_line!(
            "benchfsd: server {} serving on node {:?} (pid {}, {} workers)",
            entry.id,
            entry.node,
            entry.pid,
            entry.ucx_addresses.len()
        );
        std::thread::spawn(move || {
            if let Some(sig) = signals.forever().next() {
                benchfs_core::warn_line!("benchfsd: signal {sig}, stopping");
                stopper.stop();
            }
        });
    })
    .map_err(|e| e.to_string())?;
    benchfs_core::warn_line!("benchfsd: server {id} stopped: {stats:?}");
    Ok(())
}

fn main() -> ExitCode {
    benchfs_core::process::allow_core_dumps();
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            benchfs_core::warn_line!("benchfsd: error: {e}");
            ExitCode::FAILURE
        }
    }
}
