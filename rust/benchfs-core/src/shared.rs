//! Using a client from more than one thread: the one place that argues why a [`Client`] and a
//! [`FileHandle`] may move between threads; [`SharedClient`]/[`SharedFile`], which threads
//! take turns on; and [`ClientPool`], whose clients threads lease. The Python module, the C
//! library and the interposition library build on these; a face keeps no `unsafe impl Send`
//! of its own.

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use crate::client::{Client, FileHandle};
use crate::config::Config;
use crate::error::{Error, Result};

/// A [`Client`] that may move to another thread. Sound because (1) the `Rc`s inside it (its
/// reply state, shared with the UCX reply handler) never leave it: no clone is handed out, so
/// moving the client moves every owner of those counts together; (2) whoever holds it uses it
/// from one thread at a time (a mutex or a pool's lease orders one thread's last use before
/// the next thread's first), so its `Cell`s and `RefCell`s are never touched by two threads at
/// once; (3) its UCX worker runs in serialized mode (any thread, one at a time) and its
/// io_uring ring and event loop keep no thread-local state.
pub struct SendClient(Box<Client>);

// SAFETY: see the type's documentation.
unsafe impl Send for SendClient {}

impl SendClient {
    /// Boxed: a pool moves its clients in and out of its idle list at every lease, and a
    /// `Client` is large (a memcpy of it was 4% of a 4 KiB read's time through the preload).
    pub fn new(client: Client) -> SendClient {
        SendClient(Box::new(client))
    }

    pub fn client(&self) -> &Client {
        &self.0
    }
}

/// A [`FileHandle`] that may move to another thread: its cells are used only together with
/// its client, under the same discipline as [`SendClient`].
pub struct SendHandle(FileHandle);

// SAFETY: as for SendClient.
unsafe impl Send for SendHandle {}

impl SendHandle {
    pub fn new(handle: FileHandle) -> SendHandle {
        SendHandle(handle)
    }

    pub fn into_inner(self) -> FileHandle {
        self.0
    }
}

/// Takes the lock; after a panic in another holder the state is unknown, so the value is
/// dropped and the caller sees it closed.
fn lock<T>(m: &Mutex<Option<T>>) -> MutexGuard<'_, Option<T>> {
    let poisoned = m.is_poisoned();
    let mut guard = m.lock().unwrap_or_else(PoisonError::into_inner);
    if poisoned {
        guard.take();
    }
    guard
}

/// A client any thread may use, one at a time (the others wait for it); use one per thread
/// for parallel I/O. Closing it makes every later call fail with EBADF.
pub struct SharedClient {
    inner: Mutex<Option<SendClient>>,
}

impl SharedClient {
    pub fn new(client: Client) -> SharedClient {
        SharedClient {
            inner: Mutex::new(Some(SendClient::new(client))),
        }
    }

    /// Runs `f` on the client, holding it for the call.
    pub fn with<R>(&self, f: impl FnOnce(&Client) -> Result<R>) -> Result<R> {
        let guard = lock(&self.inner);
        let client = guard.as_ref().ok_or(Error::Closed("client"))?;
        f(&client.0)
    }

    /// Closes the connections (after the call that holds the client, if any). Idempotent.
    pub fn close(&self) {
        let client = lock(&self.inner).take();
        drop(client);
    }
}

/// An open file of a [`SharedClient`], usable from any thread, one at a time.
pub struct SharedFile {
    handle: Mutex<Option<SendHandle>>,
}

impl SharedFile {
    pub fn new(handle: FileHandle) -> SharedFile {
        SharedFile {
            handle: Mutex::new(Some(SendHandle(handle))),
        }
    }

    pub fn is_closed(&self) -> bool {
        lock(&self.handle).is_none()
    }

    /// The size the handle knows (at least what was written through it); None once closed.
    pub fn size(&self) -> Option<u64> {
        lock(&self.handle).as_ref().map(|h| h.0.size())
    }

    /// Runs `f` on the client and the file, taking the client first, then the file.
    pub fn with<R>(
        &self,
        client: &SharedClient,
        f: impl FnOnce(&Client, &FileHandle) -> Result<R>,
    ) -> Result<R> {
        client.with(|c| {
            let guard = lock(&self.handle);
            let handle = guard.as_ref().ok_or(Error::Closed("file"))?;
            f(c, &handle.0)
        })
    }

    /// Publishes the size this handle wrote ([`Client::close`]), then closes it even if
    /// publishing failed (which is returned). Idempotent.
    pub fn close(&self, client: &SharedClient) -> Result<()> {
        client.with(|c| self.close_on(c))
    }

    /// Runs `f` on the file with a client the caller holds alone (a [`Lease`]).
    pub fn on<R>(&self, client: &Client, f: impl FnOnce(&Client, &FileHandle) -> Result<R>) -> Result<R> {
        let guard = lock(&self.handle);
        let handle = guard.as_ref().ok_or(Error::Closed("file"))?;
        f(client, &handle.0)
    }

    /// True when the handle wrote past what it last published (see [`FileHandle::unpublished`]).
    pub fn unpublished(&self) -> bool {
        lock(&self.handle).as_ref().is_some_and(|h| h.0.unpublished())
    }

    /// Drops the handle without telling the owner anything (for a handle with nothing to
    /// publish); later calls fail with EBADF.
    pub fn take(&self) -> bool {
        lock(&self.handle).take().is_some()
    }

    /// [`SharedFile::close`] with a client the caller holds alone.
    pub fn close_on(&self, client: &Client) -> Result<()> {
        let mut guard = lock(&self.handle);
        let Some(handle) = guard.take() else {
            return Ok(());
        };
        drop(guard);
        client.close(&handle.0)
    }
}

/// Takes a lock whose state stays consistent across a panic (updated in single steps).
fn lock_state<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The clients of a pool: idle ones, and how many exist (idle or leased).
struct PoolState {
    idle: Vec<SendClient>,
    live: usize,
    closed: bool,
    /// `benchfs_ucx::fork_generation` of the clients counted here.
    generation: u64,
}

/// A bounded pool of clients of one cluster, for a process whose threads call in parallel: a
/// call leases a client (an idle one, else a new one while fewer than the limit exist, else it
/// waits), uses it alone, and gives it back when the lease drops. Threads working on different
/// files thus run in parallel on different clients; a [`FileHandle`] holds only the file's
/// identity, layout and written size, so any client may serve it.
pub struct ClientPool {
    registry: PathBuf,
    config: Config,
    limit: usize,
    /// New clients take descriptor numbers from here up (0: wherever the kernel puts them).
    fd_floor: i32,
    /// The write-behind group of the pool's clients: a file written with one lease may be
    /// flushed or closed with another.
    write_behind: u64,
    state: Mutex<PoolState>,
    /// Signalled when a client goes back to the pool or a slot frees up.
    returned: Condvar,
}

/// One client of a [`ClientPool`], used by one thread until dropped.
pub struct Lease {
    pool: Arc<ClientPool>,
    /// None only while the client is being created.
    client: Option<SendClient>,
}

impl Lease {
    pub fn client(&self) -> Result<&Client> {
        self.client
            .as_ref()
            .map(SendClient::client)
            .ok_or(Error::Closed("client"))
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let client = self.client.take();
        let mut state = lock_state(&self.pool.state);
        // After a panic the client's state is unknown, and after close it is not wanted:
        // either way it is dropped instead of going back to the pool.
        let discard = match client {
            Some(c) if !state.closed && !std::thread::panicking() => {
                state.idle.push(c);
                None
            }
            other => {
                state.live -= 1;
                other
            }
        };
        drop(state);
        self.pool.returned.notify_one();
        // Closing endpoints takes a while: not under the lock.
        drop(discard);
    }
}

impl ClientPool {
    /// A pool of at most `limit` (at least 1) clients; none is connected yet.
    pub fn new(registry: PathBuf, config: Config, limit: usize) -> Arc<ClientPool> {
        ClientPool::with_fd_floor(registry, config, limit, 0)
    }

    /// A pool whose clients open their descriptors (sockets, event descriptors, rings) at
    /// `floor` or above, out of the way of a program that picks its own low numbers (a shell's
    /// `exec 3>file` would otherwise replace a client's socket).
    pub fn with_fd_floor(registry: PathBuf, config: Config, limit: usize, floor: i32) -> Arc<ClientPool> {
        Arc::new(ClientPool {
            registry,
            config,
            limit: limit.max(1),
            fd_floor: floor,
            write_behind: crate::client::write_behind_group(),
            state: Mutex::new(PoolState {
                idle: Vec::new(),
                live: 0,
                closed: false,
                generation: {
                    benchfs_ucx::watch_forks();
                    benchfs_ucx::fork_generation()
                },
            }),
            returned: Condvar::new(),
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// An idle client, else a new one while fewer than the limit exist, else waits for one.
    /// A closed pool answers [`Error::Stopped`].
    pub fn lease(self: &Arc<Self>) -> Result<Lease> {
        let mut state = lock_state(&self.state);
        if state.generation != benchfs_ucx::fork_generation() {
            // In the child of a fork: the clients are the parent's (its UCX workers and
            // sockets, its io_uring rings), which the child must neither use nor tear down.
            // They are leaked and the pool starts empty, so the child connects its own.
            std::mem::forget(std::mem::take(&mut state.idle));
            state.live = 0;
            state.generation = benchfs_ucx::fork_generation();
        }
        loop {
            if state.closed {
                return Err(Error::Stopped);
            }
            if let Some(c) = state.idle.pop() {
                return Ok(Lease {
                    pool: self.clone(),
                    client: Some(c),
                });
            }
            if state.live < self.limit {
                state.live += 1;
                drop(state);
                // Dropped on failure, which gives the slot back.
                let mut lease = Lease {
                    pool: self.clone(),
                    client: None,
                };
                let mut client = {
                    let _below = Occupied::below(self.fd_floor);
                    Client::connect(&self.registry, self.config.clone())?
                };
                client.write_behind_as(self.write_behind);
                lease.client = Some(SendClient::new(client));
                return Ok(lease);
            }
            state = self.returned.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Closes the pool: idle clients now, leased ones when their lease drops; later leases
    /// fail with [`Error::Stopped`].
    pub fn close(&self) {
        let idle = {
            let mut state = lock_state(&self.state);
            state.closed = true;
            state.live -= state.idle.len();
            std::mem::take(&mut state.idle)
        };
        self.returned.notify_all();
        drop(idle);
    }

    /// (clients that exist, idle ones), for tests and reports.
    pub fn counts(&self) -> (usize, usize) {
        let state = lock_state(&self.state);
        (state.live, state.idle.len())
    }
}

/// Every free descriptor number below a floor, held (as duplicates of one `O_PATH`
/// descriptor of `/`) so that descriptors opened meanwhile get numbers at the floor or above;
/// given back when dropped. Descriptors a client opens later (a reconnection) may still land
/// below it.
struct Occupied(Vec<i32>);

impl Occupied {
    fn below(floor: i32) -> Occupied {
        let mut held = Vec::new();
        if floor <= 0 {
            return Occupied(held);
        }
        // SAFETY: a valid path; O_PATH opens nothing for I/O.
        let first = unsafe { libc::open(c"/".as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
        if first < 0 {
            return Occupied(held);
        }
        held.push(first);
        while let Some(&last) = held.last() {
            if last >= floor - 1 {
                break;
            }
            // SAFETY: duplicates our own descriptor at the lowest free number.
            let fd = unsafe { libc::fcntl(first, libc::F_DUPFD_CLOEXEC, 0) };
            if fd < 0 || fd >= floor {
                if fd >= 0 {
                    // SAFETY: ours, just made.
                    unsafe { libc::close(fd) };
                }
                break;
            }
            held.push(fd);
        }
        Occupied(held)
    }
}

impl Drop for Occupied {
    fn drop(&mut self) {
        for &fd in &self.0 {
            // SAFETY: descriptors this value made.
            unsafe { libc::close(fd) };
        }
    }
}
