//! Buffers that metadata replies are received into, kept for reuse. A reply may be as long
//! as a readdir page and its changes (`meta::REPLY_MAX` and more), so each call offers that
//! much room; allocating it zeroed per call was a memset of 64 KiB, a third of a null round
//! trip over shared memory. A buffer goes back to the client's pool only once a whole reply
//! was read out of it ([`ReplyBuf::body`]): after a failed call a receive may still be writing
//! into it (the call's orphan, waited for before the public call returns), so it is freed as
//! before instead. The bytes of earlier replies left in a reused buffer are never read (only
//! the new reply's length is).

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};

use crate::protocol::meta;

use super::Client;

/// Room for any metadata reply, its changes included (meta_copies.rs).
pub(super) const REPLY_ROOM: usize = meta::REPLY_MAX + super::meta_copies::CHANGES_MAX;

/// Buffers kept at most: one per metadata call in flight at once is plenty.
const KEPT: usize = 16;

/// A reply buffer of [`REPLY_ROOM`] bytes, back to its pool when dropped after a reply.
pub(super) struct ReplyBuf<'a> {
    pool: &'a RefCell<Vec<Vec<u8>>>,
    buf: Vec<u8>,
    answered: bool,
}

impl ReplyBuf<'_> {
    /// The first `len` bytes (at most the buffer's): the body of a reply that arrived whole.
    pub(super) fn body(&mut self, len: usize) -> Vec<u8> {
        self.answered = true;
        self.buf[..len.min(self.buf.len())].to_vec()
    }
}

impl Deref for ReplyBuf<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.buf
    }
}

impl DerefMut for ReplyBuf<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }
}

impl Drop for ReplyBuf<'_> {
    fn drop(&mut self) {
        let mut pool = self.pool.borrow_mut();
        if self.answered && pool.len() < KEPT {
            pool.push(std::mem::take(&mut self.buf));
        }
    }
}

impl Client {
    /// A reply buffer from the pool, or a new one.
    pub(super) fn reply_buf(&self) -> ReplyBuf<'_> {
        let buf = self
            .reply_bufs
            .borrow_mut()
            .pop()
            .unwrap_or_else(|| vec![0u8; REPLY_ROOM]);
        ReplyBuf {
            pool: &self.reply_bufs,
            buf,
            answered: false,
        }
    }
}
