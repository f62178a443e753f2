//! Advisory locks on BenchFS files, across the job (docs/namespace.md, "Locks"): fcntl's
//! process-owned record locks (`F_SETLK`, `F_SETLKW`, `F_GETLK`), OFD locks (`F_OFD_*`),
//! `flock` and `lockf`, with Linux's owners and release rules:
//! - a process's record locks are its own (a forked child holds none of its parent's), and
//!   closing any of its descriptors of a file releases its locks on that file;
//! - OFD and flock locks belong to the open file description, and go with its last close.
//!
//! glibc's `lockf` calls fcntl internally, past this library: it is defined here.

use std::collections::HashSet;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use benchfs_core::protocol::lock::{new_owner, LockClass, LockCmd, LockRequest, LockType};
use libc::off64_t;

use crate::fds::{self, OpenFile};
use crate::files::with_file;
use crate::{entry, real, set_errno};

/// This process's record-lock owner, drawn for each process (the pid it was drawn in beside
/// it, so a forked child draws its own).
static PROCESS_OWNER: Mutex<(u32, u64)> = Mutex::new((0, 0));

/// Files (by id) this process took record locks on: closing a descriptor of one releases them.
static RECORD_LOCKED: Mutex<Option<HashSet<u128>>> = Mutex::new(None);

/// Whether any record lock was taken: closes of other files take no lock when none was.
static ANY_RECORD: AtomicU64 = AtomicU64::new(0);

fn process_owner() -> u64 {
    let pid = std::process::id();
    let mut o = PROCESS_OWNER.lock().unwrap_or_else(PoisonError::into_inner);
    if o.0 != pid {
        *o = (pid, new_owner());
        // A forked child holds none of its parent's record locks.
        *RECORD_LOCKED.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
    o.1
}

/// The byte range [start, end) of a `struct flock` at the description's position and size.
fn range(f: &OpenFile, whence: c_int, start: off64_t, len: off64_t) -> Result<(u64, u64), c_int> {
    let base = match whence {
        libc::SEEK_SET => 0,
        libc::SEEK_CUR => f.position.get() as i128,
        libc::SEEK_END => with_file(f, "lock", |_, h| Ok(h.size()))? as i128,
        _ => return Err(libc::EINVAL),
    };
    let from = base + i128::from(start);
    let (s, e) = match len {
        0 => (from, i128::from(u64::MAX)),
        l if l > 0 => (from, from + i128::from(l)),
        l => (from + i128::from(l), from),
    };
    if s < 0 {
        return Err(libc::EINVAL);
    }
    Ok((s as u64, e.min(i128::from(u64::MAX)) as u64))
}

/// Runs `req` on `f`'s file: `Ok(None)` done, `Ok(Some(lock))` a conflicting lock.
fn request(f: &OpenFile, req: LockRequest) -> Result<Option<LockRequest>, c_int> {
    with_file(f, "lock", move |c, h| c.lock(h, &req))
}

fn file_id(f: &OpenFile) -> Result<u128, c_int> {
    with_file(f, "lock", |_, h| Ok(h.attr.id.0))
}

/// fcntl's lock commands on our descriptor `f`.
pub unsafe fn fcntl(f: &OpenFile, cmd: c_int, arg: *mut c_void) -> c_int {
    entry(-1, || {
        if f.is_dir() {
            return Err(libc::EBADF);
        }
        // SAFETY: a struct flock by fcntl's contract (flock64 on 64-bit Linux is the same).
        let fl = unsafe { arg.cast::<libc::flock64>().as_mut() }.ok_or(libc::EFAULT)?;
        let ofd = matches!(cmd, libc::F_OFD_GETLK | libc::F_OFD_SETLK | libc::F_OFD_SETLKW);
        if ofd && fl.l_pid != 0 {
            return Err(libc::EINVAL);
        }
        let kind = match c_int::from(fl.l_type) {
            libc::F_RDLCK => LockType::Read,
            libc::F_WRLCK => LockType::Write,
            libc::F_UNLCK => LockType::Unlock,
            _ => return Err(libc::EINVAL),
        };
        let (start, end) = range(f, c_int::from(fl.l_whence), fl.l_start, fl.l_len)?;
        if start == end {
            return Ok(0); // an empty range backwards from 0: nothing to lock
        }
        let owner = if ofd { f.lock_owner } else { process_owner() };
        let test = matches!(cmd, libc::F_GETLK | libc::F_OFD_GETLK);
        if test && kind == LockType::Unlock {
            return Err(libc::EINVAL);
        }
        if !test && ((kind == LockType::Read && !f.readable()) || (kind == LockType::Write && !f.writable()))
        {
            return Err(libc::EBADF);
        }
        let req = LockRequest {
            owner,
            start,
            end,
            pid: if ofd { 0 } else { std::process::id() },
            class: LockClass::Fcntl,
            kind,
            cmd: match cmd {
                libc::F_GETLK | libc::F_OFD_GETLK => LockCmd::Get,
                libc::F_SETLKW | libc::F_OFD_SETLKW => LockCmd::SetWait,
                _ => LockCmd::Set,
            },
        };
        if kind != LockType::Unlock && !test {
            if ofd {
                f.locked.store(true, Ordering::Relaxed);
            } else {
                let id = file_id(f)?;
                RECORD_LOCKED
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get_or_insert_with(HashSet::new)
                    .insert(id);
                ANY_RECORD.store(1, Ordering::Relaxed);
            }
        }
        match request(f, req)? {
            None if test => {
                fl.l_type = libc::F_UNLCK as i16;
                Ok(0)
            }
            None => Ok(0),
            Some(held) if test => {
                fl.l_type = if held.kind == LockType::Write {
                    libc::F_WRLCK
                } else {
                    libc::F_RDLCK
                } as i16;
                fl.l_whence = libc::SEEK_SET as i16;
                fl.l_start = held.start as off64_t;
                fl.l_len = if held.end == u64::MAX {
                    0
                } else {
                    (held.end - held.start) as off64_t
                };
                fl.l_pid = if held.pid == 0 { -1 } else { held.pid as i32 };
                Ok(0)
            }
            Some(_) => Err(libc::EAGAIN),
        }
    })
}

/// Releases this process's record locks on `f`'s file, if it took any (a descriptor of it
/// is being closed).
pub fn on_close(f: &OpenFile) {
    if ANY_RECORD.load(Ordering::Relaxed) == 0 || f.is_dir() || f.opened().is_none() {
        return;
    }
    let Ok(id) = file_id(f) else { return };
    let held = RECORD_LOCKED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_mut()
        .is_some_and(|s| s.remove(&id));
    if held {
        let _ = request(f, LockRequest::release(process_owner(), LockClass::Fcntl));
    }
}

/// Releases the description's OFD and flock locks (its last descriptor is being closed).
pub fn on_last_close(f: &OpenFile) {
    if f.locked.swap(false, Ordering::Relaxed) {
        let _ = request(f, LockRequest::release(f.lock_owner, LockClass::Fcntl));
        let _ = request(f, LockRequest::release(f.lock_owner, LockClass::Flock));
    }
}

#[no_mangle]
pub unsafe extern "C" fn flock(fd: c_int, op: c_int) -> c_int {
    let Some(f) = fds::lookup(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::flock(fd, op) };
    };
    entry(-1, || {
        if f.is_dir() {
            return Err(libc::EWOULDBLOCK); // BenchFS keeps no locks on directories
        }
        let kind = match op & !libc::LOCK_NB {
            libc::LOCK_SH => LockType::Read,
            libc::LOCK_EX => LockType::Write,
            libc::LOCK_UN => LockType::Unlock,
            _ => return Err(libc::EINVAL),
        };
        if kind != LockType::Unlock {
            f.locked.store(true, Ordering::Relaxed);
        }
        let req = LockRequest {
            owner: f.lock_owner,
            start: 0,
            end: u64::MAX,
            pid: 0,
            class: LockClass::Flock,
            kind,
            cmd: if op & libc::LOCK_NB != 0 || kind == LockType::Unlock {
                LockCmd::Set
            } else {
                LockCmd::SetWait
            },
        };
        match request(&f, req)? {
            None => Ok(0),
            Some(_) => Err(libc::EWOULDBLOCK),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn lockf64(fd: c_int, cmd: c_int, len: off64_t) -> c_int {
    let Some(f) = fds::lookup(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::lockf64(fd, cmd, len) };
    };
    // lockf is record locks from the current position (glibc's definition).
    let (l_type, fcntl_cmd) = match cmd {
        libc::F_LOCK => (libc::F_WRLCK, libc::F_SETLKW),
        libc::F_TLOCK => (libc::F_WRLCK, libc::F_SETLK),
        libc::F_ULOCK => (libc::F_UNLCK, libc::F_SETLK),
        libc::F_TEST => (libc::F_WRLCK, libc::F_GETLK),
        _ => {
            set_errno(libc::EINVAL);
            return -1;
        }
    };
    // SAFETY: all-zero is a valid flock64.
    let mut fl: libc::flock64 = unsafe { std::mem::zeroed() };
    fl.l_type = l_type as i16;
    fl.l_whence = libc::SEEK_CUR as i16;
    fl.l_len = len;
    // SAFETY: our flock64, alive for the call.
    let r = unsafe { fcntl(&f, fcntl_cmd, (&mut fl as *mut libc::flock64).cast()) };
    if r == 0
        && cmd == libc::F_TEST
        && c_int::from(fl.l_type) != libc::F_UNLCK
        && fl.l_pid != std::process::id() as i32
    {
        set_errno(libc::EACCES);
        return -1;
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn lockf(fd: c_int, cmd: c_int, len: off64_t) -> c_int {
    // SAFETY: forwarded (the same on 64-bit Linux).
    unsafe { lockf64(fd, cmd, len) }
}
