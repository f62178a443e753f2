//! The snapshot file format (a preamble with a JSON header, then 32-byte records per snapshot) and
//! [`SnapshotWriter`], which appends one snapshot with one `write(2)`.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::json;

use super::catalogue::{MetricDef, OpKind};
use super::client_metrics::CLIENT_METRICS;
use super::histogram::{Histogram, BUCKETS, SUB_BUCKET_BITS};
use super::server_metrics::{id as server_id, SERVER_METRICS};
use crate::error::{Error, Result};

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
pub const METRIC_END: u8 = server_id::END;

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

    pub(super) fn decode(b: &[u8]) -> Record {
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

    /// Whether `metric` grows by the writer's own upkeep (its CPU time): left out when
    /// [`SnapshotWriter::write_changed`] decides whether anything changed.
    fn upkeep(&self, _metric: u8) -> bool {
        false
    }
}

/// The four statistics of a histogram, then its non-empty buckets.
pub(super) fn histogram_records(
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
pub(super) fn encode_preamble(
    magic: &[u8; 8],
    version: u32,
    header: &serde_json::Value,
    align: usize,
) -> Vec<u8> {
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
pub(super) fn create_new_file(
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
pub(super) fn append_all(
    file: &mut File,
    path: &Path,
    buf: &[u8],
    good_len: &mut u64,
    broken: &mut bool,
) -> Result<()> {
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
    /// The encoding of the last snapshot written (what a held one repeats).
    buf: Vec<u8>,
    /// A fingerprint of the last written snapshot's values (None before the first).
    last_values: Option<u64>,
    last_written_ns: u64,
    /// The time of the latest snapshot [`write_changed`](Self::write_changed) held back.
    held_ns: Option<u64>,
    /// Unchanged snapshots written in a row since the last change.
    unchanged: u32,
}

/// [`SnapshotWriter::write_changed`] writes this many unchanged snapshots in a row before it
/// holds any: a live reader waiting for a snapshot taken after a moment it names (the
/// benches, after their load) still gets one when the load has just ended.
const HOLD_AFTER: u32 = 10;

/// [`SnapshotWriter::write_changed`] appends an unchanged snapshot at least this often, so
/// a reader sees the writer alive (and an idle file grows by one snapshot a minute).
const HELD_MAX_NS: u64 = 60_000_000_000;

/// FNV-1a over one record's identity and value: equal snapshots fold to equal fingerprints.
fn fold(h: u64, metric: u8, op: u8, bucket: u16, value: u64, target: u16) -> u64 {
    let key = u64::from(metric) | u64::from(op) << 8 | u64::from(bucket) << 16 | u64::from(target) << 32;
    let h = (h ^ key).wrapping_mul(0x0100_0000_01b3);
    (h ^ value).wrapping_mul(0x0100_0000_01b3)
}

const FOLD_START: u64 = 0xcbf2_9ce4_8422_2325;

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
            last_values: None,
            last_written_ns: 0,
            held_ns: None,
            unchanged: 0,
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
        self.write_held()?;
        let values = self.encode(m, unix_time_ns);
        self.append()?;
        self.last_values = Some(values);
        self.last_written_ns = unix_time_ns;
        Ok(())
    }

    /// [`write`](Self::write) for a periodic writer: once [`HOLD_AFTER`] snapshots in a row
    /// were unchanged (all values equal but the writer's upkeep), further unchanged ones are
    /// held back (an idle server's file grew ~160 KB/s at 100 ms intervals, for hours of
    /// nothing). The latest held one is written just before the next snapshot that differs
    /// (or the next `write`), so the interval that ends in a change keeps its true length and
    /// rates stay right; and at least one a minute.
    pub fn write_changed(&mut self, m: &dyn Snapshot, unix_time_ns: u64) -> Result<()> {
        let mut values = FOLD_START;
        m.records(&mut |metric, op, bucket, value, target| {
            if !m.upkeep(metric) {
                values = fold(values, metric, op, bucket, value, target);
            }
        });
        if self.last_values == Some(values) {
            if self.unchanged >= HOLD_AFTER && unix_time_ns.saturating_sub(self.last_written_ns) < HELD_MAX_NS
            {
                self.held_ns = Some(unix_time_ns);
                return Ok(());
            }
            self.unchanged = self.unchanged.saturating_add(1);
        } else {
            self.unchanged = 0;
        }
        self.write(m, unix_time_ns)
    }

    /// Appends the held snapshot: the last one written, stamped with the held time.
    fn write_held(&mut self) -> Result<()> {
        let Some(t_ns) = self.held_ns.take() else {
            return Ok(());
        };
        for record in self.buf.chunks_exact_mut(RECORD_SIZE) {
            record[0..8].copy_from_slice(&t_ns.to_le_bytes());
            record[20..24].copy_from_slice(&self.seq.to_le_bytes());
        }
        self.append()?;
        self.last_written_ns = t_ns;
        Ok(())
    }

    fn append(&mut self) -> Result<()> {
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

    /// Encodes one snapshot into `buf`; returns the fingerprint of its values.
    fn encode(&mut self, m: &dyn Snapshot, t_ns: u64) -> u64 {
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
        let mut values = FOLD_START;
        m.records(&mut |metric, op, bucket, value, target| {
            if !m.upkeep(metric) {
                values = fold(values, metric, op, bucket, value, target);
            }
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
        values
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::{bucket_lo, SubmitStats, WorkerMetrics};

    #[test]
    fn snapshot_cost_is_bounded_by_buckets() -> Result<()> {
        // Every histogram full in every bucket: the largest snapshot there can be.
        let m = WorkerMetrics::new(true);
        let submits = SubmitStats::default();
        submits.set_enabled(true);
        for i in 0..BUCKETS {
            let v = bucket_lo(i);
            submits.record(v.min(u64::from(u32::MAX)) as u32, 1);
            for k in OpKind::ALL {
                m.record_op(k, v, v, v, 1, true);
            }
        }
        m.absorb(&submits, 0, (0, 0));
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
            last_values: None,
            last_written_ns: 0,
            held_ns: None,
            unchanged: 0,
        };
        buf.encode(&m, 0);
        let records = buf.buf.len() / RECORD_SIZE;
        assert!(records <= 12 + 10 + 14 * (4 + BUCKETS) + 1, "{records}");
        Ok(())
    }
}
