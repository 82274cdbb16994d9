//! Warm standby on a real worker, on loopback: a worker started in standby
//! receives and counts but sends nothing; `SetStandby(false)` makes it
//! relay from the next datagram on (and none of the datagrams it discarded
//! comes out late); `SetStandby(true)` stops it again.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mcrelay_config::{IngressKind, Input, Output};
use mcrelay_pool::PoolConfig;
use mcrelay_relay::counters::{FlowCounters, OutputCounters};
use mcrelay_sockets::{interface_index, open_egress, open_ingress};
use mcrelay_uring::{
    Command, Event, FlowSockets, IngressSocket, OutputSocket, ReceiveMode, WorkerConfig,
};

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// Generous for a loaded 2-core machine; a passing run never waits it out.
const DEADLINE: Duration = Duration::from_secs(60);

/// A loopback flow (input on a free port, one output to `receiver`).
fn flow(receiver: &UdpSocket) -> (FlowSockets, SocketAddr) {
    let lo = interface_index("lo").expect("lo");
    let port = UdpSocket::bind((LOCALHOST, 0))
        .and_then(|s| s.local_addr())
        .expect("free port")
        .port();
    let input = Input {
        interface: "lo".into(),
        address: LOCALHOST,
        port,
        source: None,
        ingress: IngressKind::Socket,
        receive_buffer_bytes: 4 << 20,
        fec: None,
        rist: None,
    };
    let out = Output {
        interface: "lo".into(),
        address: LOCALHOST,
        port: receiver.local_addr().expect("addr").port(),
        ttl: 64,
        source_address: None,
        queue_depth: 256,
        fec: None,
        rist: None,
        srt: None,
    };
    let sockets = FlowSockets::new(
        "standby".into(),
        IngressSocket::Udp(open_ingress(&input, lo).expect("ingress").socket.into()),
        vec![OutputSocket::new(
            "out".into(),
            open_egress(&out, lo).expect("egress"),
            256,
        )],
    );
    (sockets, SocketAddr::new(LOCALHOST, port))
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !done() {
        assert!(Instant::now() < deadline, "not {what} within {DEADLINE:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn send(sender: &UdpSocket, to: SocketAddr, seqs: std::ops::Range<u32>) {
    for seq in seqs {
        sender.send_to(&seq.to_be_bytes(), to).expect("send");
    }
}

/// Every datagram waiting at `r` now (non-blocking), as sequence numbers.
fn waiting(r: &UdpSocket) -> Vec<u32> {
    r.set_nonblocking(true).expect("nonblocking");
    let mut got = Vec::new();
    let mut buf = [0u8; 64];
    while let Ok(n) = r.recv(&mut buf) {
        assert_eq!(n, 4, "unexpected datagram");
        got.push(u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]));
    }
    got
}

/// Receive exactly `count` datagrams (blocking, up to the deadline).
fn receive(r: &UdpSocket, count: usize) -> Vec<u32> {
    r.set_nonblocking(false).expect("blocking");
    r.set_read_timeout(Some(DEADLINE)).expect("timeout");
    let mut got = Vec::with_capacity(count);
    let mut buf = [0u8; 64];
    while got.len() < count {
        let n = r
            .recv(&mut buf)
            .expect("a relayed datagram within the deadline");
        assert_eq!(n, 4, "unexpected datagram");
        got.push(u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]));
    }
    got
}

fn mode_set(events: &mpsc::Receiver<Event>, standby: bool) {
    let event = events.recv_timeout(DEADLINE).expect("the worker answers");
    assert_eq!(event, Event::ModeSet { worker: 0, standby });
}

fn run(mode: ReceiveMode) {
    let receiver = UdpSocket::bind((LOCALHOST, 0)).expect("bind");
    socket2::SockRef::from(&receiver)
        .set_recv_buffer_size(4 << 20)
        .expect("rcvbuf");
    let (sockets, ingress) = flow(&receiver);
    let input: Arc<FlowCounters> = Arc::clone(&sockets.counters);
    let output: Arc<OutputCounters> = Arc::clone(&sockets.outputs[0].counters);
    let stop = Arc::new(AtomicBool::new(false));
    let (events_tx, events) = mpsc::channel();
    let worker = mcrelay_uring::spawn(
        WorkerConfig {
            index: 0,
            cpu: None,
            pools: PoolConfig::default(),
            flows: vec![sockets],
            receive: mode,
            gso: false,
            standby: true,
        },
        Arc::clone(&stop),
        events_tx,
    )
    .expect("worker");
    let sender = UdpSocket::bind((LOCALHOST, 0)).expect("bind");

    // Standby from the start: every datagram read and counted, none sent.
    send(&sender, ingress, 0..200);
    wait_until("200 datagrams discarded in standby", || {
        input.standby_discarded.get() == 200
    });
    assert_eq!(input.packets_in.get(), 200);
    assert_eq!(output.packets_out.get(), 0);
    assert_eq!(output.drop_backlog.get(), 0, "standby is not a drop");
    assert_eq!(worker.stats.loop_counters.sends_submitted.get(), 0);
    assert_eq!(waiting(&receiver), Vec::<u32>::new());

    // Take over: the next datagrams are relayed, and only they.
    worker
        .command(Command::SetStandby(false))
        .expect("command queued");
    mode_set(&events, false);
    send(&sender, ingress, 1000..1200);
    assert_eq!(receive(&receiver, 200), (1000..1200).collect::<Vec<_>>());
    assert_eq!(input.standby_discarded.get(), 200);

    // Stand by again: nothing more goes out.
    worker
        .command(Command::SetStandby(true))
        .expect("command queued");
    mode_set(&events, true);
    send(&sender, ingress, 2000..2200);
    wait_until("200 more datagrams discarded", || {
        input.standby_discarded.get() == 400
    });
    assert_eq!(output.packets_out.get(), 200);
    assert_eq!(waiting(&receiver), Vec::<u32>::new());

    stop.store(true, Ordering::Relaxed);
    worker.join().expect("worker stops cleanly");
}

#[test]
fn standby_relays_nothing_until_active_multishot() {
    run(ReceiveMode::Auto);
}

#[test]
fn standby_relays_nothing_until_active_single_receives() {
    run(ReceiveMode::Single);
}
