//! Reading telemetry and trace files back (the Rust reader; `benchfs.telemetry` is Python's).

use std::path::Path;

use super::snapshot::{
    Record, FORMAT_VERSION, FORMAT_VERSION_CLIENT, MAGIC, METRIC_END, PREAMBLE_SIZE, RECORD_SIZE,
};
use super::trace::{TraceRecord, TRACE_MAGIC, TRACE_RECORD_SIZE, TRACE_VERSION};
use crate::error::{Error, Result};

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
