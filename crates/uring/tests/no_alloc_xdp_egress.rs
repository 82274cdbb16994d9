//! XDP egress (`egress = "xdp"`) never allocates on the packet path: a
//! worker relays thousands of datagrams from a loopback UDP input to an
//! output whose datagrams leave as frames on an AF_XDP socket's TX ring
//! (a veth in a namespace of this test, its peer in another where a
//! receiver checks every one byte-exact), while a counting global
//! allocator watches every thread of this test binary. Root only
//! (namespaces, AF_XDP); skipped otherwise.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mcrelay_config::{EgressKind, Output};
use mcrelay_pool::PoolConfig;
use mcrelay_sockets::{interface_index, open_egress};
use mcrelay_uring::worker::XskOutput;
use mcrelay_uring::{FlowSockets, IngressSocket, OutputSocket, ReceiveMode, WorkerConfig};

use mcrelay_testkit::counting::{ALLOCATIONS, Counting};

#[global_allocator]
static GLOBAL: Counting = Counting;

const GROUP: Ipv4Addr = Ipv4Addr::new(239, 9, 8, 7);
const PORT: u16 = 6000;

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

/// Datagram `i`: its length and bytes name it.
fn datagram(i: usize, buf: &mut [u8]) -> usize {
    let len = 8 + i % 1400;
    buf[..8].copy_from_slice(&u64::try_from(i).unwrap_or(u64::MAX).to_be_bytes());
    for (k, b) in buf[8..len].iter_mut().enumerate() {
        *b = u8::try_from((i + k) % 251).unwrap_or(0);
    }
    len
}

#[test]
fn xdp_egress_packet_path_does_not_allocate() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIPPED: needs root (namespaces, AF_XDP); CI runs it as root");
        return;
    }
    let pid = std::process::id();
    // R (the relay) and B (the receiver), one veth between them.
    let ns = Namespaces(format!("mcxe-r-{pid}"), format!("mcxe-b-{pid}"));
    ip(&["netns", "add", &ns.0]);
    ip(&["netns", "add", &ns.1]);
    ip(&[
        "-n", &ns.0, "link", "add", "vo", "type", "veth", "peer", "name", "vb", "netns", &ns.1,
    ]);
    ip(&["-n", &ns.0, "addr", "add", "10.79.1.1/24", "dev", "vo"]);
    ip(&["-n", &ns.1, "addr", "add", "10.79.1.2/24", "dev", "vb"]);
    for (n, dev) in [(&ns.0, "vo"), (&ns.1, "vb"), (&ns.0, "lo"), (&ns.1, "lo")] {
        ip(&["-n", n, "link", "set", dev, "up"]);
    }
    ip(&["-n", &ns.0, "route", "add", "224.0.0.0/4", "dev", "vo"]);
    let receiver = mcrelay_testkit::in_netns(&ns.1, || {
        let r = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, PORT)).expect("bind");
        r.join_multicast_v4(&GROUP, &Ipv4Addr::new(10, 79, 1, 2))
            .expect("join");
        r.set_read_timeout(Some(Duration::from_millis(500)))
            .expect("timeout");
        socket2::SockRef::from(&r)
            .set_recv_buffer_size(8 << 20)
            .expect("rcvbuf");
        r
    });
    // In R: a loopback input, the xdp output on vo (its UDP socket gives
    // the source address and port), and the sender (on loopback).
    let (input, output, sender) = mcrelay_testkit::in_netns(&ns.0, || {
        let vo = interface_index("vo").expect("vo");
        let input = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind input");
        socket2::SockRef::from(&input)
            .set_recv_buffer_size(8 << 20)
            .expect("rcvbuf");
        let out = Output {
            interface: "vo".into(),
            address: IpAddr::V4(GROUP),
            port: PORT,
            ttl: 1,
            source_address: None,
            queue_depth: 256,
            fec: None,
            srt: None,
            rist: None,
            egress: EgressKind::Xdp,
        };
        let socket = open_egress(&out, vo).expect("egress socket");
        let fds = mcrelay_sockets::xdp::open_xdp_egress(&out, vo).expect("xdp egress");
        let SocketAddr::V4(local) = socket.local_addr().expect("addr") else {
            panic!("not IPv4");
        };
        let header = mcrelay_wire::egress::Template::new(&mcrelay_wire::egress::Endpoints {
            source_mac: mcrelay_sys::xdp::interface_mac("vo").expect("mac"),
            source: *local.ip(),
            source_port: local.port(),
            destination: GROUP,
            destination_mac: mcrelay_wire::egress::multicast_mac(GROUP),
            port: PORT,
            ttl: 1,
        });
        let output = OutputSocket::new("xdp".into(), socket, 256).with_xsk(XskOutput {
            socket: fds.socket,
            umem: fds.umem,
            header,
            max_payload: 1500 - 28,
            next_hop: None,
        });
        let sender = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind sender");
        sender
            .connect(input.local_addr().expect("addr"))
            .expect("connect");
        (input, output, sender)
    });
    let flow = FlowSockets::new("xdp-egress".into(), IngressSocket::Udp(input), vec![output]);
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
    let mut tx = [0u8; 2048];
    let mut rx = [0u8; 2048];
    let mut next = 0usize;
    let mut relay = |n: usize| {
        let mut got = 0;
        let check = |len: usize, rx: &[u8], got: &mut usize| {
            let mut want = [0u8; 2048];
            let i = usize::try_from(u64::from_be_bytes(rx[..8].try_into().expect("8 bytes")))
                .expect("a datagram number");
            let wlen = datagram(i, &mut want);
            assert_eq!(&rx[..len], &want[..wlen], "datagram {i} byte-exact");
            *got += 1;
        };
        for k in 0..n {
            let len = datagram(next, &mut tx);
            next += 1;
            sender.send(&tx[..len]).expect("send");
            // Keep within the TX ring and the receiver's buffer.
            if k % 32 == 31 {
                while got + 32 < k + 1 {
                    match receiver.recv(&mut rx) {
                        Ok(len) => check(len, &rx, &mut got),
                        Err(_) => break,
                    }
                }
            }
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while got < n && Instant::now() < deadline {
            if let Ok(len) = receiver.recv(&mut rx) {
                check(len, &rx, &mut got);
            }
        }
        got
    };
    // Warm-up: first-use paths allocate once; that is start-up.
    assert_eq!(relay(200), 200, "warm-up datagrams relayed");
    std::thread::sleep(Duration::from_millis(200));
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let got = relay(20_000);
    let after = ALLOCATIONS.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    worker.join().expect("worker stops cleanly");
    let out = &stats.outputs[0].1;
    assert_eq!(got, 20_000, "every datagram relayed");
    assert_eq!(out.packets_out.get(), 20_200, "sent on the TX ring");
    assert_eq!(out.drop_send_error.get(), 0, "no full ring");
    assert_eq!(
        after - before,
        0,
        "allocations while relaying 20 000 datagrams to the XDP egress"
    );
}
