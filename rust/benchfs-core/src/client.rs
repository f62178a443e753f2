//! The client: splits byte ranges into chunks, places them on servers, and keeps at most
//! `client.max_inflight` chunk requests in flight. Every request carries a client-unique id and
//! its reply is matched by that id, so concurrent requests never take each other's replies.
//!
//! Memory safety across timeouts: request payloads and read destinations are the caller's
//! buffers, handed to UCX without copies. A request that is abandoned (timeout, or a sibling's
//! error) leaves its UCX operations in `orphans`; before any public call returns, the client
//! force-closes the endpoints of failed servers (which completes their operations with an
//! error) and waits until no UCX operation refers to the caller's memory.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::Waker;
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};

use benchfs_ucx::{AmData, AmMessage, AmVerdict, Endpoint, Request, WeakWorker, Worker};

use crate::chunking::split;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::namespace::{self, Attr, Kind};
use crate::placement::{chunk_target, metadata_target, Target};
use crate::posix::NAMESPACE_ERRNOS;
use crate::protocol::meta::{self, DirEntry, MetaRequest};
use crate::protocol::{Header, Op, AM_REPLY, AM_REQUEST};
use crate::registry::{self, RegistryEntry};
use crate::runtime::{with_timeout, Runtime};
use crate::telemetry::{unix_time_ns, ClientMetrics, OpKind, SnapshotWriter};

/// Client objects made in this process so far: the `worker` of the next one's telemetry file.
static CLIENTS_MADE: AtomicU32 = AtomicU32::new(0);

/// Nanoseconds of a duration, saturated.
fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A client's telemetry (`docs/telemetry.md`, format version 2): always-on counters, and
/// snapshots written when a public call returns once `telemetry.interval_ms` has passed, and
/// when the client is dropped. No timer and no thread: an idle client writes nothing.
struct ClientTelemetry {
    metrics: ClientMetrics,
    writer: RefCell<Option<SnapshotWriter>>,
    interval: Duration,
    last_snapshot: Cell<Instant>,
    /// Set while a public call runs, so that nested calls (read's stat) count once.
    in_call: Cell<bool>,
}

impl ClientTelemetry {
    /// Counters for `membership`, and (with `telemetry.dir` set) the file
    /// `client-<pid>-w<n>.tel`, `n` counting the Client objects of this process.
    fn new(config: &Config, membership: &[RegistryEntry]) -> Result<ClientTelemetry> {
        let t = &config.telemetry;
        let index = CLIENTS_MADE.fetch_add(1, Ordering::Relaxed);
        let targets: Vec<u32> = membership.iter().map(|e| e.id).collect();
        let writer = if t.dir.is_empty() {
            None
        } else {
            let node = std::env::var("BENCHFS_NODE_NAME")
                .ok()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(crate::server::hostname);
            Some(SnapshotWriter::create_client(
                Path::new(&t.dir),
                std::process::id(),
                index,
                &node,
                &targets,
            )?)
        };
        Ok(ClientTelemetry {
            metrics: ClientMetrics::new(targets, t.enabled),
            writer: RefCell::new(writer),
            interval: Duration::from_millis(t.interval_ms),
            last_snapshot: Cell::new(Instant::now()),
            in_call: Cell::new(false),
        })
    }

    /// Writes a snapshot if `force` or the interval has passed; reports a failure once.
    fn snapshot(&self, now: Instant, force: bool) {
        if !force && now.saturating_duration_since(self.last_snapshot.get()) < self.interval {
            return;
        }
        let mut slot = self.writer.borrow_mut();
        let Some(w) = slot.as_mut() else { return };
        self.last_snapshot.set(now);
        if let Err(e) = w.write(&self.metrics, unix_time_ns()) {
            eprintln!("benchfs: client telemetry snapshots stopped: {e}");
            *slot = None;
        }
    }
}

/// Times one public call (the outermost only) into `call_ns`, and snapshots when it returns.
struct CallGuard<'a> {
    telemetry: &'a ClientTelemetry,
    op: OpKind,
    start: Instant,
    outer: bool,
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        if !self.outer {
            return;
        }
        let t = self.telemetry;
        t.in_call.set(false);
        let now = Instant::now();
        t.metrics
            .record_call(self.op, ns(now.saturating_duration_since(self.start)));
        t.snapshot(now, false);
    }
}

/// One attempt in flight: counted when made, its `rpc_ns` recorded when it ends, however it
/// ends (reply, error, timeout, or abandoned because a sibling request failed).
struct Attempt<'a> {
    metrics: &'a ClientMetrics,
    index: usize,
    op: OpKind,
    sent: Instant,
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        self.metrics
            .attempt_done(self.index, self.op, ns(self.sent.elapsed()));
    }
}

/// An open file: its identity and layout as its owner gave them at open, and what this handle
/// wrote (reported to the owner at fsync and close: close-to-open consistency).
#[derive(Debug)]
pub struct FileHandle {
    pub path: String,
    pub attr: Attr,
    written_end: Cell<u64>,
    reported_end: Cell<u64>,
    /// The size as last seen from the owner.
    known_size: Cell<u64>,
}

impl FileHandle {
    /// The size as this handle knows it: the owner's at open (or last refresh) and its writes.
    pub fn size(&self) -> u64 {
        self.known_size.get().max(self.written_end.get())
    }

    /// Tells the handle the file is at least `size` long: what other handles of the same
    /// caller wrote and have not published (a mount shares one size among its handles). Reads
    /// are then clamped at no less; nothing is published by it.
    pub fn learn_size(&self, size: u64) {
        self.known_size.set(self.known_size.get().max(size));
    }
}

/// Where a reply's payload goes: a raw view of the caller's buffer for this request.
#[derive(Clone, Copy)]
struct Dest {
    ptr: *mut u8,
    len: usize,
}

/// Why a request ended without a usable reply.
enum ReplyFailure {
    /// The reply could not be decoded.
    Malformed(String),
    /// The connection to the server failed (UCX reported the peer gone).
    Lost(String),
}

/// Set (with UCX's reason) when an endpoint's peer fails; shared by the endpoint's failure hook
/// and the requests sent on it.
type Down = Rc<RefCell<Option<String>>>;

/// An endpoint to one server worker and its failure flag.
struct Link {
    endpoint: Endpoint,
    down: Down,
}

#[derive(Default)]
struct PendingRpc {
    /// The failure flag of the endpoint the request went out on.
    down: Option<Down>,
    reply: Option<std::result::Result<Header, ReplyFailure>>,
    dest: Option<Dest>,
    /// A rendezvous receive into `dest`, started by the reply handler.
    data: Option<Request>,
    waker: Option<Waker>,
}

struct Shared {
    pending: RefCell<HashMap<u64, PendingRpc>>,
    /// UCX operations of abandoned requests that may still touch caller memory.
    orphans: RefCell<Vec<Request>>,
    late_replies: Cell<u64>,
    malformed_replies: Cell<u64>,
}

struct ServerLink {
    id: u32,
    /// One endpoint per server worker; `None` once force-closed.
    endpoints: Vec<Option<Link>>,
    /// The connection id each server worker gave this client at hello.
    conns: Vec<u32>,
    /// Set once the server failed: requests fail at once (EHOSTDOWN) until a probe succeeds.
    lost: Option<String>,
    probe: Probing,
}

/// Probing a lost server: hellos at intervals doubling from [`PROBE_FIRST`] to [`PROBE_MAX`].
struct Probing {
    next_at: Instant,
    interval: Duration,
    /// A probe in flight: its endpoints and hello request ids, one per server worker.
    inflight: Option<(Vec<Link>, Vec<u64>, Instant)>,
}

const PROBE_FIRST: Duration = Duration::from_millis(100);
const PROBE_MAX: Duration = Duration::from_secs(5);
/// How long `quiesce` waits for UCX to release caller memory after closing endpoints, before
/// it tears the UCX worker down (which releases it for certain) and reconnects.
const RELEASE_WAIT: Duration = Duration::from_millis(500);
/// How long reconnecting after such a teardown may take per server.
const RECONNECT_WAIT: Duration = Duration::from_secs(1);

impl Probing {
    fn idle() -> Probing {
        Probing {
            next_at: Instant::now(),
            interval: PROBE_FIRST,
            inflight: None,
        }
    }
}

/// What one client saw of one server (reported by [`Client::server_stats`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ServerCounters {
    pub id: u32,
    pub requests: u64,
    pub retries: u64,
    pub timeouts: u64,
    pub failures: u64,
}

/// Bounds the requests in flight to one server worker: a FIFO of waiters for permits.
#[derive(Default)]
struct Window {
    used: Cell<u32>,
    waiters: RefCell<std::collections::VecDeque<Waker>>,
}

struct Permit<'a>(&'a Window);

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.0.used.set(self.0.used.get() - 1);
        if let Some(w) = self.0.waiters.borrow_mut().pop_front() {
            w.wake();
        }
    }
}

impl Window {
    async fn acquire(&self, limit: u32) -> Permit<'_> {
        futures::future::poll_fn(|cx| {
            if self.used.get() < limit {
                self.used.set(self.used.get() + 1);
                std::task::Poll::Ready(())
            } else {
                self.waiters.borrow_mut().push_back(cx.waker().clone());
                std::task::Poll::Pending
            }
        })
        .await;
        Permit(self)
    }
}

/// A client connected to every server of the membership. Use from one thread.
pub struct Client {
    runtime: Runtime,
    /// Replaced only by [`Client::reset_transport`].
    worker: RefCell<Worker>,
    /// This client's worker address, sent in every hello (servers connect back to it).
    address: RefCell<Rc<[u8]>>,
    links: RefCell<Vec<ServerLink>>,
    /// One window per (server, worker), indexed like `links[server].endpoints[worker]`.
    windows: Vec<Vec<Window>>,
    membership: Vec<RegistryEntry>,
    shared: Rc<Shared>,
    next_request: Cell<u64>,
    /// Jitter for retry backoff (xorshift state).
    rng: Cell<u64>,
    config: Config,
    /// Said once: this client's `layout.chunk_size` is not the servers' (only theirs applies).
    told_chunk_size: Cell<bool>,
    /// The job token every request carries.
    token: u64,
    telemetry: ClientTelemetry,
}

impl Shared {
    /// UCX reported the peer of the endpoint with flag `down` failed: requests waiting on it
    /// wake up and see the flag (if `pending` is busy now, they see it when next polled).
    fn endpoint_failed(&self, down: &Down, reason: String) {
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

    fn on_reply(&self, worker: &Worker, msg: AmMessage<'_>) -> AmVerdict {
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
struct RpcGuard<'a> {
    shared: &'a Shared,
    id: u64,
    send: Option<Request>,
    /// Whether `send` reads the caller's memory (a header-only send owns all it uses).
    send_reads_caller: bool,
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

struct WaitReply<'a> {
    shared: &'a Shared,
    id: u64,
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
fn make_worker(config: &Config, runtime: &Runtime, shared: &Rc<Shared>) -> Result<(Worker, Rc<[u8]>)> {
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
    /// Waits for the expected membership in `registry_dir`, then connects to every server.
    pub fn connect(registry_dir: &Path, config: Config) -> Result<Client> {
        config.validate()?;
        let timeout = Duration::from_secs_f64(config.cluster.connect_timeout_s);
        let membership = registry::wait_for(registry_dir, config.cluster.expected_servers, timeout)?;
        let token = registry::job_token(&registry::load_secret(registry_dir)?);
        let runtime = Runtime::new(config.storage.ring_entries.min(64))?;
        runtime
            .reactor()
            .set_spin(Duration::from_micros(config.network.spin_us));
        let shared = Rc::new(Shared {
            pending: RefCell::new(HashMap::new()),
            orphans: RefCell::new(Vec::new()),
            late_replies: Cell::new(0),
            malformed_replies: Cell::new(0),
        });
        let (worker, address) = make_worker(&config, &runtime, &shared)?;
        for (i, entry) in membership.iter().enumerate() {
            if entry.id as usize != i || entry.ucx_addresses.len() != membership[0].ucx_addresses.len() {
                return Err(Error::Config(format!(
                    "membership must be servers 0..{} with equal worker counts (server {} at position {i} has {} \
                     workers): metadata owners and layouts are numbered that way",
                    membership.len(),
                    entry.id,
                    entry.ucx_addresses.len()
                )));
            }
        }
        let windows = membership
            .iter()
            .map(|e| e.ucx_addresses.iter().map(|_| Window::default()).collect())
            .collect();
        let links = membership
            .iter()
            .map(|e| ServerLink {
                id: e.id,
                endpoints: Vec::new(),
                conns: Vec::new(),
                lost: None,
                probe: Probing::idle(),
            })
            .collect();
        let telemetry = ClientTelemetry::new(&config, &membership)?;
        let client = Client {
            runtime,
            worker: RefCell::new(worker),
            address: RefCell::new(address),
            links: RefCell::new(links),
            windows,
            membership,
            shared,
            next_request: Cell::new(1),
            rng: Cell::new(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0x9E37_79B9, |d| d.as_nanos() as u64)
                    | 1,
            ),
            config,
            told_chunk_size: Cell::new(false),
            token,
            telemetry,
        };
        let deadline = Instant::now() + timeout;
        for index in 0..client.server_count() {
            client.reconnect(index, deadline)?;
        }
        Ok(client)
    }

    /// Starts connecting to every worker of the server at `index`: endpoints, then a hello on
    /// each (retiring `retire`, this client's earlier connections there). The hellos' replies
    /// (each carrying a connection id) arrive like any other; see [`Self::hello_outcome`].
    fn start_hellos(&self, index: usize, retire: &[u32]) -> Result<(Vec<Link>, Vec<u64>)> {
        let entry = &self.membership[index];
        let worker = self.worker.borrow().clone();
        let address = self.address.borrow().clone();
        let (mut endpoints, mut ids) = (Vec::new(), Vec::new());
        for (w, server_address) in entry.addresses()?.iter().enumerate() {
            let endpoint = worker
                .connect(server_address, self.config.network.peer_error_handling)
                .map_err(|e| Error::ServerLost {
                    server: entry.id,
                    reason: format!("cannot connect: {e}"),
                })?;
            let down: Down = Rc::default();
            let (shared, flag) = (Rc::downgrade(&self.shared), down.clone());
            endpoint.on_failure(move |e| {
                if let Some(s) = shared.upgrade() {
                    s.endpoint_failed(&flag, e.to_string());
                }
            });
            let id = self.request_id();
            let old = retire.get(w).copied().unwrap_or(0);
            let header = Header::request(Op::Hello, id, 0, u64::from(old), 0, address.len() as u64)
                .with_token(self.token);
            self.shared.pending.borrow_mut().insert(
                id,
                PendingRpc {
                    down: Some(down.clone()),
                    ..Default::default()
                },
            );
            // SAFETY: the address is owned by `self.address`, replaced only after every
            // endpoint (and so every send on one) is closed.
            drop(unsafe { endpoint.send_am(AM_REQUEST, &header.encode(), &address, None) });
            endpoints.push(Link { endpoint, down });
            ids.push(id);
        }
        Ok((endpoints, ids))
    }

    /// The outcome of hellos `ids` once every one is answered or any failed: the connection
    /// ids, or why not. Their pending entries are removed then; `None` while waiting.
    fn hello_outcome(&self, ids: &[u64]) -> Option<std::result::Result<Vec<u32>, String>> {
        let mut pending = self.shared.pending.borrow_mut();
        let mut conns = Vec::with_capacity(ids.len());
        let mut failure = None;
        for id in ids {
            match pending.get(id).map(|p| &p.reply) {
                Some(Some(Ok(h))) if h.status == 0 => conns.push(h.offset as u32),
                Some(Some(Ok(h))) => {
                    failure = Some(format!(
                        "hello answered with {}",
                        std::io::Error::from_raw_os_error(-h.status)
                    ))
                }
                Some(Some(Err(ReplyFailure::Lost(r) | ReplyFailure::Malformed(r)))) => {
                    failure = Some(r.clone())
                }
                Some(None) => {
                    let down = pending.get(id).and_then(|p| p.down.as_ref());
                    match down.and_then(|d| d.borrow().clone()) {
                        Some(r) => failure = Some(r),
                        None => return None,
                    }
                }
                None => failure = Some("hello vanished".into()),
            }
        }
        for id in ids {
            pending.remove(id);
        }
        Some(failure.map_or(Ok(conns), Err))
    }

    /// (Re)connects to the server at `index`, waiting for its hellos until `deadline`.
    fn reconnect(&self, index: usize, deadline: Instant) -> Result<()> {
        let server = self.membership[index].id;
        let (endpoints, ids) = self.start_hellos(index, &[])?;
        let reactor = self.runtime.reactor().clone();
        let outcome = self.runtime.block_on(async {
            loop {
                if let Some(outcome) = self.hello_outcome(&ids) {
                    return outcome;
                }
                if Instant::now() >= deadline {
                    for id in &ids {
                        self.shared.pending.borrow_mut().remove(id);
                    }
                    return Err("no answer to hello".into());
                }
                reactor.sleep(Duration::from_millis(1)).await;
            }
        })?;
        match outcome {
            Ok(conns) => {
                self.admit(index, endpoints, conns);
                Ok(())
            }
            Err(reason) => Err(Error::ServerLost { server, reason }),
        }
    }

    /// Installs connections to the server at `index` and clears its lost state.
    fn admit(&self, index: usize, endpoints: Vec<Link>, conns: Vec<u32>) {
        let old = {
            let mut links = self.links.borrow_mut();
            let link = &mut links[index];
            link.conns = conns;
            link.probe = Probing::idle();
            if link.lost.take().is_some() {
                eprintln!("benchfs: server {} answers again: re-admitted", link.id);
            }
            std::mem::replace(&mut link.endpoints, endpoints.into_iter().map(Some).collect())
        };
        // Closing progresses UCX: done with no borrow held.
        drop(old);
    }

    /// Advances the probes of lost servers (called as each public call starts; a client has
    /// no thread of its own): starts a hello when one is due, re-admits a server on its answer.
    fn poll_probes(&self) {
        let lost: Vec<usize> = self
            .links
            .borrow()
            .iter()
            .enumerate()
            .filter(|(_, l)| l.lost.is_some())
            .map(|(i, _)| i)
            .collect();
        if lost.is_empty() {
            return;
        }
        self.worker.borrow().progress();
        let now = Instant::now();
        for index in lost {
            let inflight = self.links.borrow_mut()[index].probe.inflight.take();
            let retry = match inflight {
                Some((endpoints, ids, started)) => match self.hello_outcome(&ids) {
                    Some(Ok(conns)) => {
                        self.admit(index, endpoints, conns);
                        continue;
                    }
                    None if now.saturating_duration_since(started) < PROBE_MAX => {
                        self.links.borrow_mut()[index].probe.inflight = Some((endpoints, ids, started));
                        continue;
                    }
                    _ => {
                        for id in &ids {
                            self.shared.pending.borrow_mut().remove(id);
                        }
                        drop(endpoints);
                        true
                    }
                },
                None if now >= self.links.borrow()[index].probe.next_at => {
                    let retire = self.links.borrow()[index].conns.clone();
                    match self.start_hellos(index, &retire) {
                        Ok((endpoints, ids)) => {
                            self.links.borrow_mut()[index].probe.inflight = Some((endpoints, ids, now));
                            false
                        }
                        Err(_) => true,
                    }
                }
                None => false,
            };
            if retry {
                let mut links = self.links.borrow_mut();
                let probe = &mut links[index].probe;
                probe.next_at = now + probe.interval;
                probe.interval = (probe.interval * 2).min(PROBE_MAX);
            }
        }
    }

    /// Starts timing a public call of kind `op` (see [`CallGuard`]).
    fn telemetry_call(&self, op: OpKind) -> CallGuard<'_> {
        let outer = !self.telemetry.in_call.replace(true);
        CallGuard {
            telemetry: &self.telemetry,
            op,
            start: Instant::now(),
            outer,
        }
    }

    /// This client's telemetry counters and histograms (per target in membership order).
    pub fn telemetry(&self) -> &ClientMetrics {
        &self.telemetry.metrics
    }

    /// The servers this client uses, ordered by numeric id.
    pub fn membership(&self) -> &[RegistryEntry] {
        &self.membership
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    fn server_count(&self) -> usize {
        self.membership.len()
    }

    /// Marks the server at `index` lost: requests to it fail at once (EHOSTDOWN) until a
    /// probe gets an answer. Logged once per change of state.
    fn mark_lost(&self, index: usize, reason: String) {
        if let Some(link) = self.links.borrow_mut().get_mut(index) {
            if link.lost.is_none() {
                eprintln!(
                    "benchfs: server {} lost ({reason}); requests to it fail until it answers a probe",
                    link.id
                );
                link.lost = Some(reason);
                link.probe = Probing {
                    next_at: Instant::now() + PROBE_FIRST,
                    ..Probing::idle()
                };
            }
        }
    }

    /// Workers of the server at `index`.
    fn workers(&self, index: usize) -> usize {
        self.membership[index].ucx_addresses.len()
    }

    /// Where a chunk of a file lives: (server index, worker index), by the file's layout.
    fn route(&self, attr: &Attr, chunk: u64) -> Target {
        chunk_target(attr.id, &attr.layout, chunk, self.server_count(), |s| {
            self.workers(s)
        })
    }

    /// The (server, worker) that owns `path`'s metadata.
    fn owner(&self, path: &str) -> Target {
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
    async fn call(
        &self,
        target: (usize, usize),
        header: Header,
        payload: &[u8],
        mut dest: Option<&mut [u8]>,
        ready: Instant,
    ) -> Result<Header> {
        let (index, worker) = target;
        let client = &self.config.client;
        let metrics = &self.telemetry.metrics;
        let kind = OpKind::of(header.op);
        let mut ready = ready;
        let idempotent = matches!(
            header.op,
            Op::ReadChunk | Op::Fsync | Op::TruncateData | Op::Stat | Op::Readdir | Op::DirRemove
        );
        let mut attempt = 0u32;
        let mut busy_retries = 0u32;
        let first_sent = Instant::now();
        let timeout = Duration::from_secs_f64(client.request_timeout_s);
        loop {
            let attempt_header = Header {
                request_id: self.request_id(),
                ..header
            };
            let result = {
                let _permit = self.windows[index][worker]
                    .acquire(client.max_inflight_per_server)
                    .await;
                let sent = Instant::now();
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
                Err(Error::Timeout { .. }) if idempotent && attempt < client.max_retries => {
                    let ceiling = client.retry_backoff_ms.saturating_mul(1 << attempt.min(16));
                    let pause = Duration::from_millis(self.jitter(ceiling));
                    self.runtime.reactor().sleep(pause).await;
                    attempt += 1;
                    ready = Instant::now();
                }
                Err(e) => {
                    metrics.count_error(index, kind);
                    match &e {
                        Error::ServerLost { reason, .. } => self.mark_lost(index, reason.clone()),
                        Error::Timeout { .. } => self.mark_lost(index, e.to_string()),
                        _ => {}
                    }
                    return Err(e);
                }
                Ok(reply) => {
                    let moved = match kind {
                        OpKind::Write => payload.len() as u64,
                        OpKind::Read => reply.length,
                        _ => 0,
                    };
                    metrics.count_bytes(index, kind, moved);
                    return Ok(reply);
                }
            }
        }
    }

    /// A uniformly random delay in `[0, ceiling]` ms (full jitter spreads retry storms).
    fn jitter(&self, ceiling: u64) -> u64 {
        let mut x = self.rng.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.set(x);
        x % (ceiling + 1)
    }

    /// The id of the server that holds byte `offset` of the file at `path`.
    pub fn locate(&self, path: &str, offset: u64) -> Result<u32> {
        let _call = self.telemetry_call(OpKind::Meta);
        let attr = self.stat(path)?;
        if attr.kind != Kind::File {
            return Err(Error::Path {
                op: "locate",
                path: path.into(),
                errno: libc::EISDIR,
            });
        }
        Ok(self.membership[self.route(&attr, offset / attr.layout.chunk_size).0].id)
    }

    /// What this client saw of each server, ordered like the membership.
    pub fn server_stats(&self) -> Vec<ServerCounters> {
        let m = &self.telemetry.metrics;
        let sum = |f: &dyn Fn(OpKind) -> u64| OpKind::ALL.into_iter().map(f).sum::<u64>();
        self.membership
            .iter()
            .enumerate()
            .map(|(i, e)| ServerCounters {
                id: e.id,
                requests: sum(&|k| m.requests(i, k)),
                retries: sum(&|k| m.retries(i, k)),
                timeouts: sum(&|k| m.timeouts(i, k)),
                failures: sum(&|k| m.errors(i, k)),
            })
            .collect()
    }

    /// One request/reply exchange with worker `worker` of the server at `index`.
    async fn exchange(
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
        let exchange = async {
            let reply = WaitReply {
                shared: &self.shared,
                id,
            }
            .await;
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
            }),
        }
    }

    fn request_id(&self) -> u64 {
        let id = self.next_request.get();
        self.next_request.set(id + 1);
        id
    }

    /// Runs a public operation to completion, then makes sure no UCX operation still refers
    /// to the caller's memory.
    fn run<T>(&self, fut: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        self.poll_probes();
        let result = self.runtime.block_on(fut)?;
        self.quiesce()?;
        result
    }

    /// Returns once no UCX operation refers to caller memory: closes the endpoints of lost
    /// servers (UCX completes their operations with an error), waits a little, and if UCX
    /// still holds caller memory (a receive from a paused server is not cancelled by closing
    /// an endpoint), tears the UCX worker down, which ends every operation for certain, and
    /// reconnects. Bounded; never copies data and never aborts.
    fn quiesce(&self) -> Result<()> {
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
        eprintln!(
            "benchfs: UCX still held caller memory after closing the endpoints of lost servers; \
             rebuilding this client's UCX worker"
        );
        self.reset_transport()
    }

    /// Replaces the UCX worker: closes every endpoint and probe, destroys the worker (UCX then
    /// can no longer touch any memory of an operation started on it), makes a new one and
    /// reconnects to every server not lost (those that do not answer in time become lost).
    fn reset_transport(&self) -> Result<()> {
        let old: Vec<Link> = self
            .links
            .borrow_mut()
            .iter_mut()
            .flat_map(|l| {
                let mut eps: Vec<Link> = l.endpoints.iter_mut().filter_map(Option::take).collect();
                if let Some((probe, _, _)) = l.probe.inflight.take() {
                    eps.extend(probe);
                }
                eps
            })
            .collect();
        drop(old);
        self.shared.pending.borrow_mut().clear();
        self.shared.orphans.borrow_mut().clear();
        let (worker, address) = make_worker(&self.config, &self.runtime, &self.shared)?;
        // The old worker's last reference: ucp_worker_destroy runs here.
        drop(std::mem::replace(&mut *self.worker.borrow_mut(), worker));
        *self.address.borrow_mut() = address;
        for index in 0..self.server_count() {
            if self.links.borrow()[index].lost.is_some() {
                continue;
            }
            if let Err(e) = self.reconnect(index, Instant::now() + RECONNECT_WAIT) {
                let reason = match e {
                    Error::ServerLost { reason, .. } => reason,
                    other => other.to_string(),
                };
                self.mark_lost(index, reason);
            }
        }
        Ok(())
    }

    /// One metadata request to `path`'s owner; returns the reply header and payload. A POSIX
    /// error from the owner becomes [`Error::Path`] naming `what` and the path.
    async fn meta(&self, op: Op, what: &'static str, req: &MetaRequest) -> Result<(Header, Vec<u8>)> {
        let payload = req.encode();
        let header = Header::request(op, 0, 0, 0, 0, payload.len() as u64);
        let mut reply = vec![0u8; meta::REPLY_MAX];
        match self
            .call(
                self.owner(&req.path),
                header,
                &payload,
                Some(&mut reply[..]),
                Instant::now(),
            )
            .await
        {
            Ok(h) => {
                reply.truncate((h.length as usize).min(meta::REPLY_MAX));
                Ok((h, reply))
            }
            // Namespace errors are about the path; others (a refused token, a draining or busy
            // server) keep naming the server.
            Err(Error::Remote { errno, .. }) if NAMESPACE_ERRNOS.contains(&errno) => Err(Error::Path {
                op: what,
                path: req.path.clone(),
                errno,
            }),
            Err(e) => Err(e),
        }
    }

    async fn meta_attr(&self, op: Op, what: &'static str, req: &MetaRequest) -> Result<(Attr, u64)> {
        let (h, body) = self.meta(op, what, req).await?;
        let attr = Attr::decode(&body)
            .ok_or_else(|| Error::Protocol(format!("malformed attribute in {what} reply")))?;
        Ok((attr, h.offset))
    }

    /// Adds `name` to its parent directory's entries; Ok(true) if new. An entry of the other
    /// kind is the path's own conflict, reported as `conflict` (EISDIR for open, EEXIST for
    /// mkdir, EISDIR or ENOTDIR for rename, as POSIX has them).
    /// Returns None if the entry existed, else the stripe start for a new file.
    async fn dir_add(
        &self,
        what: &'static str,
        path: &str,
        kind: Kind,
        conflict: i32,
    ) -> Result<Option<u32>> {
        let (parent, name) = namespace::split_parent(path).ok_or_else(|| Error::Path {
            op: what,
            path: path.into(),
            errno: libc::EEXIST,
        })?;
        let mut req = MetaRequest::new(parent);
        req.name = name.into();
        req.mode = kind as u32;
        let (h, _) = self.meta(Op::DirAdd, what, &req).await.map_err(|e| match e {
            // The parent's errors are about the parent; an entry of the other kind is the
            // path's own conflict.
            Error::Path { errno, .. } => Error::Path {
                op: what,
                path: path.into(),
                errno: if errno == libc::EEXIST { conflict } else { errno },
            },
            other => other,
        })?;
        Ok(h.offset.checked_sub(1).map(|s| s as u32))
    }

    async fn dir_remove(&self, what: &'static str, path: &str) -> Result<()> {
        if let Some((parent, name)) = namespace::split_parent(path) {
            let mut req = MetaRequest::new(parent);
            req.name = name.into();
            self.meta(Op::DirRemove, what, &req).await?;
        }
        Ok(())
    }

    /// The (server, worker) pairs holding the chunks of `attr`'s bytes in `[from, to)`.
    fn data_targets(&self, attr: &Attr, from: u64, to: u64) -> Vec<(usize, usize)> {
        let cs = attr.layout.chunk_size.max(1);
        let (first, last) = (from / cs, to.div_ceil(cs));
        let stripe = attr.layout.stripe_count as usize;
        let mut targets: Vec<(usize, usize)> = if last - first > (stripe * self.workers(0) * 4) as u64 {
            (0..stripe)
                .flat_map(|s| (0..self.workers(s)).map(move |w| (s, w)))
                .collect()
        } else {
            (first..last).map(|c| self.route(attr, c)).collect()
        };
        targets.sort_unstable();
        targets.dedup();
        targets
    }

    /// Sends a header-only request about `attr`'s file to each target.
    async fn to_targets(&self, op: Op, attr: &Attr, targets: Vec<(usize, usize)>, length: u64) -> Result<()> {
        let window = self.config.client.max_inflight as usize;
        let ready = Instant::now();
        let calls = targets.into_iter().map(|t| {
            self.call(
                t,
                Header::request(op, 0, attr.id.0, 0, 0, length),
                &[],
                None,
                ready,
            )
        });
        let mut results = stream::iter(calls).buffer_unordered(window);
        while let Some(r) = results.next().await {
            r?;
        }
        Ok(())
    }

    /// Frees `attr`'s bytes at and beyond `size`, up to `old_size`, on the servers holding them.
    async fn free_data(&self, attr: &Attr, size: u64, old_size: u64) -> Result<()> {
        if old_size <= size {
            return Ok(());
        }
        let targets = self.data_targets(attr, size, old_size);
        self.to_targets(Op::TruncateData, attr, targets, size).await
    }

    fn checked(&self, what: &'static str, path: &str) -> Result<String> {
        namespace::normalize(path).map_err(|errno| Error::Path {
            op: what,
            path: path.into(),
            errno,
        })
    }

    fn check_layout(&self, path: &str, attr: &Attr) -> Result<()> {
        if attr.kind == Kind::File && attr.layout.stripe_count as usize > self.server_count() {
            return Err(Error::Protocol(format!(
                "{path} stripes over {} servers but this client knows {}",
                attr.layout.stripe_count,
                self.server_count()
            )));
        }
        Ok(())
    }

    /// The servers decide a new file's chunk size: if it is not this client's
    /// `layout.chunk_size`, the user set it where it cannot apply. Said once per client.
    fn tell_chunk_size(&self, servers: u64) {
        let mine = self.config.layout.chunk_size;
        if servers != mine && !self.told_chunk_size.replace(true) {
            eprintln!(
                "benchfs: layout.chunk_size = {mine} in this client's configuration does not \
                 apply: the servers make files with {servers}-byte chunks (set it where the \
                 servers start)"
            );
        }
    }

    /// Opens the file at `path` (flags: `meta::CREATE`, `EXCLUSIVE`, `TRUNCATE`). Creating
    /// adds the name to its parent directory first, then makes the inode at its owner.
    pub fn open(&self, path: &str, flags: u32, mode: u32) -> Result<FileHandle> {
        let _call = self.telemetry_call(OpKind::Meta);
        let path = self.checked("open", path)?;
        let attr = self.run(async {
            let start = if flags & meta::CREATE != 0 {
                self.dir_add("open", &path, Kind::File, libc::EISDIR).await?
            } else {
                None
            };
            let added = start.is_some();
            let mut req = MetaRequest::new(&path);
            req.flags = flags;
            req.mode = mode;
            req.arg = start.map_or(0, |s| s as u64 + 1);
            let (attr, old) = match self.meta_attr(Op::Create, "open", &req).await {
                Ok(r) => r,
                Err(e) => {
                    if added {
                        // Undo our half of the create; the original error is what matters.
                        let _ = self.dir_remove("open", &path).await;
                    }
                    return Err(e);
                }
            };
            self.check_layout(&path, &attr)?;
            if added {
                self.tell_chunk_size(attr.layout.chunk_size);
            }
            // Only O_TRUNC makes the size smaller than it was.
            self.free_data(&attr, attr.size, old).await?;
            Ok(attr)
        })?;
        Ok(FileHandle {
            path,
            attr,
            written_end: Cell::new(0),
            reported_end: Cell::new(0),
            known_size: Cell::new(attr.size),
        })
    }

    /// Writes `data` at `offset` of an open file; returns the bytes written.
    pub fn write(&self, file: &FileHandle, offset: u64, data: &[u8]) -> Result<usize> {
        let _call = self.telemetry_call(OpKind::Write);
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or_else(|| Error::InvalidArgument("offset + length overflows".into()))?;
        let attr = &file.attr;
        let window = self.config.client.max_inflight as usize;
        let written = self.run(async {
            let ready = Instant::now();
            let calls = split(offset, data.len() as u64, attr.layout.chunk_size).map(|p| {
                let header = Header::request(Op::WriteChunk, 0, attr.id.0, p.chunk, p.offset, p.len);
                let part = &data[p.buf_offset as usize..(p.buf_offset + p.len) as usize];
                self.call(self.route(attr, p.chunk), header, part, None, ready)
            });
            let mut results = stream::iter(calls).buffer_unordered(window);
            let mut written = 0u64;
            while let Some(r) = results.next().await {
                written += r?.length;
            }
            Ok(written as usize)
        })?;
        if !data.is_empty() {
            file.written_end.set(file.written_end.get().max(end));
        }
        Ok(written)
    }

    /// Reads into `buf` from `offset`; returns the bytes read, short only at the end of the
    /// file. Holes inside the file read as zeros. The size is the one seen at open plus this
    /// handle's writes (close-to-open); a read reaching past it asks the owner once more.
    pub fn read(&self, file: &FileHandle, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let _call = self.telemetry_call(OpKind::Read);
        let mut size = file.size();
        let want_end = offset.saturating_add(buf.len() as u64);
        if want_end > size {
            let attr = self.stat(&file.path)?;
            if attr.id == file.attr.id {
                file.known_size.set(file.known_size.get().max(attr.size));
                size = file.size();
            }
        }
        let n = size.saturating_sub(offset).min(buf.len() as u64) as usize;
        let attr = &file.attr;
        let window = self.config.client.max_inflight as usize;
        let pieces: Vec<_> = split(offset, n as u64, attr.layout.chunk_size).collect();
        self.run(async {
            let ready = Instant::now();
            let mut rest = &mut buf[..n];
            let mut calls = Vec::with_capacity(pieces.len());
            for p in &pieces {
                let (head, tail) = std::mem::take(&mut rest).split_at_mut(p.len as usize);
                rest = tail;
                let header = Header::request(Op::ReadChunk, 0, attr.id.0, p.chunk, p.offset, p.len);
                calls.push(async move {
                    let reply = self
                        .call(self.route(attr, p.chunk), header, &[], Some(&mut *head), ready)
                        .await?;
                    let got = (reply.length as usize).min(head.len());
                    // Never-written ranges inside the size are holes.
                    head[got..].fill(0);
                    Ok::<(), Error>(())
                });
            }
            let mut results = stream::iter(calls).buffer_unordered(window);
            while let Some(r) = results.next().await {
                r?;
            }
            Ok(())
        })?;
        Ok(n)
    }

    /// Reports this handle's largest written end to the owner (the size is the largest end
    /// any writer reported).
    fn report_size(&self, file: &FileHandle) -> Result<()> {
        let end = file.written_end.get();
        if end <= file.reported_end.get() {
            return Ok(());
        }
        let mut req = MetaRequest::new(&file.path);
        req.arg = end;
        let (attr, _) = self.run(self.meta_attr(Op::SetSize, "close", &req))?;
        file.reported_end.set(end);
        file.known_size.set(file.known_size.get().max(attr.size));
        Ok(())
    }

    /// Makes this file's bytes durable on the servers holding them, then reports its size.
    pub fn fsync(&self, file: &FileHandle) -> Result<()> {
        let _call = self.telemetry_call(OpKind::Fsync);
        let targets = self.data_targets(&file.attr, 0, file.size());
        self.run(self.to_targets(Op::Fsync, &file.attr, targets, 0))?;
        self.report_size(file)
    }

    /// Publishes what this handle wrote (its size) so that later opens see it.
    pub fn close(&self, file: &FileHandle) -> Result<()> {
        let _call = self.telemetry_call(OpKind::Meta);
        self.report_size(file)
    }

    pub fn stat(&self, path: &str) -> Result<Attr> {
        let _call = self.telemetry_call(OpKind::Meta);
        let path = self.checked("stat", path)?;
        self.run(async {
            Ok(self
                .meta_attr(Op::Stat, "stat", &MetaRequest::new(&path))
                .await?
                .0)
        })
    }

    /// Removes a file: its inode, its chunks on every server holding them, its entry.
    pub fn unlink(&self, path: &str) -> Result<()> {
        let _call = self.telemetry_call(OpKind::Meta);
        let path = self.checked("unlink", path)?;
        self.run(async {
            let (attr, _) = self
                .meta_attr(Op::Unlink, "unlink", &MetaRequest::new(&path))
                .await?;
            self.check_layout(&path, &attr)?;
            self.free_data(&attr, 0, attr.size).await?;
            self.dir_remove("unlink", &path).await
        })
    }

    pub fn mkdir(&self, path: &str, mode: u32) -> Result<()> {
        let _call = self.telemetry_call(OpKind::Meta);
        let path = self.checked("mkdir", path)?;
        self.run(async {
            let added = self
                .dir_add("mkdir", &path, Kind::Dir, libc::EEXIST)
                .await?
                .is_some();
            let mut req = MetaRequest::new(&path);
            req.mode = mode;
            match self.meta(Op::Mkdir, "mkdir", &req).await {
                Ok(_) => Ok(()),
                Err(e) => {
                    if added {
                        let _ = self.dir_remove("mkdir", &path).await;
                    }
                    Err(e)
                }
            }
        })
    }

    pub fn rmdir(&self, path: &str) -> Result<()> {
        let _call = self.telemetry_call(OpKind::Meta);
        let path = self.checked("rmdir", path)?;
        self.run(async {
            self.meta(Op::Rmdir, "rmdir", &MetaRequest::new(&path)).await?;
            self.dir_remove("rmdir", &path).await
        })
    }

    /// Every entry of a directory, in name order (one owner answers, a page at a time).
    pub fn readdir(&self, path: &str) -> Result<Vec<DirEntry>> {
        let _call = self.telemetry_call(OpKind::Meta);
        let path = self.checked("readdir", path)?;
        self.run(async {
            let mut all = Vec::new();
            loop {
                let mut req = MetaRequest::new(&path);
                req.arg = meta::READDIR_PAGE as u64;
                req.name = all.last().map(|e: &DirEntry| e.name.clone()).unwrap_or_default();
                let (h, body) = self.meta(Op::Readdir, "readdir", &req).await?;
                let page = meta::decode_entries(&body)
                    .ok_or_else(|| Error::Protocol("malformed readdir reply".into()))?;
                let done = h.offset == 0 || page.is_empty();
                all.extend(page);
                if done {
                    return Ok(all);
                }
            }
        })
    }

    /// Renames within the file system; data never moves (the file keeps its id and layout).
    /// A file replaces a file, a directory an empty directory. Non-empty directories are
    /// refused with EXDEV (their children's inodes are keyed by path), which `mv` handles.
    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.rename_with(from, to, 0)
    }

    /// [`Self::rename`] with `flags`: [`meta::NO_REPLACE`] fails with EEXIST if `to`
    /// exists, decided by `to`'s owner in the same step that installs it (atomic, like
    /// `renameat2(RENAME_NOREPLACE)`).
    pub fn rename_with(&self, from: &str, to: &str, flags: u32) -> Result<()> {
        let _call = self.telemetry_call(OpKind::Meta);
        let from = self.checked("rename", from)?;
        let to = self.checked("rename", to)?;
        let fail = |errno| Error::Path {
            op: "rename",
            path: from.clone(),
            errno,
        };
        if from == "/" || to == "/" {
            return Err(fail(libc::EBUSY));
        }
        if to.starts_with(&format!("{from}/")) {
            return Err(fail(libc::EINVAL));
        }
        self.run(async {
            let (attr, _) = self
                .meta_attr(Op::Stat, "rename", &MetaRequest::new(&from))
                .await?;
            if from == to {
                return Ok(());
            }
            if attr.kind == Kind::Dir {
                let mut req = MetaRequest::new(&from);
                req.arg = 1;
                let (_, body) = self.meta(Op::Readdir, "rename", &req).await?;
                if !body.is_empty() {
                    return Err(fail(libc::EXDEV));
                }
            }
            let conflict = if attr.kind == Kind::File {
                libc::EISDIR
            } else {
                libc::ENOTDIR
            };
            let added = self.dir_add("rename", &to, attr.kind, conflict).await?.is_some();
            let mut req = MetaRequest::new(&to);
            req.attr = Some(attr);
            req.flags = flags & meta::NO_REPLACE;
            let replaced = match self.meta(Op::Install, "rename", &req).await {
                Ok((_, replaced)) => replaced,
                Err(e) => {
                    // An entry this rename added names nothing if the install never happened;
                    // a path error means an object is at `to` (created meanwhile): its entry.
                    if added && !matches!(e, Error::Path { .. }) {
                        let _ = self.dir_remove("rename", &to).await;
                    }
                    return Err(e);
                }
            };
            let old = MetaRequest::new(&from);
            if attr.kind == Kind::Dir {
                self.meta(Op::Rmdir, "rename", &old).await?;
            } else {
                self.meta(Op::Unlink, "rename", &old).await?;
            }
            self.dir_remove("rename", &from).await?;
            if let Some(gone) = Attr::decode(&replaced) {
                if gone.kind == Kind::File && gone.id != attr.id {
                    self.free_data(&gone, 0, gone.size).await?;
                }
            }
            Ok(())
        })
    }

    /// Sets a file's size; shrinking frees the chunks beyond it on their servers.
    pub fn truncate(&self, path: &str, size: u64) -> Result<()> {
        let _call = self.telemetry_call(OpKind::Meta);
        let path = self.checked("truncate", path)?;
        self.run(async {
            let mut req = MetaRequest::new(&path);
            req.arg = size;
            req.flags = 1;
            let (attr, old) = self.meta_attr(Op::SetSize, "truncate", &req).await?;
            self.check_layout(&path, &attr)?;
            self.free_data(&attr, size, old).await
        })
    }

    /// Truncates an open file (`ftruncate`): sets the size at the owner and makes the handle
    /// agree, forgetting its own writes beyond the new size (a later close must not regrow it).
    /// The handle's writes are published first, so the owner frees every chunk they made.
    pub fn ftruncate(&self, file: &FileHandle, size: u64) -> Result<()> {
        self.report_size(file)?;
        self.truncate(&file.path, size)?;
        file.written_end.set(file.written_end.get().min(size));
        file.reported_end.set(file.reported_end.get().min(size));
        file.known_size.set(size);
        Ok(())
    }

    /// Replies that arrived after their request was abandoned, and undecodable replies.
    pub fn reply_anomalies(&self) -> (u64, u64) {
        (
            self.shared.late_replies.get(),
            self.shared.malformed_replies.get(),
        )
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // The last snapshot: everything this client did.
        self.telemetry.snapshot(Instant::now(), true);
        // Close endpoints (forcibly, bounded) before the worker goes away.
        self.links.borrow_mut().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::{ServerHandle, ServerOptions};

    /// The last resort of `quiesce` (a UCX worker rebuilt because UCX kept caller memory after
    /// the endpoints of a lost server were closed) leaves a client that works: new worker, new
    /// connections to every server, data intact.
    #[test]
    fn a_rebuilt_transport_reconnects_and_serves() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let mut config = Config::default();
        config.cluster.expected_servers = 2;
        config.layout.chunk_size = 64 * 1024;
        config.storage.buffer_count = 8;
        let servers = (0..2)
            .map(|id| {
                ServerHandle::spawn(ServerOptions {
                    id,
                    node: format!("node-{id}"),
                    data_dir: dir.path().join(format!("data-{id}")),
                    registry_dir: dir.path().join("registry"),
                    config: config.clone(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let client = Client::connect(&dir.path().join("registry"), config)?;
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let f = client.open("/kept", meta::CREATE, 0o644)?;
        assert_eq!(client.write(&f, 0, &data)?, data.len());
        let old_address = client.address.borrow().clone();
        let old_conns: Vec<Vec<u32>> = client.links.borrow().iter().map(|l| l.conns.clone()).collect();

        client.reset_transport()?;

        assert_ne!(
            *client.address.borrow(),
            old_address,
            "the worker was not replaced"
        );
        let links = client.links.borrow();
        assert!(links
            .iter()
            .all(|l| l.lost.is_none() && l.endpoints.iter().all(Option::is_some)));
        let new_conns: Vec<Vec<u32>> = links.iter().map(|l| l.conns.clone()).collect();
        assert_ne!(new_conns, old_conns, "the servers did not open new connections");
        drop(links);
        let mut back = vec![0u8; data.len()];
        assert_eq!(client.read(&f, 0, &mut back)?, data.len());
        assert_eq!(back, data);
        client.close(&f)?;
        drop(client);
        drop(servers);
        Ok(())
    }
}
