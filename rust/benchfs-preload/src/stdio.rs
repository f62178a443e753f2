//! `FILE` streams on BenchFS files. glibc's stdio reads and writes with internal calls this
//! library cannot see, so a stream on a BenchFS file is made with `fopencookie` over this
//! library's own read, write, lseek and close: glibc's `fread`, `fgets`, `fprintf`, `fseek`
//! and `fclose` then work unchanged.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Mutex, MutexGuard, PoisonError};

use libc::{off64_t, size_t, ssize_t};

use crate::files;
use crate::names::{resolve, Target};
use crate::{fds, real, set_errno};

/// Our streams and their descriptors (for `fileno`).
static STREAMS: Mutex<Option<HashMap<usize, c_int>>> = Mutex::new(None);

fn streams() -> MutexGuard<'static, Option<HashMap<usize, c_int>>> {
    STREAMS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// open(2) flags for an fopen mode ("r", "w+", "ab", "re", "wx", ...); EINVAL otherwise.
pub fn mode_flags(mode: &str) -> Result<c_int, c_int> {
    let mut chars = mode.chars();
    let mut flags = match chars.next() {
        Some('r') => libc::O_RDONLY,
        Some('w') => libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        Some('a') => libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
        _ => return Err(libc::EINVAL),
    };
    for c in chars {
        match c {
            '+' => flags = (flags & !libc::O_ACCMODE) | libc::O_RDWR,
            'x' => flags |= libc::O_EXCL,
            'e' => flags |= libc::O_CLOEXEC,
            'b' | 't' | 'm' | 'c' => {}
            ',' => break, // ",ccs=..." (a character set): nothing for the descriptor
            _ => return Err(libc::EINVAL),
        }
    }
    Ok(flags)
}

unsafe extern "C" fn cookie_read(cookie: *mut c_void, buf: *mut c_char, n: size_t) -> ssize_t {
    // SAFETY: glibc hands a buffer of n bytes.
    unsafe { files::read(fd_of(cookie), buf.cast(), n) }
}

unsafe extern "C" fn cookie_write(cookie: *mut c_void, buf: *const c_char, n: size_t) -> ssize_t {
    // SAFETY: as above.
    let done = unsafe { files::write(fd_of(cookie), buf.cast(), n) };
    // glibc's contract for a cookie writer: 0 on error (errno set), never -1.
    done.max(0)
}

unsafe extern "C" fn cookie_seek(cookie: *mut c_void, off: *mut off64_t, whence: c_int) -> c_int {
    // SAFETY: glibc hands a valid offset.
    unsafe {
        let to = files::lseek64(fd_of(cookie), *off, whence);
        if to < 0 {
            return -1;
        }
        *off = to;
    }
    0
}

unsafe extern "C" fn cookie_close(cookie: *mut c_void) -> c_int {
    if cookie as usize & BORROWED != 0 {
        return 0; // a standard stream's descriptor belongs to the program
    }
    let fd = fd_of(cookie);
    if let Some(m) = streams().as_mut() {
        m.retain(|_, v| *v != fd);
    }
    // SAFETY: the stream's own descriptor.
    unsafe { files::close(fd) }
}

/// glibc's `cookie_io_functions_t` (libio/bits/types/cookie_io_functions_t.h, glibc 2.36:
/// four function pointers, read, write, seek with an `off64_t *`, close), which the libc crate
/// does not declare.
#[repr(C)]
struct CookieIo {
    read: Option<unsafe extern "C" fn(*mut c_void, *mut c_char, size_t) -> ssize_t>,
    write: Option<unsafe extern "C" fn(*mut c_void, *const c_char, size_t) -> ssize_t>,
    seek: Option<unsafe extern "C" fn(*mut c_void, *mut off64_t, c_int) -> c_int>,
    close: Option<unsafe extern "C" fn(*mut c_void) -> c_int>,
}

extern "C" {
    fn fopencookie(cookie: *mut c_void, mode: *const c_char, io: CookieIo) -> *mut libc::FILE;
}

/// A cookie's flag for a stream that does not own its descriptor (fclose leaves it open).
const BORROWED: usize = 1 << 32;

fn fd_of(cookie: *mut c_void) -> c_int {
    (cookie as usize & 0xffff_ffff) as c_int
}

/// A stream over our descriptor `fd`, which it now owns (fclose closes it).
unsafe fn cookie_stream(fd: c_int, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: forwarded.
    let fp = unsafe { make_stream(fd as usize, mode) };
    if !fp.is_null() {
        streams().get_or_insert_with(HashMap::new).insert(fp as usize, fd);
    }
    fp
}

unsafe fn make_stream(cookie: usize, mode: *const c_char) -> *mut libc::FILE {
    let io = CookieIo {
        read: Some(cookie_read),
        write: Some(cookie_write),
        seek: Some(cookie_seek),
        close: Some(cookie_close),
    };
    // SAFETY: a valid mode string and functions with the documented signatures.
    unsafe { fopencookie(cookie as *mut c_void, mode, io) }
}

unsafe fn open_stream(
    path: *const c_char,
    mode: *const c_char,
    local: impl FnOnce(*const c_char) -> *mut libc::FILE,
) -> *mut libc::FILE {
    // SAFETY: forwarded contract.
    match unsafe { resolve(libc::AT_FDCWD, path) } {
        Ok(Target::Local) => local(path),
        Ok(Target::LocalAt(abs)) => local(abs.as_ptr()),
        Ok(Target::Ours(_)) => {
            // SAFETY: NUL-terminated by contract.
            let flags = match unsafe { mode.as_ref() }
                .map(|_| unsafe { CStr::from_ptr(mode) }.to_string_lossy().into_owned())
                .ok_or(libc::EINVAL)
                .and_then(|m| mode_flags(&m))
            {
                Ok(f) => f,
                Err(e) => {
                    set_errno(e);
                    return std::ptr::null_mut();
                }
            };
            // SAFETY: forwarded.
            let fd = unsafe { files::benchfs_preload_openat(libc::AT_FDCWD, path, flags, 0o666) };
            if fd < 0 {
                return std::ptr::null_mut();
            }
            if crate::fds::lookup(fd).is_none() {
                // A link led outside BenchFS: the kernel opened it.
                // SAFETY: the kernel's descriptor, now the stream's.
                return unsafe { real::fdopen(fd, mode) };
            }
            // SAFETY: our descriptor and the caller's mode.
            let fp = unsafe { cookie_stream(fd, mode) };
            if fp.is_null() {
                let e = std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::ENOMEM);
                // SAFETY: our descriptor.
                unsafe { files::close(fd) };
                set_errno(e);
            }
            fp
        }
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn fopen64(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: forwarded.
    unsafe { open_stream(path, mode, |p| real::fopen64(p, mode)) }
}

#[no_mangle]
pub unsafe extern "C" fn fopen(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: forwarded.
    unsafe { fopen64(path, mode) }
}

/// `freopen` onto a BenchFS path cannot keep the stream object (glibc would do the I/O with
/// calls this library cannot see): it fails with ENOTSUP, and the stream is left as it was.
#[no_mangle]
pub unsafe extern "C" fn freopen64(
    path: *const c_char,
    mode: *const c_char,
    stream: *mut libc::FILE,
) -> *mut libc::FILE {
    if !path.is_null() {
        // SAFETY: forwarded contract.
        match unsafe { resolve(libc::AT_FDCWD, path) } {
            Ok(Target::Local) => {}
            // SAFETY: an absolute path of ours, alive for the call.
            Ok(Target::LocalAt(abs)) => return unsafe { real::freopen64(abs.as_ptr(), mode, stream) },
            Ok(Target::Ours(p)) => {
                crate::say(&format!(
                    "freopen of {p} onto an existing stream is not supported"
                ));
                set_errno(libc::ENOTSUP);
                return std::ptr::null_mut();
            }
            Err(e) => {
                set_errno(e);
                return std::ptr::null_mut();
            }
        }
    }
    // SAFETY: forwarded.
    unsafe { real::freopen64(path, mode, stream) }
}

#[no_mangle]
pub unsafe extern "C" fn freopen(
    path: *const c_char,
    mode: *const c_char,
    stream: *mut libc::FILE,
) -> *mut libc::FILE {
    // SAFETY: forwarded.
    unsafe { freopen64(path, mode, stream) }
}

#[no_mangle]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const c_char) -> *mut libc::FILE {
    if fds::lookup(fd).is_none() {
        // SAFETY: forwarded.
        return unsafe { real::fdopen(fd, mode) };
    }
    // SAFETY: our descriptor and the caller's mode.
    unsafe { cookie_stream(fd, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn fileno(stream: *mut libc::FILE) -> c_int {
    if let Some(fd) = streams()
        .as_ref()
        .and_then(|m| m.get(&(stream as usize)).copied())
    {
        return fd;
    }
    // SAFETY: forwarded.
    unsafe { real::fileno(stream) }
}

#[no_mangle]
pub unsafe extern "C" fn fileno_unlocked(stream: *mut libc::FILE) -> c_int {
    // SAFETY: forwarded.
    unsafe { fileno(stream) }
}

// ---- the standard streams ----
//
// glibc's stdin, stdout and stderr read and write descriptors 0, 1 and 2 with internal calls.
// While one of those descriptors stands for a BenchFS file (a shell's `> file`, a redirection
// inherited from the parent), the stream variable is pointed at a stream over this library's
// calls, and back at glibc's own when the descriptor is local again. Programs read the
// variables at each use (`printf` is `vfprintf(stdout, ...)`), so the switch is seen at once.

extern "C" {
    static mut stdin: *mut libc::FILE;
    static mut stdout: *mut libc::FILE;
    static mut stderr: *mut libc::FILE;
}

/// glibc's own stream for each standard descriptor while ours stands in for it.
static SAVED: Mutex<[usize; 3]> = Mutex::new([0; 3]);

unsafe fn std_var(fd: c_int) -> *mut *mut libc::FILE {
    match fd {
        0 => &raw mut stdin,
        1 => &raw mut stdout,
        _ => &raw mut stderr,
    }
}

/// Before descriptor `fd` (0-2) changes: what its stream holds is written to the file it
/// still stands for.
pub fn before_std_change(fd: c_int) {
    if !(0..=2).contains(&fd) {
        return;
    }
    let saved = SAVED.lock().unwrap_or_else(PoisonError::into_inner);
    if saved[fd as usize] != 0 {
        // SAFETY: the variable holds our stream, which is valid.
        unsafe { libc::fflush(*std_var(fd)) };
    }
}

/// After descriptor `fd` (0-2) changed: its stream follows it into or out of BenchFS.
pub fn after_std_change(fd: c_int) {
    if !(0..=2).contains(&fd) {
        return;
    }
    let ours = fds::lookup(fd).is_some();
    let mut saved = SAVED.lock().unwrap_or_else(PoisonError::into_inner);
    let slot = &mut saved[fd as usize];
    // SAFETY: the variables are glibc's stream pointers; only streams are stored in them.
    unsafe {
        let var = std_var(fd);
        if ours && *slot == 0 {
            libc::fflush(*var);
            let mode = if fd == 0 { c"r" } else { c"w" };
            let fp = make_stream(fd as usize | BORROWED, mode.as_ptr());
            if fp.is_null() {
                crate::say(&format!(
                    "no stream for descriptor {fd}: its stdio output is lost"
                ));
                return;
            }
            if fd == 2 {
                libc::setvbuf(fp, std::ptr::null_mut(), libc::_IONBF, 0);
            }
            streams().get_or_insert_with(HashMap::new).insert(fp as usize, fd);
            *slot = *var as usize;
            *var = fp;
        } else if !ours && *slot != 0 {
            let mine = *var;
            *var = *slot as *mut libc::FILE;
            *slot = 0;
            if let Some(m) = streams().as_mut() {
                m.remove(&(mine as usize));
            }
            libc::fclose(mine); // flushed before the change; leaves the descriptor alone
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fopen_modes_map_to_open_flags() {
        assert_eq!(mode_flags("r"), Ok(libc::O_RDONLY));
        assert_eq!(mode_flags("rb+"), Ok(libc::O_RDWR));
        assert_eq!(
            mode_flags("w"),
            Ok(libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC)
        );
        assert_eq!(
            mode_flags("a+"),
            Ok(libc::O_RDWR | libc::O_CREAT | libc::O_APPEND)
        );
        assert_eq!(
            mode_flags("wxe"),
            Ok(libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_EXCL | libc::O_CLOEXEC)
        );
        assert_eq!(mode_flags("r,ccs=UTF-8"), Ok(libc::O_RDONLY));
        assert_eq!(mode_flags("q"), Err(libc::EINVAL));
        assert_eq!(mode_flags(""), Err(libc::EINVAL));
        assert_eq!(mode_flags("rz"), Err(libc::EINVAL));
    }
}
