//! Tests of the telemetry modules together: histograms, metrics, the writer and the readers on
//! files the real writer wrote.

use serde_json::json;

use super::client_metrics::cid;
use super::server_metrics::id;
use super::*;
use crate::error::{Error, Result};

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

/// Records a bit of everything, the parts' stats (submissions, pool waits, handle lookups)
/// through `absorb` as a worker's snapshot takes them.
fn exercise(m: &WorkerMetrics) {
    let submits = SubmitStats::default();
    submits.set_enabled(m.enabled());
    for depth in 1..=3 {
        submits.record(depth, 1);
    }
    submits.record(9, 0);
    m.record_op(OpKind::Write, 100, 2_000, 3_000, 65536, true);
    m.record_op(OpKind::Read, 50, 1_000, 1_500, 4096, true);
    m.record_op(OpKind::Read, 50, 1_000, 1_500, 4096, false);
    m.count_rejected();
    m.count_malformed();
    m.set_gauges(7, 3, 29, 5);
    m.set_process_gauges(40, 1 << 20, 7_000);
    m.absorb(&submits, 1, (1, 1));
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
        m.connections(),
        m.descriptors(),
        m.rss_bytes(),
        m.cpu_ns(),
    ];
    assert_eq!(scalars, [0; 13]);
}

#[test]
fn enabled_metrics_record() {
    let m = WorkerMetrics::new(true);
    exercise(&m);
    assert_eq!(m.submit_batch().count(), 3);
    assert_eq!(m.inflight_at_submit().count(), 3);
    assert_eq!(
        (m.ops(OpKind::Read), m.bytes(OpKind::Read), m.errors(OpKind::Read)),
        (2, 4096, 1)
    );
    assert_eq!(m.total_ns(OpKind::Read).count(), 2);
    assert_eq!((m.handle_hits(), m.handle_misses()), (1, 1));
    assert_eq!((m.queue_depth(), m.in_service(), m.buffers_free()), (7, 3, 29));
    assert_eq!(
        (m.connections(), m.descriptors(), m.rss_bytes()),
        (5, 40, 1 << 20)
    );
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
    assert_eq!(first, 12 + 15 + 15 * 4);
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
fn unchanged_periodic_snapshots_are_held_until_a_change() -> Result<()> {
    let dir = tempdir()?;
    let m = WorkerMetrics::new(true);
    let mut w = SnapshotWriter::create(dir.path(), 0, 0, "n")?;
    let s = 1_000_000_000u64;
    let times = |f: &TelemetryFile| {
        let mut t: Vec<(u32, u64)> = f.records.iter().map(|r| (r.seq, r.t_ns)).collect();
        t.dedup();
        t
    };
    // The first, then 10 unchanged ones in a row (1-11 s); the next unchanged ones are held.
    for t in 1..=15 {
        w.write_changed(&m, t * s)?;
    }
    assert_eq!(read_file(w.path())?.snapshots, 11);
    exercise(&m);
    w.write_changed(&m, 16 * s)?;
    // The last held one (15 s) went in before the change: the interval of the change is 1 s.
    let f = read_file(w.path())?;
    assert_eq!(&times(&f)[10..], &[(10, 11 * s), (11, 15 * s), (12, 16 * s)]);
    let read = OpKind::Read as u8;
    let ops_at = |seq: u32| {
        f.records
            .iter()
            .find(|r| r.seq == seq && r.metric == id::OPS && r.op == read && r.bucket == BUCKET_NONE)
            .map(|r| r.value)
    };
    assert_eq!((ops_at(11), ops_at(12)), (Some(0), Some(2)));
    // Idle again: 10 written (17-26 s), then one a minute at least (the held 85 s, then 86 s,
    // 60 s after 26 s), and a plain write (the last one) writes the held one first.
    for t in 17..=90 {
        w.write_changed(&m, t * s)?;
    }
    w.write(&m, 91 * s)?;
    let f = read_file(w.path())?;
    let tail = [
        (22, 26 * s),
        (23, 85 * s),
        (24, 86 * s),
        (25, 90 * s),
        (26, 91 * s),
    ];
    assert_eq!(&times(&f)[22..], &tail);
    assert_eq!(f.torn_bytes, 0);
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
    // 1 gauge + 1 counter + 4 stats x (4 call_ns + 1 inflight_at_send + 4 window_wait_ns
    // + 1 connect_ns + 6 call stages x 2 data ops)
    assert_eq!(first.len(), 2 + 4 * 22);
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
    // A disabled client keeps its per-target counters (Client::server_stats reports them)
    // and records no histogram.
    let off = ClientMetrics::new(vec![0], false);
    off.attempt_sent(0, OpKind::Read, false);
    off.attempt_sent(0, OpKind::Read, true);
    off.attempt_done(0, OpKind::Read, 5);
    off.record_call(OpKind::Read, 5);
    assert_eq!(
        (off.requests(0, OpKind::Read), off.retries(0, OpKind::Read)),
        (2, 1)
    );
    assert_eq!(off.call_ns(OpKind::Read).count(), 0);
    assert_eq!(off.rpc_ns(0, OpKind::Read).map(Histogram::count), Some(0));
    assert_eq!(off.inflight_at_send().count(), 0);
    Ok(())
}
