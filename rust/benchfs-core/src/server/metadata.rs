//! Metadata requests: the ops on the names of the metadata owners this worker serves, and, with
//! copies of the metadata (`layout.replicas` > 1), the copies of other owners' names it keeps:
//! the mirrors that keep them current and the snapshot pages that catch a copy up. Also the
//! making of a worker's metadata stores.

use crate::config::Durability;
use crate::error::Result;
use crate::metadata_copies::CopyKeeper;
use crate::namespace::{self, Kind, MetaStore, SizeUpdate};
use crate::protocol::meta::{self, MetaRequest};
use crate::protocol::mirror;
use crate::protocol::{Header, Op, ReplyValue};

use super::{metadata_copies, ServerOptions, ServerState};

impl ServerState {
    /// Serves a metadata op: (status, reply value, reply payload, and with copies of the
    /// metadata the sequence number and length of the changes the payload ends with).
    pub(super) fn serve_meta(
        &self,
        h: &Header,
        bytes: &[u8],
    ) -> (i32, ReplyValue, Vec<u8>, Option<(u64, u64)>) {
        let refused = |errno: i32| (-errno, ReplyValue::Nothing, Vec::new(), None);
        let Some(copies) = &self.copies else {
            let (status, value, body) = self.meta_op(&mut self.meta.borrow_mut(), h.op, bytes);
            return (status, value, body, None);
        };
        let workers = self.owners_per_server();
        let own = self.own_owner();
        // `chunk`: 1 + the owner the request is for (0: this worker's own).
        let owner = match h.chunk.checked_sub(1).map(u32::try_from) {
            None => own,
            Some(Ok(o)) if o % workers == self.worker_index as u32 && o / workers < self.servers() => o,
            Some(_) => return refused(libc::EINVAL),
        };
        if h.op == Op::Mirror {
            return match self.apply_mirror(copies, owner, bytes) {
                Ok(()) => (0, ReplyValue::Nothing, Vec::new(), Some((0, 0))),
                Err(errno) => refused(errno),
            };
        }
        let checked = copies.check_serving(owner);
        self.wipe_own(copies.take_wipe_own());
        if let Err(errno) = checked {
            return refused(errno);
        }
        if h.op == Op::Snapshot {
            let after = String::from_utf8_lossy(bytes);
            let page = |m: &mut MetaStore| {
                let (records, last, more) = m.snapshot_page(&after, mirror::SNAPSHOT_PAGE);
                let body = mirror::encode_snapshot(&last, &records);
                Ok((0, ReplyValue::MoreFollows(more), body, Some((0, 0))))
            };
            let served = if owner == own {
                page(&mut self.meta.borrow_mut())
            } else {
                copies.with_store(owner, page)
            };
            return served.unwrap_or_else(refused);
        }
        let serve = |meta: &mut MetaStore| {
            let (status, value, mut body) = self.meta_op(meta, h.op, bytes);
            let (seq, changes) = meta.take_changes().unwrap_or_default();
            body.extend_from_slice(&changes);
            Ok((status, value, body, Some((seq, changes.len() as u64))))
        };
        let served = if owner == own {
            serve(&mut self.meta.borrow_mut())
        } else {
            copies.with_store(owner, serve)
        };
        served.unwrap_or_else(refused)
    }

    /// Applies a mirror (the changes the server serving `owner` made) to this worker's copy.
    fn apply_mirror(&self, copies: &CopyKeeper, owner: u32, bytes: &[u8]) -> std::result::Result<(), i32> {
        let Some((mirror, records)) = mirror::Mirror::decode(bytes) else {
            self.metrics.count_malformed();
            return Err(libc::EINVAL);
        };
        if mirror.shard != owner {
            return Err(libc::EINVAL);
        }
        let checked = copies.check_mirror(owner, mirror.producer);
        self.wipe_own(copies.take_wipe_own());
        checked?;
        if owner == self.own_owner() {
            self.meta.borrow_mut().apply_mirror(&records)
        } else {
            copies.with_store(owner, |m| m.apply_mirror(&records))
        }
    }

    /// The metadata owner this worker is.
    fn own_owner(&self) -> u32 {
        self.server_id * self.owners_per_server() + self.worker_index as u32
    }

    /// Empties this worker's own metadata when `wipe` (it is being caught up).
    fn wipe_own(&self, wipe: bool) {
        if wipe {
            self.meta.borrow_mut().wipe();
        }
    }

    fn owners_per_server(&self) -> u32 {
        self.config_workers
    }

    fn servers(&self) -> u32 {
        self.config_servers
    }

    /// Serves a metadata op from `meta`: (status, reply value, reply payload). A malformed
    /// payload is EINVAL and changes nothing.
    fn meta_op(&self, meta: &mut MetaStore, op: Op, bytes: &[u8]) -> (i32, ReplyValue, Vec<u8>) {
        use ReplyValue::{MoreFollows, NewEntry, Nothing, OldSize};
        if op == Op::Find {
            let page = meta::FindRequest::decode(bytes)
                .map_err(|_| libc::EINVAL)
                .and_then(|req| meta.find(&req, meta::REPLY_MAX / 2));
            return match page {
                Ok(p) => (
                    0,
                    MoreFollows(p.more),
                    meta::encode_found(p.examined, p.matched, &p.found),
                ),
                Err(errno) => {
                    if errno == libc::EINVAL {
                        self.metrics.count_malformed();
                    }
                    (-errno, Nothing, Vec::new())
                }
            };
        }
        let r = match MetaRequest::decode(bytes) {
            Ok(r) => r,
            Err(_) => {
                self.metrics.count_malformed();
                return (-libc::EINVAL, Nothing, Vec::new());
            }
        };
        let attr = |a: namespace::Attr| {
            let mut out = Vec::with_capacity(meta::ATTR_LEN);
            a.encode(&mut out);
            out
        };
        let kind = |mode: u32| {
            u8::try_from(mode)
                .ok()
                .and_then(Kind::from_u8)
                .unwrap_or(Kind::File)
        };
        let result: std::result::Result<(ReplyValue, Vec<u8>), i32> = match op {
            Op::Create => {
                // arg: 1 + the stripe start the parent's owner chose, or 0 for none.
                let start = r.arg.checked_sub(1).map(|s| u32::try_from(s).unwrap_or(u32::MAX));
                meta.create(&r.path, r.flags, r.mode, start).map(|(a, old)| {
                    let mut body = attr(a);
                    if r.flags & meta::WITH_BYTES != 0 && a.layout.inline && a.size > 0 {
                        if let Ok((_, bytes)) = meta.inline_read(&r.path, a.id.0, 0, a.size) {
                            body.extend_from_slice(bytes);
                        }
                    }
                    (OldSize(old), body)
                })
            }
            Op::Stat => meta.stat(&r.path).map(|a| (Nothing, attr(a))),
            Op::Unlink => {
                let unchanged = (r.flags & meta::UNCHANGED != 0).then_some((r.id, r.arg));
                meta.unlink(&r.path, unchanged).map(|a| (Nothing, attr(a)))
            }
            Op::Mkdir => meta.mkdir(&r.path, r.mode).map(|a| (Nothing, attr(a))),
            Op::Rmdir => meta.rmdir(&r.path).map(|()| (Nothing, Vec::new())),
            Op::DirAdd if r.name.is_empty() => Err(libc::EINVAL),
            Op::DirAdd => meta
                .dir_add(&r.path, &r.name, kind(r.mode), r.flags & meta::RETYPE != 0)
                .map(|start| (NewEntry(start), Vec::new())),
            Op::DirRemove | Op::DirMark | Op::DirConfirm if r.name.is_empty() => Err(libc::EINVAL),
            Op::DirRemove => meta
                .dir_remove(&r.path, &r.name, (r.arg != 0).then_some(r.arg))
                .map(|existed| (ReplyValue::Existed(existed), Vec::new())),
            Op::DirMark => meta
                .dir_mark(&r.path, &r.name)
                .map(|existed| (ReplyValue::Existed(existed), Vec::new())),
            Op::DirConfirm => meta
                .dir_confirm(&r.path, &r.name, r.arg)
                .map(|existed| (ReplyValue::Existed(existed), Vec::new())),
            Op::Readdir => {
                let max = (r.arg as usize).clamp(1, meta::READDIR_PAGE);
                meta.readdir(&r.path, &r.name, max)
                    .map(|(page, more)| (MoreFollows(more), meta::encode_entries(&page)))
            }
            Op::Install => match r.attr {
                Some(a) => meta
                    .install(
                        &r.path,
                        a,
                        r.flags,
                        (!r.target.is_empty()).then_some(r.target.as_str()),
                        &r.data,
                    )
                    .map(|old| (Nothing, old.map(attr).unwrap_or_default())),
                None => Err(libc::EINVAL),
            },
            Op::Symlink => meta.symlink(&r.path, &r.target).map(|a| (Nothing, attr(a))),
            Op::Readlink => meta.readlink(&r.path).map(|t| (Nothing, t.as_bytes().to_vec())),
            Op::SetAttr => {
                let mode = (r.flags & meta::SET_MODE != 0).then_some(r.mode);
                let mtime = (r.flags & meta::SET_MTIME != 0).then_some(r.arg);
                let size = (r.flags & meta::SET_SIZE != 0).then_some(r.size);
                meta.set_attr(&r.path, mode, mtime, size, r.flags & meta::SET_LINK != 0)
                    .map(|a| (Nothing, attr(a)))
            }
            Op::SetSize => {
                let how = if r.flags == 1 {
                    SizeUpdate::Exact
                } else {
                    SizeUpdate::AtLeast
                };
                meta.set_size(&r.path, r.arg, how)
                    .map(|(a, old)| (OldSize(old), attr(a)))
            }
            Op::InlineRead => meta.inline_read(&r.path, r.id, r.arg, r.size).map(|(a, bytes)| {
                let mut body = attr(a);
                body.extend_from_slice(bytes);
                (Nothing, body)
            }),
            Op::InlineWrite => meta
                .inline_write(&r.path, r.id, r.arg, &r.data)
                .map(|(a, written)| (ReplyValue::Existed(written), attr(a))),
            Op::Promote if r.flags & meta::PROMOTE_END != 0 => {
                let hash = <[u8; 16]>::try_from(r.data.as_slice()).map(u128::from_le_bytes);
                match (u16::try_from(r.arg), hash) {
                    (Ok(generation), Ok(hash)) => meta
                        .promote_end(&r.path, r.id, generation, hash)
                        .map(|a| (ReplyValue::Generation(0), attr(a))),
                    _ => Err(libc::EINVAL),
                }
            }
            Op::Promote => meta.promote_begin(&r.path, r.id).map(|(a, bytes, generation)| {
                let mut body = attr(a);
                body.extend_from_slice(&bytes);
                (ReplyValue::Generation(generation), body)
            }),
            Op::PutInline => {
                let start = r.arg.checked_sub(1).map(|s| u32::try_from(s).unwrap_or(u32::MAX));
                meta.put_inline(&r.path, (r.flags, r.mode, start), r.size, &r.data)
                    .map(|(a, old, hash)| {
                        let mut body = attr(a);
                        if let Some(h) = hash {
                            body.extend_from_slice(&h.to_le_bytes());
                        }
                        (OldSize(old), body)
                    })
            }
            _ => Err(libc::EINVAL),
        };
        match result {
            Ok((value, body)) => {
                self.note_name(op, &r, &body);
                (0, value, body)
            }
            Err(errno) => (-errno, Nothing, Vec::new()),
        }
    }

    /// With the trace on, notes the path of the file a create, stat, install or small put
    /// answered for (`telemetry::names`): what joins an application's records, by path, with
    /// the trace's, by file id.
    fn note_name(&self, op: Op, r: &MetaRequest, body: &[u8]) {
        let Some(names) = &self.names else {
            return;
        };
        let attr = match op {
            Op::Create | Op::Stat | Op::PutInline => {
                body.get(..meta::ATTR_LEN).and_then(namespace::Attr::decode)
            }
            Op::Install => r.attr,
            _ => None,
        };
        if let Some(a) = attr.filter(|a| a.kind == Kind::File) {
            if !names.note(crate::telemetry::unix_time_ns(), a.id.0, &r.path) {
                self.metrics.count_trace_dropped();
            }
        }
    }
}

/// With copies of the metadata, what worker `index` keeps of other owners' and decides about
/// serving its own.
pub(super) fn copy_keeper(opts: &ServerOptions, index: u32) -> Option<CopyKeeper> {
    let copies = metadata_copies(&opts.config);
    if copies <= 1 {
        return None;
    }
    let config = &opts.config;
    let for_copies = opts.clone();
    let make = move |owner: u32| {
        owner_store(&for_copies, owner, &format!("meta-w{index}-of{owner}")).map(MetaStore::with_copies)
    };
    Some(CopyKeeper::new(
        copies,
        (config.cluster.expected_servers, config.server.workers),
        opts.id,
        opts.registry_dir.clone(),
        Box::new(make),
    ))
}

/// Worker `index`'s metadata: kept in its store under the data directory, unless
/// `storage.durability` is `memory`.
pub(super) fn meta_store(opts: &ServerOptions, index: u32) -> Result<MetaStore> {
    let owner = opts.id * opts.config.server.workers + index;
    let store = owner_store(opts, owner, &format!("meta-w{index}"))?;
    Ok(if metadata_copies(&opts.config) > 1 {
        store.with_copies()
    } else {
        store
    })
}

/// The store of metadata owner `owner`, in directory `dir` of the data directory unless
/// `storage.durability` is `memory`.
fn owner_store(opts: &ServerOptions, owner: u32, dir: &str) -> Result<MetaStore> {
    let config = &opts.config;
    let owners = config.cluster.expected_servers * config.server.workers;
    let (stripe, chunk) = (config.cluster.expected_servers, config.layout.chunk_size);
    let durable = match config.storage.durability {
        Durability::Memory => Ok(MetaStore::new(owner, owners, stripe, chunk, id_nonce())),
        Durability::None => Err(false),
        Durability::Fsync | Durability::Close => Err(true),
    };
    let store = match durable {
        Ok(store) => store,
        Err(durable) => {
            let dir = opts.data_dir.join(dir);
            MetaStore::open(&dir, durable, (owner, owners), stripe, chunk, id_nonce())?
        }
    };
    Ok(store
        .with_replicas(config.layout.replicas)
        .with_inline(config.layout.inline_max))
}

/// Distinguishes file ids made by a restarted server from those of its previous life.
pub(super) fn id_nonce() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mixed =
        xxhash_rust::xxh3::xxh3_64(&[t.to_le_bytes(), (std::process::id() as u64).to_le_bytes()].concat());
    mixed as u32
}
