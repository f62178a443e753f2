//! The entry points whose C declarations are variadic: `open(path, flags, ...)`,
//! `openat(dirfd, path, flags, ...)`, `fcntl(fd, cmd, ...)` and `ioctl(fd, request, ...)`.
//!
//! Stable Rust cannot define a variadic function, and a cdylib exports only the functions
//! Rust defines (a C file compiled into it keeps its symbols local), so they are defined here
//! with the optional argument named. On the targets below that is exactly what the caller
//! passed: their C calling conventions (System V x86-64; AAPCS64 as Linux uses it) place
//! variadic integer and pointer arguments in the same registers and stack slots as named
//! ones. glibc's own wrappers read the argument the same way: the mode only with O_CREAT or
//! O_TMPFILE (otherwise it is whatever the register held, and unused), fcntl's and ioctl's
//! third argument as a pointer-sized value whose low bits are the int some commands take.

#[cfg(not(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64"))))]
compile_error!("libbenchfs_preload's variadic entry points assume Linux on x86-64 or AArch64");

use std::ffi::{c_char, c_int, c_ulong, c_void};

use libc::mode_t;

use crate::files::{benchfs_preload_fcntl, benchfs_preload_ioctl, benchfs_preload_openat};

/// The mode argument if the flags say one was passed.
fn mode_if(flags: c_int, mode: mode_t) -> mode_t {
    if flags & libc::O_CREAT != 0 || flags & libc::O_TMPFILE == libc::O_TMPFILE {
        mode
    } else {
        0
    }
}

#[no_mangle]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    // SAFETY: forwarded.
    unsafe { benchfs_preload_openat(libc::AT_FDCWD, path, flags, mode_if(flags, mode)) }
}

#[no_mangle]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    // SAFETY: forwarded.
    unsafe { open(path, flags | libc::O_LARGEFILE, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    // SAFETY: forwarded.
    unsafe { benchfs_preload_openat(dirfd, path, flags, mode_if(flags, mode)) }
}

#[no_mangle]
pub unsafe extern "C" fn openat64(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    // SAFETY: forwarded.
    unsafe { openat(dirfd, path, flags | libc::O_LARGEFILE, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: *mut c_void) -> c_int {
    // SAFETY: forwarded.
    unsafe { benchfs_preload_fcntl(fd, cmd, arg) }
}

#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: *mut c_void) -> c_int {
    // SAFETY: forwarded.
    unsafe { benchfs_preload_fcntl(fd, cmd, arg) }
}

#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    // SAFETY: forwarded.
    unsafe { benchfs_preload_ioctl(fd, request, arg) }
}
