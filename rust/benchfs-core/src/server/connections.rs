//! The connections back to clients, and their whole life. A client says hello with its UCX
//! worker address; the greeter task opens a connection (an endpoint of this worker's own) back to
//! it and answers with the connection's id, which the client's later requests carry and are
//! answered on.
//!
//! Teardown rules (a reader can check them all here; see benchfs-ucx `Endpoint::close` for why):
//!
//! - Endpoints are made only by the greeter task (`greet`), never inside a UCX callback: the UCX
//!   handler only queues hellos (at most [`MAX_PENDING_HELLOS`]; beyond [`MAX_CONNECTIONS`] open
//!   connections, hellos are not answered).
//! - A live client's connection is never closed forcibly: a connection is closed by dropping it,
//!   which closes it flushed, and forced only once UCX reported the peer failed
//!   (`Endpoint::close`).
//! - A transfer to or from a client (a reply, a rendezvous payload) that does not complete within
//!   1.5 x `client.request_timeout_s` is left to UCX (`with_client`): its memory is parked
//!   (`park`) until the operation completes, and the connection is kept.
//! - Connections are dropped only by the reaper task (`reap`), outside UCX callbacks: UCX's
//!   failure hook and a client greeting again (naming its earlier connection) only `retire` a
//!   connection; the reaper takes it out of the table, releases its locks and drops its waiting
//!   lock requests, and releases parked memory whose operation completed. (At stop, `stop_worker`
//!   drops the connections left, also outside callbacks.)

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use benchfs_ucx::Endpoint;

use crate::protocol::{Header, ReplyValue, AM_REPLY};
use crate::runtime::with_timeout;
use crate::telemetry::WorkerMetrics;

use super::ServerState;

/// Connections a server worker keeps open back to clients; hellos beyond it are not answered
/// (the table is bounded like every queue; a connection is dropped when its client fails).
const MAX_CONNECTIONS: usize = 65_536;

/// Connection ends (a client gone, or its connection replaced) a worker logs, one line each:
/// a client that exits ends its connections too, so a job logs up to this many per worker.
const MAX_LOGGED_ENDS: u32 = 8;

/// Hellos waiting for the greeter task of one worker (clients greet again after 2 s).
const MAX_PENDING_HELLOS: usize = 4_096;

/// The connections this worker opened back to its clients (one per client hello), by id.
///
/// UCX's own reply endpoints die with their peer, unannounced; these are ours: a client's
/// death is reported through the endpoint's failure hook, and the endpoint is closed only
/// here, outside UCX callbacks, once no request still holds it.
#[derive(Default)]
pub(super) struct Connections {
    pub(super) open: RefCell<std::collections::HashMap<u32, Rc<Endpoint>>>,
    /// The connection opened for each greeting (a hash of the client's worker address, and the
    /// greeting its hellos carry), so that a hello sent again is answered with the same one.
    greeted: RefCell<std::collections::HashMap<(u64, u64), u32>>,
    /// The greeting of each connection opened for one (to forget it with the connection).
    greeting_of: RefCell<std::collections::HashMap<u32, (u64, u64)>>,
    next_id: Cell<u32>,
    /// Connections to drop (failed, retired or timed out), filled from UCX callbacks.
    closing: RefCell<Vec<u32>>,
    pub(super) reaper: Cell<Option<Waker>>,
    /// Set once the "too many connections" line was logged.
    full_logged: Cell<bool>,
    /// Connection ends logged so far (a client that fails or replaces its connection is one
    /// line each, up to [`MAX_LOGGED_ENDS`]).
    ends_logged: Cell<u32>,
    /// Stuck transfers logged so far (`park`), up to [`MAX_LOGGED_ENDS`].
    stuck_logged: Cell<u32>,
    /// Hellos received (their header and the client's worker address), answered by the
    /// greeter task outside UCX callbacks; at most [`MAX_PENDING_HELLOS`].
    hellos: RefCell<VecDeque<(Header, Vec<u8>)>>,
    pub(super) greeter: Cell<Option<Waker>>,
}

impl Connections {
    pub(super) fn get(&self, id: u32) -> Option<Rc<Endpoint>> {
        self.open.borrow().get(&id).filter(|c| !c.is_down()).cloned()
    }

    /// Schedules connection `id` to be dropped by the reaper task.
    fn retire(&self, id: u32) {
        self.closing.borrow_mut().push(id);
        if let Some(w) = self.reaper.take() {
            w.wake();
        }
    }

    /// Takes the connections to drop, with their ids; the caller drops them outside any UCX
    /// callback.
    fn take_closing(&self) -> Vec<(u32, Rc<Endpoint>)> {
        let ids = std::mem::take(&mut *self.closing.borrow_mut());
        let mut open = self.open.borrow_mut();
        let (mut greeted, mut greeting_of) = (self.greeted.borrow_mut(), self.greeting_of.borrow_mut());
        for id in &ids {
            if let Some(key) = greeting_of.remove(id) {
                greeted.remove(&key);
            }
        }
        ids.into_iter()
            .filter_map(|id| Some((id, open.remove(&id)?)))
            .collect()
    }

    /// Logs why a connection ended (not a hot path: once per connection), up to
    /// [`MAX_LOGGED_ENDS`] lines.
    fn log_end(&self, what: &str) {
        let n = self.ends_logged.get();
        if n < MAX_LOGGED_ENDS {
            self.ends_logged.set(n + 1);
            let more = if n + 1 == MAX_LOGGED_ENDS {
                "; further connection ends are not logged"
            } else {
                ""
            };
            crate::warn_line!("benchfs: {what}{more}");
        }
    }

    /// Queues a hello for the greeter task (called from the UCX handler); a hello beyond
    /// [`MAX_PENDING_HELLOS`] is dropped, and its client greets again.
    pub(super) fn queue_hello(&self, header: Header, address: Vec<u8>, metrics: &WorkerMetrics) {
        let mut hellos = self.hellos.borrow_mut();
        if hellos.len() >= MAX_PENDING_HELLOS {
            metrics.count_undelivered();
            return;
        }
        hellos.push_back((header, address));
        if let Some(w) = self.greeter.take() {
            w.wake();
        }
    }

    /// The open connection made for `greeting`, if any (and not failed).
    fn greeted(&self, greeting: (u64, u64)) -> Option<(u32, Rc<Endpoint>)> {
        let id = *self.greeted.borrow().get(&greeting)?;
        Some((id, self.get(id)?))
    }
}

/// Waits until a connection is scheduled for closing.
struct ClosingWait<'a>(&'a Connections);

impl Future for ClosingWait<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0.closing.borrow().is_empty() {
            self.0.reaper.set(Some(cx.waker().clone()));
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }
}

/// Waits until a hello is queued.
struct HelloWait<'a>(&'a Connections);

impl Future for HelloWait<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0.hellos.borrow().is_empty() {
            self.0.greeter.set(Some(cx.waker().clone()));
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }
}

/// Memory a UCX operation that outlived its request may still use, kept until it completes.
pub(super) type Parked = (benchfs_ucx::Request, Box<dyn std::any::Any>);

/// A hash of a client's worker address (64 bits: addresses of one job's clients do not collide
/// in practice, and a collision also needs the same greeting).
fn address_hash(address: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(address)
}

/// Sends a header-only reply without waiting for it (no payload memory to keep alive).
pub(super) fn reply_now(conn: &Endpoint, header: Header) {
    // SAFETY: the payload is empty and the header is copied into the request.
    drop(unsafe { conn.send_am(AM_REPLY, &header.encode(), &[], None) });
}

impl ServerState {
    /// Opens a connection back to the client whose worker address the hello carries, and
    /// answers on it with the connection's id. Any job may say hello: the token is checked on
    /// every later request, which is answered on this connection (EACCES for another job).
    /// A hello sent again (the same address and greeting, `offset`) is answered on the
    /// connection opened for the first one.
    fn hello(&self, header: &Header, address: &[u8]) {
        let greeting = (header.offset != 0).then(|| (address_hash(address), header.offset));
        if let Some((id, conn)) = greeting.and_then(|g| self.conns.greeted(g)) {
            let reply = header
                .reply(0, 0)
                .on_connection(id)
                .with_value(ReplyValue::Connection(id));
            reply_now(&conn, reply);
            return;
        }
        if self.conns.open.borrow().len() >= MAX_CONNECTIONS {
            self.metrics.count_undelivered();
            if !self.conns.full_logged.replace(true) {
                crate::warn_line!(
                    "benchfs: {MAX_CONNECTIONS} client connections open on one server worker; \
                     further hellos are not answered until clients go"
                );
            }
            return;
        }
        let conn = match self.worker.connect(address, self.peer_errors) {
            Ok(c) => Rc::new(c),
            Err(_) => {
                self.metrics.count_malformed();
                return;
            }
        };
        let id = self.conns.next_id.get().wrapping_add(1).max(1);
        self.conns.next_id.set(id);
        let conns = Rc::downgrade(&self.conns);
        conn.on_failure(move |e| {
            if let Some(c) = conns.upgrade() {
                c.log_end(&format!("connection {id} to a client ended ({e}): dropped"));
                c.retire(id);
            }
        });
        // Only this job's clients may retire a connection (their own earlier one); its locks
        // are the new connection's.
        if header.token == self.token && header.chunk != 0 && header.chunk <= u64::from(u32::MAX) {
            let old = header.chunk as u32;
            self.conns.log_end(&format!(
                "connection {old} replaced by its client's connection {id}"
            ));
            self.locks.borrow_mut().transfer(old, id);
            self.conns.retire(old);
        }
        let reply = header
            .reply(0, 0)
            .on_connection(id)
            .with_value(ReplyValue::Connection(id));
        reply_now(&conn, reply);
        self.conns.open.borrow_mut().insert(id, conn);
        if let Some(g) = greeting {
            self.conns.greeted.borrow_mut().insert(g, id);
            self.conns.greeting_of.borrow_mut().insert(id, g);
        }
    }

    /// Waits for `op` (a transfer between this server's memory and client `conn`) until the
    /// client has surely given up on the request: `client.request_timeout_s` and half as long
    /// again. The connection stays open: a client alive but stopped comes back to it, and a
    /// dead one is reported by UCX, which fails the operation; closing it forcibly under a live
    /// peer is what crashed UCX's TCP transport (`Endpoint::close`). `Err(Some(op))`: UCX
    /// still holds the memory, so the caller parks it with the operation.
    pub(super) async fn with_client(
        &self,
        op: benchfs_ucx::Request,
    ) -> std::result::Result<usize, Option<benchfs_ucx::Request>> {
        let mut op = op;
        match with_timeout(&self.reactor, self.client_timeout * 3 / 2, &mut op).await {
            Some(r) => r.map_err(|_| None),
            None => Err(Some(op)),
        }
    }

    /// Answers the hellos the UCX handler queued, one at a time, outside UCX callbacks (an
    /// endpoint made inside one can take over a socket the progress frame still uses).
    pub(super) async fn greet(self: Rc<Self>) {
        loop {
            HelloWait(&self.conns).await;
            let next = self.conns.hellos.borrow_mut().pop_front();
            if let Some((header, address)) = next {
                self.hello(&header, &address);
            }
        }
    }

    /// Keeps `owner` (memory a stuck UCX operation may still write or read) until `op`
    /// completes; the reaper task releases it then. `what` names the transfer for the log
    /// (the first [`MAX_LOGGED_ENDS`] of a worker are logged).
    pub(super) fn park(&self, op: benchfs_ucx::Request, owner: Box<dyn std::any::Any>, what: &str) {
        self.metrics.count_undelivered();
        let n = self.conns.stuck_logged.get();
        if n < MAX_LOGGED_ENDS {
            self.conns.stuck_logged.set(n + 1);
            crate::warn_line!(
                "benchfs: {what} did not complete within {:.0} s; its memory is kept until UCX \
                 ends it{}",
                (self.client_timeout * 3 / 2).as_secs_f64(),
                if n + 1 == MAX_LOGGED_ENDS {
                    "; further ones are not logged"
                } else {
                    ""
                }
            );
        }
        self.parked.borrow_mut().push((op, owner));
        if let Some(w) = self.conns.reaper.take() {
            w.wake();
        }
    }

    /// Drops closed connections (outside UCX callbacks) and releases parked memory whose
    /// operation completed. Sleeps until woken, or polls each second while memory is parked.
    pub(super) async fn reap(self: Rc<Self>) {
        loop {
            let closed = self.conns.take_closing();
            let mut granted = Vec::new();
            for (id, _) in &closed {
                self.locks.borrow_mut().drop_conn(*id, &mut granted);
            }
            self.answer_granted(granted);
            drop(closed);
            self.parked.borrow_mut().retain(|(op, _)| !op.is_done());
            if self.parked.borrow().is_empty() {
                ClosingWait(&self.conns).await;
            } else {
                let _ = with_timeout(
                    &self.reactor,
                    std::time::Duration::from_secs(1),
                    ClosingWait(&self.conns),
                )
                .await;
            }
        }
    }
}
