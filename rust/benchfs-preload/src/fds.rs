//! Descriptors of BenchFS files and directories. Each number is a real descriptor the kernel
//! gave out (`O_PATH` of `/`), so no other file can get it and a call that bypasses this
//! library fails with EBADF; the table maps it to the open file description it stands for,
//! shared by `dup`s as the kernel's would be.

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

use benchfs_core::protocol::lock::new_owner;
use benchfs_core::shared::{ClientPool, SendHandle, SharedFile};

use crate::offsets::{Held, Position};
use crate::real;

/// An open BenchFS file or directory: what the kernel calls an open file description.
pub struct OpenFile {
    /// The BenchFS path it was opened at.
    pub path: String,
    pub dir: bool,
    /// The file's handle (never for a directory); opened at the first use when the
    /// description was inherited from the program before an `execve`.
    file: OnceLock<SharedFile>,
    /// The status flags: access mode, O_APPEND, O_NONBLOCK, O_DIRECT... (F_GETFL/F_SETFL).
    pub flags: AtomicI32,
    /// The file offset of read, write and lseek, shared with other processes holding the
    /// description; held for the whole call that moves it.
    pub position: Position,
    /// The pool whose clients serve it.
    pub pool: Arc<ClientPool>,
    /// Its OFD and flock locks' owner number, and whether it took any (locks.rs).
    pub lock_owner: u64,
    pub locked: AtomicBool,
}

impl OpenFile {
    pub fn new(
        path: String,
        file: Option<SharedFile>,
        flags: c_int,
        pool: Arc<ClientPool>,
    ) -> Result<OpenFile, c_int> {
        let dir = file.is_none();
        let cell = OnceLock::new();
        if let Some(f) = file {
            let _ = cell.set(f);
        }
        Ok(OpenFile {
            path,
            dir,
            file: cell,
            flags: AtomicI32::new(flags),
            position: Position::new(0)?,
            pool,
            lock_owner: new_owner(),
            locked: AtomicBool::new(false),
        })
    }

    /// A description a previous program of this process left open across `execve`.
    pub fn inherited(
        path: String,
        dir: bool,
        flags: c_int,
        position: Position,
        pool: Arc<ClientPool>,
    ) -> OpenFile {
        OpenFile {
            path,
            dir,
            file: OnceLock::new(),
            flags: AtomicI32::new(flags),
            position,
            pool,
            lock_owner: new_owner(),
            locked: AtomicBool::new(false),
        }
    }

    pub fn is_dir(&self) -> bool {
        self.dir
    }

    /// The handle if it was opened.
    pub fn opened(&self) -> Option<&SharedFile> {
        self.file.get()
    }

    /// The handle, opened now if the description was inherited; EISDIR for a directory.
    pub fn file(&self) -> Result<&SharedFile, c_int> {
        if self.dir {
            return Err(libc::EISDIR);
        }
        if let Some(f) = self.file.get() {
            return Ok(f);
        }
        let handle = crate::leased(&self.pool, "open", &self.path, |c| {
            c.open(&self.path, 0, 0).map(SendHandle::new)
        })?
        .into_inner();
        // Two threads may race here; one handle is kept, the other was only opened.
        let _ = self.file.set(SharedFile::new(handle));
        self.file.get().ok_or(libc::EIO)
    }

    pub fn offset(&self) -> Held<'_> {
        self.position.hold()
    }

    pub fn readable(&self) -> bool {
        self.flags.load(Ordering::Relaxed) & libc::O_ACCMODE != libc::O_WRONLY
    }

    pub fn writable(&self) -> bool {
        self.flags.load(Ordering::Relaxed) & libc::O_ACCMODE != libc::O_RDONLY
    }

    /// Tells the owner the size written through this description (if it wrote past what it
    /// last told), keeping the file open.
    pub fn publish(&self) -> Result<(), c_int> {
        let Some(file) = self.opened() else { return Ok(()) };
        if !file.unpublished() {
            return Ok(());
        }
        crate::leased(&self.pool, "close", &self.path, |c| file.on(c, |c, h| c.close(h)))
    }

    /// Closes the file, publishing the size written through it; the first error is returned.
    pub fn close(&self) -> Result<(), c_int> {
        let Some(file) = self.opened() else { return Ok(()) };
        if file.is_closed() {
            return Ok(());
        }
        crate::locks::on_last_close(self);
        if !file.unpublished() {
            // Nothing to tell the owner: no client is needed (a forked child that only
            // inherited the file need not connect to close it).
            let _ = file.take();
            return Ok(());
        }
        crate::leased(&self.pool, "close", &self.path, |c| file.close_on(c))
    }
}

impl Drop for OpenFile {
    fn drop(&mut self) {
        // The last descriptor went without an explicit close (dup2 over it, exit): publish
        // what was written all the same; an error has nobody left to tell but stderr.
        let _ = self.close();
    }
}

/// Descriptor numbers below this have a bit in [`MARKS`], so that a call on a descriptor that
/// is not BenchFS's (nearly all calls) costs one atomic load.
const MARKED: usize = 1 << 16;

static MARKS: [AtomicU64; MARKED / 64] = [const { AtomicU64::new(0) }; MARKED / 64];
static TABLE: RwLock<Option<HashMap<c_int, Arc<OpenFile>>>> = RwLock::new(None);

fn mark(fd: c_int, on: bool) {
    let fd = fd as usize;
    if fd < MARKED {
        let bit = 1u64 << (fd % 64);
        if on {
            MARKS[fd / 64].fetch_or(bit, Ordering::Release);
        } else {
            MARKS[fd / 64].fetch_and(!bit, Ordering::Release);
        }
    }
}

/// The open file behind `fd`, if BenchFS's.
pub fn lookup(fd: c_int) -> Option<Arc<OpenFile>> {
    if fd < 0 {
        return None;
    }
    let i = fd as usize;
    if i < MARKED && MARKS[i / 64].load(Ordering::Acquire) & (1u64 << (i % 64)) == 0 {
        return None;
    }
    let table = TABLE.read().unwrap_or_else(PoisonError::into_inner);
    table.as_ref()?.get(&fd).cloned()
}

/// Records `fd` as standing for `file` (replacing whatever it stood for, which is returned).
pub fn insert(fd: c_int, file: Arc<OpenFile>) -> Option<Arc<OpenFile>> {
    let mut table = TABLE.write().unwrap_or_else(PoisonError::into_inner);
    let old = table.get_or_insert_with(HashMap::new).insert(fd, file);
    mark(fd, true);
    old
}

/// Forgets `fd` (the caller closes the number); its open file is returned.
pub fn remove(fd: c_int) -> Option<Arc<OpenFile>> {
    let mut table = TABLE.write().unwrap_or_else(PoisonError::into_inner);
    mark(fd, false);
    table.as_mut()?.remove(&fd)
}

/// A new descriptor number: a real `O_PATH` descriptor of `/`, close-on-exec if asked.
pub fn reserve(cloexec: bool) -> Result<c_int, c_int> {
    let flags = libc::O_PATH | libc::O_DIRECTORY | if cloexec { libc::O_CLOEXEC } else { 0 };
    // SAFETY: a valid path; openat has no other effect.
    let fd = unsafe { real::openat(libc::AT_FDCWD, c"/".as_ptr(), flags, 0) };
    if fd < 0 {
        Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EMFILE))
    } else {
        Ok(fd)
    }
}

/// Takes `file` under a new number (open, dup): reserved, recorded, returned.
pub fn install(file: Arc<OpenFile>, cloexec: bool) -> Result<c_int, c_int> {
    crate::process::setup();
    let fd = reserve(cloexec)?;
    insert(fd, file);
    Ok(fd)
}

/// The largest size a file open in this process at `path` knows it has written (sizes are
/// published at close, so a stat before then would miss them).
pub fn written_size(path: &str) -> Option<u64> {
    let table = TABLE.read().unwrap_or_else(PoisonError::into_inner);
    table
        .as_ref()?
        .values()
        .filter(|f| f.path == path)
        .filter_map(|f| f.opened().and_then(SharedFile::size))
        .max()
}

/// Every descriptor and what it stands for (for exit and exec).
pub fn all() -> Vec<(c_int, Arc<OpenFile>)> {
    let table = TABLE.read().unwrap_or_else(PoisonError::into_inner);
    table
        .as_ref()
        .map_or_else(Vec::new, |t| t.iter().map(|(fd, f)| (*fd, f.clone())).collect())
}
