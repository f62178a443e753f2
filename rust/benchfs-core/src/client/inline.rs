//! Small files kept with their inodes (`layout.inline_max`; namespace/inline.rs): a read or a
//! write of an inline file is one request to its metadata owner, a whole small file is one
//! request after its directory entry, and a file that outgrows the limit has its bytes moved
//! into chunks, once: the client writes them to chunks of a generation the owner handed out,
//! and the owner switches the file to them only if its bytes are still those. A handle learns
//! of the move from the owner's answer (the attribute it addresses, `FileHandle::placed`).

use xxhash_rust::xxh3::xxh3_128;

use crate::error::{Error, Result};
use crate::namespace::Attr;
use crate::placement::Layout;
use crate::protocol::meta::{self, MetaRequest};
use crate::protocol::{Op, ReplyValue};

use super::put::Check;
use super::{Client, FileHandle};

/// Attempts at moving a file's bytes into chunks while other writers keep changing them.
const PROMOTE_TRIES: u32 = 64;

/// The xxh3-128 of each `chunk_size` range of `bytes`, in order (a checksum's ranges).
pub(super) fn range_hashes(bytes: &[u8], chunk_size: u64) -> Vec<u128> {
    bytes.chunks(chunk_size.max(1) as usize).map(xxh3_128).collect()
}

/// What an inline request answers: the attribute, the bytes after it, and the reply's value.
struct Answer {
    attr: Attr,
    bytes: Vec<u8>,
    value: ReplyValue,
}

impl Client {
    async fn inline_call(&self, op: Op, what: &'static str, req: &MetaRequest) -> Result<Answer> {
        let (h, mut body) = self.meta(op, what, req).await?;
        let attr = body
            .get(..meta::ATTR_LEN)
            .and_then(Attr::decode)
            .ok_or_else(|| Error::Protocol(format!("malformed attribute in {what} reply")))?;
        body.drain(..meta::ATTR_LEN);
        Ok(Answer {
            attr,
            bytes: body,
            value: h.value(),
        })
    }

    /// Writes `data` at `offset` of an inline file at its owner: true when written there;
    /// false when the handle now addresses the file's chunks (moved by another client, or by
    /// this call because the write takes the file past the limit) and the write is still to do.
    pub(super) async fn write_inline(&self, file: &FileHandle, offset: u64, data: &[u8]) -> Result<bool> {
        let id = file.attr.id.0;
        if data.len() <= meta::INLINE_LIMIT {
            let mut req = MetaRequest::new(&file.path);
            req.id = id;
            req.arg = offset;
            req.data = data.to_vec();
            let a = self.inline_call(Op::InlineWrite, "write", &req).await?;
            if a.value == ReplyValue::Existed(true) {
                file.learn_size(a.attr.size);
                return Ok(true);
            }
            if !a.attr.layout.inline {
                file.placed.set(a.attr);
                return Ok(false);
            }
        }
        let moved = self.promote("write", &file.path, id).await?;
        file.placed.set(moved);
        Ok(false)
    }

    /// Reads up to `buf.len()` bytes at `offset` of an inline file from its owner: Some(bytes
    /// read), or None when the handle now addresses the file's chunks (it was moved).
    pub(super) async fn read_inline(
        &self,
        file: &FileHandle,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<Option<usize>> {
        {
            // Close-to-open: the bytes as the open found them, short at their end; a read from
            // there on asks the owner (as a read past the size a handle knows asks the size),
            // so a file that grew since is seen growing.
            let mut at_open = file.at_open.borrow_mut();
            match at_open.as_ref() {
                Some((bytes, seen)) if *seen == file.change_count() && offset < bytes.len() as u64 => {
                    let from = offset as usize;
                    let n = (bytes.len() - from).min(buf.len());
                    buf[..n].copy_from_slice(&bytes[from..from + n]);
                    return Ok(Some(n));
                }
                Some((_, seen)) if *seen == file.change_count() => {}
                Some(_) => *at_open = None,
                None => {}
            }
        }
        let mut req = MetaRequest::new(&file.path);
        req.id = file.attr.id.0;
        req.arg = offset;
        req.size = buf.len().min(meta::INLINE_LIMIT) as u64;
        let a = self.inline_call(Op::InlineRead, "read", &req).await?;
        if !a.attr.layout.inline {
            file.placed.set(a.attr);
            return Ok(None);
        }
        file.learn_size(a.attr.size);
        let n = a.bytes.len().min(buf.len());
        buf[..n].copy_from_slice(&a.bytes[..n]);
        Ok(Some(n))
    }

    /// The attribute and all the bytes of the file at `path` (links resolved by the caller)
    /// when it is inline; no bytes otherwise.
    pub(super) async fn inline_bytes(
        &self,
        what: &'static str,
        path: &str,
        id: u128,
    ) -> Result<(Attr, Vec<u8>)> {
        let mut req = MetaRequest::new(path);
        req.id = id;
        req.size = meta::INLINE_LIMIT as u64;
        let a = self.inline_call(Op::InlineRead, what, &req).await?;
        Ok((a.attr, a.bytes))
    }

    /// Moves the bytes of inline file `id` at `path` into chunks (see the module comment);
    /// returns its attribute once it has chunks. A file no longer inline is left as it is.
    pub(super) async fn promote(&self, what: &'static str, path: &str, id: u128) -> Result<Attr> {
        for _ in 0..PROMOTE_TRIES {
            let mut req = MetaRequest::new(path);
            req.id = id;
            let begun = self.inline_call(Op::Promote, what, &req).await?;
            let ReplyValue::Generation(generation) = begun.value else {
                return Err(Error::Protocol(format!(
                    "promote answered with {:?}",
                    begun.value
                )));
            };
            if !begun.attr.layout.inline {
                return Ok(begun.attr);
            }
            let chunks = Attr {
                layout: Layout {
                    inline: false,
                    generation,
                    ..begun.attr.layout
                },
                ..begun.attr
            };
            let bytes = &begun.bytes;
            let written = self.write_checked_at(&chunks, 0, bytes, Check::Received).await;
            let expected = range_hashes(bytes, chunks.layout.chunk_size);
            let ended = match written {
                Ok(got) if got == expected => {
                    req.flags = meta::PROMOTE_END;
                    req.arg = u64::from(generation);
                    req.data = xxh3_128(bytes).to_le_bytes().to_vec();
                    self.inline_call(Op::Promote, what, &req).await.map(|a| a.attr)
                }
                Ok(_) => Err(Error::Protocol(format!(
                    "{path}: the chunks written for its move differ from its bytes"
                ))),
                Err(e) => Err(e),
            };
            match ended {
                Ok(now) if !now.layout.inline && now.layout.generation == generation => return Ok(now),
                Ok(now) => {
                    // Another client moved it, or its bytes changed since: these chunks are
                    // nobody's.
                    self.free_data(&chunks, 0, bytes.len() as u64).await?;
                    if !now.layout.inline {
                        return Ok(now);
                    }
                }
                Err(e) => {
                    let _ = self.free_data(&chunks, 0, bytes.len() as u64).await;
                    return Err(e);
                }
            }
        }
        Err(Error::Path {
            op: what,
            path: path.to_string(),
            errno: libc::EAGAIN,
        })
    }
}
