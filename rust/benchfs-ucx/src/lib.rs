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

use std::cell::{Cell, RefCell};
use std::ffi::{c_void, CStr};
use std::future::Future;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::ptr;
use std::rc::Rc;
use std::task::{Context as TaskContext, Poll, Waker};

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
    fn new(op: &'static str, status: sys::ucs_status_t) -> Self {
        // SAFETY: ucs_status_string returns a static NUL-terminated string for any status.
        let message = unsafe { CStr::from_ptr(sys::ucs_status_string(status)) }
            .to_string_lossy()
            .into_owned();
        UcxError { op, status, message }
    }
}

pub type Result<T> = std::result::Result<T, UcxError>;

fn check(op: &'static str, status: sys::ucs_status_t) -> Result<()> {
    if status == sys::UCS_OK {
        Ok(())
    } else {
        Err(UcxError::new(op, status))
    }
}

struct WorkerInner {
    context: sys::ucp_context_h,
    worker: sys::ucp_worker_h,
    event_fd: RawFd,
    /// Boxed handlers whose addresses were given to UCX as callback arguments.
    handlers: RefCell<Vec<*mut AmHandlerBox>>,
}

impl Drop for WorkerInner {
    fn drop(&mut self) {
        // SAFETY: handles were created by ucp_init/ucp_worker_create and are destroyed once;
        // the handler boxes are freed only after the worker that could call them is gone.
        unsafe {
            sys::ucp_worker_destroy(self.worker);
            sys::ucp_cleanup(self.context);
            for handler in self.handlers.borrow_mut().drain(..) {
                drop(Box::from_raw(handler));
            }
        }
    }
}

/// A UCP context with one worker, created for active messages with wakeup support.
#[derive(Clone)]
pub struct Worker {
    inner: Rc<WorkerInner>,
}

/// A worker reference that does not keep the worker alive (for handlers stored in the
/// worker itself, which would otherwise form a cycle and never destroy it).
#[derive(Clone)]
pub struct WeakWorker {
    inner: std::rc::Weak<WorkerInner>,
}

impl WeakWorker {
    pub fn upgrade(&self) -> Option<Worker> {
        self.inner.upgrade().map(|inner| Worker { inner })
    }
}

/// Where an active message's payload is.
pub enum AmData<'a> {
    /// Eager payload, valid only during the handler call.
    Eager(&'a [u8]),
    /// Rendezvous payload still at the sender: receive it with [`Worker::recv_data`].
    Rendezvous(RndvDesc),
}

/// A rendezvous data descriptor. If the handler returns [`AmVerdict::Keep`], exactly one of
/// [`Worker::recv_data`] or [`Worker::release_data`] must later be called with it.
#[derive(Debug, Clone, Copy)]
pub struct RndvDesc {
    desc: *mut c_void,
    pub len: usize,
}

/// One received active message.
pub struct AmMessage<'a> {
    pub header: &'a [u8],
    pub data: AmData<'a>,
}

/// What the handler did with a rendezvous descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AmVerdict {
    /// Done with the message (a rendezvous descriptor not received is dropped by UCX).
    Done,
    /// The handler kept the rendezvous descriptor for later.
    Keep,
}

type AmHandlerBox = Box<dyn FnMut(AmMessage<'_>) -> AmVerdict>;

unsafe extern "C" fn am_trampoline(
    arg: *mut c_void,
    header: *const c_void,
    header_length: usize,
    data: *mut c_void,
    length: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    // SAFETY: arg is the AmHandlerBox registered in set_am_handler, alive until worker drop;
    // UCX passes valid header/data pointers for the duration of the call.
    let handler = &mut *(arg as *mut AmHandlerBox);
    let param = &*param;
    let header = if header_length == 0 || header.is_null() {
        &[][..]
    } else {
        std::slice::from_raw_parts(header as *const u8, header_length)
    };
    let rndv = param.recv_attr & (sys::UCP_AM_RECV_ATTR_FLAG_RNDV as u64) != 0;
    let payload = if rndv {
        AmData::Rendezvous(RndvDesc {
            desc: data,
            len: length,
        })
    } else if length == 0 || data.is_null() {
        AmData::Eager(&[])
    } else {
        AmData::Eager(std::slice::from_raw_parts(data as *const u8, length))
    };
    let verdict = handler(AmMessage {
        header,
        data: payload,
    });
    match verdict {
        AmVerdict::Keep if rndv => sys::UCS_INPROGRESS,
        _ => sys::UCS_OK,
    }
}

/// UCX settings a worker is created with (anything unset keeps UCX's own default and the
/// process's `UCX_*` environment).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerOptions {
    /// `UCX_TLS` syntax, e.g. "tcp" or "shm,self".
    pub transports: Option<String>,
    /// `UCX_RNDV_THRESH`: payload bytes from which rendezvous is used.
    pub rndv_threshold: Option<u64>,
    /// `UCX_PROTO_ENABLE`: UCX's newer protocol selection (false: the original protocols).
    pub proto_v2: bool,
    /// Allow use from any thread, one at a time (`UCS_THREAD_MODE_SERIALIZED`) instead of
    /// only the creating thread.
    pub serialized: bool,
}

impl Worker {
    /// Creates a context (active messages + wakeup) and a single-threaded worker with UCX's
    /// defaults.
    pub fn new() -> Result<Self> {
        Self::with_options(&WorkerOptions::default())
    }

    /// Creates a context and a single-threaded worker with `options` applied.
    pub fn with_options(options: &WorkerOptions) -> Result<Self> {
        let options = options.clone();
        let settings: Vec<(&str, String)> = [
            options.transports.clone().map(|t| ("TLS", t)),
            options.rndv_threshold.map(|t| ("RNDV_THRESH", t.to_string())),
            Some((
                "PROTO_ENABLE",
                if options.proto_v2 { "y" } else { "n" }.to_string(),
            )),
        ]
        .into_iter()
        .flatten()
        .collect();
        let mut c_settings = Vec::with_capacity(settings.len());
        for (name, value) in &settings {
            let bad = || UcxError {
                op: "config_modify",
                status: sys::UCS_ERR_INVALID_PARAM,
                message: format!("{name}={value:?} contains a NUL byte"),
            };
            c_settings.push((
                std::ffi::CString::new(*name).map_err(|_| bad())?,
                std::ffi::CString::new(value.as_str()).map_err(|_| bad())?,
            ));
        }
        // SAFETY: plain FFI initialisation with zeroed, masked parameter structs.
        unsafe {
            let mut config: *mut sys::ucp_config_t = ptr::null_mut();
            check(
                "config_read",
                sys::ucp_config_read(ptr::null(), ptr::null(), &mut config),
            )?;
            for (name, value) in &c_settings {
                let status = sys::ucp_config_modify(config, name.as_ptr(), value.as_ptr());
                if status != sys::UCS_OK {
                    sys::ucp_config_release(config);
                    let mut e = UcxError::new("config_modify", status);
                    e.message = format!(
                        "{} = {:?}: {}",
                        name.to_string_lossy(),
                        value.to_string_lossy(),
                        e.message
                    );
                    return Err(e);
                }
            }
            let params = sys::ucp_params_t {
                field_mask: (sys::UCP_PARAM_FIELD_FEATURES) as u64,
                features: (sys::UCP_FEATURE_AM | sys::UCP_FEATURE_WAKEUP) as u64,
                ..Default::default()
            };
            let mut context: sys::ucp_context_h = ptr::null_mut();
            let status = sys::ucp_init(&params, config, &mut context);
            sys::ucp_config_release(config);
            check("init", status)?;
            let wparams = sys::ucp_worker_params_t {
                field_mask: sys::UCP_WORKER_PARAM_FIELD_THREAD_MODE as u64,
                thread_mode: if options.serialized {
                    sys::UCS_THREAD_MODE_SERIALIZED
                } else {
                    sys::UCS_THREAD_MODE_SINGLE
                },
                ..Default::default()
            };
            let mut worker: sys::ucp_worker_h = ptr::null_mut();
            if let Err(e) = check(
                "worker_create",
                sys::ucp_worker_create(context, &wparams, &mut worker),
            ) {
                sys::ucp_cleanup(context);
                return Err(e);
            }
            let mut event_fd: i32 = -1;
            if let Err(e) = check("worker_get_efd", sys::ucp_worker_get_efd(worker, &mut event_fd)) {
                sys::ucp_worker_destroy(worker);
                sys::ucp_cleanup(context);
                return Err(e);
            }
            Ok(Worker {
                inner: Rc::new(WorkerInner {
                    context,
                    worker,
                    event_fd,
                    handlers: RefCell::new(Vec::new()),
                }),
            })
        }
    }

    /// A reference that does not keep the worker alive.
    pub fn downgrade(&self) -> WeakWorker {
        WeakWorker {
            inner: Rc::downgrade(&self.inner),
        }
    }

    /// The worker's address, for peers to connect to (published in the registry).
    pub fn address(&self) -> Result<Vec<u8>> {
        // SAFETY: the address buffer is copied out and released with the matching call.
        unsafe {
            let mut addr: *mut sys::ucp_address_t = ptr::null_mut();
            let mut len: usize = 0;
            check(
                "worker_get_address",
                sys::ucp_worker_get_address(self.inner.worker, &mut addr, &mut len),
            )?;
            let bytes = std::slice::from_raw_parts(addr as *const u8, len).to_vec();
            sys::ucp_worker_release_address(self.inner.worker, addr);
            Ok(bytes)
        }
    }

    /// Runs UCX's progress engine once; returns how many events it processed.
    pub fn progress(&self) -> u32 {
        // SAFETY: single-threaded worker used from its owning thread.
        unsafe { sys::ucp_worker_progress(self.inner.worker) }
    }

    /// Arms the event fd. `Ok(true)`: nothing pending, safe to sleep on [`Self::event_fd`].
    /// `Ok(false)`: events are pending, progress again first.
    pub fn arm(&self) -> Result<bool> {
        // SAFETY: see progress.
        let status = unsafe { sys::ucp_worker_arm(self.inner.worker) };
        match status {
            sys::UCS_OK => Ok(true),
            sys::UCS_ERR_BUSY => Ok(false),
            other => Err(UcxError::new("worker_arm", other)),
        }
    }

    /// File descriptor that becomes readable when the armed worker has events.
    pub fn event_fd(&self) -> RawFd {
        self.inner.event_fd
    }

    /// Registers the handler for active-message id `id`, replacing any earlier one.
    pub fn set_am_handler<F>(&self, id: u16, handler: F) -> Result<()>
    where
        F: FnMut(AmMessage<'_>) -> AmVerdict + 'static,
    {
        let boxed: *mut AmHandlerBox = Box::into_raw(Box::new(Box::new(handler)));
        let param = sys::ucp_am_handler_param_t {
            field_mask: (sys::UCP_AM_HANDLER_PARAM_FIELD_ID
                | sys::UCP_AM_HANDLER_PARAM_FIELD_CB
                | sys::UCP_AM_HANDLER_PARAM_FIELD_ARG
                | sys::UCP_AM_HANDLER_PARAM_FIELD_FLAGS) as u64,
            id: id as u32,
            flags: sys::UCP_AM_FLAG_WHOLE_MSG,
            cb: Some(am_trampoline),
            arg: boxed as *mut c_void,
        };
        // SAFETY: the box stays alive (in `handlers`) until the worker is destroyed.
        let status = unsafe { sys::ucp_worker_set_am_recv_handler(self.inner.worker, &param) };
        self.inner.handlers.borrow_mut().push(boxed);
        check("set_am_recv_handler", status)
    }

    /// Connects to a peer worker by its address. With `peer_errors`, a failed peer completes
    /// outstanding operations with an error instead of leaving them pending.
    pub fn connect(&self, address: &[u8], peer_errors: bool) -> Result<Endpoint> {
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

    /// Registers `len` bytes at `ptr` with UCX.
    ///
    /// # Safety
    /// The memory must stay allocated until the returned handle is dropped.
    pub unsafe fn mem_map(&self, ptr: *mut u8, len: usize) -> Result<MemHandle> {
        let params = sys::ucp_mem_map_params_t {
            field_mask: (sys::UCP_MEM_MAP_PARAM_FIELD_ADDRESS | sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH) as u64,
            address: ptr.cast(),
            length: len,
            ..Default::default()
        };
        let mut memh: sys::ucp_mem_h = ptr::null_mut();
        check(
            "mem_map",
            sys::ucp_mem_map(self.inner.context, &params, &mut memh),
        )?;
        Ok(MemHandle {
            memh,
            worker: self.clone(),
        })
    }

    /// Sends an active message on an endpoint handle.
    ///
    /// The header is copied into the request; the data is not.
    ///
    /// # Safety
    /// `ep` is a live endpoint of this worker; `data` must stay valid and unmodified until the
    /// returned request completes.
    unsafe fn send_am(
        &self,
        ep: sys::ucp_ep_h,
        id: u16,
        header: &[u8],
        data: &[u8],
        memh: Option<&MemHandle>,
    ) -> Request {
        let state = RequestState::new(header.to_vec().into_boxed_slice());
        let mut param = sys::ucp_request_param_t {
            op_attr_mask: sys::UCP_OP_ATTR_FIELD_CALLBACK | sys::UCP_OP_ATTR_FIELD_USER_DATA,
            user_data: Rc::into_raw(state.clone()) as *mut c_void,
            ..Default::default()
        };
        param.cb.send = Some(send_done);
        if let Some(m) = memh {
            param.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_MEMH;
            param.memh = m.memh;
        }
        let status_ptr = sys::ucp_am_send_nbx(
            ep,
            id as u32,
            state.header.as_ptr() as *const c_void,
            state.header.len(),
            data.as_ptr() as *const c_void,
            data.len(),
            &param,
        );
        Self::finish_start(state, status_ptr, param.user_data, "am_send", data.len())
    }

    /// Starts receiving a rendezvous payload into `buf`.
    ///
    /// # Safety
    /// `desc` comes from a handler that returned [`AmVerdict::Keep`] (or is being used inside
    /// the handler) and is used once; `buf` stays valid until the request completes.
    pub unsafe fn recv_data(&self, desc: RndvDesc, buf: &mut [u8], memh: Option<&MemHandle>) -> Request {
        let state = RequestState::new(Box::new([]));
        let mut param = sys::ucp_request_param_t {
            op_attr_mask: sys::UCP_OP_ATTR_FIELD_CALLBACK
                | sys::UCP_OP_ATTR_FIELD_USER_DATA
                | sys::UCP_OP_ATTR_FIELD_DATATYPE,
            datatype: sys::ucp_dt_make_contig(1),
            user_data: Rc::into_raw(state.clone()) as *mut c_void,
            ..Default::default()
        };
        param.cb.recv_am = Some(recv_done);
        if let Some(m) = memh {
            param.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_MEMH;
            param.memh = m.memh;
        }
        let len = desc.len.min(buf.len());
        let status_ptr = sys::ucp_am_recv_data_nbx(
            self.inner.worker,
            desc.desc,
            buf.as_mut_ptr() as *mut c_void,
            len,
            &param,
        );
        Self::finish_start(state, status_ptr, param.user_data, "am_recv_data", len)
    }

    /// Drops a kept rendezvous descriptor without receiving it.
    ///
    /// # Safety
    /// `desc` was kept by a handler and has not been used.
    pub unsafe fn release_data(&self, desc: RndvDesc) {
        sys::ucp_am_data_release(self.inner.worker, desc.desc);
    }

    unsafe fn finish_start(
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
        }
        Request { state, op }
    }
}

/// Memory registered with UCX (`ucp_mem_map`), so transfers from and to it skip the
/// registration cache. Unmapped on drop; keeps the context alive until then.
pub struct MemHandle {
    memh: sys::ucp_mem_h,
    worker: Worker,
}

impl Drop for MemHandle {
    fn drop(&mut self) {
        // SAFETY: mapped once in `mem_map` with this context; unmapped once.
        unsafe {
            sys::ucp_mem_unmap(self.worker.inner.context, self.memh);
        }
    }
}

type FailureHook = Box<dyn Fn(&UcxError)>;

struct EpState {
    failure: Cell<Option<i8>>,
    /// Called once when UCX reports the peer failed (from inside `progress`).
    hook: RefCell<Option<FailureHook>>,
}

unsafe extern "C" fn ep_error_trampoline(arg: *mut c_void, _ep: sys::ucp_ep_h, status: i8) {
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
    ep: Cell<sys::ucp_ep_h>,
    state: Rc<EpState>,
    worker: Worker,
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
            let state = RequestState::new(Box::new([]));
            state.complete(Err(UcxError::new("am_send", sys::UCS_ERR_NOT_CONNECTED)));
            return Request { state, op: "am_send" };
        }
        self.worker.send_am(ep, id, header, data, memh)
    }

    /// Closes the endpoint forcibly: UCX completes every operation still on it with an error.
    /// Bounded (forced close needs no peer); idempotent.
    pub fn close(&self) {
        let ep = self.ep.replace(ptr::null_mut());
        if ep.is_null() {
            return;
        }
        let param = sys::ucp_request_param_t {
            op_attr_mask: sys::UCP_OP_ATTR_FIELD_FLAGS,
            flags: sys::UCP_EP_CLOSE_FLAG_FORCE,
            ..Default::default()
        };
        // SAFETY: the endpoint is closed once (the handle is cleared first); forced close
        // completes every outstanding operation on it with an error.
        unsafe {
            let req = sys::ucp_ep_close_nbx(ep, &param);
            if !req.is_null() && !sys::ucs_ptr_is_err(req) {
                for _ in 0..100_000 {
                    if sys::ucp_request_check_status(req) != sys::UCS_INPROGRESS {
                        break;
                    }
                    self.worker.progress();
                }
                sys::ucp_request_free(req);
            }
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.close();
        // The error callback can no longer run: drop the hook (it may hold references).
        self.state.hook.borrow_mut().take();
    }
}

struct RequestState {
    /// Set once UCX reported completion; stays set after the result is taken.
    completed: Cell<bool>,
    done: Cell<Option<Result<usize>>>,
    waker: Cell<Option<Waker>>,
    /// The header must outlive the request: UCX reads it lazily for rendezvous sends.
    header: Box<[u8]>,
}

impl RequestState {
    fn new(header: Box<[u8]>) -> Rc<RequestState> {
        Rc::new(RequestState {
            completed: Cell::new(false),
            done: Cell::new(None),
            waker: Cell::new(None),
            header,
        })
    }

    fn complete(&self, result: Result<usize>) {
        self.completed.set(true);
        self.done.set(Some(result));
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }
}

unsafe extern "C" fn send_done(request: *mut c_void, status: i8, user_data: *mut c_void) {
    // SAFETY: user_data holds the reference given up in send_am; the request is ours to free.
    let state = Rc::from_raw(user_data as *const RequestState);
    let result = if status == sys::UCS_OK {
        Ok(0)
    } else {
        Err(UcxError::new("am_send", status))
    };
    state.complete(result);
    sys::ucp_request_free(request);
}

unsafe extern "C" fn recv_done(request: *mut c_void, status: i8, length: usize, user_data: *mut c_void) {
    // SAFETY: as send_done.
    let state = Rc::from_raw(user_data as *const RequestState);
    let result = if status == sys::UCS_OK {
        Ok(length)
    } else {
        Err(UcxError::new("am_recv_data", status))
    };
    state.complete(result);
    sys::ucp_request_free(request);
}

/// A UCX operation in flight. Resolves to the byte count (sends resolve to 0 when they complete
/// asynchronously). Dropping it does not cancel the operation.
pub struct Request {
    state: Rc<RequestState>,
    op: &'static str,
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
