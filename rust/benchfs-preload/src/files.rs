//! Calls on descriptors: open and close, the read and write family, offsets, dup, fcntl,
//! ioctl, and the descriptor forms of stat, truncate, sync, chmod, statfs and xattrs.

use std::ffi::{c_char, c_int, c_uint, c_ulong, c_void};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use benchfs_core::client::{Client, FileHandle};
use benchfs_core::namespace::{Attr, Kind};
use benchfs_core::posix;
use benchfs_core::shared::SharedFile;
use benchfs_core::Error;
use libc::{mode_t, off64_t, size_t, ssize_t};

use crate::fds::{self, OpenFile};
use crate::names::{self, fill_stat, route, stat_of};
use crate::{entry, real, set_errno, stdio, the_pool, with_client};

/// Status flags F_SETFL may change (Linux's list, less O_ASYNC, which needs signals).
const SETFL_MASK: c_int = libc::O_APPEND | libc::O_NONBLOCK | libc::O_DIRECT | libc::O_NOATIME;

/// Runs `f` on an open file with a leased client.
pub fn with_file<R: Send>(
    f: &OpenFile,
    op: &str,
    run: impl FnOnce(&Client, &FileHandle) -> Result<R, Error> + Send,
) -> Result<R, c_int> {
    let file = f.file()?;
    crate::leased(&f.pool, op, &f.path, |c| file.on(c, run))
}

/// The attributes of an open file (its size at least what this process wrote through it).
pub fn attr_of(f: &OpenFile) -> Result<Attr, c_int> {
    stat_of(&f.path)
}

fn open_ours(path: String, flags: c_int, mode: mode_t) -> Result<c_int, c_int> {
    if flags & libc::O_TMPFILE == libc::O_TMPFILE {
        return Err(libc::EOPNOTSUPP);
    }
    let pool = the_pool()?;
    let access = flags & libc::O_ACCMODE;
    let cloexec = flags & libc::O_CLOEXEC != 0;
    let kept = flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_NOCTTY | libc::O_CLOEXEC);
    let as_dir = |pool| OpenFile::new(path.clone(), None, kept, pool).map(Arc::new);
    if flags & (libc::O_DIRECTORY | libc::O_PATH) != 0 {
        let attr = stat_of(&path)?;
        if attr.kind == Kind::Dir {
            if access != libc::O_RDONLY && flags & libc::O_PATH == 0 {
                return Err(libc::EISDIR);
            }
            return fds::install(as_dir(pool)?, cloexec);
        }
        if flags & libc::O_DIRECTORY != 0 {
            return Err(libc::ENOTDIR);
        }
    }
    let ns = posix::namespace_flags(flags);
    let mode = mode & !crate::current_umask() & 0o7777;
    let opened = with_client("open", &path, |c| c.open(&path, ns, mode));
    let handle = match opened {
        Ok(h) => h,
        Err(libc::EISDIR) if access == libc::O_RDONLY && flags & libc::O_CREAT == 0 => {
            return fds::install(as_dir(pool)?, cloexec);
        }
        Err(e) => return Err(e),
    };
    let file = OpenFile::new(path.clone(), Some(SharedFile::new(handle)), kept, pool)?;
    fds::install(Arc::new(file), cloexec)
}

/// The open family (variadic.rs) lands here.
pub unsafe fn benchfs_preload_openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        route(
            dirfd,
            path,
            -1,
            |d, p| {
                let fd = real::openat(d, p, flags, mode);
                if fd >= 0 && flags & (libc::O_DIRECTORY | libc::O_PATH) != 0 {
                    names::note_if_above(d, p, fd);
                }
                fd
            },
            |p| open_ours(p, flags, mode),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn creat(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: forwarded.
    unsafe {
        benchfs_preload_openat(
            libc::AT_FDCWD,
            path,
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
            mode,
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn creat64(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: forwarded.
    unsafe { creat(path, mode) }
}

// The _FORTIFY_SOURCE forms of open (no mode: O_CREAT is refused by them at compile time).
#[no_mangle]
pub unsafe extern "C" fn __open_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: forwarded.
    unsafe { benchfs_preload_openat(libc::AT_FDCWD, path, flags, 0) }
}
#[no_mangle]
pub unsafe extern "C" fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: forwarded.
    unsafe { benchfs_preload_openat(libc::AT_FDCWD, path, flags, 0) }
}
#[no_mangle]
pub unsafe extern "C" fn __openat_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: forwarded.
    unsafe { benchfs_preload_openat(dirfd, path, flags, 0) }
}
#[no_mangle]
pub unsafe extern "C" fn __openat64_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: forwarded.
    unsafe { benchfs_preload_openat(dirfd, path, flags, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if fds::lookup(fd).is_none() {
        names::forget_above(fd);
        // SAFETY: forwarded.
        return unsafe { real::close(fd) };
    }
    stdio::before_std_change(fd);
    if let Some(f) = fds::lookup(fd) {
        // Closing any descriptor of a file releases this process's record locks on it.
        crate::locks::on_close(&f);
    }
    let Some(file) = fds::remove(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::close(fd) };
    };
    // SAFETY: the reserved number is ours to close.
    unsafe { real::close(fd) };
    stdio::after_std_change(fd);
    entry(-1, || {
        // The last descriptor of the description: publish its size now, and report.
        if Arc::strong_count(&file) == 1 {
            file.close()?;
        }
        Ok(0)
    })
}

// ---- read and write ----

/// A caller's buffer as a slice (empty for a zero length, EFAULT for NULL).
unsafe fn buf_mut<'a>(buf: *mut c_void, n: size_t) -> Result<&'a mut [u8], c_int> {
    if n == 0 {
        return Ok(&mut []);
    }
    if buf.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: writable for n bytes by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), n) })
}

unsafe fn buf_ref<'a>(buf: *const c_void, n: size_t) -> Result<&'a [u8], c_int> {
    if n == 0 {
        return Ok(&[]);
    }
    if buf.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: readable for n bytes by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), n) })
}

fn read_at(f: &OpenFile, buf: &mut [u8], off: u64) -> Result<usize, c_int> {
    if f.is_dir() {
        return Err(libc::EISDIR);
    }
    if !f.readable() {
        return Err(libc::EBADF);
    }
    with_file(f, "read", |c, h| c.read(h, off, buf))
}

fn write_at(f: &OpenFile, data: &[u8], off: u64) -> Result<usize, c_int> {
    if !f.writable() || f.is_dir() {
        return Err(libc::EBADF);
    }
    with_file(f, "write", |c, h| c.write(h, off, data))
}

/// The file's end as this process knows it: the servers' size or what it wrote, if larger.
fn end_of(f: &OpenFile) -> Result<u64, c_int> {
    let attr = attr_of(f)?;
    Ok(attr.size.max(f.opened().and_then(SharedFile::size).unwrap_or(0)))
}

/// Reads or writes at the description's offset, moving it; O_APPEND writes at the end.
fn at_offset(
    f: &OpenFile,
    write: bool,
    io: impl FnOnce(u64) -> Result<usize, c_int>,
) -> Result<usize, c_int> {
    let mut off = f.offset();
    if write && f.flags.load(Ordering::Relaxed) & libc::O_APPEND != 0 {
        *off = end_of(f)?;
    }
    let n = io(*off)?;
    *off += n as u64;
    Ok(n)
}

fn offset_arg(off: off64_t) -> Result<u64, c_int> {
    u64::try_from(off).map_err(|_| libc::EINVAL)
}

#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    let Some(f) = fds::lookup(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::read(fd, buf, n) };
    };
    entry(-1, || {
        // SAFETY: by contract.
        let buf = unsafe { buf_mut(buf, n) }?;
        at_offset(&f, false, |off| read_at(&f, buf, off)).map(|n| n as ssize_t)
    })
}

#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    let Some(f) = fds::lookup(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::write(fd, buf, n) };
    };
    entry(-1, || {
        // SAFETY: by contract.
        let data = unsafe { buf_ref(buf, n) }?;
        at_offset(&f, true, |off| write_at(&f, data, off)).map(|n| n as ssize_t)
    })
}

#[no_mangle]
pub unsafe extern "C" fn pread64(fd: c_int, buf: *mut c_void, n: size_t, off: off64_t) -> ssize_t {
    let Some(f) = fds::lookup(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::pread64(fd, buf, n, off) };
    };
    entry(-1, || {
        // SAFETY: by contract.
        let buf = unsafe { buf_mut(buf, n) }?;
        read_at(&f, buf, offset_arg(off)?).map(|n| n as ssize_t)
    })
}

#[no_mangle]
pub unsafe extern "C" fn pread(fd: c_int, buf: *mut c_void, n: size_t, off: off64_t) -> ssize_t {
    // SAFETY: forwarded (off_t is off64_t on 64-bit Linux).
    unsafe { pread64(fd, buf, n, off) }
}

#[no_mangle]
pub unsafe extern "C" fn pwrite64(fd: c_int, buf: *const c_void, n: size_t, off: off64_t) -> ssize_t {
    let Some(f) = fds::lookup(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::pwrite64(fd, buf, n, off) };
    };
    entry(-1, || {
        // SAFETY: by contract.
        let data = unsafe { buf_ref(buf, n) }?;
        // Linux writes at the end with O_APPEND whatever the offset (pwrite(2), BUGS).
        if f.flags.load(Ordering::Relaxed) & libc::O_APPEND != 0 {
            return at_offset(&f, true, |o| write_at(&f, data, o)).map(|n| n as ssize_t);
        }
        write_at(&f, data, offset_arg(off)?).map(|n| n as ssize_t)
    })
}

#[no_mangle]
pub unsafe extern "C" fn pwrite(fd: c_int, buf: *const c_void, n: size_t, off: off64_t) -> ssize_t {
    // SAFETY: forwarded.
    unsafe { pwrite64(fd, buf, n, off) }
}

/// The iovecs of a vectored call.
unsafe fn iovecs<'a>(iov: *const libc::iovec, n: c_int) -> Result<&'a [libc::iovec], c_int> {
    if !(0..=libc::UIO_MAXIOV).contains(&n) {
        return Err(libc::EINVAL);
    }
    if n == 0 {
        return Ok(&[]);
    }
    if iov.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: n iovecs by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(iov, n as usize) })
}

/// Reads into each buffer in turn from `off`, stopping at a short read.
fn readv_at(f: &OpenFile, iov: &[libc::iovec], off: u64) -> Result<usize, c_int> {
    let mut done = 0usize;
    for v in iov {
        // SAFETY: each iovec is writable for its length by the caller's contract.
        let buf = unsafe { buf_mut(v.iov_base, v.iov_len) }?;
        let n = read_at(f, buf, off + done as u64)?;
        done += n;
        if n < buf.len() {
            break;
        }
    }
    Ok(done)
}

fn writev_at(f: &OpenFile, iov: &[libc::iovec], off: u64) -> Result<usize, c_int> {
    let mut done = 0usize;
    for v in iov {
        // SAFETY: each iovec is readable for its length by the caller's contract.
        let data = unsafe { buf_ref(v.iov_base, v.iov_len) }?;
        let n = write_at(f, data, off + done as u64)?;
        done += n;
        if n < data.len() {
            break;
        }
    }
    Ok(done)
}

/// A vectored read or write at `off` (-1: at the description's offset, moving it).
fn vectored(f: &OpenFile, write: bool, iov: &[libc::iovec], off: off64_t) -> Result<ssize_t, c_int> {
    let appending = write && f.flags.load(Ordering::Relaxed) & libc::O_APPEND != 0;
    let n = if off == -1 || appending {
        at_offset(f, write, |o| {
            if write {
                writev_at(f, iov, o)
            } else {
                readv_at(f, iov, o)
            }
        })?
    } else {
        let o = offset_arg(off)?;
        if write {
            writev_at(f, iov, o)?
        } else {
            readv_at(f, iov, o)?
        }
    };
    Ok(n as ssize_t)
}

#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t {
    let Some(f) = fds::lookup(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::readv(fd, iov, n) };
    };
    // SAFETY: by contract.
    entry(-1, || vectored(&f, false, unsafe { iovecs(iov, n) }?, -1))
}

#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t {
    let Some(f) = fds::lookup(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::writev(fd, iov, n) };
    };
    // SAFETY: by contract.
    entry(-1, || vectored(&f, true, unsafe { iovecs(iov, n) }?, -1))
}

#[no_mangle]
pub unsafe extern "C" fn preadv64(fd: c_int, iov: *const libc::iovec, n: c_int, off: off64_t) -> ssize_t {
    let Some(f) = fds::lookup(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::preadv64(fd, iov, n, off) };
    };
    // SAFETY: by contract.
    entry(-1, || {
        vectored(&f, false, unsafe { iovecs(iov, n) }?, offset_arg(off)? as off64_t)
    })
}

#[no_mangle]
pub unsafe extern "C" fn preadv(fd: c_int, iov: *const libc::iovec, n: c_int, off: off64_t) -> ssize_t {
    // SAFETY: forwarded.
    unsafe { preadv64(fd, iov, n, off) }
}

#[no_mangle]
pub unsafe extern "C" fn pwritev64(fd: c_int, iov: *const libc::iovec, n: c_int, off: off64_t) -> ssize_t {
    let Some(f) = fds::lookup(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::pwritev64(fd, iov, n, off) };
    };
    // SAFETY: by contract.
    entry(-1, || {
        vectored(&f, true, unsafe { iovecs(iov, n) }?, offset_arg(off)? as off64_t)
    })
}

#[no_mangle]
pub unsafe extern "C" fn pwritev(fd: c_int, iov: *const libc::iovec, n: c_int, off: off64_t) -> ssize_t {
    // SAFETY: forwarded.
    unsafe { pwritev64(fd, iov, n, off) }
}

/// preadv2/pwritev2 flags BenchFS can honour by doing nothing different: priority and
/// polling hints, and per-call sync (every write is on the servers when it returns).
const RWF_ACCEPTED: c_int = libc::RWF_HIPRI | libc::RWF_DSYNC | libc::RWF_SYNC | libc::RWF_APPEND;

#[no_mangle]
pub unsafe extern "C" fn preadv64v2(
    fd: c_int,
    iov: *const libc::iovec,
    n: c_int,
    off: off64_t,
    flags: c_int,
) -> ssize_t {
    let Some(f) = fds::lookup(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::preadv64v2(fd, iov, n, off, flags) };
    };
    entry(-1, || {
        if flags & !RWF_ACCEPTED != 0 {
            return Err(libc::EOPNOTSUPP); // RWF_NOWAIT: BenchFS cannot tell whether it would block
        }
        // SAFETY: by contract.
        vectored(
            &f,
            false,
            unsafe { iovecs(iov, n) }?,
            off, // -1: the description's offset
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn preadv2(
    fd: c_int,
    iov: *const libc::iovec,
    n: c_int,
    off: off64_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: forwarded.
    unsafe { preadv64v2(fd, iov, n, off, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn pwritev64v2(
    fd: c_int,
    iov: *const libc::iovec,
    n: c_int,
    off: off64_t,
    flags: c_int,
) -> ssize_t {
    let Some(f) = fds::lookup(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::pwritev64v2(fd, iov, n, off, flags) };
    };
    entry(-1, || {
        if flags & !RWF_ACCEPTED != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        // SAFETY: by contract.
        let iov = unsafe { iovecs(iov, n) }?;
        if flags & libc::RWF_APPEND != 0 {
            return at_offset(&f, true, |o| {
                let mut o = o;
                if f.flags.load(Ordering::Relaxed) & libc::O_APPEND == 0 {
                    o = end_of(&f)?;
                }
                writev_at(&f, iov, o)
            })
            .map(|n| n as ssize_t);
        }
        vectored(
            &f, true, iov, off, // -1: the description's offset
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn pwritev2(
    fd: c_int,
    iov: *const libc::iovec,
    n: c_int,
    off: off64_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: forwarded.
    unsafe { pwritev64v2(fd, iov, n, off, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn lseek64(fd: c_int, off: off64_t, whence: c_int) -> off64_t {
    let Some(f) = fds::lookup(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::lseek64(fd, off, whence) };
    };
    entry(-1, || {
        let mut pos = f.offset();
        let base = match whence {
            libc::SEEK_SET => 0,
            libc::SEEK_CUR => *pos as i128,
            libc::SEEK_END => end_of(&f)? as i128,
            libc::SEEK_DATA | libc::SEEK_HOLE => {
                // No holes are tracked: data up to the end, one hole after it.
                let end = end_of(&f)?;
                let at = offset_arg(off)?;
                if at >= end {
                    return Err(libc::ENXIO);
                }
                let to = if whence == libc::SEEK_DATA { at } else { end };
                *pos = to;
                return Ok(to as off64_t);
            }
            _ => return Err(libc::EINVAL),
        };
        let to = base + off as i128;
        if to < 0 || to > i64::MAX as i128 {
            return Err(libc::EINVAL);
        }
        *pos = to as u64;
        Ok(to as off64_t)
    })
}

#[no_mangle]
pub unsafe extern "C" fn lseek(fd: c_int, off: off64_t, whence: c_int) -> off64_t {
    // SAFETY: forwarded.
    unsafe { lseek64(fd, off, whence) }
}

// ---- stat and friends on descriptors ----

#[no_mangle]
pub unsafe extern "C" fn fstat64(fd: c_int, st: *mut libc::stat64) -> c_int {
    let Some(f) = fds::lookup(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::fstat64(fd, st) };
    };
    entry(-1, || {
        let attr = attr_of(&f)?;
        // SAFETY: NULL or writable by contract.
        let st = unsafe { st.as_mut() }.ok_or(libc::EFAULT)?;
        fill_stat(&f.path, &attr, st);
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn fstat(fd: c_int, st: *mut libc::stat64) -> c_int {
    // SAFETY: forwarded.
    unsafe { fstat64(fd, st) }
}

#[no_mangle]
pub unsafe extern "C" fn __fxstat(_ver: c_int, fd: c_int, st: *mut libc::stat64) -> c_int {
    // SAFETY: forwarded.
    unsafe { fstat64(fd, st) }
}

#[no_mangle]
pub unsafe extern "C" fn __fxstat64(_ver: c_int, fd: c_int, st: *mut libc::stat64) -> c_int {
    // SAFETY: forwarded.
    unsafe { fstat64(fd, st) }
}

#[no_mangle]
pub unsafe extern "C" fn ftruncate64(fd: c_int, len: off64_t) -> c_int {
    let Some(f) = fds::lookup(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::ftruncate64(fd, len) };
    };
    entry(-1, || {
        let len = offset_arg(len)?;
        if !f.writable() {
            return Err(libc::EINVAL); // ftruncate(2): not open for writing
        }
        with_file(&f, "ftruncate", |c, h| c.ftruncate(h, len)).map(|()| 0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ftruncate(fd: c_int, len: off64_t) -> c_int {
    // SAFETY: forwarded.
    unsafe { ftruncate64(fd, len) }
}

fn sync(f: &OpenFile) -> Result<c_int, c_int> {
    if f.is_dir() {
        return Ok(0); // namespace changes are applied before the servers answer
    }
    with_file(f, "fsync", |c, h| c.fsync(h)).map(|()| 0)
}

#[no_mangle]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    match fds::lookup(fd) {
        Some(f) => entry(-1, || sync(&f)),
        // SAFETY: forwarded.
        None => unsafe { real::fsync(fd) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    match fds::lookup(fd) {
        Some(f) => entry(-1, || sync(&f)),
        // SAFETY: forwarded.
        None => unsafe { real::fdatasync(fd) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn fchmod(fd: c_int, mode: mode_t) -> c_int {
    let Some(f) = fds::lookup(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::fchmod(fd, mode) };
    };
    entry(-1, || {
        with_client("chmod", &f.path, |c| {
            c.set_attr(&f.path, Some(mode & 0o7777), None)
        })
        .map(|_| 0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    if fds::lookup(fd).is_none() {
        // SAFETY: forwarded.
        return unsafe { real::fchown(fd, uid, gid) };
    }
    entry(-1, || names::check_owner(uid, gid))
}

#[no_mangle]
pub unsafe extern "C" fn futimens(fd: c_int, times: *const libc::timespec) -> c_int {
    let Some(f) = fds::lookup(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::futimens(fd, times) };
    };
    entry(-1, || {
        // SAFETY: by contract.
        match unsafe { names::mtime_of(times) }? {
            Some(ns) => with_client("utimens", &f.path, |c| c.set_attr(&f.path, None, Some(ns))).map(|_| 0),
            None => Ok(0),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn fstatfs64(fd: c_int, st: *mut libc::statfs64) -> c_int {
    if fds::lookup(fd).is_none() {
        // SAFETY: forwarded.
        return unsafe { real::fstatfs64(fd, st) };
    }
    // SAFETY: NULL or writable by contract.
    entry(-1, || {
        names::fill_statfs(unsafe { st.as_mut() }.ok_or(libc::EFAULT)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn fstatfs(fd: c_int, st: *mut libc::statfs64) -> c_int {
    // SAFETY: forwarded.
    unsafe { fstatfs64(fd, st) }
}

#[no_mangle]
pub unsafe extern "C" fn fstatvfs64(fd: c_int, st: *mut libc::statvfs64) -> c_int {
    if fds::lookup(fd).is_none() {
        // SAFETY: forwarded.
        return unsafe { real::fstatvfs64(fd, st) };
    }
    // SAFETY: NULL or writable by contract.
    entry(-1, || {
        names::fill_statvfs(unsafe { st.as_mut() }.ok_or(libc::EFAULT)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn fstatvfs(fd: c_int, st: *mut libc::statvfs64) -> c_int {
    // SAFETY: forwarded.
    unsafe { fstatvfs64(fd, st) }
}

// ---- descriptors ----

#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    let Some(f) = fds::lookup(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::dup(fd) };
    };
    entry(-1, || fds::install(f, false))
}

/// dup2/dup3 where `to` may stand for a BenchFS file before or after.
unsafe fn dup_onto(fd: c_int, to: c_int, flags: c_int, three: bool) -> c_int {
    let from = fds::lookup(fd);
    if from.is_none() && fds::lookup(to).is_none() {
        // SAFETY: forwarded.
        return unsafe {
            if three {
                real::dup3(fd, to, flags)
            } else {
                real::dup2(fd, to)
            }
        };
    }
    if fd == to {
        if three {
            set_errno(libc::EINVAL);
            return -1;
        }
        return to;
    }
    stdio::before_std_change(to);
    // SAFETY: the kernel replaces `to` with a copy of `fd` (a reserved number if ours).
    let got = unsafe {
        if three {
            real::dup3(fd, to, flags)
        } else {
            real::dup2(fd, to)
        }
    };
    if got < 0 {
        return got;
    }
    let replaced = match from {
        Some(f) => fds::insert(to, f),
        None => fds::remove(to),
    };
    stdio::after_std_change(to);
    // The description `to` stood for loses a descriptor; the last one closes it.
    entry(got, || {
        if let Some(old) = replaced {
            if Arc::strong_count(&old) == 1 {
                old.close()?;
            }
        }
        Ok(got)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dup2(fd: c_int, to: c_int) -> c_int {
    // SAFETY: forwarded.
    unsafe { dup_onto(fd, to, 0, false) }
}

#[no_mangle]
pub unsafe extern "C" fn dup3(fd: c_int, to: c_int, flags: c_int) -> c_int {
    // SAFETY: forwarded.
    unsafe { dup_onto(fd, to, flags, true) }
}

/// fcntl and fcntl64 (variadic.rs) land here.
pub unsafe fn benchfs_preload_fcntl(fd: c_int, cmd: c_int, arg: *mut c_void) -> c_int {
    let Some(f) = fds::lookup(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::fcntl(fd, cmd, arg) };
    };
    match cmd {
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            // SAFETY: duplicates the reserved number at or above `arg`.
            let got = unsafe { real::fcntl(fd, cmd, arg) };
            if got >= 0 {
                fds::insert(got, f);
            }
            got
        }
        // SAFETY: the close-on-exec flag is the reserved descriptor's.
        libc::F_GETFD | libc::F_SETFD => unsafe { real::fcntl(fd, cmd, arg) },
        libc::F_GETFL => f.flags.load(Ordering::Relaxed),
        libc::F_SETFL => {
            let new = arg as usize as c_int;
            let _ = f.flags.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                Some((old & !SETFL_MASK) | (new & SETFL_MASK))
            });
            0
        }
        libc::F_GETLK
        | libc::F_SETLK
        | libc::F_SETLKW
        | libc::F_OFD_GETLK
        | libc::F_OFD_SETLK
        // SAFETY: forwarded contract.
        | libc::F_OFD_SETLKW => unsafe { crate::locks::fcntl(&f, cmd, arg) },
        _ => {
            set_errno(libc::EINVAL);
            -1
        }
    }
}

/// ioctl (variadic.rs) lands here. A BenchFS file is no terminal and cannot be cloned: cp's
/// reflink attempt (FICLONE) fails with EOPNOTSUPP and cp copies instead.
pub unsafe fn benchfs_preload_ioctl(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    if fds::lookup(fd).is_none() {
        // SAFETY: forwarded.
        return unsafe { real::ioctl(fd, request, arg) };
    }
    const FICLONE: c_ulong = 0x4004_9409;
    const FICLONERANGE: c_ulong = 0x4020_940d;
    set_errno(if request == FICLONE || request == FICLONERANGE {
        libc::EOPNOTSUPP
    } else {
        libc::ENOTTY
    });
    -1
}

// ---- advice, allocation, copies, mappings ----

#[no_mangle]
pub unsafe extern "C" fn posix_fadvise64(fd: c_int, off: off64_t, len: off64_t, advice: c_int) -> c_int {
    if fds::lookup(fd).is_none() {
        // SAFETY: forwarded.
        return unsafe { real::posix_fadvise64(fd, off, len, advice) };
    }
    // Advice only: BenchFS reads ahead by itself and keeps no page cache to drop.
    if len < 0 || !(0..=5).contains(&advice) {
        libc::EINVAL
    } else {
        0
    }
}

#[no_mangle]
pub unsafe extern "C" fn posix_fadvise(fd: c_int, off: off64_t, len: off64_t, advice: c_int) -> c_int {
    // SAFETY: forwarded.
    unsafe { posix_fadvise64(fd, off, len, advice) }
}

/// Grows the file to `off + len` if shorter (BenchFS allocates as it writes, so reserving
/// space is only the size).
fn allocate(f: &OpenFile, mode: c_int, off: off64_t, len: off64_t) -> Result<c_int, c_int> {
    if off < 0 || len <= 0 {
        return Err(libc::EINVAL);
    }
    if !f.writable() {
        return Err(libc::EBADF);
    }
    if mode == libc::FALLOC_FL_KEEP_SIZE {
        return Ok(0);
    }
    if mode != 0 {
        return Err(libc::EOPNOTSUPP); // punching holes, zeroing, collapsing ranges
    }
    let want = (off as u64).checked_add(len as u64).ok_or(libc::EFBIG)?;
    if want > end_of(f)? {
        with_file(f, "fallocate", |c, h| c.ftruncate(h, want))?;
    }
    Ok(0)
}

#[no_mangle]
pub unsafe extern "C" fn fallocate64(fd: c_int, mode: c_int, off: off64_t, len: off64_t) -> c_int {
    let Some(f) = fds::lookup(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::fallocate64(fd, mode, off, len) };
    };
    entry(-1, || allocate(&f, mode, off, len))
}

#[no_mangle]
pub unsafe extern "C" fn fallocate(fd: c_int, mode: c_int, off: off64_t, len: off64_t) -> c_int {
    // SAFETY: forwarded.
    unsafe { fallocate64(fd, mode, off, len) }
}

#[no_mangle]
pub unsafe extern "C" fn posix_fallocate64(fd: c_int, off: off64_t, len: off64_t) -> c_int {
    let Some(f) = fds::lookup(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::posix_fallocate64(fd, off, len) };
    };
    // posix_fallocate returns the error number instead of setting errno.
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| allocate(&f, 0, off, len))) {
        Ok(Ok(_)) => 0,
        Ok(Err(e)) => e,
        Err(_) => libc::EIO,
    }
}

#[no_mangle]
pub unsafe extern "C" fn posix_fallocate(fd: c_int, off: off64_t, len: off64_t) -> c_int {
    // SAFETY: forwarded.
    unsafe { posix_fallocate64(fd, off, len) }
}

/// The most one emulated copy call moves (callers loop, as they must for the real calls).
const COPY_STEP: usize = 4 << 20;

/// Runs `f` with a buffer of `len` bytes (at most [`COPY_STEP`]): the thread's own, kept
/// between calls (cp calls once per 4 MiB: a new zeroed buffer each time cost a page fault
/// per 4 KiB), or a fresh one if the thread's state is gone.
fn with_copy_buffer<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    thread_local! {
        static KEPT: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let len = len.min(COPY_STEP);
    let mut kept = KEPT.try_with(|b| b.take()).ok();
    let r = match kept.as_mut() {
        Some(buf) => {
            buf.resize(COPY_STEP, 0);
            f(&mut buf[..len])
        }
        None => f(&mut vec![0u8; len]),
    };
    if let Some(buf) = kept {
        let _ = KEPT.try_with(|b| b.replace(buf));
    }
    r
}

/// Copies up to `len` bytes from `fd_in` to `fd_out`, either of which may be BenchFS's,
/// through a buffer, with each side's offset given or its descriptor's own.
unsafe fn copy_through(
    fd_in: c_int,
    off_in: *mut off64_t,
    fd_out: c_int,
    off_out: *mut off64_t,
    len: size_t,
) -> Result<ssize_t, c_int> {
    if len == 0 {
        return Ok(0);
    }
    with_copy_buffer(len, |buf| {
        // SAFETY: our own buffer; offsets are NULL or valid by the caller's contract.
        let got = unsafe {
            match off_in.as_mut() {
                Some(o) => pread64(fd_in, buf.as_mut_ptr().cast(), buf.len(), *o),
                None => read(fd_in, buf.as_mut_ptr().cast(), buf.len()),
            }
        };
        if got < 0 {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO));
        }
        let got = got as usize;
        let mut put = 0usize;
        while put < got {
            // SAFETY: as above.
            let n = unsafe {
                match off_out.as_mut() {
                    Some(o) => pwrite64(fd_out, buf[put..].as_ptr().cast(), got - put, *o + put as off64_t),
                    None => write(fd_out, buf[put..].as_ptr().cast(), got - put),
                }
            };
            if n <= 0 {
                return Err(std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO));
            }
            put += n as usize;
        }
        // SAFETY: as above.
        unsafe {
            if let Some(o) = off_in.as_mut() {
                *o += got as off64_t;
            }
            if let Some(o) = off_out.as_mut() {
                *o += got as off64_t;
            }
        }
        Ok(got as ssize_t)
    })
}

#[no_mangle]
pub unsafe extern "C" fn copy_file_range(
    fd_in: c_int,
    off_in: *mut off64_t,
    fd_out: c_int,
    off_out: *mut off64_t,
    len: size_t,
    flags: c_uint,
) -> ssize_t {
    if fds::lookup(fd_in).is_none() && fds::lookup(fd_out).is_none() {
        // SAFETY: forwarded.
        return unsafe { real::copy_file_range(fd_in, off_in, fd_out, off_out, len, flags) };
    }
    entry(-1, || {
        if flags != 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: forwarded contract.
        unsafe { copy_through(fd_in, off_in, fd_out, off_out, len) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn sendfile64(out: c_int, fd_in: c_int, off: *mut off64_t, count: size_t) -> ssize_t {
    if fds::lookup(fd_in).is_none() && fds::lookup(out).is_none() {
        // SAFETY: forwarded.
        return unsafe { real::sendfile64(out, fd_in, off, count) };
    }
    // SAFETY: forwarded contract.
    entry(-1, || unsafe {
        copy_through(fd_in, off, out, std::ptr::null_mut(), count)
    })
}

#[no_mangle]
pub unsafe extern "C" fn sendfile(out: c_int, fd_in: c_int, off: *mut off64_t, count: size_t) -> ssize_t {
    // SAFETY: forwarded.
    unsafe { sendfile64(out, fd_in, off, count) }
}

#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off64_t,
) -> *mut c_void {
    let Some(f) = fds::lookup(fd).filter(|_| flags & libc::MAP_ANONYMOUS == 0) else {
        // SAFETY: forwarded.
        return unsafe { real::mmap64(addr, len, prot, flags, fd, off) };
    };
    // SAFETY: forwarded contract.
    entry(libc::MAP_FAILED, || unsafe {
        crate::maps::map(&f, addr, len, prot, flags, off)
    })
}

#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off64_t,
) -> *mut c_void {
    // SAFETY: forwarded.
    unsafe { mmap64(addr, len, prot, flags, fd, off) }
}

macro_rules! no_xattr_fd {
    ($($name:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty;)*) => {
        $(
            #[no_mangle]
            pub unsafe extern "C" fn $name(fd: c_int, $($arg: $ty),*) -> $ret {
                if fds::lookup(fd).is_none() {
                    // SAFETY: forwarded.
                    return unsafe { real::$name(fd, $($arg),*) };
                }
                set_errno(libc::ENOTSUP);
                -1
            }
        )*
    };
}

no_xattr_fd! {
    fgetxattr(name: *const c_char, value: *mut c_void, size: size_t) -> ssize_t;
    fsetxattr(name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int;
    flistxattr(list: *mut c_char, size: size_t) -> ssize_t;
    fremovexattr(name: *const c_char) -> c_int;
}
