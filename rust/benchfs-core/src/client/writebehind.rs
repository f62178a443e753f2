//! Write-behind: with `client.write_behind` > 0 a write returns once its bytes are copied into
//! buffers the client owns and their requests are sent, so the caller's next write (and its
//! transfer) overlaps this one's device time. Bounded: at most `client.write_behind` bytes and
//! `client.max_inflight` requests of a client are unanswered (a write waits for the oldest ones
//! first), and nothing is flushed by a timer. A write that overlaps an unanswered one waits for it first, so the servers apply
//! overlapping writes in the caller's order.
//!
//! Errors: the first failure of a file's deferred writes is returned by its next write, `fsync`
//! or `close` (the last two wait for every write of the file first); nothing fails silently. A write
//! refused as busy (EAGAIN, before execution) is sent again as an ordinary request. Reads of
//! the file through this client, and truncate, unlink and rename through it, wait for its
//! writes first, so the client always reads its own writes.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use benchfs_ucx::Request;

use crate::chunking::split;
use crate::error::{Error, Result};
use crate::placement::Target;
use crate::protocol::{Header, Op};
use crate::runtime::with_timeout;
use crate::telemetry::OpKind;

use super::rpc::{ReplyFailure, WaitReply};
use super::telemetry::ns;
use super::{Client, FileHandle};

/// One deferred write: `buf` goes to `offset` of the file, within one chunk.
struct Deferred {
    chunk: u64,
    in_chunk: u64,
    offset: u64,
    id: u64,
    target: Target,
    issued: Instant,
    buf: Box<[u8]>,
    /// None once the UCX worker it went out on was replaced: then it is sent again.
    send: Option<Request>,
}

impl Drop for Deferred {
    fn drop(&mut self) {
        if self.send.as_ref().is_some_and(|s| !s.is_done()) {
            // Dropped while UCX may still read it (a failed event loop): leaked, not freed.
            std::mem::forget(std::mem::take(&mut self.buf));
        }
    }
}

impl Deferred {
    fn overlaps(&self, from: u64, to: u64) -> bool {
        self.offset < to && from < self.offset + self.buf.len() as u64
    }
}

#[derive(Default)]
struct FileWrites {
    /// Oldest first.
    unanswered: VecDeque<Deferred>,
    /// The first failure, kept for the file's next write, fsync or close.
    failed: Option<Error>,
}

/// A client's unanswered writes, per file id.
#[derive(Default)]
pub(super) struct WriteBehind {
    files: RefCell<HashMap<u128, FileWrites>>,
    bytes: Cell<u64>,
    /// Unanswered requests (at most `client.max_inflight`).
    count: Cell<usize>,
}

impl Client {
    /// Writes `data` at `offset` of `file` behind the caller (see the module comment).
    pub(super) async fn write_behind(&self, file: &FileHandle, offset: u64, data: &[u8]) -> Result<()> {
        let attr = &file.attr;
        let id = attr.id.0;
        let budget = self.config.client.write_behind;
        // An earlier write of the file failed: this one says so, rather than go on.
        let failed = self
            .write_behind
            .files
            .borrow_mut()
            .get_mut(&id)
            .and_then(|f| f.failed.take());
        if let Some(e) = failed {
            return Err(e);
        }
        for p in split(offset, data.len() as u64, attr.layout.chunk_size) {
            let from = offset + p.buf_offset;
            self.settle_overlapping(id, from, from + p.len).await;
            let most = self.config.client.max_inflight as usize;
            while (self.write_behind.bytes.get() + p.len > budget || self.write_behind.count.get() >= most)
                && self.settle_oldest(id).await
            {}
            let buf: Box<[u8]> = data[p.buf_offset as usize..(p.buf_offset + p.len) as usize].into();
            let target = self.route(attr, p.chunk);
            let header = Header::request(Op::WriteChunk, 0, id, p.chunk, p.offset, p.len);
            // SAFETY: `buf` stays in the Deferred (or, abandoned, in `detached_orphans`)
            // until its send has completed; a write's reply has no payload.
            let sent = unsafe { self.send_detached(target, header, &buf, None) };
            let (request, send) = match sent {
                Ok(x) => x,
                Err(_) => {
                    // Lost or not connected: an ordinary request says so, or reconnects.
                    self.call(target, header, &buf, None, Instant::now()).await?;
                    continue;
                }
            };
            self.telemetry
                .metrics
                .attempt_sent(target.0, OpKind::Write, false);
            let wb = &self.write_behind;
            wb.bytes.set(wb.bytes.get() + p.len);
            wb.count.set(wb.count.get() + 1);
            let d = Deferred {
                chunk: p.chunk,
                in_chunk: p.offset,
                offset: from,
                id: request,
                target,
                issued: Instant::now(),
                buf,
                send: Some(send),
            };
            wb.files
                .borrow_mut()
                .entry(id)
                .or_default()
                .unanswered
                .push_back(d);
        }
        Ok(())
    }

    /// Waits for the unanswered writes of file `id` that overlap `[from, to)`.
    async fn settle_overlapping(&self, id: u128, from: u64, to: u64) {
        loop {
            let next = {
                let mut files = self.write_behind.files.borrow_mut();
                let Some(f) = files.get_mut(&id) else { return };
                let Some(i) = f.unanswered.iter().position(|d| d.overlaps(from, to)) else {
                    return;
                };
                f.unanswered.remove(i)
            };
            if let Some(d) = next {
                self.settle(id, d).await;
            }
        }
    }

    /// Waits for the oldest unanswered write, of file `id` if it has one, else of any file;
    /// false if there was none.
    async fn settle_oldest(&self, id: u128) -> bool {
        let next = {
            let mut files = self.write_behind.files.borrow_mut();
            let key = if files.get(&id).is_some_and(|f| !f.unanswered.is_empty()) {
                Some(id)
            } else {
                files
                    .iter()
                    .find(|(_, f)| !f.unanswered.is_empty())
                    .map(|(&k, _)| k)
            };
            key.and_then(|k| {
                files
                    .get_mut(&k)
                    .and_then(|f| f.unanswered.pop_front())
                    .map(|d| (k, d))
            })
        };
        match next {
            Some((k, d)) => {
                self.settle(k, d).await;
                true
            }
            None => false,
        }
    }

    /// Waits for every unanswered write of file `id`. With `report`, returns (and forgets) the
    /// file's first failure; without, keeps it for a later fsync or close.
    pub(super) async fn settle_file(&self, id: u128, report: bool) -> Result<()> {
        loop {
            let next = {
                let mut files = self.write_behind.files.borrow_mut();
                match files.get_mut(&id) {
                    Some(f) => f.unanswered.pop_front(),
                    None => return Ok(()),
                }
            };
            match next {
                Some(d) => self.settle(id, d).await,
                None => break,
            }
        }
        let mut files = self.write_behind.files.borrow_mut();
        if !report && files.get(&id).is_some_and(|f| f.failed.is_some()) {
            return Ok(());
        }
        let failed = files.remove(&id).and_then(|f| f.failed);
        failed.map_or(Ok(()), Err)
    }

    /// Waits for every unanswered write of this client (before a truncate, unlink or rename,
    /// whose path may name a file written behind); failures stay with their files.
    pub(super) async fn settle_all(&self) {
        while self.settle_oldest(0).await {}
    }

    /// After the UCX worker was replaced (its requests are gone, their buffers free to
    /// reuse): every unanswered write is to be sent again when settled.
    pub(super) fn resend_writes_behind(&self) {
        let metrics = &self.telemetry.metrics;
        for f in self.write_behind.files.borrow_mut().values_mut() {
            for d in f.unanswered.iter_mut().filter(|d| d.send.is_some()) {
                d.send = None;
                metrics.attempt_done(d.target.0, OpKind::Write, ns(d.issued.elapsed()));
            }
        }
    }

    /// Whether file `id` has writes not yet answered or a failure not yet reported.
    pub(super) fn writes_behind(&self, id: u128) -> bool {
        self.write_behind.files.borrow().contains_key(&id)
    }

    /// Whether any file has writes not yet answered.
    pub(super) fn any_writes_behind(&self) -> bool {
        self.write_behind.bytes.get() > 0
    }

    /// Waits for one deferred write's answer; a failure is kept for the file.
    async fn settle(&self, id: u128, d: Deferred) {
        let answered = match d.send {
            Some(_) => Some(self.answer(&d).await),
            None => None,
        };
        let wb = &self.write_behind;
        wb.bytes.set(wb.bytes.get() - d.buf.len() as u64);
        wb.count.set(wb.count.get() - 1);
        let result = match answered {
            // Refused before execution (busy), or its transport replaced before the answer
            // came: sent again as an ordinary request. The same bytes at the same place are
            // the same write, and no later write overlapping it has been sent.
            None
            | Some(Err(Error::Remote {
                errno: libc::EAGAIN, ..
            })) => {
                let header = Header::request(Op::WriteChunk, 0, id, d.chunk, d.in_chunk, d.buf.len() as u64);
                self.call(d.target, header, &d.buf, None, Instant::now())
                    .await
                    .map(drop)
            }
            Some(other) => other,
        };
        let mut d = d;
        if let Some(send) = d.send.take().filter(|s| !s.is_done()) {
            // Abandoned (timed out): UCX may still read the buffer.
            let buf = std::mem::take(&mut d.buf);
            self.shared.detached_orphans.borrow_mut().push((send, buf));
        }
        if let Err(e) = result {
            let mut files = wb.files.borrow_mut();
            let f = files.entry(id).or_default();
            f.failed.get_or_insert(e);
        }
    }

    /// The reply to a deferred write, as an ordinary request's would be judged.
    async fn answer(&self, d: &Deferred) -> Result<()> {
        let (index, id) = (d.target.0, d.id);
        let server = self.membership[index].id;
        let timeout = Duration::from_secs_f64(self.config.client.request_timeout_s);
        let shared = &self.shared;
        let wait = async {
            let reply = WaitReply { shared, id }.await;
            reply.map_err(|f| match f {
                ReplyFailure::Malformed(m) => Error::Protocol(m),
                ReplyFailure::Lost(reason) => Error::ServerLost { server, reason },
            })
        };
        let outcome = with_timeout(
            self.runtime.reactor(),
            timeout.saturating_sub(d.issued.elapsed()),
            wait,
        )
        .await;
        let metrics = &self.telemetry.metrics;
        let answered = match outcome {
            Some(_) => self.shared.pending.borrow_mut().remove(&id),
            None => {
                // A late reply is dropped on arrival.
                if let Some(p) = self.shared.pending.borrow_mut().get_mut(&id) {
                    p.cancelled = true;
                }
                None
            }
        };
        let at = answered.and_then(|e| e.replied_at).unwrap_or_else(Instant::now);
        metrics.attempt_done(index, OpKind::Write, ns(at.saturating_duration_since(d.issued)));
        let outcome = outcome.unwrap_or_else(|| {
            metrics.count_timeout(index, OpKind::Write);
            Err(Error::Timeout {
                op: "write",
                server,
                timeout_s: timeout.as_secs_f64(),
            })
        });
        let reply = match outcome {
            Ok(r) => r,
            Err(e) => {
                self.request_failed(index, OpKind::Write, &e);
                return Err(e);
            }
        };
        if reply.op != Op::WriteChunk {
            return Err(Error::Protocol(format!(
                "reply op {:?} to a write request",
                reply.op
            )));
        }
        if reply.status < 0 {
            if reply.status != -libc::EAGAIN {
                metrics.count_error(index, OpKind::Write);
            }
            return Err(Error::Remote {
                server,
                op: "write",
                errno: -reply.status,
            });
        }
        metrics.count_bytes(index, OpKind::Write, d.buf.len() as u64);
        Ok(())
    }
}
