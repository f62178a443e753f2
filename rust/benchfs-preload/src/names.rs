//! Calls on paths: where a path lands (BenchFS or the local file system), and the calls that
//! name a file by path (stat, access, unlink, mkdir, rename, chmod, utimens, statfs, xattrs).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::{PoisonError, RwLock};

use benchfs_core::namespace::{Attr, Kind};
use benchfs_core::protocol;
use libc::{mode_t, size_t, ssize_t};

use crate::paths::{join, normalize};
use crate::{busy, entry, fds, prefix, real, set_errno, with_client};

/// Where a path argument lands.
pub enum Target {
    /// Not BenchFS's: the call goes to libc unchanged.
    Local,
    /// Not BenchFS's, but relative to a working directory inside BenchFS: libc gets this
    /// absolute path instead (the process's real working directory is elsewhere).
    LocalAt(CString),
    /// This BenchFS path.
    Ours(String),
}

/// The working directory when it is inside BenchFS (set by chdir and fchdir into it; the
/// kernel's working directory is then left where it was).
static CWD: RwLock<Option<String>> = RwLock::new(None);

pub fn bfs_cwd() -> Option<String> {
    CWD.read().unwrap_or_else(PoisonError::into_inner).clone()
}

pub fn set_bfs_cwd(dir: Option<String>) {
    *CWD.write().unwrap_or_else(PoisonError::into_inner) = dir;
}

/// The kernel's working directory.
fn real_cwd() -> Option<String> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: a writable buffer of its length.
    let p = unsafe { real::getcwd(buf.as_mut_ptr().cast(), buf.len()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: getcwd wrote a NUL-terminated string into buf.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().ok().map(str::to_string)
}

/// Local directories open at or above the prefix (its ancestors, or a local directory at
/// the prefix itself), by descriptor: a path relative to one of them can land in BenchFS, as
/// when rsync (3.4 and later) opens every path one component at a time from `/`.
static ABOVE: RwLock<Vec<(c_int, String)>> = RwLock::new(Vec::new());
/// Whether ABOVE holds any (so that closing other descriptors takes no lock).
static ANY_ABOVE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn above(fd: c_int) -> Option<String> {
    if !ANY_ABOVE.load(std::sync::atomic::Ordering::Acquire) {
        return None;
    }
    let above = ABOVE.read().unwrap_or_else(PoisonError::into_inner);
    above.iter().find(|(f, _)| *f == fd).map(|(_, p)| p.clone())
}

/// After the kernel opened the directory `path` (relative to `dirfd`) as `fd`: remembers
/// it when it is at or above the prefix.
pub unsafe fn note_if_above(dirfd: c_int, path: *const c_char, fd: c_int) {
    let Some(prefix) = prefix() else { return };
    if busy() || path.is_null() {
        return;
    }
    // SAFETY: NUL-terminated by the caller's contract.
    let Ok(text) = unsafe { CStr::from_ptr(path) }.to_str() else {
        return;
    };
    let full = if text.starts_with('/') {
        normalize(text)
    } else if let Some(base) = above(dirfd) {
        join(&base, text)
    } else {
        return;
    };
    let p = prefix.as_str();
    let at_or_above =
        full == "/" || p == full || p.strip_prefix(full.as_str()).is_some_and(|r| r.starts_with('/'));
    if at_or_above {
        let mut above = ABOVE.write().unwrap_or_else(PoisonError::into_inner);
        above.retain(|(f, _)| *f != fd);
        above.push((fd, full));
        ANY_ABOVE.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// `fd` is being closed (or replaced).
pub fn forget_above(fd: c_int) {
    if ANY_ABOVE.load(std::sync::atomic::Ordering::Acquire) {
        ABOVE
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(f, _)| *f != fd);
    }
}

/// Where `path` (relative to `dirfd` when relative) lands. A non-UTF-8 name under the prefix
/// is EINVAL (BenchFS names are UTF-8); it never falls through to the local disk.
pub unsafe fn resolve(dirfd: c_int, path: *const c_char) -> Result<Target, c_int> {
    if busy() || path.is_null() {
        return Ok(Target::Local);
    }
    let Some(prefix) = prefix() else {
        return Ok(Target::Local);
    };
    // SAFETY: NUL-terminated by the caller's contract.
    let bytes = unsafe { CStr::from_ptr(path) }.to_bytes();
    if bytes.is_empty() {
        return Ok(Target::Local);
    }
    let text = String::from_utf8_lossy(bytes);
    let exact = matches!(text, std::borrow::Cow::Borrowed(_));
    let full = if bytes[0] == b'/' {
        // The common case, a plain absolute path elsewhere: no allocation.
        if !bytes.starts_with(prefix.as_str().as_bytes()) && !text.contains("/.") && !text.contains("//") {
            return Ok(Target::Local);
        }
        normalize(&text)
    } else if dirfd == libc::AT_FDCWD {
        if let Some(dir) = bfs_cwd() {
            // Resolved from the BenchFS directory as the local path it stands for, so that
            // ".." can lead out of the prefix.
            let full = join(&prefix.outside(&dir), &text);
            return match prefix.inside(&full) {
                Some(p) if exact => Ok(Target::Ours(p)),
                Some(_) => Err(libc::EINVAL),
                None => CString::new(full).map(Target::LocalAt).map_err(|_| libc::EINVAL),
            };
        }
        let Some(base) = real_cwd() else {
            return Ok(Target::Local);
        };
        join(&base, &text)
    } else if let Some(dir) = fds::lookup(dirfd) {
        if !dir.is_dir() {
            return Err(libc::ENOTDIR);
        }
        let inside = join(&dir.path, &text);
        return if exact {
            Ok(Target::Ours(inside))
        } else {
            Err(libc::EINVAL)
        };
    } else if let Some(base) = above(dirfd) {
        join(&base, &text)
    } else {
        return Ok(Target::Local);
    };
    match prefix.inside(&full) {
        Some(p) if exact => Ok(Target::Ours(p)),
        Some(_) => Err(libc::EINVAL),
        None => Ok(Target::Local),
    }
}

thread_local! {
    /// The host path this thread's last BenchFS call was led to by a symbolic link whose
    /// absolute target is outside BenchFS: the call is handed to the kernel with it.
    static OUTSIDE: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

pub fn set_outside(host: String) {
    let _ = OUTSIDE.try_with(|o| *o.borrow_mut() = Some(host));
}

/// The host path a link led the last call to, if it did (taken: asked once per call).
pub fn take_outside() -> Option<CString> {
    OUTSIDE
        .try_with(|o| o.borrow_mut().take())
        .ok()
        .flatten()
        .and_then(|h| CString::new(h).ok())
}

/// Runs `ours` for a BenchFS path, `local(dirfd, path)` otherwise (with the absolute path
/// when the working directory is BenchFS's, or the host path a link led outside BenchFS
/// to); errors set errno and return `fail`.
pub unsafe fn route<R: Copy>(
    dirfd: c_int,
    path: *const c_char,
    fail: R,
    local: impl FnOnce(c_int, *const c_char) -> R,
    ours: impl FnOnce(String) -> Result<R, c_int>,
) -> R {
    // SAFETY: forwarded contract.
    match unsafe { resolve(dirfd, path) } {
        Ok(Target::Local) => local(dirfd, path),
        Ok(Target::LocalAt(abs)) => local(libc::AT_FDCWD, abs.as_ptr()),
        Ok(Target::Ours(p)) => {
            let _ = take_outside();
            let r = entry(fail, || ours(p));
            match take_outside() {
                Some(host) => local(libc::AT_FDCWD, host.as_ptr()),
                None => r,
            }
        }
        Err(e) => {
            set_errno(e);
            fail
        }
    }
}

fn uid_gid() -> (u32, u32) {
    // SAFETY: cannot fail, touch no memory of ours.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

/// The inode number shown for `path` (stat and readdir agree on it): a hash of the path,
/// never 0. Directories have no file id, so the id cannot serve; a rename changes the number,
/// which nothing relies on without hard links.
pub fn ino_of(path: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    path.hash(&mut h);
    h.finish().max(1)
}

/// The size to show: the servers' or, if larger, what this process has written through a
/// file still open (sizes are published at close).
fn shown_size(path: &str, attr: &Attr) -> u64 {
    if attr.kind == Kind::Dir {
        return 0;
    }
    attr.size.max(fds::written_size(path).unwrap_or(0))
}

fn mode_bits(attr: &Attr) -> u32 {
    (match attr.kind {
        Kind::Dir => libc::S_IFDIR,
        Kind::Symlink => libc::S_IFLNK,
        Kind::File => libc::S_IFREG,
    }) | (attr.mode & 0o7777)
}

/// The block size stdio and cp size their buffers by: one chunk.
fn blksize(attr: &Attr) -> u64 {
    if attr.kind == Kind::Dir {
        4096
    } else {
        attr.layout.chunk_size.clamp(4096, 4 << 20)
    }
}

/// Device number shown for BenchFS files (any constant other files cannot have).
const DEV: u64 = 0x0062_6673;

pub fn fill_stat(path: &str, attr: &Attr, st: &mut libc::stat64) {
    let (uid, gid) = uid_gid();
    let size = shown_size(path, attr);
    // SAFETY: all-zero is a valid stat64.
    *st = unsafe { std::mem::zeroed() };
    st.st_dev = DEV;
    st.st_ino = ino_of(path);
    st.st_mode = mode_bits(attr);
    st.st_nlink = if attr.kind == Kind::Dir { 2 } else { 1 };
    st.st_uid = uid;
    st.st_gid = gid;
    st.st_size = size as i64;
    st.st_blksize = blksize(attr) as i64;
    st.st_blocks = size.div_ceil(512) as i64;
    let (ms, mn) = (
        (attr.mtime_ns / 1_000_000_000) as i64,
        (attr.mtime_ns % 1_000_000_000) as i64,
    );
    let (cs, cn) = (
        (attr.ctime_ns / 1_000_000_000) as i64,
        (attr.ctime_ns % 1_000_000_000) as i64,
    );
    st.st_atime = ms;
    st.st_atime_nsec = mn;
    st.st_mtime = ms;
    st.st_mtime_nsec = mn;
    st.st_ctime = cs;
    st.st_ctime_nsec = cn;
}

pub fn fill_statx(path: &str, attr: &Attr, st: &mut libc::statx) {
    let (uid, gid) = uid_gid();
    let size = shown_size(path, attr);
    // SAFETY: all-zero is a valid statx.
    *st = unsafe { std::mem::zeroed() };
    st.stx_mask = libc::STATX_BASIC_STATS;
    st.stx_blksize = blksize(attr) as u32;
    st.stx_nlink = if attr.kind == Kind::Dir { 2 } else { 1 };
    st.stx_uid = uid;
    st.stx_gid = gid;
    st.stx_mode = mode_bits(attr) as u16;
    st.stx_ino = ino_of(path);
    st.stx_size = size;
    st.stx_blocks = size.div_ceil(512);
    let ts = |ns: u64| {
        // SAFETY: all-zero is a valid statx_timestamp.
        let mut t: libc::statx_timestamp = unsafe { std::mem::zeroed() };
        t.tv_sec = (ns / 1_000_000_000) as i64;
        t.tv_nsec = (ns % 1_000_000_000) as u32;
        t
    };
    st.stx_atime = ts(attr.mtime_ns);
    st.stx_mtime = ts(attr.mtime_ns);
    st.stx_ctime = ts(attr.ctime_ns);
    st.stx_dev_major = (DEV >> 8) as u32;
    st.stx_dev_minor = (DEV & 0xff) as u32;
}

pub fn stat_of(path: &str) -> Result<Attr, c_int> {
    with_client("stat", path, |c| c.stat(path))
}

/// `path`'s attribute, a symbolic link's own with `AT_SYMLINK_NOFOLLOW` in `flags`.
fn stat_at(path: &str, flags: c_int) -> Result<Attr, c_int> {
    if flags & libc::AT_SYMLINK_NOFOLLOW != 0 {
        with_client("lstat", path, |c| c.lstat(path))
    } else {
        stat_of(path)
    }
}

unsafe fn out<'a, T>(p: *mut T) -> Result<&'a mut T, c_int> {
    // SAFETY: NULL or writable by the caller's contract.
    unsafe { p.as_mut() }.ok_or(libc::EFAULT)
}

// ---- stat family ----

#[no_mangle]
pub unsafe extern "C" fn fstatat64(
    dirfd: c_int,
    path: *const c_char,
    st: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    if flags & libc::AT_EMPTY_PATH != 0 && !path.is_null() && unsafe { *path } == 0 {
        // SAFETY: forwarded.
        return unsafe { crate::files::fstat64(dirfd, st) };
    }
    // SAFETY: forwarded contract.
    unsafe {
        route(
            dirfd,
            path,
            -1,
            |d, p| real::fstatat64(d, p, st, flags),
            |p| {
                let attr = stat_at(&p, flags)?;
                fill_stat(&p, &attr, out(st)?);
                Ok(0)
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn fstatat(
    dirfd: c_int,
    path: *const c_char,
    st: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    // SAFETY: forwarded (stat and stat64 are one layout on 64-bit Linux).
    unsafe { fstatat64(dirfd, path, st, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn stat64(path: *const c_char, st: *mut libc::stat64) -> c_int {
    // SAFETY: forwarded.
    unsafe { fstatat64(libc::AT_FDCWD, path, st, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn stat(path: *const c_char, st: *mut libc::stat64) -> c_int {
    // SAFETY: forwarded.
    unsafe { fstatat64(libc::AT_FDCWD, path, st, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn lstat64(path: *const c_char, st: *mut libc::stat64) -> c_int {
    // SAFETY: forwarded.
    unsafe { fstatat64(libc::AT_FDCWD, path, st, libc::AT_SYMLINK_NOFOLLOW) }
}

#[no_mangle]
pub unsafe extern "C" fn lstat(path: *const c_char, st: *mut libc::stat64) -> c_int {
    // SAFETY: forwarded.
    unsafe { fstatat64(libc::AT_FDCWD, path, st, libc::AT_SYMLINK_NOFOLLOW) }
}

// glibc before 2.33 compiled calls to stat into these (version argument first).
#[no_mangle]
pub unsafe extern "C" fn __xstat(_ver: c_int, path: *const c_char, st: *mut libc::stat64) -> c_int {
    // SAFETY: forwarded.
    unsafe { fstatat64(libc::AT_FDCWD, path, st, 0) }
}
#[no_mangle]
pub unsafe extern "C" fn __xstat64(_ver: c_int, path: *const c_char, st: *mut libc::stat64) -> c_int {
    // SAFETY: forwarded.
    unsafe { fstatat64(libc::AT_FDCWD, path, st, 0) }
}
#[no_mangle]
pub unsafe extern "C" fn __lxstat(_ver: c_int, path: *const c_char, st: *mut libc::stat64) -> c_int {
    // SAFETY: forwarded.
    unsafe { fstatat64(libc::AT_FDCWD, path, st, libc::AT_SYMLINK_NOFOLLOW) }
}
#[no_mangle]
pub unsafe extern "C" fn __lxstat64(_ver: c_int, path: *const c_char, st: *mut libc::stat64) -> c_int {
    // SAFETY: forwarded.
    unsafe { fstatat64(libc::AT_FDCWD, path, st, libc::AT_SYMLINK_NOFOLLOW) }
}
#[no_mangle]
pub unsafe extern "C" fn __fxstatat(
    _ver: c_int,
    dirfd: c_int,
    path: *const c_char,
    st: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { fstatat64(dirfd, path, st, flags) }
}
#[no_mangle]
pub unsafe extern "C" fn __fxstatat64(
    _ver: c_int,
    dirfd: c_int,
    path: *const c_char,
    st: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { fstatat64(dirfd, path, st, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn statx(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: c_uint,
    st: *mut libc::statx,
) -> c_int {
    if flags & libc::AT_EMPTY_PATH != 0 && !path.is_null() && unsafe { *path } == 0 {
        if let Some(f) = fds::lookup(dirfd) {
            return entry(-1, || {
                let attr = crate::files::attr_of(&f)?;
                // SAFETY: by contract.
                fill_statx(&f.path, &attr, unsafe { out(st) }?);
                Ok(0)
            });
        }
        // SAFETY: forwarded.
        return unsafe { real::statx(dirfd, path, flags, mask, st) };
    }
    // SAFETY: forwarded contract.
    unsafe {
        route(
            dirfd,
            path,
            -1,
            |d, p| real::statx(d, p, flags, mask, st),
            |p| {
                let attr = stat_at(&p, flags)?;
                fill_statx(&p, &attr, out(st)?);
                Ok(0)
            },
        )
    }
}

// ---- access ----

fn check_access(attr: &Attr, mode: c_int) -> Result<c_int, c_int> {
    if mode == libc::F_OK {
        return Ok(0);
    }
    let root = uid_gid().0 == 0;
    let bits = attr.mode;
    let want_x = mode & libc::X_OK != 0;
    let ok_r = mode & libc::R_OK == 0 || root || bits & 0o400 != 0;
    let ok_w = mode & libc::W_OK == 0 || root || bits & 0o200 != 0;
    let ok_x = !want_x
        || attr.kind == Kind::Dir && (root || bits & 0o100 != 0)
        || bits & 0o111 != 0 && (root || bits & 0o100 != 0);
    if ok_r && ok_w && ok_x {
        Ok(0)
    } else {
        Err(libc::EACCES)
    }
}

#[no_mangle]
pub unsafe extern "C" fn faccessat(dirfd: c_int, path: *const c_char, mode: c_int, flags: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        route(
            dirfd,
            path,
            -1,
            |d, p| real::faccessat(d, p, mode, flags),
            |p| check_access(&stat_of(&p)?, mode),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn access(path: *const c_char, mode: c_int) -> c_int {
    // SAFETY: forwarded.
    unsafe { faccessat(libc::AT_FDCWD, path, mode, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn euidaccess(path: *const c_char, mode: c_int) -> c_int {
    // SAFETY: forwarded.
    unsafe { faccessat(libc::AT_FDCWD, path, mode, libc::AT_EACCESS) }
}

#[no_mangle]
pub unsafe extern "C" fn eaccess(path: *const c_char, mode: c_int) -> c_int {
    // SAFETY: forwarded.
    unsafe { faccessat(libc::AT_FDCWD, path, mode, libc::AT_EACCESS) }
}

// ---- names ----

#[no_mangle]
pub unsafe extern "C" fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        route(
            dirfd,
            path,
            -1,
            |d, p| real::unlinkat(d, p, flags),
            |p| {
                if flags & libc::AT_REMOVEDIR != 0 {
                    with_client("rmdir", &p, |c| c.rmdir(&p))?;
                } else {
                    with_client("unlink", &p, |c| c.unlink(&p))?;
                }
                Ok(0)
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn unlink(path: *const c_char) -> c_int {
    // SAFETY: forwarded.
    unsafe { unlinkat(libc::AT_FDCWD, path, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn rmdir(path: *const c_char) -> c_int {
    // SAFETY: forwarded.
    unsafe { unlinkat(libc::AT_FDCWD, path, libc::AT_REMOVEDIR) }
}

#[no_mangle]
pub unsafe extern "C" fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        route(
            dirfd,
            path,
            -1,
            |d, p| real::mkdirat(d, p, mode),
            |p| {
                let mode = mode & !crate::current_umask() & 0o7777;
                with_client("mkdir", &p, |c| c.mkdir(&p, mode))?;
                Ok(0)
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn mkdir(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: forwarded.
    unsafe { mkdirat(libc::AT_FDCWD, path, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn renameat2(
    fromfd: c_int,
    from: *const c_char,
    tofd: c_int,
    to: *const c_char,
    flags: c_uint,
) -> c_int {
    // SAFETY: forwarded contract.
    let (a, b) = unsafe { (resolve(fromfd, from), resolve(tofd, to)) };
    if let Some(((fa, pa), (fb, pb))) = both_local(&a, fromfd, from, &b, tofd, to) {
        // SAFETY: forwarded (or an absolute path of ours, alive for the call).
        return unsafe { real::renameat2(fa, pa, fb, pb, flags) };
    }
    match (a, b) {
        (Ok(Target::Ours(f)), Ok(Target::Ours(t))) => entry(-1, || {
            if flags & !libc::RENAME_NOREPLACE != 0 {
                return Err(libc::EINVAL); // RENAME_EXCHANGE, RENAME_WHITEOUT: not in BenchFS
            }
            let how = if flags & libc::RENAME_NOREPLACE != 0 {
                protocol::meta::NO_REPLACE
            } else {
                0
            };
            with_client("rename", &f, |c| c.rename_with(&f, &t, how))?;
            Ok(0)
        }),
        (Err(e), _) | (_, Err(e)) => {
            set_errno(e);
            -1
        }
        _ => {
            set_errno(libc::EXDEV); // across BenchFS and a local file system
            -1
        }
    }
}

/// A path as the kernel's `*at` calls take it: a directory descriptor and a path.
type AtPath = (c_int, *const c_char);

/// For a call naming two paths (rename, link): the paths to give the kernel when neither is
/// BenchFS's; None otherwise.
fn both_local(
    a: &Result<Target, c_int>,
    fromfd: c_int,
    from: *const c_char,
    b: &Result<Target, c_int>,
    tofd: c_int,
    to: *const c_char,
) -> Option<(AtPath, AtPath)> {
    let local = |t: &Result<Target, c_int>, fd: c_int, p: *const c_char| match t {
        Ok(Target::LocalAt(abs)) => Some((libc::AT_FDCWD, abs.as_ptr())),
        Ok(Target::Local) => Some((fd, p)),
        _ => None,
    };
    Some((local(a, fromfd, from)?, local(b, tofd, to)?))
}

/// Hard links: BenchFS refuses them as file systems without them do (EPERM, as vfat; a
/// missing source is ENOENT first); across BenchFS and a local file system, EXDEV.
#[no_mangle]
pub unsafe extern "C" fn linkat(
    fromfd: c_int,
    from: *const c_char,
    tofd: c_int,
    to: *const c_char,
    flags: c_int,
) -> c_int {
    // SAFETY: forwarded contract.
    let (a, b) = unsafe { (resolve(fromfd, from), resolve(tofd, to)) };
    if let Some(((fa, pa), (fb, pb))) = both_local(&a, fromfd, from, &b, tofd, to) {
        // SAFETY: forwarded (or an absolute path of ours, alive for the call).
        return unsafe { real::linkat(fa, pa, fb, pb, flags) };
    }
    match (a, b) {
        (Ok(Target::Ours(f)), Ok(Target::Ours(_))) => entry(-1, || {
            // linkat follows a link only with AT_SYMLINK_FOLLOW.
            let own = if flags & libc::AT_SYMLINK_FOLLOW != 0 {
                0
            } else {
                libc::AT_SYMLINK_NOFOLLOW
            };
            stat_at(&f, own)?;
            Err(libc::EPERM)
        }),
        (Err(e), _) | (_, Err(e)) => {
            set_errno(e);
            -1
        }
        _ => {
            set_errno(libc::EXDEV); // across BenchFS and a local file system
            -1
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn link(from: *const c_char, to: *const c_char) -> c_int {
    // SAFETY: forwarded.
    unsafe { linkat(libc::AT_FDCWD, from, libc::AT_FDCWD, to, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn renameat(
    fromfd: c_int,
    from: *const c_char,
    tofd: c_int,
    to: *const c_char,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { renameat2(fromfd, from, tofd, to, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn rename(from: *const c_char, to: *const c_char) -> c_int {
    // SAFETY: forwarded.
    unsafe { renameat2(libc::AT_FDCWD, from, libc::AT_FDCWD, to, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn truncate64(path: *const c_char, len: libc::off64_t) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        route(
            libc::AT_FDCWD,
            path,
            -1,
            |_, p| real::truncate64(p, len),
            |p| {
                let len = u64::try_from(len).map_err(|_| libc::EINVAL)?;
                with_client("truncate", &p, |c| c.truncate(&p, len))?;
                Ok(0)
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn truncate(path: *const c_char, len: libc::off64_t) -> c_int {
    // SAFETY: forwarded.
    unsafe { truncate64(path, len) }
}

// ---- attributes ----

#[no_mangle]
pub unsafe extern "C" fn fchmodat(dirfd: c_int, path: *const c_char, mode: mode_t, flags: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        route(
            dirfd,
            path,
            -1,
            |d, p| real::fchmodat(d, p, mode, flags),
            |p| {
                // A link's own mode cannot change (as Linux answers lchmod).
                if flags & libc::AT_SYMLINK_NOFOLLOW != 0 && stat_at(&p, flags)?.kind == Kind::Symlink {
                    return Err(libc::EOPNOTSUPP);
                }
                with_client("chmod", &p, |c| c.set_attr(&p, Some(mode & 0o7777), None))?;
                Ok(0)
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn chmod(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: forwarded.
    unsafe { fchmodat(libc::AT_FDCWD, path, mode, 0) }
}

/// BenchFS files belong to whoever uses the cluster: a change of owner is EOPNOTSUPP, the
/// owner they already show is accepted (as the mount does).
pub fn check_owner(uid: libc::uid_t, gid: libc::gid_t) -> Result<c_int, c_int> {
    let (u, g) = uid_gid();
    if (uid == u32::MAX || uid == u) && (gid == u32::MAX || gid == g) {
        Ok(0)
    } else {
        Err(libc::EOPNOTSUPP)
    }
}

#[no_mangle]
pub unsafe extern "C" fn fchownat(
    dirfd: c_int,
    path: *const c_char,
    uid: libc::uid_t,
    gid: libc::gid_t,
    flags: c_int,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        route(
            dirfd,
            path,
            -1,
            |d, p| real::fchownat(d, p, uid, gid, flags),
            |p| {
                stat_at(&p, flags)?; // lchown: the link itself, as tar sets it
                check_owner(uid, gid)
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn chown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    // SAFETY: forwarded.
    unsafe { fchownat(libc::AT_FDCWD, path, uid, gid, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn lchown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    // SAFETY: forwarded.
    unsafe { fchownat(libc::AT_FDCWD, path, uid, gid, libc::AT_SYMLINK_NOFOLLOW) }
}

/// The modification time `times` asks for (utimensat's rules); None: leave it.
pub unsafe fn mtime_of(times: *const libc::timespec) -> Result<Option<u64>, c_int> {
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    };
    if times.is_null() {
        return Ok(Some(now()));
    }
    // SAFETY: two timespecs by contract.
    let m = unsafe { *times.add(1) };
    match m.tv_nsec {
        libc::UTIME_OMIT => Ok(None),
        libc::UTIME_NOW => Ok(Some(now())),
        ns if !(0..1_000_000_000).contains(&ns) => Err(libc::EINVAL),
        ns => Ok(Some((m.tv_sec.max(0) as u64) * 1_000_000_000 + ns as u64)),
    }
}

/// The two times of `tv` (utimes' microseconds) as utimensat's; None for NULL (now).
unsafe fn timevals(tv: *const libc::timeval) -> Option<[libc::timespec; 2]> {
    if tv.is_null() {
        return None;
    }
    // SAFETY: two timevals by the caller's contract.
    let (a, m) = unsafe { (*tv, *tv.add(1)) };
    let ts = |t: libc::timeval| libc::timespec {
        tv_sec: t.tv_sec,
        tv_nsec: t.tv_usec * 1000,
    };
    Some([ts(a), ts(m)])
}

fn times_ptr(t: &Option<[libc::timespec; 2]>) -> *const libc::timespec {
    t.as_ref().map_or(std::ptr::null(), |t| t.as_ptr())
}

// utime, utimes, lutimes, futimes and futimesat: glibc makes them utimensat system calls of
// its own, past this library; here they are the library's utimensat and futimens.
#[no_mangle]
pub unsafe extern "C" fn utime(path: *const c_char, times: *const libc::utimbuf) -> c_int {
    // SAFETY: a utimbuf by the caller's contract, or NULL.
    let t = unsafe { times.as_ref() }.map(|u| {
        [
            libc::timespec {
                tv_sec: u.actime,
                tv_nsec: 0,
            },
            libc::timespec {
                tv_sec: u.modtime,
                tv_nsec: 0,
            },
        ]
    });
    // SAFETY: forwarded.
    unsafe { utimensat(libc::AT_FDCWD, path, times_ptr(&t), 0) }
}

#[no_mangle]
pub unsafe extern "C" fn utimes(path: *const c_char, tv: *const libc::timeval) -> c_int {
    // SAFETY: forwarded contract.
    let t = unsafe { timevals(tv) };
    // SAFETY: forwarded.
    unsafe { utimensat(libc::AT_FDCWD, path, times_ptr(&t), 0) }
}

#[no_mangle]
pub unsafe extern "C" fn lutimes(path: *const c_char, tv: *const libc::timeval) -> c_int {
    // SAFETY: forwarded contract.
    let t = unsafe { timevals(tv) };
    // SAFETY: forwarded.
    unsafe { utimensat(libc::AT_FDCWD, path, times_ptr(&t), libc::AT_SYMLINK_NOFOLLOW) }
}

#[no_mangle]
pub unsafe extern "C" fn futimesat(dirfd: c_int, path: *const c_char, tv: *const libc::timeval) -> c_int {
    // SAFETY: forwarded contract.
    let t = unsafe { timevals(tv) };
    // SAFETY: forwarded (a NULL path is the descriptor itself).
    unsafe { utimensat(dirfd, path, times_ptr(&t), 0) }
}

#[no_mangle]
pub unsafe extern "C" fn futimes(fd: c_int, tv: *const libc::timeval) -> c_int {
    // SAFETY: forwarded contract.
    let t = unsafe { timevals(tv) };
    // SAFETY: forwarded.
    unsafe { crate::files::futimens(fd, times_ptr(&t)) }
}

#[no_mangle]
pub unsafe extern "C" fn utimensat(
    dirfd: c_int,
    path: *const c_char,
    times: *const libc::timespec,
    flags: c_int,
) -> c_int {
    if path.is_null() {
        // futimens is utimensat(fd, NULL, ...) in glibc.
        // SAFETY: forwarded.
        return unsafe { crate::files::futimens(dirfd, times) };
    }
    // SAFETY: forwarded contract.
    unsafe {
        route(
            dirfd,
            path,
            -1,
            |d, p| real::utimensat(d, p, times, flags),
            |p| {
                let link = flags & libc::AT_SYMLINK_NOFOLLOW != 0;
                match (
                    mtime_of(times)?,
                    link && stat_at(&p, flags)?.kind == Kind::Symlink,
                ) {
                    // A link's own time (lutimes), as tar sets it.
                    (Some(ns), true) => with_client("utimens", &p, |c| c.set_link_time(&p, ns)).map(|_| 0),
                    (Some(ns), false) => {
                        with_client("utimens", &p, |c| c.set_attr(&p, None, Some(ns))).map(|_| 0)
                    }
                    (None, _) => stat_at(&p, flags).map(|_| 0),
                }
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn readlinkat(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut c_char,
    n: size_t,
) -> ssize_t {
    // SAFETY: forwarded contract.
    unsafe {
        route(
            dirfd,
            path,
            -1,
            |d, p| real::readlinkat(d, p, buf, n),
            |p| {
                let target = with_client("readlink", &p, |c| c.readlink(&p))?;
                let len = target.len().min(n);
                if len > 0 && buf.is_null() {
                    return Err(libc::EFAULT);
                }
                // SAFETY: writable for `n` bytes by the caller's contract; len <= n.
                std::ptr::copy_nonoverlapping(target.as_ptr(), buf.cast::<u8>(), len);
                Ok(len as ssize_t)
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn symlinkat(target: *const c_char, dirfd: c_int, path: *const c_char) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        route(
            dirfd,
            path,
            -1,
            |d, p| real::symlinkat(target, d, p),
            |p| {
                if target.is_null() {
                    return Err(libc::EFAULT);
                }
                // SAFETY: a string by the caller's contract.
                let target = std::ffi::CStr::from_ptr(target)
                    .to_str()
                    .map_err(|_| libc::EINVAL)?;
                with_client("symlink", &p, |c| c.symlink(target, &p)).map(|()| 0)
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn symlink(target: *const c_char, path: *const c_char) -> c_int {
    // SAFETY: forwarded.
    unsafe { symlinkat(target, libc::AT_FDCWD, path) }
}

#[no_mangle]
pub unsafe extern "C" fn readlink(path: *const c_char, buf: *mut c_char, n: size_t) -> ssize_t {
    // SAFETY: forwarded.
    unsafe { readlinkat(libc::AT_FDCWD, path, buf, n) }
}

// ---- file system ----

/// `f_type` of BenchFS ("bfs").
const MAGIC: i64 = 0x0062_6673;
const BSIZE: u64 = 4096;

pub fn fill_statfs(st: &mut libc::statfs64) -> Result<c_int, c_int> {
    let cap = with_client("statfs", "/", |c| c.statfs())?;
    let t = cap.total;
    // SAFETY: all-zero is a valid statfs64.
    *st = unsafe { std::mem::zeroed() };
    st.f_type = MAGIC;
    st.f_bsize = BSIZE as i64;
    st.f_frsize = BSIZE as i64;
    st.f_blocks = t.total_bytes / BSIZE;
    st.f_bfree = t.free_bytes / BSIZE;
    st.f_bavail = t.avail_bytes / BSIZE;
    // BenchFS allocates names without limit: free inodes are reported as unbounded.
    st.f_files = t.inodes + u64::from(u32::MAX);
    st.f_ffree = u64::from(u32::MAX);
    st.f_namelen = benchfs_core::namespace::NAME_MAX as i64;
    Ok(0)
}

pub fn fill_statvfs(st: &mut libc::statvfs64) -> Result<c_int, c_int> {
    // SAFETY: all-zero is a valid statfs64.
    let mut fs: libc::statfs64 = unsafe { std::mem::zeroed() };
    fill_statfs(&mut fs)?;
    // SAFETY: all-zero is a valid statvfs64.
    *st = unsafe { std::mem::zeroed() };
    st.f_bsize = fs.f_bsize as u64;
    st.f_frsize = fs.f_frsize as u64;
    st.f_blocks = fs.f_blocks;
    st.f_bfree = fs.f_bfree;
    st.f_bavail = fs.f_bavail;
    st.f_files = fs.f_files;
    st.f_ffree = fs.f_ffree;
    st.f_favail = fs.f_ffree;
    st.f_fsid = DEV;
    st.f_namemax = fs.f_namelen as u64;
    Ok(0)
}

#[no_mangle]
pub unsafe extern "C" fn statfs64(path: *const c_char, st: *mut libc::statfs64) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        route(
            libc::AT_FDCWD,
            path,
            -1,
            |_, p| real::statfs64(p, st),
            |p| {
                stat_of(&p)?;
                fill_statfs(out(st)?)
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn statfs(path: *const c_char, st: *mut libc::statfs64) -> c_int {
    // SAFETY: forwarded.
    unsafe { statfs64(path, st) }
}

#[no_mangle]
pub unsafe extern "C" fn statvfs64(path: *const c_char, st: *mut libc::statvfs64) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        route(
            libc::AT_FDCWD,
            path,
            -1,
            |_, p| real::statvfs64(p, st),
            |p| {
                stat_of(&p)?;
                fill_statvfs(out(st)?)
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn statvfs(path: *const c_char, st: *mut libc::statvfs64) -> c_int {
    // SAFETY: forwarded.
    unsafe { statvfs64(path, st) }
}

#[no_mangle]
pub unsafe extern "C" fn umask(mask: mode_t) -> mode_t {
    // SAFETY: umask cannot fail.
    let old = unsafe { real::umask(mask) };
    crate::UMASK.store(mask & 0o777, std::sync::atomic::Ordering::Relaxed);
    old
}

// ---- extended attributes: BenchFS has none (ENOTSUP, as a file system without them) ----

macro_rules! no_xattr_path {
    ($($name:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty;)*) => {
        $(
            #[no_mangle]
            pub unsafe extern "C" fn $name(path: *const c_char, $($arg: $ty),*) -> $ret {
                // SAFETY: forwarded contract.
                unsafe {
                    route(libc::AT_FDCWD, path, -1, |_, p| real::$name(p, $($arg),*), |p| {
                        stat_of(&p)?;
                        Err(libc::ENOTSUP)
                    })
                }
            }
        )*
    };
}

no_xattr_path! {
    getxattr(name: *const c_char, value: *mut c_void, size: size_t) -> ssize_t;
    lgetxattr(name: *const c_char, value: *mut c_void, size: size_t) -> ssize_t;
    setxattr(name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int;
    lsetxattr(name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int;
    listxattr(list: *mut c_char, size: size_t) -> ssize_t;
    llistxattr(list: *mut c_char, size: size_t) -> ssize_t;
    removexattr(name: *const c_char) -> c_int;
    lremovexattr(name: *const c_char) -> c_int;
}

// ---- the working directory ----

#[no_mangle]
pub unsafe extern "C" fn chdir(path: *const c_char) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        route(
            libc::AT_FDCWD,
            path,
            -1,
            |_, p| {
                let r = real::chdir(p);
                if r == 0 {
                    set_bfs_cwd(None);
                }
                r
            },
            |p| {
                if stat_of(&p)?.kind != Kind::Dir {
                    return Err(libc::ENOTDIR);
                }
                set_bfs_cwd(Some(p));
                Ok(0)
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn fchdir(fd: c_int) -> c_int {
    let Some(f) = fds::lookup(fd) else {
        // SAFETY: forwarded.
        let r = unsafe { real::fchdir(fd) };
        if r == 0 {
            set_bfs_cwd(None);
        }
        return r;
    };
    if !f.is_dir() {
        set_errno(libc::ENOTDIR);
        return -1;
    }
    set_bfs_cwd(Some(f.path.clone()));
    0
}

/// Copies `dir` into the caller's buffer as getcwd does (or a malloc'ed one for NULL).
unsafe fn give_cwd(dir: &str, buf: *mut c_char, size: size_t) -> *mut c_char {
    let bytes = dir.as_bytes();
    if buf.is_null() {
        let want = if size == 0 { bytes.len() + 1 } else { size };
        if want < bytes.len() + 1 {
            set_errno(libc::ERANGE);
            return std::ptr::null_mut();
        }
        // SAFETY: malloc'ed as glibc's getcwd does, so the caller frees it.
        let p = unsafe { libc::malloc(want) }.cast::<c_char>();
        if p.is_null() {
            set_errno(libc::ENOMEM);
            return p;
        }
        // SAFETY: `want` bytes, enough for the path and its NUL.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), p, bytes.len());
            *p.add(bytes.len()) = 0;
        }
        return p;
    }
    if size < bytes.len() + 1 {
        set_errno(if size == 0 { libc::EINVAL } else { libc::ERANGE });
        return std::ptr::null_mut();
    }
    // SAFETY: the caller's buffer of `size` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, bytes.len());
        *buf.add(bytes.len()) = 0;
    }
    buf
}

#[no_mangle]
pub unsafe extern "C" fn getcwd(buf: *mut c_char, size: size_t) -> *mut c_char {
    match (bfs_cwd(), prefix()) {
        // SAFETY: forwarded contract.
        (Some(dir), Some(pre)) => unsafe { give_cwd(&pre.outside(&dir), buf, size) },
        // SAFETY: forwarded.
        _ => unsafe { real::getcwd(buf, size) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn get_current_dir_name() -> *mut c_char {
    match (bfs_cwd(), prefix()) {
        // SAFETY: a malloc'ed copy, as glibc's.
        (Some(dir), Some(pre)) => unsafe { give_cwd(&pre.outside(&dir), std::ptr::null_mut(), 0) },
        // SAFETY: forwarded.
        _ => unsafe { real::getcwd(std::ptr::null_mut(), 0) },
    }
}
