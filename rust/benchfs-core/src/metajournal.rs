//! The journal of a metadata store that syncs (`storage.durability` fsync or close): each
//! commit is one record written with one synced write (`O_DSYNC`), where an LMDB transaction
//! synced on its own flushes the device twice (its pages, then its meta page). The store
//! applies the records to its LMDB environment, in one synced transaction, when the journal is
//! full and when it opens (after a stop, a kill or a machine crash between two of these).
//!
//! The file is `JOURNAL_BYTES` long, written with zeros when made, so that writing a record
//! changes none of the file's metadata (no size, no extent) and the sync flushes its data only.
//! Records follow each other from offset 0: magic, sequence number (u64), payload length (u32),
//! payload, then the xxh3-64 of all of that. Sequence numbers go on across laps; the store
//! keeps the last one it applied, so a read stops at the first record that is not the next
//! one: zeros, a record of an earlier lap, or one torn by a crash (never answered).

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Bytes of the journal file: about 20,000 changes between two applications to LMDB (the
/// tests' is smaller, so that they go round it quickly).
#[cfg(not(test))]
pub const JOURNAL_BYTES: u64 = 4 << 20;
#[cfg(test)]
pub const JOURNAL_BYTES: u64 = 256 << 10;
const FILE_NAME: &str = "meta.journal";
const MAGIC: u32 = u32::from_le_bytes(*b"BFSJ");
/// Magic, sequence number, payload length.
const HEAD: usize = 4 + 8 + 4;
/// The checksum after the payload.
const TAIL: usize = 8;
/// A value length that deletes the key.
const DELETED: u32 = u32::MAX;

/// A key and its new value (None: the key is deleted).
pub type Write = (Vec<u8>, Option<Vec<u8>>);

pub struct Journal {
    file: File,
    path: PathBuf,
    /// Where the next record goes.
    pos: u64,
    /// The sequence number of the last record written (or applied, before any is written).
    last: u64,
}

impl Journal {
    /// Opens (making if needed) the journal in `dir`; returns it, positioned at its start, and
    /// the writes of the records after sequence number `applied`, in order, with the last
    /// one's number (`applied` if none).
    pub fn open(dir: &Path, applied: u64) -> Result<(Journal, Vec<Write>, u64)> {
        let path = dir.join(FILE_NAME);
        let io = |what: &str, e| Error::io(format!("metadata journal {}: {what}", path.display()), e);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_DSYNC)
            .open(&path)
            .map_err(|e| io("open", e))?;
        let len = file.metadata().map_err(|e| io("stat", e))?.len();
        let mut bytes = Vec::with_capacity(JOURNAL_BYTES as usize);
        file.read_to_end(&mut bytes).map_err(|e| io("read", e))?;
        if len < JOURNAL_BYTES {
            // Written once with zeros (not preallocated: unwritten extents change metadata
            // when first written).
            let zeros = vec![0u8; (JOURNAL_BYTES - len) as usize];
            file.write_all_at(&zeros, len).map_err(|e| io("write", e))?;
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io("sync its directory", e))?;
        }
        let (writes, last) = records_after(&bytes, applied)
            .map_err(|what| Error::Protocol(format!("metadata journal {}: {what}", path.display())))?;
        Ok((
            Journal {
                file,
                path,
                pos: 0,
                last,
            },
            writes,
            last,
        ))
    }

    /// The sequence number of the last record written.
    pub fn last(&self) -> u64 {
        self.last
    }

    /// Whether a record of `writes` fits in the rest of the journal.
    pub fn fits(&self, writes: &[Write]) -> bool {
        self.pos + record_len(writes) as u64 <= JOURNAL_BYTES
    }

    /// Whether a record of `writes` fits in an empty journal.
    pub fn could_hold(writes: &[Write]) -> bool {
        record_len(writes) as u64 <= JOURNAL_BYTES
    }

    /// Writes a record of `writes`, on the device when this returns. The caller checked that
    /// it [`fits`](Self::fits).
    pub fn append(&mut self, writes: &[Write]) -> Result<()> {
        let record = encode(self.last + 1, writes);
        self.file
            .write_all_at(&record, self.pos)
            .map_err(|e| Error::io(format!("metadata journal {}: write", self.path.display()), e))?;
        self.pos += record.len() as u64;
        self.last += 1;
        Ok(())
    }

    /// Starts again from the journal's beginning: every record so far is applied to LMDB.
    pub fn restart(&mut self) {
        self.pos = 0;
    }
}

fn record_len(writes: &[Write]) -> usize {
    HEAD + TAIL
        + writes
            .iter()
            .map(|(k, v)| 8 + k.len() + v.as_ref().map_or(0, Vec::len))
            .sum::<usize>()
}

fn encode(seq: u64, writes: &[Write]) -> Vec<u8> {
    let mut b = Vec::with_capacity(record_len(writes));
    b.extend_from_slice(&MAGIC.to_le_bytes());
    b.extend_from_slice(&seq.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes()); // the payload's length, below
    for (k, v) in writes {
        b.extend_from_slice(&(k.len() as u32).to_le_bytes());
        b.extend_from_slice(k);
        match v {
            Some(v) => {
                b.extend_from_slice(&(v.len() as u32).to_le_bytes());
                b.extend_from_slice(v);
            }
            None => b.extend_from_slice(&DELETED.to_le_bytes()),
        }
    }
    let payload = (b.len() - HEAD) as u32;
    b[12..16].copy_from_slice(&payload.to_le_bytes());
    let sum = xxhash_rust::xxh3::xxh3_64(&b);
    b.extend_from_slice(&sum.to_le_bytes());
    b
}

/// The writes of the consecutive records from `applied + 1` at the start of `bytes`, and the
/// last one's number. A record whose checksum holds but whose payload does not parse is an
/// error (a journal of another format), never skipped.
fn records_after(bytes: &[u8], applied: u64) -> std::result::Result<(Vec<Write>, u64), String> {
    let mut writes = Vec::new();
    let mut pos = 0usize;
    let mut last = applied;
    let u32_at = |b: &[u8], at: usize| {
        b.get(at..at + 4)
            .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    };
    while let Some(head) = bytes.get(pos..pos + HEAD) {
        if u32_at(head, 0) != Some(MAGIC) {
            break;
        }
        let seq = u64::from_le_bytes(head[4..12].try_into().map_err(|_| "short header")?);
        let payload = u32_at(head, 12).unwrap_or(0) as usize;
        let end = pos + HEAD + payload;
        let Some(sum) = bytes.get(end..end + TAIL) else {
            break;
        };
        if seq != last + 1
            || u64::from_le_bytes(sum.try_into().map_err(|_| "short checksum")?)
                != xxhash_rust::xxh3::xxh3_64(&bytes[pos..end])
        {
            break;
        }
        let mut at = pos + HEAD;
        while at < end {
            let bad = || format!("record {seq} at byte {pos} does not parse");
            let klen = u32_at(bytes, at).ok_or_else(bad)? as usize;
            let key = bytes.get(at + 4..at + 4 + klen).ok_or_else(bad)?.to_vec();
            at += 4 + klen;
            let vlen = u32_at(bytes, at).ok_or_else(bad)?;
            at += 4;
            let value = if vlen == DELETED {
                None
            } else {
                let v = bytes.get(at..at + vlen as usize).ok_or_else(bad)?.to_vec();
                at += vlen as usize;
                Some(v)
            };
            if at > end {
                return Err(bad());
            }
            writes.push((key, value));
        }
        last = seq;
        pos = end + TAIL;
    }
    Ok((writes, last))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(k: &str, v: Option<&str>) -> Write {
        (k.as_bytes().to_vec(), v.map(|v| v.as_bytes().to_vec()))
    }

    #[test]
    fn records_read_back_in_order_until_the_first_that_is_not_next() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let (mut j, old, last) = Journal::open(dir.path(), 0)?;
        assert!(old.is_empty() && last == 0);
        j.append(&[w("a", Some("1")), w("b", None)])?;
        j.append(&[w("a", Some("2"))])?;
        drop(j);
        let (mut j, writes, last) = Journal::open(dir.path(), 0)?;
        assert_eq!(writes, vec![w("a", Some("1")), w("b", None), w("a", Some("2"))]);
        assert_eq!(last, 2);
        // Every record applied: nothing to read (the first is not the next one).
        let (_, writes, last) = Journal::open(dir.path(), 2)?;
        assert!(writes.is_empty() && last == 2);
        // A new lap overwrites from the start, and what follows its last record (the rest of
        // the earlier lap) is not read.
        j.restart();
        j.append(&[w("c", Some("3"))])?;
        let (_, writes, last) = Journal::open(dir.path(), 2)?;
        assert_eq!((writes, last), (vec![w("c", Some("3"))], 3));
        Ok(())
    }

    #[test]
    fn a_torn_record_ends_the_journal() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let (mut j, _, _) = Journal::open(dir.path(), 0)?;
        j.append(&[w("a", Some("1"))])?;
        j.append(&[w("b", Some("2"))])?;
        // A crash in the second record's write: its last byte never reached the device.
        let second_end = 2 * record_len(&[w("a", Some("1"))]) as u64;
        j.file
            .write_all_at(&[0xFF], second_end - 1)
            .map_err(|e| Error::io("write", e))?;
        let (_, writes, last) = Journal::open(dir.path(), 0)?;
        assert_eq!((writes, last), (vec![w("a", Some("1"))], 1));
        Ok(())
    }
}
