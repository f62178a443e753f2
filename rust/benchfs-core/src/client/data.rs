//! The data path: reads and writes split into chunk requests (at most `client.max_inflight`
//! in flight), fsync, and the removal of a file's chunks.

use std::time::Instant;

use futures::stream::{self, StreamExt};

use crate::chunking::split;
use crate::error::{Error, Result};
use crate::namespace::{Attr, Kind};
use crate::protocol::{Header, Op, CHECKSUM_LEN};
use crate::telemetry::OpKind;

use super::readahead::Part;
use super::{Client, FileHandle};

/// A file's checksum: the xxh3-128 of each chunk-aligned range, `[i * chunk_size, (i + 1) *
/// chunk_size)` cut at `size`, in order (none for an empty file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileChecksum {
    pub size: u64,
    pub chunk_size: u64,
    pub chunks: Vec<u128>,
}

impl Client {
    /// Writes `data` at `offset` of an open file; returns the bytes written.
    pub fn write(&self, file: &FileHandle, offset: u64, data: &[u8]) -> Result<usize> {
        let _call = self.telemetry_call(OpKind::Write);
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or_else(|| Error::InvalidArgument("offset + length overflows".into()))?;
        self.forget_read_ahead(file.attr.id.0);
        if file.placed().layout.inline && self.run(self.write_inline(file, offset, data))? {
            if !data.is_empty() {
                // The owner has the size already: a close has nothing to report.
                file.written_end.set(file.written_end.get().max(end));
                file.reported_end.set(file.reported_end.get().max(end));
                file.changed();
            }
            return Ok(data.len());
        }
        let placed = file.placed();
        let attr = &placed;
        let window = self.config.client.max_inflight as usize;
        // A file of several copies is written through: each write is answered when every live
        // copy has it.
        if self.config.client.write_behind > 0 && attr.layout.replicas <= 1 {
            file.behind.set(true);
            self.run(self.write_behind(file, offset, data))?;
            if !data.is_empty() {
                file.written_end.set(file.written_end.get().max(end));
                file.changed();
            }
            return Ok(data.len());
        }
        let written = self.run(async {
            let ready = Instant::now();
            let calls = split(offset, data.len() as u64, attr.layout.chunk_size).map(|p| async move {
                let header = Header::request(Op::WriteChunk, 0, attr.data_id(), p.chunk, p.offset, p.len);
                let part = &data[p.buf_offset as usize..(p.buf_offset + p.len) as usize];
                if attr.layout.replicas <= 1 {
                    return self
                        .call(self.route(attr, p.chunk), header, part, None, ready)
                        .await;
                }
                let copies = self.copies(attr, p.chunk);
                Ok(self.change_copies(copies, header, part, ready, false).await?.0)
            });
            let mut results = stream::iter(calls).buffer_unordered(window);
            let mut written = 0u64;
            while let Some(r) = results.next().await {
                written += r?.length;
            }
            Ok(written as usize)
        })?;
        if !data.is_empty() {
            file.written_end.set(file.written_end.get().max(end));
            file.changed();
        }
        Ok(written)
    }

    /// Reads into `buf` from `offset`; returns the bytes read, short only at the end of the
    /// file. Holes inside the file read as zeros. The size is the one seen at open plus this
    /// handle's writes (close-to-open); a read reaching past it asks the owner once more.
    pub fn read(&self, file: &FileHandle, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let _call = self.telemetry_call(OpKind::Read);
        if file.placed().layout.inline {
            if let Some(n) = self.run(self.read_inline(file, offset, buf))? {
                file.next_read.set(offset + n as u64);
                return Ok(n);
            }
        }
        let n = self.readable(file, offset, buf.len())?;
        let end = offset + n as u64;
        let sequential = offset == file.next_read.get();
        file.next_read.set(end);
        let placed = file.placed();
        let attr = &placed;
        let window = self.config.client.max_inflight as usize;
        self.run(async {
            let ready = Instant::now();
            let ahead = self.take_read_ahead(file, offset, end);
            if sequential {
                // Before this read's own requests: the next chunks' device time overlaps it.
                self.start_read_ahead(file, end);
            }
            let mut rest = &mut buf[..n];
            let mut calls = Vec::new();
            for (from, len, part) in self.read_parts(file, offset, n as u64, ahead) {
                let (head, tail) = std::mem::take(&mut rest).split_at_mut(len as usize);
                rest = tail;
                calls.push(async move {
                    let server = match part {
                        Part::Server { chunk, in_chunk } => (chunk, in_chunk),
                        Part::Ahead(mut p) => {
                            if self.finish_read_ahead(&mut p).await.is_ok() {
                                Self::copy_read_ahead(&p, from, head);
                                if p.end() > end {
                                    self.keep_read_ahead(file, p);
                                } else {
                                    self.release_read_ahead(p);
                                }
                                return Ok(());
                            }
                            // A lost hint: read these bytes as any others.
                            self.release_read_ahead(p);
                            let cs = attr.layout.chunk_size.max(1);
                            (from / cs, from % cs)
                        }
                    };
                    let header = Header::request(Op::ReadChunk, 0, attr.data_id(), server.0, server.1, len);
                    let reply = self.read_copies(attr, header, Some(&mut *head), ready).await?;
                    let got = (reply.length as usize).min(head.len());
                    // Never-written ranges inside the size are holes.
                    head[got..].fill(0);
                    Ok::<(), Error>(())
                });
            }
            let mut results = stream::iter(calls).buffer_unordered(window);
            let mut failed = None;
            while let Some(r) = results.next().await {
                // Every part runs to its end, so no read-ahead request is left half taken.
                if let Err(e) = r {
                    failed.get_or_insert(e);
                }
            }
            failed.map_or(Ok(()), Err)
        })?;
        Ok(n)
    }

    /// The bytes a read of `len` at `offset` returns: up to the size this handle knows, asked
    /// of the owner once more when the read reaches past it; this client's writes behind of
    /// the file settled first (it reads its own writes).
    fn readable(&self, file: &FileHandle, offset: u64, len: usize) -> Result<usize> {
        let mut size = file.size();
        if offset.saturating_add(len as u64) > size {
            let attr = self.stat(&file.path)?;
            if attr.id == file.attr.id {
                file.known_size.set(file.known_size.get().max(attr.size));
                size = file.size();
            }
        }
        if self.writes_behind(file.attr.id.0) {
            self.run(self.settle_file(file.attr.id.0, false))?;
        }
        Ok(size.saturating_sub(offset).min(len as u64) as usize)
    }

    /// As [`Client::read`] from a chunk-aligned `offset` (no read-ahead), and with the bytes
    /// the xxh3-128 of each chunk part of them (cut at chunk boundaries, in order), as the
    /// servers read them from their stores, hashed in the buffers they sent them from: the
    /// bytes and [`Client::checksum_file`]'s ranges in one pass over the servers' devices.
    pub fn read_hashed(&self, file: &FileHandle, offset: u64, buf: &mut [u8]) -> Result<(usize, Vec<u128>)> {
        let _call = self.telemetry_call(OpKind::Read);
        let cs = file.attr.layout.chunk_size.max(1);
        let misaligned = || {
            Err(Error::InvalidArgument(format!(
                "a hashed read starts at a chunk boundary (every {cs} bytes), not at {offset}"
            )))
        };
        if file.placed().layout.inline {
            // The owner's record is the store: the bytes, hashed here as they arrived.
            if let Some(n) = self.run(self.read_inline(file, offset, buf))? {
                if n > 0 && !offset.is_multiple_of(cs) {
                    return misaligned();
                }
                return Ok((n, super::inline::range_hashes(&buf[..n], cs)));
            }
        }
        let n = self.readable(file, offset, buf.len())?;
        // At the end of the file, as a read: nothing (from wherever the last read ended).
        if n > 0 && !offset.is_multiple_of(cs) {
            return misaligned();
        }
        let placed = file.placed();
        let attr = &placed;
        let window = self.config.client.max_inflight as usize;
        let hashes = self.run(async {
            let ready = Instant::now();
            let mut rest = &mut buf[..n];
            let mut calls = Vec::new();
            for (i, p) in split(offset, n as u64, cs).enumerate() {
                let (head, tail) = std::mem::take(&mut rest).split_at_mut(p.len as usize);
                rest = tail;
                calls.push(async move {
                    let header = Header::request(Op::ReadHashed, 0, attr.data_id(), p.chunk, p.offset, p.len);
                    let reply = self.read_copies(attr, header, Some(&mut *head), ready).await?;
                    let got = (reply.length as usize).min(head.len());
                    // Never-written ranges inside the size are holes (hashed as zeros too).
                    head[got..].fill(0);
                    Ok::<_, Error>((i, reply.file_id))
                });
            }
            let mut hashes = vec![0u128; calls.len()];
            let mut results = stream::iter(calls).buffer_unordered(window);
            let mut failed = None;
            while let Some(r) = results.next().await {
                match r {
                    Ok((i, hash)) => hashes[i] = hash,
                    Err(e) => {
                        failed.get_or_insert(e);
                    }
                }
            }
            failed.map_or(Ok(hashes), Err)
        })?;
        Ok((n, hashes))
    }

    /// Waits until every write of this file made through this client is on its servers
    /// (write-behind, `client.write_behind`); returns the first of them that failed.
    pub fn flush(&self, file: &FileHandle) -> Result<()> {
        if !self.writes_behind(file.attr.id.0) {
            file.behind.set(false);
            return Ok(());
        }
        let _call = self.telemetry_call(OpKind::Write);
        let settled = self.run(self.settle_file(file.attr.id.0, true));
        file.behind.set(false);
        settled
    }

    /// Makes this file's bytes durable on the servers holding them, then reports its size.
    pub fn fsync(&self, file: &FileHandle) -> Result<()> {
        let _call = self.telemetry_call(OpKind::Fsync);
        self.flush(file)?;
        let placed = file.placed();
        let targets = self.data_targets(&placed, 0, file.size());
        self.run(self.to_targets(Op::Fsync, &placed, targets, 0))?;
        self.report_size(file)
    }

    /// The xxh3-128 of each chunk-aligned range of the file at `path` (links followed, its
    /// size as its metadata owner knows it), as the servers holding them read them back from
    /// their stores: the ranges of every server are hashed at once, at most
    /// `client.max_inflight` requests in flight. This client's writes behind of the file are
    /// waited for first.
    pub fn checksum(&self, path: &str) -> Result<FileChecksum> {
        let _call = self.telemetry_call(OpKind::Read);
        let path = self.checked("checksum", path)?;
        self.run(self.through_links("checksum", &path, true, |path| async move {
            let attr = self.lookup(&path).await?;
            if attr.kind != Kind::File {
                let errno = match attr.kind {
                    Kind::Dir => libc::EISDIR,
                    // A link in the last place: followed (through_links resolves it).
                    _ => libc::ELOOP,
                };
                return Err(Error::Path {
                    op: "checksum",
                    path,
                    errno,
                });
            }
            self.checksum_of(&path, &attr, attr.size).await
        }))
    }

    /// As [`Client::checksum`], for an open file: its size as this handle knows it (the
    /// owner's at open and its own writes), so no lookup is needed.
    pub fn checksum_file(&self, file: &FileHandle) -> Result<FileChecksum> {
        let _call = self.telemetry_call(OpKind::Read);
        self.run(self.checksum_of(&file.path, &file.placed(), file.size()))
    }

    async fn checksum_of(&self, path: &str, attr: &Attr, size: u64) -> Result<FileChecksum> {
        if self.writes_behind(attr.id.0) {
            self.settle_file(attr.id.0, true).await?;
        }
        let cs = attr.layout.chunk_size.max(1);
        let (attr, size) = if attr.layout.inline {
            // The owner's record is the store: its bytes, hashed here as they arrived.
            let (now, bytes) = self.inline_bytes("checksum", path, attr.id.0).await?;
            if now.layout.inline {
                return Ok(FileChecksum {
                    size: bytes.len() as u64,
                    chunk_size: cs,
                    chunks: super::inline::range_hashes(&bytes, cs),
                });
            }
            (now, now.size.max(size))
        } else {
            (*attr, size)
        };
        let attr = &attr;
        let count = size.div_ceil(cs);
        let window = self.config.client.max_inflight as usize;
        let ready = Instant::now();
        let calls = (0..count).map(|chunk| async move {
            let len = (size - chunk * cs).min(cs);
            let header = Header::request(Op::Checksum, 0, attr.data_id(), chunk, 0, len);
            let mut d = [0u8; CHECKSUM_LEN];
            let reply = self.read_copies(attr, header, Some(&mut d[..]), ready).await?;
            if reply.length as usize != CHECKSUM_LEN {
                return Err(Error::Protocol(format!(
                    "checksum reply of {} bytes, not {CHECKSUM_LEN}",
                    reply.length
                )));
            }
            let digest = u128::from_le_bytes(d);
            Ok::<_, Error>((chunk, digest))
        });
        let mut results = stream::iter(calls).buffer_unordered(window);
        let mut chunks = vec![0u128; count as usize];
        while let Some(r) = results.next().await {
            let (chunk, digest) = r?;
            chunks[chunk as usize] = digest;
        }
        Ok(FileChecksum {
            size,
            chunk_size: cs,
            chunks,
        })
    }

    /// A request whose reply carries a stored range's xxh3-128 (checksum, write_checked).
    pub(super) async fn call_for_digest(
        &self,
        target: (usize, usize),
        header: Header,
        payload: &[u8],
        ready: Instant,
    ) -> Result<u128> {
        let mut digest = [0u8; CHECKSUM_LEN];
        let reply = self
            .call(target, header, payload, Some(&mut digest[..]), ready)
            .await?;
        if reply.length as usize != CHECKSUM_LEN {
            return Err(Error::Protocol(format!(
                "{} reply of {} bytes, not {CHECKSUM_LEN}",
                header.op.name(),
                reply.length
            )));
        }
        Ok(u128::from_le_bytes(digest))
    }

    /// The (server, worker) pairs holding the chunks (every copy) of `attr`'s bytes in
    /// `[from, to)`.
    pub(super) fn data_targets(&self, attr: &Attr, from: u64, to: u64) -> Vec<(usize, usize)> {
        if attr.layout.inline {
            // Its bytes are with its inode: it has no chunks.
            return Vec::new();
        }
        let cs = attr.layout.chunk_size.max(1);
        let (first, last) = (from / cs, to.div_ceil(cs));
        let stripe = attr.layout.stripe_count as usize;
        let copies = attr.layout.replicas.max(1) as u64;
        let mut targets: Vec<(usize, usize)> = if last - first > (stripe * self.workers(0) * 4) as u64 {
            (0..stripe)
                .filter(|&s| copies == 1 || !self.is_declared(s))
                .flat_map(|s| (0..self.workers(s)).map(move |w| (s, w)))
                .collect()
        } else {
            (first..last).flat_map(|c| self.copies(attr, c)).collect()
        };
        targets.sort_unstable();
        targets.dedup();
        targets
    }

    /// Sends a header-only request about `attr`'s file to each target.
    pub(super) async fn to_targets(
        &self,
        op: Op,
        attr: &Attr,
        targets: Vec<(usize, usize)>,
        length: u64,
    ) -> Result<()> {
        let window = self.config.client.max_inflight as usize;
        let ready = Instant::now();
        let header = Header::request(op, 0, attr.data_id(), 0, 0, length);
        if attr.layout.replicas > 1 {
            // Each target holds copies whose others are elsewhere: one gone is declared lost.
            let calls = targets
                .into_iter()
                .map(|t| self.change_copies(vec![t], header, &[], ready, false));
            let mut results = stream::iter(calls).buffer_unordered(window);
            let (mut took, mut fault) = (false, None);
            while let Some(r) = results.next().await {
                match r {
                    Ok(_) => took = true,
                    Err(e) if super::replicas::is_fault(&e) => {
                        fault.get_or_insert(e);
                    }
                    Err(e) => return Err(e),
                }
            }
            return match fault {
                Some(e) if !took => Err(e),
                _ => Ok(()),
            };
        }
        let calls = targets
            .into_iter()
            .map(|t| self.call(t, header, &[], None, ready));
        let mut results = stream::iter(calls).buffer_unordered(window);
        while let Some(r) = results.next().await {
            r?;
        }
        Ok(())
    }

    /// Frees `attr`'s bytes at and beyond `size`, up to `old_size`, on the servers holding them.
    pub(super) async fn free_data(&self, attr: &Attr, size: u64, old_size: u64) -> Result<()> {
        if old_size <= size {
            return Ok(());
        }
        let targets = self.data_targets(attr, size, old_size);
        self.to_targets(Op::TruncateData, attr, targets, size).await
    }
}
