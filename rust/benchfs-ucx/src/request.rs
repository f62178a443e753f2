//! Requests: non-blocking operations as futures whose state outlives the future, so dropping
//! a request never frees memory UCX still uses.

use std::cell::Cell;
use std::ffi::c_void;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context as TaskContext, Poll, Waker};

use benchfs_ucx_sys as sys;

use crate::*;

pub(crate) struct RequestState {
    /// Set once UCX reported completion; stays set after the result is taken.
    pub(crate) completed: Cell<bool>,
    pub(crate) done: Cell<Option<Result<usize>>>,
    pub(crate) waker: Cell<Option<Waker>>,
    /// The header must outlive the request: UCX reads it lazily for rendezvous sends.
    pub(crate) header: Box<[u8]>,
    /// The worker's count of requests UCX still holds (see [`WorkerInner`]'s drop).
    pub(crate) held: Option<Rc<Cell<usize>>>,
}

impl RequestState {
    pub(crate) fn new(header: Box<[u8]>, held: Option<Rc<Cell<usize>>>) -> Rc<RequestState> {
        Rc::new(RequestState {
            completed: Cell::new(false),
            done: Cell::new(None),
            waker: Cell::new(None),
            header,
            held,
        })
    }

    /// UCX called back for the last time: it holds the request no more.
    fn released(&self) {
        if let Some(held) = &self.held {
            held.set(held.get() - 1);
        }
    }

    pub(crate) fn complete(&self, result: Result<usize>) {
        self.completed.set(true);
        self.done.set(Some(result));
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }
}

pub(crate) unsafe extern "C" fn send_done(request: *mut c_void, status: i8, user_data: *mut c_void) {
    // SAFETY: user_data holds the reference given up in send_am; the request is ours to free.
    let state = Rc::from_raw(user_data as *const RequestState);
    let result = if status == sys::UCS_OK {
        Ok(0)
    } else {
        Err(UcxError::new("am_send", status))
    };
    state.complete(result);
    state.released();
    sys::ucp_request_free(request);
}

pub(crate) unsafe extern "C" fn recv_done(
    request: *mut c_void,
    status: i8,
    length: usize,
    user_data: *mut c_void,
) {
    // SAFETY: as send_done.
    let state = Rc::from_raw(user_data as *const RequestState);
    let result = if status == sys::UCS_OK {
        Ok(length)
    } else {
        Err(UcxError::new("am_recv_data", status))
    };
    state.complete(result);
    state.released();
    sys::ucp_request_free(request);
}

/// A UCX operation in flight. Resolves to the byte count (sends resolve to 0 when they complete
/// asynchronously). Dropping it does not cancel the operation.
pub struct Request {
    pub(crate) state: Rc<RequestState>,
    pub(crate) op: &'static str,
}

impl Request {
    /// True once UCX reported completion (success or error).
    pub fn is_done(&self) -> bool {
        self.state.completed.get()
    }

    /// The operation this request performs, for error messages.
    pub fn op(&self) -> &'static str {
        self.op
    }
}

impl Future for Request {
    type Output = Result<usize>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        match self.state.done.take() {
            Some(result) => Poll::Ready(result),
            None => {
                self.state.waker.set(Some(cx.waker().clone()));
                Poll::Pending
            }
        }
    }
}

impl Worker {
    pub(crate) unsafe fn finish_start(
        state: Rc<RequestState>,
        status_ptr: sys::ucs_status_ptr_t,
        user_data: *mut c_void,
        op: &'static str,
        len: usize,
    ) -> Request {
        if status_ptr.is_null() {
            // Completed in place; the callback will not run, so drop its reference.
            drop(Rc::from_raw(user_data as *const RequestState));
            state.complete(Ok(len));
        } else if sys::ucs_ptr_is_err(status_ptr) {
            drop(Rc::from_raw(user_data as *const RequestState));
            state.complete(Err(UcxError::new(op, sys::ucs_ptr_status(status_ptr))));
        } else if let Some(held) = &state.held {
            // In flight: its callback will run.
            held.set(held.get() + 1);
        }
        Request { state, op }
    }
}
