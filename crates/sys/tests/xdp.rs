//! The AF_XDP glue against the kernel, in two namespaces joined by a veth
//! (root only; skipped otherwise): the XDP program loads and attaches, a
//! datagram to the flow's group and port lands in the RX ring byte-exact,
//! other traffic on the interface (another UDP port, TCP) still reaches
//! the kernel's stack, and the program is gone once the link's fd closes.

use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

use mcrelay_sys::xdp;
use mcrelay_wire::FlowMatch;

const DEADLINE: Duration = Duration::from_secs(20);

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn link_show(ns: &str, dev: &str) -> String {
    let out = Command::new("ip")
        .args(["-n", ns, "-d", "link", "show", dev])
        .output()
        .expect("ip link show");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

struct Namespaces {
    a: String,
    r: String,
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in [&self.a, &self.r] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let ns = ns.to_owned();
    std::thread::spawn(move || {
        mcrelay_sys::ns::enter_netns(&ns).expect("enter netns");
        f()
    })
    .join()
    .expect("namespace thread")
}

#[test]
fn xdp_program_steers_the_flow_and_passes_the_rest() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipped: needs root (network namespaces, CAP_BPF, CAP_NET_ADMIN)");
        return;
    }
    let pid = std::process::id();
    let ns = Namespaces {
        a: format!("mcx-a-{pid}"),
        r: format!("mcx-r-{pid}"),
    };
    ip(&["netns", "add", &ns.a]);
    ip(&["netns", "add", &ns.r]);
    ip(&[
        "-n", &ns.a, "link", "add", "va", "type", "veth", "peer", "name", "vr", "netns", &ns.r,
    ]);
    ip(&["-n", &ns.a, "addr", "add", "10.77.1.1/24", "dev", "va"]);
    ip(&["-n", &ns.r, "addr", "add", "10.77.1.2/24", "dev", "vr"]);
    ip(&["-n", &ns.a, "link", "set", "va", "up"]);
    ip(&["-n", &ns.r, "link", "set", "vr", "up"]);
    ip(&["-n", &ns.a, "link", "set", "lo", "up"]);
    ip(&["-n", &ns.r, "link", "set", "lo", "up"]);
    ip(&["-n", &ns.a, "route", "add", "224.0.0.0/4", "dev", "va"]);

    let flow = FlowMatch {
        destination: IpAddr::V4(Ipv4Addr::new(239, 7, 7, 7)),
        port: 5000,
        source: None,
    };
    let geometry = xdp::XskGeometry {
        frames: 256,
        ring: 256,
    };
    let (mut rings, link, xsk, other) = in_ns(&ns.r, move || {
        let ifindex = mcrelay_sys::net::interface_index("vr").expect("vr");
        let map = xdp::create_xsk_map(1).expect("XSKMAP");
        let insns = mcrelay_wire::xdp::program(&flow, std::os::fd::AsRawFd::as_raw_fd(&map))
            .expect("program");
        let prog = xdp::load_xdp_program(&insns).expect("load");
        let xsk = xdp::xsk_socket().expect("AF_XDP socket");
        let (umem, zero_copy) =
            xdp::setup_xsk(&xsk, ifindex, 0, geometry, std::time::Duration::ZERO)
                .expect("bind xsk");
        assert!(!zero_copy, "veth has no zero-copy AF_XDP");
        xdp::xsk_map_insert(&map, 0, &xsk).expect("map insert");
        let link = xdp::attach_xdp(&prog, ifindex).expect("attach");
        let rings = xdp::XskRings::map(&xsk, &umem, geometry).expect("map rings");
        let other = UdpSocket::bind("10.77.1.2:5001").expect("bind other");
        other.set_read_timeout(Some(DEADLINE)).expect("timeout");
        (rings, link, xsk, other)
    });
    assert!(
        link_show(&ns.r, "vr").contains("prog/xdp"),
        "attached: {}",
        link_show(&ns.r, "vr")
    );

    let payload: Vec<u8> = (0..1316u32)
        .map(|i| u8::try_from((i * 7 + 3) % 256).unwrap_or(0))
        .collect();
    let sent = payload.clone();
    in_ns(&ns.a, move || {
        let s = UdpSocket::bind("10.77.1.1:0").expect("bind sender");
        s.send_to(&sent, "239.7.7.7:5000").expect("send flow");
        s.send_to(b"other port", "10.77.1.2:5001")
            .expect("send other");
    });

    // The flow's datagram: in the RX ring, byte-exact.
    let start = Instant::now();
    let frame = loop {
        if let Some(f) = rings.next_frame() {
            break f;
        }
        assert!(start.elapsed() < DEADLINE, "nothing reached the XSK");
        std::thread::sleep(Duration::from_millis(1));
    };
    let bytes = rings.bytes(frame).expect("in the UMEM").to_vec();
    let datagram = mcrelay_wire::parse(&bytes, &flow, false).expect("the flow's frame");
    assert_eq!(&bytes[datagram.payload], &payload[..]);
    rings.recycle(frame.addr);

    // Another port on the same interface: the kernel's stack got it.
    let mut buf = [0u8; 64];
    let (n, _) = other
        .recv_from(&mut buf)
        .expect("the other port's datagram");
    assert_eq!(&buf[..n], b"other port");
    // TCP on the same interface (ARP resolved for the unicast above).
    let listener = in_ns(&ns.r, || {
        std::net::TcpListener::bind("10.77.1.2:7000").expect("listen")
    });
    in_ns(&ns.a, || {
        use std::io::Write;
        let mut c = std::net::TcpStream::connect_timeout(
            &"10.77.1.2:7000".parse().expect("addr"),
            DEADLINE,
        )
        .expect("TCP through the XDP program");
        c.write_all(b"tcp").expect("write");
    });
    let (mut conn, _) = listener.accept().expect("accept");
    conn.set_read_timeout(Some(DEADLINE)).expect("timeout");
    let mut got = [0u8; 3];
    std::io::Read::read_exact(&mut conn, &mut got).expect("read");
    assert_eq!(&got, b"tcp");
    let stats = xdp::xsk_statistics(&xsk).expect("stats");
    assert_eq!(stats.rx_dropped, 0);

    // The link's fd is the attachment: closed, the program is gone.
    drop(link);
    let start = Instant::now();
    while link_show(&ns.r, "vr").contains("prog/xdp") {
        assert!(
            start.elapsed() < DEADLINE,
            "still attached after the link closed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
