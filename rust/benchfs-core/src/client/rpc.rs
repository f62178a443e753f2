//! The RPC engine: requests over the connections of `connect.rs`, a bounded window per
//! worker, requests matched to replies by id, timeouts and retries with backoff, and the
//! quiescing that keeps UCX off the caller's memory.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::task::Waker;
use std::time::{Duration, Instant};

use benchfs_ucx::{AmData, AmMessage, AmVerdict, Endpoint, Request, WeakWorker, Worker};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::namespace::Attr;
use crate::placement::{chunk_target, metadata_target, Target};
use crate::protocol::{Header, Op, ReplyValue, AM_REPLY, AM_REQUEST};
use crate::runtime::{with_timeout, Runtime};
use crate::telemetry::OpKind;

use super::connect::{Probing, PROBE_FIRST};
use super::telemetry::{ns, Attempt};
use super::Client;

/// Where a reply's payload goes: a raw view of the caller's buffer for this request.
#[derive(Clone, Copy)]
pub(super) struct Dest {
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
}

/// Why a request ended without a usable reply.
pub(super) enum ReplyFailure {
    /// The reply could not be decoded.
    Malformed(String),
    /// The connection to the server failed (UCX reported the peer gone).
    Lost(String),
}

/// Set (with UCX's reason) when an endpoint's peer fails; shared by the endpoint's failure hook
/// and the requests sent on it.
pub(super) type Down = Rc<RefCell<Option<String>>>;

/// An endpoint to one server worker and its failure flag.
pub(super) struct Link {
    pub(super) endpoint: Endpoint,
    pub(super) down: Down,
}

#[derive(Default)]
pub(super) struct PendingRpc {
    /// The failure flag of the endpoint the request went out on.
    pub(super) down: Option<Down>,
    pub(super) reply: Option<std::result::Result<Header, ReplyFailure>>,
    pub(super) dest: Option<Dest>,
    /// A rendezvous receive into `dest`, started by the reply handler.
    pub(super) data: Option<Request>,
    pub(super) waker: Option<Waker>,
    /// A request that outlives its call (read-ahead, write-behind): its reply's arrival is
    /// timed (`replied_at`), as no call is waiting to.
    pub(super) detached: bool,
    /// A read-ahead request nobody wants any more: its reply is dropped on arrival.
    pub(super) cancelled: bool,
    /// When a detached request's reply arrived.
    pub(super) replied_at: Option<Instant>,
}

pub(super) struct Shared {
    pub(super) pending: RefCell<HashMap<u64, PendingRpc>>,
    /// UCX operations of abandoned requests that may still touch caller memory.
    pub(super) orphans: RefCell<Vec<Request>>,
    /// Receives of cancelled read-ahead requests, with the client-owned buffers they fill:
    /// kept until UCX is done with them (they never touch caller memory).
    pub(super) detached_orphans: RefCell<Vec<(Request, Box<[u8]>)>>,
    pub(super) late_replies: Cell<u64>,
    pub(super) malformed_replies: Cell<u64>,
}

pub(super) struct ServerLink {
    pub(super) id: u32,
    /// One endpoint per server worker; `None` once force-closed.
    pub(super) endpoints: Vec<Option<Link>>,
    /// The connection id each server worker gave this client at hello.
    pub(super) conns: Vec<u32>,
    /// Set once the server failed: requests fail at once (EHOSTDOWN) until a probe succeeds.
    pub(super) lost: Option<String>,
    pub(super) probe: Probing,
    /// A call is greeting this server on its first use; others wait in `waiters`.
    pub(super) connecting: bool,
    pub(super) waiters: Vec<Waker>,
}

/// How long `quiesce` waits for UCX to release caller memory after closing endpoints, before
/// it tears the UCX worker down (which releases it for certain) and reconnects.
pub(super) const RELEASE_WAIT: Duration = Duration::from_millis(500);

/// How long reconnecting after such a teardown may take (all servers at once).
pub(super) const RECONNECT_WAIT: Duration = Duration::from_secs(1);

impl Shared {
    /// UCX reported the peer of the endpoint with flag `down` failed: requests waiting on it
    /// wake up and see the flag (if `pending` is busy now, they see it when next polled).
    pub(super) fn endpoint_failed(&self, down: &Down, reason: String) {
        *down.borrow_mut() = Some(reason);
        if let Ok(mut pending) = self.pending.try_borrow_mut() {
            for p in pending.values_mut() {
                if p.down.as_ref().is_some_and(|d| Rc::ptr_eq(d, down)) {
                    if let Some(w) = p.waker.take() {
                        w.wake();
                    }
                }
            }
        }
    }

    pub(super) fn on_reply(&self, worker: &Worker, msg: AmMessage<'_>) -> AmVerdict {
        let header = match Header::decode(msg.header) {
            Ok(h) => h,
            Err(e) => {
                self.malformed_replies.set(self.malformed_replies.get() + 1);
                if let Some(id) = e.request_id {
                    if let Some(p) = self.pending.borrow_mut().get_mut(&id) {
                        p.reply = Some(Err(ReplyFailure::Malformed(e.reason)));
                        if let Some(w) = p.waker.take() {
                            w.wake();
                        }
                    }
                }
                return AmVerdict::Done;
            }
        };
        let mut pending = self.pending.borrow_mut();
        let Some(p) = pending.get_mut(&header.request_id) else {
            // The request was abandoned; an unreceived rendezvous payload is dropped by UCX.
            self.late_replies.set(self.late_replies.get() + 1);
            return AmVerdict::Done;
        };
        if p.cancelled {
            pending.remove(&header.request_id);
            return AmVerdict::Done;
        }
        if p.detached {
            p.replied_at = Some(Instant::now());
        }
        match (msg.data, p.dest) {
            (AmData::Eager(d), Some(dest)) if !d.is_empty() => {
                let n = d.len().min(dest.len);
                // SAFETY: dest points into the caller's buffer, alive while the request is
                // pending (see the module comment); the source is valid during the callback.
                unsafe { std::ptr::copy_nonoverlapping(d.as_ptr(), dest.ptr, n) };
            }
            (AmData::Rendezvous(desc), Some(dest)) => {
                // SAFETY: as above; the descriptor is used once, inside the handler.
                let slice = unsafe { std::slice::from_raw_parts_mut(dest.ptr, dest.len) };
                p.data = Some(unsafe { worker.recv_data(desc, slice, None) });
            }
            _ => {}
        }
        p.reply = Some(Ok(header));
        if let Some(w) = p.waker.take() {
            w.wake();
        }
        AmVerdict::Done
    }
}

/// Drops the pending entry of a request; if its UCX operations are still running, they become
/// orphans that `quiesce` waits for.
pub(super) struct RpcGuard<'a> {
    pub(super) shared: &'a Shared,
    pub(super) id: u64,
    pub(super) send: Option<Request>,
    /// Whether `send` reads the caller's memory (a header-only send owns all it uses).
    pub(super) send_reads_caller: bool,
}

impl Drop for RpcGuard<'_> {
    fn drop(&mut self) {
        let entry = self.shared.pending.borrow_mut().remove(&self.id);
        let mut orphans = self.shared.orphans.borrow_mut();
        if let Some(send) = self.send.take() {
            if self.send_reads_caller && !send.is_done() {
                orphans.push(send);
            }
        }
        if let Some(data) = entry.and_then(|e| e.data) {
            if !data.is_done() {
                orphans.push(data);
            }
        }
    }
}

pub(super) struct WaitReply<'a> {
    pub(super) shared: &'a Shared,
    pub(super) id: u64,
}

impl std::future::Future for WaitReply<'_> {
    type Output = std::result::Result<Header, ReplyFailure>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let mut pending = self.shared.pending.borrow_mut();
        match pending.get_mut(&self.id) {
            Some(p) => match p.reply.take() {
                Some(r) => std::task::Poll::Ready(r),
                None => {
                    if let Some(reason) = p.down.as_ref().and_then(|d| d.borrow().clone()) {
                        return std::task::Poll::Ready(Err(ReplyFailure::Lost(reason)));
                    }
                    p.waker = Some(cx.waker().clone());
                    std::task::Poll::Pending
                }
            },
            None => std::task::Poll::Ready(Err(ReplyFailure::Malformed("request vanished".into()))),
        }
    }
}

/// A UCX worker for a client: replies handled by `shared`, progressed by `runtime`'s loop.
/// Returns it with its address (what hellos carry).
pub(super) fn make_worker(
    config: &Config,
    runtime: &Runtime,
    shared: &Rc<Shared>,
) -> Result<(Worker, Rc<[u8]>)> {
    super::netns::enter()?;
    // Serialized, not single-threaded: a client may move between threads (never used by two
    // at once; the front-ends serialize access).
    let options = benchfs_ucx::WorkerOptions {
        serialized: true,
        ..config.network.worker_options()
    };
    let worker = Worker::with_options(&options)?;
    let handler_shared = Rc::downgrade(shared);
    // Weak: the handler lives in the worker, which a strong reference would keep alive.
    let handler_worker: WeakWorker = worker.downgrade();
    worker.set_am_handler(AM_REPLY, move |msg| {
        match (handler_shared.upgrade(), handler_worker.upgrade()) {
            (Some(s), Some(w)) => s.on_reply(&w, msg),
            _ => AmVerdict::Done,
        }
    })?;
    runtime.reactor().attach_ucx(worker.clone());
    let address: Rc<[u8]> = worker.address()?.into();
    Ok((worker, address))
}

impl Client {
    pub(super) fn server_count(&self) -> usize {
        self.membership.len()
    }

    /// Marks the server at `index` lost: requests to it fail at once (EHOSTDOWN) until a
    /// probe gets an answer. Logged once per change of state.
    pub(super) fn mark_lost(&self, index: usize, reason: String) {
        if let Some(link) = self.links.borrow_mut().get_mut(index) {
            if link.lost.is_none() {
                crate::warn_line!(
                    "benchfs: server {} lost ({reason}); requests to it fail until it answers a probe",
                    link.id
                );
                link.lost = Some(reason);
                link.probe = Probing {
                    next_at: Instant::now() + PROBE_FIRST,
                    ..Probing::idle()
                };
            } else {
                return;
            }
        }
        // Another client may have declared it (or others) lost for the job already.
        self.refresh_declared();
    }

    /// Workers of the server at `index`.
    pub(super) fn workers(&self, index: usize) -> usize {
        self.membership[index].ucx_addresses.len()
    }

    /// Where a chunk of a file is read from: (server index, worker index), by the file's
    /// layout; of several copies, the first whose server answers.
    pub(super) fn route(&self, attr: &Attr, chunk: u64) -> Target {
        if attr.layout.replicas <= 1 {
            return chunk_target(
                crate::chunking::FileId(attr.data_id()),
                &attr.layout,
                chunk,
                self.server_count(),
                |s| self.workers(s),
            );
        }
        let copies = self.copies(attr, chunk);
        copies
            .iter()
            .copied()
            .find(|t| !self.is_lost(t.0))
            .or_else(|| copies.first().copied())
            .unwrap_or((0, 0))
    }

    /// The (server, worker) that owns `path`'s metadata.
    pub(super) fn owner(&self, path: &str) -> Target {
        metadata_target(path, self.server_count(), self.workers(0))
    }

    /// One request to worker `target.1` of server `target.0`, within that worker's window,
    /// with a fresh request id per attempt. Idempotent requests (read, fsync, truncate, stat,
    /// readdir, directory entry removal) are retried after a timeout, with exponential backoff
    /// and full jitter; a server that times out for good, or whose transport fails, is marked
    /// lost.
    ///
    /// `ready` is when the request could have been sent (its API call's start for a batch of
    /// chunks): the wait from then to a window slot is its `window_wait_ns`.
    pub(super) async fn call(
        &self,
        target: (usize, usize),
        header: Header,
        payload: &[u8],
        dest: Option<&mut [u8]>,
        ready: Instant,
    ) -> Result<Header> {
        let retries = self.config.client.max_retries;
        self.call_retrying(target, header, payload, dest, ready, retries)
            .await
    }

    /// As [`Client::call`], with at most `retries` retries after a timeout (a read with
    /// another copy to go to retries none: the other copy is its retry).
    pub(super) async fn call_retrying(
        &self,
        target: (usize, usize),
        header: Header,
        payload: &[u8],
        mut dest: Option<&mut [u8]>,
        ready: Instant,
        retries: u32,
    ) -> Result<Header> {
        let (index, worker) = target;
        let client = &self.config.client;
        let metrics = &self.telemetry.metrics;
        let kind = OpKind::of(header.op);
        let mut ready = ready;
        let idempotent = matches!(
            header.op,
            Op::ReadChunk
                | Op::ReadHashed
                | Op::Fsync
                | Op::TruncateData
                | Op::Stat
                | Op::Readdir
                | Op::Find
                | Op::DirRemove
                // A copy applies a mirror's records only when newer than what it holds.
                | Op::Mirror
                // Taking again a lock its owner holds changes nothing.
                | Op::Lock
        );
        let mut attempt = 0u32;
        let mut busy_retries = 0u32;
        if let Err(e) = self.connect_on_use(index).await {
            self.request_failed(index, kind, &e);
            return Err(e);
        }
        let first_sent = Instant::now();
        let timeout = Duration::from_secs_f64(client.request_timeout_s);
        loop {
            let attempt_header = Header {
                request_id: self.request_id(),
                ..header
            };
            let sent;
            let result = {
                let _permit = self.windows[index][worker]
                    .acquire(client.max_inflight_per_server)
                    .await;
                sent = Instant::now();
                metrics.record_window_wait(kind, ns(sent.saturating_duration_since(ready)));
                metrics.attempt_sent(index, kind, attempt > 0 || busy_retries > 0);
                let _attempt = Attempt {
                    metrics,
                    index,
                    op: kind,
                    sent,
                };
                self.exchange(target, attempt_header, payload, dest.as_deref_mut())
                    .await
            };
            let timed_out = matches!(result, Err(Error::Timeout { .. }));
            if timed_out {
                metrics.count_timeout(index, kind);
            }
            let busy = matches!(&result, Err(Error::Remote { errno, .. }) if *errno == libc::EAGAIN);
            if busy {
                metrics.count_busy(index, kind);
            }
            match result {
                // EAGAIN is a refusal before execution: any request, writes too, may be sent
                // again, until the request's own timeout has passed since its first attempt.
                Err(_) if busy && first_sent.elapsed() < timeout => {
                    let ceiling = client.retry_backoff_ms.saturating_mul(1 << busy_retries.min(16));
                    let left = timeout.saturating_sub(first_sent.elapsed());
                    let pause = Duration::from_millis(self.jitter(ceiling)).min(left);
                    self.runtime.reactor().sleep(pause).await;
                    busy_retries += 1;
                    ready = Instant::now();
                }
                Err(Error::Timeout { .. }) if idempotent && attempt < retries => {
                    let ceiling = client.retry_backoff_ms.saturating_mul(1 << attempt.min(16));
                    let pause = Duration::from_millis(self.jitter(ceiling));
                    self.runtime.reactor().sleep(pause).await;
                    attempt += 1;
                    ready = Instant::now();
                }
                Err(e) => {
                    self.request_failed(index, kind, &e);
                    return Err(e);
                }
                Ok(reply) => {
                    let moved = match kind {
                        OpKind::Write => payload.len() as u64,
                        OpKind::Read => reply.length,
                        _ => 0,
                    };
                    metrics.count_bytes(index, kind, moved);
                    if let ReplyValue::Served { queue_us, total_us } = reply.value() {
                        self.telemetry.answered(ready, sent, queue_us, total_us);
                    }
                    return Ok(reply);
                }
            }
        }
    }

    /// Counts a request that failed for good; a lost or silent server is marked lost.
    pub(super) fn request_failed(&self, index: usize, kind: OpKind, e: &Error) {
        self.telemetry.metrics.count_error(index, kind);
        match e {
            Error::ServerLost { reason, .. } => self.mark_lost(index, reason.clone()),
            Error::Timeout { .. } => self.mark_lost(index, e.to_string()),
            _ => {}
        }
    }

    /// A uniformly random delay in `[0, ceiling]` ms (full jitter spreads retry storms).
    pub(super) fn jitter(&self, ceiling: u64) -> u64 {
        let mut x = self.rng.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.set(x);
        x % (ceiling + 1)
    }

    /// One request/reply exchange with worker `worker` of the server at `index`.
    pub(super) async fn exchange(
        &self,
        (index, worker): (usize, usize),
        header: Header,
        payload: &[u8],
        dest: Option<&mut [u8]>,
    ) -> Result<Header> {
        let server = self.membership[index].id;
        let op = header.op.name();
        let timeout = Duration::from_secs_f64(self.config.client.request_timeout_s);
        let id = header.request_id;
        let dest = dest.map(|d| Dest {
            ptr: d.as_mut_ptr(),
            len: d.len(),
        });
        self.shared.pending.borrow_mut().insert(
            id,
            PendingRpc {
                dest,
                ..Default::default()
            },
        );
        let mut guard = RpcGuard {
            shared: &self.shared,
            id,
            send: None,
            send_reads_caller: !payload.is_empty(),
        };
        {
            let links = self.links.borrow();
            let link = &links[index];
            if let Some(reason) = &link.lost {
                return Err(Error::ServerLost {
                    server: link.id,
                    reason: format!("lost earlier ({reason}); probing it"),
                });
            }
            let (Some(Link { endpoint: ep, down }), Some(&conn)) = (
                link.endpoints.get(worker).and_then(|e| e.as_ref()),
                link.conns.get(worker),
            ) else {
                return Err(Error::ServerLost {
                    server: link.id,
                    reason: "not connected".into(),
                });
            };
            if let Some(p) = self.shared.pending.borrow_mut().get_mut(&id) {
                p.down = Some(down.clone());
            }
            // SAFETY: `payload` is borrowed for this call, and the guard turns a still-running
            // send into an orphan that the public call waits for before returning.
            let header = header.with_token(self.token).on_connection(conn);
            guard.send = Some(unsafe { ep.send_am(AM_REQUEST, &header.encode(), payload, None) });
        }
        let reactor = self.runtime.reactor().clone();
        let waiting = std::cell::Cell::new("no reply");
        let exchange = async {
            let reply = WaitReply {
                shared: &self.shared,
                id,
            }
            .await;
            waiting.set("the request still sending");
            if let Some(send) = guard.send.as_mut() {
                send.await.map_err(|e| Error::ServerLost {
                    server,
                    reason: e.to_string(),
                })?;
            }
            let reply = reply.map_err(|f| match f {
                ReplyFailure::Malformed(m) => Error::Protocol(m),
                ReplyFailure::Lost(reason) => Error::ServerLost { server, reason },
            })?;
            let data = self
                .shared
                .pending
                .borrow_mut()
                .get_mut(&id)
                .and_then(|p| p.data.take());
            if let Some(data) = data {
                waiting.set("the reply's data");
                data.await.map_err(|e| Error::ServerLost {
                    server,
                    reason: e.to_string(),
                })?;
            }
            Ok(reply)
        };
        let outcome = with_timeout(&reactor, timeout, exchange).await;
        match outcome {
            Some(Ok(reply)) => {
                drop(guard);
                if reply.op != header.op {
                    return Err(Error::Protocol(format!(
                        "reply op {:?} to a {op} request",
                        reply.op
                    )));
                }
                if reply.status < 0 {
                    return Err(Error::Remote {
                        server,
                        op,
                        errno: -reply.status,
                    });
                }
                Ok(reply)
            }
            Some(Err(e)) => Err(e),
            None => Err(Error::Timeout {
                op,
                server,
                timeout_s: timeout.as_secs_f64(),
                waiting: waiting.get(),
            }),
        }
    }

    /// Sends a request that outlives the call making it (read-ahead, write-behind): its
    /// payload and its reply's destination are buffers the client owns and keeps until UCX is
    /// done with them. Not windowed and never retried here. Returns the request id its reply
    /// is matched by, and the send (which reads `payload` until it completes).
    ///
    /// # Safety
    /// `payload` and `dest` must stay valid until the send, and any receive the reply starts
    /// into `dest`, have completed (or the UCX worker is destroyed).
    pub(super) unsafe fn send_detached(
        &self,
        (index, worker): (usize, usize),
        header: Header,
        payload: &[u8],
        dest: Option<Dest>,
    ) -> Result<(u64, Request)> {
        let links = self.links.borrow();
        let link = &links[index];
        let (None, Some(Link { endpoint: ep, down }), Some(&conn)) = (
            &link.lost,
            link.endpoints.get(worker).and_then(|e| e.as_ref()),
            link.conns.get(worker),
        ) else {
            return Err(Error::ServerLost {
                server: link.id,
                reason: "lost or not connected".into(),
            });
        };
        let id = self.request_id();
        self.shared.pending.borrow_mut().insert(
            id,
            PendingRpc {
                dest,
                down: Some(down.clone()),
                detached: true,
                ..Default::default()
            },
        );
        let header = Header {
            request_id: id,
            ..header
        }
        .with_token(self.token)
        .on_connection(conn);
        // A failed send marks the endpoint down, which the reply's waiter sees.
        Ok((id, ep.send_am(AM_REQUEST, &header.encode(), payload, None)))
    }

    pub(super) fn request_id(&self) -> u64 {
        let id = self.next_request.get();
        self.next_request.set(id + 1);
        id
    }

    /// Returns once no UCX operation refers to caller memory: closes the endpoints of lost
    /// servers (UCX completes their operations with an error), waits a little, and if UCX
    /// still holds caller memory (a receive from a paused server is not cancelled by closing
    /// an endpoint), tears the UCX worker down, which ends every operation for certain, and
    /// reconnects. Bounded; never copies data and never aborts.
    pub(super) fn quiesce(&self) -> Result<()> {
        let closing: Vec<Link> = self
            .links
            .borrow_mut()
            .iter_mut()
            .filter(|l| l.lost.is_some())
            .flat_map(|l| {
                l.endpoints
                    .iter_mut()
                    .filter_map(Option::take)
                    .collect::<Vec<_>>()
            })
            .collect();
        // Forced: the operations on them must end now (the servers are dead or silent).
        for link in &closing {
            link.endpoint.abort();
        }
        drop(closing);
        let deadline = Instant::now() + RELEASE_WAIT;
        loop {
            if self.shared.orphans.borrow().iter().all(|r| r.is_done()) {
                self.shared.orphans.borrow_mut().clear();
                return Ok(());
            }
            if Instant::now() >= deadline {
                break;
            }
            self.worker.borrow().progress();
            std::thread::sleep(Duration::from_millis(1));
        }
        crate::warn_line!(
            "benchfs: UCX still held caller memory after closing the endpoints of lost servers; \
             rebuilding this client's UCX worker"
        );
        self.reset_transport()
    }

    /// Replaces the UCX worker: closes every endpoint and probe, destroys the worker (UCX then
    /// can no longer touch any memory of an operation started on it), makes a new one and
    /// reconnects to every server it was connected to and not lost (those that do not answer in
    /// time become lost).
    pub(super) fn reset_transport(&self) -> Result<()> {
        let old: Vec<Link> = self
            .links
            .borrow_mut()
            .iter_mut()
            .flat_map(|l| {
                let mut eps: Vec<Link> = l.endpoints.iter_mut().filter_map(Option::take).collect();
                if let Some((probe, _)) = l.probe.inflight.take() {
                    eps.extend(probe.endpoints);
                }
                eps
            })
            .collect();
        // Forced: the worker that owns them is destroyed next.
        for link in &old {
            link.endpoint.abort();
        }
        drop(old);
        // Read-ahead buffers UCX may still fill go only after the old worker.
        let pending = std::mem::take(&mut *self.shared.pending.borrow_mut());
        let detached = std::mem::take(&mut *self.shared.detached_orphans.borrow_mut());
        self.shared.orphans.borrow_mut().clear();
        let ahead = self.take_all_read_ahead();
        let (worker, address) = make_worker(&self.config, &self.runtime, &self.shared)?;
        // The old worker's last reference: ucp_worker_destroy runs here.
        drop(std::mem::replace(&mut *self.worker.borrow_mut(), worker));
        drop((pending, detached, ahead));
        *self.address.borrow_mut() = address;
        let live: Vec<usize> = (0..self.server_count())
            .filter(|&i| {
                let link = &self.links.borrow()[i];
                link.lost.is_none() && !link.endpoints.is_empty()
            })
            .collect();
        for (index, e) in self.connect_servers(&live, Instant::now() + RECONNECT_WAIT) {
            let reason = match e {
                Error::ServerLost { reason, .. } => reason,
                other => other.to_string(),
            };
            self.mark_lost(index, reason);
        }
        Ok(())
    }
}
