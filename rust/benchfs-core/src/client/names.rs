//! The namespace operations: open, stat, mkdir, readdir, rename, unlink, truncate and close,
//! each a few requests to the owners of the paths involved (docs/namespace.md).

use std::cell::Cell;
use std::sync::Arc;
use std::time::Instant;

use futures::stream::{self, StreamExt};

use crate::config::Durability;
use crate::error::{Error, Result};
use crate::namespace::{self, Attr, Kind};
use crate::posix::NAMESPACE_ERRNOS;
use crate::protocol::meta::{self, DirEntry, MetaRequest};
use crate::protocol::{Header, Op, ReplyValue};
use crate::telemetry::OpKind;

use super::{Client, FileHandle};

impl Client {
    /// One metadata request to `path`'s owner; returns the reply header and payload. A POSIX
    /// error from the owner becomes [`Error::Path`] naming `what` and the path.
    pub(super) async fn meta(
        &self,
        op: Op,
        what: &'static str,
        req: &MetaRequest,
    ) -> Result<(Header, Vec<u8>)> {
        let payload = req.encode();
        let answer = if self.metadata_copies > 1 {
            self.meta_with_copies(self.owner_of(&req.path), op, &payload)
                .await
        } else {
            let header = Header::request(op, 0, 0, 0, 0, payload.len() as u64);
            let mut room = self.reply_buf();
            self.call(
                self.owner(&req.path),
                header,
                &payload,
                Some(&mut room[..meta::REPLY_MAX]),
                Instant::now(),
            )
            .await
            .map(|h| (h, room.body((h.length as usize).min(meta::REPLY_MAX))))
        };
        match answer {
            Ok(reply) => Ok(reply),
            // Namespace errors are about the path; others (a refused token, a draining or busy
            // server) keep naming the server.
            Err(Error::Remote { errno, .. }) if NAMESPACE_ERRNOS.contains(&errno) => Err(Error::Path {
                op: what,
                path: req.path.clone(),
                errno,
            }),
            Err(e) => Err(e),
        }
    }

    pub(super) async fn meta_attr(
        &self,
        op: Op,
        what: &'static str,
        req: &MetaRequest,
    ) -> Result<(Attr, u64)> {
        let (h, body) = self.meta(op, what, req).await?;
        let attr = Attr::decode(&body)
            .ok_or_else(|| Error::Protocol(format!("malformed attribute in {what} reply")))?;
        Ok((attr, h.value().old_size()))
    }

    /// Adds `name` to its parent directory's entries; Ok(true) if new. An entry of the other
    /// kind is the path's own conflict, reported as `conflict` (EISDIR for open, EEXIST for
    /// mkdir, EISDIR or ENOTDIR for rename, as POSIX has them).
    /// Returns None if the entry existed, else the stripe start for a new file. `flags`:
    /// [`meta::RETYPE`] (rename), or 0.
    pub(super) async fn dir_add(
        &self,
        what: &'static str,
        path: &str,
        kind: Kind,
        conflict: i32,
        flags: u32,
    ) -> Result<Option<u32>> {
        let (parent, name) = namespace::split_parent(path).ok_or_else(|| Error::Path {
            op: what,
            path: path.into(),
            errno: libc::EEXIST,
        })?;
        let mut req = MetaRequest::new(parent);
        req.name = name.into();
        req.mode = kind as u32;
        req.flags = flags;
        let (h, _) = self.meta(Op::DirAdd, what, &req).await.map_err(|e| match e {
            // The parent's errors are about the parent; an entry of the other kind is the
            // path's own conflict.
            Error::Path { errno, .. } => Error::Path {
                op: what,
                path: path.into(),
                errno: if errno == libc::EEXIST { conflict } else { errno },
            },
            other => other,
        })?;
        match h.value() {
            ReplyValue::NewEntry(start) => Ok(start),
            other => Err(Error::Protocol(format!("dir_add answered with {other:?}"))),
        }
    }

    /// One request about `path`'s entry at its parent (`op`: DirRemove, DirMark, DirConfirm,
    /// with `arg`); whether the entry was there (and changed). The parent's errors name `path`.
    async fn entry_op(&self, op: Op, what: &'static str, path: &str, arg: u64) -> Result<bool> {
        let Some((parent, name)) = namespace::split_parent(path) else {
            return Ok(false);
        };
        let mut req = MetaRequest::new(parent);
        req.name = name.into();
        req.arg = arg;
        match self.meta(op, what, &req).await {
            Ok((h, _)) => Ok(h.value() == ReplyValue::Existed(true)),
            Err(Error::Path { errno, .. }) => Err(Error::Path {
                op: what,
                path: path.into(),
                errno,
            }),
            Err(e) => Err(e),
        }
    }

    /// Removes `path`'s entry from its parent; whether it was there.
    pub(super) async fn dir_remove(&self, what: &'static str, path: &str) -> Result<bool> {
        self.entry_op(Op::DirRemove, what, path, 0).await
    }

    /// Marks `path`'s entry before its inode goes, so that a listing checks the inode until
    /// the entry is removed (the operation may be cut between its steps: docs/namespace.md).
    /// Without its parent directory (or below a file) the name does not exist: ENOENT, as a
    /// lookup says (docs/namespace.md).
    async fn dir_mark(&self, what: &'static str, path: &str) -> Result<()> {
        match self.entry_op(Op::DirMark, what, path, 0).await {
            Err(Error::Path {
                errno: libc::ENOTDIR, ..
            }) => Err(Error::Path {
                op: what,
                path: path.into(),
                errno: libc::ENOENT,
            }),
            other => other.map(drop),
        }
    }

    /// Test hook for the steps of multi-owner operations: with `BENCHFS_CRASH_AT=op:step` in
    /// its environment, the client process is killed (SIGKILL) right after step `step` of
    /// `op`, as a crash there would leave it (tests/test_persistence.py).
    fn step_done(&self, op: &str, step: u32) {
        if self.crash_at.as_ref().is_some_and(|(o, s)| o == op && *s == step) {
            // SAFETY: kill(2) on this process; no memory is involved.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
    }

    /// Removing a name whose inode is gone: an operation interrupted between its steps left the
    /// entry (docs/namespace.md); removing the entry completes it. ENOENT if there was none.
    async fn remove_dangling(&self, what: &'static str, path: &str, missing: Error) -> Result<()> {
        match self.dir_remove(what, path).await {
            Ok(true) => Ok(()),
            // No such entry, or no such parent directory: the name does not exist.
            Ok(false) | Err(Error::Path { .. }) => Err(missing),
            Err(e) => Err(e),
        }
    }

    pub(super) fn checked(&self, what: &'static str, path: &str) -> Result<String> {
        namespace::normalize(path).map_err(|errno| Error::Path {
            op: what,
            path: path.into(),
            errno,
        })
    }

    pub(super) fn check_layout(&self, path: &str, attr: &Attr) -> Result<()> {
        if attr.kind == Kind::File && attr.layout.stripe_count as usize > self.server_count() {
            return Err(Error::Protocol(format!(
                "{path} stripes over {} servers but this client knows {}",
                attr.layout.stripe_count,
                self.server_count()
            )));
        }
        Ok(())
    }

    /// The servers decide a new file's chunk size: if it is not this client's
    /// `layout.chunk_size`, the user set it where it cannot apply. Said once per client.
    pub(super) fn tell_chunk_size(&self, servers: u64) {
        let mine = self.config.layout.chunk_size;
        if servers != mine && !self.told_chunk_size.replace(true) {
            crate::warn_line!(
                "benchfs: layout.chunk_size = {mine} in this client's configuration does not \
                 apply: the servers make files with {servers}-byte chunks (set it where the \
                 servers start)"
            );
        }
    }

    /// Opens the file at `path` (flags: `meta::CREATE`, `EXCLUSIVE`, `TRUNCATE`, `NO_FOLLOW`),
    /// links followed. Creating adds the name to its parent directory first, then makes the
    /// inode at its owner.
    pub fn open(&self, path: &str, flags: u32, mode: u32) -> Result<FileHandle> {
        let _call = self.telemetry_call(OpKind::Meta);
        let path = self.checked("open", path)?;
        let (path, attr, bytes) = self.run(self.open_at(&path, flags | meta::WITH_BYTES, mode))?;
        // Close-to-open: what was read ahead before this open may be stale.
        self.forget_read_ahead(attr.id.0);
        if attr.layout.replicas > 1 {
            // And so may be a server another client declared lost since (client/replicas.rs).
            self.refresh_declared();
        }
        Ok(FileHandle {
            path,
            attr,
            written_end: Cell::new(0),
            reported_end: Cell::new(0),
            known_size: Cell::new(attr.size),
            next_read: Cell::new(0),
            changes: Arc::default(),
            behind: Cell::new(false),
            placed: Cell::new(attr),
            at_open: std::cell::RefCell::new(attr.layout.inline.then_some((bytes, 0))),
        })
    }

    /// [`Client::open`]'s requests: the path opened (links followed) and its attribute.
    /// With `meta::WITH_BYTES`, an inline file's bytes come with it.
    pub(super) async fn open_at(&self, path: &str, flags: u32, mode: u32) -> Result<(String, Attr, Vec<u8>)> {
        let follow = flags & meta::NO_FOLLOW == 0;
        let flags = flags & !meta::NO_FOLLOW;
        self.through_links("open", path, follow, |path| async move {
            let start = if flags & meta::CREATE != 0 {
                let start = self.dir_add("open", &path, Kind::File, libc::EISDIR, 0).await?;
                self.step_done("create", 1);
                start
            } else {
                None
            };
            let added = start.is_some();
            let mut req = MetaRequest::new(&path);
            req.flags = flags;
            req.mode = mode;
            req.arg = start.map_or(0, |s| s as u64 + 1);
            let (attr, old, bytes) = match self.meta(Op::Create, "open", &req).await {
                Ok((h, mut body)) => {
                    let attr = body
                        .get(..meta::ATTR_LEN)
                        .and_then(Attr::decode)
                        .ok_or_else(|| Error::Protocol("malformed attribute in open reply".into()))?;
                    body.drain(..meta::ATTR_LEN);
                    (attr, h.value().old_size(), body)
                }
                Err(e) => {
                    if added {
                        // Undo our half of the create; the original error is what matters.
                        let _ = self.dir_remove("open", &path).await;
                    }
                    return Err(e);
                }
            };
            self.check_layout(&path, &attr)?;
            if added {
                self.tell_chunk_size(attr.layout.chunk_size);
            }
            // Only O_TRUNC makes the size smaller than it was.
            self.free_data(&attr, attr.size, old).await?;
            Ok((path, attr, bytes))
        })
        .await
    }

    /// Publishes what this handle wrote (its size) so that later opens see it; with
    /// `storage.durability = "close"` a handle that wrote makes its data durable first.
    pub fn close(&self, file: &FileHandle) -> Result<()> {
        self.forget_read_ahead(file.attr.id.0);
        // The file's first failed write, if any, is this close's error (nothing published).
        self.flush(file)?;
        if self.config.storage.durability == Durability::Close && file.written_end.get() > 0 {
            return self.fsync(file);
        }
        let _call = self.telemetry_call(OpKind::Meta);
        self.report_size(file)
    }

    /// Reports this handle's largest written end to the owner (the size is the largest end
    /// any writer reported).
    pub(super) fn report_size(&self, file: &FileHandle) -> Result<()> {
        let end = file.written_end.get();
        if end <= file.reported_end.get() {
            return Ok(());
        }
        let mut req = MetaRequest::new(&file.path);
        req.arg = end;
        let (attr, _) = self.run(self.meta_attr(Op::SetSize, "close", &req))?;
        file.reported_end.set(end);
        file.known_size.set(file.known_size.get().max(attr.size));
        Ok(())
    }

    /// The attribute of `path`, links followed (see [`Client::lstat`] for a link's own).
    pub fn stat(&self, path: &str) -> Result<Attr> {
        let _call = self.telemetry_call(OpKind::Meta);
        let path = self.checked("stat", path)?;
        self.run(self.stat_following(&path))
    }

    /// Removes a file: marks its entry, then removes its inode, its chunks on every server
    /// holding them, and its entry.
    pub fn unlink(&self, path: &str) -> Result<()> {
        let _call = self.telemetry_call(OpKind::Meta);
        let path = self.checked("unlink", path)?;
        self.run(async {
            // No write of this client may land after the chunks are freed.
            self.settle_all().await;
            self.through_links("unlink", &path, false, |path| async move {
                self.unlink_at(&path).await
            })
            .await
        })
    }

    /// The steps of an unlink of `path`: mark its entry, remove its inode, free its data
    /// (a link has none) and remove its entry.
    async fn unlink_at(&self, path: &str) -> Result<()> {
        self.dir_mark("unlink", path).await?;
        self.step_done("unlink", 1);
        let attr = match self
            .meta_attr(Op::Unlink, "unlink", &MetaRequest::new(path))
            .await
        {
            Ok((attr, _)) => attr,
            Err(
                e @ Error::Path {
                    errno: libc::ENOENT, ..
                },
            ) => {
                return self.remove_dangling("unlink", path, e).await;
            }
            Err(e) => return Err(e),
        };
        self.step_done("unlink", 2);
        if attr.kind == Kind::Symlink {
            // A link has no data.
            return self.dir_remove("unlink", path).await.map(drop);
        }
        self.check_layout(path, &attr)?;
        self.forget_read_ahead(attr.id.0);
        let (freed, removed) = futures::join!(
            self.free_data(&attr, 0, attr.size),
            self.dir_remove("unlink", path)
        );
        freed.and(removed).map(drop)
    }

    pub fn mkdir(&self, path: &str, mode: u32) -> Result<()> {
        let _call = self.telemetry_call(OpKind::Meta);
        let path = self.checked("mkdir", path)?;
        self.run(self.through_links("mkdir", &path, false, |path| async move {
            let added = self
                .dir_add("mkdir", &path, Kind::Dir, libc::EEXIST, 0)
                .await?
                .is_some();
            self.step_done("mkdir", 1);
            let mut req = MetaRequest::new(&path);
            req.mode = mode;
            match self.meta(Op::Mkdir, "mkdir", &req).await {
                Ok(_) => Ok(()),
                Err(e) => {
                    if added {
                        let _ = self.dir_remove("mkdir", &path).await;
                    }
                    Err(e)
                }
            }
        }))
    }

    pub fn rmdir(&self, path: &str) -> Result<()> {
        let _call = self.telemetry_call(OpKind::Meta);
        let path = self.checked("rmdir", path)?;
        self.run(self.through_links("rmdir", &path, false, |path| async move {
            self.dir_mark("rmdir", &path).await?;
            self.step_done("rmdir", 1);
            let req = MetaRequest::new(&path);
            let mut result = self.meta(Op::Rmdir, "rmdir", &req).await;
            if matches!(
                result,
                Err(Error::Path {
                    errno: libc::ENOTEMPTY,
                    ..
                })
            ) && self.clear_dangling(&path).await?
            {
                result = self.meta(Op::Rmdir, "rmdir", &req).await;
            }
            match result {
                Ok(_) => {
                    self.step_done("rmdir", 2);
                    self.dir_remove("rmdir", &path).await.map(drop)
                }
                Err(
                    e @ Error::Path {
                        errno: libc::ENOENT, ..
                    },
                ) => self.remove_dangling("rmdir", &path, e).await,
                Err(e) => Err(e),
            }
        }))
    }

    /// Every entry of a directory, in name order (one owner answers, a page at a time).
    pub fn readdir(&self, path: &str) -> Result<Vec<DirEntry>> {
        let _call = self.telemetry_call(OpKind::Meta);
        let path = self.checked("readdir", path)?;
        self.run(self.through_links("readdir", &path, true, |path| async move {
            Ok(self.listing(&path).await?.0)
        }))
    }

    /// A directory's entries: those that name something, and the dangling ones (marked, and
    /// their inode is gone). A marked entry is checked with its inode's owner (a stat; up to
    /// `client.max_inflight` at once) and confirmed at the directory's owner when found, so
    /// each is checked once; the kind listed is the inode's.
    async fn listing(&self, path: &str) -> Result<(Vec<DirEntry>, Vec<DirEntry>)> {
        let window = self.config.client.max_inflight as usize;
        let (mut named, mut dangling) = (Vec::new(), Vec::new());
        let mut after = String::new();
        loop {
            let mut req = MetaRequest::new(path);
            req.arg = meta::READDIR_PAGE as u64;
            req.name = after.clone();
            let (h, body) = self.meta(Op::Readdir, "readdir", &req).await?;
            let page = meta::decode_entries(&body)
                .ok_or_else(|| Error::Protocol("malformed readdir reply".into()))?;
            let done = h.value() != ReplyValue::MoreFollows(true) || page.is_empty();
            if let Some(last) = page.last() {
                after = last.name.clone();
            }
            let mut checked =
                stream::iter(page.into_iter().map(|entry| self.check_entry(path, entry))).buffered(window);
            while let Some(r) = checked.next().await {
                match r? {
                    (entry, true) => named.push(entry),
                    (entry, false) => dangling.push(entry),
                }
            }
            if done {
                return Ok((named, dangling));
            }
        }
    }

    /// Whether a listed entry of `dir` names something (see [`Self::listing`]).
    async fn check_entry(&self, dir: &str, mut entry: DirEntry) -> Result<(DirEntry, bool)> {
        if entry.mark == 0 {
            return Ok((entry, true));
        }
        let child = namespace::child_path(dir, &entry.name);
        match self
            .meta_attr(Op::Stat, "readdir", &MetaRequest::new(&child))
            .await
        {
            Ok((attr, _)) => {
                // Best effort: an entry left marked is only checked again by the next listing.
                let _ = self.entry_op(Op::DirConfirm, "readdir", &child, entry.mark).await;
                entry.kind = attr.kind;
                entry.mark = 0;
                Ok((entry, true))
            }
            Err(Error::Path {
                errno: libc::ENOENT, ..
            }) => Ok((entry, false)),
            Err(e) => Err(e),
        }
    }

    /// Removes the dangling entries of a directory that lists as empty (an rmdir found it not
    /// empty); whether there were any. Each goes only if it still carries the mark seen.
    async fn clear_dangling(&self, dir: &str) -> Result<bool> {
        let (named, dangling) = self.listing(dir).await?;
        if !named.is_empty() || dangling.is_empty() {
            return Ok(false);
        }
        for e in &dangling {
            let child = namespace::child_path(dir, &e.name);
            self.entry_op(Op::DirRemove, "rmdir", &child, e.mark).await?;
        }
        Ok(true)
    }

    /// Renames within the file system; data never moves (the file keeps its id and layout).
    /// A file replaces a file, a directory an empty directory. Non-empty directories are
    /// refused with EXDEV (their children's inodes are keyed by path), which `mv` handles.
    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.rename_with(from, to, 0)
    }

    /// [`Self::rename`] with `flags`: [`meta::NO_REPLACE`] fails with EEXIST if `to`
    /// exists, decided by `to`'s owner in the same step that installs it (atomic, like
    /// `renameat2(RENAME_NOREPLACE)`).
    pub fn rename_with(&self, from: &str, to: &str, flags: u32) -> Result<()> {
        let _call = self.telemetry_call(OpKind::Meta);
        let from = self.checked("rename", from)?;
        let to = self.checked("rename", to)?;
        let fail = |errno| Error::Path {
            op: "rename",
            path: from.clone(),
            errno,
        };
        if from == "/" || to == "/" {
            return Err(fail(libc::EBUSY));
        }
        if to.starts_with(&format!("{from}/")) {
            return Err(fail(libc::EINVAL));
        }
        self.run(async {
            self.settle_all().await;
            // Links among the directories: again on the path the failure names, resolved
            // (the source, then the destination: at most once each).
            let (mut from, mut to) = (from.clone(), to.clone());
            let mut tries = 0;
            loop {
                match self.rename_at(&from, &to, flags).await {
                    Err(
                        e @ Error::Path {
                            errno: libc::ENOENT | libc::ENOTDIR,
                            ..
                        },
                    ) if tries < 2 => {
                        tries += 1;
                        let Error::Path { path, .. } = &e else {
                            return Err(e);
                        };
                        let (old_from, old_to) = (from.clone(), to.clone());
                        if *path == from {
                            from = self.resolve("rename", &from, false).await?;
                        } else {
                            to = self.resolve("rename", &to, false).await?;
                        }
                        if from == old_from && to == old_to {
                            return Err(e);
                        }
                    }
                    r => return r,
                }
            }
        })
    }

    /// The steps of a rename of `from` to `to` (both resolved as far as the caller knows).
    async fn rename_at(&self, from: &str, to: &str, flags: u32) -> Result<()> {
        let fail = |errno| Error::Path {
            op: "rename",
            path: from.to_string(),
            errno,
        };
        let (mut attr, _) = self
            .meta_attr(Op::Stat, "rename", &MetaRequest::new(from))
            .await?;
        if from == to {
            return Ok(());
        }
        // An inline file's bytes move with its inode: read with it, in one request.
        let mut bytes = Vec::new();
        if attr.layout.inline {
            (attr, bytes) = self.inline_bytes("rename", from, attr.id.0).await?;
        }
        // A link moves with its target.
        let target = match attr.kind {
            Kind::Symlink => self.readlink_at(from).await?,
            _ => String::new(),
        };
        if attr.kind == Kind::Dir {
            let mut req = MetaRequest::new(from);
            req.arg = 1;
            let (_, body) = self.meta(Op::Readdir, "rename", &req).await?;
            if !body.is_empty() {
                return Err(fail(libc::EXDEV));
            }
        }
        let conflict = if attr.kind == Kind::Dir {
            libc::ENOTDIR
        } else {
            libc::EISDIR
        };
        // Two owners, no order needed between them: the new entry hides until installed,
        // the old one stays valid until its inode goes.
        let (added, marked) = futures::join!(
            self.dir_add("rename", to, attr.kind, conflict, meta::RETYPE),
            self.dir_mark("rename", from)
        );
        let added = added?.is_some();
        if let Err(e) = marked {
            if added {
                let _ = self.dir_remove("rename", to).await;
            }
            return Err(e);
        }
        self.step_done("rename", 1);
        self.step_done("rename", 2);
        let mut req = MetaRequest::new(to);
        req.attr = Some(attr);
        req.target = target;
        req.data = bytes;
        req.flags = flags & meta::NO_REPLACE;
        let replaced = match self.meta(Op::Install, "rename", &req).await {
            Ok((_, replaced)) => replaced,
            Err(e) => {
                // An entry this rename added names nothing if the install never happened;
                // a path error means an object is at `to` (created meanwhile): its entry.
                if added && !matches!(e, Error::Path { .. }) {
                    let _ = self.dir_remove("rename", to).await;
                }
                return Err(e);
            }
        };
        self.step_done("rename", 3);
        let mut old = MetaRequest::new(from);
        if attr.kind == Kind::Dir {
            self.meta(Op::Rmdir, "rename", &old).await?;
        } else {
            // An inline file goes only as its bytes were read: written since, the bytes are
            // installed again as they are now (over the install above, the same file).
            for tries in 0.. {
                if attr.layout.inline {
                    old.flags = meta::UNCHANGED;
                    old.id = attr.id.0;
                    old.arg = attr.ctime_ns;
                }
                match self.meta(Op::Unlink, "rename", &old).await {
                    Err(Error::Path {
                        errno: libc::ESTALE, ..
                    }) if tries < 64 => {
                        (attr, req.data) = self.inline_bytes("rename", from, attr.id.0).await?;
                        req.attr = Some(attr);
                        req.flags = 0;
                        self.meta(Op::Install, "rename", &req).await?;
                    }
                    r => {
                        r?;
                        break;
                    }
                }
            }
        }
        self.step_done("rename", 4);
        self.dir_remove("rename", from).await?;
        if let Some(gone) = Attr::decode(&replaced) {
            if gone.kind == Kind::File && gone.id != attr.id {
                self.free_data(&gone, 0, gone.size).await?;
            }
        }
        Ok(())
    }

    /// Sets a file's size; shrinking frees the chunks beyond it on their servers.
    pub fn truncate(&self, path: &str, size: u64) -> Result<()> {
        let _call = self.telemetry_call(OpKind::Meta);
        let path = self.checked("truncate", path)?;
        self.run(async {
            self.settle_all().await;
            self.through_links("truncate", &path, true, |path| async move {
                let mut req = MetaRequest::new(&path);
                req.arg = size;
                req.flags = 1;
                let (attr, old) = match self.meta_attr(Op::SetSize, "truncate", &req).await {
                    // An inline file truncated past the limit: its bytes move into chunks first.
                    Err(Error::Path {
                        errno: libc::EFBIG, ..
                    }) => {
                        let attr = self.lookup(&path).await?;
                        self.promote("truncate", &path, attr.id.0).await?;
                        self.meta_attr(Op::SetSize, "truncate", &req).await?
                    }
                    r => r?,
                };
                self.check_layout(&path, &attr)?;
                self.forget_read_ahead(attr.id.0);
                self.free_data(&attr, size, old).await
            })
            .await
        })
    }

    /// Sets the permission bits (chmod) and/or the modification time in nanoseconds since the
    /// Unix epoch (utimens) of a file or directory.
    pub fn set_attr(&self, path: &str, mode: Option<u32>, mtime_ns: Option<u64>) -> Result<Attr> {
        let _call = self.telemetry_call(OpKind::Meta);
        let path = self.checked("setattr", path)?;
        self.run(self.through_links("setattr", &path, true, |path| async move {
            let mut req = MetaRequest::new(&path);
            if let Some(mode) = mode {
                req.flags |= meta::SET_MODE;
                req.mode = mode & 0o7777;
            }
            if let Some(t) = mtime_ns {
                req.flags |= meta::SET_MTIME;
                req.arg = t;
            }
            Ok(self.meta_attr(Op::SetAttr, "setattr", &req).await?.0)
        }))
    }

    /// Truncates an open file (`ftruncate`): sets the size at the owner and makes the handle
    /// agree, forgetting its own writes beyond the new size (a later close must not regrow it).
    /// The handle's writes are published first, so the owner frees every chunk they made.
    pub fn ftruncate(&self, file: &FileHandle, size: u64) -> Result<()> {
        self.report_size(file)?;
        self.truncate(&file.path, size)?;
        file.written_end.set(file.written_end.get().min(size));
        file.reported_end.set(file.reported_end.get().min(size));
        file.known_size.set(size);
        file.changed();
        Ok(())
    }
}
