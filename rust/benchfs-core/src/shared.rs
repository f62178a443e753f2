//! Using a client from more than one thread: the one place that argues why a [`Client`] and a
//! [`FileHandle`] may move between threads, and [`SharedClient`]/[`SharedFile`], which threads
//! take turns on. The Python module, the C library and (later) the interposition library
//! build on these; a face keeps no `unsafe impl Send` of its own.

use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::client::{Client, FileHandle};
use crate::error::{Error, Result};

/// A [`Client`] that may move to another thread. Sound because (1) the `Rc`s inside it (its
/// reply state, shared with the UCX reply handler) never leave it: no clone is handed out, so
/// moving the client moves every owner of those counts together; (2) whoever holds it uses it
/// from one thread at a time (a mutex or a pool's lease orders one thread's last use before
/// the next thread's first), so its `Cell`s and `RefCell`s are never touched by two threads at
/// once; (3) its UCX worker runs in serialized mode (any thread, one at a time) and its
/// io_uring ring and event loop keep no thread-local state.
pub struct SendClient(Client);

// SAFETY: see the type's documentation.
unsafe impl Send for SendClient {}

impl SendClient {
    pub fn new(client: Client) -> SendClient {
        SendClient(client)
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
            inner: Mutex::new(Some(SendClient(client))),
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
        if self.is_closed() {
            return Ok(());
        }
        let result = self.with(client, |c, f| c.close(f));
        lock(&self.handle).take();
        result
    }
}
