//! The per-thread event loop that drives tasks, one io_uring and (optionally) one UCX worker.
//!
//! Each turn runs every ready task, progresses UCX, reaps completions, and submits all queued
//! SQEs with one `io_uring_enter`. No timer ever gates submission: under load batches grow by
//! themselves, at low load a request is submitted in the turn that produced it. When nothing is
//! ready the thread sleeps in the kernel (`io_uring_enter` waiting for one CQE) until an I/O
//! completes, the armed UCX event fd becomes readable (a poll SQE on the same ring), another
//! thread notifies the loop's eventfd, or the earliest timer (request timeouts) is due.

use std::cell::{Cell, RefCell};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use futures::executor::{LocalPool, LocalSpawner};
use futures::task::LocalSpawnExt;
use io_uring::{opcode, squeue, types, IoUring};

use benchfs_ucx::Worker;

use crate::buffer::{BufferPool, IoBuffer};
use crate::error::{Error, Result};
use crate::telemetry::SubmitStats;

/// A poll of the UCX worker's event fd: this bit and the worker's generation, so that the poll
/// of a worker since replaced completes as a stale token (op slots never reach this bit).
const TOKEN_UCX: u64 = 1 << 62;
const TOKEN_NOTIFY: u64 = u64::MAX;

/// The first and the longest pause of a loop whose UCX wakes it with nothing to do (see
/// `Reactor::fruitless_wakes`).
const BUSY_PAUSE_FIRST: Duration = Duration::from_micros(100);
const BUSY_PAUSE_MAX: Duration = Duration::from_millis(10);

enum OpSlot {
    Free,
    /// In flight; the buffer stays here until the kernel is done with it.
    Pending {
        waker: Option<Waker>,
        buf: Option<IoBuffer>,
        abandoned: bool,
    },
    Done {
        result: i32,
        buf: Option<IoBuffer>,
    },
}

/// Owns the ring, the timers and the wakeup sources of one thread.
pub struct Reactor {
    ring: RefCell<IoUring>,
    slots: RefCell<Vec<OpSlot>>,
    free_slots: RefCell<Vec<usize>>,
    /// SQEs that did not fit in the submission queue; pushed first on the next turn.
    backlog: RefCell<VecDeque<(squeue::Entry, bool)>>,
    /// Data SQEs placed in the submission queue since the last `io_uring_enter`.
    unsubmitted: Cell<u32>,
    timers: RefCell<BinaryHeap<Reverse<(Instant, u64)>>>,
    timer_wakers: RefCell<HashMap<u64, Waker>>,
    next_timer: Cell<u64>,
    ucx: RefCell<Option<Worker>>,
    /// Counts the workers attached (the low bits of `TOKEN_UCX` polls).
    ucx_generation: Cell<u64>,
    ucx_poll_armed: Cell<bool>,
    notify_fd: OwnedFd,
    notify_armed: Cell<bool>,
    notified: Cell<bool>,
    notify_waker: RefCell<Option<Waker>>,
    /// Set when this turn woke a task, so the loop must not sleep.
    woke: Cell<bool>,
    /// Data operations (not the loop's own polls) queued or in the kernel.
    inflight: Cell<u32>,
    /// Where depth-at-submit and batch sizes are recorded (the telemetry of this loop).
    submit_stats: SubmitStats,
    /// Timer-gated submission: hold data SQEs this long. Servers never do; the storage bench
    /// (benchfs-tools) does, to measure what such designs cost.
    hold: Option<Duration>,
    last_flush: Cell<Instant>,
    /// The pool whose buffers are registered as fixed buffers.
    fixed_pool: Cell<Option<usize>>,
    /// How long to keep polling after activity before sleeping (0: never spin).
    spin: Cell<Duration>,
    /// Whether the last turn did work (only then does the loop spin before sleeping).
    was_active: Cell<bool>,
    /// Set when the poll on UCX's event descriptor completed.
    ucx_fired: Cell<bool>,
    /// UCX wake-ups in a row after which progress found nothing to do. UCX's TCP transport
    /// can leave its event descriptor readable with nothing for progress to consume (while
    /// peers connect); polling it again at once spins, and hundreds of processes spinning so on
    /// two cores (25-40 thousand turns a second each, measured) left none for the peers they
    /// waited for. From the second such wake-up on, the loop pauses before polling UCX again,
    /// from BUSY_PAUSE_FIRST doubling to BUSY_PAUSE_MAX; other events (completions, timers,
    /// notifications) still wake it at once.
    fruitless_wakes: Cell<u32>,
    /// Whether the last turn paused instead of polling UCX (the next one polls it again).
    paused: Cell<bool>,
}

/// A cloneable, `Send` handle that wakes a sleeping loop from another thread.
#[derive(Clone)]
pub struct Notifier {
    fd: Arc<OwnedFd>,
}

impl Notifier {
    /// Whether both wake the same loop.
    pub fn same_loop(&self, other: &Notifier) -> bool {
        Arc::ptr_eq(&self.fd, &other.fd)
    }

    pub fn notify(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a valid u64 to an eventfd we own.
        unsafe {
            libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8);
        }
    }
}

impl Reactor {
    fn new(entries: u32, hold: Option<Duration>) -> Result<Rc<Reactor>> {
        let ring = IoUring::new(entries).map_err(|e| Error::io("io_uring_setup", e))?;
        // SAFETY: eventfd returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(Error::io("eventfd", io::Error::last_os_error()));
        }
        Ok(Rc::new(Reactor {
            ring: RefCell::new(ring),
            slots: RefCell::new(Vec::new()),
            free_slots: RefCell::new(Vec::new()),
            backlog: RefCell::new(VecDeque::new()),
            unsubmitted: Cell::new(0),
            timers: RefCell::new(BinaryHeap::new()),
            timer_wakers: RefCell::new(HashMap::new()),
            next_timer: Cell::new(0),
            ucx: RefCell::new(None),
            ucx_generation: Cell::new(0),
            ucx_poll_armed: Cell::new(false),
            // SAFETY: fd is a fresh descriptor owned by nothing else.
            notify_fd: unsafe { OwnedFd::from_raw_fd(fd) },
            notify_armed: Cell::new(false),
            notified: Cell::new(false),
            notify_waker: RefCell::new(None),
            woke: Cell::new(false),
            inflight: Cell::new(0),
            submit_stats: SubmitStats::default(),
            hold,
            last_flush: Cell::new(Instant::now()),
            fixed_pool: Cell::new(None),
            spin: Cell::new(Duration::ZERO),
            was_active: Cell::new(false),
            ucx_fired: Cell::new(false),
            fruitless_wakes: Cell::new(0),
            paused: Cell::new(false),
        }))
    }

    /// Lets the loop progress and sleep on this UCX worker.
    pub fn attach_ucx(&self, worker: Worker) {
        if self.ucx_poll_armed.replace(false) {
            // The replaced worker's event fd is still polled: cancel that poll, or the new
            // worker's fd would never be (both completions carry the old, stale token).
            let stale = self.ucx_token();
            self.push_sqe(opcode::AsyncCancel::new(stale).build().user_data(stale), false);
        }
        self.ucx_generation
            .set((self.ucx_generation.get() + 1) & (TOKEN_UCX - 1));
        *self.ucx.borrow_mut() = Some(worker);
    }

    fn ucx_token(&self) -> u64 {
        TOKEN_UCX | self.ucx_generation.get()
    }

    /// A handle for other threads; the duplicate descriptor keeps working after the loop ends.
    pub fn notifier(&self) -> Result<Notifier> {
        let dup = self
            .notify_fd
            .try_clone()
            .map_err(|e| Error::io("dup eventfd", e))?;
        Ok(Notifier { fd: Arc::new(dup) })
    }

    /// Places an SQE in the submission queue, or in the backlog when the queue is full (a full
    /// queue is never an error: the SQE goes in on the next turn).
    fn push_sqe(&self, entry: squeue::Entry, data: bool) {
        let mut ring = self.ring.borrow_mut();
        // SAFETY: every SQE's buffers are owned by its slot until the CQE arrives.
        if unsafe { ring.submission().push(&entry) }.is_ok() {
            if data {
                self.unsubmitted.set(self.unsubmitted.get() + 1);
            }
        } else {
            self.backlog.borrow_mut().push_back((entry, data));
        }
    }

    fn new_slot(&self, buf: Option<IoBuffer>) -> usize {
        let slot = OpSlot::Pending {
            waker: None,
            buf,
            abandoned: false,
        };
        let mut slots = self.slots.borrow_mut();
        match self.free_slots.borrow_mut().pop() {
            Some(i) => {
                slots[i] = slot;
                i
            }
            None => {
                slots.push(slot);
                slots.len() - 1
            }
        }
    }

    fn release_slot(&self, i: usize) {
        self.slots.borrow_mut()[i] = OpSlot::Free;
        self.free_slots.borrow_mut().push(i);
    }

    /// Queues a data SQE whose memory (if any) is `buf`, owned by the slot until completion.
    fn start(self: &Rc<Self>, build: impl FnOnce(u64) -> squeue::Entry, buf: Option<IoBuffer>) -> IoOp {
        let slot = self.new_slot(buf);
        self.inflight.set(self.inflight.get() + 1);
        let sqe = build(slot as u64);
        if self.hold.is_some() {
            self.backlog.borrow_mut().push_back((sqe, true));
        } else {
            self.push_sqe(sqe, true);
        }
        IoOp {
            reactor: self.clone(),
            slot,
            finished: false,
        }
    }

    /// Registers a pool's buffers with the ring: its buffers then move with
    /// `READ_FIXED`/`WRITE_FIXED`, which skip pinning pages per operation.
    pub fn register_buffers(&self, pool: &BufferPool) -> Result<()> {
        let iovecs = pool.iovecs()?;
        // SAFETY: the pool's buffers stay allocated as long as the pool; its owners keep it
        // alive until the ring has no operation in flight (`Runtime::quiesce`).
        unsafe { self.ring.borrow().submitter().register_buffers(&iovecs) }
            .map_err(|e| Error::io("io_uring buffer registration", e))?;
        self.fixed_pool.set(Some(pool.id()));
        Ok(())
    }

    fn fixed_index(&self, buf: &IoBuffer) -> Option<u16> {
        self.fixed_pool.get().and_then(|id| buf.fixed_index(id))
    }

    /// Writes `buf[start..start+len]` at `offset` of `fd`; returns the result and the buffer.
    pub fn write_at(
        self: &Rc<Self>,
        fd: RawFd,
        buf: IoBuffer,
        start: usize,
        len: usize,
        offset: u64,
    ) -> IoOp {
        let start = start.min(buf.capacity());
        let len = len.min(buf.capacity() - start) as u32;
        // SAFETY: start is within the allocation.
        let ptr = unsafe { buf.as_ptr().add(start) };
        let fixed = self.fixed_index(&buf);
        self.start(
            |token| match fixed {
                Some(index) => opcode::WriteFixed::new(types::Fd(fd), ptr, len, index)
                    .offset(offset)
                    .build()
                    .user_data(token),
                None => opcode::Write::new(types::Fd(fd), ptr, len)
                    .offset(offset)
                    .build()
                    .user_data(token),
            },
            Some(buf),
        )
    }

    /// Reads up to `len` bytes at `offset` of `fd` into the start of `buf`.
    pub fn read_at(self: &Rc<Self>, fd: RawFd, mut buf: IoBuffer, len: usize, offset: u64) -> IoOp {
        let ptr = buf.as_mut_ptr();
        let len = len.min(buf.capacity()) as u32;
        let fixed = self.fixed_index(&buf);
        self.start(
            |token| match fixed {
                Some(index) => opcode::ReadFixed::new(types::Fd(fd), ptr, len, index)
                    .offset(offset)
                    .build()
                    .user_data(token),
                None => opcode::Read::new(types::Fd(fd), ptr, len)
                    .offset(offset)
                    .build()
                    .user_data(token),
            },
            Some(buf),
        )
    }

    /// Opens `path` (relative to the working directory) through the ring, so a slow open or
    /// create never stalls the loop. Resolves to the new descriptor.
    pub fn openat(self: &Rc<Self>, path: &std::path::Path, flags: i32, mode: u32) -> IoOp {
        use std::os::unix::ffi::OsStrExt;
        // The path is owned by the slot until the kernel is done reading it.
        let mut bytes = path.as_os_str().as_bytes().to_vec();
        bytes.push(0);
        let buf = IoBuffer::Heap(bytes);
        let ptr = buf.as_ptr().cast::<libc::c_char>();
        self.start(
            |token| {
                opcode::OpenAt::new(types::Fd(libc::AT_FDCWD), ptr)
                    .flags(flags | libc::O_CLOEXEC)
                    .mode(mode)
                    .build()
                    .user_data(token)
            },
            Some(buf),
        )
    }

    /// `fdatasync(fd)` through the ring.
    pub fn fdatasync(self: &Rc<Self>, fd: RawFd) -> IoOp {
        self.start(
            |token| {
                opcode::Fsync::new(types::Fd(fd))
                    .flags(types::FsyncFlags::DATASYNC)
                    .build()
                    .user_data(token)
            },
            None,
        )
    }

    /// Data operations queued or in the kernel right now.
    pub fn inflight(&self) -> u32 {
        self.inflight.get()
    }

    /// Polls for up to `spin` after activity before sleeping in the kernel.
    pub fn set_spin(&self, spin: Duration) {
        self.spin.set(spin);
    }

    /// This loop's submissions (in-flight depth, batch size), recorded once enabled.
    pub fn submit_stats(&self) -> &SubmitStats {
        &self.submit_stats
    }

    /// One `io_uring_enter` put `sqes` data operations in the kernel, leaving `depth` in
    /// flight: each of them counts as submitted at that depth.
    fn record_submit(&self, sqes: u32) {
        self.submit_stats.record(self.inflight.get(), sqes);
    }

    /// A future that resolves after `dur` (for request timeouts, never for batching I/O).
    pub fn sleep(self: &Rc<Self>, dur: Duration) -> Sleep {
        Sleep {
            reactor: self.clone(),
            deadline: Instant::now() + dur,
            id: None,
        }
    }

    /// Resolves once another thread called [`Notifier::notify`] (level-triggered: stays ready).
    pub fn notified(self: &Rc<Self>) -> Notified {
        Notified {
            reactor: self.clone(),
        }
    }

    /// Lowers the flag [`Notified`] resolves on, for a loop that waits for notifications
    /// again and again (it checks what it waits for after lowering it).
    pub fn reset_notified(&self) {
        self.notified.set(false);
    }

    fn wake(&self, waker: Waker) {
        self.woke.set(true);
        waker.wake();
    }

    fn reap(&self) {
        let mut done = Vec::new();
        {
            let mut ring = self.ring.borrow_mut();
            for cqe in ring.completion() {
                done.push((cqe.user_data(), cqe.result()));
            }
        }
        for (token, result) in done {
            match token {
                TOKEN_NOTIFY => {
                    self.notify_armed.set(false);
                    self.notified.set(true);
                    let mut scratch = [0u8; 8];
                    // SAFETY: draining our own nonblocking eventfd into a local buffer.
                    unsafe {
                        libc::read(self.notify_fd.as_raw_fd(), scratch.as_mut_ptr().cast(), 8);
                    }
                    self.woke.set(true);
                    if let Some(w) = self.notify_waker.borrow_mut().take() {
                        w.wake();
                    }
                }
                t if t & TOKEN_UCX != 0 => {
                    if t == self.ucx_token() {
                        // Not a wake-up by itself: the next turn progresses UCX, and whatever
                        // that delivers wakes its tasks (see `fruitless_wakes`).
                        self.ucx_poll_armed.set(false);
                        self.ucx_fired.set(true);
                    }
                }
                slot => self.complete(slot as usize, result),
            }
        }
    }

    fn complete(&self, i: usize, result: i32) {
        self.inflight.set(self.inflight.get().saturating_sub(1));
        let old = {
            let mut slots = self.slots.borrow_mut();
            match slots.get_mut(i) {
                Some(s) => std::mem::replace(s, OpSlot::Free),
                None => return,
            }
        };
        match old {
            OpSlot::Pending { abandoned: true, .. } => {
                // The future is gone; now the kernel is done with the buffer, drop both.
                self.free_slots.borrow_mut().push(i);
            }
            OpSlot::Pending { waker, buf, .. } => {
                self.slots.borrow_mut()[i] = OpSlot::Done { result, buf };
                if let Some(w) = waker {
                    self.wake(w);
                }
            }
            other => self.slots.borrow_mut()[i] = other,
        }
    }

    fn fire_timers(&self) -> Option<Instant> {
        let now = Instant::now();
        let mut timers = self.timers.borrow_mut();
        while let Some(Reverse((deadline, id))) = timers.peek().copied() {
            if deadline > now {
                return Some(deadline);
            }
            timers.pop();
            if let Some(w) = self.timer_wakers.borrow_mut().remove(&id) {
                self.wake(w);
            }
        }
        None
    }

    /// One turn of the loop. Sleeps in the kernel only if `may_sleep` and nothing woke.
    fn turn(&self, may_sleep: bool) -> Result<()> {
        self.woke.set(false);
        let ucx = self.ucx.borrow().clone();
        if let Some(w) = &ucx {
            // UCX callbacks wake tasks directly; any processed event may have woken one.
            while w.progress() > 0 {
                self.woke.set(true);
            }
        }
        if self.woke.get() {
            self.fruitless_wakes.set(0);
        } else if self.ucx_fired.get() {
            self.fruitless_wakes
                .set(self.fruitless_wakes.get().saturating_add(1));
        }
        self.ucx_fired.set(false);
        self.flush_backlog();
        self.reap();
        let next_deadline = self.fire_timers();
        let submit = |want: usize, timeout: Option<Duration>| -> Result<()> {
            let ring = self.ring.borrow();
            let res = match timeout {
                Some(t) => {
                    let ts = types::Timespec::from(t);
                    let args = types::SubmitArgs::new().timespec(&ts);
                    ring.submitter().submit_with_args(want, &args)
                }
                None => ring.submitter().submit_and_wait(want),
            };
            match res {
                Ok(_) => {
                    // Only data SQEs count as a batch; the loop's own polls are bookkeeping.
                    self.record_submit(self.unsubmitted.replace(0));
                    Ok(())
                }
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY) | Some(libc::EAGAIN)
                    ) =>
                {
                    Ok(())
                }
                Err(e) => Err(Error::io("io_uring_enter", e)),
            }
        };
        if self.woke.get() || !may_sleep {
            self.was_active.set(true);
            return submit(0, None);
        }
        if self.ucx_fired.get() {
            // UCX's poll completed after this turn's progress: progress again before sleeping
            // (arming alone need not see what woke it).
            return submit(0, None);
        }
        // A bounded spin after activity: a reply or completion often follows within
        // microseconds, and sleeping would add the kernel's wake-up latency to it. An idle
        // loop (no activity since its last sleep) does not spin.
        if self.was_active.replace(false) && !self.spin.get().is_zero() {
            submit(0, None)?;
            let until = Instant::now() + self.spin.get();
            while Instant::now() < until {
                if let Some(w) = &ucx {
                    if w.progress() > 0 {
                        self.woke.set(true);
                    }
                }
                self.reap();
                if self.woke.get() {
                    self.was_active.set(true);
                    return Ok(());
                }
                // Not a pause: the peer this loop waits for may be runnable on this very CPU
                // (two processes on one core); yielding lets it run (measured: a 4 KiB round
                // trip between a client and a server sharing a CPU took 140-160 µs with a
                // pause, the whole spin lost each time). With nothing else runnable it returns
                // at once.
                std::thread::yield_now();
            }
        }
        let fruitless = self.fruitless_wakes.get();
        let pause = (fruitless >= 2 && !self.paused.get())
            .then(|| (BUSY_PAUSE_FIRST * (1 << (fruitless - 2).min(16))).min(BUSY_PAUSE_MAX));
        self.paused.set(pause.is_some());
        if let (Some(w), None) = (&ucx, pause) {
            if !w.arm()? {
                if fruitless == 0 {
                    return submit(0, None);
                }
                // Events pending again with nothing done: counted as a fruitless wake-up.
                self.ucx_fired.set(true);
                return submit(0, None);
            }
            if !self.ucx_poll_armed.get() {
                let sqe = opcode::PollAdd::new(types::Fd(w.event_fd()), libc::POLLIN as u32)
                    .build()
                    .user_data(self.ucx_token());
                self.push_sqe(sqe, false);
                self.ucx_poll_armed.set(true);
            }
        }
        if !self.notify_armed.get() {
            let sqe = opcode::PollAdd::new(types::Fd(self.notify_fd.as_raw_fd()), libc::POLLIN as u32)
                .build()
                .user_data(TOKEN_NOTIFY);
            self.push_sqe(sqe, false);
            self.notify_armed.set(true);
        }
        let mut timeout = next_deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if let Some(p) = pause {
            timeout = Some(timeout.map_or(p, |t| t.min(p)));
        }
        if let (Some(hold), false) = (self.hold, self.backlog.borrow().is_empty()) {
            let left = hold.saturating_sub(self.last_flush.get().elapsed());
            timeout = Some(timeout.map_or(left, |t| t.min(left)));
        }
        submit(1, timeout)?;
        self.reap();
        self.fire_timers();
        self.was_active.set(self.woke.get());
        Ok(())
    }

    fn flush_backlog(&self) {
        let mut backlog = self.backlog.borrow_mut();
        if backlog.is_empty() {
            return;
        }
        if let Some(hold) = self.hold {
            if self.last_flush.get().elapsed() < hold {
                return;
            }
            self.last_flush.set(Instant::now());
        }
        let mut ring = self.ring.borrow_mut();
        while let Some((entry, data)) = backlog.front() {
            // SAFETY: as in push_sqe.
            if unsafe { ring.submission().push(entry) }.is_err() {
                break;
            }
            if *data {
                self.unsubmitted.set(self.unsubmitted.get() + 1);
            }
            backlog.pop_front();
        }
    }
}

/// An io_uring operation in flight; resolves to (result or errno, the buffer back).
pub struct IoOp {
    reactor: Rc<Reactor>,
    slot: usize,
    finished: bool,
}

impl Future for IoOp {
    type Output = (io::Result<usize>, IoBuffer);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let slot = self.slot;
        let reactor = self.reactor.clone();
        let mut slots = reactor.slots.borrow_mut();
        match &mut slots[slot] {
            OpSlot::Pending { waker, .. } => {
                *waker = Some(cx.waker().clone());
                Poll::Pending
            }
            OpSlot::Done { result, buf } => {
                let result = *result;
                let buf = buf.take().unwrap_or_else(IoBuffer::empty);
                drop(slots);
                reactor.release_slot(slot);
                self.finished = true;
                let out = if result < 0 {
                    Err(io::Error::from_raw_os_error(-result))
                } else {
                    Ok(result as usize)
                };
                Poll::Ready((out, buf))
            }
            OpSlot::Free => Poll::Ready((Err(io::Error::other("io_uring slot lost")), IoBuffer::empty())),
        }
    }
}

impl Drop for IoOp {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let mut slots = self.reactor.slots.borrow_mut();
        match &mut slots[self.slot] {
            OpSlot::Pending { abandoned, .. } => *abandoned = true,
            OpSlot::Done { .. } => {
                drop(slots);
                self.reactor.release_slot(self.slot);
            }
            OpSlot::Free => {}
        }
    }
}

pub struct Sleep {
    reactor: Rc<Reactor>,
    deadline: Instant,
    id: Option<u64>,
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.deadline {
            if let Some(id) = self.id.take() {
                self.reactor.timer_wakers.borrow_mut().remove(&id);
            }
            return Poll::Ready(());
        }
        let id = match self.id {
            Some(id) => id,
            None => {
                let id = self.reactor.next_timer.get();
                self.reactor.next_timer.set(id + 1);
                self.reactor
                    .timers
                    .borrow_mut()
                    .push(Reverse((self.deadline, id)));
                self.id = Some(id);
                id
            }
        };
        self.reactor
            .timer_wakers
            .borrow_mut()
            .insert(id, cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            let live = {
                let mut wakers = self.reactor.timer_wakers.borrow_mut();
                wakers.remove(&id);
                wakers.len()
            };
            // Cancelled timers leave dead heap entries; rebuild once they dominate, so the heap
            // stays proportional to the live timers rather than to the request rate.
            let mut timers = self.reactor.timers.borrow_mut();
            if timers.len() > 64 && timers.len() > 2 * live {
                let wakers = self.reactor.timer_wakers.borrow();
                timers.retain(|Reverse((_, id))| wakers.contains_key(id));
            }
        }
    }
}

pub struct Notified {
    reactor: Rc<Reactor>,
}

impl Future for Notified {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.reactor.notified.get() {
            return Poll::Ready(());
        }
        *self.reactor.notify_waker.borrow_mut() = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// Resolves to `Err(Timeout)`-style `None` when `dur` passes before `fut` completes.
/// Lets every other task that is ready now run first: the task wakes itself and is queued
/// behind them.
pub fn yield_now() -> impl Future<Output = ()> {
    let mut yielded = false;
    futures::future::poll_fn(move |cx| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
}

pub async fn with_timeout<F: Future>(reactor: &Rc<Reactor>, dur: Duration, fut: F) -> Option<F::Output> {
    let fut = pin!(fut);
    let sleep = pin!(reactor.sleep(dur));
    match futures::future::select(fut, sleep).await {
        futures::future::Either::Left((v, _)) => Some(v),
        futures::future::Either::Right(_) => None,
    }
}

struct FlagWaker(AtomicBool);

impl Wake for FlagWaker {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::Release);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::Release);
    }
}

/// A single-threaded runtime: a task pool plus the reactor.
pub struct Runtime {
    pool: RefCell<LocalPool>,
    spawner: LocalSpawner,
    reactor: Rc<Reactor>,
    /// `benchfs_ucx::fork_generation` when made: a forked child must not run its parent's loop.
    generation: u64,
}

impl Runtime {
    pub fn new(ring_entries: u32) -> Result<Runtime> {
        Self::with_submit_hold(ring_entries, None)
    }

    /// A runtime whose data SQEs are held up to `hold` before submission: the hook by which the
    /// storage bench measures timer-gated designs. Servers submit every turn.
    pub fn with_submit_hold(ring_entries: u32, hold: Option<Duration>) -> Result<Runtime> {
        let pool = LocalPool::new();
        let spawner = pool.spawner();
        benchfs_ucx::watch_forks();
        Ok(Runtime {
            pool: RefCell::new(pool),
            spawner,
            reactor: Reactor::new(ring_entries, hold)?,
            generation: benchfs_ucx::fork_generation(),
        })
    }

    /// [`Error::Forked`] in the child of a fork: the ring (its memory shared with the parent)
    /// and everything the loop drives are the parent's.
    fn check_not_forked(&self) -> Result<()> {
        if self.generation != benchfs_ucx::fork_generation() {
            return Err(Error::Forked);
        }
        Ok(())
    }

    pub fn reactor(&self) -> &Rc<Reactor> {
        &self.reactor
    }

    /// Spawns a task on this thread. Callers bound how many they spawn.
    pub fn spawn(&self, fut: impl Future<Output = ()> + 'static) -> Result<()> {
        self.spawner.spawn_local(fut).map_err(|_| Error::Stopped)
    }

    /// Turns the loop until no data operation is in the kernel (bounded by `timeout`), so that
    /// dropping the ring never leaves the kernel holding files or buffers.
    pub fn quiesce(&self, timeout: Duration) -> Result<()> {
        self.check_not_forked()?;
        let deadline = Instant::now() + timeout;
        while self.reactor.inflight() > 0 {
            if Instant::now() >= deadline {
                return Err(Error::io(
                    "stopping the event loop",
                    io::Error::other(format!(
                        "{} I/O operations did not finish",
                        self.reactor.inflight()
                    )),
                ));
            }
            self.pool.borrow_mut().run_until_stalled();
            let wait = pin!(self.reactor.sleep(Duration::from_millis(10)));
            let mut cx = Context::from_waker(futures::task::noop_waker_ref());
            let _ = wait.poll(&mut cx);
            self.reactor.turn(true)?;
        }
        Ok(())
    }

    /// Runs the loop until `fut` completes; spawned tasks run alongside it.
    pub fn block_on<F: Future>(&self, fut: F) -> Result<F::Output> {
        self.check_not_forked()?;
        let flag = Arc::new(FlagWaker(AtomicBool::new(true)));
        let waker = Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        let mut fut = pin!(fut);
        loop {
            if flag.0.swap(false, Ordering::AcqRel) {
                if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                    return Ok(v);
                }
            }
            self.pool.borrow_mut().run_until_stalled();
            let may_sleep = !flag.0.load(Ordering::Acquire);
            self.reactor.turn(may_sleep)?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_fire_in_order_and_cancelled_ones_do_not_accumulate() -> Result<()> {
        let rt = Runtime::new(8)?;
        let reactor = rt.reactor().clone();
        let start = Instant::now();
        let order = rt.block_on(async {
            // Many cancelled timeouts (requests that completed in time).
            for _ in 0..10_000 {
                let mut yielded = false;
                let yield_once = futures::future::poll_fn(|cx| {
                    if yielded {
                        return Poll::Ready(());
                    }
                    yielded = true;
                    cx.waker().wake_by_ref();
                    Poll::Pending
                });
                let _ = with_timeout(&reactor, Duration::from_secs(30), yield_once).await;
            }
            let fast = with_timeout(
                &reactor,
                Duration::from_millis(20),
                futures::future::pending::<()>(),
            )
            .await;
            fast.is_none()
        })?;
        assert!(order, "the pending future must time out");
        assert!(start.elapsed() >= Duration::from_millis(20));
        assert!(start.elapsed() < Duration::from_secs(5));
        assert!(
            reactor.timers.borrow().len() <= 128,
            "heap kept {} dead timers",
            reactor.timers.borrow().len()
        );
        Ok(())
    }

    #[test]
    fn notifier_wakes_a_sleeping_loop_from_another_thread() -> Result<()> {
        let rt = Runtime::new(8)?;
        let notifier = rt.reactor().notifier()?;
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            notifier.notify();
        });
        let start = Instant::now();
        rt.block_on(rt.reactor().notified())?;
        assert!(start.elapsed() < Duration::from_secs(5));
        t.join().map_err(|_| Error::Stopped)?;
        Ok(())
    }

    #[test]
    fn io_uring_write_then_read_round_trips() -> Result<()> {
        use std::os::fd::AsRawFd;
        let rt = Runtime::new(8)?;
        let reactor = rt.reactor().clone();
        let file = tempfile::tempfile().map_err(|e| Error::io("tempfile", e))?;
        let fd = file.as_raw_fd();
        let (written, read_back) = rt.block_on(async {
            let (w, _) = reactor
                .write_at(fd, IoBuffer::Heap(b"hello uring".to_vec()), 6, 5, 100)
                .await;
            let (r, buf) = reactor.read_at(fd, IoBuffer::Heap(vec![0; 16]), 16, 100).await;
            (w, r.map(|n| buf.as_slice(n).to_vec()))
        })?;
        assert_eq!(written.map_err(|e| Error::io("write", e))?, 5);
        assert_eq!(read_back.map_err(|e| Error::io("read", e))?, b"uring");
        Ok(())
    }
}
