//! What arrives at a server worker: requests, as UCX active messages. The handler
//! (`on_message`, run inside UCX's progress) decodes the header, checks the job's token, refuses
//! new requests while the worker drains, checks the request, and queues it for the service
//! tasks in the bounded [`RequestQueue`] (EAGAIN when it is full); a rendezvous payload stays at
//! the client until a service task receives it. Hellos are only queued here, for the greeter
//! task of `connections`: no endpoint is made inside a UCX callback.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use benchfs_ucx::{AmData, AmMessage, AmVerdict, Endpoint, RndvDesc};

use crate::protocol::{check_request, Header, Op};

use super::connections::reply_now;
use super::ServerState;

pub(super) enum Payload {
    None,
    Eager(Vec<u8>),
    Rendezvous(RndvDesc),
}

pub(super) struct Incoming {
    pub(super) header: Header,
    pub(super) payload: Payload,
    /// The connection the reply goes back on.
    pub(super) conn: Rc<Endpoint>,
    /// When the request arrived (queue wait and total time start here).
    pub(super) arrived: Instant,
}

/// The bounded wait queue between the UCX handler and the service tasks.
pub(super) struct RequestQueue {
    pub(super) items: RefCell<VecDeque<Incoming>>,
    pub(super) waiters: RefCell<VecDeque<Waker>>,
    pub(super) capacity: usize,
}

impl RequestQueue {
    /// Queues `item`; `None` (and `item` dropped) when the queue is full.
    fn push(&self, item: Incoming) -> Option<usize> {
        let mut items = self.items.borrow_mut();
        if items.len() >= self.capacity {
            return None;
        }
        items.push_back(item);
        let depth = items.len();
        drop(items);
        if let Some(w) = self.waiters.borrow_mut().pop_front() {
            w.wake();
        }
        Some(depth)
    }

    pub(super) fn pop(self: &Rc<Self>) -> PopRequest {
        PopRequest { queue: self.clone() }
    }
}

pub(super) struct PopRequest {
    queue: Rc<RequestQueue>,
}

impl Future for PopRequest {
    type Output = Incoming;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Incoming> {
        match self.queue.items.borrow_mut().pop_front() {
            Some(item) => Poll::Ready(item),
            None => {
                self.queue.waiters.borrow_mut().push_back(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl ServerState {
    pub(super) fn on_message(&self, msg: AmMessage<'_>) -> AmVerdict {
        let payload_len = match &msg.data {
            AmData::Eager(d) => d.len(),
            AmData::Rendezvous(r) => r.len,
        };
        let header = match Header::decode(msg.header) {
            Ok(h) => h,
            Err(e) => {
                self.metrics.count_malformed();
                // Answer what we can: a readable request id and connection get an EPROTO reply.
                if let (Some(id), Some(conn)) = (e.request_id, e.client.and_then(|c| self.conns.get(c))) {
                    let h = Header::request(Op::WriteChunk, id, 0, 0, 0, 0).reply(-libc::EPROTO, 0);
                    reply_now(&conn, h);
                }
                return AmVerdict::Done;
            }
        };
        if header.op == Op::Hello {
            // Answered by the greeter task: no endpoint is made inside a UCX callback.
            match &msg.data {
                AmData::Eager(a) if check_request(&header, payload_len, self.chunk_size).is_ok() => {
                    self.conns.queue_hello(header, a.to_vec(), &self.metrics);
                }
                // A rendezvous hello (an address that large is not one) or a bad length:
                // there is no address to answer to.
                _ => self.metrics.count_malformed(),
            }
            return AmVerdict::Done;
        }
        let Some(conn) = self.conns.get(header.client) else {
            // No connection to answer on (never opened, or dropped after its client failed):
            // the client times out and opens a new one.
            self.metrics.count_undelivered();
            return AmVerdict::Done;
        };
        if header.token != self.token {
            self.metrics.count_refused_auth();
            if !self.refusal_logged.replace(true) {
                crate::warn_line!(
                    "benchfs: refused a request without this job's token (op {}, request {}); \
                     further refusals are only counted (telemetry refused_auth)",
                    header.op.name(),
                    header.request_id
                );
            }
            reply_now(&conn, header.reply(-libc::EACCES, 0));
            return AmVerdict::Done;
        }
        if self.draining.get() {
            reply_now(&conn, header.reply(-libc::ESHUTDOWN, 0));
            return AmVerdict::Done;
        }
        if check_request(&header, payload_len, self.chunk_size).is_err() {
            self.metrics.count_malformed();
            reply_now(&conn, header.reply(-libc::EINVAL, 0));
            return AmVerdict::Done;
        }
        let (payload, verdict) = match msg.data {
            AmData::Eager(d) if !d.is_empty() => (Payload::Eager(d.to_vec()), AmVerdict::Done),
            AmData::Eager(_) => (Payload::None, AmVerdict::Done),
            AmData::Rendezvous(r) => (Payload::Rendezvous(r), AmVerdict::Keep),
        };
        let item = Incoming {
            header,
            payload,
            conn: conn.clone(),
            arrived: Instant::now(),
        };
        match self.queue.push(item) {
            Some(_) => verdict,
            None => {
                self.metrics.count_rejected();
                reply_now(&conn, header.reply(-libc::EAGAIN, 0));
                // Returning Done lets UCX drop an unreceived rendezvous descriptor.
                AmVerdict::Done
            }
        }
    }
}
