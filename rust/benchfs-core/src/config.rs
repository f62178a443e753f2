//! The one configuration of BenchFS. Defaults live here and nowhere else; the daemon, the client
//! and the Python tools all resolve it through [`resolve`]:
//! built-in defaults < TOML file < `BENCHFS_*` environment variables < explicit overrides.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::size::parse_size;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub cluster: ClusterConfig,
    pub layout: LayoutConfig,
    pub client: ClientConfig,
    pub server: ServerConfig,
    pub storage: StorageConfig,
    pub network: NetworkConfig,
    pub telemetry: TelemetryConfig,
    pub run: RunConfig,
    pub diagnose: DiagnoseConfig,
    pub insights: InsightsConfig,
}

/// Membership: where servers register and how many a client waits for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// Directory where servers publish their addresses (one per job).
    pub registry_dir: String,
    /// Servers a client waits for before starting; 0 means "not set".
    pub expected_servers: u32,
    /// How long a client waits for the expected membership.
    pub connect_timeout_s: f64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            registry_dir: String::new(),
            expected_servers: 0,
            connect_timeout_s: 30.0,
        }
    }
}

/// How files are laid out over the servers: decided by the servers, and returned to clients
/// with each file's layout (a client's own value has no effect).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LayoutConfig {
    /// Bytes per chunk; a file's byte range is split on these boundaries.
    pub chunk_size: u64,
}

impl Default for LayoutConfig {
    fn default() -> Self {
        LayoutConfig { chunk_size: 4 << 20 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientConfig {
    /// Chunk requests one client keeps in flight at most.
    pub max_inflight: u32,
    /// Requests one client keeps in flight to any one server worker at most.
    pub max_inflight_per_server: u32,
    /// Time after which a request counts as failed.
    pub request_timeout_s: f64,
    /// Retries of an idempotent request (read, fsync, truncate, stat, readdir, directory entry
    /// removal) after a timeout; writes are never retried after a timeout (a late original
    /// could land after a newer write).
    pub max_retries: u32,
    /// First retry delay; doubles per retry, with full jitter.
    pub retry_backoff_ms: u64,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            max_inflight: 16,
            max_inflight_per_server: 8,
            request_timeout_s: 30.0,
            max_retries: 2,
            retry_backoff_ms: 50,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Event-loop threads per server, each with its own io_uring and UCX worker.
    pub workers: u32,
    /// Requests served at once per worker (a fixed set of service tasks, never a spawn per
    /// request).
    pub max_in_service: u32,
    /// Requests waiting beyond those; further requests are refused with EAGAIN.
    pub max_queued: u32,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            workers: 1,
            max_in_service: 32,
            max_queued: 1024,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// Page-aligned buffers of `layout.chunk_size` bytes per server worker (the memory bound).
    pub buffer_count: u32,
    /// io_uring submission queue entries per server worker.
    pub ring_entries: u32,
    /// On-disk layout: one file per chunk, or chunks packed in large files.
    pub layout: DiskLayout,
    /// O_DIRECT for writes (bypass the page cache); unaligned heads and tails handled.
    pub direct_write: bool,
    /// O_DIRECT for reads.
    pub direct_read: bool,
    /// Open chunk files kept per worker (bounded handle cache).
    pub handle_cache: u32,
    /// When queued device operations are submitted.
    pub submit_policy: SubmitPolicy,
    /// With submit_policy = "timer": hold SQEs until this much time passed since the last submit.
    pub submit_timer_us: u64,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            buffer_count: 32,
            ring_entries: 256,
            layout: DiskLayout::Chunkfile,
            // Measured here (docs/storage.md): direct writes 1093 vs buffered 279 MiB/s once
            // writeback throttles; buffered sequential reads 1590 vs direct 1207 MiB/s.
            direct_write: true,
            direct_read: false,
            handle_cache: 512,
            submit_policy: SubmitPolicy::Immediate,
            submit_timer_us: 50_000,
        }
    }
}

/// `storage.layout`: how chunks are kept on a server's device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskLayout {
    /// One file per chunk.
    Chunkfile,
    /// Chunks in large preallocated files.
    Packed,
}

/// `storage.submit_policy`: when queued device operations are submitted to io_uring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SubmitPolicy {
    /// Every turn of the event loop (the default).
    Immediate,
    /// Held until `submit_timer_us` passed since the last submit: a timer-gated design kept
    /// only to reproduce its measurements.
    Timer,
}

/// The UCX transport.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkConfig {
    /// UCX transports (`UCX_TLS` syntax, e.g. "tcp", "shm,self"); empty: UCX chooses.
    pub transports: String,
    /// Payload size from which UCX uses rendezvous (zero-copy into the receiver's buffer);
    /// 0: UCX's own threshold.
    pub rndv_threshold: u64,
    /// Detect failed peers so their requests fail instead of hanging until the timeout. UCX
    /// 1.13's shared-memory transports cannot do this, so `false` is needed to use them.
    pub peer_error_handling: bool,
    /// Microseconds an event loop keeps polling after activity before it sleeps in the
    /// kernel (a wake-up costs tens of microseconds); 0 never spins. Idle loops never spin.
    pub spin_us: u64,
    /// UCX's newer protocol selection (`UCX_PROTO_ENABLE`). Off: UCX 1.22 then moves BenchFS's
    /// chunks as fast as 1.13 did; on, 4 MiB transfers over TCP ran at 0.6x (docs/bench.md).
    pub ucx_proto_v2: bool,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            transports: String::new(),
            rndv_threshold: 0,
            peer_error_handling: true,
            spin_us: 50,
            ucx_proto_v2: false,
        }
    }
}

impl NetworkConfig {
    /// The UCX settings this section asks for.
    pub fn worker_options(&self) -> benchfs_ucx::WorkerOptions {
        benchfs_ucx::WorkerOptions {
            transports: (!self.transports.is_empty()).then(|| self.transports.clone()),
            rndv_threshold: (self.rndv_threshold > 0).then_some(self.rndv_threshold),
            proto_v2: self.ucx_proto_v2,
            serialized: false,
        }
    }
}

/// Always-on counters and histograms, and where servers write their snapshots.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// Record histograms and counters (off only to measure their overhead).
    pub enabled: bool,
    /// Directory for snapshot files; empty means keep counters in memory only.
    pub dir: String,
    /// Snapshot period in milliseconds (100 to 60000).
    pub interval_ms: u64,
    /// Per-operation trace records on servers (`<dir>/server-<id>-w<worker>.trace`).
    pub trace: bool,
    /// Trace records buffered per server worker between two snapshots (more are dropped and
    /// counted): the bound on the trace's memory, 72 bytes each.
    pub trace_records: u64,
}

/// Upper bound of `telemetry.trace_records` (16 Mi records = 1.2 GiB per worker).
pub const MAX_TRACE_RECORDS: u64 = 1 << 24;

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            enabled: true,
            dir: String::new(),
            interval_ms: 1000,
            trace: false,
            trace_records: 65536,
        }
    }
}

/// Defaults for `benchfs-run` (read by the Python launcher).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    pub servers: u32,
    pub clients: u32,
    /// Bytes each client writes and reads back.
    pub file_size: u64,
    pub transfer_size: u64,
    pub results_root: String,
    /// Node-local scratch directory; empty means a fresh directory under /tmp per run.
    pub scratch_dir: String,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            servers: 2,
            clients: 2,
            file_size: 64 << 20,
            transfer_size: 1 << 20,
            results_root: "results".into(),
            scratch_dir: String::new(),
        }
    }
}

/// Thresholds and durations of `benchfs-diagnose` (read by the Python tool; docs/diagnose.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DiagnoseConfig {
    /// Seconds of the workload-shaped probe (many files, random 1-4 MiB reads).
    pub workload_seconds: f64,
    /// Its seconds with `--quick`; the short probes run a quarter of the workload probe's time.
    pub quick_seconds: f64,
    /// Wall-time budget of a whole screen; probes still running then are stopped.
    pub budget_s: f64,
    /// Modified z-score (MAD based) above which a node is an outlier on a metric.
    pub z_threshold: f64,
    /// ... and it must also be at least this much worse than the median (0.2 = 20%).
    pub min_worse: f64,
    /// Smallest spread assumed (relative), so that equal nodes (MAD = 0) flag no noise.
    pub min_spread: f64,
    /// With two nodes: flag the worse one when it is this many times worse than the other.
    pub two_node_ratio: f64,
    /// When half the nodes are slow: flag the worse group when it is this many times worse.
    pub group_ratio: f64,
    /// Device read latency (iostat r_await, ms) that flags a node whatever its peers do.
    pub r_await_ms: f64,
    /// Relative r_await flags need at least this latency (ms), to ignore fast-device noise.
    pub r_await_floor_ms: f64,
    /// A member device this many times slower (r_await) than its twin is flagged.
    pub member_ratio: f64,
    /// Application latency this many times the device's r_await means slow above the device.
    pub above_device_ratio: f64,
    /// Largest share of the nodes a screen excludes (the worst first).
    pub max_exclude_share: f64,
    /// In-run judgment: a node's latency rose when its level after a change point is this
    /// many times the level before.
    pub rise_ratio: f64,
}

impl Default for DiagnoseConfig {
    fn default() -> Self {
        DiagnoseConfig {
            workload_seconds: 60.0,
            quick_seconds: 10.0,
            budget_s: 900.0,
            z_threshold: 3.5,
            min_worse: 0.2,
            min_spread: 0.05,
            two_node_ratio: 2.0,
            group_ratio: 2.0,
            r_await_ms: 20.0,
            r_await_floor_ms: 2.0,
            member_ratio: 5.0,
            above_device_ratio: 4.0,
            max_exclude_share: 0.25,
            rise_ratio: 2.0,
        }
    }
}

/// Thresholds of the coded insights of `benchfs-analyze` (read by the Python tool;
/// docs/analysis.md names the insight each key belongs to).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InsightsConfig {
    /// An operation slower than this (server op time, ms) is a slow operation (the seeds: 100).
    pub slow_op_ms: f64,
    /// Operations a server (or the run) needs before a distribution-based insight may fire.
    pub min_ops: u64,
    /// BFS-001: share of data submissions at device depth 1 that means starvation...
    pub depth1_share: f64,
    /// ... while requests waited at least this many times the mean device time to be submitted.
    pub starvation_queue_ratio: f64,
    /// BFS-002: mean SQEs per io_uring_enter at or below this ...
    pub batch_mean_max: f64,
    /// ... while the device had at least this mean depth: one enter per SQE under load.
    pub batch_depth_min: f64,
    /// BFS-003: a node whose percentage of slow operations exceeds the other nodes' median by
    /// at least this many points is slow ...
    pub slow_node_pct: f64,
    /// ... and so is one whose mean op time is this many times the other nodes' median.
    pub slow_node_factor: f64,
    /// BFS-004: a member device this many times slower (iostat await) than its node's fastest ...
    pub device_await_ratio: f64,
    /// ... and at least this slow (ms), to ignore noise on fast devices.
    pub device_await_min_ms: f64,
    /// BFS-005: bytes on the busiest server over the mean across servers.
    pub placement_max_mean: f64,
    /// BFS-006: retries per request (client telemetry).
    pub retry_rate: f64,
    /// BFS-007: buffer-pool waits per data operation.
    pub pool_wait_share: f64,
    /// BFS-008: a node's mean read time over its mean write time (or the reverse).
    pub read_write_ratio: f64,
    /// BFS-009: writes of at most this many bytes on average are small ...
    pub small_write_bytes: u64,
    /// ... and fsyncs per write at or above this amplify them.
    pub fsync_per_write: f64,
    /// BFS-010: handle-cache misses per lookup.
    pub handle_miss_share: f64,
    /// Op-time distributions: share a range needs to count as a mode (bimodality flag).
    pub bimodal_mode_share: f64,
}

impl Default for InsightsConfig {
    fn default() -> Self {
        InsightsConfig {
            slow_op_ms: 100.0,
            min_ops: 200,
            depth1_share: 0.9,
            starvation_queue_ratio: 1.0,
            batch_mean_max: 1.2,
            batch_depth_min: 4.0,
            slow_node_pct: 10.0,
            slow_node_factor: 3.0,
            device_await_ratio: 5.0,
            device_await_min_ms: 5.0,
            placement_max_mean: 1.5,
            retry_rate: 0.01,
            pool_wait_share: 0.1,
            read_write_ratio: 5.0,
            small_write_bytes: 65536,
            fsync_per_write: 0.25,
            handle_miss_share: 0.9,
            bimodal_mode_share: 0.1,
        }
    }
}

impl InsightsConfig {
    /// Every threshold must be a number above zero (shares at most 1).
    fn validate(&self) -> Result<()> {
        let positive = [
            ("slow_op_ms", self.slow_op_ms),
            ("starvation_queue_ratio", self.starvation_queue_ratio),
            ("batch_mean_max", self.batch_mean_max),
            ("batch_depth_min", self.batch_depth_min),
            ("slow_node_pct", self.slow_node_pct),
            ("slow_node_factor", self.slow_node_factor),
            ("device_await_ratio", self.device_await_ratio),
            ("device_await_min_ms", self.device_await_min_ms),
            ("placement_max_mean", self.placement_max_mean),
            ("read_write_ratio", self.read_write_ratio),
            ("fsync_per_write", self.fsync_per_write),
        ];
        for (key, value) in positive {
            if value.is_nan() || value <= 0.0 {
                return Err(Error::Config(format!("insights.{key} must be positive")));
            }
        }
        let shares = [
            ("depth1_share", self.depth1_share),
            ("retry_rate", self.retry_rate),
            ("pool_wait_share", self.pool_wait_share),
            ("handle_miss_share", self.handle_miss_share),
            ("bimodal_mode_share", self.bimodal_mode_share),
        ];
        for (key, value) in shares {
            if value.is_nan() || value <= 0.0 || value > 1.0 {
                return Err(Error::Config(format!(
                    "insights.{key} must be above 0 and at most 1"
                )));
            }
        }
        Ok(())
    }
}

/// Environment variables with short names, kept for the launch scripts' convenience.
const ENV_ALIASES: &[(&str, &str)] = &[
    ("BENCHFS_REGISTRY", "cluster.registry_dir"),
    ("BENCHFS_EXPECTED_SERVERS", "cluster.expected_servers"),
    ("BENCHFS_RESULTS", "run.results_root"),
];

/// Names the configuration file when no path is given.
pub const CONFIG_ENV: &str = "BENCHFS_CONFIG";

impl Config {
    /// Checks the relations between keys that types alone do not express.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::Config(m.to_string()));
        if self.layout.chunk_size == 0 || self.layout.chunk_size > (1 << 30) {
            return bad("layout.chunk_size must be between 1 byte and 1 GiB");
        }
        if self.client.max_inflight == 0 || self.client.max_inflight_per_server == 0 {
            return bad("client.max_inflight and client.max_inflight_per_server must be at least 1");
        }
        if self.client.max_retries > 10 {
            return bad("client.max_retries must be at most 10");
        }
        if self.network.spin_us > 10_000 {
            return bad("network.spin_us must be at most 10000");
        }
        if self.network.transports.contains(char::is_whitespace) {
            return bad("network.transports is a comma-separated list without spaces");
        }
        if self.client.request_timeout_s.is_nan() || self.client.request_timeout_s <= 0.0 {
            return bad("client.request_timeout_s must be positive");
        }
        if self.cluster.connect_timeout_s.is_nan() || self.cluster.connect_timeout_s < 0.0 {
            return bad("cluster.connect_timeout_s must not be negative");
        }
        if self.server.max_in_service == 0 {
            return bad("server.max_in_service must be at least 1");
        }
        if self.server.workers == 0 || self.server.workers > 64 {
            return bad("server.workers must be between 1 and 64");
        }
        if self.storage.handle_cache == 0 {
            return bad("storage.handle_cache must be at least 1");
        }
        if !(100..=60_000).contains(&self.telemetry.interval_ms) {
            return bad("telemetry.interval_ms must be between 100 and 60000");
        }
        if !(1..=MAX_TRACE_RECORDS).contains(&self.telemetry.trace_records) {
            return bad("telemetry.trace_records must be between 1 and 16777216");
        }
        if self.telemetry.trace && !self.telemetry.enabled {
            return bad("telemetry.trace needs telemetry.enabled = true");
        }
        if self.storage.buffer_count == 0 {
            return bad("storage.buffer_count must be at least 1");
        }
        if !self.storage.ring_entries.is_power_of_two() || self.storage.ring_entries > 32768 {
            return bad("storage.ring_entries must be a power of two up to 32768");
        }
        if self.run.transfer_size == 0 {
            return bad("run.transfer_size must be at least 1");
        }
        let d = &self.diagnose;
        let positive = [
            ("workload_seconds", d.workload_seconds),
            ("quick_seconds", d.quick_seconds),
            ("budget_s", d.budget_s),
            ("z_threshold", d.z_threshold),
            ("min_spread", d.min_spread),
            ("r_await_ms", d.r_await_ms),
            ("above_device_ratio", d.above_device_ratio),
        ];
        for (key, value) in positive {
            if value.is_nan() || value <= 0.0 {
                return Err(Error::Config(format!("diagnose.{key} must be positive")));
            }
        }
        let ratios = [
            ("two_node_ratio", d.two_node_ratio),
            ("group_ratio", d.group_ratio),
            ("member_ratio", d.member_ratio),
            ("rise_ratio", d.rise_ratio),
        ];
        for (key, value) in ratios {
            if value.is_nan() || value <= 1.0 {
                return Err(Error::Config(format!("diagnose.{key} must be greater than 1")));
            }
        }
        if d.min_worse.is_nan()
            || d.min_worse < 0.0
            || d.r_await_floor_ms.is_nan()
            || d.r_await_floor_ms < 0.0
        {
            return bad("diagnose.min_worse and diagnose.r_await_floor_ms must not be negative");
        }
        if d.max_exclude_share.is_nan() || !(0.0..=1.0).contains(&d.max_exclude_share) {
            return bad("diagnose.max_exclude_share must be between 0 and 1");
        }
        self.insights.validate()?;
        Ok(())
    }

    /// The effective configuration as TOML (what goes into every results directory), headed
    /// by [`EFFECTIVE_HEADER`]: read back, it is taken as it is, without the environment.
    pub fn to_toml(&self) -> String {
        match toml::to_string(self) {
            Ok(body) => format!("{EFFECTIVE_HEADER}\n{body}"),
            Err(e) => format!("# cannot serialise config: {e}\n"),
        }
    }

    /// Parses a complete or partial TOML text over the defaults, without env or overrides
    /// (an effective configuration: what `to_toml` wrote, or what a client was handed).
    pub fn from_toml(text: &str) -> Result<Config> {
        let mut r = Resolver::new()?;
        let file: toml::Table =
            toml::from_str(text).map_err(|e| Error::Config(format!("malformed TOML: {e}")))?;
        r.merge_table(file, "configuration text")?;
        r.finish()
    }
}

/// First line of an effective configuration ([`Config::to_toml`]). A file that starts with it
/// is complete and already has every layer applied, so [`resolve`] does not apply the
/// `BENCHFS_*` variables over it again (only explicit overrides): every process a run starts
/// with it runs exactly what the run recorded.
pub const EFFECTIVE_HEADER: &str =
    "# BenchFS effective configuration: complete; BENCHFS_* variables are not applied over it \
     (delete this line to use it as a base)";

/// Keys whose values are byte sizes: integers, or strings such as "4M" ([`parse_size`]).
pub const SIZE_KEYS: &[&str] = &[
    "layout.chunk_size",
    "network.rndv_threshold",
    "run.file_size",
    "run.transfer_size",
    "insights.small_write_bytes",
];

/// Old names still accepted, each with a one-line notice: (old, new).
const RENAMED: &[(&str, &str)] = &[("client.chunk_size", "layout.chunk_size")];

/// Each renamed key's notice is printed once per process.
static NOTICED: Mutex<Vec<&str>> = Mutex::new(Vec::new());

/// The current name of `name`, telling the user once if it is an old one.
fn current_name(name: &str, origin: &str) -> String {
    let Some(&(old, new)) = RENAMED.iter().find(|(old, _)| *old == name) else {
        return name.to_string();
    };
    let mut noticed = NOTICED.lock().unwrap_or_else(PoisonError::into_inner);
    if !noticed.contains(&old) {
        noticed.push(old);
        eprintln!("benchfs: {old} (from {origin}) is now called {new}; the old name will go");
    }
    new.to_string()
}

/// Builds one configuration: the defaults' table, each value merged over it with where it came
/// from, so every error names the key, its value and its source.
struct Resolver {
    table: toml::Table,
    /// "section.key" -> the source of its value (a file, a variable, "override").
    origins: BTreeMap<String, String>,
}

impl Resolver {
    fn new() -> Result<Resolver> {
        let table = toml::Table::try_from(Config::default())
            .map_err(|e| Error::Config(format!("cannot build defaults: {e}")))?;
        Ok(Resolver {
            table,
            origins: BTreeMap::new(),
        })
    }

    /// Merges a parsed file (`origin` names it): sections and keys must exist in the defaults.
    fn merge_table(&mut self, over: toml::Table, origin: &str) -> Result<()> {
        for (section, value) in over {
            let toml::Value::Table(keys) = value else {
                return Err(Error::Config(format!(
                    "{section} must be a table [{section}] (from {origin})"
                )));
            };
            for (key, value) in keys {
                self.set(&format!("{section}.{key}"), value, origin)?;
            }
        }
        Ok(())
    }

    /// Sets "section.key" from a string typed as people type it (a variable or an override):
    /// a string key takes it as is, any other key parses it as a TOML value.
    fn set_str(&mut self, name: &str, raw: &str, origin: &str) -> Result<()> {
        let name = current_name(name, origin);
        let value = match self.slot(&name, origin)? {
            toml::Value::String(_) => toml::Value::String(raw.to_string()),
            _ if SIZE_KEYS.contains(&name.as_str()) => toml::Value::String(raw.to_string()),
            _ => {
                let doc: toml::Table = toml::from_str(&format!("v = {raw}")).map_err(|_| {
                    Error::Config(format!("{name} = {raw:?} (from {origin}) is not a valid value"))
                })?;
                doc.get("v")
                    .cloned()
                    .ok_or_else(|| Error::Config(format!("{name}: empty value (from {origin})")))?
            }
        };
        self.set(&name, value, origin)
    }

    fn slot(&mut self, name: &str, origin: &str) -> Result<&mut toml::Value> {
        let unknown = || Error::Config(format!("unknown key {name} (from {origin})"));
        let (section, key) = name.split_once('.').ok_or_else(unknown)?;
        self.table
            .get_mut(section)
            .and_then(toml::Value::as_table_mut)
            .and_then(|s| s.get_mut(key))
            .ok_or_else(unknown)
    }

    /// Sets "section.key" to `value`, converted to the default's type: integers where floats
    /// are expected, size strings for [`SIZE_KEYS`]; anything else of another type, a negative
    /// number for an unsigned key or a bad size is refused, naming the key and its source.
    fn set(&mut self, name: &str, value: toml::Value, origin: &str) -> Result<()> {
        use toml::Value as V;
        let name = current_name(name, origin);
        let is_size = SIZE_KEYS.contains(&name.as_str());
        let slot = self.slot(&name, origin)?;
        let bad = |why: String| Error::Config(format!("{name} = {value} (from {origin}): {why}"));
        let typed = match (&*slot, &value) {
            (V::Integer(_), V::String(text)) if is_size => {
                let bytes = parse_size(text).map_err(bad)?;
                V::Integer(i64::try_from(bytes).map_err(|_| bad("too large".into()))?)
            }
            (V::Integer(_), V::Integer(i)) if *i < 0 => {
                return Err(bad("must not be negative".into()));
            }
            (V::Float(_), V::Integer(i)) => V::Float(*i as f64),
            (d, v) if std::mem::discriminant(d) == std::mem::discriminant(v) => value.clone(),
            (d, v) => {
                let sizes = if is_size { " or a size such as \"4M\"" } else { "" };
                return Err(bad(format!(
                    "must be {}{sizes}, not {}",
                    d.type_str(),
                    v.type_str()
                )));
            }
        };
        *slot = typed;
        self.origins.insert(name, origin.to_string());
        Ok(())
    }

    /// The typed configuration, checked: a value serde refuses (out of range, not one of an
    /// enum's names) is reported with its key and source.
    fn finish(self) -> Result<Config> {
        let Resolver { table, origins } = self;
        let origin = |name: &str| origins.get(name).map_or("the defaults", String::as_str);
        let config: Config = serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
            let name = e.path().to_string();
            let why = plain(e.inner().message());
            Error::Config(format!("{name} (from {}): {why}", origin(&name)))
        })?;
        // A relation or range check names its key first: add where that key's value came from.
        config.validate().map_err(|e| match e {
            Error::Config(m) => {
                let key = m.split_whitespace().next().unwrap_or_default();
                match origins.get(key) {
                    Some(from) => Error::Config(format!("{m} (from {from})")),
                    None => Error::Config(m),
                }
            }
            other => other,
        })?;
        Ok(config)
    }
}

/// serde's words for the two refusals left after [`Resolver::set`] in a user's words:
/// "unknown variant `x`, expected `a` or `b`" and "invalid value: integer `n`, expected u32".
fn plain(message: &str) -> String {
    if let Some(rest) = message.strip_prefix("unknown variant ") {
        if let Some((value, allowed)) = rest.split_once(", expected ") {
            let allowed = allowed.replace(" or ", ", ").replace("one of ", "");
            return format!("{value} is not one of {allowed}");
        }
    }
    if let Some(rest) = message.strip_prefix("invalid value: integer ") {
        if let Some((value, kind)) = rest.split_once(", expected ") {
            let max = match kind {
                "u32" => u64::from(u32::MAX),
                _ => u64::MAX,
            };
            return format!("{value} is too large (at most {max})");
        }
    }
    message.to_string()
}

/// Resolves the configuration: defaults < file (`path`, else `$BENCHFS_CONFIG`) < `BENCHFS_*`
/// variables from `env` < `overrides` (`section.key=value`). The variables are skipped for an
/// effective configuration file ([`EFFECTIVE_HEADER`]).
pub fn resolve(path: Option<&Path>, env: &BTreeMap<String, String>, overrides: &[String]) -> Result<Config> {
    let mut r = Resolver::new()?;
    let env_path = env.get(CONFIG_ENV).filter(|p| !p.is_empty()).map(Path::new);
    let mut effective = false;
    if let Some(file) = path.or(env_path) {
        let text = std::fs::read_to_string(file)
            .map_err(|e| Error::io(format!("configuration file {}", file.display()), e))?;
        let over: toml::Table = toml::from_str(&text)
            .map_err(|e| Error::Config(format!("{}: malformed TOML: {e}", file.display())))?;
        r.merge_table(over, &file.display().to_string())?;
        effective = text.starts_with(EFFECTIVE_HEADER);
    }
    if !effective {
        r.apply_env(env)?;
    }
    r.apply_overrides(overrides)?;
    r.finish()
}

/// An effective configuration's text with `overrides` applied (no environment): for facts
/// only known after resolving, such as a run's directories and shape.
pub fn with_overrides(effective: &str, overrides: &[String]) -> Result<Config> {
    let mut r = Resolver::new()?;
    let over: toml::Table =
        toml::from_str(effective).map_err(|e| Error::Config(format!("malformed TOML: {e}")))?;
    r.merge_table(over, "configuration text")?;
    r.apply_overrides(overrides)?;
    r.finish()
}

impl Resolver {
    fn apply_env(&mut self, env: &BTreeMap<String, String>) -> Result<()> {
        // Generic variables: BENCHFS_<SECTION>_<KEY> for every key the defaults have, and the
        // renamed keys' old names.
        let mut names: Vec<String> = self
            .table
            .iter()
            .filter_map(|(s, v)| v.as_table().map(|t| (s, t)))
            .flat_map(|(s, t)| t.keys().map(move |k| format!("{s}.{k}")))
            .collect();
        names.extend(RENAMED.iter().map(|(old, _)| old.to_string()));
        for name in &names {
            let var = format!("BENCHFS_{}", name.replace('.', "_").to_uppercase());
            if let Some(raw) = env.get(&var) {
                self.set_str(name, raw, &var)?;
            }
        }
        for (var, name) in ENV_ALIASES {
            if let Some(raw) = env.get(*var) {
                self.set_str(name, raw, var)?;
            }
        }
        Ok(())
    }

    fn apply_overrides(&mut self, overrides: &[String]) -> Result<()> {
        for item in overrides {
            let (name, raw) = item
                .split_once('=')
                .filter(|(name, _)| name.contains('.'))
                .ok_or_else(|| Error::Config(format!("override {item:?} is not section.key=value")))?;
            self.set_str(name.trim(), raw.trim(), "override")?;
        }
        Ok(())
    }
}

/// The process environment's `BENCHFS_*` variables.
pub fn process_env() -> BTreeMap<String, String> {
    std::env::vars()
        .filter(|(k, _)| k.starts_with("BENCHFS_"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn precedence_defaults_file_env_override() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "[layout]\nchunk_size = 65536\n[client]\nmax_inflight = 4\n",
        )
        .map_err(|e| Error::io("write", e))?;
        let c = resolve(Some(&file), &env(&[]), &[])?;
        assert_eq!(c.layout.chunk_size, 65536);
        assert_eq!(c.client.request_timeout_s, 30.0);
        let c = resolve(Some(&file), &env(&[("BENCHFS_CLIENT_MAX_INFLIGHT", "8")]), &[])?;
        assert_eq!(c.client.max_inflight, 8);
        let c = resolve(
            Some(&file),
            &env(&[("BENCHFS_CLIENT_MAX_INFLIGHT", "8"), ("BENCHFS_REGISTRY", "/r")]),
            &["client.max_inflight=2".into()],
        )?;
        assert_eq!(c.client.max_inflight, 2);
        assert_eq!(c.cluster.registry_dir, "/r");
        Ok(())
    }

    #[test]
    fn sizes_as_people_write_them() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "[layout]\nchunk_size = \"1MiB\"\n[run]\nfile_size = \"2G\"\n",
        )
        .map_err(|e| Error::io("write", e))?;
        let c = resolve(Some(&file), &env(&[("BENCHFS_RUN_TRANSFER_SIZE", "64k")]), &[])?;
        assert_eq!((c.layout.chunk_size, c.run.file_size), (1 << 20, 2 << 30));
        assert_eq!(c.run.transfer_size, 64 << 10);
        let c = resolve(
            None,
            &env(&[]),
            &["layout.chunk_size=1M".into(), "run.file_size=4096".into()],
        )?;
        assert_eq!((c.layout.chunk_size, c.run.file_size), (1 << 20, 4096));
        // The old name still works, from every source.
        let c = resolve(None, &env(&[("BENCHFS_CLIENT_CHUNK_SIZE", "2M")]), &[])?;
        assert_eq!(c.layout.chunk_size, 2 << 20);
        let c = resolve(None, &env(&[]), &["client.chunk_size=1M".into()])?;
        assert_eq!(c.layout.chunk_size, 1 << 20);
        assert_eq!(
            Config::from_toml("[client]\nchunk_size = \"8M\"\n")?
                .layout
                .chunk_size,
            8 << 20
        );
        // The effective text has plain numbers and the enums' names.
        let text = c.to_toml();
        assert!(text.contains("chunk_size = 1048576") && text.contains("layout = \"chunkfile\""));
        Ok(())
    }

    #[test]
    fn bad_input_is_a_clear_error() {
        let e = |r: Result<Config>| r.err().map(|e| e.to_string()).unwrap_or_default();
        let over = |o: &str| e(resolve(None, &env(&[]), &[o.to_string()]));
        assert!(e(Config::from_toml("[client]\nchunk_sise = 1\n")).contains("unknown key client.chunk_sise"));
        assert!(
            e(Config::from_toml("[client]\nmax_inflight = \"big\"\n")).contains(
                "client.max_inflight = \"big\" (from configuration text): must be integer, not string"
            )
        );
        assert!(e(Config::from_toml("[layout]\nchunk_size = \"big\"\n"))
            .contains("layout.chunk_size = \"big\" (from configuration text): expected a whole number"));
        assert!(over("client.max_inflight=1.5").contains("client.max_inflight"));
        assert!(e(Config::from_toml("[client\n")).contains("malformed TOML"));
        assert!(e(Config::from_toml("[layout]\nchunk_size = 0\n"))
            .contains("layout.chunk_size must be between 1 byte and 1 GiB (from configuration text)"));
        assert!(over("layout.chunk_size=2G").contains("between 1 byte and 1 GiB (from override)"));
        assert!(e(resolve(
            None,
            &env(&[("BENCHFS_CLIENT_MAX_INFLIGHT", "x y")]),
            &[]
        ))
        .contains("BENCHFS_CLIENT_MAX_INFLIGHT"));
        assert!(over("nosuch.key=1").contains("unknown key nosuch.key (from override)"));
        assert!(over("nokey=1").contains("is not section.key=value"));
        assert!(e(resolve(Some(Path::new("/nonexistent/c.toml")), &env(&[]), &[]))
            .contains("configuration file /nonexistent/c.toml"));
        // Negative values, bad suffixes and enum names: the key, the value and the source.
        assert_eq!(
            over("client.max_inflight=-5"),
            "invalid configuration: client.max_inflight = -5 (from override): must not be negative"
        );
        assert!(
            e(resolve(None, &env(&[("BENCHFS_LAYOUT_CHUNK_SIZE", "-5")]), &[])).contains(
                "layout.chunk_size = \"-5\" (from BENCHFS_LAYOUT_CHUNK_SIZE): a size must not be negative"
            )
        );
        assert!(over("layout.chunk_size=1X")
            .contains("layout.chunk_size = \"1X\" (from override): unknown suffix"));
        assert!(e(Config::from_toml("[run]\nfile_size = -1\n"))
            .contains("run.file_size = -1 (from configuration text): must not be negative"));
        assert_eq!(
            over("storage.layout=striped"),
            "invalid configuration: storage.layout (from override): `striped` is not one of \
             `chunkfile`, `packed`"
        );
        assert!(over("storage.submit_policy=later").contains("`later` is not one of `immediate`, `timer`"));
        assert!(over("client.max_inflight=5000000000")
            .contains("client.max_inflight (from override): `5000000000` is too large (at most 4294967295)"));
        assert!(over("client=1").contains("is not section.key=value"));
    }

    #[test]
    fn effective_config_round_trips() -> Result<()> {
        let c = resolve(
            None,
            &env(&[]),
            &["layout.chunk_size=1024".into(), "storage.layout=packed".into()],
        )?;
        assert_eq!(Config::from_toml(&c.to_toml())?, c);
        Ok(())
    }

    #[test]
    fn an_effective_file_is_read_without_the_environment() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let file = dir.path().join("config.toml");
        let recorded = resolve(None, &env(&[]), &["client.max_inflight=3".into()])?;
        std::fs::write(&file, recorded.to_toml()).map_err(|e| Error::io("write", e))?;
        let vars = env(&[("BENCHFS_CLIENT_MAX_INFLIGHT", "9"), ("BENCHFS_RUN_SERVERS", "7")]);
        assert_eq!(resolve(Some(&file), &vars, &[])?, recorded);
        let over = resolve(Some(&file), &vars, &["run.servers=5".into()])?;
        assert_eq!((over.client.max_inflight, over.run.servers), (3, 5));
        // A plain file (the header deleted) is a base again.
        let text = recorded.to_toml().replacen(EFFECTIVE_HEADER, "", 1);
        std::fs::write(&file, text).map_err(|e| Error::io("write", e))?;
        assert_eq!(resolve(Some(&file), &vars, &[])?.client.max_inflight, 9);
        let later = with_overrides(&recorded.to_toml(), &["run.clients=4".into()])?;
        assert_eq!((later.client.max_inflight, later.run.clients), (3, 4));
        Ok(())
    }

    #[test]
    fn size_keys_are_integer_keys() -> Result<()> {
        let r = Resolver::new()?;
        for name in SIZE_KEYS {
            let (s, k) = name.split_once('.').unwrap_or_default();
            assert!(r.table[s][k].is_integer(), "{name}");
        }
        Ok(())
    }
}
