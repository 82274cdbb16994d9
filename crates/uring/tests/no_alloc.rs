//! After start-up the packet path never allocates: a worker relays
//! thousands of datagrams on loopback while a counting global allocator
//! watches every thread of this test binary. The measured window contains
//! only packet work (the test's own send and receive loops don't allocate).

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mcrelay_config::{IngressKind, Input, Output};
use mcrelay_pool::PoolConfig;
use mcrelay_sockets::{interface_index, open_egress, open_ingress};
use mcrelay_uring::{FlowSockets, IngressSocket, OutputSocket, ReceiveMode, WorkerConfig};

mod counting;
use counting::ALLOCATIONS;

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// Relay 20 000 datagrams through a worker and count allocations. With
/// `same_size`, every datagram is 1316 bytes, so runs of them leave as GSO
/// sends when `gso` is on; otherwise sizes cycle through 1..=1316.
fn relay_and_count(mode: ReceiveMode, gso: bool, same_size: bool) {
    let lo = interface_index("lo").expect("lo");
    let in_port = mcrelay_testkit::free_udp_port();
    let input = Input {
        interface: "lo".into(),
        address: LOCALHOST,
        port: in_port,
        source: None,
        ingress: IngressKind::Socket,
        receive_buffer_bytes: 4 << 20,
        fec: None,
        rist: None,
    };
    let receivers: Vec<UdpSocket> = (0..2)
        .map(|_| UdpSocket::bind((LOCALHOST, 0)).expect("bind"))
        .collect();
    let mut outputs = Vec::new();
    for r in &receivers {
        r.set_read_timeout(Some(Duration::from_millis(500)))
            .expect("timeout");
        socket2::SockRef::from(r)
            .set_recv_buffer_size(8 << 20)
            .expect("rcvbuf");
        let out = Output {
            interface: "lo".into(),
            address: LOCALHOST,
            port: r.local_addr().expect("addr").port(),
            ttl: 64,
            source_address: None,
            queue_depth: 256,
            fec: None,
            rist: None,
            srt: None,
        };
        outputs.push(OutputSocket::new(
            out.port.to_string(),
            open_egress(&out, lo).expect("egress"),
            256,
        ));
    }
    let flow = FlowSockets::new(
        "lo".into(),
        IngressSocket::Udp(open_ingress(&input, lo).expect("ingress").socket.into()),
        outputs,
    );
    let stats = flow.stats();
    let (events, _events_rx) = std::sync::mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let worker = mcrelay_uring::spawn(
        WorkerConfig {
            index: 0,
            cpu: None,
            pools: PoolConfig::default(),
            flows: vec![flow],
            receive: mode,
            gso,
            standby: false,
        },
        Arc::clone(&stop),
        events,
    )
    .expect("worker");
    let sender = UdpSocket::bind((LOCALHOST, 0)).expect("bind");
    let dest = SocketAddr::new(LOCALHOST, in_port);
    let payload = [0x5au8; 1316];
    let mut rx = [0u8; 2048];
    let mut relay = |n: usize| {
        let mut got = 0;
        for i in 0..n {
            sender
                .send_to(
                    &payload[..if same_size { 1316 } else { 1 + i % 1316 }],
                    dest,
                )
                .expect("send");
            // Keep within the receivers' buffers: drain as we go.
            if i % 32 == 31 {
                for r in &receivers {
                    while got < 2 * (i + 1) && r.recv(&mut rx).is_ok() {
                        got += 1;
                        if got % 32 == 0 {
                            break;
                        }
                    }
                }
            }
        }
        // Generous for a loaded machine: left as soon as all arrived.
        let deadline = Instant::now() + Duration::from_secs(60);
        while got < 2 * n && Instant::now() < deadline {
            for r in &receivers {
                if r.recv(&mut rx).is_ok() {
                    got += 1;
                }
            }
        }
        got
    };
    // Warm-up: lazily initialised statics (thread-locals, first-use paths)
    // allocate once; that is start-up, not the packet path.
    assert_eq!(relay(200), 400, "warm-up packets relayed to both outputs");
    std::thread::sleep(Duration::from_millis(200));
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let got = relay(20_000);
    let after = ALLOCATIONS.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    worker.join().expect("worker stops cleanly");
    let flow = &stats;
    assert_eq!(
        flow.input.packets_in.get(),
        20_200,
        "every datagram received"
    );
    assert_eq!(got, 40_000, "every datagram relayed to both outputs");
    assert_eq!(
        after - before,
        0,
        "allocations while relaying 20 000 datagrams ({mode:?}, gso {gso}, same size {same_size})"
    );
    let gso_sends: u64 = flow.outputs.iter().map(|(_, o)| o.gso_sends.get()).sum();
    let fallbacks: u64 = flow
        .outputs
        .iter()
        .map(|(_, o)| o.gso_fallbacks.get())
        .sum();
    assert_eq!(fallbacks, 0, "loopback takes GSO");
    if !gso {
        assert_eq!(gso_sends, 0, "GSO off means no GSO sends");
    }
    if gso && same_size && mode == ReceiveMode::Auto {
        // Multishot receives pile up while the worker handles a batch, so
        // some batches hold several same-size datagrams per output.
        assert!(
            gso_sends > 0,
            "runs of 1316-byte datagrams went out as GSO sends"
        );
    }
}

/// One test for both receive paths: the allocator counts every thread of
/// the binary, so nothing else may run during a measured window.
#[test]
fn packet_path_does_not_allocate() {
    relay_and_count(ReceiveMode::Auto, true, false);
    relay_and_count(ReceiveMode::Auto, true, true);
    relay_and_count(ReceiveMode::Auto, false, true);
    relay_and_count(ReceiveMode::Single, true, false);
}
