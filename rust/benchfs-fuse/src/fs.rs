//! The FUSE file system. fuser runs a fixed number of event loops, each on its own thread
//! with its own `/dev/fuse` descriptor; a loop serves the request it read on its own thread,
//! with that thread's core [`Client`] (the client is single-threaded by design, so each
//! thread connects its own at its first request), and replies. No request crosses a thread:
//! a 4 KiB request through the kernel costs its round trip and nothing more. Parallel
//! requests (several jobs, readahead, async direct I/O) are served in parallel, up to the
//! number of threads; while all are busy the kernel queues further requests.

use std::cell::RefCell;
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::hash::{Hash, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use benchfs_core::client::{Client, ClusterCapacity, FileHandle as CoreHandle};
use benchfs_core::config::Config;
use benchfs_core::namespace::{self, Attr, Kind};
use benchfs_core::posix;
use benchfs_core::protocol;
use benchfs_core::protocol::lock::{LockCmd, LockRequest, LockType};
use benchfs_core::Error;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, Notifier, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLock, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    TimeOrNow, WriteFlags,
};

use crate::locks::{self, Waiters};
use crate::table::{join, Table, ROOT, SILLY_PREFIX};

/// How long the kernel may cache entries and attributes (libfuse's default). Within it, a
/// change made by another client (another node's mount or the Python API) may be unseen;
/// data is never cached across opens (no FOPEN_KEEP_CACHE), so close-to-open holds for bytes.
pub const TTL: Duration = Duration::from_secs(1);

/// The largest read or write request: 1 MiB (the kernel's default `max_pages_limit` is 256
/// pages; fuser asks for `max_pages` from max_write).
pub const MAX_IO: u32 = 1 << 20;

/// statfs block size: capacities are reported in 4 KiB blocks.
const STATFS_BSIZE: u64 = 4096;

/// How long rmdir and rename wait for queued removals of hidden names.
const REMOVAL_WAIT: Duration = Duration::from_secs(10);

/// How long an rmdir or rename refused for a non-empty directory waits for the hidden names
/// in it to go before answering ENOTEMPTY (see [`Shared::wait_hidden_gone`]).
const HIDDEN_WAIT: Duration = Duration::from_secs(1);

type Res<T> = Result<T, Errno>;

/// The core error as an errno for the kernel; failures of the servers are also logged,
/// since the application only sees EIO-like codes.
fn errno(op: &str, e: Error) -> Errno {
    let code = e.errno();
    if !posix::is_path_answer(code) {
        benchfs_core::warn_line!("benchfs-mount: {op}: {e}");
    }
    Errno::from_i32(code)
}

fn no_support() -> Errno {
    Errno::from_i32(libc::EOPNOTSUPP)
}

/// State shared by the event loops.
pub struct Shared {
    table: Mutex<Table>,
    /// Directory listings of open directory handles, fetched at offset 0.
    dirs: Mutex<HashMap<u64, Vec<Listed>>>,
    next_fh: AtomicU64,
    silly_seq: AtomicU64,
    /// Hidden names whose removal (at a last release) is queued but not done: rmdir and
    /// rename wait for them, or a directory that looks empty would answer ENOTEMPTY.
    removals: Mutex<u64>,
    removed: Condvar,
    uid: u32,
    gid: u32,
    /// Tells the kernel to drop cached attributes (set once the session exists).
    notifier: OnceLock<Notifier>,
    /// Read and write requests served, so the request sizes the kernel really sent can be
    /// reported at exit (they bound what one request can do).
    pub reads: IoCounter,
    pub writes: IoCounter,
    /// The write-behind group of every worker's client: a file written through one thread
    /// may be read, flushed or closed through another.
    write_behind: u64,
}

/// Requests, bytes and the largest request of one direction.
#[derive(Default)]
pub struct IoCounter {
    requests: AtomicU64,
    bytes: AtomicU64,
    largest: AtomicU64,
}

impl IoCounter {
    fn add(&self, len: usize) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(len as u64, Ordering::Relaxed);
        self.largest.fetch_max(len as u64, Ordering::Relaxed);
    }

    /// "N requests, M MiB, largest K KiB".
    pub fn summary(&self) -> String {
        format!(
            "{} requests, {} MiB, largest {} KiB",
            self.requests.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed) >> 20,
            self.largest.load(Ordering::Relaxed) >> 10
        )
    }
}

struct Listed {
    ino: u64,
    kind: FileType,
    name: String,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    /// Files shown as owned by this process's user and group.
    pub fn new() -> Shared {
        // SAFETY: getuid and getgid cannot fail and touch no memory of ours.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        Shared::owned_by(uid, gid)
    }

    /// Files shown as owned by `uid` and `gid` (a mount made by root for a job's user).
    pub fn owned_by(uid: u32, gid: u32) -> Shared {
        Shared {
            table: Mutex::new(Table::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            silly_seq: AtomicU64::new(0),
            removals: Mutex::new(0),
            removed: Condvar::new(),
            uid,
            gid,
            notifier: OnceLock::new(),
            reads: IoCounter::default(),
            writes: IoCounter::default(),
            write_behind: benchfs_core::client::write_behind_group(),
        }
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        lock(&self.table)
    }

    /// A number for an open file description, unique in this mount: the kernel names the
    /// description by it at its RELEASE, which releases the locks taken through it alone
    /// (locks.rs). Reads and writes go through the inode's pooled handles, not by it.
    pub fn new_fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }

    /// Gives the workers the session's notifier (see [`Worker::open`]).
    pub fn set_notifier(&self, notifier: Notifier) {
        let _ = self.notifier.set(notifier);
    }

    /// The lock that orders truncates against reads and writes of file `ino` on this mount.
    fn io_lock(&self, ino: u64) -> Res<Arc<RwLock<()>>> {
        self.table().get(ino).map(|i| i.io.clone()).ok_or(Errno::EBADF)
    }

    /// Waits (bounded) until queued removals of hidden names are done.
    fn wait_removals(&self) {
        let pending = lock(&self.removals);
        let _ = self.removed.wait_timeout_while(pending, REMOVAL_WAIT, |n| *n > 0);
    }

    /// After a refusal for a non-empty directory `dir`: waits (bounded) until this mount has
    /// no hidden name left in it, and says whether that happened (then the caller tries
    /// again). Event loops run in parallel, so an unlink can be served before the RELEASE
    /// the kernel queued ahead of it (the last close of the file): the unlink then hides the
    /// file, which the RELEASE removes a moment later. A file really still open keeps its
    /// hidden name, and the refusal stands after the wait.
    fn wait_hidden_gone(&self, dir: &str) -> bool {
        let hidden_in = |t: &Table| {
            t.unlinked_paths()
                .iter()
                .any(|p| namespace::split_parent(p).is_some_and(|(d, _)| d == dir))
        };
        if !hidden_in(&self.table()) {
            return false;
        }
        let pending = lock(&self.removals);
        let (pending, waited) = self
            .removed
            .wait_timeout_while(pending, HIDDEN_WAIT, |_| hidden_in(&self.table()))
            .unwrap_or_else(PoisonError::into_inner);
        drop(pending);
        !waited.timed_out()
    }

    fn removal_done(&self) {
        let mut pending = lock(&self.removals);
        *pending = pending.saturating_sub(1);
        self.removed.notify_all();
    }
}

impl Default for Shared {
    fn default() -> Self {
        Shared::new()
    }
}

fn time(ns: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(ns)
}

/// The kernel's view of an object: sizes include this mount's unpublished writes. Records the
/// size told.
fn file_attr(ino: u64, attr: &Attr, table: &mut Table, uid: u32, gid: u32) -> FileAttr {
    let dir = attr.kind == Kind::Dir;
    let (size, unlinked) = match table.get_mut(ino) {
        Some(i) => {
            let size = if dir { 0 } else { attr.size.max(i.local_end) };
            i.told_size = size;
            (size, i.unlinked)
        }
        None => (if dir { 0 } else { attr.size }, false),
    };
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size.div_ceil(512),
        atime: time(attr.mtime_ns),
        mtime: time(attr.mtime_ns),
        ctime: time(attr.ctime_ns),
        crtime: time(attr.ctime_ns),
        kind: match attr.kind {
            Kind::Dir => FileType::Directory,
            Kind::Symlink => FileType::Symlink,
            Kind::File => FileType::RegularFile,
        },
        perm: (attr.mode & 0o7777) as u16,
        nlink: match (dir, unlinked) {
            (true, _) => 2,
            (false, true) => 0,
            (false, false) => 1,
        },
        uid,
        gid,
        rdev: 0,
        // stdio and cp size their buffers by this: one chunk per call.
        blksize: if dir {
            4096
        } else {
            attr.layout.chunk_size.clamp(4096, u64::from(MAX_IO)) as u32
        },
        flags: 0,
    }
}

/// What the kernel is told at open: O_DIRECT opens bypass the page cache.
fn fopen_flags(flags: i32) -> FopenFlags {
    if flags & libc::O_DIRECT != 0 {
        FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES
    } else {
        FopenFlags::empty()
    }
}

/// A d_ino for a directory entry the kernel has not looked up (never equal to a table number).
fn synthetic_ino(path: &str) -> u64 {
    let mut h = DefaultHasher::new();
    path.hash(&mut h);
    h.finish() | (1 << 63)
}

/// One event loop's serving state: a core client and a reusable read buffer.
pub struct Worker {
    client: Client,
    shared: Arc<Shared>,
    buf: Vec<u8>,
}

impl Worker {
    /// Connects a client (waiting for the configuration's expected servers).
    pub fn connect(registry: &Path, config: Config, shared: Arc<Shared>) -> Result<Worker, String> {
        let mut client = Client::connect(registry, config)
            .map_err(|e| format!("cannot connect to the cluster in {}: {e}", registry.display()))?;
        client.write_behind_as(shared.write_behind);
        // The kernel follows links (readlink) and hands this mount resolved paths.
        client.set_resolve_links(false);
        Ok(Worker {
            client,
            shared,
            buf: Vec::new(),
        })
    }

    fn path_of(&self, ino: u64) -> Res<String> {
        self.shared.table().path(ino).ok_or(Errno::ENOENT)
    }

    fn child(&self, parent: u64, name: &OsStr) -> Res<String> {
        let parent = self.path_of(parent)?;
        let name = name.to_str().ok_or(Errno::EINVAL)?;
        Ok(join(&parent, name))
    }

    /// The attribute of `path` itself: the kernel follows symbolic links (readlink).
    fn stat(&self, op: &str, path: &str) -> Res<Attr> {
        self.client.lstat(path).map_err(|e| errno(op, e))
    }

    fn attr_of(&self, ino: u64, attr: &Attr) -> FileAttr {
        let mut t = self.shared.table();
        file_attr(ino, attr, &mut t, self.shared.uid, self.shared.gid)
    }

    /// Records a lookup (the reply counts as one for the kernel) and builds the entry.
    fn entry(&self, path: &str, attr: &Attr) -> FileAttr {
        let mut t = self.shared.table();
        let ino = t.remember(path, attr);
        file_attr(ino, attr, &mut t, self.shared.uid, self.shared.gid)
    }

    fn lookup(&mut self, parent: u64, name: &OsStr) -> Res<FileAttr> {
        let path = self.child(parent, name)?;
        let attr = self.stat("lookup", &path)?;
        Ok(self.entry(&path, &attr))
    }

    fn getattr(&mut self, ino: u64) -> Res<FileAttr> {
        let path = self.path_of(ino)?;
        let attr = self.stat("getattr", &path)?;
        Ok(self.attr_of(ino, &attr))
    }

    /// Size changes truncate; permission bits and the modification time (ns since the epoch)
    /// are stored; owner changes are refused unless they change nothing (BenchFS stores no
    /// owners); access times are not kept.
    fn setattr(
        &mut self,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        mtime_ns: Option<u64>,
    ) -> Res<FileAttr> {
        let path = self.path_of(ino)?;
        let mut attr = self.stat("setattr", &path)?;
        if uid.is_some_and(|u| u != self.shared.uid) || gid.is_some_and(|g| g != self.shared.gid) {
            return Err(no_support());
        }
        if attr.kind == Kind::Symlink {
            // The kernel asks for a link's own attributes only (lutimes; chmod follows links).
            if mode.is_some_and(|m| m & 0o7777 != attr.mode & 0o7777) || size.is_some() {
                return Err(no_support());
            }
            if let Some(t) = mtime_ns {
                attr = self
                    .client
                    .set_link_time(&path, t)
                    .map_err(|e| errno("setattr", e))?;
            }
            return Ok(self.attr_of(ino, &attr));
        }
        if let Some(size) = size {
            if attr.kind == Kind::Dir {
                return Err(Errno::EISDIR);
            }
            let io = self.shared.io_lock(ino)?;
            let _no_io = io.write().unwrap_or_else(PoisonError::into_inner);
            if let Some(inode) = self.shared.table().get_mut(ino) {
                // Handles that wrote before the truncate must not publish their old ends.
                inode.pool.clear();
                inode.epoch += 1;
                inode.local_end = 0;
                inode.changes.fetch_add(1, Ordering::AcqRel);
            }
            self.client
                .truncate(&path, size)
                .map_err(|e| errno("truncate", e))?;
            attr = self.stat("setattr", &path)?;
        }
        let mode = mode.map(|m| m & 0o7777).filter(|m| *m != attr.mode & 0o7777);
        if mode.is_some() || mtime_ns.is_some() {
            attr = self
                .client
                .set_attr(&path, mode, mtime_ns)
                .map_err(|e| errno("setattr", e))?;
        }
        Ok(self.attr_of(ino, &attr))
    }

    /// Opens: the kernel drops the file's cached pages (no FOPEN_KEEP_CACHE), and its cached
    /// attributes too if the owner now gives another size than the kernel was told (another
    /// client wrote or truncated it): close-to-open for sizes as for bytes.
    fn open(&mut self, ino: u64, flags: i32) -> Res<(u64, FopenFlags)> {
        let path = self.path_of(ino)?;
        // A name this mount looked up may have been removed through another (another node's
        // mount, the library) within the entry cache time: ESTALE makes the kernel look it
        // up again and retry the open, which then creates it (O_CREAT) or says ENOENT.
        let mut handle = self
            .client
            .open(&path, 0, 0)
            .map_err(|e| match errno("open", e) {
                Errno::ENOENT => Errno::ESTALE,
                other => other,
            })?;
        let stale = {
            let mut t = self.shared.table();
            let inode = t.get_mut(ino).ok_or(Errno::ENOENT)?;
            inode.opens += 1;
            let stale = handle.attr.size.max(inode.local_end) != inode.told_size.max(inode.local_end);
            handle.share_changes(&inode.changes);
            inode.pool.push(handle);
            stale
        };
        if stale {
            if let Some(n) = self.shared.notifier.get() {
                // Attributes only (offset -1): the pages go anyway at this open.
                if let Err(e) = n.inval_inode(INodeNo(ino), -1, 0) {
                    benchfs_core::warn_line!("benchfs-mount: cannot invalidate cached attributes: {e}");
                }
            }
        }
        Ok((self.shared.new_fh(), fopen_flags(flags)))
    }

    fn create(
        &mut self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Res<(FileAttr, u64, FopenFlags)> {
        let path = self.child(parent, name)?;
        let how = posix::namespace_flags(flags | libc::O_CREAT);
        // Truncating a file this mount has open: between its reads and writes, as setattr.
        let known = self.shared.table().ino_of(&path);
        let io = match known {
            Some(ino) if how & protocol::meta::TRUNCATE != 0 => self.shared.io_lock(ino).ok(),
            _ => None,
        };
        let _no_io = io
            .as_ref()
            .map(|l| l.write().unwrap_or_else(PoisonError::into_inner));
        let mut handle = self
            .client
            .open(&path, how, mode & !umask & 0o7777)
            .map_err(|e| errno("create", e))?;
        let attr = handle.attr;
        let mut t = self.shared.table();
        let ino = t.remember(&path, &attr);
        if let Some(inode) = t.get_mut(ino) {
            if flags & libc::O_TRUNC != 0 {
                inode.pool.clear();
                inode.epoch += 1;
                inode.local_end = 0;
                inode.changes.fetch_add(1, Ordering::AcqRel);
            }
            inode.opens += 1;
            handle.share_changes(&inode.changes);
            inode.pool.push(handle);
        }
        let fattr = file_attr(ino, &attr, &mut t, self.shared.uid, self.shared.gid);
        Ok((fattr, self.shared.new_fh(), fopen_flags(flags)))
    }

    /// A core handle of an open file for one request (opened on demand: one per concurrent
    /// request), with the epoch it was taken in. The handle knows the file is at least as
    /// long as this mount wrote it, whichever handle did the writing. Called with the file's
    /// I/O lock held (shared), so no truncate falls between this and the I/O.
    fn take(&mut self, ino: u64) -> Res<(CoreHandle, u64)> {
        let (path, epoch) = {
            let mut t = self.shared.table();
            let inode = t.get_mut(ino).ok_or(Errno::EBADF)?;
            if let Some(mut h) = inode.pool.pop() {
                if h.path != inode.path {
                    h.path.clone_from(&inode.path); // renamed since: publish to the new name
                }
                h.learn_size(inode.local_end);
                return Ok((h, inode.epoch));
            }
            (inode.path.clone(), inode.epoch)
        };
        let mut h = self.client.open(&path, 0, 0).map_err(|e| errno("open", e))?;
        if let Some(inode) = self.shared.table().get(ino) {
            h.learn_size(inode.local_end);
            h.share_changes(&inode.changes);
        }
        Ok((h, epoch))
    }

    /// Returns a handle to its file's pool (`wrote_to`: the end of a successful write).
    fn put(&self, ino: u64, h: CoreHandle, epoch: u64, wrote_to: Option<u64>) {
        let mut t = self.shared.table();
        if let Some(inode) = t.get_mut(ino) {
            if inode.epoch == epoch && inode.opens > 0 {
                if let Some(end) = wrote_to {
                    inode.local_end = inode.local_end.max(end);
                }
                inode.pool.push(h);
            }
        }
    }

    fn read(&mut self, ino: u64, offset: u64, size: usize, reply: ReplyData) {
        let io = match self.shared.io_lock(ino) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        let _io = io.read().unwrap_or_else(PoisonError::into_inner);
        let (h, epoch) = match self.take(ino) {
            Ok(x) => x,
            Err(e) => return reply.error(e),
        };
        if self.buf.len() < size {
            self.buf.resize(size, 0);
        }
        let got = self.client.read(&h, offset, &mut self.buf[..size]);
        self.put(ino, h, epoch, None);
        match got {
            Ok(n) => reply.data(&self.buf[..n]),
            Err(e) => reply.error(errno("read", e)),
        }
    }

    fn write(&mut self, ino: u64, offset: u64, data: &[u8]) -> Res<u32> {
        let io = self.shared.io_lock(ino)?;
        let _io = io.read().unwrap_or_else(PoisonError::into_inner);
        let (h, epoch) = self.take(ino)?;
        let done = self.client.write(&h, offset, data);
        let end = done.as_ref().ok().map(|&n| offset + n as u64);
        self.put(ino, h, epoch, end);
        let n = done.map_err(|e| errno("write", e))?;
        u32::try_from(n).map_err(|_| Errno::EIO)
    }

    /// Publishes every idle handle's size (close-to-open), or makes its data durable first.
    /// A lock request on inode `ino` (locks.rs): `Ok(None)` done, `Ok(Some(lock))` a conflicting
    /// lock. Taking or releasing one is a boundary: sizes written through this mount are
    /// published first, and once a lock is taken the kernel's cached pages of the file are
    /// dropped (another node may have written them under the lock before).
    pub fn lock(&mut self, ino: u64, req: &LockRequest) -> Res<Option<LockRequest>> {
        if req.cmd != LockCmd::Get {
            self.publish(ino, false)?;
        }
        let (h, epoch) = self.take(ino)?;
        let result = self.client.lock(&h, req);
        self.put(ino, h, epoch, None);
        let held = result.map_err(|e| errno("lock", e))?;
        if held.is_none() && req.cmd != LockCmd::Get && req.kind != LockType::Unlock {
            if let Some(n) = self.shared.notifier.get() {
                if let Err(e) = n.inval_inode(INodeNo(ino), 0, 0) {
                    benchfs_core::warn_line!("benchfs-mount: cannot drop cached pages after a lock: {e}");
                }
            }
        }
        Ok(held)
    }

    fn publish(&mut self, ino: u64, durable: bool) -> Res<()> {
        let (handles, epoch) = {
            let mut t = self.shared.table();
            let Some(inode) = t.get_mut(ino) else {
                return Ok(());
            };
            let mut handles = std::mem::take(&mut inode.pool);
            for h in &mut handles {
                if h.path != inode.path {
                    h.path.clone_from(&inode.path);
                }
            }
            (handles, inode.epoch)
        };
        let mut result = Ok(());
        for h in &handles {
            let done = if durable {
                self.client.fsync(h).map_err(|e| errno("fsync", e))
            } else {
                self.client.close(h).map_err(|e| errno("flush", e))
            };
            if result.is_ok() {
                result = done;
            }
        }
        for h in handles {
            self.put(ino, h, epoch, None);
        }
        result
    }

    /// The last release of a file unlinked while open: now its data goes.
    fn remove_hidden(&mut self, ino: u64, hidden: &str) -> Res<()> {
        let removed = self.client.unlink(hidden).map_err(|e| errno("unlink", e));
        let mut t = self.shared.table();
        t.detach(hidden);
        t.maybe_drop(ino);
        removed
    }

    /// Moves an open file out of the way (NFS's "silly rename"): its handles keep working on
    /// the hidden name, which the last release removes.
    fn hide(&mut self, ino: u64, path: &str) -> Res<()> {
        let dir = namespace::split_parent(path).map_or("/", |(d, _)| d);
        let seq = self.shared.silly_seq.fetch_add(1, Ordering::Relaxed);
        let hidden = join(dir, &format!("{SILLY_PREFIX}{ino:x}-{seq}"));
        self.client
            .rename(path, &hidden)
            .map_err(|e| errno("unlink", e))?;
        let mut t = self.shared.table();
        t.rename(path, &hidden);
        match t.get_mut(ino) {
            Some(inode) if inode.opens > 0 => {
                inode.unlinked = true;
                Ok(())
            }
            // The last RELEASE was served while the name was being moved (event loops run
            // in parallel), and found nothing to remove: the hidden name goes now.
            _ => {
                drop(t);
                self.remove_hidden(ino, &hidden)
            }
        }
    }

    /// The number of an open regular file at `path`, if this mount has one.
    fn open_file_at(&self, path: &str) -> Option<u64> {
        let t = self.shared.table();
        t.ino_of(path)
            .filter(|&i| t.get(i).is_some_and(|n| n.opens > 0 && n.kind == Kind::File))
    }

    fn unlink(&mut self, parent: u64, name: &OsStr) -> Res<()> {
        let path = self.child(parent, name)?;
        if let Some(ino) = self.open_file_at(&path) {
            if name.to_str().is_some_and(|n| n.starts_with(SILLY_PREFIX)) {
                return Err(Errno::EBUSY);
            }
            return self.hide(ino, &path);
        }
        self.client.unlink(&path).map_err(|e| errno("unlink", e))?;
        self.shared.table().detach(&path);
        Ok(())
    }

    fn mkdir(&mut self, parent: u64, name: &OsStr, mode: u32, umask: u32) -> Res<FileAttr> {
        let path = self.child(parent, name)?;
        self.client
            .mkdir(&path, mode & !umask & 0o7777)
            .map_err(|e| errno("mkdir", e))?;
        let attr = self.stat("mkdir", &path)?;
        Ok(self.entry(&path, &attr))
    }

    /// A symbolic link to `target`, kept as given: the kernel resolves it (an absolute target
    /// is a path on this host, usually through this mount).
    fn symlink(&mut self, parent: u64, name: &OsStr, target: &std::path::Path) -> Res<FileAttr> {
        let path = self.child(parent, name)?;
        let target = target.to_str().ok_or(Errno::EINVAL)?;
        self.client
            .symlink(target, &path)
            .map_err(|e| errno("symlink", e))?;
        let attr = self.stat("symlink", &path)?;
        Ok(self.entry(&path, &attr))
    }

    fn readlink(&mut self, ino: u64) -> Res<Vec<u8>> {
        let path = self.path_of(ino)?;
        let target = self.client.readlink(&path).map_err(|e| errno("readlink", e))?;
        Ok(target.into_bytes())
    }

    /// Regular files only (BenchFS has no special files).
    fn mknod(&mut self, parent: u64, name: &OsStr, mode: u32, umask: u32) -> Res<FileAttr> {
        if mode & libc::S_IFMT != libc::S_IFREG {
            return Err(Errno::EPERM);
        }
        let path = self.child(parent, name)?;
        let how = protocol::meta::CREATE | protocol::meta::EXCLUSIVE;
        let h = self
            .client
            .open(&path, how, mode & !umask & 0o7777)
            .map_err(|e| errno("mknod", e))?;
        self.client.close(&h).map_err(|e| errno("mknod", e))?;
        Ok(self.entry(&path, &h.attr))
    }

    fn rmdir(&mut self, parent: u64, name: &OsStr) -> Res<()> {
        let path = self.child(parent, name)?;
        self.shared.wait_removals();
        let mut removed = self.client.rmdir(&path);
        if removed.as_ref().is_err_and(|e| e.errno() == libc::ENOTEMPTY)
            && self.shared.wait_hidden_gone(&path)
        {
            removed = self.client.rmdir(&path);
        }
        removed.map_err(|e| errno("rmdir", e))?;
        self.shared.table().detach(&path);
        Ok(())
    }

    fn rename(
        &mut self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: RenameFlags,
    ) -> Res<()> {
        let from = self.child(parent, name)?;
        let to = self.child(newparent, newname)?;
        if flags.intersects(RenameFlags::RENAME_EXCHANGE | RenameFlags::RENAME_WHITEOUT) {
            return Err(Errno::EINVAL);
        }
        self.shared.wait_removals();
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        if from != to && !noreplace {
            if let Some(target) = self.open_file_at(&to) {
                // A file replacing an open file: the open one keeps its data until released.
                if self.stat("rename", &from)?.kind == Kind::File {
                    self.hide(target, &to)?;
                }
            }
        }
        let how = if noreplace { protocol::meta::NO_REPLACE } else { 0 };
        let mut renamed = self.client.rename_with(&from, &to, how);
        if renamed.as_ref().is_err_and(|e| e.errno() == libc::ENOTEMPTY) && self.shared.wait_hidden_gone(&to)
        {
            renamed = self.client.rename_with(&from, &to, how);
        }
        renamed.map_err(|e| errno("rename", e))?;
        self.shared.table().rename(&from, &to);
        Ok(())
    }

    fn readdir(&mut self, ino: u64, fh: u64, offset: u64, mut reply: ReplyDirectory) {
        if offset == 0 {
            let listed = self.list(ino);
            match listed {
                Ok(list) => {
                    lock(&self.shared.dirs).insert(fh, list);
                }
                Err(e) => return reply.error(e),
            }
        }
        let dirs = lock(&self.shared.dirs);
        let Some(list) = dirs.get(&fh) else {
            return reply.error(Errno::EBADF);
        };
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        for (k, e) in list.iter().enumerate().skip(start) {
            if reply.add(INodeNo(e.ino), k as u64 + 1, e.kind, &e.name) {
                break;
            }
        }
        reply.ok();
    }

    fn list(&mut self, ino: u64) -> Res<Vec<Listed>> {
        let path = self.path_of(ino)?;
        let entries = self.client.readdir(&path).map_err(|e| errno("readdir", e))?;
        let t = self.shared.table();
        let parent = namespace::split_parent(&path)
            .and_then(|(p, _)| t.ino_of(p))
            .unwrap_or(ROOT);
        let mut list = Vec::with_capacity(entries.len() + 2);
        list.push(Listed {
            ino,
            kind: FileType::Directory,
            name: ".".into(),
        });
        list.push(Listed {
            ino: parent,
            kind: FileType::Directory,
            name: "..".into(),
        });
        for e in entries {
            let child = join(&path, &e.name);
            list.push(Listed {
                ino: t.ino_of(&child).unwrap_or_else(|| synthetic_ino(&child)),
                kind: match e.kind {
                    Kind::Dir => FileType::Directory,
                    Kind::Symlink => FileType::Symlink,
                    Kind::File => FileType::RegularFile,
                },
                name: e.name,
            });
        }
        Ok(list)
    }

    /// At shutdown: removes the hidden names of files still open when the mount went away.
    pub fn cleanup(&mut self) {
        let hidden = self.shared.table().unlinked_paths();
        for path in hidden {
            if let Err(e) = self.client.unlink(&path) {
                benchfs_core::warn_line!("benchfs-mount: cannot remove {path} (unlinked while open): {e}");
            }
        }
    }
}

/// How a worker answers one kind of request.
trait Respond<T> {
    fn send_ok(self, value: T);
    fn send_err(self, e: Errno);
}

impl Respond<FileAttr> for ReplyEntry {
    fn send_ok(self, attr: FileAttr) {
        self.entry(&TTL, &attr, Generation(0));
    }
    fn send_err(self, e: Errno) {
        self.error(e);
    }
}

impl Respond<FileAttr> for ReplyAttr {
    fn send_ok(self, attr: FileAttr) {
        self.attr(&TTL, &attr);
    }
    fn send_err(self, e: Errno) {
        self.error(e);
    }
}

impl Respond<()> for ReplyEmpty {
    fn send_ok(self, _: ()) {
        self.ok();
    }
    fn send_err(self, e: Errno) {
        self.error(e);
    }
}

impl Respond<ClusterCapacity> for ReplyStatfs {
    fn send_ok(self, c: ClusterCapacity) {
        let t = c.total;
        // BenchFS allocates names without limit: report free inodes as unbounded.
        let files_free = u64::from(u32::MAX);
        self.statfs(
            t.total_bytes / STATFS_BSIZE,
            t.free_bytes / STATFS_BSIZE,
            t.avail_bytes / STATFS_BSIZE,
            t.inodes + files_free,
            files_free,
            STATFS_BSIZE as u32,
            namespace::NAME_MAX as u32,
            STATFS_BSIZE as u32,
        );
    }
    fn send_err(self, e: Errno) {
        self.error(e);
    }
}

impl Respond<Vec<u8>> for ReplyData {
    fn send_ok(self, data: Vec<u8>) {
        self.data(&data);
    }
    fn send_err(self, e: Errno) {
        self.error(e);
    }
}

impl Respond<u32> for ReplyWrite {
    fn send_ok(self, n: u32) {
        self.written(n);
    }
    fn send_err(self, e: Errno) {
        self.error(e);
    }
}

impl Respond<(u64, FopenFlags)> for ReplyOpen {
    fn send_ok(self, (fh, flags): (u64, FopenFlags)) {
        self.opened(FileHandle(fh), flags);
    }
    fn send_err(self, e: Errno) {
        self.error(e);
    }
}

impl Respond<(FileAttr, u64, FopenFlags)> for ReplyCreate {
    fn send_ok(self, (attr, fh, flags): (FileAttr, u64, FopenFlags)) {
        self.created(&TTL, &attr, Generation(0), FileHandle(fh), flags);
    }
    fn send_err(self, e: Errno) {
        self.error(e);
    }
}

thread_local! {
    /// This event loop thread's worker, connected at its first request and dropped when
    /// the thread ends with the session.
    static WORKER: RefCell<Option<Worker>> = const { RefCell::new(None) };
}

/// The file system handed to fuser: each request is served on the event loop thread that
/// read it.
pub struct BenchFs {
    shared: Arc<Shared>,
    registry: PathBuf,
    config: Config,
    /// Where lock requests that wait are served (locks.rs).
    waiters: Arc<Waiters>,
}

impl BenchFs {
    pub fn new(shared: Arc<Shared>, registry: PathBuf, config: &Config) -> BenchFs {
        // Writes behind (client.write_behind) are the process's: a read, flush or close
        // served by another thread's client waits for them (see `Shared::write_behind`).
        let config = config.clone();
        BenchFs {
            waiters: Arc::new(Waiters::new(registry.clone(), config.clone(), shared.clone())),
            shared,
            registry,
            config,
        }
    }

    /// Runs `serve` with this thread's worker, connecting it first if needed; a failed
    /// connection is answered with EIO (and said once per attempt on stderr).
    fn serve(&self, serve: impl FnOnce(Res<&mut Worker>)) {
        WORKER.with(|slot| {
            let mut slot = slot.borrow_mut();
            if slot.is_none() {
                match Worker::connect(&self.registry, self.config.clone(), self.shared.clone()) {
                    Ok(w) => *slot = Some(w),
                    Err(e) => benchfs_core::warn_line!("benchfs-mount: {e}"),
                }
            }
            let worker = slot.as_mut().ok_or(Errno::EIO);
            // A bug in one request must not end this event loop (the kernel would wait
            // forever for its replies); the dropped reply answers EIO.
            if catch_unwind(AssertUnwindSafe(|| serve(worker))).is_err() {
                benchfs_core::warn_line!("benchfs-mount: a request panicked; answered EIO");
            }
        });
    }

    /// Serves `op` and answers with its result through `reply`.
    fn dispatch<T, R, F>(&self, reply: R, op: F)
    where
        R: Respond<T>,
        F: FnOnce(&mut Worker) -> Res<T>,
    {
        self.serve(|w| match w.and_then(op) {
            Ok(v) => reply.send_ok(v),
            Err(e) => reply.send_err(e),
        });
    }
}

impl Filesystem for BenchFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // 1 MiB requests; fuser then asks for max_pages to match.
        if let Err(nearest) = config.set_max_write(MAX_IO) {
            let _ = config.set_max_write(nearest);
        }
        // Readahead and async direct I/O keep several requests in flight per file.
        let _ = config.set_max_background(64);
        // fcntl locks come here (getlk, setlk) and are the job's.
        for cap in [
            InitFlags::FUSE_ASYNC_DIO,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_POSIX_LOCKS,
        ] {
            let _ = config.add_capabilities(cap);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.dispatch(reply, |w| w.lookup(parent.0, name));
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.shared.table().forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.dispatch(reply, |w| w.getattr(ino.0));
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mtime_ns = mtime.map(|t| {
            let at = match t {
                TimeOrNow::SpecificTime(at) => at,
                TimeOrNow::Now => SystemTime::now(),
            };
            // Before the epoch: clamp to it (BenchFS keeps unsigned nanoseconds).
            at.duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        self.dispatch(reply, |w| w.setattr(ino.0, mode, uid, gid, size, mtime_ns));
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        self.dispatch(reply, |w| w.mknod(parent.0, name, mode, umask));
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        self.dispatch(reply, |w| w.mkdir(parent.0, name, mode, umask));
    }

    fn symlink(&self, _req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        self.dispatch(reply, |w| w.symlink(parent.0, link_name, target));
    }

    /// Hard links are refused as by file systems without them (vfat): EPERM. A BenchFS file
    /// has one name (docs/namespace.md).
    fn link(&self, _req: &Request, _ino: INodeNo, _newparent: INodeNo, _newname: &OsStr, reply: ReplyEntry) {
        reply.error(Errno::EPERM);
    }

    fn getlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        let req = match locks::request(
            self.waiters.mount,
            lock_owner.0,
            start,
            end,
            typ,
            pid,
            LockCmd::Get,
        ) {
            Ok(r) => r,
            Err(e) => return reply.error(e),
        };
        self.serve(move |w| match w.and_then(|w| w.lock(ino.0, &req)) {
            Ok(held) => {
                let (start, end, typ, pid) = locks::answer(held.as_ref());
                reply.locked(start, end, typ, pid);
            }
            Err(e) => reply.error(e),
        });
    }

    /// Tried once on this event loop; a request that waits (F_SETLKW) and conflicts goes to a
    /// waiter thread (locks.rs), so the loop serves on.
    fn setlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let req = match locks::request(
            self.waiters.mount,
            lock_owner.0,
            start,
            end,
            typ,
            pid,
            LockCmd::Set,
        ) {
            Ok(r) => r,
            Err(e) => return reply.error(e),
        };
        if req.kind != LockType::Unlock {
            self.waiters.noted(ino.0, fh.0, req.owner);
        }
        let waiters = self.waiters.clone();
        self.serve(move |w| match w.and_then(|w| w.lock(ino.0, &req)) {
            Ok(None) => reply.ok(),
            Ok(Some(_)) if sleep => waiters.wait(
                ino.0,
                LockRequest {
                    cmd: LockCmd::SetWait,
                    ..req
                },
                reply,
            ),
            Ok(Some(_)) => reply.error(Errno::from_i32(libc::EAGAIN)),
            Err(e) => reply.error(e),
        });
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.dispatch(reply, |w| w.readlink(ino.0));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.dispatch(reply, |w| w.unlink(parent.0, name));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.dispatch(reply, |w| w.rmdir(parent.0, name));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.dispatch(reply, |w| w.rename(parent.0, name, newparent.0, newname, flags));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.dispatch(reply, |w| w.open(ino.0, flags.0));
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.shared.reads.add(size as usize);
        self.serve(|w| match w {
            Ok(w) => w.read(ino.0, offset, size as usize, reply),
            Err(e) => reply.error(e),
        });
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.shared.writes.add(data.len());
        self.dispatch(reply, |w| w.write(ino.0, offset, data));
    }

    /// Every close: publishes the sizes written, and releases the closing owner's locks on
    /// the file (a process's record locks go with any close of the file; locks.rs).
    fn flush(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, lock_owner: LockOwner, reply: ReplyEmpty) {
        let release = self
            .waiters
            .to_release(ino.0, None, Some(lock_owner.0 ^ self.waiters.mount));
        self.dispatch(reply, |w| {
            for owner in release {
                w.lock(ino.0, &locks::release(owner))?;
            }
            w.publish(ino.0, false)
        });
    }

    /// The kernel sends RELEASE asynchronously after close() returned, so a later unlink from
    /// the same program may be served first, on another event loop (it then hides the file,
    /// which this removes; rmdir and rename wait for that). Sizes were published by FLUSH
    /// (every close); idle handles are just dropped.
    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // The description's last close: the locks taken through it (OFD locks) go.
        let release = self.waiters.to_release(ino.0, Some(fh.0), None);
        if !release.is_empty() {
            self.serve(|w| {
                if let Ok(w) = w {
                    for owner in release {
                        let _ = w.lock(ino.0, &locks::release(owner));
                    }
                }
            });
        }
        let hidden = {
            let mut t = self.shared.table();
            let hidden = t.get_mut(ino.0).and_then(|inode| {
                inode.opens = inode.opens.saturating_sub(1);
                if inode.opens > 0 {
                    return None;
                }
                inode.pool.clear();
                inode.local_end = 0;
                inode.unlinked.then(|| inode.path.clone())
            });
            if hidden.is_none() {
                t.maybe_drop(ino.0);
            }
            hidden
        };
        let Some(hidden) = hidden else {
            return reply.ok();
        };
        *lock(&self.shared.removals) += 1;
        self.dispatch(reply, |w| w.remove_hidden(ino.0, &hidden));
        self.shared.removal_done();
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.dispatch(reply, |w| w.publish(ino.0, true));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.shared.table().path(ino.0).is_none() {
            return reply.error(Errno::ENOENT);
        }
        reply.opened(FileHandle(self.shared.new_fh()), FopenFlags::empty());
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, reply: ReplyDirectory) {
        self.serve(|w| match w {
            Ok(w) => w.readdir(ino.0, fh.0, offset, reply),
            Err(e) => reply.error(e),
        });
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        lock(&self.shared.dirs).remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        // Namespace changes are applied by the servers before they answer.
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.dispatch(reply, |w| w.client.statfs().map_err(|e| errno("statfs", e)));
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.dispatch(reply, |w| w.create(parent.0, name, mode, umask, flags));
    }
}
