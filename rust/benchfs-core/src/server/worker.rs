//! A server worker's life: its start (the event loop, UCX worker, chunk store, buffer pool,
//! metadata and state; the request handler; the reaper, greeter, lock timer, service and
//! snapshot tasks; its telemetry files), its run until stopped, and its graceful stop (drain,
//! quiesce, last snapshot, store saved). Also its telemetry snapshots and gauges.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::path::Path;
use std::rc::Rc;
use std::time::Instant;

use benchfs_ucx::{AmVerdict, Worker};

use crate::buffer::{io_buffer_size, BufferPool};
use crate::error::{Error, Result};
use crate::locktable::LockTable;
use crate::protocol::AM_REQUEST;
use crate::registry;
use crate::runtime::{Notifier, Runtime};
use crate::storage::ChunkStore;
use crate::telemetry::{
    unix_time_ns, NameLog, NamesWriter, SnapshotWriter, TraceRing, TraceWriter, WorkerMetrics,
    TRACE_RECORD_SIZE,
};

use super::connections::Connections;
use super::intake::{Payload, RequestQueue};
use super::metadata::{copy_keeper, id_nonce, meta_store};
use super::{hostname, ServerOptions, ServerState, ServerStats};

/// How long a stopping server waits for accepted requests and in-flight I/O.
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

pub(super) struct WorkerReady {
    pub(super) address: Vec<u8>,
    pub(super) notifier: Notifier,
}

/// One worker: its own io_uring, UCX worker, buffer pool and store, on the calling thread.
pub(super) fn run_worker(
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
                snapshot(&s, &w, true);
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
        group: super::group_commit::GroupCommit::new(matches!(
            config.storage.durability,
            crate::config::Durability::Fsync | crate::config::Durability::Close
        )),
        config_workers: config.server.workers.max(1),
        config_servers: config.cluster.expected_servers,
        chunk_size: config.layout.chunk_size,
        metrics: Rc::new(WorkerMetrics::new(config.telemetry.enabled)),
        trace: tracing.then(|| TraceRing::new(config.telemetry.trace_records as usize)),
        // As much memory for paths as the ring has for records.
        names: tracing.then(|| NameLog::new(config.telemetry.trace_records as usize * TRACE_RECORD_SIZE)),
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
            outputs.names = Some(NamesWriter::create(
                dir,
                opts.id,
                index,
                &node,
                snapshots.instance(),
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
    snapshot(&state, &outputs, false);
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

/// A worker's telemetry files: its snapshots and (with `telemetry.trace`) its trace and the
/// names of the files it names.
#[derive(Default)]
struct Outputs {
    snapshots: Option<SnapshotWriter>,
    trace: Option<TraceWriter>,
    names: Option<NamesWriter>,
}

/// Writes the worker's telemetry snapshot (gauges refreshed first; a `periodic` one only if
/// something changed since the last), then flushes its trace ring; reports a failure once
/// per file.
fn snapshot(state: &ServerState, outputs: &RefCell<Outputs>, periodic: bool) {
    let mut out = outputs.borrow_mut();
    if let Some(w) = out.snapshots.as_mut() {
        state.set_gauges();
        state.absorb_parts();
        let written = if periodic {
            w.write_changed(&*state.metrics, unix_time_ns())
        } else {
            w.write(&*state.metrics, unix_time_ns())
        };
        if let Err(e) = written {
            crate::warn_line!("benchfs: telemetry snapshots stopped: {e}");
            out.snapshots = None;
        }
    }
    if let (Some(w), Some(ring)) = (out.trace.as_mut(), state.trace.as_ref()) {
        if let Err(e) = w.flush(ring) {
            crate::warn_line!("benchfs: per-operation traces stopped: {e}");
            out.trace = None;
        }
    }
    if let (Some(w), Some(log)) = (out.names.as_mut(), state.names.as_ref()) {
        if let Err(e) = w.flush(log) {
            crate::warn_line!("benchfs: the names of traced files stopped: {e}");
            out.names = None;
        }
    }
}

impl ServerState {
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

/// The node name a server reports: as configured, else the host name.
fn node_name(opts: &ServerOptions) -> String {
    if opts.node.is_empty() {
        hostname()
    } else {
        opts.node.clone()
    }
}
