//! Bounds the requests in flight to one server worker: permits handed out first come, first
//! served, and a waiter that gives up never strands the ones behind it.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

#[derive(Default)]
pub(super) struct Window {
    used: Cell<u32>,
    /// Waiting acquirers, oldest first, each once, by ticket.
    waiters: RefCell<VecDeque<(u64, Waker)>>,
    next_ticket: Cell<u64>,
}

/// A slot in the window, given back on drop.
pub(super) struct Permit<'a>(&'a Window);

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.0.used.set(self.0.used.get() - 1);
        self.0.wake_next();
    }
}

impl Window {
    /// Waits for one of `limit` slots.
    pub(super) fn acquire(&self, limit: u32) -> Acquire<'_> {
        Acquire {
            window: self,
            limit,
            ticket: None,
            done: false,
        }
    }

    fn wake_next(&self) {
        let next = self.waiters.borrow_mut().pop_front();
        if let Some((_, waker)) = next {
            waker.wake();
        }
    }
}

/// The future of [`Window::acquire`].
pub(super) struct Acquire<'a> {
    window: &'a Window,
    limit: u32,
    /// Set once this acquirer has queued; out of the queue again once woken.
    ticket: Option<u64>,
    done: bool,
}

impl<'a> Future for Acquire<'a> {
    type Output = Permit<'a>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Permit<'a>> {
        let this = self.get_mut();
        let w = this.window;
        let free = w.used.get() < this.limit;
        let mut waiters = w.waiters.borrow_mut();
        let place = this
            .ticket
            .and_then(|t| waiters.iter().position(|(x, _)| *x == t));
        let take = match (this.ticket, place) {
            // A newcomer goes behind anyone already waiting.
            (None, _) => free && waiters.is_empty(),
            // Still queued (polled without being woken): only the first may take a free slot.
            (Some(_), Some(i)) if i == 0 && free => {
                waiters.pop_front();
                true
            }
            (Some(_), Some(i)) => {
                waiters[i].1 = cx.waker().clone();
                return Poll::Pending;
            }
            // Woken: it was first in line, and stays first if the slot went to someone else.
            (Some(t), None) => {
                if !free {
                    waiters.push_front((t, cx.waker().clone()));
                    return Poll::Pending;
                }
                true
            }
        };
        if take {
            w.used.set(w.used.get() + 1);
            this.done = true;
            return Poll::Ready(Permit(w));
        }
        let t = w.next_ticket.get();
        w.next_ticket.set(t + 1);
        this.ticket = Some(t);
        waiters.push_back((t, cx.waker().clone()));
        Poll::Pending
    }
}

impl Drop for Acquire<'_> {
    fn drop(&mut self) {
        let (Some(t), false) = (self.ticket, self.done) else {
            return;
        };
        let w = self.window;
        let mut waiters = w.waiters.borrow_mut();
        if let Some(i) = waiters.iter().position(|(x, _)| *x == t) {
            waiters.remove(i);
        } else if w.used.get() < self.limit {
            // Woken for a free slot it will not take: the next waiter gets the wake.
            drop(waiters);
            w.wake_next();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::executor::LocalPool;
    use futures::task::{noop_waker, ArcWake, LocalSpawnExt};
    use std::rc::Rc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    async fn yield_now() {
        let mut yielded = false;
        futures::future::poll_fn(|cx| {
            if yielded {
                return Poll::Ready(());
            }
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        })
        .await
    }

    /// Tasks of their own (as threads sharing a client would be): at most `limit` hold a
    /// slot at once, and slots go out in the order the tasks asked.
    #[test]
    fn slots_are_bounded_and_first_come_first_served() {
        let mut pool = LocalPool::new();
        let window = Rc::new(Window::default());
        let order = Rc::new(RefCell::new(Vec::new()));
        let held = Rc::new(Cell::new(0u32));
        let most = Rc::new(Cell::new(0u32));
        for task in 0..8 {
            let (window, order, held, most) = (window.clone(), order.clone(), held.clone(), most.clone());
            pool.spawner()
                .spawn_local(async move {
                    let _permit = window.acquire(3).await;
                    order.borrow_mut().push(task);
                    held.set(held.get() + 1);
                    most.set(most.get().max(held.get()));
                    for _ in 0..task % 3 + 1 {
                        yield_now().await; // the others run while this task holds its slot
                    }
                    held.set(held.get() - 1);
                })
                .unwrap_or_else(|e| panic!("spawn: {e}"));
        }
        pool.run_until_stalled();
        assert_eq!(*order.borrow(), (0..8).collect::<Vec<_>>());
        assert_eq!(most.get(), 3);
        assert_eq!(window.used.get(), 0);
    }

    struct Count(AtomicUsize);

    impl ArcWake for Count {
        fn wake_by_ref(me: &Arc<Self>) {
            me.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_woken_waiter_that_gives_up_passes_the_slot_on() {
        let window = Window::default();
        let noop = noop_waker();
        let mut cx = Context::from_waker(&noop);
        let mut first = Box::pin(window.acquire(1));
        let Poll::Ready(permit) = first.as_mut().poll(&mut cx) else {
            panic!("an empty window should give a slot");
        };
        let (a_wakes, b_wakes) = (
            Arc::new(Count(AtomicUsize::new(0))),
            Arc::new(Count(AtomicUsize::new(0))),
        );
        let (a_waker, b_waker) = (
            futures::task::waker(a_wakes.clone()),
            futures::task::waker(b_wakes.clone()),
        );
        let mut a = Box::pin(window.acquire(1));
        let mut b = Box::pin(window.acquire(1));
        assert!(a.as_mut().poll(&mut Context::from_waker(&a_waker)).is_pending());
        assert!(b.as_mut().poll(&mut Context::from_waker(&b_waker)).is_pending());
        // Polled again without a wake (as a join of many requests does): still queued once.
        assert!(b.as_mut().poll(&mut Context::from_waker(&b_waker)).is_pending());
        assert_eq!(window.waiters.borrow().len(), 2);
        drop(permit);
        assert_eq!(a_wakes.0.load(Ordering::SeqCst), 1);
        drop(a); // woken, but its request was abandoned
        assert_eq!(b_wakes.0.load(Ordering::SeqCst), 1, "b was stranded");
        assert!(b.as_mut().poll(&mut Context::from_waker(&b_waker)).is_ready());
    }

    #[test]
    fn a_queued_waiter_that_gives_up_leaves_the_queue() {
        let window = Window::default();
        let noop = noop_waker();
        let mut cx = Context::from_waker(&noop);
        let mut first = Box::pin(window.acquire(1));
        let Poll::Ready(_permit) = first.as_mut().poll(&mut cx) else {
            panic!("an empty window should give a slot");
        };
        let mut a = Box::pin(window.acquire(1));
        assert!(a.as_mut().poll(&mut cx).is_pending());
        drop(a);
        assert!(window.waiters.borrow().is_empty());
    }
}
