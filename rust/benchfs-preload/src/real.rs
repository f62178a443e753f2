//! The definitions this library stands in front of: each looked up once with
//! `dlsym(RTLD_NEXT, name)` (the next object in the lookup order, normally libc) and kept.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};

/// The address of the next definition of `name`, looked up at the first call.
fn next(slot: &AtomicPtr<c_void>, name: &CStr) -> *mut c_void {
    let known = slot.load(Ordering::Relaxed);
    if !known.is_null() {
        return known;
    }
    // SAFETY: a valid NUL-terminated name; RTLD_NEXT is defined for a shared object.
    let found = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    if found.is_null() {
        // No next definition: libc lacks the symbol (an older glibc). Saying so once per
        // process would need the symbol we lack; the caller answers ENOSYS.
        return found;
    }
    slot.store(found, Ordering::Relaxed);
    found
}

/// Declares `real::NAME(args) -> ret`, calling the next definition, or failing with ENOSYS
/// where there is none.
macro_rules! real {
    ($($name:ident ( $($arg:ident : $ty:ty),* $(, ...)? ) -> $ret:ty = $fail:expr;)*) => {
        $(
            #[allow(clippy::unused_unit)] // rewinddir and seekdir return nothing
            pub unsafe fn $name($($arg: $ty),*) -> $ret {
                static SLOT: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
                let f = next(&SLOT, unsafe {
                    CStr::from_bytes_with_nul_unchecked(concat!(stringify!($name), "\0").as_bytes())
                });
                if f.is_null() {
                    crate::set_errno(libc::ENOSYS);
                    return $fail;
                }
                // SAFETY: the symbol has this C signature (the libc declaration).
                let f: unsafe extern "C" fn($($ty),*) -> $ret = unsafe { std::mem::transmute(f) };
                // SAFETY: the caller's arguments, forwarded unchanged.
                unsafe { f($($arg),*) }
            }
        )*
    };
}

use libc::{mode_t, off64_t, size_t, ssize_t};
pub type Iovec = libc::iovec;

real! {
    openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int = -1;
    close(fd: c_int) -> c_int = -1;
    read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t = -1;
    write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t = -1;
    pread64(fd: c_int, buf: *mut c_void, n: size_t, off: off64_t) -> ssize_t = -1;
    pwrite64(fd: c_int, buf: *const c_void, n: size_t, off: off64_t) -> ssize_t = -1;
    readv(fd: c_int, iov: *const Iovec, n: c_int) -> ssize_t = -1;
    writev(fd: c_int, iov: *const Iovec, n: c_int) -> ssize_t = -1;
    preadv64(fd: c_int, iov: *const Iovec, n: c_int, off: off64_t) -> ssize_t = -1;
    pwritev64(fd: c_int, iov: *const Iovec, n: c_int, off: off64_t) -> ssize_t = -1;
    preadv64v2(fd: c_int, iov: *const Iovec, n: c_int, off: off64_t, flags: c_int) -> ssize_t = -1;
    pwritev64v2(fd: c_int, iov: *const Iovec, n: c_int, off: off64_t, flags: c_int) -> ssize_t = -1;
    lseek64(fd: c_int, off: off64_t, whence: c_int) -> off64_t = -1;
    dup(fd: c_int) -> c_int = -1;
    dup3(fd: c_int, to: c_int, flags: c_int) -> c_int = -1;
    dup2(fd: c_int, to: c_int) -> c_int = -1;
    fcntl(fd: c_int, cmd: c_int, arg: *mut c_void) -> c_int = -1;
    ioctl(fd: c_int, req: libc::c_ulong, arg: *mut c_void) -> c_int = -1;
    fstat64(fd: c_int, st: *mut libc::stat64) -> c_int = -1;
    fstatat64(dirfd: c_int, path: *const c_char, st: *mut libc::stat64, flags: c_int) -> c_int = -1;
    statx(dirfd: c_int, path: *const c_char, flags: c_int, mask: libc::c_uint, st: *mut libc::statx) -> c_int = -1;
    faccessat(dirfd: c_int, path: *const c_char, mode: c_int, flags: c_int) -> c_int = -1;
    ftruncate64(fd: c_int, len: off64_t) -> c_int = -1;
    truncate64(path: *const c_char, len: off64_t) -> c_int = -1;
    fsync(fd: c_int) -> c_int = -1;
    fdatasync(fd: c_int) -> c_int = -1;
    unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int = -1;
    mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int = -1;
    renameat2(fromfd: c_int, from: *const c_char, tofd: c_int, to: *const c_char, flags: libc::c_uint) -> c_int = -1;
    fchmodat(dirfd: c_int, path: *const c_char, mode: mode_t, flags: c_int) -> c_int = -1;
    fchmod(fd: c_int, mode: mode_t) -> c_int = -1;
    fchownat(dirfd: c_int, path: *const c_char, uid: libc::uid_t, gid: libc::gid_t, flags: c_int) -> c_int = -1;
    fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int = -1;
    utimensat(dirfd: c_int, path: *const c_char, times: *const libc::timespec, flags: c_int) -> c_int = -1;
    futimens(fd: c_int, times: *const libc::timespec) -> c_int = -1;
    readlinkat(dirfd: c_int, path: *const c_char, buf: *mut c_char, n: size_t) -> ssize_t = -1;
    symlinkat(target: *const c_char, dirfd: c_int, path: *const c_char) -> c_int = -1;
    linkat(fromfd: c_int, from: *const c_char, tofd: c_int, to: *const c_char, flags: c_int) -> c_int = -1;
    mkostemps64(template: *mut c_char, suffix: c_int, flags: c_int) -> c_int = -1;
    mkdtemp(template: *mut c_char) -> *mut c_char = std::ptr::null_mut();
    flock(fd: c_int, op: c_int) -> c_int = -1;
    lockf64(fd: c_int, cmd: c_int, len: off64_t) -> c_int = -1;
    statfs64(path: *const c_char, st: *mut libc::statfs64) -> c_int = -1;
    fstatfs64(fd: c_int, st: *mut libc::statfs64) -> c_int = -1;
    statvfs64(path: *const c_char, st: *mut libc::statvfs64) -> c_int = -1;
    fstatvfs64(fd: c_int, st: *mut libc::statvfs64) -> c_int = -1;
    posix_fadvise64(fd: c_int, off: off64_t, len: off64_t, advice: c_int) -> c_int = libc::ENOSYS;
    fallocate64(fd: c_int, mode: c_int, off: off64_t, len: off64_t) -> c_int = -1;
    posix_fallocate64(fd: c_int, off: off64_t, len: off64_t) -> c_int = libc::ENOSYS;
    copy_file_range(fd_in: c_int, off_in: *mut off64_t, fd_out: c_int, off_out: *mut off64_t, len: size_t, flags: libc::c_uint) -> ssize_t = -1;
    sendfile64(out: c_int, fd_in: c_int, off: *mut off64_t, count: size_t) -> ssize_t = -1;
    mmap64(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off64_t) -> *mut c_void = libc::MAP_FAILED;
    opendir(path: *const c_char) -> *mut libc::DIR = std::ptr::null_mut();
    fdopendir(fd: c_int) -> *mut libc::DIR = std::ptr::null_mut();
    readdir64(dir: *mut libc::DIR) -> *mut libc::dirent64 = std::ptr::null_mut();
    scandir64(path: *const c_char, list: *mut *mut *mut libc::dirent64, filter: Option<unsafe extern "C" fn(*const libc::dirent64) -> c_int>, compar: Option<unsafe extern "C" fn(*mut *const libc::dirent64, *mut *const libc::dirent64) -> c_int>) -> c_int = -1;
    closedir(dir: *mut libc::DIR) -> c_int = -1;
    dirfd(dir: *mut libc::DIR) -> c_int = -1;
    rewinddir(dir: *mut libc::DIR) -> () = ();
    telldir(dir: *mut libc::DIR) -> libc::c_long = -1;
    seekdir(dir: *mut libc::DIR, pos: libc::c_long) -> () = ();
    umask(mask: mode_t) -> mode_t = 0o022;
    chdir(path: *const c_char) -> c_int = -1;
    execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int = -1;
    execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int = -1;
    fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char) -> c_int = -1;
    posix_spawn(pid: *mut libc::pid_t, path: *const c_char, actions: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int = libc::ENOSYS;
    posix_spawnp(pid: *mut libc::pid_t, file: *const c_char, actions: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int = libc::ENOSYS;
    system(command: *const c_char) -> c_int = -1;
    nftw64(path: *const c_char, f: Option<crate::dirs::NftwFn>, fds: c_int, flags: c_int) -> c_int = -1;
    ftw64(path: *const c_char, f: Option<crate::dirs::FtwFn>, fds: c_int) -> c_int = -1;
    glob(pattern: *const c_char, flags: c_int, errfunc: Option<unsafe extern "C" fn(*const c_char, c_int) -> c_int>, pglob: *mut crate::dirs::GlobT) -> c_int = libc::GLOB_ABORTED;
    popen(command: *const c_char, mode: *const c_char) -> *mut libc::FILE = std::ptr::null_mut();
    fchdir(fd: c_int) -> c_int = -1;
    getcwd(buf: *mut c_char, size: size_t) -> *mut c_char = std::ptr::null_mut();
    fopen64(path: *const c_char, mode: *const c_char) -> *mut libc::FILE = std::ptr::null_mut();
    freopen64(path: *const c_char, mode: *const c_char, stream: *mut libc::FILE) -> *mut libc::FILE = std::ptr::null_mut();
    fdopen(fd: c_int, mode: *const c_char) -> *mut libc::FILE = std::ptr::null_mut();
    fileno(stream: *mut libc::FILE) -> c_int = -1;
    getxattr(path: *const c_char, name: *const c_char, value: *mut c_void, size: size_t) -> ssize_t = -1;
    lgetxattr(path: *const c_char, name: *const c_char, value: *mut c_void, size: size_t) -> ssize_t = -1;
    fgetxattr(fd: c_int, name: *const c_char, value: *mut c_void, size: size_t) -> ssize_t = -1;
    setxattr(path: *const c_char, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int = -1;
    lsetxattr(path: *const c_char, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int = -1;
    fsetxattr(fd: c_int, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int = -1;
    listxattr(path: *const c_char, list: *mut c_char, size: size_t) -> ssize_t = -1;
    llistxattr(path: *const c_char, list: *mut c_char, size: size_t) -> ssize_t = -1;
    flistxattr(fd: c_int, list: *mut c_char, size: size_t) -> ssize_t = -1;
    removexattr(path: *const c_char, name: *const c_char) -> c_int = -1;
    lremovexattr(path: *const c_char, name: *const c_char) -> c_int = -1;
    fremovexattr(fd: c_int, name: *const c_char) -> c_int = -1;
}
