//! A client's telemetry: its counters and histograms, the snapshots written when a public call
//! returns once an interval has passed, and the guards that time calls and attempts.

use std::cell::{Cell, RefCell};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::error::Result;
use crate::registry::RegistryEntry;
use crate::telemetry::{unix_time_ns, ClientMetrics, OpKind, SnapshotWriter};

use super::Client;

/// Client objects made in this process so far: the `worker` of the next one's telemetry file.
pub(super) static CLIENTS_MADE: AtomicU32 = AtomicU32::new(0);

/// Nanoseconds of a duration, saturated.
pub(super) fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A client's telemetry (`docs/telemetry.md`, format version 2): always-on counters, and
/// snapshots written when a public call returns once `telemetry.interval_ms` has passed, and
/// when the client is dropped. No timer and no thread: an idle client writes nothing.
pub(super) struct ClientTelemetry {
    pub(super) metrics: ClientMetrics,
    pub(super) writer: RefCell<Option<SnapshotWriter>>,
    pub(super) interval: Duration,
    pub(super) last_snapshot: Cell<Instant>,
    /// Set while a public call runs, so that nested calls (read's stat) count once.
    pub(super) in_call: Cell<bool>,
    /// The running call's data request answered last so far: its call stages.
    pub(super) critical: Cell<Option<Critical>>,
}

/// Where a data request's time went: from when it could have been sent (`ready`) to its send
/// (the window), the server's queue and the rest of its time there, and the transport (both
/// ways, and both event loops: the reply's time at the client less the server's).
#[derive(Clone, Copy)]
pub(super) struct Critical {
    answered: Instant,
    ready: Instant,
    window_ns: u64,
    queue_ns: u64,
    service_ns: u64,
    transport_ns: u64,
}

impl ClientTelemetry {
    /// Counters for `membership`, and (with `telemetry.dir` set) the file
    /// `client-<pid>-w<n>.tel`, `n` counting the Client objects of this process.
    pub(super) fn new(config: &Config, membership: &[RegistryEntry]) -> Result<ClientTelemetry> {
        let t = &config.telemetry;
        let index = CLIENTS_MADE.fetch_add(1, Ordering::Relaxed);
        let targets: Vec<u32> = membership.iter().map(|e| e.id).collect();
        let writer = if t.dir.is_empty() {
            None
        } else {
            let node = std::env::var("BENCHFS_NODE_NAME")
                .ok()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(crate::server::hostname);
            Some(SnapshotWriter::create_client(
                Path::new(&t.dir),
                std::process::id(),
                index,
                &node,
                &targets,
            )?)
        };
        Ok(ClientTelemetry {
            metrics: ClientMetrics::new(targets, t.enabled),
            writer: RefCell::new(writer),
            interval: Duration::from_millis(t.interval_ms),
            last_snapshot: Cell::new(Instant::now()),
            in_call: Cell::new(false),
            critical: Cell::new(None),
        })
    }

    /// A data request of the running call was answered: sent at `sent`, after waiting for a
    /// window slot since `ready`; the server's reply says `queue_us` and `total_us` (0: not
    /// reported). The request answered last is the call's critical one.
    pub(super) fn answered(&self, ready: Instant, sent: Instant, queue_us: u32, total_us: u32) {
        if total_us == 0 || !self.in_call.get() {
            return;
        }
        let now = Instant::now();
        let rpc_ns = ns(now.saturating_duration_since(sent));
        let total_ns = (u64::from(total_us) * 1000).min(rpc_ns);
        let queue_ns = (u64::from(queue_us) * 1000).min(total_ns);
        self.critical.set(Some(Critical {
            answered: now,
            ready,
            window_ns: ns(sent.saturating_duration_since(ready)),
            queue_ns,
            service_ns: total_ns - queue_ns,
            transport_ns: rpc_ns - total_ns,
        }));
    }

    /// Writes a snapshot if `force` or the interval has passed; reports a failure once.
    pub(super) fn snapshot(&self, now: Instant, force: bool) {
        if !force && now.saturating_duration_since(self.last_snapshot.get()) < self.interval {
            return;
        }
        let mut slot = self.writer.borrow_mut();
        let Some(w) = slot.as_mut() else { return };
        self.last_snapshot.set(now);
        if let Err(e) = w.write(&self.metrics, unix_time_ns()) {
            crate::warn_line!("benchfs: client telemetry snapshots stopped: {e}");
            *slot = None;
        }
    }
}

/// Times one public call (the outermost only) into `call_ns`, and snapshots when it returns.
pub(super) struct CallGuard<'a> {
    pub(super) telemetry: &'a ClientTelemetry,
    pub(super) op: OpKind,
    pub(super) start: Instant,
    pub(super) outer: bool,
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        if !self.outer {
            return;
        }
        let t = self.telemetry;
        t.in_call.set(false);
        let now = Instant::now();
        let call_ns = ns(now.saturating_duration_since(self.start));
        t.metrics.record_call(self.op, call_ns);
        let critical = t.critical.take();
        if matches!(self.op, OpKind::Write | OpKind::Read) {
            let stages = match critical {
                Some(c) => {
                    // The call's time before its critical request could be sent, and after
                    // its answer.
                    let other_ns = ns(c.ready.saturating_duration_since(self.start))
                        + ns(now.saturating_duration_since(c.answered));
                    [c.window_ns, c.queue_ns, c.service_ns, c.transport_ns, other_ns, 0]
                }
                None => [0, 0, 0, 0, 0, call_ns],
            };
            t.metrics.record_call_stages(self.op, stages);
        }
        t.snapshot(now, false);
    }
}

/// One attempt in flight: counted when made, its `rpc_ns` recorded when it ends, however it
/// ends (reply, error, timeout, or abandoned because a sibling request failed).
pub(super) struct Attempt<'a> {
    pub(super) metrics: &'a ClientMetrics,
    pub(super) index: usize,
    pub(super) op: OpKind,
    pub(super) sent: Instant,
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        self.metrics
            .attempt_done(self.index, self.op, ns(self.sent.elapsed()));
    }
}

impl Client {
    /// Starts timing a public call of kind `op` (see [`CallGuard`]).
    pub(super) fn telemetry_call(&self, op: OpKind) -> CallGuard<'_> {
        let outer = !self.telemetry.in_call.replace(true);
        if outer {
            self.telemetry.critical.set(None);
        }
        CallGuard {
            telemetry: &self.telemetry,
            op,
            start: Instant::now(),
            outer,
        }
    }
}
