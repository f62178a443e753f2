//! Telemetry and trace files with chosen contents, written by the core's own writers
//! ([`SnapshotWriter`], [`TraceWriter`]): tests and studies plant known answers (a slow node, a
//! bimodal distribution, client retries) in files exactly like a run's, so every reader is
//! tested on what the real writer writes and the format is written in one place.

use std::collections::BTreeMap;
use std::path::Path;

use benchfs_core::telemetry::{
    Histogram, MetricDef, MetricKind, OpKind, Snapshot, SnapshotWriter, Source, TraceRecord, TraceRing,
    TraceWriter, BUCKET_COUNT, BUCKET_MAX, BUCKET_MIN, BUCKET_NONE, BUCKET_SUM, CLIENT_METRICS, NO_OP,
    NO_TARGET, SERVER_METRICS,
};
use benchfs_core::{Error, Result};

/// (metric id, op index or NO_OP, target id or NO_TARGET)
type Key = (u8, u8, u16);

/// The id of the metric `requests` of a client: a client's per-target series are written once
/// the pair has sent a request, as the real client does.
const CLIENT_REQUESTS: u8 = 1;

/// One telemetry file whose counters, gauges and histograms the caller sets, then snapshots.
pub struct SyntheticTelemetry {
    writer: SnapshotWriter,
    catalogue: &'static [MetricDef],
    targets: Vec<u16>,
    values: BTreeMap<Key, u64>,
    hists: BTreeMap<Key, Histogram>,
}

impl SyntheticTelemetry {
    /// A server worker's file (`server-<id>-w<worker>.tel`, format version 1) in `dir`.
    pub fn server(dir: &Path, id: u32, worker: u32, node: &str) -> Result<SyntheticTelemetry> {
        let writer = SnapshotWriter::create_for(Source::Server, dir, id, worker, node)?;
        Ok(SyntheticTelemetry::with(writer, SERVER_METRICS, Vec::new()))
    }

    /// A client's file (`client-<id>-w<worker>.tel`, format version 2) for the servers
    /// `targets` (ids, ascending).
    pub fn client(
        dir: &Path,
        id: u32,
        worker: u32,
        node: &str,
        targets: &[u32],
    ) -> Result<SyntheticTelemetry> {
        let writer = SnapshotWriter::create_client(dir, id, worker, node, targets)?;
        let targets = targets.iter().map(|&t| t as u16).collect();
        Ok(SyntheticTelemetry::with(writer, CLIENT_METRICS, targets))
    }

    fn with(
        writer: SnapshotWriter,
        catalogue: &'static [MetricDef],
        targets: Vec<u16>,
    ) -> SyntheticTelemetry {
        SyntheticTelemetry {
            writer,
            catalogue,
            targets,
            values: BTreeMap::new(),
            hists: BTreeMap::new(),
        }
    }

    pub fn path(&self) -> &Path {
        self.writer.path()
    }

    /// The key of metric `name` for `op` and `target`, checked against the catalogue: an op
    /// exactly for per-op metrics, a target (one of this client's) exactly for per-target ones.
    fn key(&self, name: &str, op: Option<&str>, target: Option<u32>, histogram: bool) -> Result<Key> {
        let bad = |why: String| Error::InvalidArgument(format!("metric {name}: {why}"));
        let def = self
            .catalogue
            .iter()
            .find(|d| d.name == name)
            .ok_or_else(|| bad("not in this file's catalogue".into()))?;
        if (def.kind == MetricKind::Histogram) != histogram {
            return Err(bad(format!("is a {}", def.kind.name())));
        }
        let op = match (def.per_op, op) {
            (true, Some(o)) => OpKind::ALL
                .into_iter()
                .find(|k| k.name() == o)
                .ok_or_else(|| bad(format!("unknown op {o:?}")))? as u8,
            (false, None) => NO_OP,
            (true, None) => return Err(bad("needs an op".into())),
            (false, Some(_)) => return Err(bad("has no op".into())),
        };
        let target = match (def.per_target, target) {
            (true, Some(t)) if self.targets.contains(&(t as u16)) => t as u16,
            (true, Some(t)) => return Err(bad(format!("{t} is not a target of this client"))),
            (false, None) => NO_TARGET,
            (true, None) => return Err(bad("needs a target".into())),
            (false, Some(_)) => return Err(bad("has no target".into())),
        };
        Ok((def.id, op, target))
    }

    /// Adds `value` to a counter.
    pub fn add(&mut self, name: &str, value: u64, op: Option<&str>, target: Option<u32>) -> Result<()> {
        let key = self.key(name, op, target, false)?;
        let v = self.values.entry(key).or_default();
        *v = v.saturating_add(value);
        Ok(())
    }

    /// Sets a counter or gauge.
    pub fn set(&mut self, name: &str, value: u64, op: Option<&str>, target: Option<u32>) -> Result<()> {
        let key = self.key(name, op, target, false)?;
        self.values.insert(key, value);
        Ok(())
    }

    /// Records `values` into a histogram (the core's [`Histogram`]: the same buckets).
    pub fn record(
        &mut self,
        name: &str,
        values: &[u64],
        op: Option<&str>,
        target: Option<u32>,
    ) -> Result<()> {
        let key = self.key(name, op, target, true)?;
        let h = self.hists.entry(key).or_default();
        for &v in values {
            h.record(v);
        }
        Ok(())
    }

    /// Appends one snapshot of the current values, taken at `t_ns` (ns since the epoch).
    pub fn snapshot(&mut self, t_ns: u64) -> Result<()> {
        let view = View {
            catalogue: self.catalogue,
            targets: &self.targets,
            values: &self.values,
            hists: &self.hists,
        };
        self.writer.write(&view, t_ns)
    }
}

struct View<'a> {
    catalogue: &'static [MetricDef],
    targets: &'a [u16],
    values: &'a BTreeMap<Key, u64>,
    hists: &'a BTreeMap<Key, Histogram>,
}

impl Snapshot for View<'_> {
    /// Every counter and gauge, then every histogram, in catalogue order, for every op of
    /// per-op metrics and every active target of per-target ones (as the real writers do).
    fn records(&self, push: &mut dyn FnMut(u8, u8, u16, u64, u16)) {
        let ops: Vec<u8> = OpKind::ALL.iter().map(|&k| k as u8).collect();
        let active = |op: u8, t: u16| self.values.get(&(CLIENT_REQUESTS, op, t)).copied().unwrap_or(0) > 0;
        for histograms in [false, true] {
            for d in self
                .catalogue
                .iter()
                .filter(|d| (d.kind == MetricKind::Histogram) == histograms)
            {
                let op_list = if d.per_op { ops.clone() } else { vec![NO_OP] };
                let target_list = if d.per_target {
                    self.targets.to_vec()
                } else {
                    vec![NO_TARGET]
                };
                for &op in &op_list {
                    for &t in &target_list {
                        if d.per_target && !active(op, t) {
                            continue;
                        }
                        let key = (d.id, op, t);
                        if !histograms {
                            push(
                                d.id,
                                op,
                                BUCKET_NONE,
                                self.values.get(&key).copied().unwrap_or(0),
                                t,
                            );
                            continue;
                        }
                        let empty = Histogram::new();
                        let h = self.hists.get(&key).unwrap_or(&empty);
                        push(d.id, op, BUCKET_COUNT, h.count(), t);
                        push(d.id, op, BUCKET_SUM, h.sum(), t);
                        push(d.id, op, BUCKET_MIN, h.min(), t);
                        push(d.id, op, BUCKET_MAX, h.max(), t);
                        for (i, c) in h.nonzero_buckets() {
                            push(d.id, op, i as u16, c, t);
                        }
                    }
                }
            }
        }
    }
}

/// Writes `records` as the trace file `server-<server>-w<worker>.trace` in `dir` (one flush of
/// the core's trace writer); returns its path.
pub fn write_trace(
    dir: &Path,
    server: u32,
    worker: u32,
    node: &str,
    records: &[TraceRecord],
) -> Result<std::path::PathBuf> {
    let ring = TraceRing::new(records.len().max(1));
    for r in records {
        ring.push(r);
    }
    let mut writer = TraceWriter::create(dir, server, worker, node, 0, ring.capacity())?;
    writer.flush(&ring)?;
    Ok(writer.path().to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;
    use benchfs_core::telemetry::{read_file, read_trace};

    #[test]
    fn synthetic_files_read_back_through_the_core_reader() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let mut s = SyntheticTelemetry::server(dir.path(), 3, 1, "n3")?;
        s.add("ops", 5, Some("read"), None)?;
        s.record("total_ns", &[1000, 1000, 3000], Some("read"), None)?;
        s.set("queue_depth", 7, None, None)?;
        s.snapshot(1_700_000_000_000_000_000)?;
        let f = read_file(s.path())?;
        let get = |metric: u8, op: u8, bucket: u16| {
            f.records
                .iter()
                .find(|r| r.metric == metric && r.op == op && r.bucket == bucket)
                .map(|r| r.value)
        };
        assert_eq!(get(1, OpKind::Read as u8, BUCKET_NONE), Some(5));
        assert_eq!(get(20, OpKind::Read as u8, BUCKET_COUNT), Some(3));
        assert_eq!(get(20, OpKind::Read as u8, BUCKET_MAX), Some(3000));
        assert_eq!(get(9, NO_OP, BUCKET_NONE), Some(7));
        let e = |r: Result<()>| r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e(s.add("ops", 1, None, None)).contains("needs an op"));
        assert!(e(s.add("total_ns", 1, Some("read"), None)).contains("is a histogram"));
        assert!(e(s.add("nope", 1, None, None)).contains("not in this file's catalogue"));
        let mut c = SyntheticTelemetry::client(dir.path(), 9, 0, "c", &[0, 1])?;
        assert!(e(c.add("requests", 1, Some("read"), Some(5))).contains("not a target"));
        c.add("requests", 2, Some("read"), Some(1))?;
        c.snapshot(1)?;
        let f = read_file(c.path())?;
        assert!(f.records.iter().all(|r| r.target != 0), "target 0 sent nothing");
        let rec = TraceRecord {
            t_ns: 5,
            total_ns: 9,
            server: 3,
            op: OpKind::Write as u8,
            ..Default::default()
        };
        let path = write_trace(dir.path(), 3, 0, "n3", &[rec, rec])?;
        assert_eq!(read_trace(&path)?.records, vec![rec, rec]);
        Ok(())
    }
}
