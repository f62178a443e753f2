//! The bounded cache of open chunk files, so hot chunks are not reopened per request.
//! Entries are reference-counted: eviction never closes a descriptor an operation still uses.

use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::num::NonZeroUsize;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::rc::Rc;

use lru::LruCache;

use crate::chunking::FileId;
use crate::runtime::Reactor;

/// A chunk file's descriptors: buffered, and O_DIRECT when a direction uses direct I/O.
pub struct Handle {
    buffered: File,
    direct: Option<File>,
}

impl Handle {
    pub fn new(buffered: File, direct: Option<File>) -> Handle {
        Handle { buffered, direct }
    }

    pub fn buffered_fd(&self) -> i32 {
        self.buffered.as_raw_fd()
    }

    pub fn direct_fd(&self) -> Option<i32> {
        self.direct.as_ref().map(|f| f.as_raw_fd())
    }
}

pub struct HandleCache {
    cache: RefCell<LruCache<(FileId, u64), Rc<Handle>>>,
    direct: bool,
}

impl HandleCache {
    pub fn new(capacity: usize, direct: bool) -> HandleCache {
        HandleCache {
            cache: RefCell::new(LruCache::new(
                NonZeroUsize::new(capacity.max(1)).unwrap_or(NonZeroUsize::MIN),
            )),
            direct,
        }
    }

    /// Drops a cached handle (the chunk file is being removed or cut).
    pub fn forget(&self, file: FileId, chunk: u64) {
        self.cache.borrow_mut().pop(&(file, chunk));
    }

    /// The chunk's handle and whether it was cached; `None` if it does not exist and `create`
    /// is false. Misses open through io_uring, so they never stall the event loop.
    pub async fn get(
        &self,
        reactor: &Rc<Reactor>,
        file: FileId,
        chunk: u64,
        create: bool,
        path: PathBuf,
    ) -> io::Result<Option<(Rc<Handle>, bool)>> {
        if let Some(h) = self.cache.borrow_mut().get(&(file, chunk)) {
            return Ok(Some((h.clone(), true)));
        }
        let Some(handle) = super::open_handle_async(reactor, &path, create, self.direct).await? else {
            return Ok(None);
        };
        let handle = Rc::new(handle);
        // Two concurrent misses may both open; the later entry wins, the other handle closes
        // when its operation finishes.
        self.cache.borrow_mut().put((file, chunk), handle.clone());
        Ok(Some((handle, false)))
    }
}
