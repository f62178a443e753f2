//! The metadata an owner keeps, on its server's device: one LMDB environment per server worker
//! with the owner's inodes (attribute and stripe counter), directory entries, id counter and
//! nonce, written through on every change, so a server restarted on its data directory serves
//! every name it owned. LMDB was chosen by measurement (docs/storage.md): 180,000-200,000
//! single-change commits per second without a sync, against 9,000-15,000 for redb.
//!
//! Changes are staged, then committed (`commit_staged`) before the requests that made them are
//! answered: each request's at once, or, where commits sync, the changes of every request served
//! in one turn of the event loop together (`server/group_commit.rs`). Every commit reaches the
//! kernel before its changes are answered, so a killed server loses only changes it had not
//! answered. With `durable` (`storage.durability` fsync or close) every commit is also on the
//! device before it is answered: one synced record in the store's journal (`metajournal`),
//! applied to LMDB in one synced transaction when the journal is full and when the store opens.

use std::cell::RefCell;
use std::path::Path;

use heed::types::Bytes;
use heed::{Database, Env, EnvFlags, EnvOpenOptions};

use crate::error::{Error, Result};
use crate::metajournal::{Journal, Write};
use crate::namespace::{Attr, Entry, Kind};
use crate::protocol::meta::ATTR_LEN;

/// The largest the environment may grow (a sparse reservation, not an allocation).
const MAP_SIZE: usize = 64 << 30;

const INODE: u8 = b'i';
const ENTRY: u8 = b'e';
const COUNTER: &[u8] = b"m:next_id";
const NONCE: &[u8] = b"m:nonce";
const SHAPE: &[u8] = b"m:shape";
/// The store's format: 2 since symbolic links (an inode's value may end with a link target).
/// A store without it was written before and is refused.
const FORMAT: &[u8] = b"m:format";
/// 2 kept symbolic links; 3 keeps each file's copy count in its layout; 4 keeps small files'
/// bytes with their inodes (an inode's value may end with them) and their chunk generation.
const FORMAT_VERSION: u32 = 4;
/// The sequence number of the last journal record applied to the environment.
const JOURNAL_APPLIED: &[u8] = b"m:journal";

/// One change to persist; a call persists several in one commit.
pub enum Change<'a> {
    /// An inode is new or changed: its attribute, its directory's entry counter, a symbolic
    /// link's target, and an inline file's bytes.
    Inode {
        path: &'a str,
        attr: Attr,
        added: u64,
        target: Option<&'a str>,
        inline: Option<&'a [u8]>,
    },
    /// An inode is gone.
    Removed(&'a str),
    /// Directory `dir` has entry `name` (new or with a new mark).
    Entry {
        dir: &'a str,
        name: &'a str,
        entry: Entry,
    },
    /// Directory `dir` no longer has entry `name`.
    EntryRemoved { dir: &'a str, name: &'a str },
    /// The next file id counter.
    NextId(u64),
}

/// What an inode's value ends with, after its attribute and entry counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tail {
    None,
    /// A symbolic link's target.
    Target(String),
    /// An inline file's bytes (possibly none).
    Inline(Vec<u8>),
}

/// What a store held when it was opened.
pub struct Loaded {
    /// Path, attribute, entry counter, and a link's target or an inline file's bytes.
    pub inodes: Vec<(String, Attr, u64, Tail)>,
    pub entries: Vec<(String, String, Entry)>,
    pub next_id: u64,
    pub nonce: u32,
}

pub struct MetaDb {
    env: Env,
    db: Database<Bytes, Bytes>,
    path: String,
    /// Writes staged for the next commit, in order.
    staged: RefCell<Vec<Write>>,
    /// With `durable`: the journal, and the writes of its records not yet applied to the
    /// environment (bounded by the journal's size).
    journal: Option<RefCell<(Journal, Vec<Write>)>>,
}

fn db_error(what: &str, path: &str, e: heed::Error) -> Error {
    let source = match e {
        heed::Error::Io(io) => io,
        other => std::io::Error::other(other.to_string()),
    };
    Error::io(format!("metadata store {path}: {what}"), source)
}

fn entry_key(dir: &str, name: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(dir.len() + name.len() + 2);
    k.push(ENTRY);
    k.extend_from_slice(dir.as_bytes());
    k.push(0);
    k.extend_from_slice(name.as_bytes());
    k
}

fn inode_key(path: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(path.len() + 1);
    k.push(INODE);
    k.extend_from_slice(path.as_bytes());
    k
}

/// The write that persists `c`.
fn write_of(c: &Change<'_>) -> Write {
    match c {
        Change::Inode {
            path,
            attr,
            added,
            target,
            inline,
        } => {
            // The attribute says which the tail is: a link's target or an inline file's bytes.
            let tail = target.map(str::as_bytes).or(*inline).unwrap_or_default();
            let mut value = Vec::with_capacity(ATTR_LEN + 8 + tail.len());
            attr.encode(&mut value);
            value.extend_from_slice(&added.to_le_bytes());
            value.extend_from_slice(tail);
            (inode_key(path), Some(value))
        }
        Change::Removed(path) => (inode_key(path), None),
        Change::Entry { dir, name, entry } => {
            let mut value = Vec::with_capacity(9);
            value.push(entry.kind as u8);
            if entry.mark != 0 {
                value.extend_from_slice(&entry.mark.to_le_bytes());
            }
            (entry_key(dir, name), Some(value))
        }
        Change::EntryRemoved { dir, name } => (entry_key(dir, name), None),
        Change::NextId(n) => (COUNTER.to_vec(), Some(n.to_le_bytes().to_vec())),
    }
}

fn u64_of(b: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(b.try_into().ok()?))
}

impl MetaDb {
    /// Opens (creating if needed) the store in directory `dir`.
    pub fn open(dir: &Path, durable: bool) -> Result<MetaDb> {
        let path = dir.display().to_string();
        std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("create {path}"), e))?;
        let flags = if durable {
            // Synced: written only when the journal's records are applied (and at init, clear).
            EnvFlags::empty()
        } else {
            // Commits still reach the kernel (a killed server loses nothing), unsynced.
            EnvFlags::NO_SYNC
        };
        // SAFETY: the environment is opened once per worker directory and never by another
        // process (each server owns its data directory); LMDB's own rule.
        let env = unsafe { EnvOpenOptions::new().map_size(MAP_SIZE).flags(flags).open(dir) }
            .map_err(|e| db_error("open", &path, e))?;
        let mut w = env.write_txn().map_err(|e| db_error("begin", &path, e))?;
        let db = env
            .create_database::<Bytes, Bytes>(&mut w, None)
            .map_err(|e| db_error("create", &path, e))?;
        w.commit().map_err(|e| db_error("commit", &path, e))?;
        let mut store = MetaDb {
            env,
            db,
            path,
            staged: RefCell::new(Vec::new()),
            journal: None,
        };
        if durable {
            let applied = {
                let r = store.env.read_txn().map_err(|e| store.err("read", e))?;
                let v = store
                    .db
                    .get(&r, JOURNAL_APPLIED)
                    .map_err(|e| store.err("read", e))?;
                v.and_then(u64_of).unwrap_or(0)
            };
            let (journal, unapplied, _) = Journal::open(dir, applied)?;
            store.journal = Some(RefCell::new((journal, unapplied)));
            // What a stop or crash left in the journal only, in the environment before loading.
            store.apply_journal()?;
        }
        Ok(store)
    }

    /// Applies the journal's records not yet in the environment to it, in one synced
    /// transaction that also records the last one applied; the journal starts again.
    fn apply_journal(&self) -> Result<()> {
        let Some(journal) = &self.journal else {
            return Ok(());
        };
        let mut journal = journal.borrow_mut();
        let (j, pending) = &mut *journal;
        let mut w = self.env.write_txn().map_err(|e| self.err("begin", e))?;
        for (key, value) in pending.iter() {
            match value {
                Some(v) => self.db.put(&mut w, key, v),
                None => self.db.delete(&mut w, key).map(drop),
            }
            .map_err(|e| self.err("write", e))?;
        }
        self.db
            .put(&mut w, JOURNAL_APPLIED, &j.last().to_le_bytes())
            .map_err(|e| self.err("write", e))?;
        w.commit().map_err(|e| self.err("commit", e))?;
        pending.clear();
        j.restart();
        Ok(())
    }

    /// Everything the store holds, or None when it is new. A store written by another owner
    /// or cluster shape is refused: its paths would belong to other owners now.
    pub fn load(&self, owner: u32, owners: u32) -> Result<Option<Loaded>> {
        let r = self.env.read_txn().map_err(|e| self.err("read", e))?;
        let get = |k: &[u8]| self.db.get(&r, k).map_err(|e| self.err("read", e));
        let Some(shape) = get(SHAPE)? else {
            return Ok(None);
        };
        let want = [owner.to_le_bytes(), owners.to_le_bytes()].concat();
        if shape != want.as_slice() {
            let num = |at: usize| {
                shape
                    .get(at..at + 4)
                    .and_then(|b| b.try_into().ok())
                    .map_or("?".to_string(), |b| u32::from_le_bytes(b).to_string())
            };
            return Err(Error::Config(format!(
                "metadata store {}: written by metadata owner {} of {}, this worker is owner \
                 {owner} of {owners}: restart with the cluster's original server and worker counts",
                self.path,
                num(0),
                num(4)
            )));
        }
        let format = get(FORMAT)?.and_then(|b| b.try_into().ok().map(u32::from_le_bytes));
        if format != Some(FORMAT_VERSION) {
            return Err(Error::Config(format!(
                "metadata store {}: format {} (this BenchFS reads format {FORMAT_VERSION}, which \
                 keeps small files' bytes with their inodes): start the job on an empty data directory",
                self.path,
                format.map_or("1".to_string(), |f| f.to_string())
            )));
        }
        let bad = |what: &str| Error::Protocol(format!("metadata store {}: {what}", self.path));
        let next_id = get(COUNTER)?
            .and_then(u64_of)
            .ok_or_else(|| bad("no id counter"))?;
        let nonce = get(NONCE)?
            .and_then(|b| b.try_into().ok().map(u32::from_le_bytes))
            .ok_or_else(|| bad("no nonce"))?;
        let mut loaded = Loaded {
            inodes: Vec::new(),
            entries: Vec::new(),
            next_id,
            nonce,
        };
        for item in self.db.iter(&r).map_err(|e| self.err("read", e))? {
            let (k, v) = item.map_err(|e| self.err("read", e))?;
            match k.first() {
                Some(&INODE) => {
                    let path = std::str::from_utf8(&k[1..]).map_err(|_| bad("a path is not UTF-8"))?;
                    let attr = v.get(..ATTR_LEN).and_then(Attr::decode);
                    let added = v.get(ATTR_LEN..ATTR_LEN + 8).and_then(u64_of);
                    let tail = v.get(ATTR_LEN + 8..);
                    let (Some(attr), Some(added), Some(tail)) = (attr, added, tail) else {
                        return Err(bad(&format!("inode {path} is damaged")));
                    };
                    let tail = match (attr.kind, std::str::from_utf8(tail)) {
                        (Kind::Symlink, Ok(t)) if !t.is_empty() => Tail::Target(t.to_string()),
                        (Kind::Symlink, _) => return Err(bad(&format!("link {path} has no target"))),
                        (Kind::File, _) if attr.layout.inline && tail.len() as u64 == attr.size => {
                            Tail::Inline(tail.to_vec())
                        }
                        (_, _) if tail.is_empty() && !attr.layout.inline => Tail::None,
                        _ => return Err(bad(&format!("inode {path} is damaged"))),
                    };
                    loaded.inodes.push((path.to_string(), attr, added, tail));
                }
                Some(&ENTRY) => {
                    let text = std::str::from_utf8(&k[1..]).map_err(|_| bad("an entry is not UTF-8"))?;
                    let (dir, name) = text.split_once('\0').ok_or_else(|| bad("an entry has no name"))?;
                    // The kind, then the mark when the entry has one.
                    let kind = v.first().and_then(|&b| Kind::from_u8(b));
                    let mark = match v.get(1..) {
                        Some([]) => Some(0),
                        Some(m) => u64_of(m),
                        None => None,
                    };
                    let (Some(kind), Some(mark)) = (kind, mark) else {
                        return Err(bad(&format!("entry {name} of {dir} is damaged")));
                    };
                    loaded
                        .entries
                        .push((dir.to_string(), name.to_string(), Entry { kind, mark }));
                }
                _ => {}
            }
        }
        Ok(Some(loaded))
    }

    /// Marks a new store as owner `owner` of `owners`, ids from `nonce`.
    pub fn init(&self, owner: u32, owners: u32, nonce: u32) -> Result<()> {
        let mut w = self.env.write_txn().map_err(|e| self.err("begin", e))?;
        let shape = [owner.to_le_bytes(), owners.to_le_bytes()].concat();
        let format = FORMAT_VERSION.to_le_bytes();
        for (k, v) in [
            (SHAPE, &shape[..]),
            (NONCE, &nonce.to_le_bytes()[..]),
            (FORMAT, &format[..]),
        ] {
            self.db.put(&mut w, k, v).map_err(|e| self.err("write", e))?;
        }
        self.db
            .put(&mut w, COUNTER, &1u64.to_le_bytes())
            .map_err(|e| self.err("write", e))?;
        w.commit().map_err(|e| self.err("commit", e))
    }

    /// Removes every inode and entry (the counter, nonce and shape stay), staged ones too.
    pub fn clear(&self) -> Result<()> {
        self.staged.borrow_mut().clear();
        // The journal's records first, so that none of them brings back what this removes.
        self.apply_journal()?;
        let mut w = self.env.write_txn().map_err(|e| self.err("begin", e))?;
        let keys: Vec<Vec<u8>> = {
            let iter = self.db.iter(&w).map_err(|e| self.err("read", e))?;
            let mut keys = Vec::new();
            for item in iter {
                let (k, _) = item.map_err(|e| self.err("read", e))?;
                if matches!(k.first(), Some(&INODE) | Some(&ENTRY)) {
                    keys.push(k.to_vec());
                }
            }
            keys
        };
        for k in keys {
            self.db.delete(&mut w, &k).map_err(|e| self.err("clear", e))?;
        }
        w.commit().map_err(|e| self.err("commit", e))
    }

    /// Persists `changes` in one commit of their own (with anything staged before them).
    pub fn apply(&self, changes: &[Change<'_>]) -> Result<()> {
        self.stage(changes);
        self.commit_staged().map(drop)
    }

    /// Stages `changes` for the next [`commit_staged`](Self::commit_staged).
    pub fn stage(&self, changes: &[Change<'_>]) {
        self.staged.borrow_mut().extend(changes.iter().map(write_of));
    }

    /// Whether changes wait for a commit.
    pub fn has_staged(&self) -> bool {
        !self.staged.borrow().is_empty()
    }

    /// Commits every staged change at once: one transaction, or with `durable` one synced
    /// journal record; returns how many writes it made. On an error the staged changes are
    /// dropped: they stay in memory only, and are lost at a restart.
    pub fn commit_staged(&self) -> Result<usize> {
        let writes = std::mem::take(&mut *self.staged.borrow_mut());
        if writes.is_empty() {
            return Ok(0);
        }
        if let Some(journal) = &self.journal {
            let n = writes.len();
            if !journal.borrow().0.fits(&writes) {
                if !Journal::could_hold(&writes) {
                    // Larger than the whole journal: straight into the environment, synced.
                    journal.borrow_mut().1.extend(writes);
                    return self.apply_journal().map(|()| n);
                }
                self.apply_journal()?;
            }
            let (j, pending) = &mut *journal.borrow_mut();
            j.append(&writes)?;
            pending.extend(writes);
            return Ok(n);
        }
        let mut w = self.env.write_txn().map_err(|e| self.err("begin", e))?;
        for (key, value) in &writes {
            match value {
                Some(v) => self.db.put(&mut w, key, v),
                None => self.db.delete(&mut w, key).map(drop),
            }
            .map_err(|e| self.err("write", e))?;
        }
        w.commit().map_err(|e| self.err("commit", e))?;
        Ok(writes.len())
    }

    fn err(&self, what: &str, e: heed::Error) -> Error {
        db_error(what, &self.path, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunking::FileId;
    use crate::placement::Layout;

    fn link_attr() -> Attr {
        Attr {
            kind: Kind::Symlink,
            mode: 0o777,
            id: FileId(9),
            size: 6,
            mtime_ns: 1,
            ctime_ns: 1,
            layout: Layout::NONE,
        }
    }

    #[test]
    fn a_link_keeps_its_target() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let db = MetaDb::open(dir.path(), false)?;
        db.init(0, 1, 7)?;
        db.apply(&[Change::Inode {
            path: "/l",
            attr: link_attr(),
            added: 0,
            target: Some("../t/x"),
            inline: None,
        }])?;
        let loaded = db.load(0, 1)?.ok_or_else(|| Error::Protocol("empty".into()))?;
        assert_eq!(
            loaded.inodes,
            vec![(
                "/l".to_string(),
                link_attr(),
                0,
                Tail::Target("../t/x".to_string())
            )]
        );
        Ok(())
    }

    fn file_attr(id: u128) -> Attr {
        Attr {
            kind: Kind::File,
            id: FileId(id),
            size: id as u64,
            layout: Layout {
                chunk_size: 1 << 20,
                stripe_count: 1,
                start: 0,
                replicas: 1,
                ..Layout::NONE
            },
            ..link_attr()
        }
    }

    /// A durable store's commits are journal records until the journal fills: a store dropped
    /// at any point (as a killed server's) opens with every committed change, across laps of
    /// the journal, and what `clear` removed stays removed.
    #[test]
    fn a_durable_store_keeps_every_commit_through_its_journal() -> Result<()> {
        const BIG: &str = "/a-directory-whose-long-name-makes-its-entries-outgrow-the-journal";
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let paths: Vec<String> = (0..5_000)
            .map(|i| format!("/dir/file-with-a-long-name-{i:06}"))
            .collect();
        {
            let db = MetaDb::open(dir.path(), true)?;
            db.init(0, 1, 7)?;
            for (i, p) in paths.iter().enumerate() {
                db.stage(&[Change::Inode {
                    path: p,
                    attr: file_attr(i as u128),
                    added: 0,
                    target: None,
                    inline: None,
                }]);
                db.commit_staged()?;
            }
            db.apply(&[Change::Removed(&paths[0])])?;
            // One group larger than the whole journal goes straight into the environment.
            let big: Vec<Change<'_>> = (0..3_000)
                .map(|i| Change::Entry {
                    dir: BIG,
                    name: &paths[i],
                    entry: Entry {
                        kind: Kind::File,
                        mark: 0,
                    },
                })
                .collect();
            assert!(!Journal::could_hold(
                &big.iter().map(write_of).collect::<Vec<_>>()
            ));
            db.apply(&big)?;
        }
        let reopened = MetaDb::open(dir.path(), true)?;
        let loaded = reopened
            .load(0, 1)?
            .ok_or_else(|| Error::Protocol("empty".into()))?;
        assert_eq!(loaded.inodes.len(), paths.len() - 1);
        assert_eq!(loaded.entries.iter().filter(|(d, _, _)| d == BIG).count(), 3_000);
        let number = |p: &str| p.rsplit('-').next().and_then(|n| n.parse::<u64>().ok());
        assert!(loaded
            .inodes
            .iter()
            .all(|(p, a, _, _)| *p != paths[0] && number(p) == Some(a.size)));
        reopened.clear()?;
        drop(reopened);
        let cleared = MetaDb::open(dir.path(), true)?.load(0, 1)?;
        assert_eq!(cleared.map(|l| l.inodes.len()), Some(0));
        Ok(())
    }

    #[test]
    fn a_store_written_before_links_is_refused_in_one_line() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let db = MetaDb::open(dir.path(), false)?;
        db.init(0, 1, 7)?;
        // What a store of format 1 looks like: no format key.
        let mut w = db.env.write_txn().map_err(|e| db.err("begin", e))?;
        db.db.delete(&mut w, FORMAT).map_err(|e| db.err("write", e))?;
        w.commit().map_err(|e| db.err("commit", e))?;
        let refused = db.load(0, 1).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(refused.contains("format 1"), "{refused}");
        assert!(
            refused.contains("empty data directory") && !refused.contains('\n'),
            "{refused}"
        );
        Ok(())
    }

    /// Formats 2 and 3 kept no copy count (2) and no inline bytes or chunk generation (3) in
    /// their inodes: their files would read wrongly, so they are refused in one line.
    #[test]
    fn a_store_of_an_older_format_is_refused_in_one_line() -> Result<()> {
        for old in [2u32, 3] {
            let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
            let db = MetaDb::open(dir.path(), false)?;
            db.init(0, 1, 7)?;
            let mut w = db.env.write_txn().map_err(|e| db.err("begin", e))?;
            db.db
                .put(&mut w, FORMAT, &old.to_le_bytes())
                .map_err(|e| db.err("write", e))?;
            w.commit().map_err(|e| db.err("commit", e))?;
            let refused = db.load(0, 1).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(
                refused.contains(&format!("format {old}"))
                    && refused.contains("small files")
                    && !refused.contains('\n'),
                "{refused}"
            );
        }
        Ok(())
    }
}
