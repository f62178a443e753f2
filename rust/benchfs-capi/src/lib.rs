//! `libbenchfs.so`: the C ABI of the BenchFS client, declared in `include/benchfs.h` (the
//! reference for callers; docs/capi.md has examples). Thin over `benchfs_core::client`: every
//! entry point catches panics (-EIO), checks its pointers, and reports failures as negative
//! errno values, with a message kept per thread (`benchfs_last_error`).
//!
//! Threads. The core `Client` is single-threaded (an `Rc` and `Cell`s inside), so the library
//! keeps a bounded pool of clients (`benchfs_core::shared::ClientPool`, up to the limit given
//! to `benchfs_init`): a call leases one, uses it alone, and returns it. A file handle is a
//! heap object with its own mutex, served by whichever client a call leases.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use benchfs_core::client::{Client, FileHandle};
use benchfs_core::config;
use benchfs_core::namespace::{Attr, Kind};
use benchfs_core::posix;
use benchfs_core::protocol::lock::{LockClass, LockCmd, LockRequest, LockType};
use benchfs_core::protocol::meta::FindRequest;
use benchfs_core::shared::{ClientPool, Lease};
use benchfs_core::Error;

/// Clients in the pool when `benchfs_init` is given 0.
const DEFAULT_CLIENTS: c_uint = 4;
/// The most clients a process may ask for (each has its own UCX worker and io_uring ring).
const MAX_CLIENTS: c_uint = 64;
/// Values of `type` in readdir callbacks (Linux's DT_DIR, DT_REG and DT_LNK).
const DT_DIR: c_int = 4;
const DT_REG: c_int = 8;
const DT_LNK: c_int = 10;

static VERSION: &CStr = match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
    Ok(v) => v,
    Err(_) => panic!("version string has an interior NUL"),
};

/// A failure on its way to C: the errno to return and the message for `benchfs_last_error`.
struct Fail {
    errno: i32,
    message: String,
}

impl Fail {
    fn new(errno: i32, message: impl Into<String>) -> Fail {
        Fail {
            errno,
            message: message.into(),
        }
    }
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        let errno = e.errno();
        // A positive errno is the contract; anything else would read as success or garbage.
        Fail::new(if errno > 0 { errno } else { libc::EIO }, e.to_string())
    }
}

fn shutdown() -> Fail {
    Fail::new(
        libc::ESHUTDOWN,
        "libbenchfs is not initialized (benchfs_init was not called, or benchfs_finalize was)",
    )
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: String) {
    let c = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    // During thread teardown the slot may be gone; the errno still reaches the caller.
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = c);
}

/// The C return types: `int` and `ssize_t` carry -errno on failure.
trait Ret {
    fn from_errno(errno: i32) -> Self;
}

impl Ret for c_int {
    fn from_errno(errno: i32) -> Self {
        -errno
    }
}

impl Ret for isize {
    fn from_errno(errno: i32) -> Self {
        -(errno as isize)
    }
}

/// Runs one entry point: a panic becomes -EIO (never unwinds into C), a failure -errno, and
/// both leave their message for `benchfs_last_error`.
fn ffi<R: Ret>(op: &str, f: impl FnOnce() -> Result<R, Fail>) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(fail)) => {
            set_last_error(format!("{op}: {}", fail.message));
            R::from_errno(fail.errno)
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last_error(format!("{op}: internal error: {what}"));
            R::from_errno(libc::EIO)
        }
    }
}

/// A client of `pool`; a closed pool (after `benchfs_finalize`) is ESHUTDOWN with its message.
fn lease(pool: &Arc<ClientPool>) -> Result<Lease, Fail> {
    pool.lease().map_err(|e| match e {
        Error::Stopped => shutdown(),
        other => other.into(),
    })
}

/// A string argument: NULL and bad UTF-8 are EINVAL (no path can be either).
///
/// # Safety
/// `p` is NULL or a NUL-terminated string valid for the call.
unsafe fn str_arg<'a>(p: *const c_char, what: &str) -> Result<&'a str, Fail> {
    if p.is_null() {
        return Err(Fail::new(libc::EINVAL, format!("{what} is NULL")));
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| Fail::new(libc::EINVAL, format!("{what} is not valid UTF-8")))
}

static LIBRARY: RwLock<Option<Arc<ClientPool>>> = RwLock::new(None);

fn current() -> Result<Arc<ClientPool>, Fail> {
    LIBRARY
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
        .ok_or_else(shutdown)
}

/// Runs `f` on a leased client of the current library state.
fn with_client<R>(f: impl FnOnce(&Client) -> Result<R, Error>) -> Result<R, Fail> {
    let pool = current()?;
    let lease = lease(&pool)?;
    Ok(f(lease.client()?)?)
}

/// An open file (`benchfs_file` in C). The pool is the one it was opened with, so a file
/// outliving `benchfs_finalize` fails with ESHUTDOWN instead of reaching a newer pool.
pub struct BenchfsFile {
    pool: Arc<ClientPool>,
    handle: Mutex<FileHandle>,
    /// This handle's lock owner number (its locks are OFD locks), and whether it took any.
    lock_owner: u64,
    locked: std::sync::atomic::AtomicBool,
}

/// Runs `f` on an open file and a leased client: the file's mutex first, then the pool's.
///
/// # Safety
/// `file` is NULL or a handle from `benchfs_open`/`benchfs_create` not yet closed.
unsafe fn with_file<R>(
    file: *mut BenchfsFile,
    f: impl FnOnce(&Client, &FileHandle) -> Result<R, Error>,
) -> Result<R, Fail> {
    // SAFETY: NULL or a live handle by the caller's contract.
    let file = unsafe { file.as_ref() }.ok_or_else(|| Fail::new(libc::EBADF, "file handle is NULL"))?;
    let handle = file
        .handle
        .lock()
        .map_err(|_| Fail::new(libc::EIO, "file state unknown after an internal error; close it"))?;
    let lease = lease(&file.pool)?;
    Ok(f(lease.client()?, &handle)?)
}

/// The namespace flags for open(2)-style `flags` (see benchfs.h).
fn open_flags(flags: c_int, create: bool) -> Result<u32, Fail> {
    if flags & libc::O_APPEND != 0 {
        return Err(Fail::new(
            libc::EINVAL,
            "O_APPEND is not supported: writes are positional (benchfs_pwrite)",
        ));
    }
    Ok(posix::namespace_flags(if create {
        flags | libc::O_CREAT
    } else {
        flags
    }))
}

/// # Safety
/// `path` as for `str_arg`; `out` NULL or writable.
unsafe fn open_common(
    op: &str,
    path: *const c_char,
    flags: c_int,
    mode: u32,
    create: bool,
    out: *mut *mut BenchfsFile,
) -> c_int {
    ffi(op, || {
        if out.is_null() {
            return Err(Fail::new(libc::EFAULT, "out is NULL"));
        }
        // SAFETY: `out` is non-null and writable by contract; cleared so a failure never
        // leaves a stale handle behind.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: by contract.
        let path = unsafe { str_arg(path, "path") }?;
        let ns = open_flags(flags, create)?;
        let pool = current()?;
        let handle = {
            let lease = lease(&pool)?;
            lease.client()?.open(path, ns, mode & 0o7777)?
        };
        let file = Box::new(BenchfsFile {
            pool,
            handle: Mutex::new(handle),
            lock_owner: benchfs_core::protocol::lock::new_owner(),
            locked: std::sync::atomic::AtomicBool::new(false),
        });
        // SAFETY: checked above.
        unsafe { out.write(Box::into_raw(file)) };
        Ok(0)
    })
}

/// Connects to the cluster whose servers registered in `registry_dir` (NULL: the configured
/// `cluster.registry_dir`).
///
/// # Safety
/// Pointer arguments are NULL or valid NUL-terminated strings; `overrides` is NULL or a
/// NULL-terminated array of them. See benchfs.h.
#[no_mangle]
pub unsafe extern "C" fn benchfs_init(
    registry_dir: *const c_char,
    config_path: *const c_char,
    overrides: *const *const c_char,
    max_clients: c_uint,
) -> c_int {
    ffi("benchfs_init", || {
        let registry_arg = if registry_dir.is_null() {
            None
        } else {
            // SAFETY: by contract.
            Some(PathBuf::from(unsafe { str_arg(registry_dir, "registry_dir") }?))
        };
        let config_file = if config_path.is_null() {
            None
        } else {
            // SAFETY: by contract.
            Some(PathBuf::from(unsafe { str_arg(config_path, "config_path") }?))
        };
        let mut items = Vec::new();
        if !overrides.is_null() {
            for i in 0.. {
                // SAFETY: a NULL-terminated array by contract; we stop at the NULL.
                let item = unsafe { *overrides.add(i) };
                if item.is_null() {
                    break;
                }
                // SAFETY: by contract.
                items.push(unsafe { str_arg(item, "override") }?.to_string());
            }
        }
        if max_clients > MAX_CLIENTS {
            return Err(Fail::new(
                libc::EINVAL,
                format!("max_clients {max_clients} is over the limit of {MAX_CLIENTS}"),
            ));
        }
        let limit = if max_clients == 0 {
            DEFAULT_CLIENTS
        } else {
            max_clients
        } as usize;
        let config = config::resolve(config_file.as_deref(), &config::process_env(), &items)?;
        // As for benchfsd: the argument, else cluster.registry_dir ($BENCHFS_REGISTRY).
        let registry = match registry_arg {
            Some(r) => r,
            None if !config.cluster.registry_dir.is_empty() => PathBuf::from(&config.cluster.registry_dir),
            None => {
                return Err(Fail::new(
                    libc::EINVAL,
                    "registry_dir is NULL and cluster.registry_dir is not set (BENCHFS_REGISTRY)",
                ))
            }
        };
        let mut library = LIBRARY.write().unwrap_or_else(PoisonError::into_inner);
        if library.is_some() {
            return Err(Fail::new(
                libc::EALREADY,
                "already initialized (call benchfs_finalize first)",
            ));
        }
        let pool = ClientPool::new(registry, config, limit);
        // One client now, so that a missing cluster fails here rather than at the first open.
        drop(lease(&pool)?);
        *library = Some(pool);
        Ok(0)
    })
}

/// Disconnects. Open files fail with -ESHUTDOWN afterwards (close still frees them).
#[no_mangle]
pub extern "C" fn benchfs_finalize() -> c_int {
    ffi("benchfs_finalize", || {
        let pool = LIBRARY
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .ok_or_else(shutdown)?;
        pool.close();
        Ok(0)
    })
}

/// # Safety
/// See benchfs.h: `path` a string, `out` writable.
#[no_mangle]
pub unsafe extern "C" fn benchfs_create(
    path: *const c_char,
    flags: c_int,
    mode: libc::mode_t,
    out: *mut *mut BenchfsFile,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { open_common("benchfs_create", path, flags, mode, true, out) }
}

/// # Safety
/// See benchfs.h: `path` a string, `out` writable.
#[no_mangle]
pub unsafe extern "C" fn benchfs_open(
    path: *const c_char,
    flags: c_int,
    out: *mut *mut BenchfsFile,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { open_common("benchfs_open", path, flags, 0o644, false, out) }
}

/// # Safety
/// `file` is NULL or an open handle, which this call frees (whatever it returns).
#[no_mangle]
pub unsafe extern "C" fn benchfs_close(file: *mut BenchfsFile) -> c_int {
    ffi("benchfs_close", || {
        if file.is_null() {
            return Err(Fail::new(libc::EBADF, "file handle is NULL"));
        }
        // SAFETY: an open handle by contract, made by Box::into_raw; freed on every path.
        let file = unsafe { Box::from_raw(file) };
        let release = file
            .locked
            .load(std::sync::atomic::Ordering::Relaxed)
            .then(|| LockRequest::release(file.lock_owner, LockClass::Fcntl));
        let handle = file
            .handle
            .into_inner()
            .map_err(|_| Fail::new(libc::EIO, "file state unknown after an internal error"))?;
        let lease = lease(&file.pool)?;
        let client = lease.client()?;
        if let Some(release) = release {
            // Its locks go with it; the size is published below whatever this says.
            let _ = client.lock(&handle, &release);
        }
        client.close(&handle)?;
        Ok(0)
    })
}

/// # Safety
/// `file` NULL or open; `buf` valid for reading `count` bytes.
#[no_mangle]
pub unsafe extern "C" fn benchfs_pwrite(
    file: *mut BenchfsFile,
    buf: *const c_void,
    count: usize,
    offset: i64,
) -> isize {
    ffi("benchfs_pwrite", || {
        let offset = u64::try_from(offset).map_err(|_| Fail::new(libc::EINVAL, "negative offset"))?;
        if count > isize::MAX as usize {
            return Err(Fail::new(libc::EINVAL, "count is over SSIZE_MAX"));
        }
        let data: &[u8] = if count == 0 {
            &[]
        } else if buf.is_null() {
            return Err(Fail::new(libc::EFAULT, "buf is NULL"));
        } else {
            // SAFETY: valid for `count` bytes by contract.
            unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), count) }
        };
        // SAFETY: by contract.
        let n = unsafe { with_file(file, |c, h| c.write(h, offset, data)) }?;
        Ok(n as isize)
    })
}

/// # Safety
/// `file` NULL or open; `buf` valid for writing `count` bytes.
#[no_mangle]
pub unsafe extern "C" fn benchfs_pread(
    file: *mut BenchfsFile,
    buf: *mut c_void,
    count: usize,
    offset: i64,
) -> isize {
    ffi("benchfs_pread", || {
        let offset = u64::try_from(offset).map_err(|_| Fail::new(libc::EINVAL, "negative offset"))?;
        if count > isize::MAX as usize {
            return Err(Fail::new(libc::EINVAL, "count is over SSIZE_MAX"));
        }
        let dest: &mut [u8] = if count == 0 {
            &mut []
        } else if buf.is_null() {
            return Err(Fail::new(libc::EFAULT, "buf is NULL"));
        } else {
            // SAFETY: valid for writing `count` bytes by contract.
            unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), count) }
        };
        // SAFETY: by contract.
        let n = unsafe { with_file(file, |c, h| c.read(h, offset, dest)) }?;
        Ok(n as isize)
    })
}

/// # Safety
/// `file` NULL or open.
#[no_mangle]
pub unsafe extern "C" fn benchfs_fsync(file: *mut BenchfsFile) -> c_int {
    ffi("benchfs_fsync", || {
        // SAFETY: by contract.
        unsafe { with_file(file, |c, h| c.fsync(h)) }?;
        Ok(0)
    })
}

fn lock_request(file: &BenchfsFile, kind: LockType, start: u64, end: u64, cmd: LockCmd) -> LockRequest {
    LockRequest {
        owner: file.lock_owner,
        start,
        end,
        pid: 0,
        class: LockClass::Fcntl,
        kind,
        cmd,
    }
}

/// # Safety
/// `file` NULL or open.
#[no_mangle]
pub unsafe extern "C" fn benchfs_lock(
    file: *mut BenchfsFile,
    kind: c_int,
    start: i64,
    len: i64,
    wait: c_int,
) -> c_int {
    ffi("benchfs_lock", || {
        let kind = match kind {
            libc::F_RDLCK => LockType::Read,
            libc::F_WRLCK => LockType::Write,
            libc::F_UNLCK => LockType::Unlock,
            other => {
                return Err(Fail::new(
                    libc::EINVAL,
                    format!("lock type {other}: not F_RDLCK, F_WRLCK or F_UNLCK"),
                ))
            }
        };
        if start < 0 || len < 0 {
            return Err(Fail::new(
                libc::EINVAL,
                format!("lock range start {start}, length {len}: negative"),
            ));
        }
        let end = if len == 0 {
            u64::MAX
        } else {
            (start as u64).saturating_add(len as u64)
        };
        // SAFETY: by contract.
        let f = unsafe { file.as_ref() }.ok_or_else(|| Fail::new(libc::EBADF, "file handle is NULL"))?;
        if kind != LockType::Unlock {
            f.locked.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let req = lock_request(
            f,
            kind,
            start as u64,
            end,
            if wait != 0 { LockCmd::SetWait } else { LockCmd::Set },
        );
        // SAFETY: by contract.
        match unsafe { with_file(file, |c, h| c.lock(h, &req)) }? {
            None => Ok(0),
            Some(_) => Err(Fail::new(libc::EAGAIN, "another holder's lock conflicts")),
        }
    })
}

/// What `benchfs_stat` fills (`struct benchfs_stat` in benchfs.h; the layouts must match).
#[repr(C)]
pub struct BenchfsStat {
    pub size: u64,
    pub mode: u32,
    pub stripe_count: u32,
    pub chunk_size: u64,
    pub mtime_ns: u64,
    pub ctime_ns: u64,
    pub stripe_start: u32,
    pub reserved: u32,
    pub id: [u8; 16],
}

const _: () = assert!(std::mem::size_of::<BenchfsStat>() == 64);

impl From<&Attr> for BenchfsStat {
    fn from(a: &Attr) -> BenchfsStat {
        let kind = match a.kind {
            Kind::File => libc::S_IFREG,
            Kind::Dir => libc::S_IFDIR,
            Kind::Symlink => libc::S_IFLNK,
        };
        BenchfsStat {
            size: a.size,
            mode: kind | (a.mode & 0o7777),
            stripe_count: a.layout.stripe_count,
            chunk_size: a.layout.chunk_size,
            mtime_ns: a.mtime_ns,
            ctime_ns: a.ctime_ns,
            stripe_start: a.layout.start,
            reserved: 0,
            id: a.id.0.to_be_bytes(),
        }
    }
}

/// # Safety
/// `path` a string; `st` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn benchfs_stat(path: *const c_char, st: *mut BenchfsStat) -> c_int {
    ffi("benchfs_stat", || {
        // SAFETY: by contract.
        let path = unsafe { str_arg(path, "path") }?;
        if st.is_null() {
            return Err(Fail::new(libc::EFAULT, "st is NULL"));
        }
        let attr = with_client(|c| c.stat(path))?;
        // SAFETY: non-null and writable by contract.
        unsafe { st.write(BenchfsStat::from(&attr)) };
        Ok(0)
    })
}

/// # Safety
/// `path` a string, `st` writable.
#[no_mangle]
pub unsafe extern "C" fn benchfs_lstat(path: *const c_char, st: *mut BenchfsStat) -> c_int {
    ffi("benchfs_lstat", || {
        // SAFETY: by contract.
        let path = unsafe { str_arg(path, "path") }?;
        if st.is_null() {
            return Err(Fail::new(libc::EFAULT, "st is NULL"));
        }
        let attr = with_client(|c| c.lstat(path))?;
        // SAFETY: non-null and writable by contract.
        unsafe { st.write(BenchfsStat::from(&attr)) };
        Ok(0)
    })
}

/// # Safety
/// `target` and `path` strings.
#[no_mangle]
pub unsafe extern "C" fn benchfs_symlink(target: *const c_char, path: *const c_char) -> c_int {
    ffi("benchfs_symlink", || {
        // SAFETY: by contract.
        let target = unsafe { str_arg(target, "target") }?;
        // SAFETY: by contract.
        let path = unsafe { str_arg(path, "path") }?;
        with_client(|c| c.symlink(target, path))?;
        Ok(0)
    })
}

/// # Safety
/// `path` a string, `buf` writable for `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn benchfs_readlink(path: *const c_char, buf: *mut c_char, size: usize) -> isize {
    ffi("benchfs_readlink", || {
        // SAFETY: by contract.
        let path = unsafe { str_arg(path, "path") }?;
        if buf.is_null() && size > 0 {
            return Err(Fail::new(libc::EFAULT, "buf is NULL"));
        }
        let target = with_client(|c| c.readlink(path))?;
        let n = target.len().min(size);
        // SAFETY: writable for `size` bytes by contract; n <= size.
        unsafe { std::ptr::copy_nonoverlapping(target.as_ptr(), buf.cast::<u8>(), n) };
        Ok(n as isize)
    })
}

/// What `benchfs_statfs` fills (`struct benchfs_statfs` in benchfs.h; the layouts must match).
#[repr(C)]
pub struct BenchfsStatfs {
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub avail_bytes: u64,
    pub files: u64,
    pub servers: u32,
    pub unreachable: u32,
    pub reserved: u64,
}

const _: () = assert!(std::mem::size_of::<BenchfsStatfs>() == 48);

/// # Safety
/// `st` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn benchfs_statfs(st: *mut BenchfsStatfs) -> c_int {
    ffi("benchfs_statfs", || {
        if st.is_null() {
            return Err(Fail::new(libc::EFAULT, "st is NULL"));
        }
        let c = with_client(|c| c.statfs())?;
        let out = BenchfsStatfs {
            total_bytes: c.total.total_bytes,
            free_bytes: c.total.free_bytes,
            avail_bytes: c.total.avail_bytes,
            files: c.total.inodes,
            servers: c.servers.len() as u32,
            unreachable: c.unreachable() as u32,
            reserved: 0,
        };
        // SAFETY: non-null and writable by contract.
        unsafe { st.write(out) };
        Ok(0)
    })
}

/// # Safety
/// `path` a string; `hashes` NULL or writable for `max` x 16 bytes; `chunk_size` and `count`
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn benchfs_checksum(
    path: *const c_char,
    chunk_size: *mut u64,
    hashes: *mut u8,
    max: usize,
    count: *mut usize,
) -> c_int {
    ffi("benchfs_checksum", || {
        // SAFETY: by contract.
        let path = unsafe { str_arg(path, "path") }?;
        if hashes.is_null() && max > 0 {
            return Err(Fail::new(libc::EFAULT, "hashes is NULL"));
        }
        let sum = with_client(|c| c.checksum(path))?;
        for (i, h) in sum.chunks.iter().take(max).enumerate() {
            // Most significant byte first, as xxhsum prints it.
            // SAFETY: i < max, and `hashes` holds max x 16 bytes by contract.
            unsafe { std::ptr::copy_nonoverlapping(h.to_be_bytes().as_ptr(), hashes.add(i * 16), 16) };
        }
        // SAFETY: NULL or writable by contract.
        if let Some(out) = unsafe { chunk_size.as_mut() } {
            *out = sum.chunk_size;
        }
        // SAFETY: NULL or writable by contract.
        if let Some(out) = unsafe { count.as_mut() } {
            *out = sum.chunks.len();
        }
        Ok(0)
    })
}

/// # Safety
/// `path` a string.
#[no_mangle]
pub unsafe extern "C" fn benchfs_unlink(path: *const c_char) -> c_int {
    ffi("benchfs_unlink", || {
        // SAFETY: by contract.
        let path = unsafe { str_arg(path, "path") }?;
        with_client(|c| c.unlink(path))?;
        Ok(0)
    })
}

/// # Safety
/// `path` a string.
#[no_mangle]
pub unsafe extern "C" fn benchfs_mkdir(path: *const c_char, mode: libc::mode_t) -> c_int {
    ffi("benchfs_mkdir", || {
        // SAFETY: by contract.
        let path = unsafe { str_arg(path, "path") }?;
        with_client(|c| c.mkdir(path, mode & 0o7777))?;
        Ok(0)
    })
}

/// # Safety
/// `path` a string.
#[no_mangle]
pub unsafe extern "C" fn benchfs_rmdir(path: *const c_char) -> c_int {
    ffi("benchfs_rmdir", || {
        // SAFETY: by contract.
        let path = unsafe { str_arg(path, "path") }?;
        with_client(|c| c.rmdir(path))?;
        Ok(0)
    })
}

/// The readdir callback: `(arg, name, type)`; non-zero stops the listing.
pub type ReaddirCallback = Option<unsafe extern "C" fn(*mut c_void, *const c_char, c_int) -> c_int>;

/// Lists a directory: the whole listing is fetched first, then `callback` runs per entry with
/// no lock held (so it may call this library).
///
/// # Safety
/// `path` a string; `callback` NULL or a function safe to call with `arg`.
#[no_mangle]
pub unsafe extern "C" fn benchfs_readdir(
    path: *const c_char,
    callback: ReaddirCallback,
    arg: *mut c_void,
) -> c_int {
    ffi("benchfs_readdir", || {
        // SAFETY: by contract.
        let path = unsafe { str_arg(path, "path") }?;
        let callback = callback.ok_or_else(|| Fail::new(libc::EFAULT, "callback is NULL"))?;
        let entries = with_client(|c| c.readdir(path))?;
        let names = entries
            .into_iter()
            .map(|e| {
                let kind = match e.kind {
                    Kind::File => DT_REG,
                    Kind::Dir => DT_DIR,
                    Kind::Symlink => DT_LNK,
                };
                CString::new(e.name)
                    .map(|n| (n, kind))
                    .map_err(|_| Fail::new(libc::EPROTO, "a server sent an entry name with a NUL byte"))
            })
            .collect::<Result<Vec<_>, Fail>>()?;
        for (name, kind) in &names {
            // SAFETY: the caller vouches for the callback; `name` lives across the call.
            let stop = unsafe { callback(arg, name.as_ptr(), *kind) };
            if stop != 0 {
                return Ok(stop);
            }
        }
        Ok(0)
    })
}

pub type FindCallback = Option<unsafe extern "C" fn(*mut c_void, *const c_char, c_int, u64, u64) -> c_int>;

/// A find run on the servers (docs/capi.md): the matches are fetched first, then `callback`
/// runs per match in path order with no lock held; the counts go to `examined` and `matched`
/// when they are not NULL. A NULL `name` matches any name; `kind` 0 any, else
/// BENCHFS_DT_REG or BENCHFS_DT_DIR; `newer_ns` 0 any.
///
/// # Safety
/// `root` a string; `name` NULL or a string; `callback` NULL (counts only) or a function
/// taking `arg`; `examined`, `matched` NULL or writable.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn benchfs_find(
    root: *const c_char,
    name: *const c_char,
    kind: c_int,
    size_min: u64,
    size_max: u64,
    newer_ns: u64,
    callback: FindCallback,
    arg: *mut c_void,
    examined: *mut u64,
    matched: *mut u64,
) -> c_int {
    ffi("benchfs_find", || {
        // SAFETY: by contract.
        let root = unsafe { str_arg(root, "root") }?;
        // SAFETY: by contract.
        let name = if name.is_null() {
            ""
        } else {
            unsafe { str_arg(name, "name") }?
        };
        let kind = match kind {
            0 => None,
            DT_REG => Some(Kind::File),
            DT_DIR => Some(Kind::Dir),
            other => {
                return Err(Fail::new(
                    libc::EINVAL,
                    format!("kind {other}: 0, BENCHFS_DT_REG or BENCHFS_DT_DIR"),
                ))
            }
        };
        let req = FindRequest {
            name: name.to_string(),
            kind,
            size_min,
            size_max,
            newer_ns,
            count_only: callback.is_none(),
            ..FindRequest::new(root)
        };
        let result = with_client(|c| c.find(&req))?;
        // SAFETY: NULL or writable, by contract.
        unsafe {
            if !examined.is_null() {
                *examined = result.examined;
            }
            if !matched.is_null() {
                *matched = result.matched;
            }
        }
        let Some(callback) = callback else {
            return Ok(0);
        };
        for f in result.found {
            let path = CString::new(f.path)
                .map_err(|_| Fail::new(libc::EPROTO, "a server sent a path with a NUL byte"))?;
            let kind = if f.kind == Kind::Dir { DT_DIR } else { DT_REG };
            // SAFETY: the caller vouches for the callback; `path` lives across the call.
            let stop = unsafe { callback(arg, path.as_ptr(), kind, f.size, f.mtime_ns) };
            if stop != 0 {
                return Ok(stop);
            }
        }
        Ok(0)
    })
}

/// # Safety
/// `from` and `to` strings.
#[no_mangle]
pub unsafe extern "C" fn benchfs_rename(from: *const c_char, to: *const c_char) -> c_int {
    ffi("benchfs_rename", || {
        // SAFETY: by contract.
        let (from, to) = unsafe { (str_arg(from, "from")?, str_arg(to, "to")?) };
        with_client(|c| c.rename(from, to))?;
        Ok(0)
    })
}

/// # Safety
/// `path` a string.
#[no_mangle]
pub unsafe extern "C" fn benchfs_truncate(path: *const c_char, size: i64) -> c_int {
    ffi("benchfs_truncate", || {
        // SAFETY: by contract.
        let path = unsafe { str_arg(path, "path") }?;
        let size = u64::try_from(size).map_err(|_| Fail::new(libc::EINVAL, "negative size"))?;
        with_client(|c| c.truncate(path, size))?;
        Ok(0)
    })
}

/// The message of this thread's last failed call ("" if none); valid until this thread's next
/// failing call.
#[no_mangle]
pub extern "C" fn benchfs_last_error() -> *const c_char {
    LAST_ERROR
        .try_with(|slot| slot.borrow().as_ptr())
        .unwrap_or(c"".as_ptr())
}

/// The library's version ("0.1.0"), a static string.
#[no_mangle]
pub extern "C" fn benchfs_version() -> *const c_char {
    VERSION.as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

    use benchfs_core::protocol::meta;
    use benchfs_core::server::{ServerHandle, ServerOptions};

    /// Tests that touch the process-wide library state take turns.
    static GLOBAL: Mutex<()> = Mutex::new(());

    fn errno_of(rc: c_int) -> String {
        // SAFETY: the message pointer is valid until this thread's next failure.
        let msg = unsafe { CStr::from_ptr(benchfs_last_error()) };
        format!("rc {rc}: {}", msg.to_string_lossy())
    }

    fn pattern(seed: u64, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (seed.wrapping_mul(31).wrapping_add(i as u64 / 7)) as u8)
            .collect()
    }

    /// One thread's file: create, two writes, close, open, read back, stat, unlink.
    fn file_round_trip(i: u64) -> Result<(), String> {
        let path = CString::new(format!("/t{i}")).map_err(|e| e.to_string())?;
        let data = pattern(i, 300 * 1024);
        let mut f: *mut BenchfsFile = std::ptr::null_mut();
        // SAFETY: valid strings, buffers and handles throughout.
        unsafe {
            let rc = benchfs_create(path.as_ptr(), libc::O_EXCL, 0o600, &mut f);
            if rc != 0 {
                return Err(errno_of(rc));
            }
            for offset in [0i64, 1 << 20] {
                let n = benchfs_pwrite(f, data.as_ptr().cast(), data.len(), offset);
                if n != data.len() as isize {
                    return Err(format!("pwrite {n}"));
                }
            }
            let rc = benchfs_close(f);
            if rc != 0 {
                return Err(errno_of(rc));
            }
            let rc = benchfs_open(path.as_ptr(), libc::O_RDONLY, &mut f);
            if rc != 0 {
                return Err(errno_of(rc));
            }
            let mut back = vec![0u8; data.len()];
            let n = benchfs_pread(f, back.as_mut_ptr().cast(), back.len(), 1 << 20);
            benchfs_close(f);
            if n != data.len() as isize || back != data {
                return Err(format!("read {n} bytes, equal: {}", back == data));
            }
            let mut st: BenchfsStat = std::mem::zeroed();
            let rc = benchfs_stat(path.as_ptr(), &mut st);
            if rc != 0 || st.size != (1 << 20) + data.len() as u64 || st.mode != libc::S_IFREG | 0o600 {
                return Err(format!("stat rc {rc} size {} mode {:o}", st.size, st.mode));
            }
            let rc = benchfs_unlink(path.as_ptr());
            if rc != 0 {
                return Err(errno_of(rc));
            }
        }
        Ok(())
    }

    #[test]
    fn threads_share_a_bounded_pool_and_finalize_ends_open_files() -> Result<(), String> {
        let _turn = GLOBAL.lock().unwrap_or_else(PoisonError::into_inner);
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let registry = dir.path().join("registry");
        let overrides = [
            "cluster.expected_servers=2",
            "cluster.connect_timeout_s=10",
            "layout.chunk_size=65536",
            "client.request_timeout_s=10",
            "storage.buffer_count=8",
        ];
        let config = config::resolve(None, &Default::default(), &overrides.map(String::from))
            .map_err(|e| e.to_string())?;
        let mut servers = (0..2)
            .map(|id| {
                ServerHandle::spawn(ServerOptions {
                    id,
                    node: format!("capi-{id}"),
                    domain: String::new(),
                    data_dir: dir.path().join(format!("data-{id}")),
                    registry_dir: registry.clone(),
                    config: config.clone(),
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;

        let c_registry = CString::new(registry.to_string_lossy().as_bytes()).map_err(|e| e.to_string())?;
        let c_overrides: Vec<CString> = overrides.iter().filter_map(|o| CString::new(*o).ok()).collect();
        let mut ptrs: Vec<*const c_char> = c_overrides.iter().map(|o| o.as_ptr()).collect();
        ptrs.push(std::ptr::null());
        // SAFETY: valid strings and a NULL-terminated array.
        let rc = unsafe { benchfs_init(c_registry.as_ptr(), std::ptr::null(), ptrs.as_ptr(), 2) };
        assert_eq!(rc, 0, "{}", errno_of(rc));
        // SAFETY: as above.
        let again = unsafe { benchfs_init(c_registry.as_ptr(), std::ptr::null(), ptrs.as_ptr(), 2) };
        assert_eq!(again, -libc::EALREADY);

        // Six threads, two clients: they wait their turn and all succeed.
        let results: Vec<Result<(), String>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..6).map(|i| s.spawn(move || file_round_trip(i))).collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into())))
                .collect()
        });
        for r in results {
            r?;
        }
        let pool = current().map_err(|f| f.message)?;
        let (live, idle) = pool.counts();
        assert!((1..=2).contains(&live), "{live} clients for a limit of 2");
        assert_eq!(idle, live, "every client came back");
        drop(pool);

        // A file open across finalize fails cleanly, and close still frees it.
        let mut f: *mut BenchfsFile = std::ptr::null_mut();
        // SAFETY: valid string and out pointer.
        let rc = unsafe { benchfs_create(c"/late".as_ptr(), 0, 0o644, &mut f) };
        assert_eq!(rc, 0, "{}", errno_of(rc));
        assert_eq!(benchfs_finalize(), 0);
        let mut byte = 0u8;
        // SAFETY: `f` is open (its pool is finalized); the buffer is one byte.
        unsafe {
            assert_eq!(
                benchfs_pread(f, (&mut byte as *mut u8).cast(), 1, 0),
                -(libc::ESHUTDOWN as isize)
            );
            assert_eq!(benchfs_close(f), -libc::ESHUTDOWN);
        }
        assert_eq!(benchfs_finalize(), -libc::ESHUTDOWN);
        for s in &mut servers {
            s.stop().map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    #[test]
    fn flags_map_to_namespace_flags() {
        assert!(matches!(open_flags(libc::O_RDWR, false), Ok(0)));
        assert!(
            matches!(open_flags(libc::O_CREAT | libc::O_EXCL, false), Ok(f) if f == meta::CREATE | meta::EXCLUSIVE)
        );
        // O_EXCL means nothing without O_CREAT (as in open(2) on regular files).
        assert!(matches!(open_flags(libc::O_EXCL, false), Ok(0)));
        assert!(matches!(open_flags(libc::O_TRUNC, true), Ok(f) if f == meta::CREATE | meta::TRUNCATE));
        assert!(matches!(open_flags(libc::O_APPEND, true), Err(f) if f.errno == libc::EINVAL));
    }

    #[test]
    fn calls_before_init_fail_with_eshutdown_and_a_message() {
        let _turn = GLOBAL.lock().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: a valid string and a writable out pointer.
        let rc = unsafe { benchfs_unlink(c"/x".as_ptr()) };
        assert_eq!(rc, -libc::ESHUTDOWN);
        // SAFETY: the returned pointer is a valid string until the next failure on this thread.
        let msg = unsafe { CStr::from_ptr(benchfs_last_error()) }
            .to_string_lossy()
            .into_owned();
        assert!(
            msg.contains("benchfs_unlink") && msg.contains("not initialized"),
            "{msg}"
        );
        assert_eq!(benchfs_finalize(), -libc::ESHUTDOWN);
    }

    #[test]
    fn bad_pointers_are_errors_not_crashes() {
        let mut file: *mut BenchfsFile = std::ptr::null_mut();
        // SAFETY: NULL pointers are part of the contract being tested.
        unsafe {
            assert_eq!(benchfs_open(std::ptr::null(), 0, &mut file), -libc::EINVAL);
            assert_eq!(
                benchfs_open(c"/x".as_ptr(), 0, std::ptr::null_mut()),
                -libc::EFAULT
            );
            assert_eq!(
                benchfs_pread(std::ptr::null_mut(), std::ptr::null_mut(), 0, 0),
                -(libc::EBADF as isize)
            );
            assert_eq!(benchfs_close(std::ptr::null_mut()), -libc::EBADF);
            assert_eq!(
                benchfs_init(std::ptr::null(), std::ptr::null(), std::ptr::null(), 0),
                -libc::EINVAL
            );
            let bad = [0xffu8, 0];
            assert_eq!(benchfs_unlink(bad.as_ptr().cast()), -libc::EINVAL);
        }
        assert!(file.is_null());
    }

    #[test]
    fn panics_become_eio() {
        let rc: c_int = ffi("probe", || panic!("boom"));
        assert_eq!(rc, -libc::EIO);
        // SAFETY: as above.
        let msg = unsafe { CStr::from_ptr(benchfs_last_error()) }
            .to_string_lossy()
            .into_owned();
        assert!(msg.contains("probe") && msg.contains("boom"), "{msg}");
    }
}
