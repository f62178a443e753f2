//! Read-ahead: a handle that reads sequentially (each read starting where its previous one
//! ended) keeps the chunks after its read in flight, so the servers' devices see a queue while
//! the caller consumes what came before. Bounded: `client.read_ahead` bytes in all per client
//! and at most `client.max_inflight` read-ahead requests; never past the size the handle knows.
//!
//! Prefetched bytes are what the servers held after the file was opened (close-to-open, as any
//! read): this client's writes, truncates, unlinks, renames onto the file and its open and close
//! drop them. A read-ahead request that fails or times out is only a hint lost: the bytes are
//! read again by an ordinary request, with its retries.
//!
//! Memory: a read-ahead request's reply lands in a buffer the client owns. Cancelling one
//! whose payload UCX is still receiving moves the buffer to `detached_orphans`, freed once UCX
//! is done; a transport reset frees them only after the old UCX worker is destroyed.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use crate::chunking::split;
use crate::error::{Error, Result};
use crate::placement::Target;
use crate::protocol::{Header, Op};
use crate::runtime::with_timeout;
use crate::telemetry::OpKind;

use super::rpc::{Dest, ReplyFailure, WaitReply};
use super::telemetry::ns;
use super::{Client, FileHandle};

/// A file whose reader has not come back for this long gives its read-ahead to others.
const IDLE: Duration = Duration::from_secs(1);

/// One read-ahead request: `len` bytes of the file from `offset`, within one chunk.
pub(super) struct Prefetch {
    pub(super) offset: u64,
    len: u64,
    id: u64,
    target: Target,
    issued: Instant,
    buf: Box<[u8]>,
    /// Bytes the server returned, once the reply and its payload are in.
    got: Option<u64>,
    /// Set by `release_read_ahead`, which makes the buffer safe to free.
    released: bool,
    /// The file's change count when it was asked for.
    seen: u64,
}

impl Prefetch {
    pub(super) fn end(&self) -> u64 {
        self.offset + self.len
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        if !self.released && self.got.is_none() {
            // Dropped without release (a failed event loop): UCX may still write into the
            // buffer, so it is leaked rather than freed.
            std::mem::forget(std::mem::take(&mut self.buf));
        }
    }
}

#[derive(Default)]
struct FileAhead {
    /// Non-overlapping, by offset.
    entries: BTreeMap<u64, Prefetch>,
    used: Option<Instant>,
}

/// A client's read-ahead: per file id, what is in flight or arrived and not yet read.
#[derive(Default)]
pub(super) struct ReadAhead {
    files: RefCell<HashMap<u128, FileAhead>>,
    /// Bytes of the buffers held.
    bytes: Cell<u64>,
    /// Requests not yet answered.
    inflight: Cell<u32>,
}

/// A part of one read: bytes from the servers, or from a read-ahead request.
pub(super) enum Part {
    Server { chunk: u64, in_chunk: u64 },
    Ahead(Prefetch),
}

impl Client {
    /// Takes out the read-ahead requests overlapping `[from, to)` of `file`, by offset; a read
    /// puts back those it did not consume with [`Client::keep_read_ahead`].
    pub(super) fn take_read_ahead(&self, file: &FileHandle, from: u64, to: u64) -> Vec<Prefetch> {
        let mut files = self.read_ahead.files.borrow_mut();
        let Some(f) = files.get_mut(&file.attr.id.0) else {
            return Vec::new();
        };
        f.used = Some(Instant::now());
        let changes = file.change_count();
        let stale = f.entries.values().any(|p| p.seen != changes);
        if stale {
            // The file changed since these were asked for (through another client too).
            drop(files);
            self.forget_read_ahead(file.attr.id.0);
            return Vec::new();
        }
        let starts: Vec<u64> = f
            .entries
            .range(..to)
            .filter(|(_, p)| p.end() > from)
            .map(|(&o, _)| o)
            .collect();
        starts.into_iter().filter_map(|o| f.entries.remove(&o)).collect()
    }

    /// Puts back a read-ahead request a read used only in part.
    pub(super) fn keep_read_ahead(&self, file: &FileHandle, p: Prefetch) {
        let mut files = self.read_ahead.files.borrow_mut();
        files
            .entry(file.attr.id.0)
            .or_default()
            .entries
            .insert(p.offset, p);
    }

    /// Starts read-ahead requests after a sequential read of `file` that ended at `end`: whole
    /// chunks up to `client.read_ahead` bytes past it (and not past the size the handle knows),
    /// as the budget allows.
    pub(super) fn start_read_ahead(&self, file: &FileHandle, end: u64) {
        let budget = self.config.client.read_ahead;
        let size = file.size();
        if budget == 0 || end >= size {
            return;
        }
        let cs = file.attr.layout.chunk_size.max(1);
        let mut limit = end.saturating_add(budget).min(size);
        if limit < size {
            limit -= limit % cs; // whole chunks: no sliver requests
        }
        let id = file.attr.id.0;
        let placed = file.placed();
        let from = {
            let files = self.read_ahead.files.borrow();
            let last = files
                .get(&id)
                .and_then(|f| f.entries.values().next_back().map(Prefetch::end));
            last.map_or(end, |l| l.max(end))
        };
        if limit <= from {
            return;
        }
        self.free_idle_read_ahead(id);
        for piece in split(from, limit - from, cs) {
            let ra = &self.read_ahead;
            if ra.bytes.get() + piece.len > budget || ra.inflight.get() >= self.config.client.max_inflight {
                break;
            }
            let offset = from + piece.buf_offset;
            let target = self.route(&placed, piece.chunk);
            let mut buf = vec![0u8; piece.len as usize].into_boxed_slice();
            let dest = Dest {
                ptr: buf.as_mut_ptr(),
                len: buf.len(),
            };
            let header = Header::request(
                Op::ReadChunk,
                0,
                placed.data_id(),
                piece.chunk,
                piece.offset,
                piece.len,
            );
            // SAFETY: the buffer lives in the Prefetch until `release_read_ahead` (or a
            // transport reset) says UCX is done with it; a header-only send reads nothing else.
            let Ok((request, _send)) = (unsafe { self.send_detached(target, header, &[], Some(dest)) })
            else {
                break; // a lost server: the reads ask it themselves
            };
            self.telemetry.metrics.attempt_sent(target.0, OpKind::Read, false);
            ra.bytes.set(ra.bytes.get() + piece.len);
            ra.inflight.set(ra.inflight.get() + 1);
            let p = Prefetch {
                offset,
                len: piece.len,
                id: request,
                target,
                issued: Instant::now(),
                buf,
                got: None,
                released: false,
                seen: file.change_count(),
            };
            let mut files = ra.files.borrow_mut();
            let f = files.entry(id).or_default();
            f.used = Some(Instant::now());
            f.entries.insert(offset, p);
        }
    }

    /// Everything read ahead, for a transport reset to free once the old UCX worker is gone
    /// (nothing can write into the buffers then).
    pub(super) fn take_all_read_ahead(&self) -> Vec<Prefetch> {
        let ra = &self.read_ahead;
        ra.bytes.set(0);
        ra.inflight.set(0);
        let files = std::mem::take(&mut *ra.files.borrow_mut());
        let mut all: Vec<Prefetch> = files
            .into_values()
            .flat_map(|f| f.entries.into_values())
            .collect();
        for p in &mut all {
            if p.got.is_none() {
                self.telemetry
                    .metrics
                    .attempt_done(p.target.0, OpKind::Read, ns(p.issued.elapsed()));
            }
            p.released = true;
        }
        all
    }

    /// Frees the read-ahead of files other than `keep` whose readers stopped coming back.
    fn free_idle_read_ahead(&self, keep: u128) {
        let idle: Vec<u128> = self
            .read_ahead
            .files
            .borrow()
            .iter()
            .filter(|(&id, f)| id != keep && f.used.is_none_or(|t| t.elapsed() >= IDLE))
            .map(|(&id, _)| id)
            .collect();
        for id in idle {
            self.forget_read_ahead(id);
        }
    }

    /// Waits for a read-ahead request's reply and payload; Err if it failed in any way (the
    /// caller then reads those bytes with an ordinary request).
    pub(super) async fn finish_read_ahead(&self, p: &mut Prefetch) -> Result<u64> {
        if let Some(got) = p.got {
            return Ok(got);
        }
        let timeout = Duration::from_secs_f64(self.config.client.request_timeout_s);
        let left = timeout.saturating_sub(p.issued.elapsed());
        let shared = &self.shared;
        let id = p.id;
        let wait = async {
            let reply = WaitReply { shared, id }.await;
            // The receive stays in the pending entry while it runs: abandoned by a timeout,
            // it is still found there by `release_read_ahead`.
            let received = std::future::poll_fn(|cx| {
                let mut pending = shared.pending.borrow_mut();
                match pending.get_mut(&id).and_then(|e| e.data.as_mut()) {
                    Some(data) => Pin::new(data).poll(cx).map(Some),
                    None => Poll::Ready(None),
                }
            })
            .await;
            if let Some(Err(e)) = received {
                return Err(Error::Protocol(e.to_string()));
            }
            reply.map_err(|f| match f {
                ReplyFailure::Malformed(m) | ReplyFailure::Lost(m) => Error::Protocol(m),
            })
        };
        let reply = with_timeout(self.runtime.reactor(), left, wait)
            .await
            .unwrap_or_else(|| Err(Error::Protocol("read-ahead timed out".into())))?;
        let answered = self.shared.pending.borrow_mut().remove(&id);
        self.read_ahead.inflight.set(self.read_ahead.inflight.get() - 1);
        let at = answered.and_then(|e| e.replied_at).unwrap_or_else(Instant::now);
        let metrics = &self.telemetry.metrics;
        metrics.attempt_done(
            p.target.0,
            OpKind::Read,
            ns(at.saturating_duration_since(p.issued)),
        );
        if reply.op != Op::ReadChunk || reply.status < 0 {
            p.got = Some(0);
            return Err(Error::Protocol("read-ahead refused".into()));
        }
        let got = reply.length.min(p.len);
        metrics.count_bytes(p.target.0, OpKind::Read, got);
        p.got = Some(got);
        Ok(got)
    }

    /// Copies `p`'s bytes for `[from, from + dest.len())` into `dest` (holes as zeros).
    pub(super) fn copy_read_ahead(p: &Prefetch, from: u64, dest: &mut [u8]) {
        let start = (from - p.offset) as usize;
        let got = p.got.unwrap_or(0) as usize;
        let have = got.saturating_sub(start).min(dest.len());
        dest[..have].copy_from_slice(&p.buf[start..start + have]);
        dest[have..].fill(0);
    }

    /// Lets go of a read-ahead request: answered or not, its buffer is freed as soon as UCX
    /// can no longer write into it.
    pub(super) fn release_read_ahead(&self, mut p: Prefetch) {
        p.released = true;
        let ra = &self.read_ahead;
        ra.bytes.set(ra.bytes.get() - p.len);
        if p.got.is_some() {
            return;
        }
        ra.inflight.set(ra.inflight.get() - 1);
        self.telemetry
            .metrics
            .attempt_done(p.target.0, OpKind::Read, ns(p.issued.elapsed()));
        let mut pending = self.shared.pending.borrow_mut();
        let Some(entry) = pending.get_mut(&p.id) else {
            return; // its worker was reset: nothing refers to the buffer
        };
        if entry.replied_at.is_none() {
            // Not answered yet: the reply, if it comes, is dropped without a receive.
            entry.cancelled = true;
            entry.dest = None;
            return;
        }
        let data = pending.remove(&p.id).and_then(|e| e.data);
        if let Some(data) = data.filter(|d| !d.is_done()) {
            let buf = std::mem::take(&mut p.buf);
            self.shared.detached_orphans.borrow_mut().push((data, buf));
        }
    }

    /// Drops what is read ahead of file `id` (its bytes changed or may have).
    /// Drops what this client read ahead of `file`: its bytes are about to change by another
    /// way than this client (a mapping or a program run through a mount of BenchFS).
    pub fn forget_cached(&self, file: &FileHandle) {
        self.forget_read_ahead(file.attr.id.0);
    }

    pub(super) fn forget_read_ahead(&self, id: u128) {
        let gone = self.read_ahead.files.borrow_mut().remove(&id);
        for p in gone.into_iter().flat_map(|f| f.entries.into_values()) {
            self.release_read_ahead(p);
        }
    }

    /// Splits `[offset, offset + n)` into the parts a read is made of: the read-ahead
    /// requests `ahead` (sorted, overlapping the range) where they cover it, chunk pieces
    /// from the servers elsewhere. Each part comes with its file offset and length.
    pub(super) fn read_parts(
        &self,
        file: &FileHandle,
        offset: u64,
        n: u64,
        ahead: Vec<Prefetch>,
    ) -> Vec<(u64, u64, Part)> {
        let cs = file.attr.layout.chunk_size.max(1);
        let end = offset + n;
        let mut parts = Vec::new();
        let mut pos = offset;
        let server = |parts: &mut Vec<(u64, u64, Part)>, from: u64, to: u64| {
            for piece in split(from, to.saturating_sub(from), cs) {
                let part = Part::Server {
                    chunk: piece.chunk,
                    in_chunk: piece.offset,
                };
                parts.push((from + piece.buf_offset, piece.len, part));
            }
        };
        for p in ahead {
            let start = p.offset.max(pos);
            server(&mut parts, pos, start);
            let stop = p.end().min(end);
            parts.push((start, stop - start, Part::Ahead(p)));
            pos = stop;
        }
        server(&mut parts, pos, end);
        parts
    }
}
