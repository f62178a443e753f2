//! The bounded pool of page-aligned buffers that every chunk transfer on a server goes through.
//! A request that finds no free buffer waits for one: overload becomes backpressure, never an
//! allocation storm.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::cell::{Cell, OnceCell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::ptr::NonNull;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use benchfs_ucx::{MemHandle, Worker};

use crate::error::{Error, Result};

pub const ALIGN: usize = 4096;

/// Pool buffer size for a chunk size: room for a whole chunk placed at any offset modulo
/// [`ALIGN`] (buffers mirror file alignment), rounded to whole blocks for direct I/O.
pub fn io_buffer_size(chunk_size: u64) -> usize {
    (chunk_size as usize).div_ceil(ALIGN) * ALIGN + 2 * ALIGN
}

/// One page-aligned allocation (owned by a pool buffer).
pub struct Aligned {
    ptr: NonNull<u8>,
    layout: Layout,
    /// Position in its pool (the io_uring fixed-buffer index and the UCX handle index).
    index: u16,
}

impl Aligned {
    fn new(size: usize, index: u16) -> Result<Aligned> {
        let layout = Layout::from_size_align(size.max(ALIGN), ALIGN)
            .map_err(|e| Error::Config(format!("buffer size {size}: {e}")))?;
        // SAFETY: layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) })
            .ok_or_else(|| Error::Config(format!("cannot allocate a {size}-byte buffer")))?;
        Ok(Aligned { ptr, layout, index })
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

pub struct PoolInner {
    free: RefCell<Vec<Aligned>>,
    waiters: RefCell<VecDeque<Waker>>,
    total: usize,
    /// Requests that had to wait for a buffer (exhaustion shows there): `pool_waits`.
    waits: Cell<u64>,
    /// UCX registrations of the buffers, by index, once `register_ucx` ran.
    memhs: OnceCell<Vec<MemHandle>>,
}

/// A fixed set of `count` buffers of `buffer_size` bytes.
#[derive(Clone)]
pub struct BufferPool {
    inner: Rc<PoolInner>,
}

impl BufferPool {
    pub fn new(count: usize, buffer_size: usize) -> Result<BufferPool> {
        if count > u16::MAX as usize {
            return Err(Error::Config(format!(
                "{count} buffers: at most {} per pool",
                u16::MAX
            )));
        }
        let free = (0..count)
            .map(|i| Aligned::new(buffer_size, i as u16))
            .collect::<Result<Vec<_>>>()?;
        Ok(BufferPool {
            inner: Rc::new(PoolInner {
                free: RefCell::new(free),
                waiters: RefCell::new(VecDeque::new()),
                total: count,
                waits: Cell::new(0),
                memhs: OnceCell::new(),
            }),
        })
    }

    /// Identifies this pool (to match buffers with the ring they were registered with).
    pub fn id(&self) -> usize {
        Rc::as_ptr(&self.inner) as usize
    }

    /// `iovec`s of every buffer, by index, for io_uring registration. Only valid while all
    /// buffers are free (right after creation), which is checked.
    pub fn iovecs(&self) -> Result<Vec<libc::iovec>> {
        let free = self.inner.free.borrow();
        if free.len() != self.inner.total {
            return Err(Error::Config(
                "buffers can only be registered while all are free".into(),
            ));
        }
        let mut all: Vec<&Aligned> = free.iter().collect();
        all.sort_by_key(|a| a.index);
        Ok(all
            .iter()
            .map(|a| libc::iovec {
                iov_base: a.ptr.as_ptr().cast(),
                iov_len: a.layout.size(),
            })
            .collect())
    }

    /// Maps every buffer with UCX, so rendezvous transfers into and out of them skip UCX's
    /// registration cache.
    pub fn register_ucx(&self, worker: &Worker) -> Result<()> {
        let iovecs = self.iovecs()?;
        let handles = iovecs
            .iter()
            // SAFETY: the buffers live as long as the pool, which owns the handles.
            .map(|v| unsafe { worker.mem_map(v.iov_base.cast(), v.iov_len) })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let _ = self.inner.memhs.set(handles);
        Ok(())
    }

    pub fn available(&self) -> usize {
        self.inner.free.borrow().len()
    }

    /// Requests that had to wait for a buffer so far.
    pub fn waits(&self) -> u64 {
        self.inner.waits.get()
    }

    /// Forgets parked waiters (at shutdown, to break waker reference cycles).
    pub fn clear_waiters(&self) {
        self.inner.waiters.borrow_mut().clear();
    }

    /// Waits for a free buffer (FIFO among waiters).
    pub fn acquire(&self) -> Acquire {
        Acquire {
            pool: self.clone(),
            waited: false,
        }
    }
}

pub struct Acquire {
    pool: BufferPool,
    waited: bool,
}

impl Future for Acquire {
    type Output = IoBuffer;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<IoBuffer> {
        let inner = &self.pool.inner;
        // Only take a buffer if nobody queued earlier is still waiting for one.
        let first_in_line = self.waited || inner.waiters.borrow().is_empty();
        if first_in_line {
            if let Some(buf) = inner.free.borrow_mut().pop() {
                return Poll::Ready(IoBuffer::Pooled {
                    buf: Some(buf),
                    pool: self.pool.inner.clone(),
                });
            }
        }
        if !self.waited {
            inner.waits.set(inner.waits.get() + 1);
        }
        inner.waiters.borrow_mut().push_back(cx.waker().clone());
        self.waited = true;
        Poll::Pending
    }
}

/// A buffer the storage engine and UCX can both use: pooled (aligned) or a plain heap copy.
pub enum IoBuffer {
    Pooled {
        buf: Option<Aligned>,
        pool: Rc<PoolInner>,
    },
    Heap(Vec<u8>),
}

impl IoBuffer {
    pub fn empty() -> IoBuffer {
        IoBuffer::Heap(Vec::new())
    }

    /// The fixed-buffer index, if this buffer belongs to the pool identified by `pool_id`.
    pub fn fixed_index(&self, pool_id: usize) -> Option<u16> {
        match self {
            IoBuffer::Pooled { buf: Some(b), pool } if Rc::as_ptr(pool) as usize == pool_id => Some(b.index),
            _ => None,
        }
    }

    /// The UCX registration of this buffer, if its pool was registered.
    pub fn memh(&self) -> Option<&MemHandle> {
        match self {
            IoBuffer::Pooled { buf: Some(b), pool } => pool.memhs.get().and_then(|m| m.get(b.index as usize)),
            _ => None,
        }
    }

    pub fn capacity(&self) -> usize {
        match self {
            IoBuffer::Pooled { buf: Some(b), .. } => b.layout.size(),
            IoBuffer::Pooled { buf: None, .. } => 0,
            IoBuffer::Heap(v) => v.len(),
        }
    }

    pub fn as_ptr(&self) -> *const u8 {
        match self {
            IoBuffer::Pooled { buf: Some(b), .. } => b.ptr.as_ptr(),
            IoBuffer::Pooled { buf: None, .. } => NonNull::dangling().as_ptr(),
            IoBuffer::Heap(v) => v.as_ptr(),
        }
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        match self {
            IoBuffer::Pooled { buf: Some(b), .. } => b.ptr.as_ptr(),
            IoBuffer::Pooled { buf: None, .. } => NonNull::dangling().as_ptr(),
            IoBuffer::Heap(v) => v.as_mut_ptr(),
        }
    }

    /// The first `len` bytes (clamped to the capacity).
    pub fn as_slice(&self, len: usize) -> &[u8] {
        let len = len.min(self.capacity());
        // SAFETY: the allocation is at least `capacity` initialised (zeroed) bytes.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), len) }
    }

    pub fn as_mut_slice(&mut self, len: usize) -> &mut [u8] {
        let len = len.min(self.capacity());
        // SAFETY: as above, and we hold the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), len) }
    }
}

impl Drop for IoBuffer {
    fn drop(&mut self) {
        if let IoBuffer::Pooled { buf, pool } = self {
            if let Some(b) = buf.take() {
                pool.free.borrow_mut().push(b);
                if let Some(w) = pool.waiters.borrow_mut().pop_front() {
                    w.wake();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::task::noop_waker;

    #[test]
    fn exhaustion_waits_and_release_wakes() -> Result<()> {
        let pool = BufferPool::new(2, 8192)?;
        let waker = noop_waker();
        let mut cx = Context::from_waker(&waker);
        let poll = |a: &mut Acquire, cx: &mut Context<'_>| match Pin::new(a).poll(cx) {
            Poll::Ready(b) => Some(b),
            Poll::Pending => None,
        };
        let a = poll(&mut pool.acquire(), &mut cx);
        let b = poll(&mut pool.acquire(), &mut cx);
        assert!(a.is_some() && b.is_some());
        assert_eq!(a.as_ref().map(|b| b.as_ptr() as usize % ALIGN), Some(0));
        let mut third = pool.acquire();
        assert!(poll(&mut third, &mut cx).is_none());
        assert_eq!(pool.waits(), 1);
        drop(a);
        assert!(poll(&mut third, &mut cx).is_some());
        assert_eq!(pool.available(), 1);
        Ok(())
    }
}
