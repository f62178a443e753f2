//! A server worker's advisory locks: per file id, the locks held (by owner, class, type and
//! byte range, and the client connection that took them) and the requests waiting for them.
//!
//! Rules are Linux's: two locks conflict when they are of one class, of different owners,
//! overlap, and one of them is a write lock; an owner's new lock replaces what it held in its
//! range (splitting its older locks), and unlocking a range splits them too. A waiting request
//! is granted, in arrival order, as soon as it no longer conflicts. A connection that goes
//! (its client died or was cut off) takes its locks and its waiting requests with it.
//!
//! Bounded: at most [`MAX_LOCKS`] locks and [`MAX_WAITING`] waiting requests per worker;
//! beyond, ENOLCK.

use std::collections::HashMap;
use std::time::Instant;

use crate::protocol::lock::{LockClass, LockRequest, LockType};

pub const MAX_LOCKS: usize = 1 << 20;
pub const MAX_WAITING: usize = 4096;

/// A lock held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub owner: u64,
    pub class: LockClass,
    pub write: bool,
    pub start: u64,
    pub end: u64,
    pub pid: u32,
    /// The client connection that took it.
    pub conn: u32,
}

impl Held {
    /// The lock `req` takes for connection `conn`.
    fn of(req: &LockRequest, conn: u32) -> Held {
        Held {
            owner: req.owner,
            class: req.class,
            write: req.kind == LockType::Write,
            start: req.start,
            end: req.end,
            pid: req.pid,
            conn,
        }
    }

    /// As a lock request (what a test answers with).
    pub fn as_request(&self, like: &LockRequest) -> LockRequest {
        LockRequest {
            owner: self.owner,
            start: self.start,
            end: self.end,
            pid: self.pid,
            class: self.class,
            kind: if self.write {
                LockType::Write
            } else {
                LockType::Read
            },
            cmd: like.cmd,
        }
    }
}

/// A request waiting for a lock, with what its answer needs (`W`).
pub struct Waiting<W> {
    pub req: LockRequest,
    pub conn: u32,
    pub deadline: Instant,
    pub answer: W,
}

struct FileLocks<W> {
    held: Vec<Held>,
    waiting: Vec<Waiting<W>>,
}

impl<W> Default for FileLocks<W> {
    fn default() -> Self {
        FileLocks {
            held: Vec::new(),
            waiting: Vec::new(),
        }
    }
}

pub struct LockTable<W> {
    files: HashMap<u128, FileLocks<W>>,
    locks: usize,
    waiting: usize,
}

impl<W> Default for LockTable<W> {
    fn default() -> Self {
        LockTable {
            files: HashMap::new(),
            locks: 0,
            waiting: 0,
        }
    }
}

/// The lock of `held` that `req` (of another owner, or of the same owner in another
/// description) conflicts with, if any.
fn conflict<'a>(held: &'a [Held], req: &LockRequest) -> Option<&'a Held> {
    held.iter().find(|h| {
        h.class == req.class
            && h.owner != req.owner
            && req.overlaps(h.start, h.end)
            && (h.write || req.kind == LockType::Write)
    })
}

/// Takes `req`'s range out of its owner's locks (of its class), splitting those that reach
/// past it; returns how many locks that added (negative: removed).
fn carve(held: &mut Vec<Held>, req: &LockRequest) -> isize {
    let before = held.len() as isize;
    let mut kept = Vec::with_capacity(held.len() + 1);
    for h in held.drain(..) {
        if h.class != req.class || h.owner != req.owner || !req.overlaps(h.start, h.end) {
            kept.push(h);
            continue;
        }
        if h.start < req.start {
            kept.push(Held { end: req.start, ..h });
        }
        if req.end < h.end {
            kept.push(Held { start: req.end, ..h });
        }
    }
    *held = kept;
    held.len() as isize - before
}

impl<W> LockTable<W> {
    pub fn lock_count(&self) -> usize {
        self.locks
    }

    pub fn waiting_count(&self) -> usize {
        self.waiting
    }

    /// The lock that would conflict with `req` on `file`, if any.
    pub fn test(&self, file: u128, req: &LockRequest) -> Option<Held> {
        self.files
            .get(&file)
            .and_then(|f| conflict(&f.held, req).copied())
    }

    /// Takes, changes or (with `LockType::Unlock`) releases `req`'s range for connection
    /// `conn`: `Ok(None)` when done, `Ok(Some(lock))` when `lock` conflicts (nothing
    /// changed), `Err(ENOLCK)` when the table is full. Waiting requests this lets through
    /// are granted and returned with it in `granted`.
    pub fn set(
        &mut self,
        file: u128,
        req: &LockRequest,
        conn: u32,
        granted: &mut Vec<Waiting<W>>,
    ) -> Result<Option<Held>, i32> {
        let f = self.files.entry(file).or_default();
        if req.kind != LockType::Unlock {
            if let Some(h) = conflict(&f.held, req) {
                return Ok(Some(*h));
            }
            if self.locks + 2 > MAX_LOCKS {
                return Err(libc::ENOLCK);
            }
        }
        let changed = carve(&mut f.held, req);
        let mut added = changed;
        if req.kind != LockType::Unlock {
            f.held.push(Held::of(req, conn));
            added += 1;
        }
        self.locks = (self.locks as isize + added) as usize;
        self.grant(file, granted);
        Ok(None)
    }

    /// Queues `req` (which conflicts now) until it can be granted or `deadline` passes.
    pub fn wait(
        &mut self,
        file: u128,
        req: LockRequest,
        conn: u32,
        deadline: Instant,
        answer: W,
    ) -> Result<(), i32> {
        if self.waiting >= MAX_WAITING {
            return Err(libc::ENOLCK);
        }
        self.files.entry(file).or_default().waiting.push(Waiting {
            req,
            conn,
            deadline,
            answer,
        });
        self.waiting += 1;
        Ok(())
    }

    /// Releases every lock of `owner` in `class` on `file` (a descriptor closed).
    pub fn release(&mut self, file: u128, owner: u64, class: LockClass, granted: &mut Vec<Waiting<W>>) {
        let Some(f) = self.files.get_mut(&file) else {
            return;
        };
        let before = f.held.len();
        f.held.retain(|h| !(h.owner == owner && h.class == class));
        self.locks -= before - f.held.len();
        self.grant(file, granted);
    }

    /// Connection `conn` is gone: its locks are released and its waiting requests dropped.
    pub fn drop_conn(&mut self, conn: u32, granted: &mut Vec<Waiting<W>>) {
        let mut touched = Vec::new();
        for (id, f) in &mut self.files {
            let (held, waiting) = (f.held.len(), f.waiting.len());
            f.held.retain(|h| h.conn != conn);
            f.waiting.retain(|w| w.conn != conn);
            if f.held.len() != held || f.waiting.len() != waiting {
                self.locks -= held - f.held.len();
                self.waiting -= waiting - f.waiting.len();
                touched.push(*id);
            }
        }
        for id in touched {
            self.grant(id, granted);
        }
    }

    /// Connection `old` was replaced by `new` (the client rebuilt its transport): what `old`
    /// held is now `new`'s.
    pub fn transfer(&mut self, old: u32, new: u32) {
        for f in self.files.values_mut() {
            for h in f.held.iter_mut().filter(|h| h.conn == old) {
                h.conn = new;
            }
        }
    }

    /// Waiting requests whose deadline passed (answered "still waiting" by the caller).
    pub fn expired(&mut self, now: Instant) -> Vec<Waiting<W>> {
        let mut out = Vec::new();
        for f in self.files.values_mut() {
            let mut i = 0;
            while i < f.waiting.len() {
                if f.waiting[i].deadline <= now {
                    out.push(f.waiting.remove(i));
                } else {
                    i += 1;
                }
            }
        }
        self.waiting -= out.len();
        self.files
            .retain(|_, f| !f.held.is_empty() || !f.waiting.is_empty());
        out
    }

    /// The earliest deadline of a waiting request.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.files
            .values()
            .flat_map(|f| f.waiting.iter().map(|w| w.deadline))
            .min()
    }

    /// Grants, in arrival order, the waiting requests on `file` that no longer conflict.
    fn grant(&mut self, file: u128, granted: &mut Vec<Waiting<W>>) {
        let Some(f) = self.files.get_mut(&file) else {
            return;
        };
        let mut i = 0;
        while i < f.waiting.len() {
            let req = f.waiting[i].req;
            if conflict(&f.held, &req).is_some() || self.locks + 2 > MAX_LOCKS {
                i += 1;
                continue;
            }
            let w = f.waiting.remove(i);
            self.waiting -= 1;
            let added = carve(&mut f.held, &req) + 1;
            f.held.push(Held::of(&req, w.conn));
            self.locks = (self.locks as isize + added) as usize;
            granted.push(w);
        }
        if f.held.is_empty() && f.waiting.is_empty() {
            self.files.remove(&file);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::lock::LockCmd;

    fn req(owner: u64, kind: LockType, start: u64, end: u64) -> LockRequest {
        LockRequest {
            owner,
            start,
            end,
            pid: owner as u32,
            class: LockClass::Fcntl,
            kind,
            cmd: LockCmd::Set,
        }
    }

    #[test]
    fn readers_share_writers_exclude_and_owners_replace_their_own() {
        let mut t: LockTable<()> = LockTable::default();
        let mut g = Vec::new();
        assert_eq!(t.set(1, &req(1, LockType::Read, 0, 100), 1, &mut g), Ok(None));
        assert_eq!(t.set(1, &req(2, LockType::Read, 50, 150), 2, &mut g), Ok(None));
        let c = t.set(1, &req(3, LockType::Write, 90, 95), 3, &mut g);
        assert!(matches!(c, Ok(Some(h)) if h.owner == 1 || h.owner == 2));
        // Another file, another class: no conflict.
        assert_eq!(t.set(2, &req(3, LockType::Write, 0, 10), 3, &mut g), Ok(None));
        let flock = LockRequest {
            class: LockClass::Flock,
            ..req(3, LockType::Write, 0, u64::MAX)
        };
        assert_eq!(t.set(1, &flock, 3, &mut g), Ok(None));
        // Owner 1 upgrades its own range where no one else reads: split, not a conflict.
        assert_eq!(t.set(1, &req(1, LockType::Write, 0, 40), 1, &mut g), Ok(None));
        assert!(t
            .test(1, &req(4, LockType::Read, 10, 20))
            .is_some_and(|h| h.write));
        assert!(t.test(1, &req(4, LockType::Read, 45, 49)).is_none());
        // Unlocking the middle of a range splits it.
        assert_eq!(t.set(1, &req(2, LockType::Unlock, 60, 70), 2, &mut g), Ok(None));
        assert!(t
            .test(1, &req(4, LockType::Write, 60, 70))
            .is_some_and(|h| h.owner == 1));
        assert_eq!(
            t.set(1, &req(1, LockType::Unlock, 0, u64::MAX), 1, &mut g),
            Ok(None)
        );
        assert!(t.test(1, &req(4, LockType::Write, 60, 70)).is_none());
        assert!(t
            .test(1, &req(4, LockType::Write, 100, 110))
            .is_some_and(|h| h.owner == 2));
        assert!(g.is_empty());
    }

    #[test]
    fn waiting_requests_are_granted_in_order_and_dead_connections_release() {
        let mut t: LockTable<&str> = LockTable::default();
        let mut g = Vec::new();
        let later = Instant::now() + std::time::Duration::from_secs(60);
        assert_eq!(
            t.set(1, &req(1, LockType::Write, 0, u64::MAX), 10, &mut g),
            Ok(None)
        );
        t.wait(1, req(2, LockType::Write, 0, 10), 20, later, "second")
            .expect("queued");
        t.wait(1, req(3, LockType::Read, 5, 6), 30, later, "third")
            .expect("queued");
        assert_eq!(t.waiting_count(), 2);
        // The holder's connection goes: the first waiter gets the lock, the second still
        // conflicts with it.
        t.drop_conn(10, &mut g);
        assert_eq!(g.iter().map(|w| w.answer).collect::<Vec<_>>(), ["second"]);
        g.clear();
        t.release(1, 2, LockClass::Fcntl, &mut g);
        assert_eq!(g.iter().map(|w| w.answer).collect::<Vec<_>>(), ["third"]);
        assert_eq!((t.lock_count(), t.waiting_count()), (1, 0));
        // Expiry answers what waited too long.
        let soon = Instant::now();
        t.wait(1, req(9, LockType::Write, 0, 1), 40, soon, "late")
            .expect("queued");
        assert_eq!(t.next_deadline(), Some(soon));
        assert_eq!(t.expired(Instant::now()).len(), 1);
        assert_eq!(t.waiting_count(), 0);
        // A transfer keeps the locks across a client's new connection.
        t.transfer(30, 31);
        t.drop_conn(30, &mut g);
        assert_eq!(t.lock_count(), 1);
        t.drop_conn(31, &mut g);
        assert_eq!(t.lock_count(), 0);
    }
}
