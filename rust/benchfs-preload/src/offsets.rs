//! File offsets that processes share. After `fork`, or across `execve` for a descriptor
//! without close-on-exec, two processes hold one open file description and the kernel would
//! give them one offset: `{ cat a; cat b; } > f` appends b after a because the second `cat`
//! starts where the first stopped. So every offset lives in a slot of a shared memory region
//! (a memfd, mapped shared: a forked child shares it by inheritance, a new program maps it
//! again from the descriptor number it is told in its environment).
//!
//! Slots are never reused: a region takes new slots until it is full or a fork seals it
//! (after a fork parent and child would otherwise both hand out the same next slot); each
//! process then starts a new region, and a region goes (unmapped, its descriptor closed) when
//! the last of this process's files using it is closed.

use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::real;

/// Slots per region: one page of 8-byte offsets.
const SLOTS: usize = 512;
const BYTES: usize = SLOTS * 8;

/// One shared region: its memfd, its mapping, and the next slot to hand out.
pub struct Region {
    /// The memfd, while it is still ours (the program may close any descriptor), with the
    /// inode that identifies it.
    fd: c_int,
    ino: u64,
    base: *mut AtomicU64,
    next: AtomicUsize,
}

// SAFETY: the mapping is shared memory accessed only through atomics; the pointer is valid
// until the region is dropped, which happens once no position uses it.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

fn ino_of_fd(fd: c_int) -> Option<u64> {
    // SAFETY: all-zero is a valid stat64; fstat writes it.
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out pointer.
    (unsafe { real::fstat64(fd, &mut st) } == 0).then_some(st.st_ino)
}

impl Region {
    fn create() -> Result<Region, c_int> {
        // SAFETY: a valid name; the flags ask for close-on-exec.
        let made = unsafe { libc::memfd_create(c"benchfs-offsets".as_ptr(), libc::MFD_CLOEXEC) };
        if made < 0 {
            return Err(last_errno());
        }
        // Out of the way of numbers programs pick themselves (a shell's `exec 3>file`).
        // SAFETY: our own descriptor, moved up.
        let fd = unsafe {
            real::fcntl(
                made,
                libc::F_DUPFD_CLOEXEC,
                crate::fd_floor() as usize as *mut libc::c_void,
            )
        };
        // SAFETY: as above.
        unsafe { real::close(made) };
        if fd < 0 {
            return Err(last_errno());
        }
        // SAFETY: our own new descriptor.
        if unsafe { real::ftruncate64(fd, BYTES as i64) } != 0 {
            let e = last_errno();
            // SAFETY: as above.
            unsafe { real::close(fd) };
            return Err(e);
        }
        // SAFETY: as above.
        unsafe { Region::map(fd, 0) }
    }

    /// Maps the region at `fd` (created here or inherited), handing out slots from `next`.
    unsafe fn map(fd: c_int, next: usize) -> Result<Region, c_int> {
        let ino = ino_of_fd(fd).ok_or_else(last_errno)?;
        // SAFETY: a shared mapping of the memfd's first page.
        let base = unsafe {
            real::mmap64(
                std::ptr::null_mut(),
                BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            let e = last_errno();
            return Err(e);
        }
        Ok(Region {
            fd,
            ino,
            base: base.cast(),
            next: AtomicUsize::new(next),
        })
    }

    /// The memfd, if the program has not closed it (or reused its number).
    pub fn fd(&self) -> Option<c_int> {
        (ino_of_fd(self.fd) == Some(self.ino)).then_some(self.fd)
    }

    fn slot(&self, index: usize) -> &AtomicU64 {
        debug_assert!(index < SLOTS);
        // SAFETY: in bounds of the mapping, which lives as long as `self`.
        unsafe { &*self.base.add(index) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: our mapping; nothing refers to it any more.
        unsafe { libc::munmap(self.base.cast(), BYTES) };
        if let Some(fd) = self.fd() {
            // SAFETY: the memfd is still ours.
            unsafe { real::close(fd) };
        }
    }
}

fn last_errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Where this process takes new slots (None: a new region at the next open).
static CURRENT: Mutex<Option<Arc<Region>>> = Mutex::new(None);

fn current() -> MutexGuard<'static, Option<Arc<Region>>> {
    CURRENT.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Before a fork: no process takes slots from the regions that exist now.
pub fn seal() {
    *current() = None;
}

/// The offset of one open file description, shared with the processes that share the
/// description; threads of one process take turns through `lock`.
pub struct Position {
    lock: Mutex<()>,
    region: Arc<Region>,
    index: usize,
}

/// A position held for a call: read at the start, written back when dropped.
pub struct Held<'a> {
    _turn: MutexGuard<'a, ()>,
    slot: &'a AtomicU64,
    value: u64,
}

impl std::ops::Deref for Held<'_> {
    type Target = u64;
    fn deref(&self) -> &u64 {
        &self.value
    }
}

impl std::ops::DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut u64 {
        &mut self.value
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.slot.store(self.value, Ordering::Release);
    }
}

impl Position {
    /// A new offset, `at`, in this process's current region.
    pub fn new(at: u64) -> Result<Position, c_int> {
        let mut cur = current();
        let region = match cur.as_ref() {
            Some(r) if r.next.load(Ordering::Relaxed) < SLOTS => r.clone(),
            _ => {
                let r = Arc::new(Region::create()?);
                *cur = Some(r.clone());
                r
            }
        };
        let index = region.next.fetch_add(1, Ordering::Relaxed);
        region.slot(index).store(at, Ordering::Release);
        Ok(Position {
            lock: Mutex::new(()),
            region,
            index,
        })
    }

    /// The position at slot `index` of an inherited region.
    pub fn inherited(region: Arc<Region>, index: usize) -> Option<Position> {
        (index < SLOTS).then(|| Position {
            lock: Mutex::new(()),
            region,
            index,
        })
    }

    pub fn hold(&self) -> Held<'_> {
        let turn = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = self.region.slot(self.index);
        Held {
            _turn: turn,
            slot,
            value: slot.load(Ordering::Acquire),
        }
    }

    pub fn get(&self) -> u64 {
        self.region.slot(self.index).load(Ordering::Acquire)
    }

    /// (the region's memfd if still ours, the slot): what a new program needs to share it.
    pub fn share(&self) -> (Option<c_int>, usize) {
        (self.region.fd(), self.index)
    }
}

/// Maps an inherited region (sealed: this process takes no slots from it).
pub fn inherited_region(fd: c_int) -> Result<Arc<Region>, c_int> {
    // SAFETY: `fd` was checked by the caller to be a descriptor it was told about.
    unsafe { Region::map(fd, SLOTS) }.map(Arc::new)
}
