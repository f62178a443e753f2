//! The chunk server: receives requests as UCX active messages, queues them (bounded), serves
//! them with a fixed set of service tasks over the io_uring chunk store, and replies.
//!
//! Bounds: at most `server.max_in_service` requests are served at once (one task each, spawned
//! once at start), at most `server.max_queued` wait; beyond that a request is refused with
//! EAGAIN. Rendezvous payloads stay at the client until a pool buffer is free to receive them.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use benchfs_ucx::{AmData, AmMessage, AmVerdict, Endpoint, RndvDesc, Worker};

use crate::buffer::{io_buffer_size, BufferPool, IoBuffer, ALIGN};
use crate::chunking::FileId;
use crate::config::{Config, Durability};
use crate::error::{Error, Result};
use crate::locktable::{LockTable, Waiting};
use crate::metadata_copies::CopyKeeper;
use crate::namespace::{self, Kind, MetaStore, SizeUpdate};
use crate::protocol::capacity::Capacity;
use crate::protocol::lock;
use crate::protocol::meta::{self, MetaRequest};
use crate::protocol::mirror;
use crate::protocol::{check_request, is_server_fault, Header, Op, ReplyValue, AM_REPLY, AM_REQUEST};
use crate::registry::{self, RegistryEntry};
use crate::runtime::{with_timeout, Notifier, Reactor, Runtime};
use crate::storage::ChunkStore;
use crate::telemetry::{
    unix_time_ns, OpKind, SnapshotWriter, TraceRecord, TraceRing, TraceWriter, WorkerMetrics,
    TRACE_FLAG_ERROR,
};

/// Connections a server worker keeps open back to clients; hellos beyond it are not answered
/// (the table is bounded like every queue; a connection is dropped when its client fails).
const MAX_CONNECTIONS: usize = 65_536;

/// Hellos waiting for the greeter task of one worker (clients greet again after 2 s).
const MAX_PENDING_HELLOS: usize = 4_096;

/// How long a stopping server waits for accepted requests and in-flight I/O.
/// Zeros hashed for the never-written bytes of a checksum's range.
static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Who this server is and where it keeps things.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub id: u32,
    pub node: String,
    /// The failure domain this server is in (empty: its node): copies of a chunk go to
    /// servers of distinct domains.
    pub domain: String,
    pub data_dir: PathBuf,
    pub registry_dir: PathBuf,
    pub config: Config,
}

/// A summary of a server's telemetry counters, reported when it stops (zeros when
/// `telemetry.enabled` is false).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ServerStats {
    pub requests: u64,
    pub bytes_written: u64,
    pub bytes_read: u64,
    pub errors: u64,
    pub rejected_busy: u64,
    pub malformed: u64,
    pub refused_auth: u64,
    pub buffer_waits: u64,
}

impl ServerStats {
    fn from_metrics(m: &WorkerMetrics) -> ServerStats {
        ServerStats {
            requests: OpKind::ALL.iter().map(|&k| m.ops(k)).sum(),
            bytes_written: m.bytes(OpKind::Write),
            bytes_read: m.bytes(OpKind::Read),
            errors: OpKind::ALL.iter().map(|&k| m.errors(k)).sum(),
            rejected_busy: m.rejected_busy(),
            malformed: m.malformed(),
            refused_auth: m.refused_auth(),
            buffer_waits: m.pool_waits(),
        }
    }

    /// Adds another worker's counters.
    pub fn add(&mut self, o: &ServerStats) {
        self.requests += o.requests;
        self.bytes_written += o.bytes_written;
        self.bytes_read += o.bytes_read;
        self.errors += o.errors;
        self.rejected_busy += o.rejected_busy;
        self.malformed += o.malformed;
        self.refused_auth += o.refused_auth;
        self.buffer_waits += o.buffer_waits;
    }
}

enum Payload {
    None,
    Eager(Vec<u8>),
    Rendezvous(RndvDesc),
}

struct Incoming {
    header: Header,
    payload: Payload,
    /// The connection the reply goes back on.
    conn: Rc<Endpoint>,
    /// When the request arrived (queue wait and total time start here).
    arrived: Instant,
}

/// What running a request gave: its status (0 or -errno), its byte count, the data a read
/// returns (its buffer and where the data starts in it) or a metadata reply (its value and
/// body), and when the storage operation started (queue wait ends there).
#[derive(Default)]
struct Served {
    status: i32,
    count: u64,
    data: Option<(IoBuffer, usize)>,
    meta: Option<(ReplyValue, Vec<u8>)>,
    device_start: Option<Instant>,
    /// Answered later (a lock request waiting for its lock): no reply now.
    deferred: bool,
    /// With copies of the metadata: the sequence number and length of the changes the
    /// metadata reply ends with (the reply's `file_id` carries them with the record's epoch).
    changes: Option<(u64, u64)>,
}

/// What a waiting lock request's answer needs: its header and its client's connection.
type LockAnswer = (Header, Rc<Endpoint>);

/// The bounded wait queue between the UCX handler and the service tasks.
struct RequestQueue {
    items: RefCell<VecDeque<Incoming>>,
    waiters: RefCell<VecDeque<Waker>>,
    capacity: usize,
}

impl RequestQueue {
    /// Queues `item`; `None` (and `item` dropped) when the queue is full.
    fn push(&self, item: Incoming) -> Option<usize> {
        let mut items = self.items.borrow_mut();
        if items.len() >= self.capacity {
            return None;
        }
        items.push_back(item);
        let depth = items.len();
        drop(items);
        if let Some(w) = self.waiters.borrow_mut().pop_front() {
            w.wake();
        }
        Some(depth)
    }

    fn pop(self: &Rc<Self>) -> PopRequest {
        PopRequest { queue: self.clone() }
    }
}

struct PopRequest {
    queue: Rc<RequestQueue>,
}

impl Future for PopRequest {
    type Output = Incoming;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Incoming> {
        match self.queue.items.borrow_mut().pop_front() {
            Some(item) => Poll::Ready(item),
            None => {
                self.queue.waiters.borrow_mut().push_back(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// The connections this worker opened back to its clients (one per client hello), by id.
///
/// UCX's own reply endpoints die with their peer, unannounced; these are ours: a client's
/// death is reported through the endpoint's failure hook, and the endpoint is closed only
/// here, outside UCX callbacks, once no request still holds it.
#[derive(Default)]
struct Connections {
    open: RefCell<std::collections::HashMap<u32, Rc<Endpoint>>>,
    /// The connection opened for each greeting (a hash of the client's worker address, and the
    /// greeting its hellos carry), so that a hello sent again is answered with the same one.
    greeted: RefCell<std::collections::HashMap<(u64, u64), u32>>,
    /// The greeting of each connection opened for one (to forget it with the connection).
    greeting_of: RefCell<std::collections::HashMap<u32, (u64, u64)>>,
    next_id: Cell<u32>,
    /// Connections to drop (failed, retired or timed out), filled from UCX callbacks.
    closing: RefCell<Vec<u32>>,
    reaper: Cell<Option<Waker>>,
    /// Set once the "too many connections" line was logged.
    full_logged: Cell<bool>,
    /// Hellos received (their header and the client's worker address), answered by the
    /// greeter task outside UCX callbacks; at most [`MAX_PENDING_HELLOS`].
    hellos: RefCell<VecDeque<(Header, Vec<u8>)>>,
    greeter: Cell<Option<Waker>>,
}

impl Connections {
    fn get(&self, id: u32) -> Option<Rc<Endpoint>> {
        self.open.borrow().get(&id).filter(|c| !c.is_down()).cloned()
    }

    /// Schedules connection `id` to be dropped by the reaper task.
    fn retire(&self, id: u32) {
        self.closing.borrow_mut().push(id);
        if let Some(w) = self.reaper.take() {
            w.wake();
        }
    }

    /// Takes the connections to drop, with their ids; the caller drops them outside any UCX
    /// callback.
    fn take_closing(&self) -> Vec<(u32, Rc<Endpoint>)> {
        let ids = std::mem::take(&mut *self.closing.borrow_mut());
        let mut open = self.open.borrow_mut();
        let (mut greeted, mut greeting_of) = (self.greeted.borrow_mut(), self.greeting_of.borrow_mut());
        for id in &ids {
            if let Some(key) = greeting_of.remove(id) {
                greeted.remove(&key);
            }
        }
        ids.into_iter()
            .filter_map(|id| Some((id, open.remove(&id)?)))
            .collect()
    }

    /// Queues a hello for the greeter task (called from the UCX handler); a hello beyond
    /// [`MAX_PENDING_HELLOS`] is dropped, and its client greets again.
    fn queue_hello(&self, header: Header, address: Vec<u8>, metrics: &WorkerMetrics) {
        let mut hellos = self.hellos.borrow_mut();
        if hellos.len() >= MAX_PENDING_HELLOS {
            metrics.count_undelivered();
            return;
        }
        hellos.push_back((header, address));
        if let Some(w) = self.greeter.take() {
            w.wake();
        }
    }

    /// The open connection made for `greeting`, if any (and not failed).
    fn greeted(&self, greeting: (u64, u64)) -> Option<(u32, Rc<Endpoint>)> {
        let id = *self.greeted.borrow().get(&greeting)?;
        Some((id, self.get(id)?))
    }
}

/// Waits until a connection is scheduled for closing.
struct ClosingWait<'a>(&'a Connections);

impl Future for ClosingWait<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0.closing.borrow().is_empty() {
            self.0.reaper.set(Some(cx.waker().clone()));
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }
}

/// Waits until a hello is queued.
struct HelloWait<'a>(&'a Connections);

impl Future for HelloWait<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0.hellos.borrow().is_empty() {
            self.0.greeter.set(Some(cx.waker().clone()));
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }
}

/// Waits until woken through the lock timer's waker (a lock request started waiting).
struct LockTimerWait<'a>(&'a Cell<Option<Waker>>, bool);

impl Future for LockTimerWait<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.1 {
            return Poll::Ready(());
        }
        self.1 = true;
        self.0.set(Some(cx.waker().clone()));
        Poll::Pending
    }
}

/// Memory a UCX operation that outlived its request may still use, kept until it completes.
type Parked = (benchfs_ucx::Request, Box<dyn std::any::Any>);

struct ServerState {
    worker: Worker,
    reactor: Rc<Reactor>,
    conns: Rc<Connections>,
    parked: RefCell<Vec<Parked>>,
    /// Whether connections back to clients detect failed peers (`network.peer_error_handling`).
    peer_errors: bool,
    /// How long a reply or a payload transfer may wait on a client before its connection is
    /// dropped (`client.request_timeout_s`: the client has given up by then).
    client_timeout: std::time::Duration,
    store: ChunkStore,
    /// Where the store keeps its data (its file system's capacity is what statfs reports).
    data_dir: std::path::PathBuf,
    pool: BufferPool,
    queue: Rc<RequestQueue>,
    /// The metadata of the paths this worker owns.
    meta: RefCell<MetaStore>,
    /// With copies of the metadata (`layout.replicas` > 1): who serves which owner, and the
    /// copies of other owners this worker keeps.
    copies: Option<CopyKeeper>,
    /// `server.workers` and `cluster.expected_servers`: metadata owners are numbered by them.
    config_workers: u32,
    config_servers: u32,
    chunk_size: u64,
    metrics: Rc<WorkerMetrics>,
    /// Per-operation trace records until the next snapshot (`telemetry.trace`).
    trace: Option<TraceRing>,
    /// This worker's server id and index (named by every trace record).
    server_id: u32,
    worker_index: u16,
    /// A monotonic instant and the Unix time at that instant: converts request arrival
    /// instants to trace timestamps without a clock read per operation.
    clock_base: (Instant, u64),
    /// Set at shutdown: new requests are refused with ESHUTDOWN, accepted ones still served.
    draining: Cell<bool>,
    in_service: Cell<u32>,
    /// This job's token; requests carrying another are refused.
    token: u64,
    refusal_logged: Cell<bool>,
    /// The advisory locks of the files whose locks this worker keeps.
    locks: RefCell<LockTable<LockAnswer>>,
    /// Drawn at start: a lock reply carries it, so a client learns its locks were lost to a
    /// restart.
    lock_epoch: u32,
    /// How long a waiting lock request is held before it is answered "still waiting" (well
    /// within the client's request timeout).
    lock_hold: std::time::Duration,
    /// Wakes the task that answers lock requests that waited their hold time.
    lock_timer: Cell<Option<Waker>>,
}

/// A hash of a client's worker address (64 bits: addresses of one job's clients do not collide
/// in practice, and a collision also needs the same greeting).
fn address_hash(address: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(address)
}

/// Sends a header-only reply without waiting for it (no payload memory to keep alive).
fn reply_now(conn: &Endpoint, header: Header) {
    // SAFETY: the payload is empty and the header is copied into the request.
    drop(unsafe { conn.send_am(AM_REPLY, &header.encode(), &[], None) });
}

impl ServerState {
    fn on_message(&self, msg: AmMessage<'_>) -> AmVerdict {
        let payload_len = match &msg.data {
            AmData::Eager(d) => d.len(),
            AmData::Rendezvous(r) => r.len,
        };
        let header = match Header::decode(msg.header) {
            Ok(h) => h,
            Err(e) => {
                self.metrics.count_malformed();
                // Answer what we can: a readable request id and connection get an EPROTO reply.
                if let (Some(id), Some(conn)) = (e.request_id, e.client.and_then(|c| self.conns.get(c))) {
                    let h = Header::request(Op::WriteChunk, id, 0, 0, 0, 0).reply(-libc::EPROTO, 0);
                    reply_now(&conn, h);
                }
                return AmVerdict::Done;
            }
        };
        if header.op == Op::Hello {
            // Answered by the greeter task: no endpoint is made inside a UCX callback.
            match &msg.data {
                AmData::Eager(a) if check_request(&header, payload_len, self.chunk_size).is_ok() => {
                    self.conns.queue_hello(header, a.to_vec(), &self.metrics);
                }
                // A rendezvous hello (an address that large is not one) or a bad length:
                // there is no address to answer to.
                _ => self.metrics.count_malformed(),
            }
            return AmVerdict::Done;
        }
        let Some(conn) = self.conns.get(header.client) else {
            // No connection to answer on (never opened, or dropped after its client failed):
            // the client times out and opens a new one.
            self.metrics.count_undelivered();
            return AmVerdict::Done;
        };
        if header.token != self.token {
            self.metrics.count_refused_auth();
            if !self.refusal_logged.replace(true) {
                eprintln!(
                    "benchfs: refused a request without this job's token (op {}, request {}); \
                     further refusals are only counted (telemetry refused_auth)",
                    header.op.name(),
                    header.request_id
                );
            }
            reply_now(&conn, header.reply(-libc::EACCES, 0));
            return AmVerdict::Done;
        }
        if self.draining.get() {
            reply_now(&conn, header.reply(-libc::ESHUTDOWN, 0));
            return AmVerdict::Done;
        }
        if check_request(&header, payload_len, self.chunk_size).is_err() {
            self.metrics.count_malformed();
            reply_now(&conn, header.reply(-libc::EINVAL, 0));
            return AmVerdict::Done;
        }
        let (payload, verdict) = match msg.data {
            AmData::Eager(d) if !d.is_empty() => (Payload::Eager(d.to_vec()), AmVerdict::Done),
            AmData::Eager(_) => (Payload::None, AmVerdict::Done),
            AmData::Rendezvous(r) => (Payload::Rendezvous(r), AmVerdict::Keep),
        };
        let item = Incoming {
            header,
            payload,
            conn: conn.clone(),
            arrived: Instant::now(),
        };
        match self.queue.push(item) {
            Some(_) => verdict,
            None => {
                self.metrics.count_rejected();
                reply_now(&conn, header.reply(-libc::EAGAIN, 0));
                // Returning Done lets UCX drop an unreceived rendezvous descriptor.
                AmVerdict::Done
            }
        }
    }

    /// Opens a connection back to the client whose worker address the hello carries, and
    /// answers on it with the connection's id. Any job may say hello: the token is checked on
    /// every later request, which is answered on this connection (EACCES for another job).
    /// A hello sent again (the same address and greeting, `offset`) is answered on the
    /// connection opened for the first one.
    fn hello(&self, header: &Header, address: &[u8]) {
        let greeting = (header.offset != 0).then(|| (address_hash(address), header.offset));
        if let Some((id, conn)) = greeting.and_then(|g| self.conns.greeted(g)) {
            let reply = header
                .reply(0, 0)
                .on_connection(id)
                .with_value(ReplyValue::Connection(id));
            reply_now(&conn, reply);
            return;
        }
        if self.conns.open.borrow().len() >= MAX_CONNECTIONS {
            self.metrics.count_undelivered();
            if !self.conns.full_logged.replace(true) {
                eprintln!(
                    "benchfs: {MAX_CONNECTIONS} client connections open on one server worker; \
                     further hellos are not answered until clients go"
                );
            }
            return;
        }
        let conn = match self.worker.connect(address, self.peer_errors) {
            Ok(c) => Rc::new(c),
            Err(_) => {
                self.metrics.count_malformed();
                return;
            }
        };
        let id = self.conns.next_id.get().wrapping_add(1).max(1);
        self.conns.next_id.set(id);
        let conns = Rc::downgrade(&self.conns);
        conn.on_failure(move |_| {
            if let Some(c) = conns.upgrade() {
                c.retire(id);
            }
        });
        // Only this job's clients may retire a connection (their own earlier one); its locks
        // are the new connection's.
        if header.token == self.token && header.chunk != 0 && header.chunk <= u64::from(u32::MAX) {
            self.locks.borrow_mut().transfer(header.chunk as u32, id);
            self.conns.retire(header.chunk as u32);
        }
        let reply = header
            .reply(0, 0)
            .on_connection(id)
            .with_value(ReplyValue::Connection(id));
        reply_now(&conn, reply);
        self.conns.open.borrow_mut().insert(id, conn);
        if let Some(g) = greeting {
            self.conns.greeted.borrow_mut().insert(g, id);
            self.conns.greeting_of.borrow_mut().insert(id, g);
        }
    }

    /// Waits for `op` (a transfer between this server's memory and client `conn`) until the
    /// client has surely given up on the request: `client.request_timeout_s` and half as long
    /// again. The connection stays open: a client alive but stopped comes back to it, and a
    /// dead one is reported by UCX, which fails the operation; closing it forcibly under a live
    /// peer is what crashed UCX's TCP transport (`Endpoint::close`). `Err(Some(op))`: UCX
    /// still holds the memory, so the caller parks it with the operation.
    async fn with_client(
        &self,
        op: benchfs_ucx::Request,
    ) -> std::result::Result<usize, Option<benchfs_ucx::Request>> {
        let mut op = op;
        match with_timeout(&self.reactor, self.client_timeout * 3 / 2, &mut op).await {
            Some(r) => r.map_err(|_| None),
            None => Err(Some(op)),
        }
    }

    /// Answers the hellos the UCX handler queued, one at a time, outside UCX callbacks (an
    /// endpoint made inside one can take over a socket the progress frame still uses).
    async fn greet(self: Rc<Self>) {
        loop {
            HelloWait(&self.conns).await;
            let next = self.conns.hellos.borrow_mut().pop_front();
            if let Some((header, address)) = next {
                self.hello(&header, &address);
            }
        }
    }

    /// Keeps `owner` (memory a stuck UCX operation may still write or read) until `op`
    /// completes; the reaper task releases it then.
    fn park(&self, op: benchfs_ucx::Request, owner: Box<dyn std::any::Any>) {
        self.metrics.count_undelivered();
        self.parked.borrow_mut().push((op, owner));
        if let Some(w) = self.conns.reaper.take() {
            w.wake();
        }
    }

    /// Drops closed connections (outside UCX callbacks) and releases parked memory whose
    /// operation completed. Sleeps until woken, or polls each second while memory is parked.
    async fn reap(self: Rc<Self>) {
        loop {
            let closed = self.conns.take_closing();
            let mut granted = Vec::new();
            for (id, _) in &closed {
                self.locks.borrow_mut().drop_conn(*id, &mut granted);
            }
            self.answer_granted(granted);
            drop(closed);
            self.parked.borrow_mut().retain(|(op, _)| !op.is_done());
            if self.parked.borrow().is_empty() {
                ClosingWait(&self.conns).await;
            } else {
                let _ = with_timeout(
                    &self.reactor,
                    std::time::Duration::from_secs(1),
                    ClosingWait(&self.conns),
                )
                .await;
            }
        }
    }

    /// Serves one request: runs it, accounts for it (telemetry, trace), and replies.
    async fn serve_one(&self, req: Incoming) {
        let Incoming {
            header: h,
            payload,
            conn,
            arrived,
        } = req;
        let served = self.run(&h, payload, &conn).await;
        let time = self.account(&h, arrived, &served);
        if !served.deferred {
            self.reply(&h, &conn, served, time).await;
        }
    }

    /// Receives a rendezvous payload into `target` (memory owned by `owner`, registered as
    /// `memh` if at all). Gives `owner` back, or None if the client failed to send (the memory
    /// is parked when UCX may still write it).
    ///
    /// # Safety
    /// `target` points into `owner`'s memory and stays valid while `owner` lives.
    async unsafe fn receive<B: 'static>(
        &self,
        desc: RndvDesc,
        owner: B,
        target: *mut [u8],
        memh: Option<*const benchfs_ucx::MemHandle>,
    ) -> Option<B> {
        // SAFETY: the descriptor was kept by the handler and is used once; `target` is valid
        // while `owner` lives (the caller's contract), and `owner` lives until the receive
        // completes: returned, or parked with the stuck operation.
        let recv = unsafe { self.worker.recv_data(desc, &mut *target, memh.map(|m| &*m)) };
        match self.with_client(recv).await {
            Ok(_) => Some(owner),
            Err(stuck) => {
                if let Some(op) = stuck {
                    self.park(op, Box::new(owner));
                }
                None
            }
        }
    }

    /// Runs a request against the store or the metadata: its status, count and reply data.
    async fn run(&self, h: &Header, payload: Payload, conn: &Rc<Endpoint>) -> Served {
        let file = FileId(h.file_id);
        let len = h.length as usize;
        let errno = |e: std::io::Error| -e.raw_os_error().unwrap_or(libc::EIO);
        let mut served = Served::default();
        match h.op {
            Op::WriteChunk | Op::WriteChecked => {
                let buf = match payload {
                    Payload::Eager(v) => Some((IoBuffer::Heap(v), 0)),
                    Payload::None => Some((IoBuffer::empty(), 0)),
                    Payload::Rendezvous(desc) => {
                        let mut buf = self.pool.acquire().await;
                        // Mirror the file's alignment so direct I/O can take the aligned middle.
                        let start = (h.offset % ALIGN as u64) as usize;
                        // The registration lives in the pool, which `buf` keeps alive.
                        let memh = buf.memh().map(|m| m as *const benchfs_ucx::MemHandle);
                        let target: *mut [u8] = &mut buf.as_mut_slice(start + len)[start..];
                        // SAFETY: `target` is inside `buf`, which `receive` keeps alive.
                        unsafe { self.receive(desc, buf, target, memh) }
                            .await
                            .map(|buf| (buf, start))
                    }
                };
                match buf {
                    None => served.status = -libc::ECOMM,
                    Some(_) if len == 0 => {}
                    Some((buf, start)) => {
                        served.device_start = Some(Instant::now());
                        match self.store.write(file, h.chunk, h.offset, buf, start, len).await {
                            (Ok(n), _) => served.count = n as u64,
                            (Err(e), _) => served.status = errno(e),
                        }
                        // The write's buffer is back in the pool before the read-back takes one.
                        if h.op == Op::WriteChecked && served.status == 0 {
                            self.answer_checksum(file, h, &mut served).await;
                        }
                    }
                }
            }
            Op::ReadChunk => {
                let buf = self.pool.acquire().await;
                served.device_start = Some(Instant::now());
                match self.store.read(file, h.chunk, h.offset, buf, len).await {
                    (Ok((skip, n)), buf) => {
                        served.count = n as u64;
                        served.data = Some((buf, skip));
                    }
                    (Err(e), _) => served.status = errno(e),
                }
            }
            Op::Checksum => {
                served.device_start = Some(Instant::now());
                self.answer_checksum(file, h, &mut served).await;
            }
            Op::TruncateData => {
                served.device_start = Some(Instant::now());
                if let Err(e) = self.store.truncate(file, h.length, self.chunk_size) {
                    served.status = errno(e);
                }
            }
            Op::Fsync => {
                served.device_start = Some(Instant::now());
                if let Err(e) = self.store.fsync(file).await {
                    served.status = errno(e);
                }
            }
            Op::Lock => {
                let request = match payload {
                    Payload::Eager(v) => lock::LockRequest::decode(&v).ok(),
                    _ => None,
                };
                served.device_start = Some(Instant::now());
                match request {
                    Some(req) => self.serve_lock(h, req, conn, &mut served),
                    None => served.status = -libc::EINVAL,
                }
            }
            Op::Statfs => {
                let inodes = self.meta.borrow().len() as u64;
                match Capacity::of_dir(&self.data_dir, inodes) {
                    Ok(c) => served.meta = Some((ReplyValue::Nothing, c.encode())),
                    Err(e) => served.status = errno(e),
                }
            }
            _ => {
                let request = match payload {
                    Payload::Eager(v) => Some(v),
                    Payload::None => Some(Vec::new()),
                    Payload::Rendezvous(desc) => {
                        let mut v = vec![0u8; len];
                        let target: *mut [u8] = &mut v[..];
                        // SAFETY: `target` is `v`'s heap memory, which `receive` keeps alive
                        // (moving a Vec does not move its buffer).
                        unsafe { self.receive(desc, v, target, None) }.await
                    }
                };
                served.device_start = Some(Instant::now());
                let (status, value, body, changes) = match request {
                    Some(bytes) => self.serve_meta(h, &bytes),
                    None => (-libc::ECOMM, ReplyValue::Nothing, Vec::new(), None),
                };
                served.status = status;
                served.meta = Some((value, body));
                served.changes = changes;
            }
        }
        served
    }

    /// Answers with the xxh3-128 of the request's range of its chunk as the store reads it
    /// back (never-written bytes count as zeros, as a read gives them), or its error.
    async fn answer_checksum(&self, file: FileId, h: &Header, served: &mut Served) {
        match self
            .stored_checksum(file, h.chunk, h.offset, h.length as usize)
            .await
        {
            Ok(d) => served.meta = Some((ReplyValue::Nothing, d.to_le_bytes().to_vec())),
            Err(status) => served.status = status,
        }
    }

    async fn stored_checksum(
        &self,
        file: FileId,
        chunk: u64,
        offset: u64,
        len: usize,
    ) -> std::result::Result<u128, i32> {
        let buf = self.pool.acquire().await;
        match self.store.read(file, chunk, offset, buf, len).await {
            (Ok((skip, n)), buf) => {
                let stored = &buf.as_slice(skip + n)[skip..];
                if n == len {
                    // One pass over one slice: faster than the streaming state.
                    return Ok(xxhash_rust::xxh3::xxh3_128(stored));
                }
                let mut hash = xxhash_rust::xxh3::Xxh3::new();
                hash.update(stored);
                let mut left = len - n;
                while left > 0 {
                    let zeros = left.min(ZEROS.len());
                    hash.update(&ZEROS[..zeros]);
                    left -= zeros;
                }
                Ok(hash.digest128())
            }
            (Err(e), _) => Err(-e.raw_os_error().unwrap_or(libc::EIO)),
        }
    }

    /// A lock request: answered at once, or (one that waits and conflicts) queued and answered
    /// when granted or after the hold time.
    fn serve_lock(&self, h: &Header, req: lock::LockRequest, conn: &Rc<Endpoint>, served: &mut Served) {
        use lock::{LockCmd, LockState};
        let answer = |state: LockState| ReplyValue::Lock {
            state,
            epoch: self.lock_epoch,
        };
        let mut granted = Vec::new();
        let mut locks = self.locks.borrow_mut();
        let outcome = match req.cmd {
            LockCmd::Get => Ok(match locks.test(h.file_id, &req) {
                Some(held) => (answer(LockState::Conflict), held.as_request(&req).encode()),
                None => (answer(LockState::Free), Vec::new()),
            }),
            LockCmd::Release => {
                locks.release(h.file_id, req.owner, req.class, &mut granted);
                Ok((answer(LockState::Granted), Vec::new()))
            }
            LockCmd::Set | LockCmd::SetWait => match locks.set(h.file_id, &req, h.client, &mut granted) {
                Ok(None) => Ok((answer(LockState::Granted), Vec::new())),
                Ok(Some(_)) if req.cmd == LockCmd::SetWait => {
                    let deadline = Instant::now() + self.lock_hold;
                    match locks.wait(h.file_id, req, h.client, deadline, (*h, conn.clone())) {
                        Ok(()) => {
                            served.deferred = true;
                            if let Some(w) = self.lock_timer.take() {
                                w.wake();
                            }
                            return;
                        }
                        Err(errno) => Err(errno),
                    }
                }
                Ok(Some(held)) => Ok((answer(LockState::Conflict), held.as_request(&req).encode())),
                Err(errno) => Err(errno),
            },
        };
        drop(locks);
        match outcome {
            Ok(meta) => served.meta = Some(meta),
            Err(errno) => served.status = -errno,
        }
        self.answer_granted(granted);
    }

    /// Answers lock requests that waited and are now granted.
    fn answer_granted(&self, granted: Vec<Waiting<LockAnswer>>) {
        self.answer_waiting(granted, lock::LockState::Granted);
    }

    /// Answers lock requests that waited, each with `state`.
    fn answer_waiting(&self, waited: Vec<Waiting<LockAnswer>>, state: lock::LockState) {
        let value = ReplyValue::Lock {
            state,
            epoch: self.lock_epoch,
        };
        for w in waited {
            let (h, conn) = w.answer;
            reply_now(&conn, h.reply(0, 0).with_value(value));
        }
    }

    /// Answers "still waiting" to lock requests held their hold time; sleeps until the next
    /// one's deadline, or until a request starts waiting.
    async fn expire_locks(self: Rc<Self>) {
        loop {
            let expired = self.locks.borrow_mut().expired(Instant::now());
            self.answer_waiting(expired, lock::LockState::Waiting);
            let next = self.locks.borrow().next_deadline();
            let woken = LockTimerWait(&self.lock_timer, false);
            match next {
                Some(at) => {
                    let _ = with_timeout(&self.reactor, at.saturating_duration_since(Instant::now()), woken)
                        .await;
                }
                None => woken.await,
            }
        }
    }

    /// Records a served request in the worker's telemetry and (with `telemetry.trace`) its
    /// trace ring. Returns its time here, as data replies carry it.
    fn account(&self, h: &Header, arrived: Instant, served: &Served) -> ReplyValue {
        let done = Instant::now();
        let started = served.device_start.unwrap_or(done);
        let ns = |d: std::time::Duration| d.as_nanos() as u64;
        let kind = OpKind::of(h.op);
        let moved = if matches!(h.op, Op::WriteChunk | Op::WriteChecked | Op::ReadChunk) {
            served.count
        } else {
            0
        };
        // Device time starts when the operation is handed to the store.
        let (queue_ns, device_ns, total_ns) = (
            ns(started.saturating_duration_since(arrived)),
            ns(done.saturating_duration_since(started)),
            ns(done.saturating_duration_since(arrived)),
        );
        let ok = !is_server_fault(served.status);
        self.metrics
            .record_op(kind, queue_ns, device_ns, total_ns, moved, ok);
        if let Some(ring) = &self.trace {
            let (base, base_unix) = self.clock_base;
            let record = TraceRecord {
                t_ns: base_unix.wrapping_add(ns(arrived.saturating_duration_since(base))),
                queue_ns,
                device_ns,
                total_ns,
                file: h.file_id,
                chunk: h.chunk,
                bytes: moved,
                server: self.server_id,
                worker: self.worker_index,
                op: kind as u8,
                flags: if ok { 0 } else { TRACE_FLAG_ERROR },
            };
            if !ring.push(&record) {
                self.metrics.count_trace_dropped();
            }
        }
        let us = |ns: u64| u32::try_from(ns / 1000).unwrap_or(u32::MAX);
        ReplyValue::Served {
            queue_us: us(queue_ns),
            total_us: us(total_ns),
        }
    }

    /// Sends the reply: the header (a data reply carrying `time`, the server's time for it),
    /// then read data or a metadata body as its payload.
    async fn reply(&self, h: &Header, conn: &Endpoint, served: Served, time: ReplyValue) {
        let Served {
            status,
            count,
            data,
            meta,
            changes,
            ..
        } = served;
        let data_op = matches!(h.op, Op::WriteChunk | Op::WriteChecked | Op::ReadChunk);
        let mut reply = match &meta {
            // A checked write's hash: a data reply all the same (the server's time with it).
            Some((_, body)) if data_op => h.reply(status, body.len() as u64).with_value(time),
            Some((value, body)) => h.reply(status, body.len() as u64).with_value(*value),
            None if data_op => h.reply(status, count).with_value(time),
            None => h.reply(status, count),
        };
        if let (Some((seq, len)), Some(copies)) = (changes, &self.copies) {
            reply.file_id = ((copies.epoch() as u128) << 64) | seq as u128;
            reply.chunk = len;
        }
        let payload: &[u8] = match (&data, &meta) {
            (Some((buf, skip)), _) => &buf.as_slice(skip + count as usize)[*skip..],
            (None, Some((_, body))) => body,
            _ => &[],
        };
        let memh = data.as_ref().and_then(|(buf, _)| buf.memh());
        // SAFETY: `data` (the payload's owner) lives until the send completes, or is parked
        // with it below.
        let sent = unsafe { conn.send_am(AM_REPLY, &reply.encode(), payload, memh) };
        // A reply that cannot be sent means the client is gone; it will not read the result.
        match self.with_client(sent).await {
            Ok(_) => {}
            Err(None) => self.metrics.count_undelivered(),
            Err(Some(op)) => self.park(op, Box::new((data, meta))),
        }
    }

    /// Serves a metadata op: (status, reply value, reply payload, and with copies of the
    /// metadata the sequence number and length of the changes the payload ends with).
    fn serve_meta(&self, h: &Header, bytes: &[u8]) -> (i32, ReplyValue, Vec<u8>, Option<(u64, u64)>) {
        let refused = |errno: i32| (-errno, ReplyValue::Nothing, Vec::new(), None);
        let Some(copies) = &self.copies else {
            let (status, value, body) = self.meta_op(&mut self.meta.borrow_mut(), h.op, bytes);
            return (status, value, body, None);
        };
        let workers = self.owners_per_server();
        let own = self.own_owner();
        // `chunk`: 1 + the owner the request is for (0: this worker's own).
        let owner = match h.chunk.checked_sub(1).map(u32::try_from) {
            None => own,
            Some(Ok(o)) if o % workers == self.worker_index as u32 && o / workers < self.servers() => o,
            Some(_) => return refused(libc::EINVAL),
        };
        if h.op == Op::Mirror {
            return match self.apply_mirror(copies, owner, bytes) {
                Ok(()) => (0, ReplyValue::Nothing, Vec::new(), Some((0, 0))),
                Err(errno) => refused(errno),
            };
        }
        let checked = copies.check_serving(owner);
        self.wipe_own(copies.take_wipe_own());
        if let Err(errno) = checked {
            return refused(errno);
        }
        if h.op == Op::Snapshot {
            let after = String::from_utf8_lossy(bytes);
            let page = |m: &mut MetaStore| {
                let (records, last, more) = m.snapshot_page(&after, meta::REPLY_MAX / 2);
                let body = mirror::encode_snapshot(&last, &records);
                Ok((0, ReplyValue::MoreFollows(more), body, Some((0, 0))))
            };
            let served = if owner == own {
                page(&mut self.meta.borrow_mut())
            } else {
                copies.with_store(owner, page)
            };
            return served.unwrap_or_else(refused);
        }
        let serve = |meta: &mut MetaStore| {
            let (status, value, mut body) = self.meta_op(meta, h.op, bytes);
            let (seq, changes) = meta.take_changes().unwrap_or_default();
            body.extend_from_slice(&changes);
            Ok((status, value, body, Some((seq, changes.len() as u64))))
        };
        let served = if owner == own {
            serve(&mut self.meta.borrow_mut())
        } else {
            copies.with_store(owner, serve)
        };
        served.unwrap_or_else(refused)
    }

    /// Applies a mirror (the changes the server serving `owner` made) to this worker's copy.
    fn apply_mirror(&self, copies: &CopyKeeper, owner: u32, bytes: &[u8]) -> std::result::Result<(), i32> {
        let Some((mirror, records)) = mirror::Mirror::decode(bytes) else {
            self.metrics.count_malformed();
            return Err(libc::EINVAL);
        };
        if mirror.shard != owner {
            return Err(libc::EINVAL);
        }
        let checked = copies.check_mirror(owner, mirror.producer);
        self.wipe_own(copies.take_wipe_own());
        checked?;
        if owner == self.own_owner() {
            self.meta.borrow_mut().apply_mirror(&records)
        } else {
            copies.with_store(owner, |m| m.apply_mirror(&records))
        }
    }

    /// The metadata owner this worker is.
    fn own_owner(&self) -> u32 {
        self.server_id * self.owners_per_server() + self.worker_index as u32
    }

    /// Empties this worker's own metadata when `wipe` (it is being caught up).
    fn wipe_own(&self, wipe: bool) {
        if wipe {
            self.meta.borrow_mut().wipe();
        }
    }

    fn owners_per_server(&self) -> u32 {
        self.config_workers
    }

    fn servers(&self) -> u32 {
        self.config_servers
    }

    /// Serves a metadata op from `meta`: (status, reply value, reply payload). A malformed
    /// payload is EINVAL and changes nothing.
    fn meta_op(&self, meta: &mut MetaStore, op: Op, bytes: &[u8]) -> (i32, ReplyValue, Vec<u8>) {
        use ReplyValue::{MoreFollows, NewEntry, Nothing, OldSize};
        if op == Op::Find {
            let page = meta::FindRequest::decode(bytes)
                .map_err(|_| libc::EINVAL)
                .and_then(|req| meta.find(&req, meta::REPLY_MAX / 2));
            return match page {
                Ok(p) => (
                    0,
                    MoreFollows(p.more),
                    meta::encode_found(p.examined, p.matched, &p.found),
                ),
                Err(errno) => {
                    if errno == libc::EINVAL {
                        self.metrics.count_malformed();
                    }
                    (-errno, Nothing, Vec::new())
                }
            };
        }
        let r = match MetaRequest::decode(bytes) {
            Ok(r) => r,
            Err(_) => {
                self.metrics.count_malformed();
                return (-libc::EINVAL, Nothing, Vec::new());
            }
        };
        let attr = |a: namespace::Attr| {
            let mut out = Vec::with_capacity(meta::ATTR_LEN);
            a.encode(&mut out);
            out
        };
        let kind = |mode: u32| {
            u8::try_from(mode)
                .ok()
                .and_then(Kind::from_u8)
                .unwrap_or(Kind::File)
        };
        let result: std::result::Result<(ReplyValue, Vec<u8>), i32> = match op {
            Op::Create => {
                // arg: 1 + the stripe start the parent's owner chose, or 0 for none.
                let start = r.arg.checked_sub(1).map(|s| u32::try_from(s).unwrap_or(u32::MAX));
                meta.create(&r.path, r.flags, r.mode, start)
                    .map(|(a, old)| (OldSize(old), attr(a)))
            }
            Op::Stat => meta.stat(&r.path).map(|a| (Nothing, attr(a))),
            Op::Unlink => meta.unlink(&r.path).map(|a| (Nothing, attr(a))),
            Op::Mkdir => meta.mkdir(&r.path, r.mode).map(|a| (Nothing, attr(a))),
            Op::Rmdir => meta.rmdir(&r.path).map(|()| (Nothing, Vec::new())),
            Op::DirAdd if r.name.is_empty() => Err(libc::EINVAL),
            Op::DirAdd => meta
                .dir_add(&r.path, &r.name, kind(r.mode), r.flags & meta::RETYPE != 0)
                .map(|start| (NewEntry(start), Vec::new())),
            Op::DirRemove | Op::DirMark | Op::DirConfirm if r.name.is_empty() => Err(libc::EINVAL),
            Op::DirRemove => meta
                .dir_remove(&r.path, &r.name, (r.arg != 0).then_some(r.arg))
                .map(|existed| (ReplyValue::Existed(existed), Vec::new())),
            Op::DirMark => meta
                .dir_mark(&r.path, &r.name)
                .map(|existed| (ReplyValue::Existed(existed), Vec::new())),
            Op::DirConfirm => meta
                .dir_confirm(&r.path, &r.name, r.arg)
                .map(|existed| (ReplyValue::Existed(existed), Vec::new())),
            Op::Readdir => {
                let max = (r.arg as usize).clamp(1, meta::READDIR_PAGE);
                meta.readdir(&r.path, &r.name, max)
                    .map(|(page, more)| (MoreFollows(more), meta::encode_entries(&page)))
            }
            Op::Install => match r.attr {
                Some(a) => meta
                    .install(
                        &r.path,
                        a,
                        r.flags,
                        (!r.target.is_empty()).then_some(r.target.as_str()),
                    )
                    .map(|old| (Nothing, old.map(attr).unwrap_or_default())),
                None => Err(libc::EINVAL),
            },
            Op::Symlink => meta.symlink(&r.path, &r.target).map(|a| (Nothing, attr(a))),
            Op::Readlink => meta.readlink(&r.path).map(|t| (Nothing, t.as_bytes().to_vec())),
            Op::SetAttr => {
                let mode = (r.flags & meta::SET_MODE != 0).then_some(r.mode);
                let mtime = (r.flags & meta::SET_MTIME != 0).then_some(r.arg);
                let size = (r.flags & meta::SET_SIZE != 0).then_some(r.size);
                meta.set_attr(&r.path, mode, mtime, size, r.flags & meta::SET_LINK != 0)
                    .map(|a| (Nothing, attr(a)))
            }
            Op::SetSize => {
                let how = if r.flags == 1 {
                    SizeUpdate::Exact
                } else {
                    SizeUpdate::AtLeast
                };
                meta.set_size(&r.path, r.arg, how)
                    .map(|(a, old)| (OldSize(old), attr(a)))
            }
            _ => Err(libc::EINVAL),
        };
        match result {
            Ok((value, body)) => (0, value, body),
            Err(errno) => (-errno, Nothing, Vec::new()),
        }
    }

    /// Takes the stats the event loop, the buffer pool and the store keep themselves.
    fn absorb_parts(&self) {
        self.metrics.absorb(
            self.reactor.submit_stats(),
            self.pool.waits(),
            self.store.handle_lookups(),
        );
    }

    fn set_gauges(&self) {
        self.metrics.set_gauges(
            self.queue.items.borrow().len(),
            self.in_service.get() as usize,
            self.pool.available(),
            self.conns.open.borrow().len(),
        );
        if self.worker_index == 0 {
            use crate::process::{cpu_ns, open_descriptors, resident_bytes};
            self.metrics
                .set_process_gauges(open_descriptors(), resident_bytes(), cpu_ns());
        }
    }
}

/// A worker's telemetry files: its snapshots and (with `telemetry.trace`) its trace.
#[derive(Default)]
struct Outputs {
    snapshots: Option<SnapshotWriter>,
    trace: Option<TraceWriter>,
}

/// Writes the worker's telemetry snapshot (gauges refreshed first), then flushes its trace
/// ring; reports a failure once per file.
fn snapshot(state: &ServerState, outputs: &RefCell<Outputs>) {
    let mut out = outputs.borrow_mut();
    if let Some(w) = out.snapshots.as_mut() {
        state.set_gauges();
        state.absorb_parts();
        if let Err(e) = w.write(&*state.metrics, unix_time_ns()) {
            eprintln!("benchfs: telemetry snapshots stopped: {e}");
            out.snapshots = None;
        }
    }
    if let (Some(w), Some(ring)) = (out.trace.as_mut(), state.trace.as_ref()) {
        if let Err(e) = w.flush(ring) {
            eprintln!("benchfs: per-operation traces stopped: {e}");
            out.trace = None;
        }
    }
}

/// The node name a server reports: as configured, else the host name.
fn node_name(opts: &ServerOptions) -> String {
    if opts.node.is_empty() {
        hostname()
    } else {
        opts.node.clone()
    }
}

pub(crate) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Stops every worker of a running server, from any thread. The registry entry is removed
/// first, so no new client picks the server up while it drains.
#[derive(Clone)]
pub struct StopHandle {
    notifiers: Vec<Notifier>,
    registry_dir: PathBuf,
    id: u32,
}

impl StopHandle {
    pub fn stop(&self) {
        registry::unpublish(&self.registry_dir, self.id);
        for n in &self.notifiers {
            n.notify();
        }
    }
}

struct WorkerReady {
    address: Vec<u8>,
    notifier: Notifier,
}

/// One worker: its own io_uring, UCX worker, buffer pool and store, on the calling thread.
fn run_worker(
    opts: &ServerOptions,
    index: u32,
    ready: impl FnOnce(Result<WorkerReady>),
) -> Result<ServerStats> {
    let parts = match start_worker(opts, index) {
        Ok(parts) => parts,
        Err(e) => {
            let message = e.to_string();
            ready(Err(e));
            return Err(Error::Config(message));
        }
    };
    let reactor = parts.runtime.reactor().clone();
    match (parts.worker.address(), reactor.notifier()) {
        (Ok(address), Ok(notifier)) => ready(Ok(WorkerReady { address, notifier })),
        (Err(e), _) => {
            let message = e.to_string();
            ready(Err(e.into()));
            return Err(Error::Config(message));
        }
        (_, Err(e)) => {
            let message = e.to_string();
            ready(Err(e));
            return Err(Error::Config(message));
        }
    }
    parts.runtime.block_on(reactor.notified())?;
    stop_worker(parts)
}

/// A running worker: its event loop, UCX worker, state and telemetry outputs.
struct WorkerParts {
    runtime: Runtime,
    worker: Worker,
    state: Rc<ServerState>,
    outputs: Rc<RefCell<Outputs>>,
}

/// Builds worker `index` of the server: its state, its request handler, its telemetry files,
/// and its tasks (the reaper, `server.max_in_service` service tasks, the snapshot ticker).
fn start_worker(opts: &ServerOptions, index: u32) -> Result<WorkerParts> {
    let config = &opts.config;
    let (runtime, worker, state) = worker_state(opts, index)?;
    let handler_state = Rc::downgrade(&state);
    worker.set_am_handler(AM_REQUEST, move |msg| match handler_state.upgrade() {
        Some(s) => s.on_message(msg),
        None => AmVerdict::Done,
    })?;
    runtime.spawn(state.clone().reap())?;
    runtime.spawn(state.clone().greet())?;
    runtime.spawn(state.clone().expire_locks())?;
    for _ in 0..config.server.max_in_service {
        let s = state.clone();
        runtime.spawn(async move {
            loop {
                let req = s.queue.pop().await;
                s.in_service.set(s.in_service.get() + 1);
                s.serve_one(req).await;
                s.in_service.set(s.in_service.get() - 1);
            }
        })?;
    }
    let outputs = Rc::new(RefCell::new(open_outputs(opts, index, state.trace.is_some())?));
    if outputs.borrow().snapshots.is_some() {
        let (s, w, r) = (state.clone(), outputs.clone(), runtime.reactor().clone());
        let every = std::time::Duration::from_millis(config.telemetry.interval_ms);
        runtime.spawn(async move {
            loop {
                r.sleep(every).await;
                snapshot(&s, &w);
            }
        })?;
    }
    Ok(WorkerParts {
        runtime,
        worker,
        state,
        outputs,
    })
}

/// The event loop, the UCX worker and the state of worker `index`: its store, buffer pool,
/// request queue and metadata.
fn worker_state(opts: &ServerOptions, index: u32) -> Result<(Runtime, Worker, Rc<ServerState>)> {
    let config = &opts.config;
    let token = registry::job_token(&registry::load_or_create_secret(&opts.registry_dir)?);
    let runtime = Runtime::new(config.storage.ring_entries)?;
    let reactor = runtime.reactor().clone();
    reactor.set_spin(std::time::Duration::from_micros(config.network.spin_us));
    let worker = Worker::with_options(&config.network.worker_options())?;
    reactor.attach_ucx(worker.clone());
    reactor.submit_stats().set_enabled(config.telemetry.enabled);
    let store = ChunkStore::open(
        &opts.data_dir,
        &config.storage,
        config.layout.chunk_size,
        index,
        reactor.clone(),
    )?;
    let pool = BufferPool::new(
        config.storage.buffer_count as usize,
        io_buffer_size(config.layout.chunk_size),
    )?;
    // Pool buffers move with READ_FIXED/WRITE_FIXED and UCX knows their memory.
    reactor.register_buffers(&pool)?;
    pool.register_ucx(&worker)?;
    // Traces go to a file beside the snapshots; without a directory there is none.
    let tracing = config.telemetry.trace && config.telemetry.enabled && !config.telemetry.dir.is_empty();
    let state = Rc::new(ServerState {
        worker: worker.clone(),
        reactor,
        conns: Rc::new(Connections::default()),
        parked: RefCell::new(Vec::new()),
        peer_errors: config.network.peer_error_handling,
        client_timeout: std::time::Duration::from_secs_f64(config.client.request_timeout_s),
        store,
        data_dir: opts.data_dir.clone(),
        pool,
        queue: Rc::new(RequestQueue {
            items: RefCell::new(VecDeque::new()),
            waiters: RefCell::new(VecDeque::new()),
            capacity: config.server.max_queued as usize,
        }),
        meta: RefCell::new(meta_store(opts, index)?),
        copies: copy_keeper(opts, index),
        config_workers: config.server.workers.max(1),
        config_servers: config.cluster.expected_servers,
        chunk_size: config.layout.chunk_size,
        metrics: Rc::new(WorkerMetrics::new(config.telemetry.enabled)),
        trace: tracing.then(|| TraceRing::new(config.telemetry.trace_records as usize)),
        server_id: opts.id,
        worker_index: index as u16,
        clock_base: (Instant::now(), unix_time_ns()),
        draining: Cell::new(false),
        in_service: Cell::new(0),
        token,
        refusal_logged: Cell::new(false),
        locks: RefCell::new(LockTable::default()),
        lock_epoch: id_nonce(),
        lock_hold: std::time::Duration::from_secs_f64(config.client.request_timeout_s / 3.0),
        lock_timer: Cell::new(None),
    });
    Ok((runtime, worker, state))
}

/// With copies of the metadata, what worker `index` keeps of other owners' and decides about
/// serving its own.
fn copy_keeper(opts: &ServerOptions, index: u32) -> Option<CopyKeeper> {
    let copies = metadata_copies(&opts.config);
    if copies <= 1 {
        return None;
    }
    let config = &opts.config;
    let for_copies = opts.clone();
    let make = move |owner: u32| {
        owner_store(&for_copies, owner, &format!("meta-w{index}-of{owner}")).map(MetaStore::with_copies)
    };
    Some(CopyKeeper::new(
        copies,
        (config.cluster.expected_servers, config.server.workers),
        opts.id,
        opts.registry_dir.clone(),
        Box::new(make),
    ))
}

/// The worker's telemetry files: snapshots when `telemetry.dir` is set, and the trace beside
/// them when `tracing`.
fn open_outputs(opts: &ServerOptions, index: u32, tracing: bool) -> Result<Outputs> {
    let config = &opts.config;
    let mut outputs = Outputs::default();
    if !config.telemetry.dir.is_empty() {
        let (dir, node) = (Path::new(&config.telemetry.dir), node_name(opts));
        let snapshots = SnapshotWriter::create(dir, opts.id, index, &node)?;
        if tracing {
            outputs.trace = Some(TraceWriter::create(
                dir,
                opts.id,
                index,
                &node,
                snapshots.instance(),
                config.telemetry.trace_records as usize,
            )?);
        }
        outputs.snapshots = Some(snapshots);
    }
    Ok(outputs)
}

/// Graceful stop: finishes what was accepted (bounded), lets the kernel finish every I/O it
/// holds before the ring goes away (a dropped ring's requests pin their files), writes the
/// last snapshot, saves the store, and releases everything; returns the worker's counters.
fn stop_worker(parts: WorkerParts) -> Result<ServerStats> {
    let WorkerParts {
        runtime,
        worker,
        state,
        outputs,
    } = parts;
    let reactor = runtime.reactor().clone();
    state.draining.set(true);
    runtime.block_on(async {
        let deadline = std::time::Instant::now() + DRAIN_TIMEOUT;
        while (!state.queue.items.borrow().is_empty() || state.in_service.get() > 0)
            && std::time::Instant::now() < deadline
        {
            reactor.sleep(std::time::Duration::from_millis(1)).await;
        }
    })?;
    runtime.quiesce(DRAIN_TIMEOUT)?;
    snapshot(&state, &outputs);
    state
        .store
        .close()
        .map_err(|e| Error::io("save the storage index", e))?;
    // Requests still queued with a kept rendezvous descriptor: hand the descriptors back.
    for item in state.queue.items.borrow_mut().drain(..) {
        if let Payload::Rendezvous(desc) = item.payload {
            // SAFETY: kept by the handler and never used.
            unsafe { worker.release_data(desc) };
        }
    }
    state.absorb_parts();
    let stats = ServerStats::from_metrics(&state.metrics);
    // Parked service tasks are referenced by wakers inside the state they reference: break
    // that cycle so the store (and its open files) is released when the server stops.
    state.queue.waiters.borrow_mut().clear();
    state.pool.clear_waiters();
    state.conns.reaper.take();
    state.conns.greeter.take();
    // Close the connections back to clients before the worker goes away.
    state.conns.open.borrow_mut().clear();
    drop(reactor);
    drop(runtime);
    if Rc::strong_count(&state) != 1 {
        return Err(Error::Protocol(
            "server state still referenced after shutdown".into(),
        ));
    }
    Ok(stats)
}

/// Distinguishes file ids made by a restarted server from those of its previous life.
/// Worker `index`'s metadata: kept in its store under the data directory, unless
/// `storage.durability` is `memory`.
fn meta_store(opts: &ServerOptions, index: u32) -> Result<MetaStore> {
    let owner = opts.id * opts.config.server.workers + index;
    let store = owner_store(opts, owner, &format!("meta-w{index}"))?;
    Ok(if metadata_copies(&opts.config) > 1 {
        store.with_copies()
    } else {
        store
    })
}

/// Copies of each metadata owner's names: `layout.replicas`, on as many servers as there are.
pub fn metadata_copies(config: &Config) -> u8 {
    config
        .layout
        .replicas
        .min(config.cluster.expected_servers.clamp(1, 255) as u8)
}

/// The store of metadata owner `owner`, in directory `dir` of the data directory unless
/// `storage.durability` is `memory`.
fn owner_store(opts: &ServerOptions, owner: u32, dir: &str) -> Result<MetaStore> {
    let config = &opts.config;
    let owners = config.cluster.expected_servers * config.server.workers;
    let (stripe, chunk) = (config.cluster.expected_servers, config.layout.chunk_size);
    let durable = match config.storage.durability {
        Durability::Memory => Ok(MetaStore::new(owner, owners, stripe, chunk, id_nonce())),
        Durability::None => Err(false),
        Durability::Fsync | Durability::Close => Err(true),
    };
    let store = match durable {
        Ok(store) => store,
        Err(durable) => {
            let dir = opts.data_dir.join(dir);
            MetaStore::open(&dir, durable, (owner, owners), stripe, chunk, id_nonce())?
        }
    };
    Ok(store.with_replicas(config.layout.replicas))
}

fn id_nonce() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mixed =
        xxhash_rust::xxh3::xxh3_64(&[t.to_le_bytes(), (std::process::id() as u64).to_le_bytes()].concat());
    mixed as u32
}

/// Runs a server until stopped: `server.workers` event loops on their own threads. `on_ready`
/// is called once every worker serves and the server is registered.
pub fn serve(opts: ServerOptions, on_ready: impl FnOnce(&RegistryEntry, StopHandle)) -> Result<ServerStats> {
    opts.config.validate()?;
    let expected = opts.config.cluster.expected_servers;
    if expected == 0 || opts.id >= expected {
        return Err(Error::Config(format!(
            "server id {} needs cluster.expected_servers above it (got {expected}): ids are 0..N-1, \
             and files stripe over the N servers",
            opts.id
        )));
    }
    let workers = opts.config.server.workers;
    // Each client holds about two sockets per server worker.
    match crate::process::raise_descriptor_limit() {
        Ok(limit) if limit < 4096 => eprintln!(
            "benchfs: server {}: the descriptor limit is {limit} (its hard limit): about {} clients \
             fit; raise the hard limit (ulimit -Hn) for more",
            opts.id,
            limit / 2 / u64::from(workers.max(1))
        ),
        Ok(_) => {}
        Err(e) => eprintln!(
            "benchfs: server {}: cannot read the descriptor limit: {e}",
            opts.id
        ),
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let mut threads = Vec::with_capacity(workers as usize);
    for w in 0..workers {
        let (opts, tx) = (opts.clone(), tx.clone());
        let thread = std::thread::Builder::new()
            .name(format!("benchfs-s{}-w{w}", opts.id))
            .spawn(move || {
                run_worker(&opts, w, |r| {
                    let _ = tx.send((w, r));
                })
            })
            .map_err(|e| Error::io("spawn server worker", e))?;
        threads.push(thread);
    }
    drop(tx);
    let mut ready: Vec<Option<WorkerReady>> = (0..workers).map(|_| None).collect();
    let mut failure = None;
    for (w, r) in rx.iter().take(workers as usize) {
        match r {
            Ok(r) => ready[w as usize] = Some(r),
            Err(e) => {
                failure.get_or_insert(e);
            }
        }
    }
    let join_all = |threads: Vec<std::thread::JoinHandle<Result<ServerStats>>>| -> Result<ServerStats> {
        let mut total = ServerStats::default();
        let mut first_error = None;
        for t in threads {
            match t.join() {
                Ok(Ok(s)) => total.add(&s),
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(_) => {
                    first_error.get_or_insert(Error::Stopped);
                }
            }
        }
        first_error.map_or(Ok(total), Err)
    };
    let notifiers: Vec<Notifier> = ready.iter().flatten().map(|r| r.notifier.clone()).collect();
    if failure.is_some() || notifiers.len() != workers as usize {
        notifiers.iter().for_each(Notifier::notify);
        let _ = join_all(threads);
        return Err(failure.unwrap_or(Error::Stopped));
    }
    let host = hostname();
    let node = if opts.node.is_empty() {
        host.clone()
    } else {
        opts.node.clone()
    };
    let addresses: Vec<Vec<u8>> = ready.iter().flatten().map(|r| r.address.clone()).collect();
    let domain = if opts.domain.is_empty() {
        node.clone()
    } else {
        opts.domain.clone()
    };
    let entry = RegistryEntry::new(opts.id, node, host, &addresses)
        .in_domain(domain)
        .with_metadata_copies(metadata_copies(&opts.config));
    let stop = StopHandle {
        notifiers,
        registry_dir: opts.registry_dir.clone(),
        id: opts.id,
    };
    if let Err(e) = registry::publish(&opts.registry_dir, &entry) {
        stop.stop();
        let _ = join_all(threads);
        return Err(e);
    }
    on_ready(&entry, stop.clone());
    let result = join_all(threads);
    registry::unpublish(&opts.registry_dir, opts.id);
    result
}

/// A server running on its own thread (used by the Python module and tests).
pub struct ServerHandle {
    pub entry: RegistryEntry,
    stopper: StopHandle,
    thread: Option<std::thread::JoinHandle<Result<ServerStats>>>,
}

impl ServerHandle {
    /// Starts the server and returns once it is registered (or failed to start).
    pub fn spawn(opts: ServerOptions) -> Result<ServerHandle> {
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("benchfs-server-{}", opts.id))
            .spawn(move || {
                let ready_tx = tx.clone();
                let result = serve(opts, move |entry, stopper| {
                    let _ = ready_tx.send(Ok((entry.clone(), stopper)));
                });
                if let Err(e) = &result {
                    let _ = tx.send(Err(Error::Config(e.to_string())));
                }
                result
            })
            .map_err(|e| Error::io("spawn server thread", e))?;
        match rx.recv() {
            Ok(Ok((entry, stopper))) => Ok(ServerHandle {
                entry,
                stopper,
                thread: Some(thread),
            }),
            Ok(Err(_)) | Err(_) => match thread.join() {
                Ok(Err(e)) => Err(e),
                _ => Err(Error::Stopped),
            },
        }
    }

    /// Stops the server and waits for its thread. Idempotent.
    pub fn stop(&mut self) -> Result<Option<ServerStats>> {
        self.stopper.stop();
        match self.thread.take() {
            Some(t) => match t.join() {
                Ok(r) => r.map(Some),
                Err(_) => Err(Error::Stopped),
            },
            None => Ok(None),
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}
