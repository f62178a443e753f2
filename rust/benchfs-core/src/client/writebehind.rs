//! Write-behind: with `client.write_behind` > 0 a write returns once its bytes are copied into
//! buffers handed to the process's write-behind thread (client/sender.rs), which sends them
//! while the program goes on, so the caller's next write, or its computation, overlaps this
//! one's transfer and device time. Bounded by `client.write_behind` bytes (see sender.rs);
//! nothing is flushed by a timer. Overlapping writes land in the order they were made.
//!
//! Errors: the first failure of a client's deferred writes of a file is returned by its next
//! write of the file, or its `fsync`, `flush` or `close` (which wait for every write of the
//! file first); nothing fails silently. Reads of the file through any client of the process
//! wait for its writes first, as do truncate, unlink and rename through the writing client, so
//! a process always reads its own writes.

use std::sync::Arc;

use crate::chunking::split;
use crate::error::{Error, Result};
use crate::runtime::Notifier;

use super::sender::{Part, Sender, State};
use super::{Client, FileHandle};

impl Client {
    /// Writes `data` at `offset` of `file` behind the caller (see the module comment).
    pub(super) async fn write_behind(&self, file: &FileHandle, offset: u64, data: &[u8]) -> Result<()> {
        let sender = self.sender()?;
        let attr = &file.placed();
        let id = attr.id.0;
        let me = self.behind.number;
        // An earlier write of the file failed: this one says so, rather than go on.
        if let Some(e) = sender.state().and_then(|mut s| s.take_failure(id, me)) {
            return Err(e);
        }
        let budget = self.config.client.write_behind;
        for p in split(offset, data.len() as u64, attr.layout.chunk_size) {
            let mut part = Some(Part {
                client: me,
                file: id,
                data_id: attr.data_id(),
                target: self.route(attr, p.chunk),
                chunk: p.chunk,
                in_chunk: p.offset,
                offset: offset + p.buf_offset,
                buf: data[p.buf_offset as usize..(p.buf_offset + p.len) as usize].into(),
                changes: file.changes.clone(),
            });
            let mut gone = false;
            self.wait_behind(&sender, |s| {
                gone = s.gone;
                part = part.take().filter(|_| !gone).and_then(|p| s.offer(p, budget));
                gone || part.is_none()
            })
            .await?;
            if gone {
                return Err(super::sender::thread_gone());
            }
            sender.handed_over();
        }
        Ok(())
    }

    /// Waits for every unanswered write of file `id` (of every client of this process). With
    /// `report`, returns (and forgets) the first failure of this client's writes of it;
    /// without, keeps it for a later fsync or close.
    pub(super) async fn settle_file(&self, id: u128, report: bool) -> Result<()> {
        let Some(sender) = self.live_sender() else {
            return Ok(());
        };
        let me = self.behind.number;
        let mut failed = None;
        self.wait_behind(sender, |s| {
            if !s.file_answered(id) {
                return false;
            }
            if report {
                failed = s.take_failure(id, me);
            }
            true
        })
        .await?;
        failed.map_or(Ok(()), Err)
    }

    /// Waits for every unanswered write of this client (before a truncate, unlink or rename,
    /// whose path may name a file written behind); failures stay with their files.
    pub(super) async fn settle_all(&self) {
        if let Some(sender) = self.live_sender() {
            let me = self.behind.number;
            // Fails only in a forked child, which has none of its parent's writes to wait for.
            let _ = self.wait_behind(sender, |s| s.client_unanswered(me) == 0).await;
        }
    }

    /// Whether file `id` has writes not yet answered, or a failure not yet reported, in this
    /// process.
    pub(super) fn writes_behind(&self, id: u128) -> bool {
        self.live_sender()
            .and_then(|s| s.state())
            .is_some_and(|s| s.has_file(id))
    }

    /// Whether this client has writes not yet answered.
    pub(super) fn any_writes_behind(&self) -> bool {
        let me = self.behind.number;
        self.live_sender()
            .and_then(|s| s.state())
            .is_some_and(|s| s.client_unanswered(me) > 0)
    }

    /// The process's write-behind thread for this cluster, started on first use.
    fn sender(&self) -> Result<Arc<Sender>> {
        if let Some(s) = self.behind.sender.get() {
            return Ok(s.clone());
        }
        let s = Sender::for_cluster(&self.registry_dir, self.token, &self.config)?;
        Ok(self.behind.sender.get_or_init(|| s).clone())
    }

    /// The process's sender, if one runs: a client that never wrote behind still waits for
    /// the writes of the others (a mount's reader thread for its writer thread's).
    fn live_sender(&self) -> Option<&Arc<Sender>> {
        if let Some(s) = self.behind.sender.get() {
            return Some(s);
        }
        let s = Sender::running(&self.registry_dir, self.token)?;
        Some(self.behind.sender.get_or_init(|| s))
    }

    /// Runs `ready` on the shared state until it says so, sleeping in this client's event loop
    /// (which the thread wakes at each answer) in between.
    async fn wait_behind(&self, sender: &Sender, mut ready: impl FnMut(&mut State) -> bool) -> Result<()> {
        let reactor = self.runtime.reactor();
        let waker = self.behind_waker()?;
        loop {
            {
                let mut s = sender.state().ok_or(Error::Forked)?;
                if ready(&mut s) {
                    return Ok(());
                }
                s.wait(&waker);
            }
            reactor.notified().await;
            reactor.reset_notified();
        }
    }

    fn behind_waker(&self) -> Result<Notifier> {
        if let Some(n) = self.behind.waker.get() {
            return Ok(n.clone());
        }
        let n = self.runtime.reactor().notifier()?;
        Ok(self.behind.waker.get_or_init(|| n).clone())
    }
}

/// A number for a group of clients that write behind as one (see
/// [`Client::write_behind_as`]).
pub fn write_behind_group() -> u64 {
    super::sender::client_number()
}

impl Client {
    /// Makes this client write behind as one with every client given the same `group`
    /// ([`write_behind_group`]): each waits for the group's writes (unlink, rename, truncate)
    /// and reports the failures of the group's writes of a file it flushes or closes. A mount
    /// serves one file through the clients of several threads, so a failure must reach
    /// whichever thread the file's close comes to. Call before the first write.
    pub fn write_behind_as(&mut self, group: u64) {
        self.behind.number = group;
    }
}

/// A client's side of write-behind: its number among the clients of the process, the
/// process's sender once it wrote behind, and the handle by which that thread wakes this
/// client's event loop.
pub(super) struct Behind {
    number: u64,
    sender: std::cell::OnceCell<Arc<Sender>>,
    waker: std::cell::OnceCell<Notifier>,
}

impl Behind {
    pub(super) fn new() -> Behind {
        Behind {
            number: super::sender::client_number(),
            sender: std::cell::OnceCell::new(),
            waker: std::cell::OnceCell::new(),
        }
    }
}
