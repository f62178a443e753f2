//! The worker: one UCP context and worker per event loop, progressed by its owner and woken
//! through its event fd.

use std::cell::{Cell, RefCell};
use std::io::Write as _;
use std::os::fd::RawFd;
use std::ptr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use benchfs_ucx_sys as sys;

use crate::*;

pub(crate) struct WorkerInner {
    pub(crate) context: sys::ucp_context_h,
    pub(crate) worker: sys::ucp_worker_h,
    pub(crate) event_fd: RawFd,
    /// Boxed handlers whose addresses were given to UCX as callback arguments.
    pub(crate) handlers: RefCell<Vec<*mut AmHandlerBox>>,
    /// Requests started on this worker whose completion callback has not run yet.
    pub(crate) held: Rc<Cell<usize>>,
    /// [`fork_generation`] when made: in a forked child the worker is the parent's.
    pub(crate) generation: u64,
    /// Set while `ucp_worker_progress` runs, i.e. while UCX may call our callbacks: UCX's
    /// progress is not reentrant, and an endpoint created or destroyed from inside it can free
    /// a transport endpoint the progress frame still uses (UCX 1.22 `tcp/tcp_iface.c:433`).
    pub(crate) in_progress: Cell<bool>,
    /// Endpoints whose close was asked for inside progress: closed once it returns.
    pub(crate) deferred_closes: RefCell<Vec<(sys::ucp_ep_h, bool, Rc<EpState>)>>,
}

impl WorkerInner {
    /// Made by an ancestor before a fork: its sockets and shared memory are the parent's, so
    /// this process must not use them, nor close them (a destroyed worker unlinks its shared
    /// memory and says goodbye on the parent's connections). It is leaked instead.
    pub(crate) fn forked_away(&self) -> bool {
        self.generation != fork_generation()
    }
}

/// How long dropping a worker waits for UCX to finish the requests it still holds.
const RELEASE_WAIT: Duration = Duration::from_secs(2);

impl Drop for WorkerInner {
    fn drop(&mut self) {
        if self.forked_away() {
            return;
        }
        // A request can outlive its endpoint: UCX completes an aborted rendezvous send only
        // once its registration cache lets go of the buffer, possibly later and from another
        // thread's memory release, and the completion then queues work on this worker.
        // Destroyed before that, the worker's freed memory is written to (UCX 1.22: heap
        // corruption, seen with several workers on threads). So wait until UCX has called back
        // for every request; if it has not in time, keep the worker rather than free it.
        self.close_deferred();
        let deadline = Instant::now() + RELEASE_WAIT;
        while self.held.get() > 0 && Instant::now() < deadline {
            if self.progress_once() == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        if self.held.get() > 0 {
            // Not eprintln!: a stderr that cannot be written must not panic a closing worker.
            let _ = writeln!(
                std::io::stderr(),
                "benchfs: UCX still held {} requests of a closed worker after {:?}; \
                 its memory is kept",
                self.held.get(),
                RELEASE_WAIT
            );
            return;
        }
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

impl WorkerInner {
    /// One `ucp_worker_progress`, never from inside another (a callback that asks for
    /// progress gets 0), then the endpoint closes asked for meanwhile.
    pub(crate) fn progress_once(&self) -> u32 {
        debug_assert!(
            !self.in_progress.get(),
            "UCX progress called from inside progress"
        );
        if self.in_progress.replace(true) {
            return 0;
        }
        // SAFETY: the worker is alive and used from this thread only.
        let count = unsafe { sys::ucp_worker_progress(self.worker) };
        self.in_progress.set(false);
        self.close_deferred();
        count
    }

    /// Starts closing endpoint `ep`, `force`d (every operation on it fails at once; only for
    /// a peer UCX reported failed or one that must not touch our memory again) or flushed
    /// (operations complete, then the peer is told). Never waits: the close request
    /// completes in later progress, counted in `held`. Inside progress the close is deferred
    /// until progress returns. `state` (what the endpoint's error callback is given) is kept
    /// until UCX is done with the endpoint.
    pub(crate) fn close_ep(&self, ep: sys::ucp_ep_h, force: bool, state: Rc<EpState>) {
        if self.in_progress.get() {
            self.deferred_closes.borrow_mut().push((ep, force, state));
            return;
        }
        let closing = Box::new(Closing {
            held: self.held.clone(),
            _state: state,
        });
        let mut param = sys::ucp_request_param_t {
            op_attr_mask: sys::UCP_OP_ATTR_FIELD_FLAGS
                | sys::UCP_OP_ATTR_FIELD_CALLBACK
                | sys::UCP_OP_ATTR_FIELD_USER_DATA,
            flags: if force { sys::UCP_EP_CLOSE_FLAG_FORCE } else { 0 },
            user_data: Box::into_raw(closing) as *mut std::ffi::c_void,
            ..Default::default()
        };
        param.cb.send = Some(close_done);
        // SAFETY: each endpoint is closed once (its owner clears the handle first).
        let req = unsafe { sys::ucp_ep_close_nbx(ep, &param) };
        if req.is_null() || sys::ucs_ptr_is_err(req) {
            // SAFETY: the callback will not run (the endpoint is gone): take the box back.
            drop(unsafe { Box::from_raw(param.user_data as *mut Closing) });
        } else {
            self.held.set(self.held.get() + 1);
        }
    }

    fn close_deferred(&self) {
        let closes = std::mem::take(&mut *self.deferred_closes.borrow_mut());
        for (ep, force, state) in closes {
            self.close_ep(ep, force, state);
        }
    }
}

/// What a close request keeps until UCX completes it.
struct Closing {
    held: Rc<Cell<usize>>,
    _state: Rc<EpState>,
}

/// A close request completed: UCX holds it, and the endpoint, no more.
unsafe extern "C" fn close_done(
    request: *mut std::ffi::c_void,
    _status: i8,
    user_data: *mut std::ffi::c_void,
) {
    // SAFETY: user_data is the box given up in close_ep; the request is ours to free.
    let closing = Box::from_raw(user_data as *mut Closing);
    closing.held.set(closing.held.get() - 1);
    sys::ucp_request_free(request);
}

/// A UCP context with one worker, created for active messages with wakeup support.
#[derive(Clone)]
pub struct Worker {
    pub(crate) inner: Rc<WorkerInner>,
}

/// A worker reference that does not keep the worker alive (for handlers stored in the
/// worker itself, which would otherwise form a cycle and never destroy it).
#[derive(Clone)]
pub struct WeakWorker {
    pub(crate) inner: std::rc::Weak<WorkerInner>,
}

impl WeakWorker {
    pub fn upgrade(&self) -> Option<Worker> {
        self.inner.upgrade().map(|inner| Worker { inner })
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
    /// `UCX_TCP_TX_SEG_SIZE` and `UCX_TCP_RX_SEG_SIZE`, unless the environment sets either.
    pub tcp_segment_size: Option<u64>,
    /// Allow use from any thread, one at a time (`UCS_THREAD_MODE_SERIALIZED`) instead of
    /// only the creating thread.
    pub serialized: bool,
}

/// The TCP segment size to set, unless the process's environment chose one.
fn tcp_segment(options: &WorkerOptions) -> Option<u64> {
    let chosen = ["UCX_TCP_TX_SEG_SIZE", "UCX_TCP_RX_SEG_SIZE"]
        .iter()
        .any(|v| std::env::var_os(v).is_some());
    options.tcp_segment_size.filter(|_| !chosen)
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
            tcp_segment(&options).map(|s| ("TCP_TX_SEG_SIZE", s.to_string())),
            tcp_segment(&options).map(|s| ("TCP_RX_SEG_SIZE", s.to_string())),
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
        crate::fork::check_usable()?;
        crate::fork::made_worker();
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
                    held: Rc::new(Cell::new(0)),
                    generation: fork_generation(),
                    in_progress: Cell::new(false),
                    deferred_closes: RefCell::new(Vec::new()),
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

    /// Runs UCX's progress engine once; returns how many events it processed. Called from
    /// inside progress (a UCX callback), it does nothing and returns 0.
    pub fn progress(&self) -> u32 {
        self.inner.progress_once()
    }

    /// Requests UCX still holds (sends, receives and endpoint closes not yet called back).
    pub fn held_requests(&self) -> usize {
        self.inner.held.get()
    }

    /// Whether UCX's progress is running on this worker (a UCX callback is the caller).
    pub fn in_progress(&self) -> bool {
        self.inner.in_progress.get()
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
}
