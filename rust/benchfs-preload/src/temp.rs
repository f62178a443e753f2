//! Unique temporary names: the mkstemp and mkdtemp families. glibc makes the file or
//! directory with its own internal open and mkdir, past this library, so for a template
//! under the prefix the names are made here, with the library's open (O_CREAT | O_EXCL) and
//! mkdir, as glibc does: the template's six X's replaced until a name is free.

use std::cell::Cell;
use std::ffi::{c_char, c_int, CStr};

use crate::names::{self, Target};
use crate::{files, real, set_errno};

/// Names tried before giving up with EEXIST (glibc tries many more; a prefix full enough to
/// exhaust these has other problems).
const ATTEMPTS: u32 = 1000;
const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

thread_local! {
    static STATE: Cell<u64> = const { Cell::new(0) };
}

/// The next pseudo-random value of this thread (xorshift, seeded from the clock, the
/// thread and the process).
fn next_random() -> u64 {
    STATE.with(|s| {
        let mut x = s.get();
        if x == 0 {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            x = now ^ (u64::from(std::process::id()) << 32) ^ (s as *const Cell<u64> as u64) | 1;
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        x
    })
}

/// The six X's before the last `suffix` bytes of `template`, or EINVAL.
unsafe fn x_run<'a>(template: *mut c_char, suffix: c_int) -> Result<&'a mut [u8], c_int> {
    if template.is_null() || suffix < 0 {
        return Err(libc::EINVAL);
    }
    // SAFETY: a NUL-terminated, writable template by the caller's contract.
    let len = unsafe { CStr::from_ptr(template) }.to_bytes().len();
    let suffix = suffix as usize;
    if len < 6 + suffix {
        return Err(libc::EINVAL);
    }
    // SAFETY: within the template's bytes.
    let run = unsafe { std::slice::from_raw_parts_mut(template.cast::<u8>().add(len - 6 - suffix), 6) };
    if run != b"XXXXXX" {
        return Err(libc::EINVAL);
    }
    Ok(run)
}

fn is_ours(template: *const c_char) -> bool {
    // SAFETY: the caller's NUL-terminated template.
    matches!(
        unsafe { names::resolve(libc::AT_FDCWD, template) },
        Ok(Target::Ours(_))
    )
}

/// Tries `make` on names from `template` until one is made (>= 0) or fails otherwise.
unsafe fn make_unique(template: *mut c_char, suffix: c_int, make: impl Fn() -> c_int) -> c_int {
    // SAFETY: forwarded contract.
    let run = match unsafe { x_run(template, suffix) } {
        Ok(run) => run,
        Err(e) => {
            set_errno(e);
            return -1;
        }
    };
    for _ in 0..ATTEMPTS {
        let mut v = next_random();
        for b in run.iter_mut() {
            *b = LETTERS[(v % LETTERS.len() as u64) as usize];
            v /= LETTERS.len() as u64;
        }
        let made = make();
        if made >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
            return made;
        }
    }
    set_errno(libc::EEXIST);
    -1
}

unsafe fn mkostemps_ours(template: *mut c_char, suffix: c_int, flags: c_int) -> c_int {
    let flags = (flags & !libc::O_ACCMODE) | libc::O_RDWR | libc::O_CREAT | libc::O_EXCL;
    // SAFETY: forwarded contract; the template holds the name tried.
    unsafe {
        make_unique(template, suffix, || {
            files::benchfs_preload_openat(libc::AT_FDCWD, template, flags, 0o600)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn mkostemps64(template: *mut c_char, suffix: c_int, flags: c_int) -> c_int {
    if !is_ours(template) {
        // SAFETY: forwarded.
        return unsafe { real::mkostemps64(template, suffix, flags) };
    }
    // SAFETY: forwarded contract.
    unsafe { mkostemps_ours(template, suffix, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn mkostemps(template: *mut c_char, suffix: c_int, flags: c_int) -> c_int {
    // SAFETY: forwarded (the 64 forms are the same on 64-bit Linux).
    unsafe { mkostemps64(template, suffix, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn mkstemps64(template: *mut c_char, suffix: c_int) -> c_int {
    // SAFETY: forwarded.
    unsafe { mkostemps64(template, suffix, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn mkstemps(template: *mut c_char, suffix: c_int) -> c_int {
    // SAFETY: forwarded.
    unsafe { mkostemps64(template, suffix, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn mkostemp64(template: *mut c_char, flags: c_int) -> c_int {
    // SAFETY: forwarded.
    unsafe { mkostemps64(template, 0, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn mkostemp(template: *mut c_char, flags: c_int) -> c_int {
    // SAFETY: forwarded.
    unsafe { mkostemps64(template, 0, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn mkstemp64(template: *mut c_char) -> c_int {
    // SAFETY: forwarded.
    unsafe { mkostemps64(template, 0, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn mkstemp(template: *mut c_char) -> c_int {
    // SAFETY: forwarded.
    unsafe { mkostemps64(template, 0, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn mkdtemp(template: *mut c_char) -> *mut c_char {
    if !is_ours(template) {
        // SAFETY: forwarded.
        return unsafe { real::mkdtemp(template) };
    }
    // SAFETY: forwarded contract; the template holds the name tried.
    let made = unsafe { make_unique(template, 0, || names::mkdirat(libc::AT_FDCWD, template, 0o700)) };
    if made < 0 {
        std::ptr::null_mut()
    } else {
        template
    }
}
