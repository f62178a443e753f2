//! The chunk server: receives requests as UCX active messages, queues them (bounded), serves
//! them with a fixed set of service tasks over the io_uring chunk store, and replies.
//!
//! Bounds: at most `server.max_in_service` requests are served at once (one task each, spawned
//! once at start), at most `server.max_queued` wait; beyond that a request is refused with
//! EAGAIN. Rendezvous payloads stay at the client until a pool buffer is free to receive them.
//!
//! A server runs `server.workers` workers, each on its own thread with its own event loop
//! (io_uring), UCX worker, buffer pool, chunk store, metadata and connections to clients. A
//! worker's state (`ServerState`, below) is shared by its UCX handler and its tasks; each
//! submodule adds its part of the worker's methods:
//!
//! - `worker`: a worker's life: its start (state, request handler, tasks, telemetry files), its
//!   run, and its graceful stop; its telemetry snapshots.
//! - `intake`: what arrives: the UCX active-message handler and the bounded request queue.
//! - `connections`: the connections back to clients from hello to teardown, and the rules
//!   their teardown keeps.
//! - `data`: serving a request: chunk data and checksums, accounting, and the reply.
//! - `metadata`: metadata ops, mirrors, and the stores of this worker's and other owners' names.
//! - `locks`: advisory locks, and the lock requests that wait.

mod connections;
mod data;
mod group_commit;
mod intake;
mod locks;
mod metadata;
mod worker;

use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::rc::Rc;
use std::task::Waker;
use std::time::Instant;

use benchfs_ucx::Worker;

use crate::buffer::BufferPool;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::locktable::LockTable;
use crate::metadata_copies::CopyKeeper;
use crate::namespace::MetaStore;
use crate::registry::{self, RegistryEntry};
use crate::runtime::{Notifier, Reactor};
use crate::storage::ChunkStore;
use crate::telemetry::{NameLog, OpKind, TraceRing, WorkerMetrics};

use self::connections::{Connections, Parked};
use self::intake::RequestQueue;
use self::locks::LockAnswer;
use self::worker::{run_worker, WorkerReady};

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

/// One worker's state, shared by its UCX handler and its tasks (each submodule adds its part of
/// the methods).
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
    /// The metadata changes being committed together, and whether the last groups' commits
    /// failed.
    group: group_commit::GroupCommit,
    /// `server.workers` and `cluster.expected_servers`: metadata owners are numbered by them.
    config_workers: u32,
    config_servers: u32,
    chunk_size: u64,
    metrics: Rc<WorkerMetrics>,
    /// Per-operation trace records until the next snapshot (`telemetry.trace`).
    trace: Option<TraceRing>,
    /// With the trace: the paths of the files its records name (`telemetry::names`).
    names: Option<NameLog>,
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

/// Copies of each metadata owner's names: `layout.replicas`, on as many servers as there are.
pub fn metadata_copies(config: &Config) -> u8 {
    config
        .layout
        .replicas
        .min(config.cluster.expected_servers.clamp(1, 255) as u8)
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
        Ok(limit) if limit < 4096 => crate::warn_line!(
            "benchfs: server {}: the descriptor limit is {limit} (its hard limit): about {} clients \
             fit; raise the hard limit (ulimit -Hn) for more",
            opts.id,
            limit / 2 / u64::from(workers.max(1))
        ),
        Ok(_) => {}
        Err(e) => crate::warn_line!(
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
