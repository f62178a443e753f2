//! The storage engine alone, driven at a fixed queue depth: what `benchfs-bench storage`
//! compares with fio, and what the layout study measures. Same engine, same io_uring loop as
//! the server, no network.

use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Instant;

use crate::buffer::{io_buffer_size, BufferPool};
use crate::chunking::FileId;
use crate::config::StorageConfig;
use crate::error::{Error, Result};
use crate::runtime::Runtime;
use crate::storage::ChunkStore;
use crate::telemetry::{bucket_index, WorkerMetrics};

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
}

#[derive(Debug, Clone, PartialEq)]
pub struct StorageBenchReport {
    pub bytes: u64,
    pub seconds: f64,
    pub ops: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Mean device queue depth seen by each operation at submit (the seeds' io_depth).
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
    let runtime = Runtime::new(
        spec.storage
            .ring_entries
            .max(spec.queue_depth.next_power_of_two()),
    )?;
    let reactor = runtime.reactor().clone();
    let metrics = Rc::new(WorkerMetrics::new(true));
    reactor.set_metrics(metrics.clone());
    let store = Rc::new(ChunkStore::open(
        &spec.data_dir,
        &spec.storage,
        spec.chunk_size,
        0,
        reactor.clone(),
        metrics.clone(),
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
    let depth = metrics.inflight_at_submit();
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
        mean_batch: metrics.submit_batch().mean(),
    })
}
