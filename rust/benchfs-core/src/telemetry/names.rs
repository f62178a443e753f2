//! The names behind a worker's trace: which path each file id it served had (`telemetry.trace`).
//!
//! Trace records name files by id; an application's own records (a Darshan log) name them by
//! path. A metadata worker learns both when it creates, stats or installs a file, and notes the
//! pair in its [`NameLog`]; the [`NamesWriter`] appends the new pairs, one JSON line each, to
//! `server-<id>-w<worker>[.<n>].names` at each snapshot, beside the trace. Memory is bounded as
//! the trace's is: pairs that find the log full are dropped (and counted), and a pair already
//! written is not written again (its id and path's hash are remembered, up to a bound).

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::snapshot::{append_all, create_new_file, unix_time_ns};
use crate::error::Result;

/// File name extension of name files.
pub const NAMES_EXTENSION: &str = "names";
/// Name file format version.
pub const NAMES_VERSION: u32 = 1;
/// Pairs remembered as written before the memory is cleared (a pair seen again after that is
/// written again: harmless, the reader keeps one of each).
const SEEN_MAX: usize = 1 << 20;

/// A worker's (file id, path) pairs noted since the last flush.
#[derive(Debug)]
pub struct NameLog {
    pending: RefCell<Vec<(u64, u128, Box<str>)>>,
    pending_bytes: Cell<usize>,
    capacity_bytes: usize,
    seen: RefCell<HashSet<(u128, u64)>>,
    dropped: Cell<u64>,
}

impl NameLog {
    /// A log holding up to `capacity_bytes` of paths between two flushes.
    pub fn new(capacity_bytes: usize) -> NameLog {
        NameLog {
            pending: RefCell::new(Vec::new()),
            pending_bytes: Cell::new(0),
            capacity_bytes: capacity_bytes.max(4096),
            seen: RefCell::new(HashSet::new()),
            dropped: Cell::new(0),
        }
    }

    /// Notes that file `id` had `path` at `t_ns` (Unix ns). False if the log was full and the
    /// pair was dropped; true if kept or already written.
    pub fn note(&self, t_ns: u64, id: u128, path: &str) -> bool {
        let key = (id, xxhash_rust::xxh3::xxh3_64(path.as_bytes()));
        let mut seen = self.seen.borrow_mut();
        if seen.contains(&key) {
            return true;
        }
        let size = path.len() + 64;
        if self.pending_bytes.get() + size > self.capacity_bytes {
            self.dropped.set(self.dropped.get() + 1);
            return false;
        }
        if seen.len() >= SEEN_MAX {
            seen.clear();
        }
        seen.insert(key);
        self.pending_bytes.set(self.pending_bytes.get() + size);
        self.pending.borrow_mut().push((t_ns, id, path.into()));
        true
    }

    /// Pairs dropped because the log was full, since it was made.
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }

    /// Pairs held until the next flush.
    pub fn len(&self) -> usize {
        self.pending.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.borrow().is_empty()
    }
}

/// Appends a worker's [`NameLog`] to its name file, one `write(2)` per flush.
#[derive(Debug)]
pub struct NamesWriter {
    file: File,
    path: PathBuf,
    good_len: u64,
    broken: bool,
}

impl NamesWriter {
    /// Creates `server-<id>-w<worker>[.<n>].names` in `dir` (`n` as the worker's trace file)
    /// holding its header line.
    pub fn create(dir: &Path, server_id: u32, worker: u32, node: &str, instance: u32) -> Result<NamesWriter> {
        let header = json!({
            "format": "benchfs-names",
            "version": NAMES_VERSION,
            "source": "server",
            "id": server_id,
            "worker": worker,
            "node": node,
            "pid": std::process::id(),
            "created_unix_ns": unix_time_ns(),
        });
        let mut bytes = header.to_string().into_bytes();
        bytes.push(b'\n');
        let stem = format!("server-{server_id}-w{worker}");
        let (file, path, _) = create_new_file(dir, &stem, NAMES_EXTENSION, &bytes, instance)?;
        Ok(NamesWriter {
            file,
            path,
            good_len: bytes.len() as u64,
            broken: false,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends the log's pairs as JSON lines (`{"t_ns", "file": 32 hex digits, "path"}`) and
    /// empties it; returns how many were written. On an error the file is cut back to its
    /// last complete flush.
    pub fn flush(&mut self, log: &NameLog) -> Result<usize> {
        let pending = std::mem::take(&mut *log.pending.borrow_mut());
        log.pending_bytes.set(0);
        if pending.is_empty() {
            return Ok(0);
        }
        let mut text = Vec::with_capacity(pending.len() * 96);
        for (t_ns, id, path) in &pending {
            // One JSON object per line; serde_json escapes the path. (Writing into a Vec
            // cannot fail.)
            let _ = write!(text, "{{\"t_ns\":{t_ns},\"file\":\"{id:032x}\",\"path\":");
            let _ = serde_json::to_writer(&mut text, &**path);
            text.extend_from_slice(b"}\n");
        }
        append_all(
            &mut self.file,
            &self.path,
            &text,
            &mut self.good_len,
            &mut self.broken,
        )?;
        Ok(pending.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_written_once_and_the_log_is_bounded() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| crate::error::Error::io("tempdir", e))?;
        let log = NameLog::new(4096);
        assert!(log.note(1, 7, "/a"));
        assert!(log.note(2, 7, "/a"), "a pair already noted is not noted again");
        assert!(log.note(3, 7, "/b"), "a renamed file is noted under its new name");
        assert_eq!(log.len(), 2);
        let mut w = NamesWriter::create(dir.path(), 3, 1, "n1", 0)?;
        assert_eq!(w.flush(&log)?, 2);
        assert!(log.is_empty());
        assert!(log.note(4, 7, "/a"), "written pairs are remembered");
        assert!(log.is_empty());
        let long = "x".repeat(1900);
        assert!(log.note(5, 8, &long));
        assert!(log.note(5, 9, &long));
        assert!(
            !log.note(5, 10, &long),
            "the third 1.9 kB path finds the 4 kB log full"
        );
        assert_eq!(log.dropped(), 1);
        let text = std::fs::read_to_string(w.path()).map_err(|e| crate::error::Error::io("read", e))?;
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_default())
            .collect();
        assert_eq!(lines[0]["format"], "benchfs-names");
        assert_eq!(lines[1]["file"], format!("{:032x}", 7));
        assert_eq!(lines[2]["path"], "/b");
        assert_eq!(lines.len(), 3);
        Ok(())
    }
}
