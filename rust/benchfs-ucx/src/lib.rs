//! A thin, safe-where-possible layer over UCP for one event-loop thread.
//!
//! Everything here is single-threaded (`UCS_THREAD_MODE_SINGLE`, `!Send` types): each event
//! loop owns one [`Worker`] and drives it with [`Worker::progress`], sleeping on the worker's
//! event fd after a successful [`Worker::arm`] instead of busy polling.
//!
//! Completion of non-blocking operations is reported through [`Request`], a future whose
//! state outlives the future itself: dropping a `Request` never frees memory UCX still uses.
//! Callers of the `unsafe` send/receive functions keep their data buffers alive until the
//! request completes; the BenchFS client and server do that by construction.

mod am;
mod endpoint;
mod fork;
mod memory;
mod request;
mod worker;

pub use am::{AmData, AmMessage, AmVerdict, RndvDesc};
pub use endpoint::Endpoint;
pub use fork::{fork_generation, watch_forks};
pub use memory::MemHandle;
pub use request::Request;
pub use worker::{WeakWorker, Worker, WorkerOptions};

pub(crate) use am::AmHandlerBox;
pub(crate) use endpoint::EpState;
pub(crate) use request::{recv_done, send_done, RequestState};

use std::ffi::CStr;

use benchfs_ucx_sys as sys;

/// A UCX status other than success, with the operation that produced it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("UCX {op}: {message} (status {status})")]
pub struct UcxError {
    pub op: &'static str,
    pub status: i8,
    pub message: String,
}

impl UcxError {
    pub(crate) fn new(op: &'static str, status: sys::ucs_status_t) -> Self {
        // SAFETY: ucs_status_string returns a static NUL-terminated string for any status.
        let message = unsafe { CStr::from_ptr(sys::ucs_status_string(status)) }
            .to_string_lossy()
            .into_owned();
        UcxError { op, status, message }
    }
}

pub type Result<T> = std::result::Result<T, UcxError>;

pub(crate) fn check(op: &'static str, status: sys::ucs_status_t) -> Result<()> {
    if status == sys::UCS_OK {
        Ok(())
    } else {
        Err(UcxError::new(op, status))
    }
}
