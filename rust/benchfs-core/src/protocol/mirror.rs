//! Copies of the metadata (`layout.replicas` of 2 or 3): the changes one metadata request made,
//! as the owner that served it returns them, and the mirror request that hands them to the
//! owner's other copies. docs/protocol.md gives the layouts; decoding never panics.
//!
//! A change is the same record the owner writes through to its store ([`Change`]): the whole
//! new state of one key (an inode, or one directory entry), or the key's removal. A copy
//! applies a record only when it is newer than what it holds for that key (its `version`, the
//! serving owner's sequence number of the request), so mirrors of several clients may arrive
//! in any order.

use crate::metadb::Change;
use crate::namespace::{normalize, Attr, Entry, Kind, NAME_MAX, PATH_MAX};
use crate::protocol::meta::ATTR_LEN;

const INODE: u8 = 1;
const REMOVED: u8 = 2;
const ENTRY: u8 = 3;
const ENTRY_REMOVED: u8 = 4;
const NEXT_ID: u8 = 5;

/// The records a snapshot page gathers before it ends: room in one metadata reply for its
/// last key and one more record of the largest kind (a path, a link's target or an inline
/// file's bytes, and the rest).
pub const SNAPSHOT_PAGE: usize =
    crate::protocol::meta::REPLY_MAX - crate::protocol::meta::INLINE_LIMIT - 3 * PATH_MAX - 512;

/// The fixed part of a mirror request: shard, producer, sequence number.
const MIRROR_FIXED: usize = 16;
/// The largest mirror (or snapshot) request: a snapshot page ([`SNAPSHOT_PAGE`] and the one
/// record that may go over it: at most a metadata reply), or the changes of one request (an
/// inline file's bytes among them).
pub const REQUEST_MAX: usize = MIRROR_FIXED
    + crate::protocol::meta::REPLY_MAX
    + 4 * (PATH_MAX + 256)
    + crate::protocol::meta::INLINE_LIMIT;

/// A change as a copy receives it: owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Inode {
        path: String,
        attr: Attr,
        added: u64,
        target: Option<String>,
        inline: Option<Vec<u8>>,
    },
    Removed(String),
    Entry {
        dir: String,
        name: String,
        entry: Entry,
    },
    EntryRemoved {
        dir: String,
        name: String,
    },
    NextId(u64),
}

impl Record {
    /// The change to write through to a copy's store.
    pub fn as_change(&self) -> Change<'_> {
        match self {
            Record::Inode {
                path,
                attr,
                added,
                target,
                inline,
            } => Change::Inode {
                path,
                attr: *attr,
                added: *added,
                target: target.as_deref(),
                inline: inline.as_deref(),
            },
            Record::Removed(p) => Change::Removed(p),
            Record::Entry { dir, name, entry } => Change::Entry {
                dir,
                name,
                entry: *entry,
            },
            Record::EntryRemoved { dir, name } => Change::EntryRemoved { dir, name },
            Record::NextId(n) => Change::NextId(*n),
        }
    }
}

/// The key a change is about, as a copy keeps its version: `i<path>` or `e<dir>\0<name>`
/// (None for the id counter, which only grows).
pub fn change_key(c: &Change<'_>) -> Option<String> {
    match c {
        Change::Inode { path, .. } | Change::Removed(path) => Some(format!("i{path}")),
        Change::Entry { dir, name, .. } | Change::EntryRemoved { dir, name } => {
            Some(format!("e{dir}\0{name}"))
        }
        Change::NextId(_) => None,
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u16).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Appends one change's record to `out`.
pub fn encode_change(c: &Change<'_>, out: &mut Vec<u8>) {
    match c {
        Change::Inode {
            path,
            attr,
            added,
            target,
            inline,
        } => {
            out.push(INODE);
            put_str(out, path);
            attr.encode(out);
            out.extend_from_slice(&added.to_le_bytes());
            put_str(out, target.unwrap_or(""));
            // An inline file's bytes (the attribute says whether it has them).
            let inline = inline.unwrap_or_default();
            out.extend_from_slice(&(inline.len() as u32).to_le_bytes());
            out.extend_from_slice(inline);
        }
        Change::Removed(path) => {
            out.push(REMOVED);
            put_str(out, path);
        }
        Change::Entry { dir, name, entry } => {
            out.push(ENTRY);
            put_str(out, dir);
            put_str(out, name);
            out.push(entry.kind as u8);
            out.extend_from_slice(&entry.mark.to_le_bytes());
        }
        Change::EntryRemoved { dir, name } => {
            out.push(ENTRY_REMOVED);
            put_str(out, dir);
            put_str(out, name);
        }
        Change::NextId(n) => {
            out.push(NEXT_ID);
            out.extend_from_slice(&n.to_le_bytes());
        }
    }
}

/// Reads records from a byte string, checking every path as a request's is checked.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = rest;
        Some(head)
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn text(&mut self, max: usize) -> Option<String> {
        let len = u16::from_le_bytes(self.take(2)?.try_into().ok()?) as usize;
        if len > max {
            return None;
        }
        String::from_utf8(self.take(len)?.to_vec()).ok()
    }

    fn path(&mut self) -> Option<String> {
        let p = self.text(PATH_MAX)?;
        (normalize(&p).ok().as_deref() == Some(p.as_str())).then_some(p)
    }

    fn name(&mut self) -> Option<String> {
        let n = self.text(NAME_MAX)?;
        let valid = !n.is_empty() && !n.contains(['/', '\0']) && n != "." && n != "..";
        valid.then_some(n)
    }

    fn record(&mut self) -> Option<Record> {
        Some(match self.take(1)?[0] {
            INODE => {
                let path = self.path()?;
                let attr = Attr::decode(self.take(ATTR_LEN)?)?;
                let added = self.u64()?;
                let target = self.text(PATH_MAX - 1)?;
                let len = u32::from_le_bytes(self.take(4)?.try_into().ok()?) as usize;
                let bytes = self.take(len)?;
                let fits = if attr.layout.inline {
                    bytes.len() as u64 == attr.size
                } else {
                    bytes.is_empty()
                };
                if !fits {
                    return None;
                }
                Record::Inode {
                    path,
                    attr,
                    added,
                    target: (!target.is_empty()).then_some(target),
                    inline: attr.layout.inline.then(|| bytes.to_vec()),
                }
            }
            REMOVED => Record::Removed(self.path()?),
            ENTRY => {
                let (dir, name) = (self.path()?, self.name()?);
                let kind = Kind::from_u8(self.take(1)?[0])?;
                let mark = self.u64()?;
                Record::Entry {
                    dir,
                    name,
                    entry: Entry { kind, mark },
                }
            }
            ENTRY_REMOVED => Record::EntryRemoved {
                dir: self.path()?,
                name: self.name()?,
            },
            NEXT_ID => Record::NextId(self.u64()?),
            _ => return None,
        })
    }
}

/// Decodes a sequence of records; None if any is malformed.
pub fn decode_records(b: &[u8]) -> Option<Vec<Record>> {
    let mut r = Reader(b);
    let mut out = Vec::new();
    while !r.0.is_empty() {
        out.push(r.record()?);
    }
    Some(out)
}

/// Decodes records each preceded by its version (a snapshot page); None if any is malformed.
pub fn decode_versioned(b: &[u8]) -> Option<Vec<(u64, Record)>> {
    let mut r = Reader(b);
    let mut out = Vec::new();
    while !r.0.is_empty() {
        let version = r.u64()?;
        out.push((version, r.record()?));
    }
    Some(out)
}

/// A snapshot reply's payload: the page's last key, then its versioned records.
pub fn encode_snapshot(last: &str, records: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + last.len() + records.len());
    out.extend_from_slice(&(last.len() as u16).to_le_bytes());
    out.extend_from_slice(last.as_bytes());
    out.extend_from_slice(records);
    out
}

/// The last key and the versioned records of a snapshot reply; None if malformed.
pub fn decode_snapshot(b: &[u8]) -> Option<(String, &[u8])> {
    let mut r = Reader(b);
    let last = r.text(2 * PATH_MAX + 2)?;
    Some((last, r.0))
}

/// A mirror request: the changes `producer` (the server serving metadata owner `shard`)
/// made under sequence number `seq`, for the shard's other copies; with `seq` 0, a page of the
/// serving copy's state whose records each carry their version (a repair's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mirror {
    pub shard: u32,
    pub producer: u32,
    pub seq: u64,
    pub records: Vec<u8>,
}

impl Mirror {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(MIRROR_FIXED + self.records.len());
        out.extend_from_slice(&self.shard.to_le_bytes());
        out.extend_from_slice(&self.producer.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&self.records);
        out
    }

    /// The request and its decoded records with their versions; None if malformed.
    pub fn decode(b: &[u8]) -> Option<(Mirror, Vec<(u64, Record)>)> {
        let mut r = Reader(b);
        let shard = u32::from_le_bytes(r.take(4)?.try_into().ok()?);
        let producer = u32::from_le_bytes(r.take(4)?.try_into().ok()?);
        let seq = r.u64()?;
        let records = r.0.to_vec();
        let decoded = if seq == 0 {
            decode_versioned(&records)?
        } else {
            decode_records(&records)?
                .into_iter()
                .map(|rec| (seq, rec))
                .collect()
        };
        Some((
            Mirror {
                shard,
                producer,
                seq,
                records,
            },
            decoded,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunking::FileId;
    use crate::placement::Layout;

    fn attr() -> Attr {
        Attr {
            kind: Kind::File,
            mode: 0o644,
            id: FileId(7 << 96 | 3),
            size: 42,
            mtime_ns: 1,
            ctime_ns: 2,
            layout: Layout {
                chunk_size: 1 << 20,
                stripe_count: 4,
                start: 1,
                replicas: 2,
                ..Layout::NONE
            },
        }
    }

    #[test]
    fn records_round_trip() {
        let entry = Entry {
            kind: Kind::File,
            mark: 99,
        };
        let small = Attr {
            size: 3,
            layout: Layout {
                inline: true,
                ..attr().layout
            },
            ..attr()
        };
        let changes = [
            Change::Inode {
                path: "/d/f",
                attr: attr(),
                added: 3,
                target: None,
                inline: None,
            },
            Change::Inode {
                path: "/d/s",
                attr: small,
                added: 0,
                target: None,
                inline: Some(b"abc"),
            },
            Change::Removed("/d/g"),
            Change::Entry {
                dir: "/d",
                name: "f",
                entry,
            },
            Change::EntryRemoved { dir: "/d", name: "g" },
            Change::NextId(12),
        ];
        let mut bytes = Vec::new();
        changes.iter().for_each(|c| encode_change(c, &mut bytes));
        let m = Mirror {
            shard: 5,
            producer: 2,
            seq: 77,
            records: bytes,
        };
        let (back, records) = Mirror::decode(&m.encode()).expect("decodes");
        assert_eq!(back, m);
        assert_eq!(records.len(), 6);
        for ((seq, r), c) in records.iter().zip(&changes) {
            assert_eq!(*seq, 77);
            assert_eq!(change_key(&r.as_change()), change_key(c));
        }
        assert_eq!(
            records[0].1,
            Record::Inode {
                path: "/d/f".into(),
                attr: attr(),
                added: 3,
                target: None,
                inline: None,
            }
        );
        assert_eq!(
            records[1].1,
            Record::Inode {
                path: "/d/s".into(),
                attr: small,
                added: 0,
                target: None,
                inline: Some(b"abc".to_vec()),
            }
        );
    }

    #[test]
    fn malformed_mirrors_are_refused() {
        let mut bytes = Vec::new();
        encode_change(&Change::Removed("/a/../b"), &mut bytes);
        let m = Mirror {
            shard: 0,
            producer: 0,
            seq: 1,
            records: bytes,
        };
        assert!(Mirror::decode(&m.encode()).is_none(), "an unnormalized path");
        let mut good = Vec::new();
        encode_change(&Change::Removed("/a"), &mut good);
        for cut in 0..good.len() {
            assert!(
                decode_records(&good[..cut]).is_some() == (cut == 0),
                "cut at {cut}"
            );
        }
        assert!(decode_records(&[9]).is_none(), "an unknown record");
        assert!(Mirror::decode(&[0; 15]).is_none(), "a short header");
    }
}
