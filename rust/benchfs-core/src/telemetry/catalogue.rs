//! What telemetry measures: the timed operation kinds and how each metric is described in a file's
//! header.

use crate::protocol::Op;

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

    /// The kind a request of `op` is counted as, by the server and by the client alike.
    pub fn of(op: Op) -> OpKind {
        match op {
            op if op.writes_data() => OpKind::Write,
            // A checksum reads a chunk back from the store, as a read does.
            op if op.reads_data() => OpKind::Read,
            Op::Checksum => OpKind::Read,
            Op::Fsync => OpKind::Fsync,
            _ => OpKind::Meta,
        }
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
    /// One series per [`OpKind`] (else the record's `op` is [`NO_OP`](super::NO_OP)).
    pub per_op: bool,
    /// One series per target server (format version 2; else the record's target is
    /// [`NO_TARGET`](super::NO_TARGET)).
    pub per_target: bool,
    pub unit: &'static str,
}

pub(super) const fn def(
    id: u8,
    name: &'static str,
    kind: MetricKind,
    per_op: bool,
    unit: &'static str,
) -> MetricDef {
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
pub(super) const fn per_target(
    id: u8,
    name: &'static str,
    kind: MetricKind,
    unit: &'static str,
) -> MetricDef {
    MetricDef {
        id,
        name,
        kind,
        per_op: true,
        per_target: true,
        unit,
    }
}
