//! Copies of the metadata (`layout.replicas` 2 or 3; docs/namespace.md "Copies of the
//! metadata"): each metadata owner's names are kept by its server and by the next servers on
//! the ring of failure domains. A request goes to the copy serving the owner now (its server,
//! unless the registry's record declares it lost); the changes it made come back with the
//! reply, and the client hands them to every other copy (a mirror) before the call returns:
//! a change is answered once every live copy has it.
//!
//! A copy that fails (gone, silent past the request timeout) is declared lost in the record
//! before anything else happens; the next copy serves from then on, and the declared server
//! refuses every metadata request (ESTALE) as soon as it reads the record, so no two copies
//! ever serve one owner at once. A request refused that way, or whose mirror the copies
//! refuse because another copy serves now, is sent again to the copy serving now: the server
//! that answered it first is out, and its change with it.

use std::time::Instant;

use futures::future::join_all;
use futures::stream::{self, StreamExt};

use crate::error::{Error, Result};
use crate::lost::append_lost;
use crate::lost::Event;
use crate::placement::{metadata_owner, MetadataCopies};
use crate::protocol::mirror::{decode_snapshot, decode_versioned, Mirror};
use crate::protocol::{Header, Op, ReplyValue};

use super::replicas::is_fault;
use super::Client;

/// How many times one request moves to another copy before it fails: each move follows a
/// declaration or a newer record, so a few are plenty.
const MOVES: usize = 4;

/// Bytes of changes one metadata request may return besides its reply (paths, an attribute
/// and a directory's entries: well under this), and a snapshot page's one record beyond half
/// a reply.
pub(super) const CHANGES_MAX: usize = 4 * (crate::namespace::PATH_MAX + 256);

/// What handing a change to the other copies came to.
enum Mirrored {
    Done,
    /// Another copy serves the owner now: the change must be made there.
    Moved,
}

impl Client {
    /// The metadata owner of `path`.
    pub(super) fn owner_of(&self, path: &str) -> u32 {
        metadata_owner(path, (self.server_count() * self.workers(0)) as u32)
    }

    /// The ids of the servers keeping copies of `path`'s metadata, by the record read now: the
    /// complete ones (the first serves), then those taking changes only (standing in before a
    /// repair, or being caught up). One server without copies of the metadata.
    pub fn locate_metadata_copies(&self, path: &str) -> Result<Vec<u32>> {
        let path = self.checked("locate", path)?;
        let owner = self.owner_of(&path);
        if self.metadata_copies <= 1 {
            return Ok(vec![self.membership[self.owner(&path).0].id]);
        }
        self.refresh_declared();
        let copies = self.metadata_copies_of(owner);
        let ids = copies.complete.iter().chain(&copies.joining);
        Ok(ids.map(|&s| self.membership[s].id).collect())
    }

    /// Where owner `owner`'s copies are, by the record as this client last read it.
    pub(super) fn metadata_copies_of(&self, owner: u32) -> MetadataCopies {
        self.with_metadata_copies(owner, MetadataCopies::clone)
    }

    /// `f` of where owner `owner`'s copies are (worked out once per read of the record).
    fn with_metadata_copies<T>(&self, owner: u32, f: impl FnOnce(&MetadataCopies) -> T) -> T {
        let server = owner as usize / self.workers(0).max(1);
        if let Some(c) = self.metadata_chains.borrow().get(&server) {
            return f(c);
        }
        // Declarations this client could not write to the record count here as its last lines.
        let mut events = self.record_events.borrow().clone();
        events.extend(self.unrecorded.borrow().iter().map(|&i| Event::Lost(i as u32)));
        let copies = self
            .domains
            .metadata_servers(server, self.metadata_copies, &events);
        let out = f(&copies);
        self.metadata_chains.borrow_mut().insert(server, copies);
        out
    }

    /// The server serving owner `owner`, by the record as this client last read it.
    fn serving_of(&self, owner: u32) -> Option<usize> {
        self.with_metadata_copies(owner, MetadataCopies::serving)
    }

    /// One metadata request (`op`, `payload`) for owner `owner`, to the copy serving it, its
    /// changes mirrored to the others; the reply header and payload (the changes taken off).
    pub(super) async fn meta_with_copies(
        &self,
        owner: u32,
        op: Op,
        payload: &[u8],
    ) -> Result<(Header, Vec<u8>)> {
        let worker = owner as usize % self.workers(0).max(1);
        let mut last: Option<Error> = None;
        for _ in 0..=MOVES {
            let Some(serving) = self.serving_of(owner) else {
                return Err(self.no_copy_left(owner));
            };
            let header = Header::request(op, 0, 0, owner as u64 + 1, 0, payload.len() as u64);
            let mut room = self.reply_buf();
            let answer = self
                .call(
                    (serving, worker),
                    header,
                    payload,
                    Some(&mut room[..]),
                    Instant::now(),
                )
                .await;
            match answer {
                Ok(h) => {
                    let total = (h.length as usize).min(room.len());
                    let changes = (h.chunk as usize).min(total);
                    let mut reply = room.body(total);
                    drop(room);
                    let records = reply.split_off(total - changes);
                    if (h.file_id >> 64) as u64 != self.epoch.get() {
                        self.refresh_declared();
                    }
                    if !records.is_empty() {
                        let seq = h.file_id as u64;
                        if let Mirrored::Moved = self.mirror(owner, serving, seq, records).await? {
                            continue;
                        }
                    }
                    let h = Header {
                        length: reply.len() as u64,
                        chunk: 0,
                        file_id: 0,
                        ..h
                    };
                    return Ok((h, reply));
                }
                Err(e) if is_fault(&e) => {
                    // Losing it, this client read the record again: another may have declared it.
                    if self.serving_of(owner) == Some(serving) {
                        if !self.next_copy_answers(owner).await {
                            return Err(e);
                        }
                        self.declare_lost_because(serving, "a metadata request to it failed");
                    }
                    last = Some(e);
                }
                Err(Error::Remote { errno, .. }) if errno == libc::ESTALE => {
                    // It does not serve the owner by the record: read it again.
                    self.refresh_declared();
                    if self.serving_of(owner) == Some(serving) {
                        return Err(Error::Protocol(format!(
                            "server {} refuses requests for metadata owner {owner}, though the \
                             registry's record of lost servers says it serves them",
                            self.membership[serving].id
                        )));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| self.no_copy_left(owner)))
    }

    /// Whether this client reaches the copy of owner `owner` next after the serving one: a
    /// client that reaches neither declares nothing (its own link is the likelier fault, and
    /// declaring would take the names from every client).
    pub(super) async fn next_copy_answers(&self, owner: u32) -> bool {
        let Some(&next) = self.metadata_copies_of(owner).complete.get(1) else {
            return false;
        };
        self.connect_on_use(next).await.is_ok() && !self.is_lost(next)
    }

    fn no_copy_left(&self, owner: u32) -> Error {
        let server = owner as usize / self.workers(0).max(1);
        Error::ServerLost {
            server: self.membership[server].id,
            reason: format!(
                "every copy of metadata owner {owner}'s names is on a server declared lost \
                 (benchfs status lists them)"
            ),
        }
    }

    /// Hands the changes `serving` made under `seq` to owner `owner`'s other copies. A copy
    /// that fails is declared lost (the change went on without it); copies that refuse them
    /// mean another copy serves now (the record says so), or the refusing copy is out of
    /// step, and is declared lost.
    async fn mirror(&self, owner: u32, serving: usize, seq: u64, records: Vec<u8>) -> Result<Mirrored> {
        let copies = self.metadata_copies_of(owner);
        if copies.serving() != Some(serving) {
            return Ok(Mirrored::Moved);
        }
        let worker = owner as usize % self.workers(0).max(1);
        let payload = Mirror {
            shard: owner,
            producer: self.membership[serving].id,
            seq,
            records,
        }
        .encode();
        let header = Header::request(Op::Mirror, 0, 0, owner as u64 + 1, 0, payload.len() as u64);
        let targets: Vec<usize> = copies.mirrors().collect();
        let answers = join_all(
            targets
                .iter()
                .map(|&s| self.call((s, worker), header, &payload, None, Instant::now())),
        )
        .await;
        let mut refused = Vec::new();
        for (&s, answer) in targets.iter().zip(answers) {
            match answer {
                Ok(_) => {}
                Err(e) if is_fault(&e) => {
                    self.declare_lost_because(s, "a change of the metadata went on without it")
                }
                Err(Error::Remote { errno, .. }) if errno == libc::ESTALE => refused.push(s),
                Err(e) => return Err(e),
            }
        }
        if refused.is_empty() {
            return Ok(Mirrored::Done);
        }
        self.refresh_declared();
        if self.serving_of(owner) != Some(serving) {
            return Ok(Mirrored::Moved);
        }
        for s in refused {
            self.declare_lost_because(s, "it refused a change of the metadata it keeps a copy of");
        }
        Ok(Mirrored::Done)
    }

    /// The server keeping the locks of the files whose locks server `server` keeps: itself,
    /// or with copies of the metadata, the copy serving its metadata owners when it is
    /// declared lost (whose locks start empty: holders are told on next use).
    pub(super) fn lock_server(&self, server: usize) -> usize {
        if self.metadata_copies <= 1 {
            return server;
        }
        let owner = (server * self.workers(0)) as u32;
        self.serving_of(owner).unwrap_or(server)
    }
}

impl Client {
    /// Records servers `ids` as joining (`repair`, before it catches them up): from now on
    /// they take every change of the metadata they keep copies of, and serve nothing; each
    /// forgets what it held before it takes the first.
    pub fn record_joining(&self, ids: &[u32]) -> Result<()> {
        ids.iter()
            .try_for_each(|id| append_lost(&self.registry_dir, &format!("joining {id}")))?;
        self.refresh_declared();
        Ok(())
    }

    /// Hands every metadata owner's joining copies (stand-ins for declared servers, and
    /// declared servers being caught up) the serving copy's state, page by page; changes made
    /// meanwhile reach them as mirrors, and of a name's record and its change the newer wins.
    /// Returns the records copied. Without copies of the metadata, nothing.
    pub fn catch_up_metadata(&self) -> Result<u64> {
        if self.metadata_copies <= 1 {
            return Ok(0);
        }
        self.refresh_declared();
        let owners = (self.server_count() * self.workers(0)) as u32;
        self.run(async {
            let counts: Vec<Result<u64>> = stream::iter(0..owners)
                .map(|owner| self.catch_up_owner(owner))
                .buffer_unordered(4)
                .collect()
                .await;
            counts.into_iter().sum()
        })
    }

    /// One owner's part of [`Client::catch_up_metadata`].
    async fn catch_up_owner(&self, owner: u32) -> Result<u64> {
        let copies = self.metadata_copies_of(owner);
        if copies.joining.is_empty() {
            return Ok(0);
        }
        let Some(serving) = copies.serving() else {
            return Err(self.no_copy_left(owner));
        };
        let worker = owner as usize % self.workers(0).max(1);
        let mut after = String::new();
        let mut copied = 0u64;
        loop {
            let (h, body) = self
                .meta_with_copies(owner, Op::Snapshot, after.as_bytes())
                .await?;
            let (last, records) =
                decode_snapshot(&body).ok_or_else(|| Error::Protocol("malformed snapshot reply".into()))?;
            copied += decode_versioned(records)
                .ok_or_else(|| Error::Protocol("malformed snapshot records".into()))?
                .len() as u64;
            let payload = Mirror {
                shard: owner,
                producer: self.membership[serving].id,
                seq: 0,
                records: records.to_vec(),
            }
            .encode();
            let header = Header::request(Op::Mirror, 0, 0, owner as u64 + 1, 0, payload.len() as u64);
            for &s in &copies.joining {
                self.call((s, worker), header, &payload, None, Instant::now())
                    .await?;
            }
            if h.value() != ReplyValue::MoreFollows(true) {
                break;
            }
            after = last;
        }
        // A server declared lost meanwhile brought a stand-in this copy did not reach.
        self.refresh_declared();
        if self.metadata_copies_of(owner).joining != copies.joining {
            return Err(Error::Protocol(format!(
                "the copies of metadata owner {owner} changed while repair caught them up (a \
                 server was declared lost): run repair again"
            )));
        }
        Ok(copied)
    }
}
