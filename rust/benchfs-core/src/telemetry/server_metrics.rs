//! The metrics of one server worker: their catalogue (ids and order in a snapshot) and
//! [`WorkerMetrics`], where they are recorded.

use std::cell::Cell;

use super::catalogue::{def, MetricDef, MetricKind, OpKind};
use super::histogram::Histogram;
use super::snapshot::{histogram_records, Snapshot, BUCKET_NONE, NO_OP, NO_TARGET};

pub(super) mod id {
    pub const END: u8 = 0;
    pub const OPS: u8 = 1;
    pub const BYTES: u8 = 2;
    pub const ERRORS: u8 = 3;
    pub const POOL_WAITS: u8 = 4;
    pub const HANDLE_HITS: u8 = 5;
    pub const HANDLE_MISSES: u8 = 6;
    pub const REJECTED_BUSY: u8 = 7;
    pub const MALFORMED: u8 = 8;
    pub const QUEUE_DEPTH: u8 = 9;
    pub const IN_SERVICE: u8 = 10;
    pub const BUFFERS_FREE: u8 = 11;
    pub const REFUSED_AUTH: u8 = 12;
    pub const TRACE_DROPPED: u8 = 13;
    pub const UNDELIVERED: u8 = 14;
    pub const CONNECTIONS: u8 = 15;
    pub const DESCRIPTORS: u8 = 21;
    pub const RSS_BYTES: u8 = 22;
    pub const CPU_NS: u8 = 23;
    pub const INFLIGHT_AT_SUBMIT: u8 = 16;
    pub const SUBMIT_BATCH: u8 = 17;
    pub const QUEUE_WAIT_NS: u8 = 18;
    pub const DEVICE_NS: u8 = 19;
    pub const TOTAL_NS: u8 = 20;
    pub const META_COMMIT: u8 = 24;
}

/// Every metric a server worker writes, in the order of its records in a snapshot.
pub const SERVER_METRICS: &[MetricDef] = {
    use MetricKind::{Counter, Gauge, Histogram};
    &[
        def(id::OPS, "ops", Counter, true, "ops"),
        def(id::BYTES, "bytes", Counter, true, "bytes"),
        def(id::ERRORS, "errors", Counter, true, "ops"),
        def(id::POOL_WAITS, "pool_waits", Counter, false, "waits"),
        def(id::HANDLE_HITS, "handle_hits", Counter, false, "lookups"),
        def(id::HANDLE_MISSES, "handle_misses", Counter, false, "lookups"),
        def(id::REJECTED_BUSY, "rejected_busy", Counter, false, "requests"),
        def(id::MALFORMED, "malformed", Counter, false, "requests"),
        def(id::QUEUE_DEPTH, "queue_depth", Gauge, false, "requests"),
        def(id::IN_SERVICE, "in_service", Gauge, false, "requests"),
        def(id::BUFFERS_FREE, "buffers_free", Gauge, false, "buffers"),
        def(id::REFUSED_AUTH, "refused_auth", Counter, false, "requests"),
        def(id::TRACE_DROPPED, "trace_dropped", Counter, false, "records"),
        def(id::UNDELIVERED, "undelivered", Counter, false, "replies"),
        def(id::CONNECTIONS, "connections", Gauge, false, "connections"),
        def(id::DESCRIPTORS, "descriptors", Gauge, false, "descriptors"),
        def(id::RSS_BYTES, "rss_bytes", Gauge, false, "bytes"),
        def(id::CPU_NS, "cpu_ns", Gauge, false, "ns"),
        def(
            id::INFLIGHT_AT_SUBMIT,
            "inflight_at_submit",
            Histogram,
            false,
            "ops",
        ),
        def(id::SUBMIT_BATCH, "submit_batch", Histogram, false, "sqes"),
        def(id::QUEUE_WAIT_NS, "queue_wait_ns", Histogram, true, "ns"),
        def(id::DEVICE_NS, "device_ns", Histogram, true, "ns"),
        def(id::TOTAL_NS, "total_ns", Histogram, true, "ns"),
        def(id::META_COMMIT, "meta_commit", Histogram, false, "writes"),
    ]
};

/// What an event loop records of its own io_uring submissions, kept by its reactor and read
/// by [`WorkerMetrics::absorb`] at snapshot time. Off (nothing recorded) until enabled.
#[derive(Default)]
pub struct SubmitStats {
    enabled: Cell<bool>,
    inflight_at_submit: Histogram,
    submit_batch: Histogram,
}

impl SubmitStats {
    pub fn set_enabled(&self, enabled: bool) {
        self.enabled.set(enabled);
    }

    /// One `io_uring_enter` put `sqes` data SQEs in the kernel, leaving `depth` device
    /// operations in flight (its own included): each SQE counts as submitted at `depth`, and
    /// the call as one batch of `sqes` (calls that submitted none are not counted).
    #[inline]
    pub fn record(&self, depth: u32, sqes: u32) {
        if !self.enabled.get() || sqes == 0 {
            return;
        }
        self.inflight_at_submit
            .record_n(u64::from(depth), u64::from(sqes));
        self.submit_batch.record(u64::from(sqes));
    }

    pub fn inflight_at_submit(&self) -> &Histogram {
        &self.inflight_at_submit
    }

    pub fn submit_batch(&self) -> &Histogram {
        &self.submit_batch
    }
}

/// The counters, gauges and histograms of one server worker thread.
///
/// Owned by that thread (it is `!Sync`); the hot path calls the `record_*`/`count_*`
/// methods, the event loop hands it to [`SnapshotWriter::write`] once per interval.
pub struct WorkerMetrics {
    enabled: bool,
    inflight_at_submit: Histogram,
    submit_batch: Histogram,
    queue_wait_ns: [Histogram; OpKind::COUNT],
    device_ns: [Histogram; OpKind::COUNT],
    total_ns: [Histogram; OpKind::COUNT],
    meta_commit: Histogram,
    ops: [Cell<u64>; OpKind::COUNT],
    bytes: [Cell<u64>; OpKind::COUNT],
    errors: [Cell<u64>; OpKind::COUNT],
    pool_waits: Cell<u64>,
    handle_hits: Cell<u64>,
    handle_misses: Cell<u64>,
    rejected_busy: Cell<u64>,
    refused_auth: Cell<u64>,
    malformed: Cell<u64>,
    queue_depth: Cell<u64>,
    in_service: Cell<u64>,
    buffers_free: Cell<u64>,
    trace_dropped: Cell<u64>,
    undelivered: Cell<u64>,
    connections: Cell<u64>,
    descriptors: Cell<u64>,
    rss_bytes: Cell<u64>,
    cpu_ns: Cell<u64>,
}

#[inline(always)]
pub(super) fn bump(c: &Cell<u64>, by: u64) {
    c.set(c.get().wrapping_add(by));
}

impl std::fmt::Debug for WorkerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ops: Vec<u64> = self.ops.iter().map(Cell::get).collect();
        f.debug_struct("WorkerMetrics")
            .field("enabled", &self.enabled)
            .field("ops", &ops)
            .field("inflight_at_submit", &self.inflight_at_submit)
            .field("submit_batch", &self.submit_batch)
            .finish_non_exhaustive()
    }
}

impl WorkerMetrics {
    /// All zero. With `enabled` false nothing is ever recorded (for overhead measurements).
    pub fn new(enabled: bool) -> WorkerMetrics {
        WorkerMetrics {
            enabled,
            inflight_at_submit: Histogram::new(),
            submit_batch: Histogram::new(),
            queue_wait_ns: std::array::from_fn(|_| Histogram::new()),
            device_ns: std::array::from_fn(|_| Histogram::new()),
            total_ns: std::array::from_fn(|_| Histogram::new()),
            meta_commit: Histogram::new(),
            ops: Default::default(),
            bytes: Default::default(),
            errors: Default::default(),
            pool_waits: Cell::new(0),
            handle_hits: Cell::new(0),
            handle_misses: Cell::new(0),
            rejected_busy: Cell::new(0),
            refused_auth: Cell::new(0),
            malformed: Cell::new(0),
            queue_depth: Cell::new(0),
            in_service: Cell::new(0),
            buffers_free: Cell::new(0),
            trace_dropped: Cell::new(0),
            undelivered: Cell::new(0),
            connections: Cell::new(0),
            descriptors: Cell::new(0),
            rss_bytes: Cell::new(0),
            cpu_ns: Cell::new(0),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    // Hot path.

    /// One storage operation completed: its time queued before its SQE was submitted, at the
    /// device (submit to completion) and in total (request received to reply ready), in ns;
    /// `bytes` moved (counted only if `ok`). Failed operations count in `ops`, `errors` and the
    /// latency histograms, so every latency histogram's count equals `ops`.
    #[inline]
    pub fn record_op(
        &self,
        kind: OpKind,
        queue_ns: u64,
        device_ns: u64,
        total_ns: u64,
        bytes: u64,
        ok: bool,
    ) {
        if !self.enabled {
            return;
        }
        let k = kind.index();
        bump(&self.ops[k], 1);
        if ok {
            bump(&self.bytes[k], bytes);
        } else {
            bump(&self.errors[k], 1);
        }
        self.queue_wait_ns[k].record(queue_ns);
        self.device_ns[k].record(device_ns);
        self.total_ns[k].record(total_ns);
    }

    /// Takes the stats the worker's parts keep themselves (read at snapshot time and when
    /// the worker stops): its event loop's submissions, its buffer pool's waits, its chunk
    /// store's handle lookups (hits, misses).
    pub fn absorb(&self, submit: &SubmitStats, pool_waits: u64, handle_lookups: (u64, u64)) {
        if !self.enabled {
            return;
        }
        self.inflight_at_submit.copy_from(&submit.inflight_at_submit);
        self.submit_batch.copy_from(&submit.submit_batch);
        self.pool_waits.set(pool_waits);
        self.handle_hits.set(handle_lookups.0);
        self.handle_misses.set(handle_lookups.1);
    }

    /// A request was refused with EAGAIN because the queue was full.
    #[inline]
    pub fn count_rejected(&self) {
        if self.enabled {
            bump(&self.rejected_busy, 1);
        }
    }

    /// A request did not carry this job's token (another job's client, or a stray one).
    #[inline]
    pub fn count_refused_auth(&self) {
        if self.enabled {
            bump(&self.refused_auth, 1);
        }
    }

    pub fn refused_auth(&self) -> u64 {
        self.refused_auth.get()
    }

    /// A trace record found its worker's [`TraceRing`] full and was dropped.
    #[inline]
    pub fn count_trace_dropped(&self) {
        if self.enabled {
            bump(&self.trace_dropped, 1);
        }
    }

    /// A group commit of the worker's metadata made `writes` writes (the changes of the
    /// requests served in one turn of its event loop).
    pub fn record_meta_commit(&self, writes: u64) {
        if self.enabled {
            self.meta_commit.record(writes);
        }
    }

    pub fn trace_dropped(&self) -> u64 {
        self.trace_dropped.get()
    }

    /// A reply could not be delivered: its client's connection was gone (the client died, or
    /// stopped answering for longer than `client.request_timeout_s`), or the request named a
    /// connection this worker does not have.
    #[inline]
    pub fn count_undelivered(&self) {
        if self.enabled {
            bump(&self.undelivered, 1);
        }
    }

    pub fn undelivered(&self) -> u64 {
        self.undelivered.get()
    }

    /// A request could not be parsed or failed validation.
    #[inline]
    pub fn count_malformed(&self) {
        if self.enabled {
            bump(&self.malformed, 1);
        }
    }

    /// The instantaneous state, set just before a snapshot (or whenever convenient): requests
    /// waiting for a service task, requests being served, free pool buffers.
    #[inline]
    pub fn set_gauges(&self, queue_depth: usize, in_service: usize, buffers_free: usize, connections: usize) {
        if !self.enabled {
            return;
        }
        self.queue_depth.set(queue_depth as u64);
        self.in_service.set(in_service as u64);
        self.buffers_free.set(buffers_free as u64);
        self.connections.set(connections as u64);
    }

    /// The whole process's open descriptors, resident bytes and CPU time (set by one worker
    /// only, so that sums over a server's workers stay right).
    pub fn set_process_gauges(&self, descriptors: u64, rss_bytes: u64, cpu_ns: u64) {
        if self.enabled {
            self.descriptors.set(descriptors);
            self.rss_bytes.set(rss_bytes);
            self.cpu_ns.set(cpu_ns);
        }
    }

    // Readers.

    pub fn inflight_at_submit(&self) -> &Histogram {
        &self.inflight_at_submit
    }
    pub fn submit_batch(&self) -> &Histogram {
        &self.submit_batch
    }
    pub fn queue_wait_ns(&self, kind: OpKind) -> &Histogram {
        &self.queue_wait_ns[kind.index()]
    }
    pub fn device_ns(&self, kind: OpKind) -> &Histogram {
        &self.device_ns[kind.index()]
    }
    pub fn total_ns(&self, kind: OpKind) -> &Histogram {
        &self.total_ns[kind.index()]
    }
    pub fn meta_commit(&self) -> &Histogram {
        &self.meta_commit
    }
    pub fn ops(&self, kind: OpKind) -> u64 {
        self.ops[kind.index()].get()
    }
    pub fn bytes(&self, kind: OpKind) -> u64 {
        self.bytes[kind.index()].get()
    }
    pub fn errors(&self, kind: OpKind) -> u64 {
        self.errors[kind.index()].get()
    }
    pub fn pool_waits(&self) -> u64 {
        self.pool_waits.get()
    }
    pub fn handle_hits(&self) -> u64 {
        self.handle_hits.get()
    }
    pub fn handle_misses(&self) -> u64 {
        self.handle_misses.get()
    }
    pub fn rejected_busy(&self) -> u64 {
        self.rejected_busy.get()
    }
    pub fn malformed(&self) -> u64 {
        self.malformed.get()
    }
    pub fn queue_depth(&self) -> u64 {
        self.queue_depth.get()
    }
    pub fn in_service(&self) -> u64 {
        self.in_service.get()
    }
    pub fn buffers_free(&self) -> u64 {
        self.buffers_free.get()
    }
    pub fn connections(&self) -> u64 {
        self.connections.get()
    }
    pub fn descriptors(&self) -> u64 {
        self.descriptors.get()
    }
    pub fn rss_bytes(&self) -> u64 {
        self.rss_bytes.get()
    }
    pub fn cpu_ns(&self) -> u64 {
        self.cpu_ns.get()
    }

    /// Adds another worker's counters and histograms to these (gauges are summed too), e.g.
    /// to report a whole server.
    pub fn merge_from(&self, other: &WorkerMetrics) {
        self.inflight_at_submit.merge_from(&other.inflight_at_submit);
        self.submit_batch.merge_from(&other.submit_batch);
        self.meta_commit.merge_from(&other.meta_commit);
        for k in 0..OpKind::COUNT {
            self.queue_wait_ns[k].merge_from(&other.queue_wait_ns[k]);
            self.device_ns[k].merge_from(&other.device_ns[k]);
            self.total_ns[k].merge_from(&other.total_ns[k]);
            bump(&self.ops[k], other.ops[k].get());
            bump(&self.bytes[k], other.bytes[k].get());
            bump(&self.errors[k], other.errors[k].get());
        }
        for (mine, theirs) in self.scalars().iter().zip(other.scalars().iter()) {
            bump(mine.1, theirs.1.get());
        }
    }

    /// The non-per-op counters and gauges with their metric ids, in snapshot order.
    fn scalars(&self) -> [(u8, &Cell<u64>); 15] {
        [
            (id::POOL_WAITS, &self.pool_waits),
            (id::HANDLE_HITS, &self.handle_hits),
            (id::HANDLE_MISSES, &self.handle_misses),
            (id::REJECTED_BUSY, &self.rejected_busy),
            (id::MALFORMED, &self.malformed),
            (id::QUEUE_DEPTH, &self.queue_depth),
            (id::IN_SERVICE, &self.in_service),
            (id::BUFFERS_FREE, &self.buffers_free),
            (id::REFUSED_AUTH, &self.refused_auth),
            (id::TRACE_DROPPED, &self.trace_dropped),
            (id::UNDELIVERED, &self.undelivered),
            (id::CONNECTIONS, &self.connections),
            (id::DESCRIPTORS, &self.descriptors),
            (id::RSS_BYTES, &self.rss_bytes),
            (id::CPU_NS, &self.cpu_ns),
        ]
    }

    /// Every histogram with its metric id and op, in snapshot order.
    fn histograms(&self) -> impl Iterator<Item = (u8, u8, &Histogram)> + '_ {
        fn per_op(metric: u8, hs: &[Histogram; OpKind::COUNT]) -> impl Iterator<Item = (u8, u8, &Histogram)> {
            hs.iter().zip(OpKind::ALL).map(move |(h, k)| (metric, k as u8, h))
        }
        [
            (id::INFLIGHT_AT_SUBMIT, NO_OP, &self.inflight_at_submit),
            (id::SUBMIT_BATCH, NO_OP, &self.submit_batch),
        ]
        .into_iter()
        .chain(per_op(id::QUEUE_WAIT_NS, &self.queue_wait_ns))
        .chain(per_op(id::DEVICE_NS, &self.device_ns))
        .chain(per_op(id::TOTAL_NS, &self.total_ns))
        .chain([(id::META_COMMIT, NO_OP, &self.meta_commit)])
    }
}

impl Snapshot for WorkerMetrics {
    fn records(&self, push: &mut dyn FnMut(u8, u8, u16, u64, u16)) {
        for (metric, cells) in [
            (id::OPS, &self.ops),
            (id::BYTES, &self.bytes),
            (id::ERRORS, &self.errors),
        ] {
            for k in OpKind::ALL {
                push(metric, k as u8, BUCKET_NONE, cells[k.index()].get(), NO_TARGET);
            }
        }
        for (metric, cell) in self.scalars() {
            push(metric, NO_OP, BUCKET_NONE, cell.get(), NO_TARGET);
        }
        for (metric, op, h) in self.histograms() {
            histogram_records(h, metric, op, NO_TARGET, push);
        }
    }

    fn upkeep(&self, metric: u8) -> bool {
        metric == id::CPU_NS
    }
}
