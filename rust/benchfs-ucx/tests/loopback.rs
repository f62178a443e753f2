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
