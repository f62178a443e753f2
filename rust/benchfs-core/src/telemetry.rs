//! Telemetry: always-on counters and histograms kept by every server worker, and the
//! versioned snapshot files they are written to (format: `docs/telemetry.md`).
//!
//! Recording is single-threaded and cheap: every metric is a [`Cell`] owned by one worker
//! thread (no atomics, no allocation, no clock reads in here), and a histogram record is a
//! leading-zero count, two shifts and five cell updates. With telemetry disabled every
//! `record_*`/`count_*` method returns at its first instruction, which is how the overhead of
//! telemetry is measured.
//!
//! Snapshots hold cumulative values. [`SnapshotWriter::write`] appends one snapshot as a run
//! of fixed 32-byte little-endian records (one per counter, gauge and histogram statistic,
//! and one per non-empty histogram bucket) closed by an end-of-snapshot marker, with a single
//! `write(2)`; a reader that meets a snapshot still being written (or torn by a crash) skips
//! it. [`read_file`] is the Rust reader; `benchfs.telemetry` is the Python one.
//!
//! Clients keep [`ClientMetrics`] (per target server) and write them with the same writer in
//! format version 2. Servers may also keep a [`TraceRing`] of per-operation records, flushed
//! by a [`TraceWriter`] with one `write(2)` at each snapshot.

use std::cell::{Cell, OnceCell, RefCell};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::json;

use crate::error::{Error, Result};

// ---------------------------------------------------------------------------------------------
// Histogram

/// Sub-buckets per power of two, as a number of bits: 2 bits = 4 sub-buckets, so a bucket is
/// at most 25% as wide as its lower bound.
pub const SUB_BUCKET_BITS: u32 = 2;
const SUB_BUCKETS: usize = 1 << SUB_BUCKET_BITS;
/// Buckets of every [`Histogram`]: together they cover all of `u64` (`0..=u64::MAX`).
pub const BUCKETS: usize = (65 - SUB_BUCKET_BITS as usize) * SUB_BUCKETS;

/// The bucket that holds `v`.
///
/// Log-linear buckets: values below `2^(SUB_BUCKET_BITS+1)` (0 to 7) have a bucket each; above
/// that, each power-of-two range `[2^e, 2^(e+1))` is split into `2^SUB_BUCKET_BITS` equal
/// buckets of width `2^(e-SUB_BUCKET_BITS)`. Index `i >= 4` covers
/// `[2^e + s*2^(e-2), 2^e + (s+1)*2^(e-2) - 1]` with `e = i/4 + 1`, `s = i%4`.
#[inline(always)]
pub fn bucket_index(v: u64) -> usize {
    if v < SUB_BUCKETS as u64 {
        return v as usize;
    }
    let e = 63 - v.leading_zeros(); // floor(log2 v) >= SUB_BUCKET_BITS
    let sub = (v >> (e - SUB_BUCKET_BITS)) as usize & (SUB_BUCKETS - 1);
    (e - SUB_BUCKET_BITS + 1) as usize * SUB_BUCKETS + sub
}

/// Smallest value of bucket `i` (indices past the last bucket mean the last bucket).
pub fn bucket_lo(i: usize) -> u64 {
    let i = i.min(BUCKETS - 1);
    if i < SUB_BUCKETS {
        return i as u64;
    }
    let e = (i / SUB_BUCKETS) as u32 + SUB_BUCKET_BITS - 1;
    let s = (i % SUB_BUCKETS) as u64;
    (1u64 << e) + (s << (e - SUB_BUCKET_BITS))
}

/// Largest value of bucket `i` (inclusive; `u64::MAX` for the last bucket).
pub fn bucket_hi(i: usize) -> u64 {
    let i = i.min(BUCKETS - 1);
    if i < SUB_BUCKETS {
        return i as u64;
    }
    let e = (i / SUB_BUCKETS) as u32 + SUB_BUCKET_BITS - 1;
    bucket_lo(i) + ((1u64 << (e - SUB_BUCKET_BITS)) - 1)
}

/// A fixed log-linear histogram over `u64` (see [`bucket_index`]), for one thread.
///
/// Exact for 0 to 7 (queue depths 1, 2, 3 stay apart); relative bucket width at most 25%
/// beyond; covers every `u64`, so nanosecond latencies of any length fit. `sum` wraps modulo
/// 2^64 (584 years of nanoseconds).
pub struct Histogram {
    counts: [Cell<u64>; BUCKETS],
    count: Cell<u64>,
    sum: Cell<u64>,
    min: Cell<u64>,
    max: Cell<u64>,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new()
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.count())
            .field("sum", &self.sum())
            .field("min", &self.min())
            .field("max", &self.max())
            .finish()
    }
}

impl Histogram {
    pub fn new() -> Histogram {
        Histogram {
            counts: std::array::from_fn(|_| Cell::new(0)),
            count: Cell::new(0),
            sum: Cell::new(0),
            min: Cell::new(u64::MAX),
            max: Cell::new(0),
        }
    }

    /// Counts one value.
    #[inline(always)]
    pub fn record(&self, v: u64) {
        let c = &self.counts[bucket_index(v)];
        c.set(c.get() + 1);
        self.count.set(self.count.get() + 1);
        self.sum.set(self.sum.get().wrapping_add(v));
        if v < self.min.get() {
            self.min.set(v);
        }
        if v > self.max.get() {
            self.max.set(v);
        }
    }

    /// Counts `n` occurrences of one value (same as `n` calls of [`record`](Self::record)).
    #[inline(always)]
    pub fn record_n(&self, v: u64, n: u64) {
        if n == 0 {
            return;
        }
        let c = &self.counts[bucket_index(v)];
        c.set(c.get() + n);
        self.count.set(self.count.get() + n);
        self.sum.set(self.sum.get().wrapping_add(v.wrapping_mul(n)));
        if v < self.min.get() {
            self.min.set(v);
        }
        if v > self.max.get() {
            self.max.set(v);
        }
    }

    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.count.get()
    }

    /// Sum of the values recorded (wrapping).
    pub fn sum(&self) -> u64 {
        self.sum.get()
    }

    /// Smallest value recorded, 0 if none.
    pub fn min(&self) -> u64 {
        if self.count() == 0 {
            0
        } else {
            self.min.get()
        }
    }

    /// Largest value recorded, 0 if none.
    pub fn max(&self) -> u64 {
        self.max.get()
    }

    /// Mean of the values recorded, 0.0 if none.
    pub fn mean(&self) -> f64 {
        match self.count() {
            0 => 0.0,
            n => self.sum() as f64 / n as f64,
        }
    }

    /// Count in bucket `i` (0 for `i >= BUCKETS`).
    pub fn bucket_count(&self, i: usize) -> u64 {
        self.counts.get(i).map_or(0, Cell::get)
    }

    /// Smallest value of bucket `i`.
    pub fn bucket_lo(i: usize) -> u64 {
        bucket_lo(i)
    }

    /// Largest value of bucket `i` (inclusive).
    pub fn bucket_hi(i: usize) -> u64 {
        bucket_hi(i)
    }

    /// `(bucket index, count)` of the non-empty buckets, in increasing order of value.
    pub fn nonzero_buckets(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        self.counts
            .iter()
            .enumerate()
            .map(|(i, c)| (i, c.get()))
            .filter(|&(_, c)| c > 0)
    }

    /// The value at quantile `q` (0.0 to 1.0, clamped), 0 if empty.
    ///
    /// The value of rank `r = ceil(q * count)` (at least 1): the minimum for `r = 1`, the
    /// maximum for `r = count`, otherwise the midpoint of the bucket holding rank `r`, clamped
    /// to `[min, max]`. Exact in the exact buckets (0 to 7), otherwise within half a bucket
    /// (at most 12.5%) of the true value.
    pub fn quantile(&self, q: f64) -> u64 {
        let n = self.count();
        if n == 0 {
            return 0;
        }
        let q = if q.is_nan() { 0.5 } else { q.clamp(0.0, 1.0) };
        let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
        if rank == 1 {
            return self.min();
        }
        if rank == n {
            return self.max();
        }
        let mut seen = 0u64;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c.get();
            if seen >= rank {
                let (lo, hi) = (bucket_lo(i), bucket_hi(i));
                let mid = lo + (hi - lo) / 2;
                return mid.clamp(self.min(), self.max());
            }
        }
        self.max()
    }

    /// Adds everything `other` recorded to this histogram.
    pub fn merge_from(&self, other: &Histogram) {
        if other.count() == 0 {
            return;
        }
        for (mine, theirs) in self.counts.iter().zip(other.counts.iter()) {
            mine.set(mine.get() + theirs.get());
        }
        self.count.set(self.count.get() + other.count());
        self.sum.set(self.sum.get().wrapping_add(other.sum()));
        self.min.set(self.min.get().min(other.min()));
        self.max.set(self.max.get().max(other.max()));
    }

    /// Forgets everything recorded.
    pub fn reset(&self) {
        for c in &self.counts {
            c.set(0);
        }
        self.count.set(0);
        self.sum.set(0);
        self.min.set(u64::MAX);
        self.max.set(0);
    }
}

// ---------------------------------------------------------------------------------------------
// Metrics of one server worker

/// The storage operations timed separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum OpKind {
    Write = 0,
    Read = 1,
    Fsync = 2,
    /// Metadata operations and truncations (no payload bytes).
    Meta = 3,
}

impl OpKind {
    pub const COUNT: usize = 4;
    pub const ALL: [OpKind; OpKind::COUNT] = [OpKind::Write, OpKind::Read, OpKind::Fsync, OpKind::Meta];

    /// Index into per-operation arrays (and the `op` field of a record).
    #[inline(always)]
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            OpKind::Write => "write",
            OpKind::Read => "read",
            OpKind::Fsync => "fsync",
            OpKind::Meta => "meta",
        }
    }
}

/// How a metric's values are to be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Cumulative since the worker started; per-interval rates are differences.
    Counter,
    /// The value at snapshot time.
    Gauge,
    /// A [`Histogram`]: non-empty buckets plus count, sum, min and max.
    Histogram,
}

impl MetricKind {
    pub fn name(self) -> &'static str {
        match self {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Histogram => "histogram",
        }
    }
}

/// One metric as the file header describes it.
#[derive(Debug, Clone, Copy)]
pub struct MetricDef {
    /// The `metric` byte of its records (0 is the end-of-snapshot marker).
    pub id: u8,
    pub name: &'static str,
    pub kind: MetricKind,
    /// One series per [`OpKind`] (else the record's `op` is [`NO_OP`]).
    pub per_op: bool,
    /// One series per target server (format version 2; else the record's target is
    /// [`NO_TARGET`]).
    pub per_target: bool,
    pub unit: &'static str,
}

const fn def(id: u8, name: &'static str, kind: MetricKind, per_op: bool, unit: &'static str) -> MetricDef {
    MetricDef {
        id,
        name,
        kind,
        per_op,
        per_target: false,
        unit,
    }
}

/// A metric with one series per op and target server (client telemetry).
const fn per_target(id: u8, name: &'static str, kind: MetricKind, unit: &'static str) -> MetricDef {
    MetricDef {
        id,
        name,
        kind,
        per_op: true,
        per_target: true,
        unit,
    }
}

mod id {
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
    pub const INFLIGHT_AT_SUBMIT: u8 = 16;
    pub const SUBMIT_BATCH: u8 = 17;
    pub const QUEUE_WAIT_NS: u8 = 18;
    pub const DEVICE_NS: u8 = 19;
    pub const TOTAL_NS: u8 = 20;
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
    ]
};

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
}

#[inline(always)]
fn bump(c: &Cell<u64>, by: u64) {
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
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    // Hot path.

    /// One `io_uring_enter` submitted `batch` SQEs (calls that submitted none are not counted).
    #[inline]
    pub fn record_submit(&self, batch: u32) {
        if !self.enabled || batch == 0 {
            return;
        }
        self.submit_batch.record(u64::from(batch));
    }

    /// One data SQE entered the kernel, leaving `depth` device operations in flight (itself and
    /// the rest of its batch included, so a lone operation on an idle device records 1). Call
    /// once per SQE, or use [`record_inflight_n`](Self::record_inflight_n) once per batch.
    #[inline]
    pub fn record_inflight(&self, depth: u32) {
        if !self.enabled {
            return;
        }
        self.inflight_at_submit.record(u64::from(depth));
    }

    /// `sqes` data SQEs entered the kernel together, leaving `depth` operations in flight:
    /// each counts as submitted at `depth` (same as `sqes` calls of `record_inflight(depth)`).
    #[inline]
    pub fn record_inflight_n(&self, depth: u32, sqes: u32) {
        if !self.enabled {
            return;
        }
        self.inflight_at_submit
            .record_n(u64::from(depth), u64::from(sqes));
    }

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

    /// A request found no free buffer and had to wait for one.
    #[inline]
    pub fn count_pool_wait(&self) {
        if self.enabled {
            bump(&self.pool_waits, 1);
        }
    }

    /// A handle-cache lookup: `hit` if the chunk's file was open already.
    #[inline]
    pub fn count_handle(&self, hit: bool) {
        if !self.enabled {
            return;
        }
        bump(
            if hit {
                &self.handle_hits
            } else {
                &self.handle_misses
            },
            1,
        );
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
    pub fn set_gauges(&self, queue_depth: usize, in_service: usize, buffers_free: usize) {
        if !self.enabled {
            return;
        }
        self.queue_depth.set(queue_depth as u64);
        self.in_service.set(in_service as u64);
        self.buffers_free.set(buffers_free as u64);
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

    /// Adds another worker's counters and histograms to these (gauges are summed too), e.g.
    /// to report a whole server.
    pub fn merge_from(&self, other: &WorkerMetrics) {
        self.inflight_at_submit.merge_from(&other.inflight_at_submit);
        self.submit_batch.merge_from(&other.submit_batch);
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
    fn scalars(&self) -> [(u8, &Cell<u64>); 11] {
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
    }
}

// ---------------------------------------------------------------------------------------------
// Metrics of one client

mod cid {
    pub const REQUESTS: u8 = 1;
    pub const BYTES: u8 = 2;
    pub const RETRIES: u8 = 3;
    pub const TIMEOUTS: u8 = 4;
    pub const ERRORS: u8 = 5;
    pub const BUSY: u8 = 6;
    pub const INFLIGHT: u8 = 7;
    pub const RPC_NS: u8 = 16;
    pub const CALL_NS: u8 = 17;
    pub const INFLIGHT_AT_SEND: u8 = 18;
    pub const WINDOW_WAIT_NS: u8 = 19;
}

/// Every metric a client writes (format version 2), in the order of its records.
pub const CLIENT_METRICS: &[MetricDef] = {
    use MetricKind::{Counter, Gauge, Histogram};
    &[
        per_target(cid::REQUESTS, "requests", Counter, "requests"),
        per_target(cid::BYTES, "bytes", Counter, "bytes"),
        per_target(cid::RETRIES, "retries", Counter, "requests"),
        per_target(cid::TIMEOUTS, "timeouts", Counter, "requests"),
        per_target(cid::ERRORS, "errors", Counter, "requests"),
        per_target(cid::BUSY, "busy", Counter, "requests"),
        def(cid::INFLIGHT, "inflight", Gauge, false, "requests"),
        per_target(cid::RPC_NS, "rpc_ns", Histogram, "ns"),
        def(cid::CALL_NS, "call_ns", Histogram, true, "ns"),
        def(
            cid::INFLIGHT_AT_SEND,
            "inflight_at_send",
            Histogram,
            false,
            "requests",
        ),
        def(cid::WINDOW_WAIT_NS, "window_wait_ns", Histogram, true, "ns"),
    ]
};

/// What one client sent one server, per op (allocated on the first request to it).
#[derive(Default)]
struct TargetMetrics {
    requests: [Cell<u64>; OpKind::COUNT],
    bytes: [Cell<u64>; OpKind::COUNT],
    retries: [Cell<u64>; OpKind::COUNT],
    timeouts: [Cell<u64>; OpKind::COUNT],
    errors: [Cell<u64>; OpKind::COUNT],
    busy: [Cell<u64>; OpKind::COUNT],
    rpc_ns: [Histogram; OpKind::COUNT],
}

impl TargetMetrics {
    /// The per-target counters with their metric ids, in snapshot order.
    fn counters(&self) -> [(u8, &[Cell<u64>; OpKind::COUNT]); 6] {
        [
            (cid::REQUESTS, &self.requests),
            (cid::BYTES, &self.bytes),
            (cid::RETRIES, &self.retries),
            (cid::TIMEOUTS, &self.timeouts),
            (cid::ERRORS, &self.errors),
            (cid::BUSY, &self.busy),
        ]
    }
}

/// The counters and histograms of one client (`docs/telemetry.md`, "Metrics (source
/// `client`)"), for one thread like [`WorkerMetrics`].
///
/// Per-target series are indexed by the target's position in the membership and allocated on
/// the first request to that server (about 8 KiB each), so a client of 1000 servers that talks
/// to 10 of them keeps 10.
pub struct ClientMetrics {
    enabled: bool,
    /// Server ids, ascending (the header's `targets`).
    targets: Vec<u32>,
    per_target: Vec<OnceCell<Box<TargetMetrics>>>,
    inflight: Cell<u64>,
    call_ns: [Histogram; OpKind::COUNT],
    inflight_at_send: Histogram,
    window_wait_ns: [Histogram; OpKind::COUNT],
}

impl std::fmt::Debug for ClientMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientMetrics")
            .field("enabled", &self.enabled)
            .field("targets", &self.targets)
            .field("inflight", &self.inflight.get())
            .finish_non_exhaustive()
    }
}

impl ClientMetrics {
    /// Metrics of a client of the servers `targets` (ids, in the order the client indexes
    /// them; ascending). With `enabled` false nothing is recorded.
    pub fn new(targets: Vec<u32>, enabled: bool) -> ClientMetrics {
        ClientMetrics {
            enabled,
            per_target: targets.iter().map(|_| OnceCell::new()).collect(),
            targets,
            inflight: Cell::new(0),
            call_ns: std::array::from_fn(|_| Histogram::new()),
            inflight_at_send: Histogram::new(),
            window_wait_ns: std::array::from_fn(|_| Histogram::new()),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    pub fn targets(&self) -> &[u32] {
        &self.targets
    }

    #[inline]
    fn target(&self, index: usize) -> Option<&TargetMetrics> {
        if !self.enabled {
            return None;
        }
        self.per_target.get(index).map(|t| &**t.get_or_init(Box::default))
    }

    // Hot path.

    /// An attempt to the target at `index` is being sent (`retry`: not its first attempt).
    /// Returns nothing; pair it with [`attempt_done`](Self::attempt_done).
    #[inline]
    pub fn attempt_sent(&self, index: usize, op: OpKind, retry: bool) {
        let Some(t) = self.target(index) else { return };
        let k = op.index();
        bump(&t.requests[k], 1);
        if retry {
            bump(&t.retries[k], 1);
        }
        let inflight = self.inflight.get() + 1;
        self.inflight.set(inflight);
        self.inflight_at_send.record(inflight);
    }

    /// The attempt ended (reply, error, timeout or abandoned) after `rpc_ns`.
    #[inline]
    pub fn attempt_done(&self, index: usize, op: OpKind, rpc_ns: u64) {
        let Some(t) = self.target(index) else { return };
        self.inflight.set(self.inflight.get().saturating_sub(1));
        t.rpc_ns[op.index()].record(rpc_ns);
    }

    /// A request succeeded, moving `bytes` of payload.
    #[inline]
    pub fn count_bytes(&self, index: usize, op: OpKind, bytes: u64) {
        if let Some(t) = self.target(index) {
            bump(&t.bytes[op.index()], bytes);
        }
    }

    /// An attempt got no answer within the request timeout.
    #[inline]
    pub fn count_timeout(&self, index: usize, op: OpKind) {
        if let Some(t) = self.target(index) {
            bump(&t.timeouts[op.index()], 1);
        }
    }

    /// An attempt was refused with EAGAIN (the server's queue was full).
    #[inline]
    pub fn count_busy(&self, index: usize, op: OpKind) {
        if let Some(t) = self.target(index) {
            bump(&t.busy[op.index()], 1);
        }
    }

    /// A request failed for good (after its retries).
    #[inline]
    pub fn count_error(&self, index: usize, op: OpKind) {
        if let Some(t) = self.target(index) {
            bump(&t.errors[op.index()], 1);
        }
    }

    /// A request waited `ns` for a slot in the client's in-flight window.
    #[inline]
    pub fn record_window_wait(&self, op: OpKind, ns: u64) {
        if self.enabled {
            self.window_wait_ns[op.index()].record(ns);
        }
    }

    /// One public API call of kind `op` took `ns` from entry to return.
    #[inline]
    pub fn record_call(&self, op: OpKind, ns: u64) {
        if self.enabled {
            self.call_ns[op.index()].record(ns);
        }
    }

    // Readers.

    fn series(&self, index: usize) -> Option<&TargetMetrics> {
        self.per_target.get(index).and_then(|t| t.get().map(|b| &**b))
    }

    /// Attempts sent to the target at `index` for `op` (retries included).
    pub fn requests(&self, index: usize, op: OpKind) -> u64 {
        self.series(index).map_or(0, |t| t.requests[op.index()].get())
    }
    pub fn bytes(&self, index: usize, op: OpKind) -> u64 {
        self.series(index).map_or(0, |t| t.bytes[op.index()].get())
    }
    pub fn retries(&self, index: usize, op: OpKind) -> u64 {
        self.series(index).map_or(0, |t| t.retries[op.index()].get())
    }
    pub fn timeouts(&self, index: usize, op: OpKind) -> u64 {
        self.series(index).map_or(0, |t| t.timeouts[op.index()].get())
    }
    pub fn errors(&self, index: usize, op: OpKind) -> u64 {
        self.series(index).map_or(0, |t| t.errors[op.index()].get())
    }
    pub fn busy(&self, index: usize, op: OpKind) -> u64 {
        self.series(index).map_or(0, |t| t.busy[op.index()].get())
    }
    /// `rpc_ns` of the target at `index` for `op` (None before its first request).
    pub fn rpc_ns(&self, index: usize, op: OpKind) -> Option<&Histogram> {
        self.series(index).map(|t| &t.rpc_ns[op.index()])
    }
    pub fn call_ns(&self, op: OpKind) -> &Histogram {
        &self.call_ns[op.index()]
    }
    pub fn inflight_at_send(&self) -> &Histogram {
        &self.inflight_at_send
    }
    pub fn window_wait_ns(&self, op: OpKind) -> &Histogram {
        &self.window_wait_ns[op.index()]
    }
    pub fn inflight(&self) -> u64 {
        self.inflight.get()
    }

    /// (target index, op) pairs that have sent a request, in snapshot order (ops in header
    /// order, then targets in `targets` order).
    fn active(&self) -> impl Iterator<Item = (usize, OpKind, &TargetMetrics)> + '_ {
        OpKind::ALL.into_iter().flat_map(move |k| {
            (0..self.targets.len()).filter_map(move |i| {
                self.series(i)
                    .filter(|t| t.requests[k.index()].get() > 0)
                    .map(|t| (i, k, t))
            })
        })
    }
}

// ---------------------------------------------------------------------------------------------
// File format

/// First 8 bytes of every telemetry file.
pub const MAGIC: [u8; 8] = *b"BFSTELEM";
/// The format version servers write (1); clients write [`FORMAT_VERSION_CLIENT`].
pub const FORMAT_VERSION: u32 = 1;
/// Version 2: version 1 plus the record's `target` field and the header's `targets`.
pub const FORMAT_VERSION_CLIENT: u32 = 2;
/// Bytes per record.
pub const RECORD_SIZE: usize = 32;
/// Magic, version and header length.
pub const PREAMBLE_SIZE: usize = 16;
/// File name extension of telemetry files.
pub const FILE_EXTENSION: &str = "tel";

/// `op` of a record that belongs to no operation.
pub const NO_OP: u8 = 0xFF;
/// `target` of a version 2 record whose metric is not per target server.
pub const NO_TARGET: u16 = 0xFFFF;
/// `bucket` of a counter or gauge record.
pub const BUCKET_NONE: u16 = 0xFFFF;
/// `bucket` of a histogram's count record.
pub const BUCKET_COUNT: u16 = 0xFFFE;
/// `bucket` of a histogram's sum record.
pub const BUCKET_SUM: u16 = 0xFFFD;
/// `bucket` of a histogram's min record (0 while empty).
pub const BUCKET_MIN: u16 = 0xFFFC;
/// `bucket` of a histogram's max record (0 while empty).
pub const BUCKET_MAX: u16 = 0xFFFB;
/// `metric` of the record that closes a snapshot; its value is the snapshot's record count
/// without itself.
pub const METRIC_END: u8 = id::END;

/// What wrote a telemetry file (the header's `source`, and the file name's prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Server,
    /// A client process (records' `id` is its pid, `worker` the Client object's index).
    Client,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::Server => "server",
            Source::Client => "client",
        }
    }
}

/// One 32-byte record (layout in `docs/telemetry.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// Snapshot time, ns since the Unix epoch.
    pub t_ns: u64,
    pub value: u64,
    /// Server id (for `source = server`), client pid (for `source = client`).
    pub id: u32,
    /// Snapshot number in this file, from 0.
    pub seq: u32,
    pub worker: u16,
    pub metric: u8,
    pub op: u8,
    pub bucket: u16,
    /// Version 2: the target server of a per-target series, else [`NO_TARGET`]; version 1:
    /// reserved, 0.
    pub target: u16,
}

impl Record {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.t_ns.to_le_bytes());
        out.extend_from_slice(&self.value.to_le_bytes());
        out.extend_from_slice(&self.id.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&self.worker.to_le_bytes());
        out.push(self.metric);
        out.push(self.op);
        out.extend_from_slice(&self.bucket.to_le_bytes());
        out.extend_from_slice(&self.target.to_le_bytes());
    }

    fn decode(b: &[u8]) -> Record {
        let u64_at = |o: usize| u64::from_le_bytes(std::array::from_fn(|i| b[o + i]));
        let u32_at = |o: usize| u32::from_le_bytes(std::array::from_fn(|i| b[o + i]));
        let u16_at = |o: usize| u16::from_le_bytes(std::array::from_fn(|i| b[o + i]));
        Record {
            t_ns: u64_at(0),
            value: u64_at(8),
            id: u32_at(16),
            seq: u32_at(20),
            worker: u16_at(24),
            metric: b[26],
            op: b[27],
            bucket: u16_at(28),
            target: u16_at(30),
        }
    }
}

/// Nanoseconds since the Unix epoch (what [`SnapshotWriter::write`] expects).
pub fn unix_time_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// What a [`SnapshotWriter`] writes: the records of one snapshot, in file order.
pub trait Snapshot {
    /// Calls `push(metric, op, bucket, value, target)` for every record of one snapshot
    /// (`target` is [`NO_TARGET`] for metrics that are not per target).
    fn records(&self, push: &mut dyn FnMut(u8, u8, u16, u64, u16));
}

/// The four statistics of a histogram, then its non-empty buckets.
fn histogram_records(
    h: &Histogram,
    metric: u8,
    op: u8,
    target: u16,
    push: &mut dyn FnMut(u8, u8, u16, u64, u16),
) {
    push(metric, op, BUCKET_COUNT, h.count(), target);
    push(metric, op, BUCKET_SUM, h.sum(), target);
    push(metric, op, BUCKET_MIN, h.min(), target);
    push(metric, op, BUCKET_MAX, h.max(), target);
    if h.count() > 0 {
        for (i, c) in h.nonzero_buckets() {
            push(metric, op, i as u16, c, target);
        }
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
}

impl Snapshot for ClientMetrics {
    fn records(&self, push: &mut dyn FnMut(u8, u8, u16, u64, u16)) {
        let target_id = |i: usize| self.targets[i].min(u32::from(NO_TARGET - 1)) as u16;
        for metric in 0..6 {
            for (i, k, t) in self.active() {
                let (id, cells) = t.counters()[metric];
                push(id, k as u8, BUCKET_NONE, cells[k.index()].get(), target_id(i));
            }
        }
        push(cid::INFLIGHT, NO_OP, BUCKET_NONE, self.inflight.get(), NO_TARGET);
        for (i, k, t) in self.active() {
            histogram_records(&t.rpc_ns[k.index()], cid::RPC_NS, k as u8, target_id(i), push);
        }
        for k in OpKind::ALL {
            histogram_records(&self.call_ns[k.index()], cid::CALL_NS, k as u8, NO_TARGET, push);
        }
        histogram_records(
            &self.inflight_at_send,
            cid::INFLIGHT_AT_SEND,
            NO_OP,
            NO_TARGET,
            push,
        );
        for k in OpKind::ALL {
            histogram_records(
                &self.window_wait_ns[k.index()],
                cid::WINDOW_WAIT_NS,
                k as u8,
                NO_TARGET,
                push,
            );
        }
    }
}

/// The JSON header of a file of `version` written by `source` `id`, worker `worker` on
/// `node`, with `metrics`, and (version 2) the target server ids.
fn header_json(
    version: u32,
    source: Source,
    id: u32,
    worker: u16,
    node: &str,
    metrics: &[MetricDef],
    targets: Option<&[u32]>,
) -> serde_json::Value {
    let v2 = version >= 2;
    let metrics: Vec<serde_json::Value> = metrics
        .iter()
        .map(|m| {
            let mut e = json!({"id": m.id, "name": m.name, "kind": m.kind.name(),
                               "per_op": m.per_op, "unit": m.unit});
            if v2 {
                e["per_target"] = json!(m.per_target);
            }
            e
        })
        .collect();
    let mut header = json!({
        "format": "benchfs-telemetry",
        "version": version,
        "source": source.name(),
        "id": id,
        "worker": worker,
        "node": node,
        "pid": std::process::id(),
        "created_unix_ns": unix_time_ns(),
        "byte_order": "little",
        "record_size": RECORD_SIZE,
        "record_fields": [["t_ns", "u64"], ["value", "u64"], ["id", "u32"], ["seq", "u32"],
                          ["worker", "u16"], ["metric", "u8"], ["op", "u8"], ["bucket", "u16"],
                          [if v2 { "target" } else { "reserved" }, "u16"]],
        "ops": OpKind::ALL.iter().map(|k| k.name()).collect::<Vec<_>>(),
        "no_op": NO_OP,
        "end_metric": METRIC_END,
        "histogram": {"scheme": "log-linear", "sub_bucket_bits": SUB_BUCKET_BITS,
                      "buckets": BUCKETS},
        "special_buckets": {"none": BUCKET_NONE, "count": BUCKET_COUNT, "sum": BUCKET_SUM,
                            "min": BUCKET_MIN, "max": BUCKET_MAX},
        "metrics": metrics,
    });
    if v2 {
        header["no_target"] = json!(NO_TARGET);
    }
    if let Some(t) = targets {
        header["targets"] = json!(t);
    }
    header
}

/// Magic, version, length and JSON header, padded with spaces so that records start on an
/// `align`-byte boundary.
fn encode_preamble(magic: &[u8; 8], version: u32, header: &serde_json::Value, align: usize) -> Vec<u8> {
    let mut json = header.to_string().into_bytes();
    while !(PREAMBLE_SIZE + json.len()).is_multiple_of(align) {
        json.push(b' ');
    }
    let mut out = Vec::with_capacity(PREAMBLE_SIZE + json.len());
    out.extend_from_slice(magic);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&json);
    out
}

/// Creates `dir` if needed and a new file `<stem>.<ext>` (if taken, `<stem>.<n>.<ext>` with
/// the smallest free `n >= first`; `first = 0` means the plain name first) holding `contents`:
/// written under a temporary name and linked into place, so the file appears complete or not
/// at all and no existing file is overwritten. Returns the file (opened for appending), its
/// path and `n`.
fn create_new_file(
    dir: &Path,
    stem: &str,
    ext: &str,
    contents: &[u8],
    first: u32,
) -> Result<(File, PathBuf, u32)> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("telemetry directory {}", dir.display()), e))?;
    let tmp = dir.join(format!(".{stem}.{ext}.{}.tmp", std::process::id()));
    let write_tmp = || -> std::io::Result<()> {
        let mut f = File::create(&tmp)?;
        f.write_all(contents)?;
        Ok(())
    };
    write_tmp().map_err(|e| Error::io(format!("telemetry file {}", tmp.display()), e))?;
    let mut placed = None;
    for n in first..first.saturating_add(10_000) {
        let name = if n == 0 {
            format!("{stem}.{ext}")
        } else {
            format!("{stem}.{n}.{ext}")
        };
        let path = dir.join(name);
        match std::fs::hard_link(&tmp, &path) {
            Ok(()) => {
                placed = Some((path, n));
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                // A file system without hard links: rename, after checking the name is free.
                if path.exists() {
                    continue;
                }
                std::fs::rename(&tmp, &path)
                    .map_err(|_| Error::io(format!("telemetry file {}", path.display()), e))?;
                placed = Some((path, n));
                break;
            }
        }
    }
    let _ = std::fs::remove_file(&tmp);
    let (path, n) = placed.ok_or_else(|| {
        Error::InvalidArgument(format!(
            "too many telemetry files named {stem}.* in {}",
            dir.display()
        ))
    })?;
    let file = OpenOptions::new()
        .append(true)
        .open(&path)
        .map_err(|e| Error::io(format!("telemetry file {}", path.display()), e))?;
    Ok((file, path, n))
}

/// Appends `buf` with one `write(2)`; on failure cuts the file back to `good_len` (or marks
/// it `broken` if even that fails), so that damage never sits in the middle of a file.
fn append_all(file: &mut File, path: &Path, buf: &[u8], good_len: &mut u64, broken: &mut bool) -> Result<()> {
    if *broken {
        return Err(Error::io(
            format!("telemetry file {}", path.display()),
            std::io::Error::other("an earlier write failed and could not be undone"),
        ));
    }
    match file.write_all(buf) {
        Ok(()) => {
            *good_len += buf.len() as u64;
            Ok(())
        }
        Err(e) => {
            if file.set_len(*good_len).is_err() {
                *broken = true;
            }
            Err(Error::io(format!("telemetry file {}", path.display()), e))
        }
    }
}

/// Appends snapshots of one worker's [`WorkerMetrics`] (or one client's [`ClientMetrics`])
/// to its telemetry file.
pub struct SnapshotWriter {
    file: File,
    path: PathBuf,
    id: u32,
    worker: u16,
    seq: u32,
    version: u32,
    /// The `n` of `<stem>.<n>.tel` (0 for the plain name).
    n: u32,
    /// File length after the last complete snapshot (a failed write is cut back to it).
    good_len: u64,
    broken: bool,
    buf: Vec<u8>,
}

impl std::fmt::Debug for SnapshotWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotWriter")
            .field("path", &self.path)
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

impl SnapshotWriter {
    /// Creates `dir` if needed and a new file `server-<id>-w<worker>.tel` in it (if that name
    /// is taken, by an earlier incarnation of the same server, `server-<id>-w<worker>.<n>.tel`),
    /// holding the header: the file appears complete with its header or not at all.
    pub fn create(dir: &Path, server_id: u32, worker: u32, node: &str) -> Result<SnapshotWriter> {
        SnapshotWriter::create_for(Source::Server, dir, server_id, worker, node)
    }

    /// [`create`](Self::create) for any [`Source`]: a server's file is format version 1 with
    /// [`SERVER_METRICS`]; a client's ([`create_client`](Self::create_client)) needs targets.
    pub fn create_for(
        source: Source,
        dir: &Path,
        id: u32,
        worker: u32,
        node: &str,
    ) -> Result<SnapshotWriter> {
        match source {
            Source::Server => SnapshotWriter::create_with(
                source,
                FORMAT_VERSION,
                SERVER_METRICS,
                None,
                dir,
                id,
                worker,
                node,
            ),
            Source::Client => SnapshotWriter::create_client(dir, id, worker, node, &[]),
        }
    }

    /// A client's file `client-<pid>-w<index>.tel` (format version 2) for a client of the
    /// servers `targets` (ids, ascending).
    pub fn create_client(
        dir: &Path,
        pid: u32,
        index: u32,
        node: &str,
        targets: &[u32],
    ) -> Result<SnapshotWriter> {
        if targets.iter().any(|&t| t >= u32::from(NO_TARGET)) {
            return Err(Error::InvalidArgument(format!(
                "client telemetry: server ids must be below {NO_TARGET}"
            )));
        }
        SnapshotWriter::create_with(
            Source::Client,
            FORMAT_VERSION_CLIENT,
            CLIENT_METRICS,
            Some(targets),
            dir,
            pid,
            index,
            node,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn create_with(
        source: Source,
        version: u32,
        metrics: &[MetricDef],
        targets: Option<&[u32]>,
        dir: &Path,
        id: u32,
        worker: u32,
        node: &str,
    ) -> Result<SnapshotWriter> {
        let worker = u16::try_from(worker)
            .map_err(|_| Error::InvalidArgument(format!("telemetry worker index {worker} > 65535")))?;
        let header = encode_preamble(
            &MAGIC,
            version,
            &header_json(version, source, id, worker, node, metrics, targets),
            RECORD_SIZE,
        );
        let stem = format!("{}-{id}-w{worker}", source.name());
        let (file, path, n) = create_new_file(dir, &stem, FILE_EXTENSION, &header, 0)?;
        Ok(SnapshotWriter {
            file,
            path,
            id,
            worker,
            seq: 0,
            version,
            n,
            good_len: header.len() as u64,
            broken: false,
            buf: Vec::with_capacity(64 * RECORD_SIZE),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Snapshots written so far.
    pub fn snapshots(&self) -> u32 {
        self.seq
    }

    /// The `n` of `<stem>.<n>.tel` (0 for the plain name): a trace file beside this one
    /// takes the same.
    pub fn instance(&self) -> u32 {
        self.n
    }

    /// Appends one snapshot of the cumulative values of `m`, stamped `unix_time_ns`, with one
    /// `write(2)`. Costs O(buckets), independent of the I/O done since the last snapshot. On
    /// an error the file is cut back to its last complete snapshot, so a later snapshot never
    /// follows a torn one.
    pub fn write(&mut self, m: &dyn Snapshot, unix_time_ns: u64) -> Result<()> {
        self.encode(m, unix_time_ns);
        append_all(
            &mut self.file,
            &self.path,
            &self.buf,
            &mut self.good_len,
            &mut self.broken,
        )?;
        self.seq = self.seq.wrapping_add(1);
        Ok(())
    }

    fn encode(&mut self, m: &dyn Snapshot, t_ns: u64) {
        // Version 1 has no target field: its `reserved` is 0.
        let none = if self.version >= 2 { NO_TARGET } else { 0 };
        let base = Record {
            t_ns,
            value: 0,
            id: self.id,
            seq: self.seq,
            worker: self.worker,
            metric: 0,
            op: NO_OP,
            bucket: BUCKET_NONE,
            target: none,
        };
        let buf = &mut self.buf;
        buf.clear();
        m.records(&mut |metric, op, bucket, value, target| {
            Record {
                metric,
                op,
                bucket,
                value,
                target: if target == NO_TARGET { none } else { target },
                ..base
            }
            .encode(buf);
        });
        let records = (buf.len() / RECORD_SIZE) as u64;
        Record {
            metric: METRIC_END,
            value: records,
            ..base
        }
        .encode(buf);
    }
}

// ---------------------------------------------------------------------------------------------
// Per-operation traces

/// First 8 bytes of every trace file.
pub const TRACE_MAGIC: [u8; 8] = *b"BFSTRACE";
/// Trace format version.
pub const TRACE_VERSION: u32 = 1;
/// Bytes per trace record.
pub const TRACE_RECORD_SIZE: usize = 72;
/// File name extension of trace files.
pub const TRACE_EXTENSION: &str = "trace";
/// `flags` bit of a trace record whose operation failed.
pub const TRACE_FLAG_ERROR: u8 = 1;

/// One storage operation as traced (layout in `docs/telemetry.md`, "Per-operation traces").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TraceRecord {
    /// Arrival at the server, ns since the Unix epoch.
    pub t_ns: u64,
    pub queue_ns: u64,
    pub device_ns: u64,
    pub total_ns: u64,
    pub file: u128,
    pub chunk: u64,
    pub bytes: u64,
    pub server: u32,
    pub worker: u16,
    /// [`OpKind`] index.
    pub op: u8,
    pub flags: u8,
}

impl TraceRecord {
    /// The 72 little-endian bytes of the record.
    #[inline]
    pub fn encode(&self) -> [u8; TRACE_RECORD_SIZE] {
        let mut b = [0u8; TRACE_RECORD_SIZE];
        b[0..8].copy_from_slice(&self.t_ns.to_le_bytes());
        b[8..16].copy_from_slice(&self.queue_ns.to_le_bytes());
        b[16..24].copy_from_slice(&self.device_ns.to_le_bytes());
        b[24..32].copy_from_slice(&self.total_ns.to_le_bytes());
        b[32..48].copy_from_slice(&self.file.to_le_bytes());
        b[48..56].copy_from_slice(&self.chunk.to_le_bytes());
        b[56..64].copy_from_slice(&self.bytes.to_le_bytes());
        b[64..68].copy_from_slice(&self.server.to_le_bytes());
        b[68..70].copy_from_slice(&self.worker.to_le_bytes());
        b[70] = self.op;
        b[71] = self.flags;
        b
    }

    /// Decodes 72 bytes (`b` must hold at least that many).
    pub fn decode(b: &[u8]) -> TraceRecord {
        let u64_at = |o: usize| u64::from_le_bytes(std::array::from_fn(|i| b[o + i]));
        TraceRecord {
            t_ns: u64_at(0),
            queue_ns: u64_at(8),
            device_ns: u64_at(16),
            total_ns: u64_at(24),
            file: u128::from_le_bytes(std::array::from_fn(|i| b[32 + i])),
            chunk: u64_at(48),
            bytes: u64_at(56),
            server: u32::from_le_bytes(std::array::from_fn(|i| b[64 + i])),
            worker: u16::from_le_bytes([b[68], b[69]]),
            op: b[70],
            flags: b[71],
        }
    }
}

/// A worker's trace records between two snapshots: a fixed buffer of `capacity` encoded
/// records, allocated once. [`push`](Self::push) copies 72 bytes (no allocation, no
/// formatting, no lock; the worker owns it); when full, records are dropped and counted until
/// [`TraceWriter::flush`] empties it, so memory is bounded whatever the load.
pub struct TraceRing {
    buf: RefCell<Vec<u8>>,
    capacity: usize,
    dropped: Cell<u64>,
}

impl std::fmt::Debug for TraceRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceRing")
            .field("len", &self.len())
            .field("capacity", &self.capacity)
            .field("dropped", &self.dropped.get())
            .finish()
    }
}

impl TraceRing {
    /// A ring of `capacity` records (at least 1).
    pub fn new(capacity: usize) -> TraceRing {
        let capacity = capacity.max(1);
        TraceRing {
            buf: RefCell::new(Vec::with_capacity(capacity * TRACE_RECORD_SIZE)),
            capacity,
            dropped: Cell::new(0),
        }
    }

    /// Adds a record; false (and counted in [`dropped`](Self::dropped)) if the ring is full.
    #[inline]
    pub fn push(&self, r: &TraceRecord) -> bool {
        let mut buf = self.buf.borrow_mut();
        if buf.len() >= self.capacity * TRACE_RECORD_SIZE {
            self.dropped.set(self.dropped.get() + 1);
            return false;
        }
        buf.extend_from_slice(&r.encode());
        true
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.buf.borrow().len() / TRACE_RECORD_SIZE
    }

    pub fn is_empty(&self) -> bool {
        self.buf.borrow().is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Records dropped because the ring was full, since it was made.
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }

    /// The held records, then empties the ring (its memory is kept).
    fn drain_with<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        let mut buf = self.buf.borrow_mut();
        let r = f(&buf);
        buf.clear();
        r
    }
}

/// Appends a worker's [`TraceRing`] to its trace file, one `write(2)` per flush.
pub struct TraceWriter {
    file: File,
    path: PathBuf,
    good_len: u64,
    broken: bool,
    records: u64,
}

impl std::fmt::Debug for TraceWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceWriter")
            .field("path", &self.path)
            .field("records", &self.records)
            .finish_non_exhaustive()
    }
}

impl TraceWriter {
    /// Creates `server-<id>-w<worker>[.<n>].trace` in `dir` (`n` as the worker's `.tel` file,
    /// [`SnapshotWriter::instance`]; the next free one if taken) holding its header, written
    /// like a `.tel` file's (temporary name, then linked into place).
    pub fn create(
        dir: &Path,
        server_id: u32,
        worker: u32,
        node: &str,
        instance: u32,
        ring_records: usize,
    ) -> Result<TraceWriter> {
        let worker = u16::try_from(worker)
            .map_err(|_| Error::InvalidArgument(format!("trace worker index {worker} > 65535")))?;
        let header = json!({
            "format": "benchfs-trace",
            "version": TRACE_VERSION,
            "source": "server",
            "id": server_id,
            "worker": worker,
            "node": node,
            "pid": std::process::id(),
            "created_unix_ns": unix_time_ns(),
            "byte_order": "little",
            "record_size": TRACE_RECORD_SIZE,
            "record_fields": [["t_ns", "u64"], ["queue_ns", "u64"], ["device_ns", "u64"],
                              ["total_ns", "u64"], ["file_lo", "u64"], ["file_hi", "u64"],
                              ["chunk", "u64"], ["bytes", "u64"], ["server", "u32"],
                              ["worker", "u16"], ["op", "u8"], ["flags", "u8"]],
            "ops": OpKind::ALL.iter().map(|k| k.name()).collect::<Vec<_>>(),
            "ring_records": ring_records,
        });
        let bytes = encode_preamble(&TRACE_MAGIC, TRACE_VERSION, &header, 8);
        let stem = format!("server-{server_id}-w{worker}");
        let (file, path, _) = create_new_file(dir, &stem, TRACE_EXTENSION, &bytes, instance)?;
        Ok(TraceWriter {
            file,
            path,
            good_len: bytes.len() as u64,
            broken: false,
            records: 0,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Appends the ring's records with one `write(2)` and empties the ring; returns how many
    /// were written. On an error the file is cut back to its last complete flush and the
    /// ring's records are lost (they would only grow the next flush).
    pub fn flush(&mut self, ring: &TraceRing) -> Result<usize> {
        let (file, path, good_len, broken) =
            (&mut self.file, &self.path, &mut self.good_len, &mut self.broken);
        let n = ring.drain_with(|bytes| {
            if bytes.is_empty() {
                return Ok(0);
            }
            append_all(file, path, bytes, good_len, broken).map(|()| bytes.len() / TRACE_RECORD_SIZE)
        })?;
        self.records += n as u64;
        Ok(n)
    }
}

/// A trace file as read back: its header and its complete records.
#[derive(Debug, Clone)]
pub struct TraceFile {
    pub header: serde_json::Value,
    pub records: Vec<TraceRecord>,
    /// Bytes of a trailing partial record (a flush torn by a crash); ignored.
    pub torn_bytes: u64,
}

/// Reads a trace file; a torn last record is skipped, any other damage is an error naming
/// the file.
pub fn read_trace(path: &Path) -> Result<TraceFile> {
    let bad = |why: String| Error::InvalidArgument(format!("trace file {}: {why}", path.display()));
    let bytes = std::fs::read(path).map_err(|e| Error::io(format!("trace file {}", path.display()), e))?;
    if bytes.len() < PREAMBLE_SIZE || bytes[..8] != TRACE_MAGIC {
        return Err(bad("not a BenchFS trace file (bad magic)".into()));
    }
    let version = u32::from_le_bytes(std::array::from_fn(|i| bytes[8 + i]));
    if version != TRACE_VERSION {
        return Err(bad(format!(
            "trace format version {version}, this reader reads version {TRACE_VERSION}"
        )));
    }
    let header_len = u32::from_le_bytes(std::array::from_fn(|i| bytes[12 + i])) as usize;
    let start = PREAMBLE_SIZE + header_len;
    if start > bytes.len() || !start.is_multiple_of(8) {
        return Err(bad(format!("header length {header_len} does not fit the file")));
    }
    let header: serde_json::Value = serde_json::from_slice(&bytes[PREAMBLE_SIZE..start])
        .map_err(|e| bad(format!("malformed JSON header: {e}")))?;
    let body = &bytes[start..];
    let records: Vec<TraceRecord> = body
        .chunks_exact(TRACE_RECORD_SIZE)
        .map(TraceRecord::decode)
        .collect();
    let (id, worker) = (header["id"].as_u64(), header["worker"].as_u64());
    if let Some(r) = records
        .iter()
        .find(|r| Some(u64::from(r.server)) != id || Some(u64::from(r.worker)) != worker)
    {
        return Err(bad(format!(
            "a record names server {} worker {}, not the header's",
            r.server, r.worker
        )));
    }
    Ok(TraceFile {
        header,
        records,
        torn_bytes: (body.len() % TRACE_RECORD_SIZE) as u64,
    })
}

// ---------------------------------------------------------------------------------------------
// Reader

/// A telemetry file as read back: its header and the records of its complete snapshots.
#[derive(Debug, Clone)]
pub struct TelemetryFile {
    pub header: serde_json::Value,
    /// Records of complete snapshots, end markers left out.
    pub records: Vec<Record>,
    pub snapshots: u32,
    /// Bytes after the last complete snapshot (a snapshot being written, or torn); ignored.
    pub torn_bytes: u64,
}

/// Reads a telemetry file (format version 1 or 2), skipping a torn last snapshot; any other
/// damage is an error that names the file.
pub fn read_file(path: &Path) -> Result<TelemetryFile> {
    let bad = |why: String| Error::InvalidArgument(format!("telemetry file {}: {why}", path.display()));
    let bytes =
        std::fs::read(path).map_err(|e| Error::io(format!("telemetry file {}", path.display()), e))?;
    if bytes.len() < PREAMBLE_SIZE || bytes[..8] != MAGIC {
        return Err(bad("not a BenchFS telemetry file (bad magic)".into()));
    }
    let version = u32::from_le_bytes(std::array::from_fn(|i| bytes[8 + i]));
    if version != FORMAT_VERSION && version != FORMAT_VERSION_CLIENT {
        return Err(bad(format!(
            "format version {version}, this reader reads versions {FORMAT_VERSION} and \
             {FORMAT_VERSION_CLIENT}"
        )));
    }
    let header_len = u32::from_le_bytes(std::array::from_fn(|i| bytes[12 + i])) as usize;
    let start = PREAMBLE_SIZE + header_len;
    if start > bytes.len() || !start.is_multiple_of(RECORD_SIZE) {
        return Err(bad(format!("header length {header_len} does not fit the file")));
    }
    let header: serde_json::Value = serde_json::from_slice(&bytes[PREAMBLE_SIZE..start])
        .map_err(|e| bad(format!("malformed JSON header: {e}")))?;
    let mut records = Vec::new();
    let mut pending = Vec::new();
    let mut snapshots = 0u32;
    let mut complete_end = start;
    for (n, chunk) in bytes[start..].chunks_exact(RECORD_SIZE).enumerate() {
        let r = Record::decode(chunk);
        if r.metric == METRIC_END {
            if r.value != pending.len() as u64 {
                return Err(bad(format!(
                    "snapshot {} ends after {} records but says {}",
                    r.seq,
                    pending.len(),
                    r.value
                )));
            }
            records.append(&mut pending);
            snapshots += 1;
            complete_end = start + (n + 1) * RECORD_SIZE;
        } else {
            pending.push(r);
        }
    }
    Ok(TelemetryFile {
        header,
        records,
        snapshots,
        torn_bytes: (bytes.len() - complete_end) as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_values_are_exact() {
        for v in 0..8u64 {
            assert_eq!(bucket_index(v), v as usize);
            assert_eq!(bucket_lo(v as usize), v);
            assert_eq!(bucket_hi(v as usize), v);
        }
        let h = Histogram::new();
        for d in [1u64, 2, 2, 3, 3, 3] {
            h.record(d);
        }
        assert_eq!(
            (h.bucket_count(1), h.bucket_count(2), h.bucket_count(3)),
            (1, 2, 3)
        );
        assert_eq!(h.quantile(0.0), 1);
        assert_eq!(h.quantile(0.5), 2);
        assert_eq!(h.quantile(1.0), 3);
    }

    #[test]
    fn bounds_are_contiguous_monotone_and_cover_u64() {
        assert_eq!(BUCKETS, 252);
        assert_eq!(bucket_lo(0), 0);
        assert_eq!(bucket_hi(BUCKETS - 1), u64::MAX);
        for i in 1..BUCKETS {
            assert_eq!(bucket_lo(i), bucket_hi(i - 1) + 1, "bucket {i}");
            assert!(bucket_hi(i) >= bucket_lo(i));
            // Relative width at most 25% of the lower bound beyond the exact buckets.
            let width = bucket_hi(i) - bucket_lo(i) + 1;
            if i >= 8 {
                assert!(width as f64 <= 0.25 * bucket_lo(i) as f64 + 1.0, "bucket {i}");
            } else {
                assert_eq!(width, 1);
            }
            assert_eq!(bucket_index(bucket_lo(i)), i);
            assert_eq!(bucket_index(bucket_hi(i)), i);
        }
    }

    #[test]
    fn every_u64_lands_in_its_bucket() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut values: Vec<u64> = (0..64)
            .flat_map(|b| [1u64 << b, (1u64 << b) - 1, (1u64 << b) + 1])
            .collect();
        values.extend([u64::MAX, u64::MAX - 1, 60_000_000_000, 3_600_000_000_000]);
        for _ in 0..100_000 {
            // xorshift, with random bit lengths so that every octave is hit
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            values.push(x >> (x % 64));
        }
        for v in values {
            let i = bucket_index(v);
            assert!(i < BUCKETS);
            assert!(bucket_lo(i) <= v && v <= bucket_hi(i), "{v} in bucket {i}");
        }
    }

    #[test]
    fn quantile_is_within_bucket_error() {
        let h = Histogram::new();
        let mut values: Vec<u64> = (1..=10_000u64).map(|i| i * i * 37 + 1000).collect();
        for &v in &values {
            h.record(v);
        }
        values.sort_unstable();
        assert_eq!(h.count(), values.len() as u64);
        assert_eq!(h.sum(), values.iter().sum::<u64>());
        assert_eq!((h.min(), h.max()), (values[0], values[values.len() - 1]));
        for q in [0.0, 0.01, 0.1, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0] {
            let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
            let exact = values[rank - 1];
            let est = h.quantile(q);
            let i = bucket_index(exact);
            assert!(
                bucket_lo(i) <= est && est <= bucket_hi(i),
                "q={q}: {est} not in bucket of {exact}"
            );
            assert!((est as f64 - exact as f64).abs() <= 0.25 * exact as f64, "q={q}");
        }
        assert_eq!(h.quantile(0.0), values[0]);
        assert_eq!(h.quantile(1.0), values[values.len() - 1]);
        assert_eq!(Histogram::new().quantile(0.5), 0);
    }

    #[test]
    fn merge_adds_everything() {
        let (a, b) = (Histogram::new(), Histogram::new());
        for v in [5u64, 500, 5000] {
            a.record(v);
        }
        for v in [1u64, 1_000_000] {
            b.record(v);
        }
        a.merge_from(&b);
        assert_eq!(
            (a.count(), a.sum(), a.min(), a.max()),
            (5, 1_005_506, 1, 1_000_000)
        );
        assert_eq!(a.nonzero_buckets().map(|(_, c)| c).sum::<u64>(), 5);
        let c = Histogram::new();
        c.record_n(7, 3);
        c.record_n(9, 0);
        assert_eq!(
            (c.count(), c.sum(), c.min(), c.max(), c.bucket_count(7)),
            (3, 21, 7, 7, 3)
        );
        a.merge_from(&Histogram::new());
        assert_eq!(a.min(), 1);
        a.reset();
        assert_eq!((a.count(), a.min(), a.max()), (0, 0, 0));
    }

    fn exercise(m: &WorkerMetrics) {
        m.record_submit(3);
        m.record_submit(0);
        for d in [1, 2] {
            m.record_inflight(d);
        }
        m.record_inflight_n(3, 1);
        m.record_inflight_n(9, 0);
        m.record_op(OpKind::Write, 100, 2_000, 3_000, 65536, true);
        m.record_op(OpKind::Read, 50, 1_000, 1_500, 4096, true);
        m.record_op(OpKind::Read, 50, 1_000, 1_500, 4096, false);
        m.count_pool_wait();
        m.count_handle(true);
        m.count_handle(false);
        m.count_rejected();
        m.count_malformed();
        m.set_gauges(7, 3, 29);
    }

    #[test]
    fn disabled_metrics_record_nothing() {
        let m = WorkerMetrics::new(false);
        exercise(&m);
        assert!(!m.enabled());
        assert_eq!(m.submit_batch().count() + m.inflight_at_submit().count(), 0);
        for k in OpKind::ALL {
            assert_eq!((m.ops(k), m.bytes(k), m.errors(k)), (0, 0, 0));
            assert_eq!(
                m.total_ns(k).count() + m.device_ns(k).count() + m.queue_wait_ns(k).count(),
                0
            );
        }
        let scalars = [
            m.pool_waits(),
            m.handle_hits(),
            m.handle_misses(),
            m.rejected_busy(),
            m.malformed(),
            m.queue_depth(),
            m.in_service(),
            m.buffers_free(),
            m.refused_auth(),
        ];
        assert_eq!(scalars, [0; 9]);
    }

    #[test]
    fn enabled_metrics_record() {
        let m = WorkerMetrics::new(true);
        exercise(&m);
        assert_eq!(m.submit_batch().count(), 1);
        assert_eq!(m.inflight_at_submit().count(), 3);
        assert_eq!(
            (m.ops(OpKind::Read), m.bytes(OpKind::Read), m.errors(OpKind::Read)),
            (2, 4096, 1)
        );
        assert_eq!(m.total_ns(OpKind::Read).count(), 2);
        assert_eq!((m.handle_hits(), m.handle_misses()), (1, 1));
        assert_eq!((m.queue_depth(), m.in_service(), m.buffers_free()), (7, 3, 29));
        let total = WorkerMetrics::new(true);
        total.merge_from(&m);
        total.merge_from(&m);
        assert_eq!(total.ops(OpKind::Read), 4);
        assert_eq!(total.inflight_at_submit().count(), 6);
        assert_eq!(total.pool_waits(), 2);
    }

    fn tempdir() -> Result<tempfile::TempDir> {
        tempfile::tempdir().map_err(|e| Error::io("tempdir", e))
    }

    /// value of the record (metric, op, bucket) in the last snapshot
    fn last(f: &TelemetryFile, metric: u8, op: u8, bucket: u16) -> Option<u64> {
        f.records
            .iter()
            .rev()
            .find(|r| r.metric == metric && r.op == op && r.bucket == bucket)
            .map(|r| r.value)
    }

    #[test]
    fn writer_round_trip() -> Result<()> {
        let dir = tempdir()?;
        let tdir = dir.path().join("telemetry");
        let m = WorkerMetrics::new(true);
        let mut w = SnapshotWriter::create(&tdir, 3, 1, "node-a")?;
        assert_eq!(
            w.path().file_name().and_then(|n| n.to_str()),
            Some("server-3-w1.tel")
        );
        w.write(&m, 1_000)?;
        exercise(&m);
        w.write(&m, 2_000)?;
        let f = read_file(w.path())?;
        assert_eq!(f.snapshots, 2);
        assert_eq!(f.torn_bytes, 0);
        assert_eq!(f.header["version"], 1);
        assert_eq!(f.header["source"], "server");
        assert_eq!(f.header["id"], 3);
        assert_eq!(f.header["worker"], 1);
        assert_eq!(f.header["node"], "node-a");
        assert_eq!(f.header["histogram"]["buckets"], BUCKETS);
        assert_eq!(
            f.header["metrics"].as_array().map(Vec::len),
            Some(SERVER_METRICS.len())
        );
        assert!(f.records.iter().all(|r| r.id == 3 && r.worker == 1));
        assert!(f
            .records
            .iter()
            .all(|r| (r.seq, r.t_ns) == (0, 1_000) || (r.seq, r.t_ns) == (1, 2_000)));
        let read = OpKind::Read as u8;
        assert_eq!(last(&f, id::OPS, read, BUCKET_NONE), Some(2));
        assert_eq!(last(&f, id::BYTES, read, BUCKET_NONE), Some(4096));
        assert_eq!(last(&f, id::ERRORS, read, BUCKET_NONE), Some(1));
        assert_eq!(last(&f, id::BUFFERS_FREE, NO_OP, BUCKET_NONE), Some(29));
        assert_eq!(last(&f, id::TOTAL_NS, read, BUCKET_COUNT), Some(2));
        assert_eq!(last(&f, id::TOTAL_NS, read, BUCKET_SUM), Some(3_000));
        assert_eq!(last(&f, id::TOTAL_NS, read, BUCKET_MAX), Some(1_500));
        let b = bucket_index(1_500) as u16;
        assert_eq!(last(&f, id::TOTAL_NS, read, b), Some(2));
        // Depths 1, 2 and 3 are apart in the file too.
        for d in 1..=3u16 {
            assert_eq!(last(&f, id::INFLIGHT_AT_SUBMIT, NO_OP, d), Some(1));
        }
        // The first snapshot had no histogram buckets, only the 4 statistics per histogram.
        let first = f.records.iter().filter(|r| r.seq == 0).count();
        assert_eq!(first, 12 + 11 + 14 * 4);
        // A second writer for the same server and worker gets a new file; nothing is clobbered.
        let w2 = SnapshotWriter::create(&tdir, 3, 1, "node-a")?;
        assert_eq!(
            w2.path().file_name().and_then(|n| n.to_str()),
            Some("server-3-w1.1.tel")
        );
        assert_eq!(read_file(w.path())?.snapshots, 2);
        let names: Vec<_> = std::fs::read_dir(&tdir)
            .map_err(|e| Error::io("readdir", e))?
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .collect();
        assert_eq!(names.len(), 2, "no temporary file left: {names:?}");
        Ok(())
    }

    #[test]
    fn torn_tail_is_skipped() -> Result<()> {
        let dir = tempdir()?;
        let m = WorkerMetrics::new(true);
        exercise(&m);
        let mut w = SnapshotWriter::create(dir.path(), 0, 0, "n")?;
        w.write(&m, 1)?;
        w.write(&m, 2)?;
        let path = w.path().to_path_buf();
        let full = std::fs::read(&path).map_err(|e| Error::io("read", e))?;
        let one = read_file(&path)?;
        let per_snapshot = one.records.len() / 2;
        // Cut inside the last snapshot at every record boundary and inside a record.
        let snapshot_bytes = (per_snapshot + 1) * RECORD_SIZE;
        for cut in [
            1,
            RECORD_SIZE - 1,
            RECORD_SIZE,
            5 * RECORD_SIZE + 7,
            snapshot_bytes - 1,
        ] {
            std::fs::write(&path, &full[..full.len() - cut]).map_err(|e| Error::io("write", e))?;
            let f = read_file(&path)?;
            assert_eq!(f.snapshots, 1, "cut {cut}");
            assert_eq!(f.records.len(), per_snapshot);
            assert_eq!(f.torn_bytes as usize, snapshot_bytes - cut);
        }
        // Only the header: zero snapshots, not an error.
        let header_len = full.len() - 2 * snapshot_bytes;
        std::fs::write(&path, &full[..header_len]).map_err(|e| Error::io("write", e))?;
        assert_eq!(read_file(&path)?.snapshots, 0);
        // Damage that is not a torn tail is an error naming the file.
        let mut bad = full.clone();
        bad[8] = 3;
        std::fs::write(&path, &bad).map_err(|e| Error::io("write", e))?;
        let e = read_file(&path).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            e.contains("version 3") && e.contains(&path.display().to_string()),
            "{e}"
        );
        std::fs::write(&path, b"garbage, not telemetry").map_err(|e| Error::io("write", e))?;
        let e = read_file(&path).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("bad magic"), "{e}");
        Ok(())
    }

    fn trace_record(i: u64, op: OpKind) -> TraceRecord {
        TraceRecord {
            t_ns: 1_700_000_000_000_000_000 + i,
            queue_ns: i,
            device_ns: 2 * i,
            total_ns: 3 * i,
            file: (u128::from(i) << 64) | 0xABCD,
            chunk: i,
            bytes: 4096,
            server: 3,
            worker: 1,
            op: op as u8,
            flags: (i % 2) as u8,
        }
    }

    #[test]
    fn trace_record_layout_is_the_documented_one() {
        let r = trace_record(7, OpKind::Read);
        let b = r.encode();
        assert_eq!(b.len(), 72);
        assert_eq!(TraceRecord::decode(&b), r);
        assert_eq!(u64::from_le_bytes(std::array::from_fn(|i| b[32 + i])), 0xABCD);
        assert_eq!(u64::from_le_bytes(std::array::from_fn(|i| b[40 + i])), 7);
        assert_eq!(u32::from_le_bytes(std::array::from_fn(|i| b[64 + i])), 3);
        assert_eq!((b[70], b[71]), (OpKind::Read as u8, 1));
    }

    #[test]
    fn trace_ring_drops_when_full_flushes_and_wraps_around() -> Result<()> {
        let dir = tempdir()?;
        let ring = TraceRing::new(4);
        let mut w = TraceWriter::create(dir.path(), 3, 1, "node-t", 0, 4)?;
        assert_eq!(
            w.path().file_name().and_then(|n| n.to_str()),
            Some("server-3-w1.trace")
        );
        // Nothing to flush: no write, the file is its header.
        assert_eq!(w.flush(&ring)?, 0);
        for i in 0..6 {
            let kept = ring.push(&trace_record(i, OpKind::Write));
            assert_eq!(kept, i < 4, "record {i}");
        }
        assert_eq!((ring.len(), ring.dropped()), (4, 2));
        assert_eq!(w.flush(&ring)?, 4);
        assert!(ring.is_empty());
        // After a flush the ring starts over from its beginning, and drops again when full.
        for i in 10..15 {
            ring.push(&trace_record(i, OpKind::Read));
        }
        assert_eq!((ring.len(), ring.dropped()), (4, 3));
        assert_eq!(w.flush(&ring)?, 4);
        assert_eq!(w.records(), 8);
        let f = read_trace(w.path())?;
        assert_eq!(f.torn_bytes, 0);
        assert_eq!(f.header["format"], "benchfs-trace");
        assert_eq!(f.header["id"], 3);
        assert_eq!(f.header["worker"], 1);
        assert_eq!(f.header["ring_records"], 4);
        let chunks: Vec<u64> = f.records.iter().map(|r| r.chunk).collect();
        assert_eq!(chunks, [0, 1, 2, 3, 10, 11, 12, 13]);
        assert_eq!(f.records[5], trace_record(11, OpKind::Read));
        // The header is padded so records start on an 8-byte boundary.
        let len = std::fs::metadata(w.path())
            .map_err(|e| Error::io("stat", e))?
            .len();
        assert_eq!((len - 8 * 72) % 8, 0);
        // A torn last record is skipped; a second writer of the same worker gets `.1`.
        let mut bytes = std::fs::read(w.path()).map_err(|e| Error::io("read", e))?;
        bytes.truncate(bytes.len() - 5);
        std::fs::write(w.path(), &bytes).map_err(|e| Error::io("write", e))?;
        let f = read_trace(w.path())?;
        assert_eq!((f.records.len(), f.torn_bytes), (7, 67));
        let w2 = TraceWriter::create(dir.path(), 3, 1, "node-t", 0, 4)?;
        assert_eq!(
            w2.path().file_name().and_then(|n| n.to_str()),
            Some("server-3-w1.1.trace")
        );
        Ok(())
    }

    #[test]
    fn trace_dropped_is_a_server_counter() -> Result<()> {
        let dir = tempdir()?;
        let m = WorkerMetrics::new(true);
        m.count_trace_dropped();
        m.count_trace_dropped();
        let mut w = SnapshotWriter::create(dir.path(), 0, 0, "n")?;
        w.write(&m, 1)?;
        let f = read_file(w.path())?;
        assert_eq!(last(&f, id::TRACE_DROPPED, NO_OP, BUCKET_NONE), Some(2));
        assert!(f.header["metrics"]
            .as_array()
            .is_some_and(|ms| ms.iter().any(|e| e["id"] == 13 && e["name"] == "trace_dropped")));
        assert!(
            f.records.iter().all(|r| r.target == 0),
            "version 1: reserved is 0"
        );
        Ok(())
    }

    #[test]
    fn client_snapshots_are_version_2_with_active_targets_only() -> Result<()> {
        let dir = tempdir()?;
        let m = ClientMetrics::new(vec![0, 1, 2], true);
        let mut w = SnapshotWriter::create_client(dir.path(), 4242, 0, "cnode", m.targets())?;
        assert_eq!(
            w.path().file_name().and_then(|n| n.to_str()),
            Some("client-4242-w0.tel")
        );
        w.write(&m, 1_000)?;
        // Two write attempts to server 2 (one a retry after a timeout), a read to server 0.
        m.record_window_wait(OpKind::Write, 500);
        m.attempt_sent(2, OpKind::Write, false);
        m.count_timeout(2, OpKind::Write);
        m.attempt_done(2, OpKind::Write, 5_000_000);
        m.attempt_sent(2, OpKind::Write, true);
        assert_eq!(m.inflight(), 1);
        m.attempt_done(2, OpKind::Write, 40_000);
        m.count_bytes(2, OpKind::Write, 65536);
        m.attempt_sent(0, OpKind::Read, false);
        m.attempt_done(0, OpKind::Read, 30_000);
        m.count_bytes(0, OpKind::Read, 4096);
        m.record_call(OpKind::Write, 6_000_000);
        w.write(&m, 2_000)?;
        let f = read_file(w.path())?;
        assert_eq!(f.snapshots, 2);
        assert_eq!(f.header["version"], 2);
        assert_eq!(f.header["source"], "client");
        assert_eq!(f.header["targets"], json!([0, 1, 2]));
        assert_eq!(f.header["no_target"], 65535);
        // The first snapshot has no per-target series (nothing sent yet).
        let first: Vec<&Record> = f.records.iter().filter(|r| r.seq == 0).collect();
        assert!(first.iter().all(|r| r.target == NO_TARGET));
        // 1 gauge + 4 stats x (4 call_ns + 1 inflight_at_send + 4 window_wait_ns)
        assert_eq!(first.len(), 1 + 4 * 9);
        let second: Vec<&Record> = f.records.iter().filter(|r| r.seq == 1).collect();
        let get = |metric: u8, op: OpKind, target: u16, bucket: u16| {
            second
                .iter()
                .find(|r| r.metric == metric && r.op == op as u8 && r.target == target && r.bucket == bucket)
                .map(|r| r.value)
        };
        assert_eq!(get(cid::REQUESTS, OpKind::Write, 2, BUCKET_NONE), Some(2));
        assert_eq!(get(cid::RETRIES, OpKind::Write, 2, BUCKET_NONE), Some(1));
        assert_eq!(get(cid::TIMEOUTS, OpKind::Write, 2, BUCKET_NONE), Some(1));
        assert_eq!(get(cid::BYTES, OpKind::Write, 2, BUCKET_NONE), Some(65536));
        assert_eq!(get(cid::RPC_NS, OpKind::Write, 2, BUCKET_COUNT), Some(2));
        assert_eq!(get(cid::RPC_NS, OpKind::Write, 2, BUCKET_MAX), Some(5_000_000));
        assert_eq!(get(cid::REQUESTS, OpKind::Read, 0, BUCKET_NONE), Some(1));
        // Pairs that sent nothing are not written: no read to 2, nothing at all to 1.
        assert_eq!(get(cid::REQUESTS, OpKind::Read, 2, BUCKET_NONE), None);
        assert!(second.iter().all(|r| r.target != 1));
        assert_eq!(get(cid::CALL_NS, OpKind::Write, NO_TARGET, BUCKET_COUNT), Some(1));
        assert_eq!(
            get(cid::WINDOW_WAIT_NS, OpKind::Write, NO_TARGET, BUCKET_SUM),
            Some(500)
        );
        let at_send = |b: u16| get(cid::INFLIGHT_AT_SEND, OpKind::Write, NO_TARGET, b);
        assert_eq!(at_send(BUCKET_COUNT), None, "inflight_at_send is not per op");
        assert!(second.iter().any(|r| r.metric == cid::INFLIGHT_AT_SEND
            && r.op == NO_OP
            && r.bucket == BUCKET_COUNT
            && r.value == 3));
        // Per-target metrics carry a target, every other record NO_TARGET.
        for r in &second {
            let def = CLIENT_METRICS.iter().find(|d| d.id == r.metric);
            assert_eq!(def.map(|d| d.per_target), Some(r.target != NO_TARGET), "{r:?}");
        }
        // A disabled client records nothing and allocates no per-target series.
        let off = ClientMetrics::new(vec![0], false);
        off.attempt_sent(0, OpKind::Read, false);
        off.record_call(OpKind::Read, 5);
        assert_eq!(
            (off.requests(0, OpKind::Read), off.call_ns(OpKind::Read).count()),
            (0, 0)
        );
        assert!(off.rpc_ns(0, OpKind::Read).is_none());
        Ok(())
    }

    #[test]
    fn snapshot_cost_is_bounded_by_buckets() -> Result<()> {
        // Every histogram full in every bucket: the largest snapshot there can be.
        let m = WorkerMetrics::new(true);
        for i in 0..BUCKETS {
            let v = bucket_lo(i);
            m.record_inflight(v.min(u64::from(u32::MAX)) as u32);
            for k in OpKind::ALL {
                m.record_op(k, v, v, v, 1, true);
            }
        }
        let mut buf = SnapshotWriter {
            file: tempfile::tempfile().map_err(|e| Error::io("tempfile", e))?,
            path: PathBuf::new(),
            id: 0,
            worker: 0,
            seq: 0,
            version: FORMAT_VERSION,
            n: 0,
            good_len: 0,
            broken: false,
            buf: Vec::new(),
        };
        buf.encode(&m, 0);
        let records = buf.buf.len() / RECORD_SIZE;
        assert!(records <= 12 + 10 + 14 * (4 + BUCKETS) + 1, "{records}");
        Ok(())
    }
}
