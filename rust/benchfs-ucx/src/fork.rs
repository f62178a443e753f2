//! UCX in the child of a `fork`.
//!
//! UCX runs the events of every context in a process (connections being accepted, idle
//! transports woken) on one thread, described by a static of libucs
//! (`ucs_async_thread_global_context`: the thread, how many registrations use it, a mutex).
//! `fork` copies that static but not the thread: the child believes the thread runs, adds its
//! new workers' descriptors to the parent's epoll set (the descriptor is inherited), the
//! parent's thread receives their events, and the child's connections never progress (a
//! BenchFS client in a forked shell waited for the servers' answer to its hello, 24 of 30
//! times). UCX exports no way to reset it, so the child puts it back to its value at load,
//! found through libucs's symbol table, and renews UCX's table of event handlers (whose lock
//! another thread of the parent may have held) with the exported `ucs_async_global_cleanup`
//! and `ucs_async_global_init`. The parent's own workers are left alone: the child never uses
//! them.
//!
//! Layouts mirrored from UCX v1.22.0 (commit 8a6b06fb880accbb933a79cda893883872c68d9d),
//! src/ucs/async/thread.c and src/ucs/async/async.c; a symbol whose size differs is not
//! touched. Without the symbols (a stripped libucs), a forked child cannot use UCX and
//! [`check_usable`] says so instead of letting the child wait.

use std::ffi::{c_uint, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Once, OnceLock};

use object::{Object, ObjectSymbol};

use crate::UcxError;
use benchfs_ucx_sys as sys;

extern "C" {
    // Exported by libucs (src/ucs/async/async.c): the handler table and its lock, and each
    // async mode's global state (the thread mode's is only the static reset here).
    fn ucs_async_global_init();
    fn ucs_async_global_cleanup();
}

/// `ucs_async_thread_global_context_t` (thread.c).
#[repr(C)]
struct ThreadGlobal {
    thread: *mut c_void,
    use_count: c_uint,
    lock: libc::pthread_mutex_t,
}

/// `ucs_async_global_context_t` (async.c): a khash table, its lock, the next handler id.
#[repr(C)]
struct AsyncGlobal {
    handlers_counts: [u32; 4],
    handlers_arrays: [*mut c_void; 3],
    handlers_lock: libc::pthread_rwlock_t,
    handler_id: u32,
}

struct Statics {
    thread: *mut ThreadGlobal,
    handlers: *mut AsyncGlobal,
}

// SAFETY: addresses inside libucs's data, valid for the life of the process.
unsafe impl Send for Statics {}
unsafe impl Sync for Statics {}

static STATICS: OnceLock<Option<Statics>> = OnceLock::new();
/// Set in a child whose parent had made workers when the statics could not be reset.
static UNUSABLE: AtomicBool = AtomicBool::new(false);
/// Whether this process made a worker (the parent side of a fork that matters).
static MADE_WORKER: AtomicBool = AtomicBool::new(false);
/// Forks between the process that first watched and this one (see [`fork_generation`]).
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Registers the fork handlers (once per process). Called before each worker is made, and by
/// anything else that must know it was made before a fork. libucs's statics are looked up at
/// the first fork (reading its symbol table takes milliseconds, which a program that never
/// forks should not pay at start).
pub fn watch_forks() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: handlers with the C signatures, registered once.
        unsafe { libc::pthread_atfork(Some(before), Some(in_parent), Some(in_child)) };
    });
}

/// How many forks separate this process from the one that first called [`watch_forks`]:
/// what was made at another generation (a worker, a client, an io_uring ring) belongs to an
/// ancestor, whose sockets, rings and shared memory this process must neither use nor tear
/// down.
pub fn fork_generation() -> u64 {
    GENERATION.load(Ordering::Relaxed)
}

pub(crate) fn made_worker() {
    watch_forks();
    MADE_WORKER.store(true, Ordering::Relaxed);
}

/// An error for a forked child that cannot use UCX (see the module's text), else Ok.
pub(crate) fn check_usable() -> Result<(), UcxError> {
    if UNUSABLE.load(Ordering::Relaxed) {
        return Err(UcxError {
            op: "init",
            status: sys::UCS_ERR_UNSUPPORTED,
            message: "this process is a fork of one that used UCX, and UCX's event thread \
                      cannot be reset here (libucs has no symbol table): run a new program \
                      (exec) instead"
                .into(),
        });
    }
    Ok(())
}

/// libucs's statics, or None when its symbol table lacks them or their sizes differ.
fn locate() -> Option<Statics> {
    // SAFETY: Dl_info is plain data; all zeroes is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr reads the loader's tables for an address inside a loaded library.
    let found = unsafe { libc::dladdr(ucs_async_global_init as *const c_void, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr gave a NUL-terminated path that lives as long as the library.
    let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_str().ok()?;
    let bytes = std::fs::read(path).ok()?;
    let file = object::File::parse(&*bytes).ok()?;
    let base = info.dli_fbase as usize;
    let find = |name: &str, size: usize| {
        file.symbols()
            .find(|s| s.name() == Ok(name))
            .filter(|s| s.size() as usize == size)
            .map(|s| base + s.address() as usize)
    };
    Some(Statics {
        thread: find(
            "ucs_async_thread_global_context",
            std::mem::size_of::<ThreadGlobal>(),
        )? as *mut ThreadGlobal,
        handlers: find("ucs_async_global_context", std::mem::size_of::<AsyncGlobal>())? as *mut AsyncGlobal,
    })
}

/// Before the fork (in the parent, still free to read files and allocate): finds the statics
/// if not yet, then holds the handler table so nobody changes it while the address space is
/// copied.
extern "C" fn before() {
    if let Some(s) = STATICS.get_or_init(locate) {
        // SAFETY: UCX's initialised rwlock; released in both processes right after.
        unsafe { libc::pthread_rwlock_wrlock(&mut (*s.handlers).handlers_lock) };
    }
}

extern "C" fn in_parent() {
    if let Some(Some(s)) = STATICS.get() {
        // SAFETY: taken in `before` by this thread.
        unsafe { libc::pthread_rwlock_unlock(&mut (*s.handlers).handlers_lock) };
    }
}

extern "C" fn in_child() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
    match STATICS.get() {
        Some(Some(s)) => {
            // SAFETY: the child has one thread; the thread context goes back to its initial
            // value (thread.c's initialiser), then UCX renews its handler table and lock (the
            // lock, held since `before`, is destroyed and made anew).
            unsafe {
                s.thread.write(ThreadGlobal {
                    thread: std::ptr::null_mut(),
                    use_count: 0,
                    lock: libc::PTHREAD_MUTEX_INITIALIZER,
                });
                ucs_async_global_cleanup();
                ucs_async_global_init();
            }
        }
        _ => {
            if MADE_WORKER.load(Ordering::Relaxed) {
                UNUSABLE.store(true, Ordering::Relaxed);
            }
        }
    }
}
