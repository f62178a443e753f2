//! The write-behind thread (`client.write_behind`): one per process and cluster, started by the
//! first write left behind. It has a client of its own (connections, event loop, telemetry
//! file) and sends the parts the program's clients hand it, so bytes left behind keep moving
//! while the program computes, not only while it is inside a BenchFS call.
//!
//! Bounded: a client hands a part over only while the parts of the process not yet freed
//! (queued, in flight, or still held by UCX after a failure) stay within its
//! `client.write_behind` bytes and [`MAX_PARTS`]; the thread keeps at most
//! `client.max_inflight` requests in flight. Parts of one file that overlap go out one after
//! the other, in the order they were handed over. Nothing waits for a timer: the thread sleeps
//! in the kernel until a part is handed over or a request is answered, and an idle thread
//! sleeps there too.
//!
//! Fork: the thread and its state are the parent's. A child never touches them (every use
//! checks the fork generation first); the child's own clients start a thread of their own.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

use futures::stream::{FuturesUnordered, StreamExt};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::placement::Target;
use crate::protocol::{Header, Op};
use crate::runtime::Notifier;

use super::Client;

/// Parts handed over and not yet freed, in the whole process: with small writes the byte
/// budget alone would let the queue grow to one entry per byte range.
pub(super) const MAX_PARTS: usize = 4096;

/// One write within one chunk, handed over by a client.
pub(super) struct Part {
    pub client: u64,
    pub file: u128,
    /// The id the file's chunks are kept under ([`crate::namespace::Attr::data_id`]).
    pub data_id: u128,
    pub target: Target,
    pub chunk: u64,
    pub in_chunk: u64,
    /// Where the part starts in the file (to order overlapping parts).
    pub offset: u64,
    pub buf: Box<[u8]>,
    /// The handle's count of changes, raised once the part is on its server, so that no
    /// read-ahead taken while it was on its way is used.
    pub changes: Arc<AtomicU64>,
}

impl Part {
    fn overlaps(&self, file: u128, from: u64, to: u64) -> bool {
        self.file == file && self.offset < to && from < self.offset + self.buf.len() as u64
    }
}

/// What one file has behind: parts not yet answered, and failures not yet reported (per
/// client: each client reports its own writes' failures).
#[derive(Default)]
struct FileState {
    unanswered: usize,
    failed: HashMap<u64, Error>,
}

/// The state the program's clients and the thread share.
#[derive(Default)]
pub(super) struct State {
    queue: VecDeque<Part>,
    files: HashMap<u128, FileState>,
    /// Unanswered parts per client.
    clients: HashMap<u64, usize>,
    /// Parts handed over and not yet freed, and their bytes.
    parts: usize,
    bytes: u64,
    stopping: bool,
    /// The thread ended before it was told to (its event loop failed): nothing is queued any
    /// more, and every part it had was failed.
    pub(super) gone: bool,
    /// Event loops of clients waiting for an answer or for room: woken at the next answer.
    waiting: Vec<Notifier>,
}

impl State {
    /// Queues `part` when there is room for it within `budget` bytes (a part larger than the
    /// budget goes alone); gives it back otherwise.
    pub(super) fn offer(&mut self, part: Part, budget: u64) -> Option<Part> {
        let len = part.buf.len() as u64;
        if self.parts > 0 && (self.bytes + len > budget || self.parts >= MAX_PARTS) {
            return Some(part);
        }
        self.parts += 1;
        self.bytes += len;
        self.files.entry(part.file).or_default().unanswered += 1;
        *self.clients.entry(part.client).or_default() += 1;
        self.queue.push_back(part);
        None
    }

    /// Whether file `id` has parts unanswered or failures unreported.
    pub(super) fn has_file(&self, id: u128) -> bool {
        self.files.contains_key(&id)
    }

    pub(super) fn file_answered(&self, id: u128) -> bool {
        self.files.get(&id).is_none_or(|f| f.unanswered == 0)
    }

    pub(super) fn client_unanswered(&self, client: u64) -> usize {
        self.clients.get(&client).copied().unwrap_or(0)
    }

    /// The first failure of `client`'s writes of file `id`, forgotten once taken.
    pub(super) fn take_failure(&mut self, id: u128, client: u64) -> Option<Error> {
        let f = self.files.get_mut(&id)?;
        let e = f.failed.remove(&client);
        if f.unanswered == 0 && f.failed.is_empty() {
            self.files.remove(&id);
        }
        e
    }

    /// Wakes `waiter` at the next answer. One entry per event loop: the clients of a group
    /// share a number, not a loop.
    pub(super) fn wait(&mut self, waiter: &Notifier) {
        if !self.waiting.iter().any(|n| n.same_loop(waiter)) {
            self.waiting.push(waiter.clone());
        }
    }

    /// After the thread ended unbidden: every part it had fails (each writer of a file with
    /// parts left is told at its next write, flush or close), and nobody waits in vain.
    fn give_up(&mut self) {
        self.gone = true;
        self.queue.clear();
        let writers: Vec<u64> = self.clients.drain().map(|(c, _)| c).collect();
        for f in self.files.values_mut().filter(|f| f.unanswered > 0) {
            f.unanswered = 0;
            for &c in &writers {
                f.failed.entry(c).or_insert_with(thread_gone);
            }
        }
    }

    fn answered(&mut self, part: &Part, outcome: Result<()>) {
        if let Some(n) = self.clients.get_mut(&part.client) {
            *n -= 1;
            if *n == 0 {
                self.clients.remove(&part.client);
            }
        }
        if let Some(f) = self.files.get_mut(&part.file) {
            f.unanswered -= 1;
            if let Err(e) = outcome {
                f.failed.entry(part.client).or_insert(e);
            }
            if f.unanswered == 0 && f.failed.is_empty() {
                self.files.remove(&part.file);
            }
        }
    }

    fn freed(&mut self, part: &Part) {
        self.parts -= 1;
        self.bytes -= part.buf.len() as u64;
    }
}

/// The thread of one process and cluster, shared by the clients that write behind.
pub(super) struct Sender {
    state: Arc<Mutex<State>>,
    /// Wakes the thread's event loop.
    thread_loop: Notifier,
    thread: Option<JoinHandle<()>>,
    generation: u64,
    registry: PathBuf,
    token: u64,
}

/// Every sender of this process (a sender ends with the last client using it).
static SENDERS: Mutex<Vec<Weak<Sender>>> = Mutex::new(Vec::new());

/// Whether this process ever started a sender: every read asks for one (`running`), and a
/// process that never wrote behind must not take a global lock for that on each read.
static EVER_STARTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A process-unique number per client: whose writes a part is.
pub(super) fn client_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Sender {
    /// The sender of the cluster at `registry` in this process, started if there is none.
    pub(super) fn for_cluster(registry: &Path, token: u64, config: &Config) -> Result<Arc<Sender>> {
        let generation = benchfs_ucx::fork_generation();
        let mut senders = SENDERS.lock().unwrap_or_else(PoisonError::into_inner);
        senders.retain(|w| w.strong_count() > 0);
        let found = senders
            .iter()
            .filter_map(Weak::upgrade)
            .find(|s| s.generation == generation && s.token == token && s.registry == registry);
        if let Some(s) = found {
            return Ok(s);
        }
        let sender = Arc::new(Sender::start(registry, token, config)?);
        EVER_STARTED.store(true, Ordering::Release);
        senders.push(Arc::downgrade(&sender));
        Ok(sender)
    }

    /// The sender of the cluster at `registry` in this process, if one is running.
    pub(super) fn running(registry: &Path, token: u64) -> Option<Arc<Sender>> {
        if !EVER_STARTED.load(Ordering::Acquire) {
            return None;
        }
        let generation = benchfs_ucx::fork_generation();
        let senders = SENDERS.lock().unwrap_or_else(PoisonError::into_inner);
        senders
            .iter()
            .filter_map(Weak::upgrade)
            .find(|s| s.generation == generation && s.token == token && s.registry == registry)
    }

    fn start(registry: &Path, token: u64, config: &Config) -> Result<Sender> {
        let mut config = config.clone();
        config.client.write_behind = 0;
        config.cluster.connect_at_start = false;
        let state = Arc::new(Mutex::new(State::default()));
        let (started, ready) = std::sync::mpsc::channel();
        let thread = {
            let (state, registry) = (state.clone(), registry.to_path_buf());
            std::thread::Builder::new()
                .name("benchfs-behind".into())
                .spawn(move || {
                    let client = match Client::connect(&registry, config) {
                        Ok(c) => c,
                        Err(e) => return drop(started.send(Err(e))),
                    };
                    match client.runtime.reactor().notifier() {
                        Ok(n) => drop(started.send(Ok(n))),
                        Err(e) => return drop(started.send(Err(e))),
                    }
                    let served =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| serve(&state, &client)));
                    let mut s = lock(&state);
                    if !s.stopping || served.is_err() {
                        s.give_up();
                    }
                    wake_waiting(s);
                })
                .map_err(|e| Error::io("starting the write-behind thread", e))?
        };
        let thread_loop = match ready.recv() {
            Ok(Ok(n)) => n,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(Error::Stopped);
            }
        };
        Ok(Sender {
            state,
            thread_loop,
            thread: Some(thread),
            generation: benchfs_ucx::fork_generation(),
            registry: registry.to_path_buf(),
            token,
        })
    }

    /// The shared state, unless this process is a child forked after the sender started
    /// (then the thread is not here, and its lock may have been held at the fork).
    pub(super) fn state(&self) -> Option<MutexGuard<'_, State>> {
        (self.generation == benchfs_ucx::fork_generation())
            .then(|| self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Tells the thread a part was handed over.
    pub(super) fn handed_over(&self) {
        self.thread_loop.notify();
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        let Some(mut state) = self.state() else {
            // A forked child: the thread is the parent's.
            std::mem::forget(self.thread.take());
            return;
        };
        state.stopping = true;
        drop(state);
        self.thread_loop.notify();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The failure of a part whose thread ended before sending it.
pub(super) fn thread_gone() -> Error {
    Error::io(
        "writing behind",
        std::io::Error::other("the write-behind thread ended before these bytes were sent"),
    )
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The thread: waits for parts, sends them in waves (a wave ends when nothing is queued or in
/// flight; then the client makes sure UCX holds no buffer of a failed request, and those are
/// freed), and ends when told to once nothing is left.
fn serve(state: &Mutex<State>, client: &Client) {
    let reactor = client.runtime.reactor().clone();
    loop {
        let (idle, stopping) = {
            let s = lock(state);
            (s.queue.is_empty(), s.stopping)
        };
        if idle && stopping {
            return;
        }
        if idle {
            if client.runtime.block_on(reactor.notified()).is_err() {
                return;
            }
            reactor.reset_notified();
            continue;
        }
        let held = RefCell::new(Vec::new());
        // A wave's own failures are its parts', recorded for their clients.
        let _ = client.run(async {
            wave(state, client, &held).await;
            Ok(())
        });
        let mut s = lock(state);
        for part in held.into_inner() {
            s.freed(&part);
        }
        wake_waiting(s);
    }
}

/// Sends queued parts, at most `client.max_inflight` at once, until none is queued or in
/// flight. Answered parts are freed at once, unless a request abandoned after a failure may
/// still read memory (then they wait in `held` for the end of the wave). A client probes lost
/// servers (and re-admits those that answer) as a call starts; a stream of writes is one long
/// wave, so the wave does it at each answer while a server is lost.
async fn wave(state: &Mutex<State>, client: &Client, held: &RefCell<Vec<Part>>) {
    let most = client.config.client.max_inflight as usize;
    let reactor = client.runtime.reactor().clone();
    let mut running = FuturesUnordered::new();
    // (file, from, to) of each part in flight, to keep overlapping parts in order.
    let mut flying: Vec<(u128, u64, u64)> = Vec::new();
    loop {
        {
            if client.links.borrow().iter().any(|l| l.lost.is_some()) {
                client.poll_probes();
            }
            let mut s = lock(state);
            while running.len() < most {
                let Some(next) = s.queue.front() else { break };
                let end = next.offset + next.buf.len() as u64;
                if flying.iter().any(|&(f, from, to)| next.overlaps(f, from, to)) {
                    break;
                }
                let Some(part) = s.queue.pop_front() else { break };
                flying.push((part.file, part.offset, end));
                running.push(send(client, part));
            }
            if running.is_empty() {
                return;
            }
        }
        let answer = {
            let notified = reactor.notified();
            futures::pin_mut!(notified);
            match futures::future::select(running.next(), notified).await {
                futures::future::Either::Left((answer, _)) => answer,
                futures::future::Either::Right(_) => None,
            }
        };
        reactor.reset_notified();
        let Some((part, outcome)) = answer else { continue };
        if let Some(i) = flying
            .iter()
            .position(|&(f, from, _)| f == part.file && from == part.offset)
        {
            flying.swap_remove(i);
        }
        part.changes.fetch_add(1, Ordering::AcqRel);
        let ucx_done = client.shared.orphans.borrow().iter().all(|r| r.is_done());
        let mut s = lock(state);
        s.answered(&part, outcome);
        if ucx_done {
            for p in held.borrow_mut().drain(..) {
                s.freed(&p);
            }
            s.freed(&part);
        } else {
            held.borrow_mut().push(part);
        }
        wake_waiting(s);
    }
}

/// One part's write request, as an ordinary write sends it (retries when busy; a lost server
/// or a timeout fails it).
async fn send(client: &Client, part: Part) -> (Part, Result<()>) {
    let header = Header::request(
        Op::WriteChunk,
        0,
        part.data_id,
        part.chunk,
        part.in_chunk,
        part.buf.len() as u64,
    );
    let outcome = client
        .call(part.target, header, &part.buf, None, Instant::now())
        .await
        .map(drop);
    (part, outcome)
}

/// Wakes the clients waiting for answers or room (after the lock is let go).
fn wake_waiting(mut s: MutexGuard<'_, State>) {
    let waiting = std::mem::take(&mut s.waiting);
    drop(s);
    for n in waiting {
        n.notify();
    }
}
