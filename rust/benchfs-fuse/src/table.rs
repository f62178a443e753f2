//! The inode table: BenchFS keys its namespace by path, the kernel by inode number. Each path
//! the kernel has looked up gets a number that is never reused (so the generation is always
//! 0); the kernel's lookup count keeps it alive until `forget`, open files keep it alive until
//! their last release. Renames move numbers to their new paths.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};

use benchfs_core::client::FileHandle;
use benchfs_core::namespace::{Attr, Kind};

/// The root directory's inode number (FUSE's `FUSE_ROOT_ID`).
pub const ROOT: u64 = 1;

/// Names that open-but-unlinked files are moved to until their last release.
pub const SILLY_PREFIX: &str = ".benchfs-unlinked-";

#[derive(Debug)]
pub struct Inode {
    /// Where the object is now (for a silly-renamed file: its hidden name).
    pub path: String,
    pub kind: Kind,
    /// The file id the path had when this number was given (a different id at the same
    /// path is a different object and gets a new number).
    pub id: u128,
    /// The kernel's references (lookups minus forgets).
    pub lookups: u64,
    /// Open file handles of this mount (open/create minus release).
    pub opens: u64,
    /// The largest end written through this mount that the servers may not know yet: the
    /// size the kernel is told, and every read through any handle, is never smaller (or the
    /// kernel would take a short read for the end of the file and cache zeros).
    pub local_end: u64,
    /// The size in the last attributes the kernel got for this file; an open that finds
    /// another size at the owner invalidates the kernel's copy (close-to-open).
    pub told_size: u64,
    /// Held shared by each read and write of this mount on the file, exclusively by a
    /// truncate: a truncate then falls between I/Os, never inside one.
    pub io: Arc<RwLock<()>>,
    /// Bumped by truncate: core handles taken before it carry written ends that must not be
    /// published any more, so they are dropped instead of returned to the pool.
    pub epoch: u64,
    /// Idle core handles of this file (one per concurrent request at most).
    pub pool: Vec<FileHandle>,
    /// Changes to the file's bytes through this mount, shared by every core handle of it:
    /// a worker's client does not use what it read ahead from before another's write.
    pub changes: Arc<AtomicU64>,
    /// Unlinked while open: `path` is the hidden name, removed at the last release.
    pub unlinked: bool,
    /// Gone from the namespace (removed, or replaced by a rename): no path any more.
    pub detached: bool,
}

impl Inode {
    fn new(path: &str, kind: Kind, id: u128) -> Inode {
        Inode {
            path: path.to_string(),
            kind,
            id,
            lookups: 0,
            opens: 0,
            local_end: 0,
            told_size: 0,
            io: Arc::default(),
            epoch: 0,
            pool: Vec::new(),
            changes: Arc::default(),
            unlinked: false,
            detached: false,
        }
    }
}

#[derive(Debug)]
pub struct Table {
    inodes: HashMap<u64, Inode>,
    by_path: HashMap<String, u64>,
    next: u64,
}

impl Default for Table {
    fn default() -> Self {
        Table::new()
    }
}

impl Table {
    pub fn new() -> Table {
        let mut root = Inode::new("/", Kind::Dir, 0);
        root.lookups = 1; // never forgotten
        Table {
            inodes: HashMap::from([(ROOT, root)]),
            by_path: HashMap::from([("/".to_string(), ROOT)]),
            next: ROOT + 1,
        }
    }

    pub fn get(&self, ino: u64) -> Option<&Inode> {
        self.inodes.get(&ino)
    }

    pub fn get_mut(&mut self, ino: u64) -> Option<&mut Inode> {
        self.inodes.get_mut(&ino)
    }

    /// The current path of a live inode (None: unknown number or detached).
    pub fn path(&self, ino: u64) -> Option<String> {
        self.inodes
            .get(&ino)
            .filter(|i| !i.detached)
            .map(|i| i.path.clone())
    }

    /// The number of the object at `path`, if the kernel knows it.
    pub fn ino_of(&self, path: &str) -> Option<u64> {
        self.by_path.get(path).copied()
    }

    /// Records a lookup of `path` (whose attributes are `attr`) and returns its number.
    pub fn remember(&mut self, path: &str, attr: &Attr) -> u64 {
        if let Some(&ino) = self.by_path.get(path) {
            if let Some(inode) = self.inodes.get_mut(&ino) {
                if ino == ROOT || (inode.id == attr.id.0 && inode.kind == attr.kind) {
                    inode.lookups += 1;
                    return ino;
                }
            }
            // Another object now lives at this path (replaced behind our back).
            self.detach(path);
        }
        let ino = self.next;
        self.next += 1;
        let mut inode = Inode::new(path, attr.kind, attr.id.0);
        inode.lookups = 1;
        self.inodes.insert(ino, inode);
        self.by_path.insert(path.to_string(), ino);
        ino
    }

    /// The kernel dropped `n` references.
    pub fn forget(&mut self, ino: u64, n: u64) {
        if let Some(inode) = self.inodes.get_mut(&ino) {
            inode.lookups = inode.lookups.saturating_sub(n);
        }
        self.maybe_drop(ino);
    }

    /// Forgets the number once neither the kernel nor an open file refers to it.
    pub fn maybe_drop(&mut self, ino: u64) {
        let unused = self
            .inodes
            .get(&ino)
            .is_some_and(|i| ino != ROOT && i.lookups == 0 && i.opens == 0);
        if unused {
            if let Some(inode) = self.inodes.remove(&ino) {
                if self.by_path.get(&inode.path) == Some(&ino) {
                    self.by_path.remove(&inode.path);
                }
            }
        }
    }

    /// The object at `path` left the namespace.
    pub fn detach(&mut self, path: &str) {
        if let Some(ino) = self.by_path.remove(path) {
            if let Some(inode) = self.inodes.get_mut(&ino) {
                inode.detached = true;
            }
            self.maybe_drop(ino);
        }
    }

    /// `from` was renamed to `to`: whatever was at `to` is gone; the object (and, for a
    /// directory, every known path below it) moves.
    pub fn rename(&mut self, from: &str, to: &str) {
        if from == to {
            return;
        }
        self.detach(to);
        let below = format!("{from}/");
        let moved: Vec<(String, u64)> = self
            .by_path
            .iter()
            .filter(|(p, _)| p.as_str() == from || p.starts_with(&below))
            .map(|(p, &i)| (p.clone(), i))
            .collect();
        for (old, ino) in moved {
            self.by_path.remove(&old);
            let new = format!("{to}{}", &old[from.len()..]);
            if let Some(inode) = self.inodes.get_mut(&ino) {
                inode.path = new.clone();
            }
            self.by_path.insert(new, ino);
        }
    }

    /// Silly-renamed files still waiting for their last release (removed at shutdown).
    pub fn unlinked_paths(&self) -> Vec<String> {
        self.inodes
            .values()
            .filter(|i| i.unlinked && !i.detached)
            .map(|i| i.path.clone())
            .collect()
    }
}

/// `parent/name` for a parent path from the table (the core checks the name's rules).
pub fn join(parent: &str, name: &str) -> String {
    if parent == "/" {
        format!("/{name}")
    } else {
        format!("{parent}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use benchfs_core::chunking::FileId;
    use benchfs_core::placement::Layout;

    fn attr(kind: Kind, id: u128) -> Attr {
        Attr {
            kind,
            mode: 0o644,
            id: FileId(id),
            size: 0,
            mtime_ns: 0,
            ctime_ns: 0,
            layout: Layout {
                chunk_size: 1 << 20,
                stripe_count: 1,
                start: 0,
                replicas: 1,
                ..Layout::NONE
            },
        }
    }

    #[test]
    fn lookups_keep_numbers_until_forgotten() {
        let mut t = Table::new();
        let a = t.remember("/a", &attr(Kind::File, 7));
        assert_eq!(t.remember("/a", &attr(Kind::File, 7)), a);
        assert_eq!(t.get(a).map(|i| i.lookups), Some(2));
        t.forget(a, 1);
        assert_eq!(t.path(a).as_deref(), Some("/a"));
        t.forget(a, 1);
        assert!(t.get(a).is_none());
        assert!(t.ino_of("/a").is_none());
        // Numbers are never reused.
        assert!(t.remember("/a", &attr(Kind::File, 7)) > a);
    }

    #[test]
    fn a_new_object_at_a_path_gets_a_new_number() {
        let mut t = Table::new();
        let a = t.remember("/a", &attr(Kind::File, 7));
        let b = t.remember("/a", &attr(Kind::File, 8));
        assert_ne!(a, b);
        assert!(t.path(a).is_none(), "the old number is detached");
        assert_eq!(t.path(b).as_deref(), Some("/a"));
    }

    #[test]
    fn open_files_outlive_forget() {
        let mut t = Table::new();
        let a = t.remember("/a", &attr(Kind::File, 7));
        if let Some(i) = t.get_mut(a) {
            i.opens = 1;
        }
        t.forget(a, 1);
        assert!(t.get(a).is_some());
        if let Some(i) = t.get_mut(a) {
            i.opens = 0;
        }
        t.maybe_drop(a);
        assert!(t.get(a).is_none());
    }

    #[test]
    fn rename_moves_descendants_and_detaches_the_target() {
        let mut t = Table::new();
        let d = t.remember("/d", &attr(Kind::Dir, 1));
        let f = t.remember("/d/f", &attr(Kind::File, 2));
        let x = t.remember("/x", &attr(Kind::Dir, 3));
        let dd = t.remember("/dd", &attr(Kind::Dir, 4));
        t.rename("/d", "/x");
        assert_eq!(t.path(d).as_deref(), Some("/x"));
        assert_eq!(t.path(f).as_deref(), Some("/x/f"));
        assert!(t.path(x).is_none());
        // A sibling sharing the prefix is not below it.
        assert_eq!(t.path(dd).as_deref(), Some("/dd"));
        assert_eq!(t.ino_of("/x/f"), Some(f));
        assert!(t.ino_of("/d/f").is_none());
    }

    #[test]
    fn root_is_permanent() {
        let mut t = Table::new();
        t.forget(ROOT, 100);
        assert_eq!(t.path(ROOT).as_deref(), Some("/"));
        assert_eq!(join("/", "a"), "/a");
        assert_eq!(join("/a", "b"), "/a/b");
    }
}
