//! The UCP layer on its own: two workers of this process, connected over real UCX TCP,
//! exchanging active messages eagerly and by rendezvous. (UCX's shared-memory transports do
//! not connect two workers of one process; `benchfs-bench rpc --quick` covers them between
//! processes.)

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use benchfs_ucx::{AmData, AmVerdict, Request, RndvDesc, Worker, WorkerOptions};

const AM_ID: u16 = 7;

/// A message as the receiving handler saw it.
enum Got {
    Eager(Vec<u8>, Vec<u8>),
    Rendezvous(Vec<u8>, RndvDesc),
}

fn pair(transports: &str, rndv_threshold: u64) -> Result<(Worker, Worker), String> {
    let options = WorkerOptions {
        transports: Some(transports.into()),
        rndv_threshold: Some(rndv_threshold),
        ..Default::default()
    };
    let a = Worker::with_options(&options).map_err(|e| e.to_string())?;
    let b = Worker::with_options(&options).map_err(|e| e.to_string())?;
    Ok((a, b))
}

/// Progresses both workers until `done()` or 10 s; false on timeout.
fn drive(a: &Worker, b: &Worker, done: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        if Instant::now() > deadline {
            return false;
        }
        a.progress();
        b.progress();
    }
    true
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

fn exchange(transports: &str) -> Result<(), String> {
    let (a, b) = pair(transports, 8192)?;
    let inbox: Rc<RefCell<Vec<Got>>> = Rc::default();
    let sink = inbox.clone();
    b.set_am_handler(AM_ID, move |msg| {
        let header = msg.header.to_vec();
        match msg.data {
            AmData::Eager(data) => {
                sink.borrow_mut().push(Got::Eager(header, data.to_vec()));
                AmVerdict::Done
            }
            AmData::Rendezvous(desc) => {
                sink.borrow_mut().push(Got::Rendezvous(header, desc));
                AmVerdict::Keep
            }
        }
    })
    .map_err(|e| e.to_string())?;
    let address = b.address().map_err(|e| e.to_string())?;
    let ep = a.connect(&address, true).map_err(|e| e.to_string())?;

    // Eager: a small payload arrives whole in the handler.
    let small = pattern(100);
    // SAFETY: `small` outlives the request, which completes below.
    let sent: Request = unsafe { ep.send_am(AM_ID, b"hdr-1", &small, None) };
    if !drive(&a, &b, || sent.is_done() && !inbox.borrow().is_empty()) {
        return Err(format!("{transports}: the eager message did not arrive"));
    }
    match inbox.borrow_mut().pop() {
        Some(Got::Eager(h, d)) if h == b"hdr-1" && d == small => {}
        _ => return Err(format!("{transports}: the eager message arrived changed")),
    }

    // Rendezvous: a payload above the threshold stays at the sender until received.
    let big = pattern(1 << 20);
    // SAFETY: `big` outlives the request, which completes below.
    let sent = unsafe { ep.send_am(AM_ID, b"hdr-2", &big, None) };
    if !drive(&a, &b, || !inbox.borrow().is_empty()) {
        return Err(format!("{transports}: no rendezvous descriptor arrived"));
    }
    let desc = match inbox.borrow_mut().pop() {
        Some(Got::Rendezvous(h, desc)) if h == b"hdr-2" && desc.len == big.len() => desc,
        Some(Got::Eager(..)) => return Err(format!("{transports}: 1 MiB came eagerly")),
        _ => return Err(format!("{transports}: the rendezvous header arrived changed")),
    };
    let mut back = vec![0u8; desc.len];
    // SAFETY: the descriptor was kept by the handler and is used once; `back` outlives the
    // receive, which completes below.
    let received = unsafe { b.recv_data(desc, &mut back, None) };
    if !drive(&a, &b, || received.is_done() && sent.is_done()) {
        return Err(format!("{transports}: the rendezvous receive did not complete"));
    }
    if back != big {
        return Err(format!("{transports}: rendezvous bytes differ"));
    }
    ep.close();
    drive(&a, &b, || true);
    Ok(())
}

#[test]
fn active_messages_over_tcp() -> Result<(), String> {
    exchange("tcp")
}

/// Inside a UCX callback nothing may re-enter UCX's progress or make an endpoint (UCX's TCP
/// transport can then free an endpoint its progress frame still uses): progress asked for
/// there does nothing, a connect is refused, and (in release builds, where it is not an
/// assertion) a close waits until progress returns.
#[test]
#[cfg(not(debug_assertions))]
fn callbacks_cannot_reenter_progress_or_make_endpoints() -> Result<(), String> {
    let (a, b) = pair("tcp", 8192)?;
    let address = a.address().map_err(|e| e.to_string())?;
    let seen: Rc<RefCell<Vec<String>>> = Rc::default();
    let (sink, inner) = (seen.clone(), b.downgrade());
    // The endpoint the handler closes (made outside any callback).
    let doomed = Rc::new(RefCell::new(Some(
        b.connect(&address, true).map_err(|e| e.to_string())?,
    )));
    let in_handler = doomed.clone();
    b.set_am_handler(AM_ID, move |_| {
        let Some(worker) = inner.upgrade() else {
            return AmVerdict::Done;
        };
        sink.borrow_mut().push(format!("progress {}", worker.progress()));
        match worker.connect(&address, true) {
            Ok(_) => sink.borrow_mut().push("connected".into()),
            Err(e) => sink.borrow_mut().push(e.message),
        }
        if let Some(ep) = in_handler.borrow_mut().take() {
            ep.close();
            sink.borrow_mut().push(format!("closed, down {}", ep.is_down()));
        }
        AmVerdict::Done
    })
    .map_err(|e| e.to_string())?;
    let ep = a
        .connect(&b.address().map_err(|e| e.to_string())?, true)
        .map_err(|e| e.to_string())?;
    // SAFETY: the empty payload needs no keeping.
    let sent = unsafe { ep.send_am(AM_ID, b"hdr", &[], None) };
    if !drive(&a, &b, || sent.is_done() && !seen.borrow().is_empty()) {
        return Err("the message did not arrive".into());
    }
    let seen = seen.borrow().clone();
    assert_eq!(
        seen,
        [
            "progress 0".to_string(),
            "refused inside UCX progress (a callback)".into(),
            "closed, down true".into(),
        ]
    );
    assert!(!b.in_progress());
    ep.close();
    // The deferred close ran once progress returned, and completes (flushed) like any other.
    if !drive(&a, &b, || a.held_requests() == 0 && b.held_requests() == 0) {
        return Err("the closes did not complete".into());
    }
    Ok(())
}
