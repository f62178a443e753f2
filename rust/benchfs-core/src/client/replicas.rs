//! Copies of chunks (`layout.replicas`): where a chunk's copies are, writes answered when every
//! live copy has them, reads that fail over from one copy to the next, servers declared lost,
//! and the repair that re-creates the copies a lost server held (docs/lifecycle.md, "Copies").
//!
//! A server is *lost* to a client while it does not answer (a probe re-admits it). It is
//! *declared lost* once a change of a replicated file (a write, a truncate, a removal) went on
//! without it: its copies are stale from then on, so no client uses it until `repair` has
//! caught it up (`rejoined`). The declaration is a line in the registry directory's
//! [`LOST_FILE`], read by every client when it connects, whenever it loses a server and when
//! it opens a file of several copies. A chunk's copies are then the copies that are left and,
//! in the lost ones' places, the next servers on the ring of domains (`placement::Domains`);
//! reads go to the copies that are left first, as they hold every byte; `repair` copies each
//! chunk to the servers that took a lost one's place, and to a declared server that answers
//! again.

use std::time::Instant;

use futures::future::join_all;
use futures::stream::{self, StreamExt};

use crate::error::{Error, Result};
use crate::namespace::{Attr, Kind};
use crate::placement::{chunk_worker, Target};
use crate::protocol::{Header, Op};

use super::Client;
use crate::lost::{append_lost, read_lost, LostServers};

/// Whether `e` says a server is gone (not a refusal of the request itself).
pub(super) fn is_fault(e: &Error) -> bool {
    matches!(e, Error::ServerLost { .. } | Error::Timeout { .. })
}

/// What `repair` did to one file.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Repaired {
    /// Chunk copies written to servers that took a lost server's place.
    pub copies: u64,
    /// Bytes those copies hold.
    pub bytes: u64,
    /// Chunks with no copy left on a live server (their bytes are lost).
    pub lost_chunks: u64,
}

/// How many copies a file asks for, and the fewest any of its chunks keeps on live servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopiesLeft {
    pub asked: u8,
    /// None for a file without data.
    pub fewest: Option<usize>,
}

impl Client {
    /// The registry's record of servers declared lost and repaired.
    pub fn lost_servers(&self) -> Result<LostServers> {
        read_lost(&self.registry_dir)
    }

    /// The id of the server whose worker keeps `path`'s metadata (its name, size and layout).
    pub fn locate_metadata(&self, path: &str) -> Result<u32> {
        let path = self.checked("locate", path)?;
        Ok(self.membership[self.owner(&path).0].id)
    }

    /// The ids of the servers holding the copies of byte `offset` of the file at `path`, in
    /// the order reads try them.
    pub fn locate_copies(&self, path: &str, offset: u64) -> Result<Vec<u32>> {
        let _call = self.telemetry_call(crate::telemetry::OpKind::Meta);
        let attr = self.file_to_locate(path)?;
        let chunk = offset / attr.layout.chunk_size.max(1);
        Ok(self
            .copies(&attr, chunk)
            .into_iter()
            .map(|t| self.membership[t.0].id)
            .collect())
    }

    /// For each path (links not followed): its copies asked and the fewest left on servers not
    /// in `lost` (server ids), or why its attributes could not be had.
    pub fn copies_left(&self, paths: &[String], lost: &[u32]) -> Result<Vec<Result<CopiesLeft>>> {
        let lost: Vec<usize> = self.indexes_of(lost);
        let window = self.config.client.max_inflight.max(1) as usize;
        self.run(async {
            let calls = paths.iter().map(|p| {
                let lost = &lost;
                async move {
                    let path = self.checked("status", p)?;
                    let attr = self.lookup(&path).await?;
                    Ok(CopiesLeft {
                        asked: attr.layout.replicas,
                        fewest: self.fewest_live_copies(&attr, attr.size, lost),
                    })
                }
            });
            Ok(stream::iter(calls).buffered(window).collect().await)
        })
    }

    /// Re-creates, for each path (links not followed), the copies of its chunks that servers
    /// declared lost held: on the servers standing in for them (see [`Client::copies`]), and
    /// on the declared servers `rejoining` (ids), which answer again and are caught up (their
    /// chunks of each file cut at its size, then every chunk they hold copied from a copy
    /// left). Files at once, at most `client.max_inflight` chunks in flight. Per path, what was
    /// done or why it failed.
    pub fn repair(&self, paths: &[String], rejoining: &[u32]) -> Result<Vec<Result<Repaired>>> {
        self.refresh_declared();
        let rejoining = self.indexes_of(rejoining);
        self.run(async {
            let rejoining = &rejoining;
            let calls = paths.iter().map(|p| async move {
                let path = self.checked("repair", p)?;
                let attr = self.lookup(&path).await?;
                self.repair_file(&attr, attr.size, rejoining).await
            });
            Ok(stream::iter(calls).buffered(4).collect().await)
        })
    }

    /// Declares the servers `ids` lost (see the module comment): what `repair` does first with
    /// the servers that do not answer.
    pub fn declare_lost_servers(&self, ids: &[u32]) {
        for i in self.indexes_of(ids) {
            self.declare_lost(i);
        }
    }

    /// Records that the copies servers `ids` held were re-created on their stand-ins.
    pub fn record_repaired(&self, ids: &[u32]) -> Result<()> {
        ids.iter()
            .try_for_each(|id| append_lost(&self.registry_dir, &format!("repaired {id}")))
    }

    /// Records that servers `ids` were caught up (`repair` with them rejoining): every client
    /// uses them again from its next look at the record.
    pub fn record_rejoined(&self, ids: &[u32]) -> Result<()> {
        ids.iter()
            .try_for_each(|id| append_lost(&self.registry_dir, &format!("rejoined {id}")))?;
        self.refresh_declared();
        Ok(())
    }

    /// Server indexes of the ids given (unknown ids are left out).
    fn indexes_of(&self, ids: &[u32]) -> Vec<usize> {
        ids.iter()
            .filter_map(|id| self.membership.iter().position(|e| e.id == *id))
            .collect()
    }

    /// The (server, worker) of each copy of chunk `chunk` of `attr`'s file, in the order
    /// reads try them: the copies left, then the servers standing in for declared-lost ones.
    pub(super) fn copies(&self, attr: &Attr, chunk: u64) -> Vec<Target> {
        let declared = self.declared.borrow();
        self.domains
            .replica_servers(&attr.layout, chunk, &declared)
            .into_iter()
            .map(|s| {
                (
                    s,
                    chunk_worker(
                        crate::chunking::FileId(attr.data_id()),
                        chunk,
                        self.server_count(),
                        self.workers(s),
                    ),
                )
            })
            .collect()
    }

    /// Whether the server at `index` is lost to this client now (not answering).
    pub(super) fn is_lost(&self, index: usize) -> bool {
        self.links.borrow().get(index).is_some_and(|l| l.lost.is_some())
    }

    /// Declares the server at `index` lost for the job (see the module comment); once per
    /// server. A record that cannot be written is said once; the server stays out for this
    /// client regardless.
    pub(super) fn declare_lost(&self, index: usize) {
        self.declare_lost_because(index, "a change of a replicated file went on without it");
    }

    /// As [`Client::declare_lost`], saying `why`.
    pub(super) fn declare_lost_because(&self, index: usize, why: &str) {
        if self.declared.borrow().contains(&index) {
            return;
        }
        self.declared.borrow_mut().push(index);
        let id = self.membership[index].id;
        crate::warn_line!(
            "benchfs: server {id} declared lost: {why} (`benchfs repair` re-creates its copies \
             elsewhere, or catches it up once it answers)"
        );
        if let Err(e) = append_lost(&self.registry_dir, &format!("lost {id}")) {
            crate::warn_line!("benchfs: {e}");
            self.unrecorded.borrow_mut().push(index);
        }
        // The record with this line (and any other client's since): where copies are now.
        self.refresh_declared();
    }

    /// Reads the registry's record again: servers other clients declared lost are out here too.
    /// A server that rejoined (caught up by `repair`) is used again.
    pub(super) fn refresh_declared(&self) {
        let Ok(record) = read_lost(&self.registry_dir) else {
            return;
        };
        self.epoch.set(record.epoch);
        let recorded = self.indexes_of(&record.lost);
        *self.record_events.borrow_mut() = record.events;
        self.metadata_chains.borrow_mut().clear();
        let mut declared = self.declared.borrow_mut();
        // Declarations this client could not record stay; recorded ones follow the record.
        let unrecorded = self.unrecorded.borrow();
        declared.retain(|i| recorded.contains(i) || unrecorded.contains(i));
        for i in recorded {
            if !declared.contains(&i) {
                declared.push(i);
            }
        }
    }

    /// Whether the server at `index` was declared lost (this client knows of).
    pub(super) fn is_declared(&self, index: usize) -> bool {
        self.declared.borrow().contains(&index)
    }

    /// A change (write, checked write, truncate, fsync) sent to every live copy of a chunk or
    /// every target: answered once each live copy answered. A copy that is lost, or fails
    /// because its server is gone, is declared lost and skipped; the change fails only when
    /// no copy took it, or a copy refused it (that error is returned).
    pub(super) async fn change_copies(
        &self,
        targets: Vec<Target>,
        header: Header,
        payload: &[u8],
        ready: Instant,
        digests: bool,
    ) -> Result<(Header, Option<u128>)> {
        let (live, gone): (Vec<Target>, Vec<Target>) = targets.into_iter().partition(|t| !self.is_lost(t.0));
        for t in &gone {
            self.declare_lost(t.0);
        }
        let Some(&first) = live.first() else {
            let server = gone.first().map_or(0, |t| self.membership[t.0].id);
            return Err(Error::ServerLost {
                server,
                reason: "every copy's server is lost".into(),
            });
        };
        let answers = join_all(live.iter().map(|&t| async move {
            if digests {
                let mut d = [0u8; crate::protocol::CHECKSUM_LEN];
                let h = self.call(t, header, payload, Some(&mut d[..]), ready).await?;
                if h.length as usize != d.len() {
                    return Err(Error::Protocol(format!(
                        "{} reply of {} bytes, not {}",
                        header.op.name(),
                        h.length,
                        d.len()
                    )));
                }
                Ok((h, Some(u128::from_le_bytes(d))))
            } else {
                self.call(t, header, payload, None, ready)
                    .await
                    .map(|h| (h, None))
            }
        }))
        .await;
        let mut took: Option<(Header, Option<u128>)> = None;
        let mut fault: Option<Error> = None;
        for (t, answer) in live.iter().zip(answers) {
            match answer {
                Ok((h, d)) => {
                    if let (Some((_, Some(seen))), Some(d)) = (&took, d) {
                        if *seen != d {
                            return Err(Error::Protocol(format!(
                                "the copies of chunk {} of file {:032x} differ after a checked \
                                 write (server {} stored other bytes)",
                                header.chunk, header.file_id, self.membership[t.0].id
                            )));
                        }
                    }
                    took.get_or_insert((h, d));
                }
                Err(e) if is_fault(&e) => {
                    self.declare_lost(t.0);
                    fault.get_or_insert(e);
                }
                Err(e) => return Err(e),
            }
        }
        match took {
            Some(t) => Ok(t),
            None => Err(fault.unwrap_or(Error::ServerLost {
                server: self.membership[first.0].id,
                reason: "no copy answered".into(),
            })),
        }
    }

    /// A read of one chunk (or its checksum) from its copies in turn: the first that answers
    /// gives the bytes; one that fails because its server is gone passes the request on.
    /// Servers lost to this client now are tried last.
    pub(super) async fn read_copies(
        &self,
        attr: &Attr,
        header: Header,
        mut dest: Option<&mut [u8]>,
        ready: Instant,
    ) -> Result<Header> {
        let mut order = self.copies(attr, header.chunk);
        order.sort_by_key(|t| self.is_lost(t.0));
        let mut first_error = None;
        let last = order.len().saturating_sub(1);
        for (i, t) in order.into_iter().enumerate() {
            // A silent server is left after one timeout when another copy can answer.
            let retries = if i < last {
                0
            } else {
                self.config.client.max_retries
            };
            match self
                .call_retrying(t, header, &[], dest.as_deref_mut(), ready, retries)
                .await
            {
                Ok(h) => return Ok(h),
                Err(e) if is_fault(&e) => {
                    first_error.get_or_insert(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(first_error.unwrap_or(Error::ServerLost {
            server: 0,
            reason: "no copy to read".into(),
        }))
    }

    /// Re-creates the copies of `attr`'s chunks (a file of `size` bytes) on the servers that
    /// took a declared-lost server's place: each chunk read from a copy left, written checked,
    /// and its stored checksum compared with the source's. At most `client.max_inflight`
    /// chunks at once.
    pub(super) async fn repair_file(&self, attr: &Attr, size: u64, rejoining: &[usize]) -> Result<Repaired> {
        let mut done = Repaired::default();
        // An inline file's bytes are with its inode: the metadata's repair copies them.
        if attr.kind != Kind::File || attr.layout.replicas <= 1 || attr.layout.inline {
            return Ok(done);
        }
        let cs = attr.layout.chunk_size.max(1);
        let count = size.div_ceil(cs);
        let window = self.config.client.max_inflight.max(1) as usize;
        let ready = Instant::now();
        if !rejoining.is_empty() {
            // What a rejoining server holds beyond the size (the file was cut without it) goes
            // first, so no stale byte shows in a hole once the file grows again.
            let stripe = attr.layout.stripe_count as usize;
            let cut = rejoining
                .iter()
                .filter(|&&s| s < stripe)
                .flat_map(|&s| (0..self.workers(s)).map(move |w| (s, w)));
            for target in cut {
                let header = Header::request(Op::TruncateData, 0, attr.data_id(), 0, 0, size);
                self.call(target, header, &[], None, ready).await?;
            }
        }
        let calls = (0..count).map(|chunk| async move {
            let now = self.copies(attr, chunk);
            let before: Vec<usize> = self
                .domains
                .replica_servers(&attr.layout, chunk, &[])
                .into_iter()
                .collect();
            let sources: Vec<Target> = now
                .iter()
                .copied()
                .filter(|t| before.contains(&t.0) && !self.is_lost(t.0))
                .collect();
            let worker = |s: usize| {
                chunk_worker(
                    crate::chunking::FileId(attr.data_id()),
                    chunk,
                    self.server_count(),
                    self.workers(s),
                )
            };
            let places: Vec<Target> = now
                .iter()
                .copied()
                .filter(|t| !before.contains(&t.0))
                .chain(
                    before
                        .iter()
                        .filter(|s| rejoining.contains(s))
                        .map(|&s| (s, worker(s))),
                )
                .collect();
            if places.is_empty() {
                return Ok::<_, Error>((0u64, 0u64, false));
            }
            let Some(&source) = sources.first() else {
                return Ok((0, 0, true));
            };
            let len = (size - chunk * cs).min(cs);
            let mut buf = vec![0u8; len as usize];
            let read = Header::request(Op::ReadChunk, 0, attr.data_id(), chunk, 0, len);
            let got = self.call(source, read, &[], Some(&mut buf[..]), ready).await?;
            buf.truncate((got.length as usize).min(buf.len()));
            let sum = Header::request(Op::Checksum, 0, attr.data_id(), chunk, 0, buf.len() as u64);
            let want = self.call_for_digest(source, sum, &[], ready).await?;
            let mut copies = 0;
            for place in places {
                let write = Header::request(Op::WriteChecked, 0, attr.data_id(), chunk, 0, buf.len() as u64);
                let stored = self.call_for_digest(place, write, &buf, ready).await?;
                if stored != want {
                    return Err(Error::Protocol(format!(
                        "repair: chunk {chunk} of file {:032x} stored on server {} does not \
                         match its source on server {}",
                        attr.id.0, self.membership[place.0].id, self.membership[source.0].id
                    )));
                }
                copies += 1;
            }
            Ok((copies, copies * buf.len() as u64, false))
        });
        let mut results = stream::iter(calls).buffer_unordered(window);
        while let Some(r) = results.next().await {
            let (copies, bytes, lost) = r?;
            done.copies += copies;
            done.bytes += bytes;
            done.lost_chunks += lost as u64;
        }
        Ok(done)
    }

    /// The fewest copies any chunk of `attr`'s file (of `size` bytes) keeps on servers not in
    /// `lost` (server indexes: those not answering, and those declared lost and not repaired;
    /// a repaired server's copies are on its stand-ins), or None for a file without chunks
    /// (an inline file's bytes have the copies its name has).
    pub(super) fn fewest_live_copies(&self, attr: &Attr, size: u64, lost: &[usize]) -> Option<usize> {
        if attr.kind != Kind::File || size == 0 || attr.layout.inline {
            return None;
        }
        let cs = attr.layout.chunk_size.max(1);
        // A chunk's copies follow from its primary, and the first `stripe` chunks take every
        // server of the stripe once as primary: they show every set of copies the file has.
        let count = size.div_ceil(cs).min(attr.layout.stripe_count.max(1) as u64);
        (0..count)
            .map(|chunk| {
                self.domains
                    .replica_servers(&attr.layout, chunk, &[])
                    .iter()
                    .filter(|s| !lost.contains(s))
                    .count()
            })
            .min()
    }
}
