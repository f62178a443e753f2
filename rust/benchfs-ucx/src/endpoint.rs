//! Endpoints: connections to peer workers, their failure reports, sending active messages,
//! and closing.

use std::cell::{Cell, RefCell};
use std::ffi::c_void;
use std::ptr;
use std::rc::Rc;

use benchfs_ucx_sys as sys;

use crate::*;

pub(crate) type FailureHook = Box<dyn Fn(&UcxError)>;

pub(crate) struct EpState {
    pub(crate) failure: Cell<Option<i8>>,
    /// Called once when UCX reports the peer failed (from inside `progress`).
    pub(crate) hook: RefCell<Option<FailureHook>>,
}

pub(crate) unsafe extern "C" fn ep_error_trampoline(arg: *mut c_void, _ep: sys::ucp_ep_h, status: i8) {
    // SAFETY: arg is the EpState owned by the Endpoint, which outlives the UCX endpoint.
    let state = &*(arg as *const EpState);
    if state.failure.replace(Some(status)).is_some() {
        return;
    }
    if let Some(hook) = state.hook.borrow().as_ref() {
        hook(&UcxError::new("endpoint", status));
    }
}

/// A connection to a peer worker. Closed (forcibly, bounded) by [`Endpoint::close`] or on drop.
pub struct Endpoint {
    /// Null once closed.
    pub(crate) ep: Cell<sys::ucp_ep_h>,
    pub(crate) state: Rc<EpState>,
    pub(crate) worker: Worker,
}

impl Endpoint {
    /// The error UCX reported for this endpoint's peer, if any.
    pub fn failure(&self) -> Option<UcxError> {
        self.state.failure.get().map(|s| UcxError::new("endpoint", s))
    }

    /// Whether the endpoint was closed or its peer failed: sends on it fail at once.
    pub fn is_down(&self) -> bool {
        self.ep.get().is_null() || self.state.failure.get().is_some()
    }

    /// Runs `hook` (inside UCX's progress, so it must not call into UCX) when the peer fails.
    /// Needs peer error handling (see [`Worker::connect`]).
    pub fn on_failure(&self, hook: impl Fn(&UcxError) + 'static) {
        *self.state.hook.borrow_mut() = Some(Box::new(hook));
    }

    /// Sends an active message. The header is copied; the data is not. On a closed endpoint
    /// the request fails at once.
    ///
    /// # Safety
    /// `data` must stay valid and unmodified until the returned request completes.
    pub unsafe fn send_am(&self, id: u16, header: &[u8], data: &[u8], memh: Option<&MemHandle>) -> Request {
        let ep = self.ep.get();
        if ep.is_null() {
            let state = RequestState::new(Box::new([]), None);
            state.complete(Err(UcxError::new("am_send", sys::UCS_ERR_NOT_CONNECTED)));
            return Request { state, op: "am_send" };
        }
        self.worker.send_am(ep, id, header, data, memh)
    }

    /// Closes the endpoint, never waiting: flushed (what was sent is delivered, then the peer
    /// is told) while its peer is alive, forced once UCX reported the peer failed. A forced
    /// close of a live peer's endpoint leaves UCX's TCP transport an endpoint that the peer's
    /// own close then frees inside progress while progress still uses it (UCX 1.22,
    /// `tcp/tcp_iface.c:429-434`): only [`Endpoint::abort`] does that, for peers presumed
    /// dead. Idempotent; inside progress the close runs once progress returns.
    pub fn close(&self) {
        let force = self.state.failure.get().is_some();
        self.close_with(force);
    }

    /// Closes the endpoint forcibly: UCX completes every operation still on it with an error,
    /// so none of them touches its memory afterwards. For peers presumed dead (a server that
    /// stopped answering); never waits.
    pub fn abort(&self) {
        self.close_with(true);
    }

    fn close_with(&self, force: bool) {
        debug_assert!(
            !self.worker.in_progress(),
            "an endpoint closed from inside UCX progress (a callback)"
        );
        let ep = self.ep.replace(ptr::null_mut());
        if ep.is_null() || self.worker.inner.forked_away() {
            return;
        }
        self.worker.inner.close_ep(ep, force, self.state.clone());
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.close();
        // The error callback can no longer run: drop the hook (it may hold references).
        self.state.hook.borrow_mut().take();
    }
}

impl Worker {
    /// Connects to a peer worker by its address. With `peer_errors`, a failed peer completes
    /// outstanding operations with an error instead of leaving them pending.
    /// Not from inside progress (a UCX callback): UCX's TCP transport may then hand the new
    /// endpoint a socket the progress frame still uses; that is refused.
    pub fn connect(&self, address: &[u8], peer_errors: bool) -> Result<Endpoint> {
        debug_assert!(
            !self.in_progress(),
            "an endpoint created from inside UCX progress"
        );
        if self.in_progress() {
            return Err(UcxError {
                op: "ep_create",
                status: sys::UCS_ERR_INVALID_PARAM,
                message: "refused inside UCX progress (a callback)".into(),
            });
        }
        let state = Rc::new(EpState {
            failure: Cell::new(None),
            hook: RefCell::new(None),
        });
        let mut params = sys::ucp_ep_params_t {
            field_mask: sys::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS as u64,
            address: address.as_ptr() as *const sys::ucp_address_t,
            ..Default::default()
        };
        if peer_errors {
            params.field_mask |=
                (sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER) as u64;
            params.err_mode = sys::UCP_ERR_HANDLING_MODE_PEER;
            params.err_handler = sys::ucp_err_handler_t {
                cb: Some(ep_error_trampoline),
                arg: Rc::as_ptr(&state) as *mut c_void,
            };
        }
        let mut ep: sys::ucp_ep_h = ptr::null_mut();
        // SAFETY: UCX copies the address during ep creation; `state` outlives the endpoint.
        check("ep_create", unsafe {
            sys::ucp_ep_create(self.inner.worker, &params, &mut ep)
        })?;
        Ok(Endpoint {
            ep: Cell::new(ep),
            state,
            worker: self.clone(),
        })
    }
}
