//! Serving a request, once a service task took it from the queue: running it (chunk writes,
//! reads, checksums, truncates and fsyncs against the chunk store, and statfs, here; lock and
//! metadata requests are handed to `locks` and `metadata`), accounting for it (telemetry and
//! trace), and replying. Transfers with the client (a rendezvous payload, the reply) wait through
//! `with_client` of `connections`, which leaves a stuck one to UCX with its memory parked.

use std::rc::Rc;
use std::time::Instant;

use benchfs_ucx::{Endpoint, RndvDesc};

use crate::buffer::{IoBuffer, ALIGN};
use crate::chunking::FileId;
use crate::protocol::capacity::Capacity;
use crate::protocol::lock;
use crate::protocol::{is_server_fault, Header, Op, ReplyValue, AM_REPLY};
use crate::telemetry::{OpKind, TraceRecord, TRACE_FLAG_ERROR};

use super::intake::{Incoming, Payload};
use super::ServerState;

/// Zeros hashed for the never-written bytes of a checksum's range.
static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];

/// The xxh3-128 of `stored` followed by zeros up to `len` bytes: a range as a read gives it
/// (never-written bytes are zeros).
fn hash_padded(stored: &[u8], len: usize) -> u128 {
    if stored.len() >= len {
        // One pass over one slice: faster than the streaming state.
        return xxhash_rust::xxh3::xxh3_128(&stored[..len]);
    }
    let mut hash = xxhash_rust::xxh3::Xxh3::new();
    hash.update(stored);
    let mut left = len - stored.len();
    while left > 0 {
        let zeros = left.min(ZEROS.len());
        hash.update(&ZEROS[..zeros]);
        left -= zeros;
    }
    hash.digest128()
}

/// What running a request gave: its status (0 or -errno), its byte count, the data a read
/// returns (its buffer and where the data starts in it) or a metadata reply (its value and
/// body), and when the storage operation started (queue wait ends there).
#[derive(Default)]
pub(super) struct Served {
    pub(super) status: i32,
    count: u64,
    data: Option<(IoBuffer, usize)>,
    pub(super) meta: Option<(ReplyValue, Vec<u8>)>,
    device_start: Option<Instant>,
    /// Answered later (a lock request waiting for its lock): no reply now.
    pub(super) deferred: bool,
    /// With copies of the metadata: the sequence number and length of the changes the
    /// metadata reply ends with (the reply's `file_id` carries them with the record's epoch).
    changes: Option<(u64, u64)>,
    /// A hashed read's hash of the range it read (the reply's `file_id` carries it).
    read_hash: Option<u128>,
}

impl ServerState {
    /// Serves one request: runs it, accounts for it (telemetry, trace), and replies.
    pub(super) async fn serve_one(&self, req: Incoming) {
        let Incoming {
            header: h,
            payload,
            conn,
            arrived,
        } = req;
        let served = self.run(&h, payload, &conn).await;
        let time = self.account(&h, arrived, &served);
        if !served.deferred {
            self.reply(&h, &conn, served, time).await;
        }
    }

    /// Receives a rendezvous payload into `target` (memory owned by `owner`, registered as
    /// `memh` if at all). Gives `owner` back, or None if the client failed to send (the memory
    /// is parked when UCX may still write it).
    ///
    /// # Safety
    /// `target` points into `owner`'s memory and stays valid while `owner` lives.
    async unsafe fn receive<B: 'static>(
        &self,
        desc: RndvDesc,
        owner: B,
        target: *mut [u8],
        memh: Option<*const benchfs_ucx::MemHandle>,
    ) -> Option<B> {
        // SAFETY: the descriptor was kept by the handler and is used once; `target` is valid
        // while `owner` lives (the caller's contract), and `owner` lives until the receive
        // completes: returned, or parked with the stuck operation.
        let recv = unsafe { self.worker.recv_data(desc, &mut *target, memh.map(|m| &*m)) };
        match self.with_client(recv).await {
            Ok(_) => Some(owner),
            Err(stuck) => {
                if let Some(op) = stuck {
                    self.park(op, Box::new(owner), "a request's payload from a client");
                }
                None
            }
        }
    }

    /// Runs a request against the store or the metadata: its status, count and reply data.
    async fn run(&self, h: &Header, payload: Payload, conn: &Rc<Endpoint>) -> Served {
        let file = FileId(h.file_id);
        let len = h.length as usize;
        let errno = |e: std::io::Error| -e.raw_os_error().unwrap_or(libc::EIO);
        let mut served = Served::default();
        match h.op {
            Op::WriteChunk | Op::WriteChecked | Op::WriteHashed => {
                let buf = match payload {
                    Payload::Eager(v) => Some((IoBuffer::Heap(v), 0)),
                    Payload::None => Some((IoBuffer::empty(), 0)),
                    Payload::Rendezvous(desc) => {
                        let mut buf = self.pool.acquire().await;
                        // Mirror the file's alignment so direct I/O can take the aligned middle.
                        let start = (h.offset % ALIGN as u64) as usize;
                        // The registration lives in the pool, which `buf` keeps alive.
                        let memh = buf.memh().map(|m| m as *const benchfs_ucx::MemHandle);
                        let target: *mut [u8] = &mut buf.as_mut_slice(start + len)[start..];
                        // SAFETY: `target` is inside `buf`, which `receive` keeps alive.
                        unsafe { self.receive(desc, buf, target, memh) }
                            .await
                            .map(|buf| (buf, start))
                    }
                };
                match buf {
                    None => served.status = -libc::ECOMM,
                    Some(_) if len == 0 => {}
                    Some((buf, start)) => {
                        // The bytes as received, hashed in the buffer the store writes from.
                        let received = (h.op == Op::WriteHashed)
                            .then(|| xxhash_rust::xxh3::xxh3_128(&buf.as_slice(start + len)[start..]));
                        served.device_start = Some(Instant::now());
                        match self.store.write(file, h.chunk, h.offset, buf, start, len).await {
                            (Ok(n), _) => served.count = n as u64,
                            (Err(e), _) => served.status = errno(e),
                        }
                        if let (Some(d), 0) = (received, served.status) {
                            if served.count == len as u64 {
                                served.meta = Some((ReplyValue::Nothing, d.to_le_bytes().to_vec()));
                            } else {
                                served.status = -libc::EIO;
                            }
                        }
                        // The write's buffer is back in the pool before the read-back takes one.
                        if h.op == Op::WriteChecked && served.status == 0 {
                            self.answer_checksum(file, h, &mut served).await;
                        }
                    }
                }
            }
            Op::ReadChunk | Op::ReadHashed => {
                let buf = self.pool.acquire().await;
                served.device_start = Some(Instant::now());
                match self.store.read(file, h.chunk, h.offset, buf, len).await {
                    (Ok((skip, n)), buf) => {
                        if h.op == Op::ReadHashed {
                            served.read_hash = Some(hash_padded(&buf.as_slice(skip + n)[skip..], len));
                        }
                        served.count = n as u64;
                        served.data = Some((buf, skip));
                    }
                    (Err(e), _) => served.status = errno(e),
                }
            }
            Op::Checksum => {
                served.device_start = Some(Instant::now());
                self.answer_checksum(file, h, &mut served).await;
            }
            Op::TruncateData => {
                served.device_start = Some(Instant::now());
                if let Err(e) = self.store.truncate(file, h.length, self.chunk_size) {
                    served.status = errno(e);
                }
            }
            Op::Fsync => {
                served.device_start = Some(Instant::now());
                if let Err(e) = self.store.fsync(file).await {
                    served.status = errno(e);
                }
            }
            Op::Lock => {
                let request = match payload {
                    Payload::Eager(v) => lock::LockRequest::decode(&v).ok(),
                    _ => None,
                };
                served.device_start = Some(Instant::now());
                match request {
                    Some(req) => self.serve_lock(h, req, conn, &mut served),
                    None => served.status = -libc::EINVAL,
                }
            }
            Op::Statfs => {
                let inodes = self.meta.borrow().len() as u64;
                match Capacity::of_dir(&self.data_dir, inodes) {
                    Ok(c) => served.meta = Some((ReplyValue::Nothing, c.encode())),
                    Err(e) => served.status = errno(e),
                }
            }
            _ => {
                let request = match payload {
                    Payload::Eager(v) => Some(v),
                    Payload::None => Some(Vec::new()),
                    Payload::Rendezvous(desc) => {
                        let mut v = vec![0u8; len];
                        let target: *mut [u8] = &mut v[..];
                        // SAFETY: `target` is `v`'s heap memory, which `receive` keeps alive
                        // (moving a Vec does not move its buffer).
                        unsafe { self.receive(desc, v, target, None) }.await
                    }
                };
                served.device_start = Some(Instant::now());
                let (mut status, value, body, changes) = match request {
                    Some(bytes) => self.serve_meta(h, &bytes),
                    None => (-libc::ECOMM, ReplyValue::Nothing, Vec::new(), None),
                };
                // Answered only once what it changed, or saw changed, is stored.
                if !self.metadata_committed().await && status >= 0 {
                    status = -libc::EIO;
                }
                served.status = status;
                served.meta = Some((value, body));
                served.changes = changes;
            }
        }
        served
    }

    /// Answers with the xxh3-128 of the request's range of its chunk as the store reads it
    /// back (never-written bytes count as zeros, as a read gives them), or its error.
    async fn answer_checksum(&self, file: FileId, h: &Header, served: &mut Served) {
        match self
            .stored_checksum(file, h.chunk, h.offset, h.length as usize)
            .await
        {
            Ok(d) => served.meta = Some((ReplyValue::Nothing, d.to_le_bytes().to_vec())),
            Err(status) => served.status = status,
        }
    }

    async fn stored_checksum(
        &self,
        file: FileId,
        chunk: u64,
        offset: u64,
        len: usize,
    ) -> std::result::Result<u128, i32> {
        let buf = self.pool.acquire().await;
        match self.store.read(file, chunk, offset, buf, len).await {
            (Ok((skip, n)), buf) => Ok(hash_padded(&buf.as_slice(skip + n)[skip..], len)),
            (Err(e), _) => Err(-e.raw_os_error().unwrap_or(libc::EIO)),
        }
    }

    /// Records a served request in the worker's telemetry and (with `telemetry.trace`) its
    /// trace ring. Returns its time here, as data replies carry it.
    fn account(&self, h: &Header, arrived: Instant, served: &Served) -> ReplyValue {
        let done = Instant::now();
        let started = served.device_start.unwrap_or(done);
        let ns = |d: std::time::Duration| d.as_nanos() as u64;
        let kind = OpKind::of(h.op);
        let moved = if h.op.moves_data() { served.count } else { 0 };
        // Device time starts when the operation is handed to the store.
        let (queue_ns, device_ns, total_ns) = (
            ns(started.saturating_duration_since(arrived)),
            ns(done.saturating_duration_since(started)),
            ns(done.saturating_duration_since(arrived)),
        );
        let ok = !is_server_fault(served.status);
        self.metrics
            .record_op(kind, queue_ns, device_ns, total_ns, moved, ok);
        if let Some(ring) = &self.trace {
            let (base, base_unix) = self.clock_base;
            let record = TraceRecord {
                t_ns: base_unix.wrapping_add(ns(arrived.saturating_duration_since(base))),
                queue_ns,
                device_ns,
                total_ns,
                file: h.file_id,
                chunk: h.chunk,
                bytes: moved,
                server: self.server_id,
                worker: self.worker_index,
                op: kind as u8,
                flags: if ok { 0 } else { TRACE_FLAG_ERROR },
            };
            if !ring.push(&record) {
                self.metrics.count_trace_dropped();
            }
        }
        let us = |ns: u64| u32::try_from(ns / 1000).unwrap_or(u32::MAX);
        ReplyValue::Served {
            queue_us: us(queue_ns),
            total_us: us(total_ns),
        }
    }

    /// Sends the reply: the header (a data reply carrying `time`, the server's time for it),
    /// then read data or a metadata body as its payload.
    async fn reply(&self, h: &Header, conn: &Endpoint, served: Served, time: ReplyValue) {
        let Served {
            status,
            count,
            data,
            meta,
            changes,
            read_hash,
            ..
        } = served;
        let data_op = h.op.moves_data();
        let mut reply = match &meta {
            // A checked write's hash: a data reply all the same (the server's time with it).
            Some((_, body)) if data_op => h.reply(status, body.len() as u64).with_value(time),
            Some((value, body)) => h.reply(status, body.len() as u64).with_value(*value),
            None if data_op => h.reply(status, count).with_value(time),
            None => h.reply(status, count),
        };
        if let (Some((seq, len)), Some(copies)) = (changes, &self.copies) {
            reply.file_id = ((copies.epoch() as u128) << 64) | seq as u128;
            reply.chunk = len;
        }
        if let Some(hash) = read_hash {
            reply.file_id = hash;
        }
        let payload: &[u8] = match (&data, &meta) {
            (Some((buf, skip)), _) => &buf.as_slice(skip + count as usize)[*skip..],
            (None, Some((_, body))) => body,
            _ => &[],
        };
        let memh = data.as_ref().and_then(|(buf, _)| buf.memh());
        // SAFETY: `data` (the payload's owner) lives until the send completes, or is parked
        // with it below.
        let sent = unsafe { conn.send_am(AM_REPLY, &reply.encode(), payload, memh) };
        // A reply that cannot be sent means the client is gone; it will not read the result.
        match self.with_client(sent).await {
            Ok(_) => {}
            Err(None) => self.metrics.count_undelivered(),
            Err(Some(op)) => self.park(
                op,
                Box::new((data, meta)),
                &format!(
                    "the reply to {} request {} on connection {}",
                    h.op.name(),
                    h.request_id,
                    h.client
                ),
            ),
        }
    }
}
