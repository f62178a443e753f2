//! The chunk store: where chunks live on disk (a [`layout`]), how bytes move (io_uring, with
//! O_DIRECT as a policy per direction), and what fsync means.
//!
//! Direct I/O without read-modify-write: a write's block-aligned middle goes through the
//! O_DIRECT descriptor, its unaligned head and tail through the buffered descriptor of the same
//! file. The kernel merges sub-block buffered writes under its page lock, and writes back cached
//! pages before direct I/O touches them, so neighbouring unaligned writes to one chunk (IOR-hard's
//! 47008-byte transfers) can never lose each other's bytes the way a user-space read-modify-write
//! can. Buffers mirror file alignment (data for file offset `o` sits at buffer offset `o % ALIGN`)
//! so that the aligned middle is also aligned in memory.
//!
//! fsync: every chunk written since the last fsync of its file is remembered; `fsync(file)`
//! runs `fdatasync` on each of their files (or on the pack files holding them) before it returns,
//! so the data is on the device, including its volatile cache. No write ever fsyncs by itself.

mod handles;
mod packed;

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use futures::stream::{self, StreamExt};

use crate::buffer::{IoBuffer, ALIGN};
use crate::chunking::FileId;
use crate::config::{DiskLayout, StorageConfig};
use crate::error::{Error, Result};
use crate::runtime::Reactor;

pub use handles::Handle;
use handles::HandleCache;
use packed::Packed;

/// How bytes move to and from the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoPolicy {
    pub direct_write: bool,
    pub direct_read: bool,
}

/// A chunk's place: the file holding it and where the chunk starts in that file.
struct Location {
    handle: Rc<Handle>,
    base: u64,
    /// Readable bytes of the chunk when the file itself cannot tell (packed slots).
    readable: Option<u64>,
    /// Identifies the on-disk file for fsync de-duplication.
    file_key: u64,
}

enum Layout {
    /// One file per chunk under `chunks/<2 hex>/<file id>.<chunk>`.
    ChunkFiles { root: PathBuf, handles: HandleCache },
    /// Fixed-size slots in a few large preallocated files, with an in-memory index.
    Packed(Packed),
    /// Nothing kept (`storage.layout = "discard"`, for benchmarks of the protocol alone).
    Discard,
}

/// Buffered reads and writes up to this size run inline, not on the ring, when the data
/// directory is in memory (tmpfs): there they never wait for a device, while io_uring
/// hands every one of them to a worker thread (tmpfs has no non-blocking I/O), which cost
/// 18-37 µs of server time per 4 KiB request against about 1 µs for the copy itself. Larger
/// ones stay on the ring, so that their copies overlap the loop's other work.
const INLINE_MAX: usize = 64 * 1024;

/// Whether `dir` is on tmpfs, which keeps its data in memory.
fn in_memory(dir: &Path) -> bool {
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: a NUL-terminated path and a statfs buffer the call fills.
    if unsafe { libc::statfs(path.as_ptr(), st.as_mut_ptr()) } != 0 {
        return false;
    }
    // SAFETY: filled by the successful call above.
    let kind = unsafe { st.assume_init() }.f_type;
    kind == libc::TMPFS_MAGIC
}

/// One buffered `pwrite` or `pread` on this thread, for the inline path; `n` bytes or the error.
fn inline_io(write: bool, fd: i32, ptr: *mut u8, len: usize, offset: u64) -> io::Result<usize> {
    // SAFETY: `ptr..ptr+len` lies in a buffer the caller holds for the call.
    let n = unsafe {
        if write {
            libc::pwrite(fd, ptr as *const libc::c_void, len, offset as libc::off_t)
        } else {
            libc::pread(fd, ptr as *mut libc::c_void, len, offset as libc::off_t)
        }
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

pub struct ChunkStore {
    layout: Layout,
    policy: IoPolicy,
    /// The data directory is in memory: small buffered I/O runs inline (see INLINE_MAX).
    inline_small: bool,
    reactor: Rc<Reactor>,
    /// Chunks written since their file's last fsync.
    dirty: RefCell<HashMap<FileId, HashSet<u64>>>,
    /// Every chunk this store wrote, so a chunk file that vanished is an error, not a hole.
    stored: RefCell<HashMap<FileId, HashSet<u64>>>,
    /// The store holds chunks of an earlier life of its server (a restart on its data): a
    /// file `stored` does not know may still have chunks on disk.
    reopened: bool,
    /// Handle-cache lookups (chunk-file layout): hits, misses.
    handle_hits: Cell<u64>,
    handle_misses: Cell<u64>,
}

/// Fails early, with a clear message, when the file system refuses O_DIRECT (tmpfs does).
fn probe_direct(dir: &Path) -> Result<()> {
    let probe = dir.join(".direct-probe");
    let res = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe);
    let _ = fs::remove_file(&probe);
    match res {
        Ok(_) => Ok(()),
        Err(e) => Err(Error::Config(format!(
            "{} does not support O_DIRECT ({e}); set storage.direct_write and storage.direct_read to false",
            dir.display()
        ))),
    }
}

fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

impl ChunkStore {
    /// Opens (creating as needed) the store under `data_dir`.
    pub fn open(
        data_dir: &Path,
        config: &StorageConfig,
        chunk_size: u64,
        worker: u32,
        reactor: Rc<Reactor>,
    ) -> Result<ChunkStore> {
        fs::create_dir_all(data_dir).map_err(|e| Error::io(format!("create {}", data_dir.display()), e))?;
        let policy = IoPolicy {
            direct_write: config.direct_write,
            direct_read: config.direct_read,
        };
        if policy.direct_write || policy.direct_read {
            probe_direct(data_dir)?;
        }
        let direct = policy.direct_write || policy.direct_read;
        let layout = match config.layout {
            DiskLayout::Packed => Layout::Packed(Packed::open(
                &data_dir.join("packed"),
                worker,
                round_up(chunk_size, ALIGN as u64),
                direct,
            )?),
            DiskLayout::Chunkfile => {
                let root = data_dir.join("chunks");
                // 256 fan-out directories, made once, never per write.
                for i in 0..256 {
                    let dir = root.join(format!("{i:02x}"));
                    fs::create_dir_all(&dir)
                        .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
                }
                Layout::ChunkFiles {
                    root,
                    handles: HandleCache::new(config.handle_cache as usize, direct),
                }
            }
            DiskLayout::Discard => Layout::Discard,
        };
        let reopened = match &layout {
            Layout::ChunkFiles { root, .. } => (0..256)
                .any(|i| fs::read_dir(root.join(format!("{i:02x}"))).is_ok_and(|mut d| d.next().is_some())),
            Layout::Packed(p) => !p.is_empty(),
            Layout::Discard => false,
        };
        Ok(ChunkStore {
            layout,
            policy,
            inline_small: in_memory(data_dir),
            reactor,
            dirty: RefCell::new(HashMap::new()),
            stored: RefCell::new(HashMap::new()),
            reopened,
            handle_hits: Cell::new(0),
            handle_misses: Cell::new(0),
        })
    }

    /// The chunks of `file` on disk: its chunk files (in its fan-out directory), or its
    /// packed slots.
    fn chunks_on_disk(&self, file: FileId) -> io::Result<HashSet<u64>> {
        match &self.layout {
            Layout::ChunkFiles { root, .. } => {
                let hex = file.hex();
                let prefix = format!("{hex}.");
                let mut found = HashSet::new();
                for entry in fs::read_dir(root.join(&hex[..2]))? {
                    let name = entry?.file_name();
                    let chunk = name
                        .to_str()
                        .and_then(|n| n.strip_prefix(&prefix))
                        .and_then(|c| c.parse::<u64>().ok());
                    found.extend(chunk);
                }
                Ok(found)
            }
            Layout::Packed(p) => Ok(p.chunks_of(file)),
            Layout::Discard => Ok(HashSet::new()),
        }
    }

    /// Handle-cache lookups so far: (hits, misses); zeros for the packed layout.
    pub fn handle_lookups(&self) -> (u64, u64) {
        (self.handle_hits.get(), self.handle_misses.get())
    }

    pub fn policy(&self) -> IoPolicy {
        self.policy
    }

    async fn locate(&self, file: FileId, chunk: u64, create: bool) -> io::Result<Option<Location>> {
        match &self.layout {
            Layout::ChunkFiles { root, handles } => {
                let hex = file.hex();
                let path = root.join(&hex[..2]).join(format!("{hex}.{chunk}"));
                let (handle, hit) = match handles.get(&self.reactor, file, chunk, create, path).await? {
                    Some(h) => h,
                    None => return Ok(None),
                };
                let counter = if hit {
                    &self.handle_hits
                } else {
                    &self.handle_misses
                };
                counter.set(counter.get() + 1);
                Ok(Some(Location {
                    handle,
                    base: 0,
                    readable: None,
                    file_key: (file.0 as u64) ^ chunk.rotate_left(32),
                }))
            }
            Layout::Packed(p) => Ok(p.locate(file, chunk, create)?.map(|s| Location {
                handle: s.handle,
                base: s.base,
                readable: Some(s.len),
                file_key: s.file_index,
            })),
            Layout::Discard => Ok(None),
        }
    }

    /// Writes `buf[start..start+len]` at `offset` within the chunk; returns the bytes written
    /// and the buffer.
    pub async fn write(
        &self,
        file: FileId,
        chunk: u64,
        offset: u64,
        buf: IoBuffer,
        start: usize,
        len: usize,
    ) -> (io::Result<usize>, IoBuffer) {
        if let Layout::Discard = self.layout {
            return (Ok(len), buf);
        }
        let loc = match self.locate(file, chunk, true).await {
            Ok(Some(l)) => l,
            Ok(None) => return (Err(io::Error::from_raw_os_error(libc::ENOENT)), buf),
            Err(e) => return (Err(e), buf),
        };
        let pos = loc.base + offset;
        // Split into an unaligned head, an aligned middle and an unaligned tail.
        let align = ALIGN as u64;
        let head = ((align - pos % align) % align).min(len as u64) as usize;
        let middle = (len - head) / ALIGN * ALIGN;
        let mid_ptr_aligned = (buf.as_ptr() as usize + start + head).is_multiple_of(ALIGN);
        let direct_fd = loc
            .handle
            .direct_fd()
            .filter(|_| self.policy.direct_write && mid_ptr_aligned);
        let buffered_fd = loc.handle.buffered_fd();
        let parts: [(usize, usize, i32); 3] = match direct_fd {
            Some(dfd) if middle > 0 => [
                (0, head, buffered_fd),
                (head, middle, dfd),
                (head + middle, len - head - middle, buffered_fd),
            ],
            _ => [
                (0, len, buffered_fd),
                (len, 0, buffered_fd),
                (len, 0, buffered_fd),
            ],
        };
        let mut buf = buf;
        for (at, part_len, fd) in parts {
            let mut done = 0;
            while done < part_len {
                if self.inline_small && fd == buffered_fd && part_len <= INLINE_MAX {
                    // SAFETY: within the buffer, which this function holds.
                    let ptr = unsafe { buf.as_ptr().add(start + at + done) } as *mut u8;
                    match inline_io(true, fd, ptr, part_len - done, pos + (at + done) as u64) {
                        Ok(0) => return (Err(io::Error::from_raw_os_error(libc::EIO)), buf),
                        Ok(n) => done += n,
                        Err(e) => return (Err(e), buf),
                    }
                    continue;
                }
                // Short writes to regular files are rare but legal: continue where it stopped.
                let (res, b) = self
                    .reactor
                    .write_at(
                        fd,
                        buf,
                        start + at + done,
                        part_len - done,
                        pos + (at + done) as u64,
                    )
                    .await;
                buf = b;
                match res {
                    Ok(0) => return (Err(io::Error::from_raw_os_error(libc::EIO)), buf),
                    Ok(n) => done += n,
                    Err(e) => return (Err(e), buf),
                }
            }
        }
        if let Layout::Packed(p) = &self.layout {
            if let Err(e) = p.extend(file, chunk, offset + len as u64) {
                return (Err(e), buf);
            }
        }
        self.dirty.borrow_mut().entry(file).or_default().insert(chunk);
        self.stored.borrow_mut().entry(file).or_default().insert(chunk);
        drop(loc);
        (Ok(len), buf)
    }

    /// Reads up to `len` bytes at `offset` within the chunk into `buf`. Returns where the data
    /// starts in the buffer and how many bytes there are. A chunk never written reads as 0 bytes.
    pub async fn read(
        &self,
        file: FileId,
        chunk: u64,
        offset: u64,
        buf: IoBuffer,
        len: usize,
    ) -> (io::Result<(usize, usize)>, IoBuffer) {
        if let Layout::Discard = self.layout {
            return (Ok((0, len.min(buf.capacity()))), buf);
        }
        let loc = match self.locate(file, chunk, false).await {
            Ok(Some(l)) => l,
            Ok(None)
                if self
                    .stored
                    .borrow()
                    .get(&file)
                    .is_some_and(|c| c.contains(&chunk)) =>
            {
                // We wrote this chunk and its file is gone: data loss, say so.
                return (Err(io::Error::from_raw_os_error(libc::ENODATA)), buf);
            }
            Ok(None) => return (Ok((0, 0)), buf),
            Err(e) => return (Err(e), buf),
        };
        let len = match loc.readable {
            Some(readable) => (readable.saturating_sub(offset) as usize).min(len),
            None => len,
        };
        if len == 0 {
            return (Ok((0, 0)), buf);
        }
        let pos = loc.base + offset;
        let align = ALIGN as u64;
        let direct_fd = loc.handle.direct_fd().filter(|_| self.policy.direct_read);
        let (fd, file_start, skip, want) = match direct_fd {
            Some(dfd) => {
                let start = pos / align * align;
                let skip = (pos - start) as usize;
                (dfd, start, skip, round_up((skip + len) as u64, align) as usize)
            }
            None => (loc.handle.buffered_fd(), pos, 0, len),
        };
        if want > buf.capacity() {
            return (Err(io::Error::from_raw_os_error(libc::EINVAL)), buf);
        }
        let (res, buf) = if self.inline_small && direct_fd.is_none() && want <= INLINE_MAX {
            let mut buf = buf;
            (inline_io(false, fd, buf.as_mut_ptr(), want, file_start), buf)
        } else {
            self.reactor.read_at(fd, buf, want, file_start).await
        };
        drop(loc);
        let res = res.map(|n| (skip, n.saturating_sub(skip).min(len)));
        (res, buf)
    }

    /// Frees what this store holds of `file` at and beyond byte `size` (chunks of
    /// `chunk_size`): later chunks are removed, the chunk containing `size` is cut, so that a
    /// file that grows again reads zeros there. The chunks this store wrote are known; in a
    /// reopened store, those of a file it did not write since are looked up on disk (a file cut
    /// after a restart keeps no stale byte beyond its size).
    pub fn truncate(&self, file: FileId, size: u64, chunk_size: u64) -> io::Result<()> {
        if self.reopened && !self.stored.borrow().contains_key(&file) {
            let found = self.chunks_on_disk(file)?;
            if !found.is_empty() {
                self.stored.borrow_mut().insert(file, found);
            }
        }
        let chunks: Vec<u64> = match self.stored.borrow().get(&file) {
            Some(c) => c
                .iter()
                .copied()
                .filter(|&c| (c + 1) * chunk_size > size)
                .collect(),
            None => return Ok(()),
        };
        for chunk in chunks {
            let keep = size.saturating_sub(chunk * chunk_size);
            match &self.layout {
                Layout::ChunkFiles { root, handles } => {
                    let hex = file.hex();
                    let path = root.join(&hex[..2]).join(format!("{hex}.{chunk}"));
                    handles.forget(file, chunk);
                    let res = if keep == 0 {
                        fs::remove_file(&path)
                    } else {
                        OpenOptions::new()
                            .write(true)
                            .open(&path)
                            .and_then(|f| f.set_len(keep))
                    };
                    match res {
                        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                        _ => {}
                    }
                }
                Layout::Packed(p) => p.cut(file, chunk, keep)?,
                Layout::Discard => {}
            }
            if keep == 0 {
                let mut stored = self.stored.borrow_mut();
                if let Some(set) = stored.get_mut(&file) {
                    set.remove(&chunk);
                    if set.is_empty() {
                        stored.remove(&file);
                    }
                }
                if let Some(set) = self.dirty.borrow_mut().get_mut(&file) {
                    set.remove(&chunk);
                }
            }
        }
        Ok(())
    }

    /// Saves what the layout keeps in memory (the packed index). Called when a server or a
    /// benchmark stops.
    pub fn close(&self) -> io::Result<()> {
        match &self.layout {
            Layout::Packed(p) => p.persist(),
            Layout::ChunkFiles { .. } | Layout::Discard => Ok(()),
        }
    }

    /// Makes every chunk of `file` written since its last fsync durable on the device.
    pub async fn fsync(&self, file: FileId) -> io::Result<()> {
        let chunks = self.dirty.borrow_mut().remove(&file).unwrap_or_default();
        let mut seen = HashSet::new();
        let mut targets = Vec::new();
        for chunk in chunks {
            if let Some(loc) = self.locate(file, chunk, false).await? {
                if seen.insert(loc.file_key) {
                    targets.push(loc.handle);
                }
            }
        }
        if let Layout::Packed(p) = &self.layout {
            // The index's changes are durable with the data they locate.
            p.sync_journal()?;
        }
        let reactor = &self.reactor;
        let results: Vec<io::Result<usize>> = stream::iter(targets)
            .map(|h| async move {
                let (res, _) = reactor.fdatasync(h.buffered_fd()).await;
                drop(h);
                res
            })
            .buffer_unordered(32)
            .collect()
            .await;
        results.into_iter().find_map(|r| r.err()).map_or(Ok(()), Err)
    }
}

/// [`open_handle`] through io_uring (chunk files are opened on the event loop's thread).
async fn open_handle_async(
    reactor: &Rc<Reactor>,
    path: &Path,
    create: bool,
    direct: bool,
) -> io::Result<Option<Handle>> {
    use std::os::fd::FromRawFd;
    let open = |flags: i32| async move {
        let (res, _) = reactor.openat(path, flags, 0o600).await;
        // SAFETY: a successful openat returns a new descriptor that nothing else owns.
        res.map(|fd| unsafe { fs::File::from_raw_fd(fd as i32) })
    };
    let base = libc::O_RDWR | if create { libc::O_CREAT } else { 0 };
    let buffered = match open(base).await {
        Ok(f) => f,
        Err(e) if !create && e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let direct = if direct {
        Some(open(libc::O_RDWR | libc::O_DIRECT).await?)
    } else {
        None
    };
    Ok(Some(Handle::new(buffered, direct)))
}

/// Opens a chunk's descriptors: buffered always, O_DIRECT when a direction uses it.
fn open_handle(path: &Path, create: bool, direct: bool) -> io::Result<Option<Handle>> {
    let mut opts = OpenOptions::new();
    opts.read(true).write(true).mode(0o600);
    if create {
        opts.create(true);
    }
    let buffered = match opts.open(path) {
        Ok(f) => f,
        Err(e) if !create && e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let direct = if direct {
        Some(
            OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)?,
        )
    } else {
        None
    };
    Ok(Some(Handle::new(buffered, direct)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Runtime;

    /// Small buffered I/O runs inline in a memory-backed directory and on the ring elsewhere,
    /// with the same bytes either way: an unaligned write, a read past it (a hole reads as
    /// zeros), a read of a chunk never written, and a large write that stays on the ring.
    #[test]
    fn small_io_inline_in_memory_and_on_the_ring_on_disk_keep_every_byte() -> Result<()> {
        let memory = tempfile::tempdir_in("/dev/shm").map_err(|e| Error::io("tempdir", e))?;
        let disk = tempfile::tempdir_in(std::env::temp_dir()).map_err(|e| Error::io("tempdir", e))?;
        for (dir, inline) in [(memory.path(), true), (disk.path(), in_memory(disk.path()))] {
            let runtime = Runtime::new(64)?;
            let config = StorageConfig {
                direct_write: false,
                direct_read: false,
                ..StorageConfig::default()
            };
            let store = ChunkStore::open(dir, &config, 1 << 20, 0, runtime.reactor().clone())?;
            assert_eq!(store.inline_small, inline, "{}", dir.display());
            let file = FileId(7);
            let small: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
            let large: Vec<u8> = (0..(200 << 10) as u32).map(|i| (i % 241) as u8).collect();
            runtime.block_on(async {
                let (res, _) = store
                    .write(file, 0, 4097, IoBuffer::Heap(small.clone()), 0, small.len())
                    .await;
                assert_eq!(res.expect("small write"), small.len());
                let (res, _) = store
                    .write(file, 1, 3, IoBuffer::Heap(large.clone()), 0, large.len())
                    .await;
                assert_eq!(res.expect("large write"), large.len());
                let (res, buf) = store
                    .read(file, 0, 0, IoBuffer::Heap(vec![1; 16 << 10]), 16 << 10)
                    .await;
                let (skip, n) = res.expect("small read");
                assert_eq!(n, 4097 + small.len());
                let got = &buf.as_slice(skip + n)[skip..];
                assert!(got[..4097].iter().all(|&b| b == 0), "the hole reads as zeros");
                assert_eq!(&got[4097..], &small[..]);
                let (res, buf) = store
                    .read(file, 1, 3, IoBuffer::Heap(vec![0; 256 << 10]), large.len())
                    .await;
                let (skip, n) = res.expect("large read");
                assert_eq!(&buf.as_slice(skip + n)[skip..], &large[..]);
                let (res, _) = store.read(file, 9, 0, IoBuffer::Heap(vec![0; 4096]), 4096).await;
                assert_eq!(res.expect("unwritten chunk").1, 0);
            })?;
        }
        Ok(())
    }
}
