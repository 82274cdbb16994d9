//! An output whose socket fills keeps its datagrams in order: what finds
//! the socket full is dropped and counted (`EAGAIN`), and what the socket
//! took leaves in the order it came. The output here is the worker's end
//! of a Unix `SOCK_SEQPACKET` pair, as an SRT output's is, whose reader
//! stops reading for a while (an SRT thread not scheduled on a loaded
//! machine). io_uring parked such sends on the socket's wait queue and
//! retried them newest first once the reader drained it: the stream came
//! out with those datagrams reversed.

use std::io::Read;
use std::net::{Ipv4Addr, UdpSocket};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mcrelay_pool::PoolConfig;
use mcrelay_testkit::loopback;
use mcrelay_uring::{OutputSocket, ReceiveMode, WorkerConfig};
use socket2::{Domain, Socket, Type};

/// Generous for a loaded 2-core machine; a passing run never waits it out.
const DEADLINE: Duration = Duration::from_secs(60);

/// Datagrams sent while nobody reads the output: far more than its
/// socket holds.
const SENT: u32 = 400;

fn wait_for(what: &str, mut done: impl FnMut() -> Result<(), String>) {
    let until = Instant::now() + DEADLINE;
    while let Err(e) = done() {
        assert!(Instant::now() < until, "{what} within {DEADLINE:?}: {e}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn check(ok: bool, state: impl FnOnce() -> String) -> Result<(), String> {
    if ok { Ok(()) } else { Err(state()) }
}

#[test]
fn an_output_whose_socket_fills_drops_what_finds_it_full_and_keeps_the_order() {
    let (worker_end, reader) = Socket::pair(Domain::UNIX, Type::SEQPACKET, None).expect("pair");
    worker_end.set_nonblocking(true).expect("nonblocking");
    // The smallest send buffer: a handful of datagrams fill it.
    worker_end.set_send_buffer_size(0).expect("send buffer");
    reader.set_nonblocking(true).expect("nonblocking");
    let (mut flow, to) = loopback::flow("order", &[]);
    let output = OutputSocket::new(
        "pair".into(),
        UdpSocket::from(OwnedFd::from(worker_end)),
        256,
    );
    let counters = Arc::clone(&output.counters);
    flow.outputs.push(output);
    let flow_counters = Arc::clone(&flow.counters);

    let stop = Arc::new(AtomicBool::new(false));
    let (events_tx, _events) = mpsc::channel();
    let worker = mcrelay_uring::spawn(
        WorkerConfig {
            index: 0,
            cpu: None,
            pools: PoolConfig::default(),
            flows: vec![flow],
            receive: ReceiveMode::Auto,
            gso: false,
            standby: false,
        },
        Arc::clone(&stop),
        events_tx,
    )
    .expect("worker");

    // Nobody reads the pair while the datagrams come, a few at a time so
    // the input's buffer never overflows.
    let sender = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind sender");
    for n in 0..SENT {
        sender.send_to(&n.to_be_bytes(), to).expect("send");
        if n % 16 == 15 {
            wait_for("the worker to read what was sent", || {
                let read = flow_counters.packets_in.get();
                check(read > u64::from(n), || {
                    format!("{read} read; output {:?}", &counters)
                })
            });
        }
    }
    wait_for("every datagram received", || {
        let read = flow_counters.packets_in.get();
        check(read == u64::from(SENT), || format!("{read} read"))
    });

    // Then the reader drains the pair until every datagram is accounted
    // for: sent to the pair, or dropped with its reason.
    let mut got = Vec::new();
    let mut buf = [0u8; 64];
    wait_for("every datagram sent or counted as dropped", || {
        while let Ok(n) = (&reader).read(&mut buf) {
            if let Some(number) = buf.get(..n).and_then(|b| b.try_into().ok()) {
                got.push(u32::from_be_bytes(number));
            }
        }
        let out = counters.packets_out.get();
        let dropped = counters.drop_send_error.get() + counters.drop_backlog.get();
        check(
            out + dropped == u64::from(SENT) && got.len() as u64 == out,
            || {
                format!(
                    "{out} sent, {dropped} dropped, {} read: {:?}",
                    got.len(),
                    &counters
                )
            },
        )
    });
    stop.store(true, Ordering::Relaxed);
    worker.join().expect("worker stops cleanly");

    assert!(
        counters.drop_send_error.get() > 0,
        "the pair never filled: the test proves nothing"
    );
    assert_eq!(
        counters.last_error.get(),
        u64::try_from(libc::EAGAIN).expect("positive"),
        "a full socket is counted as EAGAIN"
    );
    let out_of_order: Vec<(u32, u32)> = got
        .windows(2)
        .filter(|w| w[0] >= w[1])
        .map(|w| (w[0], w[1]))
        .collect();
    assert!(
        out_of_order.is_empty(),
        "{} datagrams left out of order, e.g. {:?} (of {} sent to the pair)",
        out_of_order.len(),
        &out_of_order[..out_of_order.len().min(8)],
        got.len()
    );
}
