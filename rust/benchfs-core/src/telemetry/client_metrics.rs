//! The metrics of one client, per target server: their catalogue and [`ClientMetrics`].

use std::cell::{Cell, OnceCell};

use super::catalogue::{def, per_target, MetricDef, MetricKind, OpKind};
use super::histogram::Histogram;
use super::server_metrics::bump;
use super::snapshot::{histogram_records, Snapshot, BUCKET_NONE, NO_OP, NO_TARGET};

// Metrics of one client

pub(super) mod cid {
    pub const REQUESTS: u8 = 1;
    pub const BYTES: u8 = 2;
    pub const RETRIES: u8 = 3;
    pub const TIMEOUTS: u8 = 4;
    pub const ERRORS: u8 = 5;
    pub const BUSY: u8 = 6;
    pub const INFLIGHT: u8 = 7;
    pub const HELLO_RESENDS: u8 = 8;
    pub const RPC_NS: u8 = 16;
    pub const CALL_NS: u8 = 17;
    pub const INFLIGHT_AT_SEND: u8 = 18;
    pub const WINDOW_WAIT_NS: u8 = 19;
    pub const CONNECT_NS: u8 = 20;
    /// The call stages, in [`CALL_STAGES`] order.
    pub const CALL_SEND_NS: u8 = 21;
}

/// The stages a data call's time is split into (`call_ns` = their sum, call by call; a stage
/// a call did not have records 0): its critical request's (the one answered last) time from
/// when it could have been sent to its send (window slot, connection, the client's own time),
/// time in the server's queue, the rest of its time at the server, and its
/// transport; the rest of the call (before that request could be sent, and after its answer);
/// and the whole of a call that sent no request (served from the client's read-ahead, or left
/// to write-behind). Metric ids `cid::CALL_SEND_NS` onwards.
pub const CALL_STAGES: [&str; 6] = [
    "call_send_ns",
    "call_queue_ns",
    "call_service_ns",
    "call_transport_ns",
    "call_other_ns",
    "call_buffered_ns",
];

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
        def(cid::HELLO_RESENDS, "hello_resends", Counter, false, "hellos"),
        def(cid::CONNECT_NS, "connect_ns", Histogram, false, "ns"),
        def(cid::CALL_SEND_NS, CALL_STAGES[0], Histogram, true, "ns"),
        def(cid::CALL_SEND_NS + 1, CALL_STAGES[1], Histogram, true, "ns"),
        def(cid::CALL_SEND_NS + 2, CALL_STAGES[2], Histogram, true, "ns"),
        def(cid::CALL_SEND_NS + 3, CALL_STAGES[3], Histogram, true, "ns"),
        def(cid::CALL_SEND_NS + 4, CALL_STAGES[4], Histogram, true, "ns"),
        def(cid::CALL_SEND_NS + 5, CALL_STAGES[5], Histogram, true, "ns"),
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
    hello_resends: Cell<u64>,
    connect_ns: Histogram,
    /// Per op, the histograms of [`CALL_STAGES`] (written for data calls only).
    call_stages: [[Histogram; CALL_STAGES.len()]; OpKind::COUNT],
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
    /// them; ascending). With `enabled` false only the per-target counters are kept (no
    /// histograms, no in-flight gauge).
    pub fn new(targets: Vec<u32>, enabled: bool) -> ClientMetrics {
        ClientMetrics {
            enabled,
            per_target: targets.iter().map(|_| OnceCell::new()).collect(),
            targets,
            inflight: Cell::new(0),
            call_ns: std::array::from_fn(|_| Histogram::new()),
            inflight_at_send: Histogram::new(),
            window_wait_ns: std::array::from_fn(|_| Histogram::new()),
            hello_resends: Cell::new(0),
            connect_ns: Histogram::new(),
            call_stages: std::array::from_fn(|_| std::array::from_fn(|_| Histogram::new())),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    pub fn targets(&self) -> &[u32] {
        &self.targets
    }

    /// The target's series (allocated on first use). Counters are kept whether or not
    /// telemetry is enabled: they are what `Client::server_stats` reports.
    #[inline]
    fn target(&self, index: usize) -> Option<&TargetMetrics> {
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
        if !self.enabled {
            return;
        }
        let inflight = self.inflight.get() + 1;
        self.inflight.set(inflight);
        self.inflight_at_send.record(inflight);
    }

    /// The attempt ended (reply, error, timeout or abandoned) after `rpc_ns`.
    #[inline]
    pub fn attempt_done(&self, index: usize, op: OpKind, rpc_ns: u64) {
        let Some(t) = self.target(index).filter(|_| self.enabled) else {
            return;
        };
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

    /// One data call of kind `op` split into its [`CALL_STAGES`] (ns each).
    #[inline]
    pub fn record_call_stages(&self, op: OpKind, stages: [u64; CALL_STAGES.len()]) {
        if self.enabled {
            for (h, v) in self.call_stages[op.index()].iter().zip(stages) {
                h.record(v);
            }
        }
    }

    /// A silent server was greeted again while connecting (kept whether or not telemetry is
    /// enabled, like the per-target counters).
    pub fn count_hello_resend(&self) {
        bump(&self.hello_resends, 1);
    }

    /// Connecting to a set of servers (every server at start, those not lost after a
    /// transport rebuild) took `ns`, from the first hello to the last answer or give-up.
    pub fn record_connect(&self, ns: u64) {
        if self.enabled {
            self.connect_ns.record(ns);
        }
    }

    // Readers.

    pub fn hello_resends(&self) -> u64 {
        self.hello_resends.get()
    }
    pub fn connect_ns(&self) -> &Histogram {
        &self.connect_ns
    }

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
    /// Stage `stage` (an index into [`CALL_STAGES`]) of the calls of kind `op`.
    pub fn call_stage_ns(&self, op: OpKind, stage: usize) -> &Histogram {
        &self.call_stages[op.index()][stage]
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
        push(
            cid::HELLO_RESENDS,
            NO_OP,
            BUCKET_NONE,
            self.hello_resends.get(),
            NO_TARGET,
        );
        histogram_records(&self.connect_ns, cid::CONNECT_NS, NO_OP, NO_TARGET, push);
        for (s, id) in (cid::CALL_SEND_NS..).take(CALL_STAGES.len()).enumerate() {
            for k in [OpKind::Write, OpKind::Read] {
                histogram_records(&self.call_stages[k.index()][s], id, k as u8, NO_TARGET, push);
            }
        }
    }
}
