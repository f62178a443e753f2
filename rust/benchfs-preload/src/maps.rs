//! What the kernel must do itself with a BenchFS file (map it, execute it) is handed to the
//! kernel through a mount of BenchFS at the prefix, when one serves it (`benchfs start
//! --mount` exports its mount point, the prefix's default). Before a hand-over the kernel
//! must find what this process wrote: the size is published (writes here are answered before
//! they return, so their bytes are at the servers) and the client's read-ahead for the file
//! is dropped, so that it cannot serve bytes the kernel's side changes afterwards.
//!
//! Without such a mount, a mapping that only reads, or whose changes stay private, is served
//! from private memory holding the file's bytes; a shared writable mapping and exec fail
//! with one line naming the missing mount.

use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::atomic::{AtomicBool, Ordering};

use libc::{off64_t, size_t};

use crate::fds::{self, OpenFile};
use crate::files::with_file;
use crate::names::{self, Target};
use crate::{prefix, real, say};

/// `f_type` of a FUSE file system (the kernel's FUSE_SUPER_MAGIC).
const FUSE_MAGIC: i64 = 0x6573_5546;

/// Whether a FUSE file system is mounted at the prefix (looked up until one is found).
pub fn mount_at_prefix() -> bool {
    static FOUND: AtomicBool = AtomicBool::new(false);
    if FOUND.load(Ordering::Relaxed) {
        return true;
    }
    let Some(p) = prefix() else { return false };
    let Ok(path) = CString::new(p.as_str()) else {
        return false;
    };
    // SAFETY: all-zero is a valid statfs64; the kernel's own statfs, not the library's.
    let mut st: libc::statfs64 = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a writable statfs64.
    let found = unsafe { real::statfs64(path.as_ptr(), &mut st) } == 0 && st.f_type as i64 == FUSE_MAGIC;
    if found {
        FOUND.store(true, Ordering::Relaxed);
    }
    found
}

/// The path of BenchFS's `path` through the mount at the prefix.
pub fn mounted_path(path: &str) -> Result<CString, c_int> {
    let p = prefix().ok_or(libc::ENODEV)?;
    CString::new(p.outside(path)).map_err(|_| libc::EINVAL)
}

/// Makes what this process wrote to `f` visible to the kernel's side, and drops what the
/// client read ahead of it.
pub fn hand_over(f: &OpenFile) -> Result<(), c_int> {
    f.publish()?;
    if f.opened().is_some() {
        with_file(f, "mmap", |c, h| {
            c.forget_cached(h);
            Ok(())
        })?;
    }
    Ok(())
}

/// Makes the kernel fetch the attributes of the mounted file `fd` or `path` refers to now
/// (`AT_STATX_FORCE_SYNC`: a FUSE getattr whatever it cached). The mount's kernel may hold a
/// size this process's writes since outgrew (or a truncate undercut): a mapping of the file
/// faults with SIGBUS past the size the kernel knows (git's pack-objects mapping the index
/// that `git add` had just rewritten). A name the library renamed or removed meanwhile gets
/// ESTALE from the mount, and the kernel looks it up again.
fn refresh_kernel_attrs(dirfd: c_int, path: &CString) -> Result<(), c_int> {
    // SAFETY: all-zero is a valid statx buffer.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let flags = libc::AT_STATX_FORCE_SYNC | if path.is_empty() { libc::AT_EMPTY_PATH } else { 0 };
    // SAFETY: the kernel's own statx (not the library's), a NUL-terminated path and a
    // writable buffer.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_statx,
            dirfd,
            path.as_ptr(),
            flags,
            libc::STATX_SIZE | libc::STATX_MTIME,
            &mut stx as *mut libc::statx,
        )
    };
    if rc < 0 {
        return Err(errno());
    }
    Ok(())
}

/// `mmap` of our descriptor `fd`.
pub unsafe fn map(
    f: &OpenFile,
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    off: off64_t,
) -> Result<*mut c_void, c_int> {
    if f.is_dir() {
        return Err(libc::ENODEV);
    }
    // The sharing type: MAP_SHARED_VALIDATE is MAP_SHARED | MAP_PRIVATE.
    let kind = flags & libc::MAP_TYPE;
    let shared = kind == libc::MAP_SHARED || kind == libc::MAP_SHARED_VALIDATE;
    let writes_back = shared && prot & libc::PROT_WRITE != 0;
    // What the kernel asks of the descriptor: readable, and writable for a shared writable
    // mapping.
    if !f.readable() || (writes_back && !f.writable()) {
        return Err(libc::EACCES);
    }
    if mount_at_prefix() {
        hand_over(f)?;
        let path = mounted_path(&f.path)?;
        let access = if writes_back { libc::O_RDWR } else { libc::O_RDONLY };
        // SAFETY: a NUL-terminated path; the descriptor is closed once mapped (the mapping
        // keeps the file).
        unsafe {
            let mfd = real::openat(libc::AT_FDCWD, path.as_ptr(), access | libc::O_CLOEXEC, 0);
            if mfd < 0 {
                return Err(errno());
            }
            if let Err(e) = refresh_kernel_attrs(mfd, &CString::default()) {
                real::close(mfd);
                return Err(e);
            }
            let mapped = real::mmap64(addr, len, prot, flags, mfd, off);
            let e = errno();
            real::close(mfd);
            return if mapped == libc::MAP_FAILED {
                Err(e)
            } else {
                Ok(mapped)
            };
        }
    }
    if writes_back {
        say(&format!(
            "mmap of {}: a shared writable mapping of a BenchFS file needs BenchFS mounted at the \
             prefix {} (benchfs start --mount), and none is",
            f.path,
            prefix().map_or("", |p| p.as_str())
        ));
        return Err(libc::ENODEV);
    }
    if off < 0 || len == 0 {
        return Err(libc::EINVAL);
    }
    // Private memory holding the file's bytes from `off` (zeros past its end), then the
    // protection asked for.
    let private = (flags & !libc::MAP_TYPE) | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    // SAFETY: an anonymous mapping where the caller asked (MAP_FIXED kept as asked).
    let mem = unsafe { real::mmap64(addr, len, libc::PROT_READ | libc::PROT_WRITE, private, -1, 0) };
    if mem == libc::MAP_FAILED {
        return Err(errno());
    }
    // SAFETY: `len` writable bytes just mapped.
    let buf = unsafe { std::slice::from_raw_parts_mut(mem.cast::<u8>(), len) };
    let filled = fill(f, buf, off as u64).and_then(|()| {
        // SAFETY: our mapping, its length.
        if unsafe { libc::mprotect(mem, len, prot) } == 0 {
            Ok(())
        } else {
            Err(errno())
        }
    });
    if let Err(e) = filled {
        // SAFETY: our mapping, its length.
        unsafe { libc::munmap(mem, len) };
        return Err(e);
    }
    Ok(mem)
}

/// Reads the file into `buf` from `off` until `buf` is full or the file ends.
fn fill(f: &OpenFile, buf: &mut [u8], off: u64) -> Result<(), c_int> {
    let mut done = 0;
    while done < buf.len() {
        let n = with_file(f, "mmap", |c, h| c.read(h, off + done as u64, &mut buf[done..]))?;
        if n == 0 {
            break;
        }
        done += n;
    }
    Ok(())
}

fn errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// The path to give the kernel to execute `path` (resolved as the library resolves it): None
/// to give it unchanged. A BenchFS program runs through the mount at the prefix, its absolute
/// path there (the kernel's working directory is not BenchFS's), after the hand-over of what
/// this process has open of it; without that mount the exec fails with one line.
pub unsafe fn exec_path(path: *const c_char) -> Result<Option<CString>, c_int> {
    // SAFETY: forwarded contract.
    match unsafe { names::resolve(libc::AT_FDCWD, path) } {
        Ok(Target::Ours(p)) => {
            if !mount_at_prefix() {
                let prefix = prefix().map_or("", |p| p.as_str());
                say(&format!(
                    "cannot execute {}: programs stored in BenchFS run through BenchFS mounted at \
                     the prefix {prefix} (benchfs start --mount), and none is",
                    mounted_path(&p).map_or(p.clone(), |c| c.to_string_lossy().into_owned())
                ));
                return Err(libc::EACCES);
            }
            for (_, f) in fds::all() {
                if f.path == p {
                    hand_over(&f)?;
                }
            }
            let mounted = mounted_path(&p)?;
            refresh_kernel_attrs(libc::AT_FDCWD, &mounted)?;
            Ok(Some(mounted))
        }
        Ok(Target::LocalAt(abs)) => Ok(Some(abs)),
        Ok(Target::Local) | Err(_) => Ok(None),
    }
}
