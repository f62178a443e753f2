//! Per-operation traces: [`TraceRecord`], the bounded [`TraceRing`] a worker fills, and the
//! [`TraceWriter`] that flushes it at each snapshot.

use std::cell::{Cell, RefCell};
use std::fs::File;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::catalogue::OpKind;
use super::snapshot::{append_all, create_new_file, encode_preamble, unix_time_ns};
use crate::error::{Error, Result};

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
