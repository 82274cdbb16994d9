//! A running worker takes flow changes without disturbing its other flows:
//! a flow added and one removed while a third relays a steady stream on
//! loopback, which loses nothing and stays in order.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mcrelay_config::{IngressKind, Input, Output};
use mcrelay_pool::PoolConfig;
use mcrelay_sockets::{interface_index, open_egress, open_ingress};
use mcrelay_uring::{
    Command, Event, FlowSockets, IngressSocket, OutputSocket, ReceiveMode, WorkerConfig,
    WorkerHandle,
};

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// A loopback flow: its ingress address and its output's receiver.
struct Loop {
    sockets: Option<FlowSockets>,
    ingress: SocketAddr,
    receiver: UdpSocket,
}

fn flow(name: &str) -> Loop {
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
    let receiver = UdpSocket::bind((LOCALHOST, 0)).expect("bind");
    receiver.set_read_timeout(Some(DEADLINE)).expect("timeout");
    socket2::SockRef::from(&receiver)
        .set_recv_buffer_size(8 << 20)
        .expect("rcvbuf");
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
    let outputs = vec![OutputSocket::new(
        out.port.to_string(),
        open_egress(&out, lo).expect("egress"),
        256,
    )];
    Loop {
        sockets: Some(FlowSockets::new(
            name.into(),
            IngressSocket::Udp(open_ingress(&input, lo).expect("ingress").socket.into()),
            outputs,
        )),
        ingress: SocketAddr::new(LOCALHOST, port),
        receiver,
    }
}

/// How long a wait for something expected may take before the test fails:
/// generous for a loaded 2-core machine; a passing run never waits it out.
const DEADLINE: Duration = Duration::from_secs(60);

fn wait_for(events: &mpsc::Receiver<Event>, want: &Event) {
    let event = events
        .recv_timeout(DEADLINE)
        .expect("the worker answers within its tick");
    assert_eq!(&event, want);
}

/// Datagrams carrying their sequence number.
fn send(sender: &UdpSocket, to: SocketAddr, seq: u32) {
    sender.send_to(&seq.to_be_bytes(), to).expect("send");
}

/// Receive until `count` arrived or a read times out ([`DEADLINE`], or
/// the window a negative check set); the sequence numbers.
fn drain(r: &UdpSocket, count: usize) -> Vec<u32> {
    let mut got = Vec::with_capacity(count);
    let mut buf = [0u8; 64];
    while got.len() < count {
        match r.recv(&mut buf) {
            Ok(4) => got.push(u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]])),
            Ok(_) => panic!("unexpected datagram"),
            Err(_) => break,
        }
    }
    got
}

fn start(
    flows: Vec<FlowSockets>,
    mode: ReceiveMode,
) -> (WorkerHandle, Arc<AtomicBool>, mpsc::Receiver<Event>) {
    let stop = Arc::new(AtomicBool::new(false));
    let (events, events_rx) = mpsc::channel();
    let worker = mcrelay_uring::spawn(
        WorkerConfig {
            index: 0,
            cpu: None,
            pools: PoolConfig::default(),
            flows,
            receive: mode,
            gso: true,
            standby: false,
        },
        Arc::clone(&stop),
        events,
    )
    .expect("worker");
    (worker, stop, events_rx)
}

fn add_and_remove_under_traffic(mode: ReceiveMode) {
    let mut steady = flow("steady");
    let mut leaving = flow("leaving");
    let mut joining = flow("joining");
    let leaving_stats = leaving.sockets.as_ref().expect("sockets").stats();
    let (worker, stop, events) = start(
        vec![
            steady.sockets.take().expect("sockets"),
            leaving.sockets.take().expect("sockets"),
        ],
        mode,
    );
    let sender = UdpSocket::bind((LOCALHOST, 0)).expect("bind");
    let mut seq = 0u32;
    let mut steady_got = Vec::new();
    let mut pump = |n: u32, got: &mut Vec<u32>| {
        for _ in 0..n {
            send(&sender, steady.ingress, seq);
            seq += 1;
            if seq % 64 == 0 {
                got.extend(drain(&steady.receiver, 64));
            }
        }
    };
    pump(2000, &mut steady_got);
    send(&sender, leaving.ingress, 1);
    assert_eq!(
        drain(&leaving.receiver, 1),
        vec![1],
        "the leaving flow relays"
    );

    worker
        .command(Command::AddFlow(Box::new(
            joining.sockets.take().expect("sockets"),
        )))
        .expect("queued");
    worker
        .command(Command::RemoveFlow("leaving".into()))
        .expect("queued");
    // Traffic keeps flowing on the steady flow while the worker applies
    // the commands.
    let deadline = Instant::now() + Duration::from_millis(300);
    while Instant::now() < deadline {
        pump(200, &mut steady_got);
    }
    wait_for(
        &events,
        &Event::FlowAdded {
            worker: 0,
            flow: "joining".into(),
        },
    );
    wait_for(
        &events,
        &Event::FlowRemoved {
            worker: 0,
            flow: "leaving".into(),
            last_rtp: None,
        },
    );
    worker
        .command(Command::RemoveFlow("nosuch".into()))
        .expect("queued");
    wait_for(
        &events,
        &Event::FlowUnknown {
            worker: 0,
            flow: "nosuch".into(),
        },
    );
    pump(2000, &mut steady_got);

    send(&sender, joining.ingress, 7);
    assert_eq!(
        drain(&joining.receiver, 1),
        vec![7],
        "the added flow relays"
    );
    let before = leaving_stats.input.packets_in.get();
    // A window to look for something that must not come.
    leaving
        .receiver
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    send(&sender, leaving.ingress, 2);
    assert!(
        drain(&leaving.receiver, 1).is_empty(),
        "the removed flow no longer relays"
    );
    assert_eq!(
        leaving_stats.input.packets_in.get(),
        before,
        "its socket is closed: nothing received"
    );

    steady_got.extend(drain(&steady.receiver, seq as usize - steady_got.len()));
    let expected: Vec<u32> = (0..seq).collect();
    assert_eq!(
        steady_got.len(),
        expected.len(),
        "no loss on the steady flow"
    );
    assert_eq!(steady_got, expected, "in order, no duplicates");
    stop.store(true, Ordering::Relaxed);
    worker.join().expect("clean stop");
}

#[test]
fn flows_come_and_go_without_disturbing_the_others() {
    add_and_remove_under_traffic(ReceiveMode::Auto);
}

#[test]
fn flows_come_and_go_with_rearmed_receives() {
    add_and_remove_under_traffic(ReceiveMode::Single);
}
