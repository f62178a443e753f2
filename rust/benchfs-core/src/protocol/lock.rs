//! Lock requests ([`super::Op::Lock`]): advisory locks on a file, kept by the server worker
//! chosen from the file's id (`placement::lock_target`), so a rename does not move them.
//!
//! The payload is a [`LockRequest`] of [`LockRequest::LEN`] bytes; the reply's value is a
//! [`super::ReplyValue::Lock`], and a test (`LockCmd::Get`) that finds a conflicting lock
//! carries it as the reply payload, in the same encoding.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// A new lock owner number (a process, or an open file description): 64 bits from the
/// clock, the process and a counter, unique in a job in practice.
pub fn new_owner() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let parts = [
        now.to_le_bytes(),
        u64::from(std::process::id()).to_le_bytes(),
        NEXT.fetch_add(1, Ordering::Relaxed).to_le_bytes(),
    ]
    .concat();
    xxhash_rust::xxh3::xxh3_64(&parts) | 1
}

/// Which locks a request belongs with: fcntl's (process-owned and OFD locks share one space,
/// as in Linux), or flock's (whole-file locks of an open file description).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LockClass {
    Fcntl = 0,
    Flock = 1,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockType {
    Read = 0,
    Write = 1,
    Unlock = 2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockCmd {
    /// Take (or change, or with `Unlock` release) the range now, or answer `Conflict`.
    Set = 0,
    /// As `Set`, waiting while it conflicts: answered `Granted`, or `Waiting` after the
    /// server's hold time (the client asks again).
    SetWait = 1,
    /// Which lock would conflict (answered `Free`, or `Conflict` with it as the payload).
    Get = 2,
    /// Releases every lock of `owner` on the file, in its class (close of a descriptor).
    Release = 3,
}

/// One lock request, or a lock (a test's answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockRequest {
    /// Who holds it: a process (fcntl locks) or an open file description (OFD and flock
    /// locks), as a number the client draws at random.
    pub owner: u64,
    pub start: u64,
    /// One past the last byte; `u64::MAX`: to the end of the file, however it grows.
    pub end: u64,
    /// The holder's process id, as F_GETLK reports it (0 for OFD and flock locks, as Linux
    /// reports -1).
    pub pid: u32,
    pub class: LockClass,
    pub kind: LockType,
    pub cmd: LockCmd,
}

impl LockRequest {
    pub const LEN: usize = 32;

    /// Releases every lock of `owner` in `class` on the file (a descriptor's close).
    pub fn release(owner: u64, class: LockClass) -> LockRequest {
        LockRequest {
            owner,
            start: 0,
            end: u64::MAX,
            pid: 0,
            class,
            kind: LockType::Unlock,
            cmd: LockCmd::Release,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(Self::LEN);
        b.extend_from_slice(&self.owner.to_le_bytes());
        b.extend_from_slice(&self.start.to_le_bytes());
        b.extend_from_slice(&self.end.to_le_bytes());
        b.extend_from_slice(&self.pid.to_le_bytes());
        b.extend_from_slice(&[self.class as u8, self.kind as u8, self.cmd as u8, 0]);
        b
    }

    pub fn decode(b: &[u8]) -> Result<LockRequest> {
        let bad = |what: &str| Error::Protocol(format!("lock request: {what}"));
        if b.len() != Self::LEN {
            return Err(bad(&format!("{} bytes, not {}", b.len(), Self::LEN)));
        }
        let u64_at = |at: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(a)
        };
        let mut pid = [0u8; 4];
        pid.copy_from_slice(&b[24..28]);
        let class = match b[28] {
            0 => LockClass::Fcntl,
            1 => LockClass::Flock,
            _ => return Err(bad("unknown class")),
        };
        let kind = match b[29] {
            0 => LockType::Read,
            1 => LockType::Write,
            2 => LockType::Unlock,
            _ => return Err(bad("unknown type")),
        };
        let cmd = match b[30] {
            0 => LockCmd::Set,
            1 => LockCmd::SetWait,
            2 => LockCmd::Get,
            3 => LockCmd::Release,
            _ => return Err(bad("unknown command")),
        };
        let req = LockRequest {
            owner: u64_at(0),
            start: u64_at(8),
            end: u64_at(16),
            pid: u32::from_le_bytes(pid),
            class,
            kind,
            cmd,
        };
        if req.start >= req.end {
            return Err(bad("an empty range"));
        }
        Ok(req)
    }

    /// Whether the two ranges share a byte.
    pub fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start < end && start < self.end
    }
}

/// What a lock request's reply says (with the server's epoch, [`super::ReplyValue::Lock`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockState {
    /// Set: taken (or released). Release: done.
    Granted = 0,
    /// Set, Get: another owner's lock conflicts.
    Conflict = 1,
    /// SetWait: still conflicting after the server's hold time; ask again.
    Waiting = 2,
    /// Get: nothing conflicts.
    Free = 3,
}

impl LockState {
    pub fn of(v: u32) -> LockState {
        match v {
            0 => LockState::Granted,
            1 => LockState::Conflict,
            2 => LockState::Waiting,
            _ => LockState::Free,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_bad_ones_are_refused() -> Result<()> {
        let r = LockRequest {
            owner: 7,
            start: 10,
            end: u64::MAX,
            pid: 42,
            class: LockClass::Flock,
            kind: LockType::Write,
            cmd: LockCmd::SetWait,
        };
        let b = r.encode();
        assert_eq!(b.len(), LockRequest::LEN);
        assert_eq!(LockRequest::decode(&b)?, r);
        assert!(LockRequest::decode(&b[1..]).is_err());
        let mut bad = b.clone();
        bad[29] = 9;
        assert!(LockRequest::decode(&bad).is_err());
        let empty = LockRequest { end: 10, ..r };
        assert!(LockRequest::decode(&empty.encode()).is_err());
        assert!(r.overlaps(0, 11) && !r.overlaps(0, 10));
        Ok(())
    }
}
