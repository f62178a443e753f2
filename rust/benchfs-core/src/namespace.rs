//! The namespace: path rules, file attributes, and the in-memory metadata store each owner
//! (one per server worker) keeps for the paths that hash to it. docs/namespace.md describes
//! the semantics; the wire encodings of attributes, requests and entries are in
//! [`crate::protocol::meta`] (docs/protocol.md).
//!
//! Who holds what: a path's inode (kind, id, size, mode, times, layout) lives on
//! `metadata_owner(path)`; a directory's entries live with the directory's inode, so readdir
//! asks one owner. Creating a file touches two owners: the parent's (entry) and the file's
//! (inode); the client drives both steps (see client/names.rs).
//!
//! An entry is either confirmed or marked: a name being added, or about to lose its inode
//! (unlink, rename), carries a mark until a reader has seen its inode. Listings verify marked
//! entries with the inode's owner and hide those without one, so a client that dies between
//! the steps of an operation leaves a namespace on which stat, readdir and open agree.

mod inline;

use std::collections::{BTreeMap, HashMap};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::chunking::FileId;
use crate::metadb::{Change, MetaDb, Tail};
use crate::placement::{Layout, LayoutAllocator};
use crate::protocol::meta::{DirEntry, FindRequest, Found, CHUNKED, CREATE, EXCLUSIVE, NO_REPLACE, TRUNCATE};
use crate::protocol::mirror;

pub const PATH_MAX: usize = 4096;
pub const NAME_MAX: usize = 255;

type Errno = i32;

/// Normalizes an absolute path: collapses `//` and `.`, resolves `..` lexically. Errors:
/// ENOENT for an empty path, EINVAL for a relative path, a NUL byte or `..` above the root,
/// ENAMETOOLONG for a path over PATH_MAX or a component over NAME_MAX.
pub fn normalize(path: &str) -> Result<String, Errno> {
    if path.is_empty() {
        return Err(libc::ENOENT);
    }
    if path.len() >= PATH_MAX {
        return Err(libc::ENAMETOOLONG);
    }
    if path.as_bytes().contains(&0) || !path.starts_with('/') {
        return Err(libc::EINVAL);
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(libc::EINVAL);
                }
            }
            name if name.len() > NAME_MAX => return Err(libc::ENAMETOOLONG),
            name => parts.push(name),
        }
    }
    Ok(if parts.is_empty() {
        "/".to_string()
    } else {
        parts.iter().flat_map(|p| ["/", p]).collect()
    })
}

/// `(parent, name)` of a normalized path; None for the root.
pub fn split_parent(path: &str) -> Option<(&str, &str)> {
    if path == "/" {
        return None;
    }
    let at = path.rfind('/')?;
    Some((if at == 0 { "/" } else { &path[..at] }, &path[at + 1..]))
}

/// The path of entry `name` of the normalized directory `dir` (the inverse of
/// [`split_parent`]).
pub fn child_path(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    File = 1,
    Dir = 2,
    /// A symbolic link: its target is kept with its inode.
    Symlink = 3,
}

impl Kind {
    pub(crate) fn from_u8(v: u8) -> Option<Kind> {
        match v {
            1 => Some(Kind::File),
            2 => Some(Kind::Dir),
            3 => Some(Kind::Symlink),
            _ => None,
        }
    }
}

/// What stat reports. Directories have a zero id and layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    pub kind: Kind,
    /// Permission bits (the file type is `kind`).
    pub mode: u32,
    pub id: FileId,
    pub size: u64,
    pub mtime_ns: u64,
    pub ctime_ns: u64,
    pub layout: Layout,
}

impl Attr {
    /// The id the file's chunks are kept under: its id, with the generation of its chunks
    /// (see [`Layout::generation`]) in bits 48 to 62 of its counter, which no file's counter
    /// reaches, so each move of a small file's bytes into chunks writes chunks no other file
    /// and no other attempt has.
    pub fn data_id(&self) -> u128 {
        self.id.0 ^ ((self.layout.generation as u128) << 48)
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A directory entry as its directory's owner keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub kind: Kind,
    /// 0 when confirmed (the name has its inode); else the mark an operation that may not have
    /// finished gave it (unique within this owner, never reused: see [`MetaStore::new_mark`]).
    pub mark: u64,
}

struct Node {
    attr: Attr,
    /// A directory's entries; None for files.
    entries: Option<BTreeMap<String, Entry>>,
    /// Entries ever added to this directory: the next file's stripe start (see `dir_add`).
    added: u64,
    /// A symbolic link's target, as its creator wrote it.
    target: Option<Box<str>>,
    /// An inline file's bytes (`attr.layout.inline`; as many as its size).
    inline: Option<Vec<u8>>,
}

/// What [`MetaStore::find`] answers.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct FindPage {
    pub examined: u64,
    pub matched: u64,
    pub found: Vec<Found>,
    pub more: bool,
}

/// How [`MetaStore::set_size`] changes the size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeUpdate {
    /// The size becomes at least this (a writer's largest end, at close or fsync).
    AtLeast,
    /// The size becomes exactly this (truncate).
    Exact,
}

/// The metadata one owner keeps: served from memory, written through to its store on the
/// server's device when it has one ([`MetaStore::open`]).
pub struct MetaStore {
    nodes: HashMap<String, Node>,
    /// Ids are `id_base | counter`: the owner's index and a nonce in the high 64 bits, so no
    /// two files of a job, on any owner, ever share an id (and thus chunks). Both are kept in
    /// the store, so a restarted owner continues the sequence.
    id_base: u128,
    next_id: u64,
    layouts: LayoutAllocator,
    db: Option<MetaDb>,
    /// The next entry mark: starts at the clock in nanoseconds, so a restarted owner never
    /// reuses one a client may still hold (it hands out far fewer than one per nanosecond).
    next_mark: u64,
    /// With copies of the metadata: the changes of the request being served, and the versions
    /// of the keys changed by mirrors (see [`MetaStore::apply_mirror`]).
    copies: Option<Copies>,
    /// Files created from now on keep up to this many bytes with their inodes (0: none).
    inline_max: usize,
    /// The last chunk generation handed to a move of an inline file's bytes into chunks.
    generation: u16,
}

/// What a store with copies keeps besides its names.
#[derive(Default)]
struct Copies {
    /// The records of the changes made since the last [`MetaStore::take_changes`].
    journal: std::cell::RefCell<Vec<u8>>,
    /// The keys those changes are about (their versions are set when numbered).
    keys: std::cell::RefCell<Vec<String>>,
    /// The newest sequence number handed out or applied: changes are numbered above it.
    seq: u64,
    /// Key ([`mirror::change_key`]) -> the sequence number of its last change (made here or
    /// applied from a mirror), removals included, so an older record arriving late changes
    /// nothing. Keys not changed since the store was opened have none (version 0).
    versions: HashMap<String, u64>,
}

impl MetaStore {
    /// Owner `owner` of `owners`; files stripe over `stripe_count` servers in `chunk_size`
    /// chunks. The owner of "/" creates the root directory.
    pub fn new(owner: u32, owners: u32, stripe_count: u32, chunk_size: u64, nonce: u32) -> MetaStore {
        let mut store = MetaStore {
            nodes: HashMap::new(),
            id_base: ((owner as u128) << 96) | ((nonce as u128) << 64),
            next_id: 1,
            layouts: LayoutAllocator::new(owner, owners, stripe_count, chunk_size),
            db: None,
            next_mark: now_ns().max(1),
            copies: None,
            inline_max: 0,
            // Attempts of an earlier life of this owner wrote under other generations.
            generation: (now_ns() % crate::placement::MAX_GENERATION as u64) as u16,
        };
        if crate::placement::metadata_owner("/", owners) == owner {
            store.nodes.insert("/".into(), Self::dir_node(0o755));
        }
        store
    }

    /// As [`MetaStore::new`], kept in the store in directory `dir`: what it holds is loaded
    /// (a restarted owner serves every name it had), and every change is written through
    /// (`durable`: and synced before it is answered). `nonce` is used only for a new store.
    pub fn open(
        dir: &std::path::Path,
        durable: bool,
        (owner, owners): (u32, u32),
        stripe_count: u32,
        chunk_size: u64,
        nonce: u32,
    ) -> crate::error::Result<MetaStore> {
        let db = MetaDb::open(dir, durable)?;
        let mut store = match db.load(owner, owners)? {
            Some(loaded) => {
                let mut store = MetaStore::new(owner, owners, stripe_count, chunk_size, loaded.nonce);
                store.nodes.clear();
                store.next_id = loaded.next_id;
                for (path, attr, added, tail) in loaded.inodes {
                    let entries = (attr.kind == Kind::Dir).then(BTreeMap::new);
                    let (target, inline) = match tail {
                        Tail::Target(t) => (Some(t.into_boxed_str()), None),
                        Tail::Inline(b) => (None, Some(b)),
                        Tail::None => (None, None),
                    };
                    store.nodes.insert(
                        path,
                        Node {
                            attr,
                            entries,
                            added,
                            target,
                            inline,
                        },
                    );
                }
                for (dir, name, entry) in loaded.entries {
                    store.next_mark = store.next_mark.max(entry.mark + 1);
                    // A directory and its entries change in one commit, so every entry's
                    // directory is there; one that is not would have nowhere to be listed.
                    if let Some(Node { entries: Some(e), .. }) = store.nodes.get_mut(&dir) {
                        e.insert(name, entry);
                    }
                }
                store
            }
            None => {
                let store = MetaStore::new(owner, owners, stripe_count, chunk_size, nonce);
                db.init(owner, owners, nonce)?;
                if let Some(root) = store.nodes.get("/") {
                    db.apply(&[Change::Inode {
                        path: "/",
                        attr: root.attr,
                        added: 0,
                        target: None,
                        inline: None,
                    }])?;
                }
                store
            }
        };
        store.db = Some(db);
        Ok(store)
    }

    /// Stages `changes` for the store's next group commit ([`commit`](Self::commit)), and
    /// with copies of the metadata journals them for the mirrors.
    fn persist(&self, changes: &[Change<'_>]) -> Result<(), Errno> {
        if let Some(c) = &self.copies {
            let mut journal = c.journal.borrow_mut();
            changes
                .iter()
                .for_each(|ch| mirror::encode_change(ch, &mut journal));
            c.keys
                .borrow_mut()
                .extend(changes.iter().filter_map(mirror::change_key));
        }
        self.write_through(changes)
    }

    /// Stages `changes` for the store on the device only.
    fn write_through(&self, changes: &[Change<'_>]) -> Result<(), Errno> {
        if let Some(db) = &self.db {
            db.stage(changes);
        }
        Ok(())
    }

    /// Whether changes wait for [`commit`](Self::commit).
    pub fn has_staged(&self) -> bool {
        self.db.as_ref().is_some_and(MetaDb::has_staged)
    }

    /// Commits the staged changes to the store on the device in one transaction; returns how
    /// many writes it made (EIO if it failed: the changes are then in memory only, and lost at
    /// a restart). The changes of a request are answered only after this.
    pub fn commit(&self) -> Result<usize, Errno> {
        match &self.db {
            None => Ok(0),
            Some(db) => db.commit_staged().map_err(|e| {
                crate::warn_line!("benchfs: {e}");
                libc::EIO
            }),
        }
    }

    /// The persisted form of the inode at `path` (it must exist).
    fn inode_change<'a>(&'a self, path: &'a str) -> Option<Change<'a>> {
        self.nodes.get(path).map(|n| Change::Inode {
            path,
            attr: n.attr,
            added: n.added,
            target: n.target.as_deref(),
            inline: n.inline.as_deref(),
        })
    }

    /// Persists the inode at `path` as it is now.
    fn persist_inode(&self, path: &str) -> Result<(), Errno> {
        match self.inode_change(path) {
            Some(c) => self.persist(&[c]),
            None => Ok(()),
        }
    }

    fn dir_node(mode: u32) -> Node {
        let t = now_ns();
        Node {
            attr: Attr {
                kind: Kind::Dir,
                mode: mode & 0o7777,
                id: FileId(0),
                size: 0,
                mtime_ns: t,
                ctime_ns: t,
                layout: Layout::NONE,
            },
            entries: Some(BTreeMap::new()),
            added: 0,
            target: None,
            inline: None,
        }
    }

    /// Files created from now on keep `replicas` copies of each chunk (`layout.replicas`);
    /// those made before keep the layout they were made with.
    pub fn with_replicas(mut self, replicas: u8) -> MetaStore {
        self.layouts = self.layouts.with_replicas(replicas);
        self
    }

    /// This owner's metadata has copies elsewhere: every change is also recorded for them
    /// ([`MetaStore::take_changes`]).
    pub fn with_copies(mut self) -> MetaStore {
        self.copies = Some(Copies::default());
        self
    }

    /// The changes made since the last call, numbered for the copies: a sequence number above
    /// every one handed out or applied here before (and at least the clock in nanoseconds, so
    /// a restarted or newly serving copy continues above its predecessor), and their records.
    /// None when nothing changed.
    pub fn take_changes(&mut self) -> Option<(u64, Vec<u8>)> {
        let c = self.copies.as_mut()?;
        let journal = std::mem::take(c.journal.get_mut());
        if journal.is_empty() {
            return None;
        }
        c.seq = (c.seq + 1).max(now_ns());
        for key in c.keys.get_mut().drain(..) {
            c.versions.insert(key, c.seq);
        }
        Some((c.seq, journal))
    }

    /// Applies changes the serving copy made (a mirror: every record under one sequence
    /// number; or a page of its state, each record with its key's version): each record whose
    /// key has no newer version here, so mirrors of several clients and the pages of a repair
    /// may arrive in any order. Written through to the store like the serving copy's changes.
    pub fn apply_mirror(&mut self, records: &[(u64, mirror::Record)]) -> Result<(), Errno> {
        let Some(c) = self.copies.as_mut() else {
            return Err(libc::EINVAL);
        };
        let mut applied = Vec::with_capacity(records.len());
        for (seq, r) in records {
            c.seq = c.seq.max(*seq);
            if let Some(key) = mirror::change_key(&r.as_change()) {
                match c.versions.get_mut(&key) {
                    Some(v) if *v >= *seq => continue,
                    Some(v) => *v = *seq,
                    None => {
                        c.versions.insert(key, *seq);
                    }
                }
            }
            applied.push(r);
        }
        for r in &applied {
            self.apply_record(r);
        }
        let changes: Vec<Change<'_>> = applied.iter().map(|r| r.as_change()).collect();
        self.write_through(&changes)
    }

    /// Forgets every name (a copy about to be caught up from the serving one): in memory and
    /// in the store. The id counter stays.
    pub fn wipe(&mut self) {
        self.nodes.clear();
        if let Some(c) = self.copies.as_mut() {
            c.versions.clear();
            c.journal.get_mut().clear();
            c.keys.get_mut().clear();
        }
        if let Some(db) = &self.db {
            if let Err(e) = db.clear() {
                crate::warn_line!("benchfs: {e}");
            }
        }
    }

    /// A page of this store's state for a copy being caught up: the keys after `after` (as
    /// [`mirror::change_key`] makes them; empty: from the start, the id counter first), by
    /// path and each path's inode before its entries, about `max_bytes` of records, each
    /// preceded by its key's version (u64). Returns the page, its last key, and whether more
    /// follow.
    pub fn snapshot_page(&self, after: &str, max_bytes: usize) -> (Vec<u8>, String, bool) {
        let version = |key: &str| {
            self.copies
                .as_ref()
                .and_then(|c| c.versions.get(key).copied())
                .unwrap_or(0)
        };
        let mut out = Vec::new();
        if after.is_empty() {
            out.extend_from_slice(&0u64.to_le_bytes());
            mirror::encode_change(&Change::NextId(self.next_id), &mut out);
        }
        // The cursor: its path, and for an entry its name (the path's inode went before).
        let (from_path, from_name) = match after.split_at_checked(1) {
            Some(("e", rest)) => match rest.split_once('\0') {
                Some((dir, name)) => (dir, Some(name)),
                None => (rest, None),
            },
            Some((_, rest)) => (rest, None),
            None => ("", None),
        };
        let mut paths: Vec<&String> = self.nodes.keys().filter(|p| p.as_str() >= from_path).collect();
        paths.sort_unstable();
        let mut last = after.to_string();
        for path in paths {
            let node = &self.nodes[path];
            let at_cursor = !after.is_empty() && path.as_str() == from_path;
            if !at_cursor {
                if out.len() >= max_bytes {
                    return (out, last, true);
                }
                let key = format!("i{path}");
                out.extend_from_slice(&version(&key).to_le_bytes());
                let change = Change::Inode {
                    path,
                    attr: node.attr,
                    added: node.added,
                    target: node.target.as_deref(),
                    inline: node.inline.as_deref(),
                };
                mirror::encode_change(&change, &mut out);
                last = key;
            }
            let Some(entries) = &node.entries else {
                continue;
            };
            let start = match (at_cursor, from_name) {
                (true, Some(name)) => std::ops::Bound::Excluded(name),
                _ => std::ops::Bound::Unbounded,
            };
            for (name, entry) in entries.range::<str, _>((start, std::ops::Bound::Unbounded)) {
                if out.len() >= max_bytes {
                    return (out, last, true);
                }
                let key = format!("e{path}\0{name}");
                out.extend_from_slice(&version(&key).to_le_bytes());
                let change = Change::Entry {
                    dir: path,
                    name,
                    entry: *entry,
                };
                mirror::encode_change(&change, &mut out);
                last = key;
            }
        }
        (out, last, false)
    }

    /// One record of a mirror, in memory.
    fn apply_record(&mut self, r: &mirror::Record) {
        use mirror::Record;
        match r {
            Record::Inode {
                path,
                attr,
                added,
                target,
                inline,
            } => {
                let target = target.as_deref().map(Box::from);
                let node = self.nodes.entry(path.clone()).or_insert_with(|| Node {
                    attr: *attr,
                    entries: None,
                    added: 0,
                    target: None,
                    inline: None,
                });
                node.attr = *attr;
                node.added = *added;
                node.target = target;
                node.inline = inline.clone();
                match (attr.kind, &node.entries) {
                    (Kind::Dir, None) => node.entries = Some(BTreeMap::new()),
                    (Kind::Dir, Some(_)) => {}
                    _ => node.entries = None,
                }
            }
            Record::Removed(path) => {
                self.nodes.remove(path);
            }
            Record::Entry { dir, name, entry } => {
                self.next_mark = self.next_mark.max(entry.mark + 1);
                // The directory's own record may come in a later mirror: it then keeps these.
                let node = self
                    .nodes
                    .entry(dir.clone())
                    .or_insert_with(|| Self::dir_node(0o755));
                node.entries
                    .get_or_insert_with(BTreeMap::new)
                    .insert(name.clone(), *entry);
            }
            Record::EntryRemoved { dir, name } => {
                if let Some(Node { entries: Some(e), .. }) = self.nodes.get_mut(dir) {
                    e.remove(name);
                }
            }
            Record::NextId(n) => self.next_id = self.next_id.max(*n),
        }
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Opens or creates a file. Returns its attribute and its size before this call (O_TRUNC
    /// makes the new size smaller; the caller frees the chunks beyond it). A new file stripes
    /// from `start` when given (what its directory's owner chose, see [`MetaStore::dir_add`]),
    /// else from this owner's own counter.
    pub fn create(
        &mut self,
        path: &str,
        flags: u32,
        mode: u32,
        start: Option<u32>,
    ) -> Result<(Attr, u64), Errno> {
        if let Some(node) = self.nodes.get_mut(path) {
            if flags & CREATE != 0 && flags & EXCLUSIVE != 0 {
                return Err(libc::EEXIST);
            }
            match node.attr.kind {
                Kind::Dir => return Err(libc::EISDIR),
                // The client follows links before it opens; one here is O_NOFOLLOW's refusal.
                Kind::Symlink => return Err(libc::ELOOP),
                Kind::File => {}
            }
            let old = node.attr.size;
            let attr = if flags & TRUNCATE != 0 && old > 0 {
                if let Some(bytes) = node.inline.as_mut() {
                    bytes.clear();
                }
                node.attr.size = 0;
                node.attr.mtime_ns = now_ns();
                node.attr.ctime_ns = node.attr.mtime_ns;
                let attr = node.attr;
                self.persist_inode(path)?;
                attr
            } else {
                node.attr
            };
            return Ok((attr, old));
        }
        if flags & CREATE == 0 {
            return Err(libc::ENOENT);
        }
        let mut layout = match start {
            Some(s) => self.layouts.at(s).ok_or(libc::EINVAL)?,
            None => self.layouts.allocate(),
        };
        layout.inline = self.inline_max > 0 && flags & CHUNKED == 0;
        let attr = self.new_inode(path, Kind::File, mode & 0o7777, 0, layout, None)?;
        Ok((attr, 0))
    }

    /// Makes the inode of a new file or link at `path` with the next id, and persists it.
    fn new_inode(
        &mut self,
        path: &str,
        kind: Kind,
        mode: u32,
        size: u64,
        layout: Layout,
        target: Option<&str>,
    ) -> Result<Attr, Errno> {
        let t = now_ns();
        let attr = Attr {
            kind,
            mode,
            id: FileId(self.id_base | self.next_id as u128),
            size,
            mtime_ns: t,
            ctime_ns: t,
            layout,
        };
        self.next_id += 1;
        self.nodes.insert(
            path.to_string(),
            Node {
                attr,
                entries: None,
                added: 0,
                target: target.map(Into::into),
                inline: layout.inline.then(Vec::new),
            },
        );
        self.persist(&[
            Change::Inode {
                path,
                attr,
                added: 0,
                target,
                inline: layout.inline.then_some(&[][..]),
            },
            Change::NextId(self.next_id),
        ])?;
        Ok(attr)
    }

    /// Creates a symbolic link at `path` to `target` (kept as given: the client resolves it).
    /// Its size is the target's length, its mode 0777, and it has an id like a file (never
    /// data).
    pub fn symlink(&mut self, path: &str, target: &str) -> Result<Attr, Errno> {
        if target.is_empty() {
            return Err(libc::ENOENT);
        }
        if self.nodes.contains_key(path) {
            return Err(libc::EEXIST);
        }
        let none = Layout::NONE;
        self.new_inode(
            path,
            Kind::Symlink,
            0o777,
            target.len() as u64,
            none,
            Some(target),
        )
    }

    /// The target of the symbolic link at `path` (EINVAL if it is not one).
    pub fn readlink(&self, path: &str) -> Result<&str, Errno> {
        match self.nodes.get(path) {
            None => Err(libc::ENOENT),
            Some(n) => n.target.as_deref().ok_or(libc::EINVAL),
        }
    }

    pub fn stat(&self, path: &str) -> Result<Attr, Errno> {
        self.nodes.get(path).map(|n| n.attr).ok_or(libc::ENOENT)
    }

    /// Removes a file's inode and returns it (the caller frees its chunks); with `unchanged`
    /// (an id and a change time), only while the inode is that one, unchanged since (ESTALE).
    pub fn unlink(&mut self, path: &str, unchanged: Option<(u128, u64)>) -> Result<Attr, Errno> {
        match self.nodes.get(path) {
            None => Err(libc::ENOENT),
            Some(n) if n.attr.kind == Kind::Dir => Err(libc::EISDIR),
            Some(n) if unchanged.is_some_and(|(id, t)| n.attr.id.0 != id || n.attr.ctime_ns != t) => {
                Err(libc::ESTALE)
            }
            Some(_) => {
                let attr = self.nodes.remove(path).map(|n| n.attr).ok_or(libc::ENOENT)?;
                self.persist(&[Change::Removed(path)])?;
                Ok(attr)
            }
        }
    }

    pub fn mkdir(&mut self, path: &str, mode: u32) -> Result<Attr, Errno> {
        if self.nodes.contains_key(path) {
            return Err(libc::EEXIST);
        }
        let node = Self::dir_node(mode);
        let attr = node.attr;
        self.nodes.insert(path.to_string(), node);
        self.persist_inode(path)?;
        Ok(attr)
    }

    pub fn rmdir(&mut self, path: &str) -> Result<(), Errno> {
        if path == "/" {
            return Err(libc::EBUSY);
        }
        match self.nodes.get(path) {
            None => Err(libc::ENOENT),
            Some(Node { entries: None, .. }) => Err(libc::ENOTDIR),
            Some(Node { entries: Some(e), .. }) if !e.is_empty() => Err(libc::ENOTEMPTY),
            Some(_) => {
                self.nodes.remove(path);
                self.persist(&[Change::Removed(path)])
            }
        }
    }

    fn new_mark(&mut self) -> u64 {
        self.next_mark += 1;
        self.next_mark - 1
    }

    fn dir_entries(&mut self, dir: &str) -> Result<&mut BTreeMap<String, Entry>, Errno> {
        match self.nodes.get_mut(dir) {
            None => Err(libc::ENOENT),
            Some(Node { entries: None, .. }) => Err(libc::ENOTDIR),
            Some(Node { entries: Some(e), .. }) => Ok(e),
        }
    }

    /// Adds `name` to directory `dir`. Returns None if it was there already, else the stripe
    /// start for a new file: the directory's own rotation (a start derived from its path) plus
    /// the number of entries it was ever given, so the files of one directory take consecutive
    /// starts and balance by construction, whatever their names. An existing entry of another
    /// kind is EEXIST (a file cannot shadow a directory, nor the reverse). A new entry is
    /// marked until a listing sees its inode (the inode is made in the operation's next step).
    ///
    /// A link's entry: a file added over it is ELOOP (the client follows the link and creates
    /// its target), unless `retype` (rename), which gives any non-directory entry the new kind.
    pub fn dir_add(&mut self, dir: &str, name: &str, kind: Kind, retype: bool) -> Result<Option<u32>, Errno> {
        let stripe = self.layouts.stripe_count().max(1) as u64;
        let mark = self.new_mark();
        let node = match self.nodes.get_mut(dir) {
            None => return Err(libc::ENOENT),
            Some(n) => n,
        };
        let Some(entries) = node.entries.as_mut() else {
            return Err(libc::ENOTDIR);
        };
        match entries.get_mut(name) {
            Some(e) if e.kind == kind => Ok(None),
            Some(e) if retype && e.kind != Kind::Dir && kind != Kind::Dir => {
                e.kind = kind;
                let entry = *e;
                self.persist(&[Change::Entry { dir, name, entry }])?;
                Ok(None)
            }
            Some(e) if e.kind == Kind::Symlink && kind == Kind::File => Err(libc::ELOOP),
            Some(_) => Err(libc::EEXIST),
            None => {
                let entry = Entry { kind, mark };
                entries.insert(name.to_string(), entry);
                let start =
                    (crate::placement::directory_rotation(dir, stripe as u32) as u64 + node.added) % stripe;
                node.added += 1;
                let (attr, added) = (node.attr, node.added);
                self.persist(&[
                    Change::Entry { dir, name, entry },
                    Change::Inode {
                        path: dir,
                        attr,
                        added,
                        target: None,
                        inline: None,
                    },
                ])?;
                Ok(Some(start as u32))
            }
        }
    }

    /// Removes entry `name` of `dir` (only if it carries mark `only_mark`, when that is
    /// given); whether it was removed.
    pub fn dir_remove(&mut self, dir: &str, name: &str, only_mark: Option<u64>) -> Result<bool, Errno> {
        let entries = self.dir_entries(dir)?;
        match entries.get(name) {
            Some(e) if only_mark.is_none_or(|m| m == e.mark) => {
                entries.remove(name);
            }
            _ => return Ok(false),
        }
        self.persist(&[Change::EntryRemoved { dir, name }])?;
        Ok(true)
    }

    /// Marks entry `name` of `dir` before its inode goes (unlink, rmdir, rename's source), so
    /// that listings check it until the operation is over; whether it was there.
    pub fn dir_mark(&mut self, dir: &str, name: &str) -> Result<bool, Errno> {
        let mark = self.new_mark();
        let Some(e) = self.dir_entries(dir)?.get_mut(name) else {
            return Ok(false);
        };
        e.mark = mark;
        let entry = *e;
        self.persist(&[Change::Entry { dir, name, entry }])?;
        Ok(true)
    }

    /// Confirms entry `name` of `dir` if it still carries `mark` (a reader found its inode after
    /// the mark was given); whether it did.
    pub fn dir_confirm(&mut self, dir: &str, name: &str, mark: u64) -> Result<bool, Errno> {
        let Some(e) = self.dir_entries(dir)?.get_mut(name) else {
            return Ok(false);
        };
        if mark == 0 || e.mark != mark {
            return Ok(false);
        }
        e.mark = 0;
        let entry = *e;
        self.persist(&[Change::Entry { dir, name, entry }])?;
        Ok(true)
    }

    /// Up to `max` entries after `after` (exclusive; "" from the start), and whether more follow.
    pub fn readdir(&mut self, dir: &str, after: &str, max: usize) -> Result<(Vec<DirEntry>, bool), Errno> {
        let entries = self.dir_entries(dir)?;
        let mut range = entries.range::<str, _>((
            if after.is_empty() {
                std::ops::Bound::Unbounded
            } else {
                std::ops::Bound::Excluded(after)
            },
            std::ops::Bound::Unbounded,
        ));
        let page: Vec<DirEntry> = range
            .by_ref()
            .take(max)
            .map(|(n, e)| DirEntry {
                name: n.clone(),
                kind: e.kind,
                mark: e.mark,
            })
            .collect();
        Ok((page, range.next().is_some()))
    }

    /// A find over the names this owner holds (see [`FindRequest`]): how many names under
    /// the root it examined and matched, and (unless `count_only`) the matches after the
    /// request's cursor, in path order, at most `max` of them and at most `max_bytes` of paths;
    /// whether more follow.
    pub fn find(&self, req: &FindRequest, max_bytes: usize) -> Result<FindPage, Errno> {
        let pattern = glob::Pattern::new(&req.name).map_err(|_| libc::EINVAL)?;
        let under = |path: &str| {
            req.root == "/"
                || path == req.root
                || (path.starts_with(req.root.as_str()) && path.as_bytes().get(req.root.len()) == Some(&b'/'))
        };
        let mut page = FindPage::default();
        let mut matches: Vec<(&String, &Attr)> = Vec::new();
        for (path, node) in &self.nodes {
            if !under(path) {
                continue;
            }
            page.examined += 1;
            let a = &node.attr;
            let name = path.rsplit('/').next().unwrap_or("");
            let hit = req.kind.is_none_or(|k| k == a.kind)
                && (req.size_min..=req.size_max).contains(&a.size)
                && a.mtime_ns > req.newer_ns
                && (req.name.is_empty() || pattern.matches(name));
            if hit {
                page.matched += 1;
                if !req.count_only && path.as_str() > req.after.as_str() {
                    matches.push((path, a));
                }
            }
        }
        matches.sort_unstable_by(|x, y| x.0.cmp(y.0));
        let mut bytes = 0;
        for (path, a) in matches.iter() {
            if page.found.len() >= req.max as usize || bytes + path.len() > max_bytes {
                page.more = true;
                break;
            }
            bytes += path.len() + 19;
            page.found.push(Found {
                path: (*path).clone(),
                kind: a.kind,
                size: a.size,
                mtime_ns: a.mtime_ns,
            });
        }
        Ok(page)
    }

    /// Puts `attr` at `path` (the second half of a rename; a symbolic link's with its `target`).
    /// Replacing follows rename(2): a file or link may replace a file or link, a directory an
    /// empty directory. Returns what was replaced.
    pub fn install(
        &mut self,
        path: &str,
        attr: Attr,
        flags: u32,
        target: Option<&str>,
        inline: &[u8],
    ) -> Result<Option<Attr>, Errno> {
        if (attr.kind == Kind::Symlink) != target.is_some_and(|t| !t.is_empty()) {
            return Err(libc::EINVAL);
        }
        // An inline file's bytes move with it, all of them.
        if (attr.layout.inline && inline.len() as u64 != attr.size)
            || (!attr.layout.inline && !inline.is_empty())
        {
            return Err(libc::EINVAL);
        }
        if let Some(old) = self.nodes.get(path) {
            if flags & NO_REPLACE != 0 {
                return Err(libc::EEXIST);
            }
            match (attr.kind, &old.entries) {
                (Kind::File | Kind::Symlink, Some(_)) => return Err(libc::EISDIR),
                (Kind::Dir, None) => return Err(libc::ENOTDIR),
                (Kind::Dir, Some(e)) if !e.is_empty() => return Err(libc::ENOTEMPTY),
                _ => {}
            }
        }
        let node = Node {
            attr: Attr {
                ctime_ns: now_ns(),
                ..attr
            },
            entries: (attr.kind == Kind::Dir).then(BTreeMap::new),
            added: 0,
            target: target.map(Into::into),
            inline: attr.layout.inline.then(|| inline.to_vec()),
        };
        let replaced = self.nodes.insert(path.to_string(), node).map(|n| n.attr);
        self.persist_inode(path)?;
        Ok(replaced)
    }

    /// Updates a file's size; returns the new attribute and the old size.
    pub fn set_size(&mut self, path: &str, size: u64, how: SizeUpdate) -> Result<(Attr, u64), Errno> {
        let node = self.nodes.get_mut(path).ok_or(libc::ENOENT)?;
        match node.attr.kind {
            Kind::Dir => return Err(libc::EISDIR),
            // The client follows links before it truncates (ELOOP tells it to).
            Kind::Symlink => return Err(libc::ELOOP),
            Kind::File => {}
        }
        let old = node.attr.size;
        let new = match how {
            SizeUpdate::AtLeast => old.max(size),
            SizeUpdate::Exact => size,
        };
        let attr = if new != old || how == SizeUpdate::Exact {
            Self::resize_inline(node, new, self.inline_max)?;
            node.attr.size = new;
            node.attr.mtime_ns = now_ns();
            node.attr.ctime_ns = node.attr.mtime_ns;
            let attr = node.attr;
            self.persist_inode(path)?;
            attr
        } else {
            node.attr
        };
        Ok((attr, old))
    }

    /// Sets the permission bits and/or the modification time (chmod, utimens), and a file's
    /// size to at least `size` (a close's report, with the attributes a copy keeps); the
    /// change time becomes now. A link's own: only its time, and only when asked for the link
    /// itself (`link`; lutimes). Otherwise chmod and utimes follow links, and ELOOP tells the
    /// client to.
    pub fn set_attr(
        &mut self,
        path: &str,
        mode: Option<u32>,
        mtime_ns: Option<u64>,
        size: Option<u64>,
        link: bool,
    ) -> Result<Attr, Errno> {
        let node = self.nodes.get_mut(path).ok_or(libc::ENOENT)?;
        match (node.attr.kind, link) {
            (Kind::Symlink, false) => return Err(libc::ELOOP),
            (Kind::Symlink, true) if mode.is_some() || size.is_some() => return Err(libc::EOPNOTSUPP),
            (_, true) if node.attr.kind != Kind::Symlink => return Err(libc::EINVAL),
            (Kind::Dir, _) if size.is_some() => return Err(libc::EISDIR),
            _ => {}
        }
        if let Some(size) = size {
            if size > node.attr.size {
                Self::resize_inline(node, size, self.inline_max)?;
                node.attr.size = size;
                node.attr.mtime_ns = now_ns();
            }
        }
        if let Some(mode) = mode {
            node.attr.mode = mode & 0o7777;
        }
        if let Some(t) = mtime_ns {
            node.attr.mtime_ns = t;
        }
        node.attr.ctime_ns = now_ns();
        let attr = node.attr;
        self.persist_inode(path)?;
        Ok(attr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_rules() {
        assert_eq!(normalize("/"), Ok("/".into()));
        assert_eq!(normalize("//a/./b//"), Ok("/a/b".into()));
        assert_eq!(normalize("/a/b/../c"), Ok("/a/c".into()));
        assert_eq!(normalize("/a/.."), Ok("/".into()));
        assert_eq!(normalize(""), Err(libc::ENOENT));
        assert_eq!(normalize("a/b"), Err(libc::EINVAL));
        assert_eq!(normalize("/.."), Err(libc::EINVAL));
        assert_eq!(normalize("/a/../.."), Err(libc::EINVAL));
        assert_eq!(normalize("/a\0b"), Err(libc::EINVAL));
        assert_eq!(
            normalize(&format!("/{}", "x".repeat(256))),
            Err(libc::ENAMETOOLONG)
        );
        assert!(normalize(&format!("/{}", "x".repeat(255))).is_ok());
        assert_eq!(normalize(&"/abc".repeat(1100)), Err(libc::ENAMETOOLONG));
        assert_eq!(split_parent("/a/b"), Some(("/a", "b")));
        assert_eq!(split_parent("/a"), Some(("/", "a")));
        assert_eq!(split_parent("/"), None);
    }

    #[test]
    fn create_flags_and_errors() {
        let mut m = MetaStore::new(0, 1, 4, 1 << 20, 7);
        assert_eq!(m.create("/f", 0, 0o644, None), Err(libc::ENOENT));
        let (a, _) = m.create("/f", CREATE | EXCLUSIVE, 0o644, None).expect("create");
        assert_eq!(m.create("/f", CREATE | EXCLUSIVE, 0o644, None), Err(libc::EEXIST));
        assert_eq!(m.create("/f", CREATE, 0o644, None).map(|r| r.0.id), Ok(a.id));
        m.set_size("/f", 10, SizeUpdate::AtLeast).expect("size");
        m.set_size("/f", 5, SizeUpdate::AtLeast).expect("size");
        assert_eq!(m.stat("/f").map(|a| a.size), Ok(10));
        assert_eq!(
            m.create("/f", TRUNCATE, 0, None).map(|(a, old)| (a.size, old)),
            Ok((0, 10))
        );
        assert_eq!(m.create("/", CREATE, 0, None), Err(libc::EISDIR));
        assert_eq!(m.unlink("/", None), Err(libc::EISDIR));
        assert_eq!(m.rmdir("/f"), Err(libc::ENOTDIR));
        assert_eq!(m.rmdir("/"), Err(libc::EBUSY));
        m.mkdir("/d", 0o755).expect("mkdir");
        assert_eq!(m.mkdir("/d", 0o755), Err(libc::EEXIST));
        let first = m.dir_add("/d", "x", Kind::File, false).expect("add");
        assert_eq!(m.dir_add("/d", "x", Kind::File, false), Ok(None));
        let second = m.dir_add("/d", "y", Kind::File, false).expect("add");
        assert_eq!(second.map(|s| (s + 4 - 1) % 4), first, "consecutive starts");
        m.dir_remove("/d", "y", None).expect("remove");
        assert_eq!(m.dir_add("/d", "x", Kind::Dir, false), Err(libc::EEXIST));
        assert_eq!(m.dir_add("/f", "x", Kind::File, false), Err(libc::ENOTDIR));
        assert_eq!(m.dir_add("/nope", "x", Kind::File, false), Err(libc::ENOENT));
        assert_eq!(m.rmdir("/d"), Err(libc::ENOTEMPTY));
        m.dir_remove("/d", "x", None).expect("remove");
        assert_eq!(m.rmdir("/d"), Ok(()));
        assert_eq!(m.unlink("/f", None).map(|a| a.id), Ok(a.id));
        assert_eq!(m.stat("/f"), Err(libc::ENOENT));
    }

    #[test]
    fn readdir_pages_in_order() {
        let mut m = MetaStore::new(0, 1, 1, 4096, 1);
        for i in 0..1000 {
            m.dir_add("/", &format!("n{i:04}"), Kind::File, false)
                .expect("add");
        }
        let (mut all, mut after) = (Vec::new(), String::new());
        loop {
            let (page, more) = m.readdir("/", &after, 300).expect("readdir");
            after = page.last().map(|e| e.name.clone()).unwrap_or_default();
            all.extend(page);
            if !more {
                break;
            }
        }
        assert_eq!(all.len(), 1000);
        assert!(all.windows(2).all(|w| w[0].name < w[1].name));
    }

    #[test]
    fn install_follows_rename_rules() {
        let mut m = MetaStore::new(0, 1, 1, 4096, 1);
        let (f, _) = m.create("/a", CREATE, 0o600, None).expect("create");
        let (g, _) = m.create("/b", CREATE, 0o600, None).expect("create");
        m.mkdir("/d", 0o755).expect("mkdir");
        assert_eq!(m.install("/b", f, NO_REPLACE, None, &[]), Err(libc::EEXIST));
        assert_eq!(m.install("/d", f, 0, None, &[]), Err(libc::EISDIR));
        assert_eq!(
            m.install("/b", f, 0, None, &[]).map(|r| r.map(|a| a.id)),
            Ok(Some(g.id))
        );
        let d = m.stat("/d").expect("stat");
        assert_eq!(m.install("/a", d, 0, None, &[]), Err(libc::ENOTDIR));
        m.dir_add("/d", "x", Kind::File, false).expect("add");
        m.mkdir("/e", 0o755).expect("mkdir");
        let e = m.stat("/e").expect("stat");
        assert_eq!(m.install("/d", e, 0, None, &[]), Err(libc::ENOTEMPTY));
    }

    /// Names that collide under the original's byte-summing hash get distinct ids, and 400k
    /// mdtest-hard-style names spread over 16 owners all get distinct ids.
    #[test]
    fn ids_never_collide() {
        let owners = 16u32;
        let mut stores: Vec<MetaStore> = (0..owners)
            .map(|o| MetaStore::new(o, owners, 16, 1 << 20, 42))
            .collect();
        let mut create = |p: &str| {
            let o = crate::placement::metadata_owner(p, owners) as usize;
            stores[o]
                .create(p, CREATE | EXCLUSIVE, 0o644, None)
                .map(|(a, _)| a.id)
        };
        for (a, b) in [("/file.mdtest.3.7", "/file.mdtest.7.3"), ("/d/ab", "/d/ba")] {
            // Permuted names: a byte-summing path hash cannot tell them apart.
            assert_eq!(
                a.bytes().map(u32::from).sum::<u32>(),
                b.bytes().map(u32::from).sum::<u32>()
            );
            assert_ne!(create(a), create(b));
        }
        let mut ids = std::collections::HashSet::new();
        for rank in 0..400u32 {
            for i in 0..1000u32 {
                let id = create(&format!("/mdtest/file.mdtest.{rank}.{i}")).expect("create");
                assert!(ids.insert(id), "id {id:?} repeated");
            }
        }
        assert_eq!(ids.len(), 400_000);
    }

    /// Marks: a new entry is marked, a reader's confirm clears only the mark it saw (a later
    /// mark, from an unlink that began meanwhile, stays), and a conditional remove takes only
    /// the entry still carrying its mark. A reopened store keeps marks and hands out new ones.
    #[test]
    fn entry_marks_follow_their_operations() -> crate::error::Result<()> {
        let dir = tempfile::tempdir().map_err(|e| crate::error::Error::io("tempdir", e))?;
        let path = dir.path().join("meta-w0");
        let open = || MetaStore::open(&path, false, (0, 1), 4, 1 << 20, 77);
        let mark_of = |m: &mut MetaStore, name: &str| {
            let (page, _) = m.readdir("/", "", 10).expect("readdir");
            page.into_iter().find(|e| e.name == name).map(|e| e.mark)
        };
        let (seen, later) = {
            let mut m = open()?;
            m.dir_add("/", "a", Kind::File, false).expect("add");
            let seen = mark_of(&mut m, "a").expect("listed");
            assert_ne!(seen, 0, "a new entry is marked");
            assert_eq!(m.dir_mark("/", "a"), Ok(true));
            let later = mark_of(&mut m, "a").expect("listed");
            assert!(later > seen);
            assert_eq!(m.dir_confirm("/", "a", seen), Ok(false), "a stale confirm");
            assert_eq!(m.dir_remove("/", "a", Some(seen)), Ok(false));
            assert_eq!(m.dir_mark("/", "nope"), Ok(false));
            m.dir_add("/", "b", Kind::File, false).expect("add");
            let b = mark_of(&mut m, "b").expect("listed");
            assert_eq!(m.dir_confirm("/", "b", b), Ok(true));
            assert_eq!(mark_of(&mut m, "b"), Some(0));
            assert_eq!(m.dir_confirm("/", "b", 0), Ok(false));
            m.commit().expect("commit");
            (seen, later)
        };
        let mut m = open()?;
        assert_eq!(mark_of(&mut m, "a"), Some(later));
        assert_eq!(mark_of(&mut m, "b"), Some(0));
        m.dir_add("/", "c", Kind::File, false).expect("add");
        assert!(
            mark_of(&mut m, "c").expect("listed") > later,
            "marks are never reused"
        );
        assert_eq!(m.dir_remove("/", "a", Some(seen)), Ok(false));
        assert_eq!(m.dir_remove("/", "a", Some(later)), Ok(true));
        Ok(())
    }

    /// A store reopened on its directory holds every inode, entry, size, layout, mode and
    /// time, continues the id sequence, and forgets what was removed.
    #[test]
    fn a_reopened_store_serves_what_it_had() -> crate::error::Result<()> {
        let dir = tempfile::tempdir().map_err(|e| crate::error::Error::io("tempdir", e))?;
        let path = dir.path().join("meta-w0");
        let open = || MetaStore::open(&path, false, (0, 1), 4, 1 << 20, 77);
        let (file, kept, gone) = {
            let mut m = open()?;
            m.mkdir("/d", 0o750).expect("mkdir");
            m.dir_add("/", "d", Kind::Dir, false).expect("entry d");
            let start = m.dir_add("/d", "f", Kind::File, false).expect("entry f");
            let (file, _) = m.create("/d/f", CREATE, 0o640, start).expect("create");
            m.set_size("/d/f", 12345, SizeUpdate::AtLeast).expect("size");
            m.set_attr("/d/f", Some(0o600), Some(42), None, false)
                .expect("attr");
            m.create("/d/g", CREATE, 0o644, None).expect("create g");
            m.dir_add("/d", "g", Kind::File, false).expect("entry g");
            m.unlink("/d/g", None).expect("unlink");
            m.dir_remove("/d", "g", None).expect("entry removed");
            m.commit().expect("commit");
            (file, m.stat("/d/f").expect("stat"), m.next_id)
        };
        let mut m = open()?;
        assert_eq!(m.stat("/d/f"), Ok(kept));
        assert_eq!(
            (kept.size, kept.mode, kept.mtime_ns, kept.id),
            (12345, 0o600, 42, file.id)
        );
        assert_eq!(m.stat("/d/g"), Err(libc::ENOENT));
        let (names, _) = m.readdir("/d", "", 10).expect("readdir");
        assert_eq!(names.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["f"]);
        assert_eq!(m.readdir("/", "", 10).expect("root").0.len(), 1);
        let (next, _) = m.create("/d/h", CREATE, 0o644, None).expect("create h");
        assert_eq!(
            next.id.0 & u64::MAX as u128,
            gone as u128,
            "the id sequence continues"
        );
        drop(m);
        // Another cluster shape: its paths belong to other owners now.
        let other = MetaStore::open(&path, false, (0, 2), 4, 1 << 20, 77);
        assert!(matches!(other, Err(crate::error::Error::Config(ref m)) if m.contains("owner 0 of 2")));
        Ok(())
    }

    /// Group commit: changes are staged until `commit`, which writes those of several
    /// operations at once; a store reopened without it (a server killed mid-group) has none of
    /// the staged changes and every committed one.
    #[test]
    fn staged_changes_reach_the_store_only_with_their_commit() -> crate::error::Result<()> {
        let dir = tempfile::tempdir().map_err(|e| crate::error::Error::io("tempdir", e))?;
        let path = dir.path().join("meta-w0");
        let open = || MetaStore::open(&path, false, (0, 1), 4, 1 << 20, 77);
        {
            let mut m = open()?;
            assert!(!m.has_staged());
            for name in ["a", "b", "c"] {
                m.create(&format!("/{name}"), CREATE, 0o644, None)
                    .expect("create");
                m.dir_add("/", name, Kind::File, false).expect("entry");
            }
            assert!(m.has_staged());
            m.commit().expect("commit");
            assert!(!m.has_staged());
            m.create("/lost", CREATE, 0o644, None).expect("create");
            m.dir_add("/", "lost", Kind::File, false).expect("entry");
            m.unlink("/a", None).expect("unlink");
            assert!(m.has_staged());
            // Dropped without a commit: as a server killed before answering these.
        }
        let mut m = open()?;
        for name in ["/a", "/b", "/c"] {
            assert!(m.stat(name).is_ok(), "{name} was committed");
        }
        assert_eq!(m.stat("/lost"), Err(libc::ENOENT));
        let (names, _) = m.readdir("/", "", 10).expect("readdir");
        assert_eq!(
            names.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
            ["a", "b", "c"]
        );
        Ok(())
    }
}
