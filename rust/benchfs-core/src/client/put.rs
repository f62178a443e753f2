//! Checked writes, and whole files written in one call, many at once (what staging does with
//! a tree's files). A checked write's servers answer with the xxh3-128 of each chunk-aligned
//! range, as they received it ([`Check::Received`]: hashed in the buffer they store from) or
//! as they read it back from their store after writing it ([`Check::Stored`]: a second pass
//! over the device), so the writer compares it with the hash of what it sent without a second
//! request and without the bytes coming back.
//! A whole file is four requests: the parent's entry, the inode (created or truncated), the
//! checked writes, and its size, mode and time together; a small one (`layout.inline_max`)
//! two: the parent's entry, then the inode with its bytes, mode and time, kept with it
//! (client/inline.rs). A batch runs them for `client.max_inflight` files at once.

use std::time::Instant;

use futures::stream::{self, StreamExt};
use xxhash_rust::xxh3::xxh3_128;

use crate::chunking::split;
use crate::error::{Error, Result};
use crate::namespace::{Attr, Kind};
use crate::protocol::meta::{self, MetaRequest};
use crate::protocol::{Header, Op};
use crate::telemetry::OpKind;

use super::data::FileChecksum;
use super::{Client, FileHandle};

/// What a checked write's hash covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// The bytes as each server received them (the transfer and the receipt; no read-back).
    Received,
    /// The bytes as each server's store reads them back after writing them (the device too).
    Stored,
}

impl Check {
    fn op(self) -> Op {
        match self {
            Check::Received => Op::WriteHashed,
            Check::Stored => Op::WriteChecked,
        }
    }
}

/// A file to write whole: its path, all of its bytes, and the mode and time it gets.
#[derive(Debug, Clone, Copy)]
pub struct WholeFile<'a> {
    pub path: &'a str,
    pub data: &'a [u8],
    pub mode: u32,
    pub mtime_ns: u64,
}

impl Client {
    /// Writes `data` at `offset` of an open file as [`Client::write`] does, and returns the
    /// xxh3-128 of each chunk part of the range (cut at chunk boundaries, in order), as `check`
    /// says. Writes behind of the file are waited for first.
    pub fn write_checked(
        &self,
        file: &FileHandle,
        offset: u64,
        data: &[u8],
        check: Check,
    ) -> Result<Vec<u128>> {
        let _call = self.telemetry_call(OpKind::Write);
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or_else(|| Error::InvalidArgument("offset + length overflows".into()))?;
        self.forget_read_ahead(file.attr.id.0);
        let digests = self.run(async {
            if self.writes_behind(file.attr.id.0) {
                self.settle_file(file.attr.id.0, true).await?;
            }
            if file.placed().layout.inline && !data.is_empty() {
                // A checked write is checked in the chunks it lands in.
                file.placed
                    .set(self.promote("write", &file.path, file.attr.id.0).await?);
            }
            self.write_checked_at(&file.placed(), offset, data, check).await
        })?;
        if !data.is_empty() {
            file.written_end.set(file.written_end.get().max(end));
            file.changed();
        }
        Ok(digests)
    }

    /// Writes each file whole (created, or truncated if it exists; links followed), with its
    /// mode and time, and returns for each, in order, the checksum of its bytes as `check` says
    /// or why it failed. A failed file may be left shorter than its
    /// data, never reported at the full size. The outer error: the client could not run.
    pub fn put_files(&self, files: &[WholeFile<'_>], check: Check) -> Result<Vec<Result<FileChecksum>>> {
        let _call = self.telemetry_call(OpKind::Write);
        let window = self.config.client.max_inflight.max(1) as usize;
        let mut done: Vec<(usize, Result<FileChecksum>)> = self.run(async {
            let calls = files
                .iter()
                .enumerate()
                .map(|(i, f)| async move { (i, self.put_one(f, check).await) });
            Ok(stream::iter(calls).buffer_unordered(window).collect().await)
        })?;
        done.sort_unstable_by_key(|(i, _)| *i);
        Ok(done.into_iter().map(|(_, r)| r).collect())
    }

    async fn put_one(&self, f: &WholeFile<'_>, check: Check) -> Result<FileChecksum> {
        let path = self.checked("put", f.path)?;
        let small = f.data.len() as u64 <= self.config.layout.inline_max;
        let (path, attr, _) = if small {
            match self.put_inline(&path, f).await? {
                Ok(done) => return Ok(done),
                Err((path, attr)) => (path, attr, Vec::new()),
            }
        } else {
            let flags = meta::CREATE | meta::TRUNCATE | meta::CHUNKED;
            self.open_at(&path, flags, f.mode & 0o7777).await?
        };
        self.forget_read_ahead(attr.id.0);
        // An inline file made before, now given more than it keeps.
        let attr = if attr.layout.inline {
            self.promote("put", &path, attr.id.0).await?
        } else {
            attr
        };
        let chunks = self.write_checked_at(&attr, 0, f.data, check).await?;
        let mut req = MetaRequest::new(&path);
        req.flags = meta::SET_SIZE | meta::SET_MODE | meta::SET_MTIME;
        req.size = f.data.len() as u64;
        req.mode = f.mode & 0o7777;
        req.arg = f.mtime_ns;
        self.meta_attr(Op::SetAttr, "put", &req).await?;
        Ok(FileChecksum {
            size: f.data.len() as u64,
            chunk_size: attr.layout.chunk_size.max(1),
            chunks,
        })
    }

    /// A whole small file in one request after its entry: Ok(checksum) when its owner kept it
    /// inline; else the file as opened (created or truncated) for its bytes to be written to
    /// chunks. The owner's hash of the bytes as it kept them is compared with the caller's.
    async fn put_inline(
        &self,
        path: &str,
        f: &WholeFile<'_>,
    ) -> Result<std::result::Result<FileChecksum, (String, Attr)>> {
        self.through_links("put", path, true, |path| async move {
            let start = self.dir_add("put", &path, Kind::File, libc::EISDIR, 0).await?;
            let mut req = MetaRequest::new(&path);
            req.flags = meta::CREATE | meta::TRUNCATE;
            req.mode = f.mode & 0o7777;
            req.arg = start.map_or(0, |s| s as u64 + 1);
            req.size = f.mtime_ns;
            req.data = f.data.to_vec();
            let (h, body) = match self.meta(Op::PutInline, "put", &req).await {
                Ok(r) => r,
                Err(e) => {
                    if start.is_some() {
                        let _ = self.dir_remove("put", &path).await;
                    }
                    return Err(e);
                }
            };
            let attr = body
                .get(..meta::ATTR_LEN)
                .and_then(Attr::decode)
                .ok_or_else(|| Error::Protocol("malformed attribute in put reply".into()))?;
            self.check_layout(&path, &attr)?;
            if start.is_some() {
                self.tell_chunk_size(attr.layout.chunk_size);
            }
            let cs = attr.layout.chunk_size.max(1);
            match <[u8; 16]>::try_from(&body[meta::ATTR_LEN..]).map(u128::from_le_bytes) {
                Ok(kept) if kept == xxh3_128(f.data) => Ok(Ok(FileChecksum {
                    size: f.data.len() as u64,
                    chunk_size: cs,
                    chunks: super::inline::range_hashes(f.data, cs),
                })),
                Ok(_) => Err(Error::Protocol(format!(
                    "{path}: its owner kept bytes that differ from those sent"
                ))),
                Err(_) => {
                    // Not kept inline (a file made with chunks before): its old chunks beyond
                    // its new size go, as an open with O_TRUNC frees them.
                    self.free_data(&attr, attr.size, h.value().old_size()).await?;
                    Ok(Err((path, attr)))
                }
            }
        })
        .await
    }

    /// Checked writes of `data` at `offset` of `attr`'s file, at most `client.max_inflight`
    /// in flight: the hash of each chunk part, in order, as `check` says.
    pub(super) async fn write_checked_at(
        &self,
        attr: &Attr,
        offset: u64,
        data: &[u8],
        check: Check,
    ) -> Result<Vec<u128>> {
        let window = self.config.client.max_inflight.max(1) as usize;
        let ready = Instant::now();
        let parts: Vec<_> = split(offset, data.len() as u64, attr.layout.chunk_size).collect();
        let mut digests = vec![0u128; parts.len()];
        let calls = parts.into_iter().enumerate().map(|(i, p)| async move {
            let header = Header::request(check.op(), 0, attr.data_id(), p.chunk, p.offset, p.len);
            let part = &data[p.buf_offset as usize..(p.buf_offset + p.len) as usize];
            let digest = if attr.layout.replicas <= 1 {
                self.call_for_digest(self.route(attr, p.chunk), header, part, ready)
                    .await?
            } else {
                let copies = self.copies(attr, p.chunk);
                let (_, digest) = self.change_copies(copies, header, part, ready, true).await?;
                digest.unwrap_or_default()
            };
            Ok::<_, Error>((i, digest))
        });
        let mut results = stream::iter(calls).buffer_unordered(window);
        while let Some(r) = results.next().await {
            let (i, d) = r?;
            digests[i] = d;
        }
        Ok(digests)
    }
}
