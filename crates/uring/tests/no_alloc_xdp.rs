//! XDP ingress (`ingress = "xdp"`) never allocates on the packet path
//! either: a worker relays thousands of datagrams from an AF_XDP socket's
//! RX ring (fed by the XDP program on a veth in a namespace of this test)
//! to two loopback outputs while a counting global allocator watches every
//! thread of this test binary. Root only (namespaces, CAP_BPF); skipped
//! otherwise.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mcrelay_config::{IngressKind, Input, Output};
use mcrelay_pool::PoolConfig;
use mcrelay_sockets::{interface_index, open_egress};
use mcrelay_uring::{FlowSockets, IngressSocket, OutputSocket, ReceiveMode, WorkerConfig};

use mcrelay_testkit::counting::{ALLOCATIONS, Counting};

#[global_allocator]
static GLOBAL: Counting = Counting;

const GROUP: Ipv4Addr = Ipv4Addr::new(239, 9, 9, 9);
const PORT: u16 = 5000;

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

struct Namespaces(String, String);

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in [&self.0, &self.1] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

#[test]
fn xdp_packet_path_does_not_allocate() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIPPED: needs root (namespaces, CAP_BPF); CI runs it as root");
        return;
    }
    let pid = std::process::id();
    let ns = Namespaces(format!("mcxa-a-{pid}"), format!("mcxa-r-{pid}"));
    ip(&["netns", "add", &ns.0]);
    ip(&["netns", "add", &ns.1]);
    ip(&[
        "-n", &ns.0, "link", "add", "va", "type", "veth", "peer", "name", "vr", "netns", &ns.1,
    ]);
    ip(&["-n", &ns.0, "addr", "add", "10.78.1.1/24", "dev", "va"]);
    ip(&["-n", &ns.1, "addr", "add", "10.78.1.2/24", "dev", "vr"]);
    for (n, dev) in [(&ns.0, "va"), (&ns.1, "vr"), (&ns.0, "lo"), (&ns.1, "lo")] {
        ip(&["-n", n, "link", "set", dev, "up"]);
    }
    ip(&["-n", &ns.0, "route", "add", "224.0.0.0/4", "dev", "va"]);

    // In R: the xdp ingress (program, XSK, link), two loopback outputs and
    // their receivers.
    let (ingress, outputs, receivers) = mcrelay_testkit::in_netns(&ns.1, || {
        let vr = interface_index("vr").expect("vr");
        let lo = interface_index("lo").expect("lo");
        let input = Input {
            interface: "vr".into(),
            address: IpAddr::V4(GROUP),
            port: PORT,
            source: None,
            ingress: IngressKind::Xdp,
            receive_buffer_bytes: 4 << 20,
            fec: None,
            srt: None,
            rist: None,
        };
        let opened = mcrelay_sockets::xdp::open_xdp_ingress(&input, vr).expect("xdp ingress");
        let xdp = opened.xdp.expect("the UMEM and link");
        let ingress = IngressSocket::Xdp {
            socket: opened.socket,
            filter: mcrelay_sockets::packet::flow_match(&input),
            umem: xdp.umem,
            link: xdp.link,
            membership: opened.membership,
        };
        let receivers: Vec<UdpSocket> = (0..2)
            .map(|_| UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind"))
            .collect();
        let mut outputs = Vec::new();
        for r in &receivers {
            r.set_read_timeout(Some(Duration::from_millis(500)))
                .expect("timeout");
            socket2::SockRef::from(r)
                .set_recv_buffer_size(8 << 20)
                .expect("rcvbuf");
            let out = Output {
                egress: Default::default(),
                interface: "lo".into(),
                address: IpAddr::V4(Ipv4Addr::LOCALHOST),
                port: r.local_addr().expect("addr").port(),
                ttl: 64,
                source_address: None,
                queue_depth: 256,
                fec: None,
                srt: None,
                rist: None,
            };
            outputs.push(OutputSocket::new(
                out.port.to_string(),
                open_egress(&out, lo).expect("egress"),
                256,
            ));
        }
        (ingress, outputs, receivers)
    });
    let sender = mcrelay_testkit::in_netns(&ns.0, || {
        UdpSocket::bind("10.78.1.1:0").expect("bind sender")
    });
    let flow = FlowSockets::new("xdp".into(), ingress, outputs);
    let stats = flow.stats();
    let (events, _events_rx) = std::sync::mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let worker = mcrelay_uring::spawn(
        WorkerConfig {
            index: 0,
            cpu: None,
            pools: PoolConfig::default(),
            flows: vec![flow],
            receive: ReceiveMode::Auto,
            gso: true,
            standby: false,
        },
        Arc::clone(&stop),
        events,
    )
    .expect("worker");
    let dest = SocketAddr::new(IpAddr::V4(GROUP), PORT);
    let payload = [0x5au8; 1316];
    let mut rx = [0u8; 2048];
    let mut relay = |n: usize| {
        let mut got = 0;
        for i in 0..n {
            sender
                .send_to(&payload[..1 + i % 1316], dest)
                .expect("send");
            // Keep within the RX ring and the receivers' buffers.
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
    // Warm-up: first-use paths allocate once; that is start-up.
    assert_eq!(relay(200), 400, "warm-up packets relayed to both outputs");
    std::thread::sleep(Duration::from_millis(200));
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let got = relay(20_000);
    let after = ALLOCATIONS.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    worker.join().expect("worker stops cleanly");
    assert_eq!(
        stats.input.packets_in.get(),
        20_200,
        "every datagram received"
    );
    assert_eq!(got, 40_000, "every datagram relayed to both outputs");
    assert_eq!(
        after - before,
        0,
        "allocations while relaying 20 000 datagrams from the XDP ingress"
    );
}
