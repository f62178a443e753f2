//! `libbenchfs_preload.so`: loaded with `LD_PRELOAD`, it serves every path under a prefix
//! (`BENCHFS_PRELOAD_PREFIX`, else the mount point `benchfs start` exports as
//! `BENCHFS_MOUNT`, else `/benchfs`) from BenchFS through the core client, in the calling
//! process, and passes every other call on to libc untouched. docs/preload.md lists what is
//! intercepted.
//!
//! How it fits together:
//! - [`variadic`]: `open`, `openat`, `fcntl` and `ioctl`, whose C declarations are variadic;
//!   everything else is defined with libc's signature where its call is handled.
//! - [`real`]: the next definition of each function (libc's), for calls that are not ours.
//! - [`fds`]: descriptor numbers of BenchFS files, each reserved with a real `O_PATH`
//!   descriptor, so a call that bypasses this library (a raw system call, io_uring) fails
//!   with EBADF and never touches another file.
//! - [`files`], [`names`], [`dirs`], [`stdio`]: the calls on descriptors, on paths, on
//!   directory streams and on `FILE` streams.
//! - [`offsets`]: file offsets in shared memory, so processes sharing a description share
//!   its offset; [`process`]: exit, fork, and the hand-over of descriptors across `execve`.
//!
//! A thread inside BenchFS (connecting, talking to servers) may make calls of its own (UCX
//! opening its sockets, reading configuration files); those always go to libc.

// The safety contracts of the exported functions are those of the libc functions they stand
// in for.
#![allow(clippy::missing_safety_doc)]

mod dirs;
mod fds;
mod files;
mod locks;
mod maps;
mod names;
mod offsets;
mod paths;
mod process;
mod real;
mod stdio;
mod temp;
mod variadic;

use std::cell::Cell;
use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use benchfs_core::config;
use benchfs_core::posix;
use benchfs_core::shared::{ClientPool, Lease};
use benchfs_core::Error;

use crate::paths::Prefix;

/// Clients one process may have (each its own UCX worker): threads beyond it wait their turn.
const MAX_CLIENTS: usize = 8;

/// Where the clients' own descriptors start: above what shells and programs pick by number
/// (`exec 3>file`, bash's saved descriptors from 10, its script at 255), within half the
/// descriptor limit.
pub(crate) fn fd_floor() -> i32 {
    // SAFETY: all-zero is a valid rlimit; getrlimit fills it.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out pointer.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur
    } else {
        1024
    };
    (soft / 2).min(256) as i32
}

pub(crate) fn set_errno(e: c_int) {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = e };
}

thread_local! {
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

/// Set when this library's constructor runs. The initialisers that run before it (the
/// libraries it loads, UCX's among them) are not the program's calls: UCX reads `./ucx.conf`
/// in its constructor, and with the working directory inside BenchFS that read set up a
/// client (connecting to every server) in every process started there, `seq` included.
static LOADED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub(crate) fn mark_loaded() {
    LOADED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// True while this thread is inside BenchFS (or its thread-local state is gone), or before
/// this library's constructor ran: every call then goes to libc.
pub(crate) fn busy() -> bool {
    !LOADED.load(std::sync::atomic::Ordering::Relaxed) || BUSY.try_with(Cell::get).unwrap_or(true)
}

/// Marks this thread busy until dropped.
pub(crate) struct Inside(bool);

pub(crate) fn inside() -> Inside {
    Inside(BUSY.try_with(|b| b.replace(true)).unwrap_or(true))
}

impl Drop for Inside {
    fn drop(&mut self) {
        let _ = BUSY.try_with(|b| b.set(self.0));
    }
}

/// One line on stderr, written with libc's `write` (stderr may itself be a BenchFS file).
pub(crate) fn say(message: &str) {
    let line = format!("benchfs-preload: {message}\n");
    // SAFETY: a valid buffer of its length.
    let _ = unsafe { real::write(2, line.as_ptr().cast(), line.len()) };
}

/// The prefix, from the environment at the first call that needs it; None when the
/// environment names an unusable one (said once; nothing is intercepted then).
pub(crate) fn prefix() -> Option<&'static Prefix> {
    static PREFIX: OnceLock<Option<Prefix>> = OnceLock::new();
    PREFIX
        .get_or_init(|| {
            let raw = std::env::var("BENCHFS_PRELOAD_PREFIX")
                .ok()
                .filter(|p| !p.is_empty())
                .or_else(|| std::env::var("BENCHFS_MOUNT").ok().filter(|p| !p.is_empty()))
                .unwrap_or_else(|| "/benchfs".into());
            match Prefix::new(&raw) {
                Ok(p) => Some(p),
                Err(e) => {
                    say(&format!("{e}; BenchFS paths are not intercepted"));
                    None
                }
            }
        })
        .as_ref()
}

/// The clients of this process, set up at the first BenchFS call; the reason when the
/// configuration cannot be used.
static POOL: OnceLock<Result<Arc<ClientPool>, String>> = OnceLock::new();

fn pool() -> Result<&'static Arc<ClientPool>, c_int> {
    let made = POOL.get_or_init(|| {
        let _inside = inside();
        process::setup();
        let file = std::env::var_os("BENCHFS_CONFIG")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        let mut config =
            config::resolve(file.as_deref(), &config::process_env(), &[]).map_err(|e| e.to_string())?;
        // Each write is answered before it returns: programs end with `_exit` (dash, a
        // vforked child), which no exit handler sees, and start children that read what they
        // wrote before it was closed (`system`, shells); neither may lose a write behind.
        config.client.write_behind = 0;
        // As for the C library and the mount: BENCHFS_REGISTRY (their argument), else the
        // configuration's (an effective configuration file ignores BENCHFS_* variables).
        let registry = std::env::var("BENCHFS_REGISTRY")
            .ok()
            .filter(|r| !r.is_empty())
            .unwrap_or_else(|| config.cluster.registry_dir.clone());
        if registry.is_empty() {
            return Err(
                "no cluster: set BENCHFS_REGISTRY (or cluster.registry_dir in BENCHFS_CONFIG)".into(),
            );
        }
        let registry = PathBuf::from(registry);
        Ok(ClientPool::with_fd_floor(
            registry,
            config,
            MAX_CLIENTS,
            fd_floor(),
        ))
    });
    match made {
        Ok(pool) => Ok(pool),
        Err(e) => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| say(&format!("{e}; calls on BenchFS paths fail with ENOTCONN")));
            Err(libc::ENOTCONN)
        }
    }
}

/// A failure of a BenchFS call: its errno, said on stderr when it is not an ordinary answer
/// about a path (a server lost, a timeout).
pub(crate) fn errno_of(op: &str, path: &str, e: &Error) -> c_int {
    let code = e.errno();
    if !posix::is_path_answer(code) {
        say(&format!("{op} {path}: {e}"));
    }
    if code > 0 {
        code
    } else {
        libc::EIO
    }
}

thread_local! {
    /// Set when this thread's thread-local state is being destroyed (at thread exit, and for
    /// the main thread when the process exits, before exit handlers and stdio's last flush).
    static GONE: Cell<bool> = const { Cell::new(false) };
    /// Touched after each call on a client: its destructor is registered after the client
    /// event loop's thread-locals, so it runs before theirs are destroyed and sets GONE.
    static SENTINEL: Sentinel = const { Sentinel };
}

struct Sentinel;

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = GONE.try_with(|g| g.set(true));
    }
}

/// Runs `f` here, or on a short-lived thread of its own once this thread's thread-local
/// state is gone (a program's exit handler writing a last line to a BenchFS file).
fn on_live_thread<R: Send>(f: impl FnOnce() -> Result<R, c_int> + Send) -> Result<R, c_int> {
    if !GONE.try_with(Cell::get).unwrap_or(true) {
        let r = f();
        let _ = SENTINEL.try_with(|_| ());
        return r;
    }
    std::thread::scope(|s| {
        match std::thread::Builder::new()
            .name("benchfs-late".into())
            .spawn_scoped(s, f)
        {
            Ok(t) => t.join().unwrap_or(Err(libc::EIO)),
            Err(_) => Err(libc::EAGAIN),
        }
    })
}

/// Runs `f` with a client leased from `pool`, this thread marked busy; errors become
/// errnos (and a line on stderr when they are not ordinary answers about a path).
pub(crate) fn leased<R: Send>(
    pool: &Arc<ClientPool>,
    op: &str,
    path: &str,
    f: impl FnOnce(&benchfs_core::client::Client) -> Result<R, Error> + Send,
) -> Result<R, c_int> {
    let mut outside = None;
    let r = on_live_thread(|| {
        let _inside = inside();
        let lease: Lease = pool.lease().map_err(|e| errno_of(op, path, &e))?;
        let client = lease.client().map_err(|e| errno_of(op, path, &e))?;
        f(client).map_err(|e| {
            if let Error::LinkOutside { host, .. } = &e {
                outside = Some(host.clone());
            }
            errno_of(op, path, &e)
        })
    });
    if let Some(host) = outside {
        names::set_outside(host);
    }
    r
}

/// [`leased`] from this process's pool.
pub(crate) fn with_client<R: Send>(
    op: &str,
    path: &str,
    f: impl FnOnce(&benchfs_core::client::Client) -> Result<R, Error> + Send,
) -> Result<R, c_int> {
    leased(pool()?, op, path, f)
}

/// The pool, for files that keep it.
pub(crate) fn the_pool() -> Result<Arc<ClientPool>, c_int> {
    pool().cloned()
}

/// The process's umask as the `umask` wrapper last set it; `u32::MAX` until first read.
pub(crate) static UMASK: AtomicU32 = AtomicU32::new(u32::MAX);

/// The process's umask (read once from the kernel, then kept by the `umask` wrapper).
pub(crate) fn current_umask() -> u32 {
    let m = UMASK.load(Ordering::Relaxed);
    if m != u32::MAX {
        return m;
    }
    // SAFETY: umask cannot fail; set back at once (a race with another thread's umask is
    // the caller's, as with any umask read).
    let old = unsafe {
        let old = real::umask(0o022);
        real::umask(old);
        old
    };
    UMASK.store(old, Ordering::Relaxed);
    old
}

/// Runs one exported call: a panic is EIO (never unwinds into C), `Err(errno)` sets errno
/// and returns `fail`.
pub(crate) fn entry<R: Copy>(fail: R, f: impl FnOnce() -> Result<R, c_int>) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_errno(e);
            fail
        }
        Err(_) => {
            say("internal error (a panic); answered EIO");
            set_errno(libc::EIO);
            fail
        }
    }
}
