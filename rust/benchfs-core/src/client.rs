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
use std::task::Waker;
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};

use benchfs_ucx::{AmData, AmMessage, AmVerdict, Endpoint, Request, Worker};

use crate::chunking::{place, place_worker, split, FileId};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::protocol::{Header, Op, AM_REPLY, AM_REQUEST};
use crate::registry::{self, RegistryEntry};
use crate::runtime::{with_timeout, Runtime};

/// Where a reply's payload goes: a raw view of the caller's buffer for this request.
#[derive(Clone, Copy)]
struct Dest {
    ptr: *mut u8,
    len: usize,
}

#[derive(Default)]
struct PendingRpc {
    reply: Option<std::result::Result<Header, String>>,
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
    endpoints: Vec<Option<Endpoint>>,
    /// Set once the server failed; later requests fail at once.
    lost: Option<String>,
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
    worker: Worker,
    links: RefCell<Vec<ServerLink>>,
    /// One window per (server, worker), indexed like `links[server].endpoints[worker]`.
    windows: Vec<Vec<Window>>,
    counters: RefCell<Vec<ServerCounters>>,
    membership: Vec<RegistryEntry>,
    shared: Rc<Shared>,
    next_request: Cell<u64>,
    /// Jitter for retry backoff (xorshift state).
    rng: Cell<u64>,
    config: Config,
    /// The job token every request carries.
    token: u64,
}

impl Shared {
    fn on_reply(&self, worker: &Worker, msg: AmMessage<'_>) -> AmVerdict {
        let header = match Header::decode(msg.header) {
            Ok(h) => h,
            Err(e) => {
                self.malformed_replies.set(self.malformed_replies.get() + 1);
                if let Some(id) = e.request_id {
                    if let Some(p) = self.pending.borrow_mut().get_mut(&id) {
                        p.reply = Some(Err(e.reason));
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
    type Output = std::result::Result<Header, String>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let mut pending = self.shared.pending.borrow_mut();
        match pending.get_mut(&self.id) {
            Some(p) => match p.reply.take() {
                Some(r) => std::task::Poll::Ready(r),
                None => {
                    p.waker = Some(cx.waker().clone());
                    std::task::Poll::Pending
                }
            },
            None => std::task::Poll::Ready(Err("request vanished".into())),
        }
    }
}

impl Client {
    /// Waits for the expected membership in `registry_dir`, then connects to every server.
    pub fn connect(registry_dir: &Path, config: Config) -> Result<Client> {
        config.validate()?;
        let timeout = Duration::from_secs_f64(config.cluster.connect_timeout_s);
        let membership = registry::wait_for(registry_dir, config.cluster.expected_servers, timeout)?;
        let token = registry::job_token(&registry::load_secret(registry_dir)?);
        let runtime = Runtime::new(config.storage.ring_entries.min(64))?;
        // Serialized, not single-threaded: a client may move between threads (never used by
        // two at once; the front-ends serialize access).
        let options = benchfs_ucx::WorkerOptions {
            serialized: true,
            ..config.network.worker_options()
        };
        let worker = Worker::with_options(&options)?;
        runtime.reactor().attach_ucx(worker.clone());
        runtime
            .reactor()
            .set_spin(Duration::from_micros(config.network.spin_us));
        let shared = Rc::new(Shared {
            pending: RefCell::new(HashMap::new()),
            orphans: RefCell::new(Vec::new()),
            late_replies: Cell::new(0),
            malformed_replies: Cell::new(0),
        });
        let handler_shared = Rc::downgrade(&shared);
        let handler_worker = worker.clone();
        worker.set_am_handler(AM_REPLY, move |msg| match handler_shared.upgrade() {
            Some(s) => s.on_reply(&handler_worker, msg),
            None => AmVerdict::Done,
        })?;
        let mut links = Vec::with_capacity(membership.len());
        for entry in &membership {
            let mut endpoints = Vec::new();
            for address in entry.addresses()? {
                let endpoint = worker
                    .connect(&address, config.network.peer_error_handling)
                    .map_err(|e| Error::ServerLost {
                        server: entry.id,
                        reason: format!("cannot connect: {e}"),
                    })?;
                endpoints.push(Some(endpoint));
            }
            links.push(ServerLink {
                id: entry.id,
                endpoints,
                lost: None,
            });
        }
        let windows = links
            .iter()
            .map(|l| l.endpoints.iter().map(|_| Window::default()).collect())
            .collect();
        let counters = membership
            .iter()
            .map(|e| ServerCounters {
                id: e.id,
                ..Default::default()
            })
            .collect();
        Ok(Client {
            runtime,
            worker,
            links: RefCell::new(links),
            windows,
            counters: RefCell::new(counters),
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
            token,
        })
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

    fn mark_lost(&self, index: usize, reason: String) {
        if let Some(link) = self.links.borrow_mut().get_mut(index) {
            if link.lost.is_none() {
                link.lost = Some(reason);
            }
        }
    }

    /// Workers of the server at `index`.
    fn workers(&self, index: usize) -> usize {
        self.membership[index].ucx_addresses.len()
    }

    /// Every (server, worker) pair, for requests that concern all of a file's chunks.
    fn all_workers(&self) -> Vec<(usize, usize)> {
        (0..self.server_count())
            .flat_map(|s| (0..self.workers(s)).map(move |w| (s, w)))
            .collect()
    }

    /// Where a chunk lives: (server index, worker index).
    fn route(&self, file: FileId, chunk: u64) -> (usize, usize) {
        let s = place(file, chunk, self.server_count());
        (s, place_worker(file, chunk, self.server_count(), self.workers(s)))
    }

    /// One request to worker `target.1` of server `target.0`, within that worker's window,
    /// with a fresh request id per attempt. Idempotent requests (read, extent, fsync) are
    /// retried after a timeout, with exponential backoff and full jitter; a server that times
    /// out for good, or whose transport fails, is marked lost.
    async fn call(
        &self,
        target: (usize, usize),
        header: Header,
        payload: &[u8],
        mut dest: Option<&mut [u8]>,
    ) -> Result<Header> {
        let (index, worker) = target;
        let client = &self.config.client;
        let idempotent = matches!(header.op, Op::ReadChunk | Op::FileExtent | Op::Fsync);
        let mut attempt = 0u32;
        loop {
            let attempt_header = Header {
                request_id: self.request_id(),
                ..header
            };
            self.counters.borrow_mut()[index].requests += 1;
            let result = {
                let _permit = self.windows[index][worker]
                    .acquire(client.max_inflight_per_server)
                    .await;
                self.exchange(target, attempt_header, payload, dest.as_deref_mut())
                    .await
            };
            let timed_out = matches!(result, Err(Error::Timeout { .. }));
            if timed_out {
                self.counters.borrow_mut()[index].timeouts += 1;
            }
            match result {
                Err(Error::Timeout { .. }) if idempotent && attempt < client.max_retries => {
                    self.counters.borrow_mut()[index].retries += 1;
                    let ceiling = client.retry_backoff_ms.saturating_mul(1 << attempt.min(16));
                    let pause = Duration::from_millis(self.jitter(ceiling));
                    self.runtime.reactor().sleep(pause).await;
                    attempt += 1;
                }
                Err(e) => {
                    self.counters.borrow_mut()[index].failures += 1;
                    if timed_out || matches!(e, Error::ServerLost { .. }) {
                        self.mark_lost(index, e.to_string());
                    }
                    return Err(e);
                }
                Ok(reply) => return Ok(reply),
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

    /// The id of the server that holds byte `offset` of `path`.
    pub fn locate(&self, path: &str, offset: u64) -> u32 {
        let chunk = offset / self.config.client.chunk_size;
        self.membership[self.route(FileId::from_path(path), chunk).0].id
    }

    /// What this client saw of each server, ordered like the membership.
    pub fn server_stats(&self) -> Vec<ServerCounters> {
        self.counters.borrow().clone()
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
                    reason: reason.clone(),
                });
            }
            let Some(ep) = link.endpoints.get(worker).and_then(|e| e.as_ref()) else {
                return Err(Error::ServerLost {
                    server: link.id,
                    reason: "endpoint closed".into(),
                });
            };
            // SAFETY: `payload` is borrowed for this call, and the guard turns a still-running
            // send into an orphan that the public call waits for before returning.
            let header = header.with_token(self.token);
            guard.send = Some(unsafe { ep.send_am(AM_REQUEST, &header.encode(), payload) });
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
            let reply = reply.map_err(Error::Protocol)?;
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
        let result = self.runtime.block_on(fut)?;
        self.quiesce()?;
        result
    }

    fn quiesce(&self) -> Result<()> {
        if self.shared.orphans.borrow().iter().all(|r| r.is_done()) {
            self.shared.orphans.borrow_mut().clear();
            return Ok(());
        }
        // Force-closing the endpoints of failed servers completes their operations with errors.
        for link in self.links.borrow_mut().iter_mut() {
            if link.lost.is_some() {
                link.endpoints.iter_mut().for_each(|e| *e = None);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.shared.orphans.borrow().iter().all(|r| r.is_done()) {
                self.shared.orphans.borrow_mut().clear();
                return Ok(());
            }
            self.worker.progress();
            std::thread::sleep(Duration::from_millis(1));
        }
        // Last resort: UCX did not release the caller's memory; continuing would be unsound.
        eprintln!("benchfs: UCX operations on caller memory did not finish after endpoint close; aborting");
        std::process::abort();
    }

    /// Writes `data` at `offset` of the file at `path`; returns the bytes written.
    pub fn write(&self, path: &str, offset: u64, data: &[u8]) -> Result<usize> {
        let file = FileId::from_path(path);
        let chunk_size = self.config.client.chunk_size;
        offset
            .checked_add(data.len() as u64)
            .ok_or_else(|| Error::InvalidArgument("offset + length overflows".into()))?;
        let window = self.config.client.max_inflight as usize;
        self.run(async {
            let calls = split(offset, data.len() as u64, chunk_size).map(|p| {
                let header = Header::request(Op::WriteChunk, 0, file.0, p.chunk, p.offset, p.len);
                let part = &data[p.buf_offset as usize..(p.buf_offset + p.len) as usize];
                self.call(self.route(file, p.chunk), header, part, None)
            });
            let mut results = stream::iter(calls).buffer_unordered(window);
            let mut written = 0u64;
            while let Some(r) = results.next().await {
                written += r?.length;
            }
            Ok(written as usize)
        })
    }

    /// Reads into `buf` from `offset`; returns the bytes read (short only at the end of the
    /// file). Ranges never written inside the file size read as zeros.
    pub fn read_into(&self, path: &str, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let file = FileId::from_path(path);
        let chunk_size = self.config.client.chunk_size;
        let window = self.config.client.max_inflight as usize;
        let total = buf.len();
        let pieces: Vec<_> = split(offset, total as u64, chunk_size).collect();
        let short = self.run(async {
            // Disjoint slices of the caller's buffer, one per piece.
            let mut rest = &mut buf[..];
            let mut calls = Vec::with_capacity(pieces.len());
            for p in &pieces {
                let (head, tail) = std::mem::take(&mut rest).split_at_mut(p.len as usize);
                rest = tail;
                let header = Header::request(Op::ReadChunk, 0, file.0, p.chunk, p.offset, p.len);
                calls.push(async move {
                    let reply = self
                        .call(self.route(file, p.chunk), header, &[], Some(&mut *head))
                        .await?;
                    let got = (reply.length as usize).min(head.len());
                    head[got..].fill(0);
                    Ok::<bool, Error>(got < head.len())
                });
            }
            let mut results = stream::iter(calls).buffer_unordered(window);
            let mut any_short = false;
            while let Some(r) = results.next().await {
                any_short |= r?;
            }
            Ok(any_short)
        })?;
        if !short {
            return Ok(total);
        }
        // Some piece was short: a hole or the end of the file. Only the size can tell.
        let size = self.file_size(path)?;
        Ok(size.saturating_sub(offset).min(total as u64) as usize)
    }

    /// Sends a header-only request about `path` to every worker of every server; returns the
    /// replies (for requests that concern all of a file's chunks).
    fn broadcast(&self, op: Op, path: &str) -> Result<Vec<Header>> {
        let file = FileId::from_path(path);
        let window = self.config.client.max_inflight as usize;
        self.run(async {
            let calls = self
                .all_workers()
                .into_iter()
                .map(|target| self.call(target, Header::request(op, 0, file.0, 0, 0, 0), &[], None));
            let mut results = stream::iter(calls).buffer_unordered(window);
            let mut replies = Vec::new();
            while let Some(r) = results.next().await {
                replies.push(r?);
            }
            Ok(replies)
        })
    }

    /// The file's size: the end of its furthest byte on any server.
    pub fn file_size(&self, path: &str) -> Result<u64> {
        Ok(self
            .broadcast(Op::FileExtent, path)?
            .iter()
            .map(|h| h.length)
            .max()
            .unwrap_or(0))
    }

    /// Makes everything this file's servers hold of it durable on their devices.
    pub fn fsync(&self, path: &str) -> Result<()> {
        self.broadcast(Op::Fsync, path).map(|_| ())
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
        // Close endpoints (forcibly, bounded) before the worker goes away.
        self.links.borrow_mut().clear();
    }
}
