//! Advisory locks, for the files whose locks this worker keeps (`LockTable`): a lock request is
//! answered at once, or (one that waits and conflicts) held and answered when granted, or
//! answered "still waiting" after the hold time (a third of `client.request_timeout_s`), and then
//! sent again by its client. A lock reply carries the worker's lock epoch, drawn at start, so a
//! client learns its locks were lost to a restart. The locks and waiting requests of a connection
//! that goes are dropped by the reaper task of `connections`.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use benchfs_ucx::Endpoint;

use crate::locktable::Waiting;
use crate::protocol::lock;
use crate::protocol::{Header, ReplyValue};
use crate::runtime::with_timeout;

use super::connections::reply_now;
use super::data::Served;
use super::ServerState;

/// What a waiting lock request's answer needs: its header and its client's connection.
pub(super) type LockAnswer = (Header, Rc<Endpoint>);

/// Waits until woken through the lock timer's waker (a lock request started waiting).
struct LockTimerWait<'a>(&'a Cell<Option<Waker>>, bool);

impl Future for LockTimerWait<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.1 {
            return Poll::Ready(());
        }
        self.1 = true;
        self.0.set(Some(cx.waker().clone()));
        Poll::Pending
    }
}

impl ServerState {
    /// A lock request: answered at once, or (one that waits and conflicts) queued and answered
    /// when granted or after the hold time.
    pub(super) fn serve_lock(
        &self,
        h: &Header,
        req: lock::LockRequest,
        conn: &Rc<Endpoint>,
        served: &mut Served,
    ) {
        use lock::{LockCmd, LockState};
        let answer = |state: LockState| ReplyValue::Lock {
            state,
            epoch: self.lock_epoch,
        };
        let mut granted = Vec::new();
        let mut locks = self.locks.borrow_mut();
        let outcome = match req.cmd {
            LockCmd::Get => Ok(match locks.test(h.file_id, &req) {
                Some(held) => (answer(LockState::Conflict), held.as_request(&req).encode()),
                None => (answer(LockState::Free), Vec::new()),
            }),
            LockCmd::Release => {
                locks.release(h.file_id, req.owner, req.class, &mut granted);
                Ok((answer(LockState::Granted), Vec::new()))
            }
            LockCmd::Set | LockCmd::SetWait => match locks.set(h.file_id, &req, h.client, &mut granted) {
                Ok(None) => Ok((answer(LockState::Granted), Vec::new())),
                Ok(Some(_)) if req.cmd == LockCmd::SetWait => {
                    let deadline = Instant::now() + self.lock_hold;
                    match locks.wait(h.file_id, req, h.client, deadline, (*h, conn.clone())) {
                        Ok(()) => {
                            served.deferred = true;
                            if let Some(w) = self.lock_timer.take() {
                                w.wake();
                            }
                            return;
                        }
                        Err(errno) => Err(errno),
                    }
                }
                Ok(Some(held)) => Ok((answer(LockState::Conflict), held.as_request(&req).encode())),
                Err(errno) => Err(errno),
            },
        };
        drop(locks);
        match outcome {
            Ok(meta) => served.meta = Some(meta),
            Err(errno) => served.status = -errno,
        }
        self.answer_granted(granted);
    }

    /// Answers lock requests that waited and are now granted.
    pub(super) fn answer_granted(&self, granted: Vec<Waiting<LockAnswer>>) {
        self.answer_waiting(granted, lock::LockState::Granted);
    }

    /// Answers lock requests that waited, each with `state`.
    fn answer_waiting(&self, waited: Vec<Waiting<LockAnswer>>, state: lock::LockState) {
        let value = ReplyValue::Lock {
            state,
            epoch: self.lock_epoch,
        };
        for w in waited {
            let (h, conn) = w.answer;
            reply_now(&conn, h.reply(0, 0).with_value(value));
        }
    }

    /// Answers "still waiting" to lock requests held their hold time; sleeps until the next
    /// one's deadline, or until a request starts waiting.
    pub(super) async fn expire_locks(self: Rc<Self>) {
        loop {
            let expired = self.locks.borrow_mut().expired(Instant::now());
            self.answer_waiting(expired, lock::LockState::Waiting);
            let next = self.locks.borrow().next_deadline();
            let woken = LockTimerWait(&self.lock_timer, false);
            match next {
                Some(at) => {
                    let _ = with_timeout(&self.reactor, at.saturating_duration_since(Instant::now()), woken)
                        .await;
                }
                None => woken.await,
            }
        }
    }
}
