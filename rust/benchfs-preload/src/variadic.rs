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

// `execl(path, arg0, ..., NULL)`, `execlp(file, arg0, ..., NULL)` and
// `execle(path, arg0, ..., NULL, envp)`: glibc's own call its internal execve, past the
// wrappers that hand descriptors over, so they are defined here. Their arguments are all
// pointers, as many as the caller passed; a naked entry saves the six register arguments
// next to the caller's stack arguments, and `exec_list` reads them in order up to the NULL
// (and the envp after it), exactly as many as were passed. x86-64 only (elsewhere glibc's
// own run, and inherited BenchFS descriptors fail with EBADF in the new program).

/// Which exec function an `exec_list` call stands for.
#[cfg(target_arch = "x86_64")]
const EXECL: c_int = 0;
#[cfg(target_arch = "x86_64")]
const EXECLP: c_int = 1;
#[cfg(target_arch = "x86_64")]
const EXECLE: c_int = 2;

/// The arguments of an execl-style call: `regs` the six saved register arguments (System V
/// x86-64: rdi, rsi, rdx, rcx, r8, r9), `stack` the caller's stack arguments after them.
#[cfg(target_arch = "x86_64")]
unsafe extern "C" fn exec_list(
    regs: *const *const c_char,
    stack: *const *const c_char,
    kind: c_int,
) -> c_int {
    const IN_REGISTERS: usize = 6;
    // SAFETY: argument i exists for every i up to the terminating NULL (and the envp after it
    // for execle): the caller's contract.
    let arg = |i: usize| unsafe {
        if i < IN_REGISTERS {
            *regs.add(i)
        } else {
            *stack.add(i - IN_REGISTERS)
        }
    };
    let mut argv = Vec::new();
    let mut i = 1;
    loop {
        let a = arg(i);
        argv.push(a);
        i += 1;
        if a.is_null() {
            break;
        }
    }
    // SAFETY: forwarded to the wrappers, argv NULL-terminated.
    unsafe {
        match kind {
            EXECL => crate::process::execv(arg(0), argv.as_ptr()),
            EXECLP => crate::process::execvp(arg(0), argv.as_ptr()),
            _ => crate::process::execve(arg(0), argv.as_ptr(), arg(i).cast()),
        }
    }
}

/// The naked entry of an execl-style function: saves the register arguments, passes them and
/// the caller's stack arguments to `exec_list` with `kind`, returns what it returns.
#[cfg(target_arch = "x86_64")]
macro_rules! exec_list_entry {
    ($name:ident, $kind:expr) => {
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, arg: *const c_char) -> c_int {
            core::arch::naked_asm!(
                "push rbp",
                "mov rbp, rsp",
                "sub rsp, 48",
                "mov [rsp], rdi",
                "mov [rsp + 8], rsi",
                "mov [rsp + 16], rdx",
                "mov [rsp + 24], rcx",
                "mov [rsp + 32], r8",
                "mov [rsp + 40], r9",
                "mov rdi, rsp",
                "lea rsi, [rbp + 16]",
                "mov edx, {kind}",
                "call {list}",
                "leave",
                "ret",
                kind = const $kind,
                list = sym exec_list,
            )
        }
    };
}

#[cfg(target_arch = "x86_64")]
exec_list_entry!(execl, EXECL);
#[cfg(target_arch = "x86_64")]
exec_list_entry!(execlp, EXECLP);
#[cfg(target_arch = "x86_64")]
exec_list_entry!(execle, EXECLE);
