//! fcntl locks through the mount (the kernel's GETLK and SETLK, with FUSE_POSIX_LOCKS): the
//! job's locks (docs/namespace.md, "Locks"), not the node's. A lock request that waits
//! (F_SETLKW) must not hold an event loop for as long as it waits: it is tried once there,
//! and if it conflicts, handed to a small pool of waiter threads, each with a client of its
//! own, which answers the kernel when the lock is granted.
//!
//! The kernel names a lock's owner by a number unique on this node (its `fl_owner`); mixed
//! with this mount's own random number, it is unique in the job. flock's locks stay the
//! kernel's, node-local: fuser does not tell flock requests from fcntl ones.
//!
//! Release: the kernel keeps no record of locks it passes on, so it does not unlock them at
//! close. As FUSE asks, a FLUSH (every close) releases the locks of its owner (a process's
//! record locks) on the file, and a RELEASE (a description's last close) those of every owner
//! that locked through it (OFD locks). Which owners hold locks is kept here, so closes of
//! files nobody locked cost nothing.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use benchfs_core::config::Config;
use benchfs_core::protocol::lock::{new_owner, LockClass, LockCmd, LockRequest, LockType};
use fuser::{Errno, ReplyEmpty};

use crate::fs::{Shared, Worker};

/// Waiter threads at most; a waiting request beyond them is answered ENOLCK.
pub const MAX_WAITERS: usize = 64;

/// How long a closing mount waits for its idle waiters to close their clients.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// Waiter threads alive in this process, each with a UCX client. The process must not exit
/// (UCX's destructors run at exit) while one still uses its client: see [`live_waiters`].
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// Waiter threads still alive; after the session ends, only those blocked in a lock wait.
pub fn live_waiters() -> usize {
    LIVE.load(Ordering::Acquire)
}

/// The kernel's `OFFSET_MAX`: a lock to the end of the file.
const OFFSET_MAX: u64 = i64::MAX as u64;

/// A lock request as the kernel gives it: (owner, start, inclusive end, type, pid).
pub fn request(
    mount: u64,
    owner: u64,
    start: u64,
    end: u64,
    typ: i32,
    pid: u32,
    cmd: LockCmd,
) -> Result<LockRequest, Errno> {
    let kind = match typ {
        libc::F_RDLCK => LockType::Read,
        libc::F_WRLCK => LockType::Write,
        libc::F_UNLCK => LockType::Unlock,
        _ => return Err(Errno::EINVAL),
    };
    Ok(LockRequest {
        owner: owner ^ mount,
        start,
        end: if end >= OFFSET_MAX { u64::MAX } else { end + 1 },
        pid,
        class: LockClass::Fcntl,
        kind,
        cmd,
    })
}

/// A lock as the kernel's GETLK answer wants it: (start, inclusive end, type, pid).
pub fn answer(held: Option<&LockRequest>) -> (u64, u64, i32, u32) {
    match held {
        None => (0, 0, libc::F_UNLCK, 0),
        Some(h) => (
            h.start,
            if h.end == u64::MAX { OFFSET_MAX } else { h.end - 1 },
            if h.kind == LockType::Write {
                libc::F_WRLCK
            } else {
                libc::F_RDLCK
            },
            h.pid,
        ),
    }
}

type Job = (u64, LockRequest, ReplyEmpty);

/// The waiter threads and their queue.
pub struct Waiters {
    /// This mount's number, mixed into every owner.
    pub mount: u64,
    registry: PathBuf,
    config: Config,
    shared: Arc<Shared>,
    queue: Mutex<Sender<Job>>,
    jobs: Arc<Mutex<Receiver<Job>>>,
    threads: AtomicUsize,
    /// Waiter threads waiting for a job; counted down, under its lock, by one that leaves.
    idle: Arc<(Mutex<usize>, Condvar)>,
    /// Owners that took locks, per inode and per open file handle.
    owners: Mutex<Owners>,
}

#[derive(Default)]
struct Owners {
    by_inode: HashMap<u64, HashSet<u64>>,
    by_handle: HashMap<u64, HashSet<u64>>,
}

/// A request releasing every lock of `owner` (already mixed) on a file.
pub fn release(owner: u64) -> LockRequest {
    LockRequest::release(owner, LockClass::Fcntl)
}

impl Waiters {
    pub fn new(registry: PathBuf, config: Config, shared: Arc<Shared>) -> Waiters {
        let (tx, rx) = mpsc::channel();
        Waiters {
            mount: new_owner(),
            registry,
            config,
            shared,
            queue: Mutex::new(tx),
            jobs: Arc::new(Mutex::new(rx)),
            threads: AtomicUsize::new(0),
            idle: Arc::new((Mutex::new(0), Condvar::new())),
            owners: Mutex::new(Owners::default()),
        }
    }

    /// `owner` (mixed) asked for a lock on inode `ino` through handle `fh`.
    pub fn noted(&self, ino: u64, fh: u64, owner: u64) {
        let mut o = self.owners.lock().unwrap_or_else(PoisonError::into_inner);
        o.by_inode.entry(ino).or_default().insert(owner);
        o.by_handle.entry(fh).or_default().insert(owner);
    }

    /// The owners whose locks on `ino` a close must release: `owner` at a FLUSH (given), or
    /// every owner that locked through `fh` at its RELEASE. Forgotten here.
    pub fn to_release(&self, ino: u64, fh: Option<u64>, owner: Option<u64>) -> Vec<u64> {
        let mut o = self.owners.lock().unwrap_or_else(PoisonError::into_inner);
        let candidates: Vec<u64> = match (fh, owner) {
            (_, Some(owner)) => vec![owner],
            (Some(fh), None) => o
                .by_handle
                .remove(&fh)
                .map(|s| s.into_iter().collect())
                .unwrap_or_default(),
            (None, None) => Vec::new(),
        };
        let Some(held) = o.by_inode.get_mut(&ino) else {
            return Vec::new();
        };
        let out: Vec<u64> = candidates.into_iter().filter(|c| held.remove(c)).collect();
        if held.is_empty() {
            o.by_inode.remove(&ino);
        }
        out
    }

    /// Waits for the lock of `req` on inode `ino` on a waiter thread, which answers `reply`.
    pub fn wait(&self, ino: u64, req: LockRequest, reply: ReplyEmpty) {
        if self.idle() == 0 && self.threads.load(Ordering::Acquire) < MAX_WAITERS {
            if let Err(e) = self.spawn() {
                benchfs_core::warn_line!("benchfs-mount: cannot start a lock waiter: {e}");
            }
        }
        if self.idle() == 0 && self.threads.load(Ordering::Acquire) >= MAX_WAITERS {
            return reply.error(Errno::from_i32(libc::ENOLCK));
        }
        let queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        if let Err(mpsc::SendError((_, _, reply))) = queue.send((ino, req, reply)) {
            reply.error(Errno::from_i32(libc::ENOLCK));
        }
    }

    fn idle(&self) -> usize {
        *self.idle.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn spawn(&self) -> std::io::Result<()> {
        let (jobs, idle) = (self.jobs.clone(), self.idle.clone());
        let (registry, config, shared) = (self.registry.clone(), self.config.clone(), self.shared.clone());
        self.threads.fetch_add(1, Ordering::AcqRel);
        LIVE.fetch_add(1, Ordering::AcqRel);
        count(&self.idle, 1);
        std::thread::Builder::new()
            .name("benchfs-lockwait".into())
            .spawn(move || {
                let mut worker = None;
                loop {
                    let job = jobs.lock().unwrap_or_else(PoisonError::into_inner).recv();
                    let Ok((ino, req, reply)) = job else { break };
                    count(&idle, -1);
                    if worker.is_none() {
                        match Worker::connect(&registry, config.clone(), shared.clone()) {
                            Ok(w) => worker = Some(w),
                            Err(e) => {
                                benchfs_core::warn_line!("benchfs-mount: lock waiter: {e}");
                                reply.error(Errno::EIO);
                                count(&idle, 1);
                                continue;
                            }
                        }
                    }
                    if let Some(w) = worker.as_mut() {
                        match w.lock(ino, &req) {
                            Ok(_) => reply.ok(),
                            Err(e) => reply.error(e),
                        }
                    }
                    count(&idle, 1);
                }
                // The queue closed: the client goes first, then this thread counts itself out.
                drop(worker);
                LIVE.fetch_sub(1, Ordering::AcqRel);
                count(&idle, -1);
            })
            .map(drop)
            .inspect_err(|_| {
                self.threads.fetch_sub(1, Ordering::AcqRel);
                LIVE.fetch_sub(1, Ordering::AcqRel);
                count(&self.idle, -1);
            })
    }
}

/// Changes the count of idle waiters by `by`, and wakes who waits for it.
fn count(idle: &(Mutex<usize>, Condvar), by: isize) {
    let mut n = idle.0.lock().unwrap_or_else(PoisonError::into_inner);
    *n = n.saturating_add_signed(by);
    idle.1.notify_all();
}

impl Drop for Waiters {
    /// The session ended: the idle waiters close their clients before the process exits.
    /// Waiters blocked in a lock wait stay; the mount's end sees them in [`live_waiters`].
    fn drop(&mut self) {
        *self.queue.lock().unwrap_or_else(PoisonError::into_inner) = mpsc::channel().0;
        let deadline = Instant::now() + CLOSE_GRACE;
        let mut idle = self.idle.0.lock().unwrap_or_else(PoisonError::into_inner);
        while *idle > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                benchfs_core::warn_line!(
                    "benchfs-mount: {} lock waiters did not close their clients",
                    *idle
                );
                return;
            }
            idle = self
                .idle
                .1
                .wait_timeout(idle, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}
