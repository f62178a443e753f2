//! Connections to servers: an endpoint to every server worker and a hello on each, answered with
//! the connection id later requests carry. A client connects to many servers at once (a bounded
//! number in flight, woken by the answers, never by a timer), greets a silent server again with
//! backoff, and probes a lost server until it answers.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use benchfs_ucx::Endpoint;

use crate::error::{Error, Result};
use crate::protocol::{Header, Op, ReplyValue, AM_REQUEST};
use crate::runtime::with_timeout;

use super::rpc::{Down, Link, PendingRpc, ReplyFailure, Shared};
use super::telemetry::ns;
use super::Client;

/// Probing a lost server: hellos at intervals doubling from [`PROBE_FIRST`] to [`PROBE_MAX`].
pub(super) struct Probing {
    pub(super) next_at: Instant,
    pub(super) interval: Duration,
    /// A probe in flight, and when it started.
    pub(super) inflight: Option<(Greeting, Instant)>,
}

pub(super) const PROBE_FIRST: Duration = Duration::from_millis(100);

pub(super) const PROBE_MAX: Duration = Duration::from_secs(5);

/// A server that has not answered a hello is greeted again after this, then at doubling
/// intervals up to [`HELLO_RESEND_MAX`] (an overloaded server is slow, not lost). Not sooner:
/// UCX delivers what it accepted, so a hello sent again helps only one the server dropped, and
/// at 512 ranks on 2 cores half the answers took over 1 s (13,028 resends at 1 s).
pub(super) const HELLO_RESEND_FIRST: Duration = Duration::from_secs(2);

pub(super) const HELLO_RESEND_MAX: Duration = Duration::from_secs(8);

impl Probing {
    pub(super) fn idle() -> Probing {
        Probing {
            next_at: Instant::now(),
            interval: PROBE_FIRST,
            inflight: None,
        }
    }
}

/// Hellos in flight to the workers of one server.
pub(super) struct Greeting {
    pub(super) endpoints: Vec<Link>,
    /// The request id of each worker's latest hello.
    pub(super) ids: Vec<u64>,
    /// Each worker's greeting: the request id of its first hello, carried by every hello sent
    /// again, so that the server answers those with the connection it opened for the first.
    greetings: Vec<u64>,
    /// This client's earlier connection to each worker, retired by the hello (0: none).
    retire: Vec<u32>,
    /// Hellos sent to each worker so far.
    pub(super) sent: u32,
}

impl Greeting {
    /// Gives up on a server that did not answer: its endpoints are closed forcibly (a flushed
    /// close would wait for the silent server).
    fn abort(&self) {
        for link in &self.endpoints {
            link.endpoint.abort();
        }
    }
}

/// Ready once more of the hellos `ids` are settled (answered, or their endpoint failed) than
/// `settled` were when it was made.
struct MoreHellos<'a> {
    shared: &'a Shared,
    ids: &'a [u64],
    settled: usize,
}

impl MoreHellos<'_> {
    fn settled(shared: &Shared, ids: &[u64]) -> usize {
        let pending = shared.pending.borrow();
        let settled =
            |p: &PendingRpc| p.reply.is_some() || p.down.as_ref().is_some_and(|d| d.borrow().is_some());
        ids.iter()
            .filter(|id| pending.get(id).is_none_or(settled))
            .count()
    }
}

impl Future for MoreHellos<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Self::settled(self.shared, self.ids) > self.settled {
            return Poll::Ready(());
        }
        let mut pending = self.shared.pending.borrow_mut();
        for id in self.ids {
            if let Some(p) = pending.get_mut(id) {
                p.waker = Some(cx.waker().clone());
            }
        }
        Poll::Pending
    }
}

/// Ready once no call is greeting the server at `index` (see [`Client::connect_on_use`]).
struct Greeted<'a> {
    client: &'a Client,
    index: usize,
}

impl Future for Greeted<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut links = self.client.links.borrow_mut();
        let link = &mut links[self.index];
        if !link.connecting {
            return Poll::Ready(());
        }
        link.waiters.push(cx.waker().clone());
        Poll::Pending
    }
}

/// Ends a call's greeting of the server at `index`, and wakes the calls waiting for it, even
/// if the greeting call is dropped part way.
struct GreetingDone<'a> {
    client: &'a Client,
    index: usize,
}

impl Drop for GreetingDone<'_> {
    fn drop(&mut self) {
        let waiters = {
            let mut links = self.client.links.borrow_mut();
            let link = &mut links[self.index];
            link.connecting = false;
            std::mem::take(&mut link.waiters)
        };
        for w in waiters {
            w.wake();
        }
    }
}

/// A server being connected to by [`Client::greet`].
struct Connecting {
    index: usize,
    greeting: Greeting,
    resend_at: Instant,
    interval: Duration,
}

impl Client {
    /// Starts connecting to every worker of the server at `index`: endpoints, then a hello on
    /// each (retiring `retire`, this client's earlier connections there). The hellos' replies
    /// (each carrying a connection id) arrive like any other; see [`Self::hello_outcome`].
    pub(super) fn start_hellos(&self, index: usize, retire: &[u32]) -> Result<Greeting> {
        super::netns::enter()?;
        let entry = self
            .moved
            .borrow()
            .get(&index)
            .cloned()
            .unwrap_or_else(|| self.membership[index].clone());
        let worker = self.worker.borrow().clone();
        let mut greeting = Greeting {
            endpoints: Vec::new(),
            ids: Vec::new(),
            greetings: Vec::new(),
            retire: Vec::new(),
            sent: 1,
        };
        for (w, server_address) in entry.addresses()?.iter().enumerate() {
            let endpoint = worker
                .connect(server_address, self.config.network.peer_error_handling)
                .map_err(|e| Error::ServerLost {
                    server: entry.id,
                    reason: format!("cannot connect: {e}"),
                })?;
            let down: Down = Rc::default();
            let (shared, flag) = (Rc::downgrade(&self.shared), down.clone());
            endpoint.on_failure(move |e| {
                if let Some(s) = shared.upgrade() {
                    s.endpoint_failed(&flag, e.to_string());
                }
            });
            let old = retire.get(w).copied().unwrap_or(0);
            let id = self.request_id();
            self.send_hello(&endpoint, &down, id, old, id);
            greeting.endpoints.push(Link { endpoint, down });
            greeting.ids.push(id);
            greeting.greetings.push(id);
            greeting.retire.push(old);
        }
        Ok(greeting)
    }

    /// Looks the lost server at `index` up in the registry again: whether it published other
    /// addresses (it restarted), which later hellos then go to.
    fn readdressed(&self, index: usize) -> bool {
        let id = self.membership[index].id;
        let Ok(now) = crate::registry::read_entry(&self.registry_dir, id) else {
            return false;
        };
        let known = self.moved.borrow().get(&index).map_or_else(
            || self.membership[index].ucx_addresses.clone(),
            |e| e.ucx_addresses.clone(),
        );
        if now.ucx_addresses == known {
            return false;
        }
        self.moved.borrow_mut().insert(index, now);
        true
    }

    /// Sends hello `id` (greeting `greeting`, retiring connection `retire`) on `endpoint`.
    fn send_hello(&self, endpoint: &Endpoint, down: &Down, id: u64, retire: u32, greeting: u64) {
        let address = self.address.borrow().clone();
        let header = Header::request(
            Op::Hello,
            id,
            0,
            u64::from(retire),
            greeting,
            address.len() as u64,
        )
        .with_token(self.token);
        self.shared.pending.borrow_mut().insert(
            id,
            PendingRpc {
                down: Some(down.clone()),
                ..Default::default()
            },
        );
        // SAFETY: the address is owned by `self.address`, replaced only after every endpoint
        // (and so every send on one) is closed.
        drop(unsafe { endpoint.send_am(AM_REQUEST, &header.encode(), &address, None) });
    }

    /// Greets every worker of `greeting` again, on the same endpoints and with the same
    /// greetings; an answer to an earlier hello then counts as late.
    fn resend_hellos(&self, greeting: &mut Greeting) {
        self.forget_hellos(&greeting.ids);
        for w in 0..greeting.endpoints.len() {
            let id = self.request_id();
            let link = &greeting.endpoints[w];
            self.send_hello(
                &link.endpoint,
                &link.down,
                id,
                greeting.retire[w],
                greeting.greetings[w],
            );
            greeting.ids[w] = id;
        }
        greeting.sent += 1;
        self.telemetry.metrics.count_hello_resend();
    }

    fn forget_hellos(&self, ids: &[u64]) {
        let mut pending = self.shared.pending.borrow_mut();
        for id in ids {
            pending.remove(id);
        }
    }

    /// The outcome of hellos `ids` once every one is answered or any failed: the connection
    /// ids, or why not. Their pending entries are removed then; `None` while waiting.
    pub(super) fn hello_outcome(&self, ids: &[u64]) -> Option<std::result::Result<Vec<u32>, String>> {
        let mut pending = self.shared.pending.borrow_mut();
        let mut conns = Vec::with_capacity(ids.len());
        let mut failure = None;
        for id in ids {
            match pending.get(id).map(|p| &p.reply) {
                Some(Some(Ok(h))) if h.status == 0 => match h.value() {
                    ReplyValue::Connection(id) => conns.push(id),
                    other => failure = Some(format!("hello answered with {other:?}")),
                },
                Some(Some(Ok(h))) => {
                    failure = Some(format!(
                        "hello answered with {}",
                        std::io::Error::from_raw_os_error(-h.status)
                    ))
                }
                Some(Some(Err(ReplyFailure::Lost(r) | ReplyFailure::Malformed(r)))) => {
                    failure = Some(r.clone())
                }
                Some(None) => {
                    let down = pending.get(id).and_then(|p| p.down.as_ref());
                    match down.and_then(|d| d.borrow().clone()) {
                        Some(r) => failure = Some(r),
                        None => return None,
                    }
                }
                None => failure = Some("hello vanished".into()),
            }
        }
        for id in ids {
            pending.remove(id);
        }
        Some(failure.map_or(Ok(conns), Err))
    }

    /// Connects to the servers at `indices` (see [`Self::greet`]) from outside the event loop:
    /// at start with `cluster.connect_at_start`, and after a transport rebuild.
    pub(super) fn connect_servers(&self, indices: &[usize], deadline: Instant) -> Vec<(usize, Error)> {
        match self.runtime.block_on(self.greet(indices, deadline)) {
            Ok(failed) => failed,
            // The loop could not run (a forked child's inherited client): nothing answered.
            Err(e) => indices
                .iter()
                .map(|&index| {
                    (
                        index,
                        Error::ServerLost {
                            server: self.membership[index].id,
                            reason: e.to_string(),
                        },
                    )
                })
                .collect(),
        }
    }

    /// Connects to the server at `index` if no call has yet (without
    /// `cluster.connect_at_start`, a client connects to a server on its first request there):
    /// one call greets it, within `client.request_timeout_s`, and calls that need it meanwhile
    /// wait for that greeting. A server that cannot be reached is marked lost, so it is probed
    /// like one lost later, and the call fails naming it.
    pub(super) async fn connect_on_use(&self, index: usize) -> Result<()> {
        loop {
            {
                let links = self.links.borrow();
                let link = &links[index];
                if !link.endpoints.is_empty() || link.lost.is_some() {
                    return Ok(());
                }
                if !link.connecting {
                    break;
                }
            }
            Greeted { client: self, index }.await;
        }
        self.links.borrow_mut()[index].connecting = true;
        let _done = GreetingDone { client: self, index };
        let timeout = Duration::from_secs_f64(self.config.client.request_timeout_s);
        match self.greet(&[index], Instant::now() + timeout).await.pop() {
            None => Ok(()),
            Some((_, e)) => {
                if let Error::ServerLost { reason, .. } = &e {
                    self.mark_lost(index, reason.clone());
                }
                Err(e)
            }
        }
    }

    /// Connects to the servers at `indices`, with hellos in flight to at most
    /// `cluster.connect_parallel` of them at once, until `deadline`. Sleeps until an answer, a
    /// failure or a resend is due. A silent server is greeted again ([`HELLO_RESEND_FIRST`],
    /// doubling); a transport failure or a refusal ends its attempt at once, with nothing sent
    /// again. Admits every server that answered and returns the others, each with why.
    async fn greet(&self, indices: &[usize], deadline: Instant) -> Vec<(usize, Error)> {
        let started = Instant::now();
        let limit = self.config.cluster.connect_parallel.max(1) as usize;
        let mut queued = indices.iter().copied();
        let mut active: Vec<Connecting> = Vec::new();
        let mut failed = Vec::new();
        let lost = |index: usize, reason: String| {
            (
                index,
                Error::ServerLost {
                    server: self.membership[index].id,
                    reason,
                },
            )
        };
        let reactor = self.runtime.reactor().clone();
        loop {
            while active.len() < limit {
                let Some(index) = queued.next() else { break };
                match self.start_hellos(index, &[]) {
                    Ok(greeting) => active.push(Connecting {
                        index,
                        greeting,
                        resend_at: Instant::now() + HELLO_RESEND_FIRST,
                        interval: HELLO_RESEND_FIRST,
                    }),
                    Err(e) => failed.push((index, e)),
                }
            }
            if active.is_empty() {
                break;
            }
            let now = Instant::now();
            let mut k = 0;
            while k < active.len() {
                let c = &mut active[k];
                match self.hello_outcome(&c.greeting.ids) {
                    Some(outcome) => {
                        let c = active.swap_remove(k);
                        match outcome {
                            Ok(conns) => self.admit(c.index, c.greeting.endpoints, conns),
                            Err(reason) => failed.push(lost(c.index, reason)),
                        }
                    }
                    None if now >= deadline => {
                        let c = active.swap_remove(k);
                        self.forget_hellos(&c.greeting.ids);
                        c.greeting.abort();
                        let waited = now.saturating_duration_since(started).as_secs_f64();
                        let sent = c.greeting.sent;
                        failed.push(lost(
                            c.index,
                            format!("no answer to hello in {waited:.1} s ({sent} sent)"),
                        ));
                    }
                    None => {
                        if now >= c.resend_at {
                            self.resend_hellos(&mut c.greeting);
                            c.interval = (c.interval * 2).min(HELLO_RESEND_MAX);
                            c.resend_at = now + c.interval;
                        }
                        k += 1;
                    }
                }
            }
            let Some(wake) = active.iter().map(|c| c.resend_at.min(deadline)).min() else {
                continue;
            };
            let ids: Vec<u64> = active
                .iter()
                .flat_map(|c| c.greeting.ids.iter().copied())
                .collect();
            let wait = wake.saturating_duration_since(Instant::now());
            let settled = MoreHellos::settled(&self.shared, &ids);
            with_timeout(
                &reactor,
                wait,
                MoreHellos {
                    shared: &self.shared,
                    ids: &ids,
                    settled,
                },
            )
            .await;
        }
        self.telemetry.metrics.record_connect(ns(started.elapsed()));
        failed.sort_by_key(|(index, _)| *index);
        failed
    }

    /// Installs connections to the server at `index` and clears its lost state.
    pub(super) fn admit(&self, index: usize, endpoints: Vec<Link>, conns: Vec<u32>) {
        let old = {
            let mut links = self.links.borrow_mut();
            let link = &mut links[index];
            link.conns = conns;
            link.probe = Probing::idle();
            if link.lost.take().is_some() {
                crate::warn_line!("benchfs: server {} answers again: re-admitted", link.id);
            }
            std::mem::replace(&mut link.endpoints, endpoints.into_iter().map(Some).collect())
        };
        // Closing progresses UCX: done with no borrow held.
        drop(old);
    }

    /// Advances the probes of lost servers (called as each public call starts; a client has
    /// no thread of its own): starts a hello when one is due, re-admits a server on its answer.
    pub(super) fn poll_probes(&self) {
        let lost: Vec<usize> = self
            .links
            .borrow()
            .iter()
            .enumerate()
            .filter(|(_, l)| l.lost.is_some())
            .map(|(i, _)| i)
            .collect();
        if lost.is_empty() {
            return;
        }
        self.worker.borrow().progress();
        let now = Instant::now();
        for index in lost {
            let inflight = self.links.borrow_mut()[index].probe.inflight.take();
            let retry = match inflight {
                Some((greeting, started)) => match self.hello_outcome(&greeting.ids) {
                    Some(Ok(conns)) => {
                        self.admit(index, greeting.endpoints, conns);
                        continue;
                    }
                    None if now.saturating_duration_since(started) < PROBE_MAX => {
                        self.links.borrow_mut()[index].probe.inflight = Some((greeting, started));
                        continue;
                    }
                    _ => {
                        self.forget_hellos(&greeting.ids);
                        greeting.abort();
                        true
                    }
                },
                None if now >= self.links.borrow()[index].probe.next_at => {
                    // A server that restarted is another instance: nothing to retire there.
                    let retire = if self.readdressed(index) {
                        Vec::new()
                    } else {
                        self.links.borrow()[index].conns.clone()
                    };
                    match self.start_hellos(index, &retire) {
                        Ok(greeting) => {
                            self.links.borrow_mut()[index].probe.inflight = Some((greeting, now));
                            false
                        }
                        Err(_) => true,
                    }
                }
                None => false,
            };
            if retry {
                let mut links = self.links.borrow_mut();
                let probe = &mut links[index].probe;
                probe.next_at = now + probe.interval;
                probe.interval = (probe.interval * 2).min(PROBE_MAX);
            }
        }
    }
}
