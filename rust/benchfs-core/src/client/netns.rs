//! `BENCHFS_NETNS`: the network namespace a client connects from. The MPI ranks of a node made
//! by `benchfs-run nodes --netns` start outside it (their launcher's own connections live in
//! the host's namespace) and enter it here, after MPI is up and before BenchFS makes a socket.
//! Like `BENCHFS_NODE_NAME` it says where a process runs, so it is not a configuration key.
//! `setns` moves only the calling thread, so every place that makes UCX sockets (a worker, an
//! endpoint) enters first: a client may move between threads.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Moves the calling thread into the namespace `$BENCHFS_NETNS` (a name under /run/netns, or
/// a path); nothing when it is unset or empty.
pub(super) fn enter() -> Result<()> {
    let name = std::env::var("BENCHFS_NETNS").unwrap_or_default();
    if name.is_empty() {
        return Ok(());
    }
    let path = if name.contains('/') {
        PathBuf::from(&name)
    } else {
        Path::new("/run/netns").join(&name)
    };
    let bad = |what: &str, e: std::io::Error| {
        Error::Config(format!("BENCHFS_NETNS={name:?}: {what} {}: {e}", path.display()))
    };
    let file = File::open(&path).map_err(|e| bad("cannot open", e))?;
    // Already there (a process started inside the node's network, as a burst buffer's
    // staging, which may not have the right to call setns): nothing to do.
    let here = std::fs::metadata("/proc/thread-self/ns/net")
        .map_err(|e| bad("cannot read this thread's namespace for", e))?;
    let there = file.metadata().map_err(|e| bad("cannot read", e))?;
    if (here.dev(), here.ino()) == (there.dev(), there.ino()) {
        return Ok(());
    }
    // SAFETY: a descriptor this function owns; the call changes only this thread's namespace.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(bad("cannot enter", std::io::Error::last_os_error()));
    }
    Ok(())
}
