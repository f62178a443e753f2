//! `benchfs-mount`: mounts a running BenchFS cluster at a directory with FUSE, so that
//! unmodified POSIX programs (fio, IOR's POSIX backend, cp, Python's open) can use it. Runs in
//! the foreground; SIGTERM or SIGINT unmounts and exits 0. See docs/mount.md.

mod fs;
mod locks;
mod table;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use fuser::{MountOption, Session, SessionUnmounter};
use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};
use signal_hook::iterator::Signals;

use benchfs_core::config;

/// How long the session may take to end after the unmount before the process exits anyway
/// (exiting closes /dev/fuse, which aborts a lazily detached mount's remaining requests).
const END_GRACE: Duration = Duration::from_secs(5);

#[derive(Parser, Debug)]
#[command(
    name = "benchfs-mount",
    version,
    about = "Mount a running BenchFS cluster with FUSE"
)]
struct Args {
    /// Registry directory (default: cluster.registry_dir, $BENCHFS_REGISTRY).
    #[arg(long)]
    registry: Option<PathBuf>,
    /// Configuration file (default: $BENCHFS_CONFIG).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Override a configuration key: section.key=value (repeatable).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    overrides: Vec<String>,
    /// Event loop threads, each with its own connection: requests served in parallel.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=256))]
    threads: u16,
    /// Show every file as owned by UID:GID, and let that user in (with the kernel checking
    /// permission bits): a mount made by root for another user, as a burst buffer's.
    #[arg(long, value_name = "UID:GID", value_parser = parse_owner)]
    owner: Option<(u32, u32)>,
    /// An existing, empty directory that is not a mount point yet.
    mountpoint: PathBuf,
}

fn parse_owner(text: &str) -> Result<(u32, u32), String> {
    let (uid, gid) = text.split_once(':').ok_or("expected UID:GID, e.g. 1000:1000")?;
    let number = |s: &str| {
        s.parse::<u32>()
            .map_err(|_| format!("{s:?} is not a numeric id (UID:GID)"))
    };
    Ok((number(uid)?, number(gid)?))
}

enum Event {
    Signal(i32),
    Ended(std::io::Result<()>),
}

/// Decodes the octal escapes (`\040` for a space) of /proc/self/mountinfo fields.
fn unescape(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        if let Some(d) = octal {
            out.push(
                d.iter()
                    .fold(0u8, |v, c| v.wrapping_mul(8).wrapping_add(c - b'0')),
            );
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// The file system type mounted at `path` according to `mountinfo`, if any.
fn mounted_in(mountinfo: &str, path: &Path) -> Option<String> {
    let want = path.as_os_str().as_bytes();
    mountinfo.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let sep = fields.iter().position(|f| *f == "-")?;
        let point = fields.get(4)?;
        (unescape(point) == want).then(|| fields.get(sep + 1).map_or_else(String::new, |s| s.to_string()))
    })
}

fn mounted_at(path: &Path) -> Result<Option<String>, String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    Ok(mounted_in(&text, path))
}

/// Refuses a mount point that is missing, not a directory, or already mounted (the kernel
/// would stack a second mount on it silently). Mountinfo is checked before touching the path,
/// so a dead mount gives this message rather than a hang or ENOTCONN.
fn check_mountpoint(path: &Path) -> Result<PathBuf, String> {
    let abs = std::path::absolute(path).map_err(|e| format!("bad mountpoint {}: {e}", path.display()))?;
    let busy = |p: &Path, fstype: String| {
        format!(
            "mountpoint {} is busy: already a mount point ({fstype}); unmount it first (fusermount3 -u {})",
            p.display(),
            p.display()
        )
    };
    if let Some(fstype) = mounted_at(&abs)? {
        return Err(busy(&abs, fstype));
    }
    let meta = std::fs::metadata(&abs).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("mountpoint {} does not exist", abs.display()),
        _ => format!("cannot use mountpoint {}: {e}", abs.display()),
    })?;
    if !meta.is_dir() {
        return Err(format!("mountpoint {} is not a directory", abs.display()));
    }
    let canon = std::fs::canonicalize(&abs)
        .map_err(|e| format!("cannot resolve mountpoint {}: {e}", abs.display()))?;
    if canon != abs {
        if let Some(fstype) = mounted_at(&canon)? {
            return Err(busy(&canon, fstype));
        }
    }
    Ok(canon)
}

/// Unmounts; if a process still uses the mount (EBUSY), detaches it lazily instead.
fn unmount(unmounter: &mut SessionUnmounter, mountpoint: &Path) {
    let Err(e) = unmounter.unmount() else { return };
    let lazy = CString::new(mountpoint.as_os_str().as_bytes())
        .ok()
        // SAFETY: a valid NUL-terminated path; umount2 reads it only during the call.
        .is_some_and(|c| unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0);
    if lazy {
        benchfs_core::warn_line!(
            "benchfs-mount: {} was busy ({e}); detached it lazily",
            mountpoint.display()
        );
        return;
    }
    // Not root: the setuid helper can detach lazily too.
    let helper = std::process::Command::new("fusermount3")
        .arg("-uz")
        .arg(mountpoint)
        .status();
    if !helper.is_ok_and(|s| s.success()) {
        benchfs_core::warn_line!("benchfs-mount: cannot unmount {}: {e}", mountpoint.display());
    }
}

fn run(args: Args) -> Result<(), String> {
    let mut config = config::resolve(args.config.as_deref(), &config::process_env(), &args.overrides)
        .map_err(|e| e.to_string())?;
    // The mount's own write-behind budget: its daemon outlives the programs writing through it.
    config.client.write_behind = config.client.mount_write_behind;
    let registry = args
        .registry
        .or_else(|| {
            (!config.cluster.registry_dir.is_empty()).then(|| config.cluster.registry_dir.clone().into())
        })
        .ok_or("no registry directory: pass --registry or set BENCHFS_REGISTRY")?;
    let mountpoint = check_mountpoint(&args.mountpoint)?;
    let threads = usize::from(args.threads);
    let servers = config.cluster.expected_servers;

    let shared = Arc::new(match args.owner {
        Some((uid, gid)) => fs::Shared::owned_by(uid, gid),
        None => fs::Shared::new(),
    });
    // Connected here first, so that a cluster that cannot be reached fails the mount; kept
    // for the clean-up at the end. Each event loop connects its own at its first request.
    let mut first = fs::Worker::connect(&registry, config.clone(), shared.clone())?;

    // From here on a signal unmounts instead of killing the process (SIGUSR1 too: it is what
    // srun forwards to its tasks).
    let mut signals = Signals::new([SIGTERM, SIGINT, SIGUSR1])
        .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let mut options = fuser::Config::default();
    options.mount_options = vec![
        MountOption::FSName(format!("benchfs:{}", registry.display())),
        MountOption::Subtype("benchfs".into()),
        MountOption::NoAtime,
        MountOption::NoDev,
        MountOption::NoSuid,
    ];
    if args.owner.is_some() {
        // Another user's files: the kernel checks the modes, as for a local file system.
        options.acl = fuser::SessionACL::All;
        options.mount_options.push(MountOption::DefaultPermissions);
    }
    // Each event loop reads with its own descriptor and serves what it read.
    options.n_threads = Some(threads);
    options.clone_fd = true;
    let filesystem = fs::BenchFs::new(shared.clone(), registry.clone(), &config);
    let mut session = Session::new(filesystem, &mountpoint, &options)
        .map_err(|e| format!("cannot mount at {}: {e}", mountpoint.display()))?;
    shared.set_notifier(session.notifier());
    let mut unmounter = session.unmount_callable();
    let (events_tx, events) = mpsc::channel::<Event>();
    let ended = events_tx.clone();
    let runner = std::thread::Builder::new()
        .name("benchfs-fuse".into())
        .spawn(move || {
            let _ = ended.send(Event::Ended(session.run()));
        })
        .map_err(|e| format!("cannot start the FUSE session thread: {e}"))?;
    let signal_thread = signals.handle();
    std::thread::Builder::new()
        .name("benchfs-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                let _ = events_tx.send(Event::Signal(sig));
            }
        })
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;
    benchfs_core::warn_line!(
        "benchfs-mount: mounted {} at {} ({servers} servers, {threads} threads, requests up to {} KiB)",
        registry.display(),
        mountpoint.display(),
        fs::MAX_IO / 1024
    );

    let outcome = match events.recv() {
        Ok(Event::Signal(sig)) => {
            benchfs_core::warn_line!("benchfs-mount: signal {sig}, unmounting {}", mountpoint.display());
            unmount(&mut unmounter, &mountpoint);
            match events.recv_timeout(END_GRACE) {
                Ok(Event::Ended(r)) => r.map_err(|e| format!("FUSE session failed: {e}")),
                _ => {
                    benchfs_core::warn_line!(
                        "benchfs-mount: files are still open in the detached mount; exiting (their requests now fail)"
                    );
                    // Its event loops still use their clients.
                    exit_now(0);
                }
            }
        }
        Ok(Event::Ended(r)) => {
            benchfs_core::warn_line!("benchfs-mount: {} was unmounted", mountpoint.display());
            r.map_err(|e| format!("FUSE session failed: {e}"))
        }
        Err(_) => Err("the FUSE session thread vanished".to_string()),
    };
    signal_thread.close();
    let _ = runner.join();
    benchfs_core::warn_line!(
        "benchfs-mount: served reads: {}; writes: {}",
        shared.reads.summary(),
        shared.writes.summary()
    );
    // Files still open at the unmount were never released: remove their hidden names.
    first.cleanup();
    outcome
}

/// Ends the process without its exit handlers. Threads still inside UCX (the event loops of
/// a detached mount, lock waiters blocked in a wait) would race UCX's destructors, which run
/// at `exit` and free what those threads use.
fn exit_now(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: _exit ends the process at once; no Rust code runs after it.
    unsafe { libc::_exit(code) }
}

fn main() -> ExitCode {
    benchfs_core::process::allow_core_dumps();
    let code = match run(Args::parse()) {
        Ok(()) => 0,
        Err(e) => {
            benchfs_core::warn_line!("benchfs-mount: error: {e}");
            1
        }
    };
    if locks::live_waiters() > 0 {
        exit_now(code);
    }
    ExitCode::from(code as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
98 22 0:50 / /tmp/my\\040mnt rw,nosuid,nodev,relatime shared:60 - fuse.benchfs benchfs:/r rw,user_id=0,group_id=0
";

    #[test]
    fn mountinfo_names_the_mounted_type() {
        assert_eq!(mounted_in(MOUNTINFO, Path::new("/")).as_deref(), Some("ext4"));
        assert_eq!(
            mounted_in(MOUNTINFO, Path::new("/tmp/my mnt")).as_deref(),
            Some("fuse.benchfs")
        );
        assert_eq!(mounted_in(MOUNTINFO, Path::new("/tmp/my")), None);
        assert_eq!(unescape("a\\134b"), b"a\\b");
        assert_eq!(unescape("end\\"), b"end\\");
    }

    #[test]
    fn missing_and_plain_file_mountpoints_are_refused() {
        let missing = check_mountpoint(Path::new("/nonexistent/benchfs-mnt"));
        assert!(missing.is_err_and(|e| e.contains("does not exist")));
        let file = check_mountpoint(Path::new("/proc/self/mountinfo"));
        assert!(file.is_err_and(|e| e.contains("not a directory")));
        let root = check_mountpoint(Path::new("/"));
        assert!(root.is_err_and(|e| e.contains("busy")));
    }
}
