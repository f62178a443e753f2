//! The storage engine alone, driven at a fixed queue depth: what `benchfs-bench storage`
//! compares with fio, and what the layout study measures. Same engine, same io_uring loop as
//! the server, no network. [`bench_telemetry`] runs the server's storage path with telemetry
//! off, with snapshots, and with per-operation traces, to measure what telemetry costs.

use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use benchfs_core::buffer::{io_buffer_size, BufferPool};
use benchfs_core::chunking::FileId;
use benchfs_core::config::StorageConfig;
use benchfs_core::error::{Error, Result};
use benchfs_core::runtime::{Reactor, Runtime};
use benchfs_core::storage::ChunkStore;
use benchfs_core::telemetry::{
    bucket_index, unix_time_ns, OpKind, SnapshotWriter, TraceRecord, TraceRing, TraceWriter, WorkerMetrics,
    TRACE_FLAG_ERROR,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    SeqWrite,
    SeqRead,
    RandRead,
}

impl Pattern {
    pub fn parse(s: &str) -> Result<Pattern> {
        match s {
            "seqwrite" => Ok(Pattern::SeqWrite),
            "seqread" => Ok(Pattern::SeqRead),
            "randread" => Ok(Pattern::RandRead),
            other => Err(Error::InvalidArgument(format!(
                "pattern {other:?}: expected seqwrite, seqread or randread"
            ))),
        }
    }
}

#[derive(Debug, Clone)]
pub struct StorageBenchSpec {
    pub data_dir: PathBuf,
    pub pattern: Pattern,
    pub block_size: u64,
    pub queue_depth: u32,
    /// Bytes moved by the measured operations.
    pub total_bytes: u64,
    /// Bytes of the dataset random reads pick from (written earlier by a seqwrite).
    pub dataset_bytes: u64,
    pub chunk_size: u64,
    pub storage: StorageConfig,
    /// Timer-gated submission: hold each SQE until this long after the previous submit (what
    /// designs that batch on a timer pay); `None` submits every turn, as servers do.
    pub submit_hold: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StorageBenchReport {
    pub bytes: u64,
    pub seconds: f64,
    pub ops: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Mean device queue depth seen by each operation at submit.
    pub mean_inflight: f64,
    pub share_depth1: f64,
    /// Mean data SQEs per `io_uring_enter`.
    pub mean_batch: f64,
}

impl StorageBenchReport {
    pub fn mib_s(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes as f64 / self.seconds / (1 << 20) as f64
        } else {
            0.0
        }
    }
}

/// The one file the benchmark writes and reads.
const BENCH_FILE: FileId = FileId(0xB3C4_0000_0000_0000_0000_0000_0000_0001);

fn percentile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64 / 1000.0
}

pub fn bench_storage(spec: &StorageBenchSpec) -> Result<StorageBenchReport> {
    let bs = spec.block_size;
    if bs == 0 || spec.queue_depth == 0 || spec.chunk_size == 0 || bs > spec.chunk_size {
        return Err(Error::InvalidArgument(
            "block_size must be between 1 and chunk_size, queue_depth at least 1".into(),
        ));
    }
    if !spec.chunk_size.is_multiple_of(bs) {
        return Err(Error::InvalidArgument(
            "chunk_size must be a multiple of block_size".into(),
        ));
    }
    let ops = spec.total_bytes / bs;
    let dataset_blocks = (spec.dataset_bytes.max(spec.total_bytes) / bs).max(1);
    let runtime = Runtime::with_submit_hold(
        spec.storage
            .ring_entries
            .max(spec.queue_depth.next_power_of_two()),
        spec.submit_hold,
    )?;
    let reactor = runtime.reactor().clone();
    reactor.submit_stats().set_enabled(true);
    let store = Rc::new(ChunkStore::open(
        &spec.data_dir,
        &spec.storage,
        spec.chunk_size,
        0,
        reactor.clone(),
    )?);
    let pool = BufferPool::new(spec.queue_depth as usize, io_buffer_size(bs))?;
    reactor.register_buffers(&pool)?;
    let next = Rc::new(Cell::new(0u64));
    let latencies = Rc::new(RefCell::new(Vec::with_capacity(ops as usize)));
    let failure: Rc<RefCell<Option<std::io::Error>>> = Rc::new(RefCell::new(None));
    let seed = Rc::new(Cell::new(0x9E37_79B9_7F4A_7C15u64));
    // Buffers are taken and (for writes) filled before the clock starts: only I/O is timed.
    let mut buffers = runtime.block_on(futures::future::join_all(
        (0..spec.queue_depth).map(|_| pool.acquire()),
    ))?;
    if spec.pattern == Pattern::SeqWrite {
        let block: Vec<u8> = (0..bs).map(|i| (i % 251) as u8 + 1).collect();
        for buf in &mut buffers {
            buf.as_mut_slice(bs as usize).copy_from_slice(&block);
        }
    }
    let start = Instant::now();
    let mut workers = Vec::with_capacity(spec.queue_depth as usize);
    for mut buf in buffers {
        let (store, next, latencies, failure, seed) = (
            store.clone(),
            next.clone(),
            latencies.clone(),
            failure.clone(),
            seed.clone(),
        );
        let pattern = spec.pattern;
        let chunk_size = spec.chunk_size;
        workers.push(async move {
            loop {
                let i = next.get();
                if i >= ops || failure.borrow().is_some() {
                    break;
                }
                next.set(i + 1);
                let block = match pattern {
                    Pattern::RandRead => {
                        // xorshift: cheap and reproducible.
                        let mut x = seed.get();
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        seed.set(x);
                        x % dataset_blocks
                    }
                    _ => i,
                };
                let pos = block * bs;
                let (chunk, offset) = (pos / chunk_size, pos % chunk_size);
                let t0 = Instant::now();
                let (res, b) = match pattern {
                    Pattern::SeqWrite => {
                        let (r, b) = store.write(BENCH_FILE, chunk, offset, buf, 0, bs as usize).await;
                        (r.map(|_| ()), b)
                    }
                    _ => {
                        let (r, b) = store.read(BENCH_FILE, chunk, offset, buf, bs as usize).await;
                        (
                            r.and_then(|(_, n)| {
                                if n == bs as usize {
                                    Ok(())
                                } else {
                                    Err(std::io::Error::other(format!(
                                        "short read of chunk {chunk} at {offset}: {n} bytes (was the dataset written?)"
                                    )))
                                }
                            }),
                            b,
                        )
                    }
                };
                buf = b;
                latencies.borrow_mut().push(t0.elapsed().as_nanos() as u64);
                if let Err(e) = res {
                    *failure.borrow_mut() = Some(e);
                }
            }
        });
    }
    runtime.block_on(futures::future::join_all(workers))?;
    let seconds = start.elapsed().as_secs_f64();
    store
        .close()
        .map_err(|e| Error::io("save the storage index", e))?;
    if let Some(e) = failure.borrow_mut().take() {
        return Err(Error::io("storage benchmark", e));
    }
    let submits = reactor.submit_stats();
    let depth = submits.inflight_at_submit();
    let submitted = depth.count().max(1) as f64;
    let mut lat = latencies.borrow_mut();
    lat.sort_unstable();
    Ok(StorageBenchReport {
        bytes: ops * bs,
        seconds,
        ops,
        p50_us: percentile(&lat, 0.5),
        p99_us: percentile(&lat, 0.99),
        mean_inflight: depth.mean(),
        share_depth1: depth.bucket_count(bucket_index(1)) as f64 / submitted,
        mean_batch: submits.submit_batch().mean(),
    })
}

/// What telemetry a [`bench_telemetry`] run keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TelemetryMode {
    /// `telemetry.enabled = false`: nothing recorded, no files.
    Off,
    /// Counters and histograms, snapshots every interval (the default configuration).
    Snapshots,
    /// Snapshots plus a per-operation trace ring flushed at every snapshot.
    Trace,
}

impl TelemetryMode {
    pub fn parse(s: &str) -> Result<TelemetryMode> {
        match s {
            "off" => Ok(TelemetryMode::Off),
            "snapshots" => Ok(TelemetryMode::Snapshots),
            "trace" => Ok(TelemetryMode::Trace),
            other => Err(Error::InvalidArgument(format!(
                "telemetry mode {other:?}: expected off, snapshots or trace"
            ))),
        }
    }
}

#[derive(Debug, Clone)]
pub struct TelemetryBenchSpec {
    pub data_dir: PathBuf,
    /// Where the snapshot and trace files go (one subdirectory per mode; the caller removes it).
    pub telemetry_dir: PathBuf,
    /// Rounds: each runs one block of every mode, in alternating order.
    pub rounds: u32,
    /// Random reads per block.
    pub ops_per_block: u64,
    pub block_size: u64,
    pub queue_depth: u32,
    /// Bytes of the file the reads pick from (written, untimed, before the first round).
    pub dataset_bytes: u64,
    pub chunk_size: u64,
    pub interval_ms: u64,
    pub trace_records: u64,
    pub storage: StorageConfig,
}

/// What one telemetry mode cost over a [`bench_telemetry`] run.
#[derive(Debug, Clone, PartialEq)]
pub struct ModeReport {
    pub mode: TelemetryMode,
    /// CPU ns per read of each block, in round order.
    pub cpu_ns_per_op: Vec<f64>,
    pub ops: u64,
    pub snapshots: u32,
    pub trace_records: u64,
    pub trace_dropped: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryBenchReport {
    /// Off, snapshots, trace.
    pub modes: Vec<ModeReport>,
    pub seconds: f64,
}

impl TelemetryMode {
    pub const ALL: [TelemetryMode; 3] = [TelemetryMode::Off, TelemetryMode::Snapshots, TelemetryMode::Trace];

    pub fn name(self) -> &'static str {
        match self {
            TelemetryMode::Off => "off",
            TelemetryMode::Snapshots => "snapshots",
            TelemetryMode::Trace => "trace",
        }
    }
}

/// CPU seconds used by this process so far (every thread, user and system).
fn process_cpu_s() -> Result<f64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Err(Error::io("clock_gettime", std::io::Error::last_os_error()));
    }
    Ok(ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9)
}

/// One mode's telemetry: what a server worker keeps with that configuration.
struct ModeState {
    mode: TelemetryMode,
    metrics: Rc<WorkerMetrics>,
    snapshots: Option<SnapshotWriter>,
    trace: Option<(TraceRing, TraceWriter)>,
    last_snapshot: Instant,
    cpu_ns_per_op: Vec<f64>,
}

impl ModeState {
    /// Writes a snapshot, taking the stats of the event loop, the pool and the store first
    /// (as a server worker does).
    fn snapshot(
        &mut self,
        now: Instant,
        reactor: &Reactor,
        pool: &BufferPool,
        store: &ChunkStore,
    ) -> Result<()> {
        let Some(w) = self.snapshots.as_mut() else {
            return Ok(());
        };
        self.last_snapshot = now;
        self.metrics
            .absorb(reactor.submit_stats(), pool.waits(), store.handle_lookups());
        w.write(&*self.metrics, unix_time_ns())?;
        if let Some((ring, tw)) = self.trace.as_mut() {
            tw.flush(ring)?;
        }
        Ok(())
    }
}

/// The server's storage path without the network, `queue_depth` reads at a time, with
/// telemetry off (`telemetry.enabled = false`), with snapshots, and with per-operation traces:
/// per read the same clock reads, `record_op` and (trace) trace record as `serve_one`, and a
/// snapshot (plus trace flush) whenever `interval_ms` has passed, as the server's snapshot
/// task does. The modes alternate in blocks of `ops_per_block` reads (order reversed every
/// other round), so that load from the rest of the machine falls on all of them alike; CPU
/// time per read against the off mode is telemetry's overhead. Small reads from the page
/// cache make the operation cheap, so the share is the largest the server's path can show.
pub fn bench_telemetry(spec: &TelemetryBenchSpec) -> Result<TelemetryBenchReport> {
    let bs = spec.block_size;
    if bs == 0 || spec.queue_depth == 0 || spec.chunk_size == 0 || bs > spec.chunk_size {
        return Err(Error::InvalidArgument(
            "block_size must be between 1 and chunk_size, queue_depth at least 1".into(),
        ));
    }
    if spec.rounds == 0 || spec.ops_per_block == 0 {
        return Err(Error::InvalidArgument(
            "rounds and ops_per_block must be at least 1".into(),
        ));
    }
    if !spec.chunk_size.is_multiple_of(bs) || spec.dataset_bytes < bs {
        return Err(Error::InvalidArgument(
            "chunk_size must be a multiple of block_size, and the dataset at least one block".into(),
        ));
    }
    if spec.trace_records == 0 || spec.trace_records > benchfs_core::config::MAX_TRACE_RECORDS {
        return Err(Error::InvalidArgument(
            "trace_records must be between 1 and 16777216".into(),
        ));
    }
    // Write the dataset (untimed) with the engine alone.
    bench_storage(&StorageBenchSpec {
        data_dir: spec.data_dir.clone(),
        pattern: Pattern::SeqWrite,
        block_size: spec.chunk_size.min(1 << 20).max(bs) / bs * bs,
        queue_depth: 4,
        total_bytes: spec.dataset_bytes,
        dataset_bytes: spec.dataset_bytes,
        chunk_size: spec.chunk_size,
        storage: spec.storage.clone(),
        submit_hold: None,
    })?;
    let runtime = Runtime::new(
        spec.storage
            .ring_entries
            .max(spec.queue_depth.next_power_of_two()),
    )?;
    let reactor = runtime.reactor().clone();
    let pool = BufferPool::new(spec.queue_depth as usize, io_buffer_size(bs))?;
    reactor.register_buffers(&pool)?;
    let mut states = Vec::with_capacity(3);
    let mut stores = Vec::with_capacity(3);
    for mode in TelemetryMode::ALL {
        let metrics = Rc::new(WorkerMetrics::new(mode != TelemetryMode::Off));
        let store = ChunkStore::open(&spec.data_dir, &spec.storage, spec.chunk_size, 0, reactor.clone())?;
        let (mut snapshots, mut trace) = (None, None);
        if mode != TelemetryMode::Off {
            let dir = spec.telemetry_dir.join(mode.name());
            let w = SnapshotWriter::create(&dir, 0, 0, "bench")?;
            if mode == TelemetryMode::Trace {
                let ring = TraceRing::new(spec.trace_records as usize);
                let tw = TraceWriter::create(&dir, 0, 0, "bench", w.instance(), spec.trace_records as usize)?;
                trace = Some((ring, tw));
            }
            snapshots = Some(w);
        }
        stores.push(store);
        states.push(ModeState {
            mode,
            metrics,
            snapshots,
            trace,
            last_snapshot: Instant::now(),
            cpu_ns_per_op: Vec::with_capacity(spec.rounds as usize),
        });
    }
    let interval = std::time::Duration::from_millis(spec.interval_ms);
    let blocks = (spec.dataset_bytes / bs).max(1);
    let seed = Cell::new(0x9E37_79B9_7F4A_7C15u64);
    let clock_base = (Instant::now(), unix_time_ns());
    let start = Instant::now();
    for round in 0..spec.rounds {
        let order: [usize; 3] = if round % 2 == 0 { [0, 1, 2] } else { [2, 1, 0] };
        for i in order {
            let store = &stores[i];
            let state = RefCell::new(&mut states[i]);
            reactor
                .submit_stats()
                .set_enabled(state.borrow().mode != TelemetryMode::Off);
            let next = Cell::new(0u64);
            let failure: RefCell<Option<Error>> = RefCell::new(None);
            let cpu0 = process_cpu_s()?;
            let workers = (0..spec.queue_depth).map(|_| async {
                loop {
                    let i = next.get();
                    if i >= spec.ops_per_block || failure.borrow().is_some() {
                        break;
                    }
                    next.set(i + 1);
                    let mut x = seed.get();
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    seed.set(x);
                    let pos = (x % blocks) * bs;
                    let (chunk, offset) = (pos / spec.chunk_size, pos % spec.chunk_size);
                    // The server's clock reads: arrival, hand-off to the store, completion.
                    let arrived = Instant::now();
                    let buf = pool.acquire().await;
                    let started = Instant::now();
                    let (res, buf) = store.read(BENCH_FILE, chunk, offset, buf, bs as usize).await;
                    let done = Instant::now();
                    drop(buf);
                    let ok = matches!(res, Ok((_, n)) if n == bs as usize);
                    let queue_ns = started.saturating_duration_since(arrived).as_nanos() as u64;
                    let device_ns = done.saturating_duration_since(started).as_nanos() as u64;
                    let total_ns = done.saturating_duration_since(arrived).as_nanos() as u64;
                    let mut st = state.borrow_mut();
                    st.metrics
                        .record_op(OpKind::Read, queue_ns, device_ns, total_ns, bs, ok);
                    if let Some((ring, _)) = &st.trace {
                        let since = arrived.saturating_duration_since(clock_base.0).as_nanos() as u64;
                        let record = TraceRecord {
                            t_ns: clock_base.1.wrapping_add(since),
                            queue_ns,
                            device_ns,
                            total_ns,
                            file: BENCH_FILE.0,
                            chunk,
                            bytes: bs,
                            server: 0,
                            worker: 0,
                            op: OpKind::Read as u8,
                            flags: if ok { 0 } else { TRACE_FLAG_ERROR },
                        };
                        if !ring.push(&record) {
                            st.metrics.count_trace_dropped();
                        }
                    }
                    if !ok {
                        let why = match res {
                            Err(e) => Error::io("telemetry benchmark read", e),
                            Ok((_, n)) => {
                                Error::Protocol(format!("short read of chunk {chunk} at {offset}: {n} bytes"))
                            }
                        };
                        *failure.borrow_mut() = Some(why);
                    } else if done.saturating_duration_since(st.last_snapshot) >= interval {
                        if let Err(e) = st.snapshot(done, &reactor, &pool, store) {
                            *failure.borrow_mut() = Some(e);
                        }
                    }
                }
            });
            runtime.block_on(futures::future::join_all(workers))?;
            let cpu_s = process_cpu_s()? - cpu0;
            if let Some(e) = failure.borrow_mut().take() {
                return Err(e);
            }
            let st = state.into_inner();
            st.cpu_ns_per_op.push(cpu_s * 1e9 / spec.ops_per_block as f64);
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let mut modes = Vec::with_capacity(3);
    for (mut st, store) in states.into_iter().zip(stores) {
        // The final snapshot, as a stopping server writes it.
        st.snapshot(Instant::now(), &reactor, &pool, &store)?;
        store
            .close()
            .map_err(|e| Error::io("save the storage index", e))?;
        modes.push(ModeReport {
            mode: st.mode,
            cpu_ns_per_op: st.cpu_ns_per_op,
            ops: u64::from(spec.rounds) * spec.ops_per_block,
            snapshots: st.snapshots.as_ref().map_or(0, SnapshotWriter::snapshots),
            trace_records: st.trace.as_ref().map_or(0, |(_, w)| w.records()),
            trace_dropped: st.metrics.trace_dropped(),
        });
    }
    Ok(TelemetryBenchReport { modes, seconds })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn telemetry_bench_modes_write_what_they_say() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let tel = dir.path().join("tel");
        let spec = TelemetryBenchSpec {
            data_dir: dir.path().join("data"),
            telemetry_dir: tel.clone(),
            rounds: 3,
            ops_per_block: 700,
            block_size: 4096,
            queue_depth: 4,
            dataset_bytes: 1 << 20,
            chunk_size: 1 << 18,
            interval_ms: 100,
            trace_records: 1000,
            storage: StorageConfig::default(),
        };
        let r = bench_telemetry(&spec)?;
        let names: Vec<&str> = r.modes.iter().map(|m| m.mode.name()).collect();
        assert_eq!(names, ["off", "snapshots", "trace"]);
        for m in &r.modes {
            assert_eq!((m.ops, m.cpu_ns_per_op.len()), (2100, 3));
            assert!(m.cpu_ns_per_op.iter().all(|&c| c > 0.0));
        }
        let (off, snaps, trace) = (&r.modes[0], &r.modes[1], &r.modes[2]);
        assert!(!tel.join("off").exists(), "telemetry off writes no files");
        assert_eq!((off.snapshots, off.trace_records), (0, 0));
        assert!(snaps.snapshots >= 1 && snaps.trace_records == 0);
        // A 1000-record ring: what was not flushed in time was dropped and counted.
        assert_eq!(trace.trace_records + trace.trace_dropped, 2100);
        let traced = benchfs_core::telemetry::read_trace(&tel.join("trace").join("server-0-w0.trace"))?;
        assert_eq!(traced.records.len() as u64, trace.trace_records);
        assert!(traced.records.iter().all(|r| r.bytes == 4096 && r.flags == 0));
        let snap = benchfs_core::telemetry::read_file(&tel.join("trace").join("server-0-w0.tel"))?;
        let dropped = snap
            .records
            .iter()
            .rev()
            .find(|r| r.metric == 13)
            .map(|r| r.value);
        assert_eq!(dropped, Some(trace.trace_dropped));
        assert!(TelemetryMode::parse("sometimes").is_err());
        Ok(())
    }
}
