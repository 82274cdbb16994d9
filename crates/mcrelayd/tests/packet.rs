//! `ingress = "packet"` end to end, in namespaces (topology in
//! `common/mod.rs`): a source on a subnet the relay has no route back to,
//! with `rp_filter=1` in the relay's namespace. A socket flow gets nothing
//! (the kernel's reverse-path filter drops the datagrams before any UDP
//! socket); a packet flow relays every one byte-exact. Also: a VLAN-tagged
//! input, the relay's own output on its input interface not re-relayed,
//! zero-length payloads, and IP fragments dropped and counted.

use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::process::Command;

mod common;
use common::*;

/// The unroutable source: on A's link, unknown to R.
const SOURCE: &str = "192.168.77.1";

/// Make A's traffic come from an unroutable source and turn the reverse
/// path filter on in R.
fn unroutable(t: &Topology) {
    t.ip(&t.a, &["addr", "add", &format!("{SOURCE}/32"), "dev", "vA"]);
    for key in ["all", "vRA"] {
        t.rp_filter(key, 1);
    }
}

/// `IPReversePathFilter` drops counted in namespace `ns` so far.
fn rpf_drops(ns: &str) -> u64 {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "nstat",
            "-az",
            "TcpExtIPReversePathFilter",
        ])
        .output()
        .expect("nstat");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("TcpExtIPReversePathFilter"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// A socket in B joined to the flow's output group 239.2.2.2:6000.
fn output_receiver(t: &Topology) -> UdpSocket {
    let receiver = mcrelay_testkit::in_netns(&t.b, || {
        let s = UdpSocket::bind("0.0.0.0:6000").expect("bind");
        s.join_multicast_v4(&"239.2.2.2".parse().unwrap(), &"10.10.2.2".parse().unwrap())
            .expect("join");
        s.set_read_timeout(Some(DEADLINE)).expect("timeout");
        s
    });
    // Let the IGMP join settle on the veth.
    std::thread::sleep(std::time::Duration::from_millis(100));
    receiver
}

const FLOW: &str = r#"
[[flow]]
name = "rpf"
input = { interface = "vRA", address = "239.1.1.1", port = 5000, ingress = "INGRESS" }
outputs = [ { interface = "vRB", address = "239.2.2.2", port = 6000 } ]
"#;

#[test]
fn an_unroutable_source_is_relayed_by_packet_ingress_only() {
    let Some(t) = Topology::new() else { return };
    unroutable(&t);
    let sizes = "1316,1,1472,9000,9001";

    // Socket ingress: the reverse-path filter eats everything.
    let relay = t.relay(&FLOW.replace("INGRESS", "socket"), &[]);
    let before = rpf_drops(&t.r);
    // The receiver listens until the kernel has counted every datagram
    // dropped (and would fail the wait if it didn't).
    let rx = t.receiver("239.2.2.2:6000", 1, &[]);
    t.send(
        "239.1.1.1:5000",
        &["--source", SOURCE, "--count", "500", "--rate", "20000"],
    );
    wait_until("the kernel counted its RPF drops", || {
        let dropped = rpf_drops(&t.r) - before;
        if dropped >= 500 {
            Ok(())
        } else {
            Err(format!("{dropped}"))
        }
    });
    let out = terminate(rx);
    let log = relay.stop();
    assert_eq!(field(&out, "valid"), 0, "nothing gets through: {out}");
    assert_eq!(counter(&log, &["flow=rpf", "packets_in"], "packets_in"), 0);

    // Packet ingress: every datagram, byte-exact; the 9001-byte ones are
    // too large to relay and counted.
    let relay = t.relay(&FLOW.replace("INGRESS", "packet"), &[]);
    let rx = t.receiver("239.2.2.2:6000", 800, &[]);
    t.send(
        "239.1.1.1:5000",
        &[
            "--source", SOURCE, "--count", "1000", "--rate", "20000", "--size", sizes,
        ],
    );
    let out = finish(rx);
    let log = relay.stop();
    clean(&out);
    assert_eq!(
        (field(&out, "valid"), field(&out, "short")),
        (600, 200),
        "{out}"
    );
    assert_eq!(field(&out, "max_len"), 9000, "{out}");
    assert!(log.contains("packet ingress on a TPACKET_V3 ring"), "{log}");
    let flow = ["flow=rpf", "packets_in"];
    assert_eq!(counter(&log, &flow, "packets_in"), 1000);
    assert_eq!(counter(&log, &flow, "drop_oversize"), 200);
    for reason in [
        "truncated",
        "malformed",
        "fragment",
        "bad_checksum",
        "not_this_flow",
    ] {
        assert_eq!(
            counter(&log, &flow, &format!("drop_{reason}")),
            0,
            "{reason}"
        );
    }
    assert_eq!(
        counter(&log, &["output=239.2.2.2:6000"], "packets_out"),
        800
    );
}

#[test]
fn zero_length_payloads_are_relayed_and_fragments_counted() {
    let Some(t) = Topology::new() else { return };
    unroutable(&t);
    let relay = t.relay(&FLOW.replace("INGRESS", "packet"), &[]);
    let receiver = output_receiver(&t);
    mcrelay_testkit::in_netns(&t.a, || {
        let s = UdpSocket::bind(format!("{SOURCE}:0")).expect("bind");
        for _ in 0..3 {
            s.send_to(b"", "239.1.1.1:5000").expect("empty");
        }
        // 12000 bytes over a 9200-byte MTU: two fragments.
        s.send_to(&[7u8; 12000], "239.1.1.1:5000")
            .expect("fragmented");
        s.send_to(b"after", "239.1.1.1:5000").expect("after");
    });
    let mut buf = [0u8; 64];
    let mut lengths = Vec::new();
    while let Ok(n) = receiver.recv(&mut buf) {
        lengths.push(n);
        if n == 5 {
            break;
        }
    }
    let log = relay.stop();
    assert_eq!(
        lengths,
        [0, 0, 0, 5],
        "zero-length datagrams relayed as such"
    );
    let flow = ["flow=rpf", "packets_in"];
    assert_eq!(counter(&log, &flow, "packets_in"), 4);
    assert_eq!(counter(&log, &flow, "bytes_in"), 5);
    assert_eq!(counter(&log, &flow, "drop_fragment"), 2, "{log}");
}

/// Send raw Ethernet `frames` out of `dev` in namespace `ns` (an AF_PACKET
/// socket of the test's own: tags and checksums exactly as built).
#[allow(unsafe_code)]
fn inject(ns: &str, dev: &'static str, frames: Vec<Vec<u8>>) {
    mcrelay_testkit::in_netns(ns, move || {
        // SAFETY: plain socket(2); checked below.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
        assert!(fd >= 0, "AF_PACKET: {}", std::io::Error::last_os_error());
        // SAFETY: `fd` is new and owned by nothing else.
        let socket = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let name = std::ffi::CString::new(dev).expect("name");
        // SAFETY: a valid NUL-terminated name.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        assert!(ifindex > 0, "{dev} missing");
        // SAFETY: all-zero is a valid sockaddr_ll.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = 17; // AF_PACKET
        addr.sll_ifindex = i32::try_from(ifindex).expect("index");
        addr.sll_halen = 6;
        for frame in frames {
            // SAFETY: `frame` and `addr` are valid for the lengths given.
            let n = unsafe {
                libc::sendto(
                    socket.as_raw_fd(),
                    frame.as_ptr().cast(),
                    frame.len(),
                    0,
                    (&raw const addr).cast(),
                    u32::try_from(size_of::<libc::sockaddr_ll>()).expect("len"),
                )
            };
            assert_eq!(
                n,
                isize::try_from(frame.len()).expect("len"),
                "{}",
                std::io::Error::last_os_error()
            );
        }
    });
}

#[test]
fn vlan_tagged_and_hostile_frames_through_the_kernel() {
    use mcrelay_wire::testframes::{fix_ipv4_checksum, ipv4_udp, ipv6_udp, vlan};
    let Some(t) = Topology::new() else { return };
    unroutable(&t);
    let relay = t.relay(&FLOW.replace("INGRESS", "packet"), &[]);
    let receiver = output_receiver(&t);
    let good = |p: &[u8]| ipv4_udp(SOURCE, "239.1.1.1", 5000, p);
    let mut bad_checksum = good(b"bad checksum");
    let last = bad_checksum.len() - 1;
    bad_checksum[last] ^= 0x55;
    let mut udp_too_long = good(b"udp length past the frame");
    udp_too_long[14 + 20 + 4..14 + 20 + 6].copy_from_slice(&900u16.to_be_bytes());
    let mut zero_udp_len = good(b"udp length below 8");
    zero_udp_len[14 + 20 + 4..14 + 20 + 6].copy_from_slice(&4u16.to_be_bytes());
    let mut ip_total_too_long = good(b"ip total length past the frame");
    ip_total_too_long[14 + 2..14 + 4].copy_from_slice(&2000u16.to_be_bytes());
    fix_ipv4_checksum(&mut ip_total_too_long, 14);
    inject(
        &t.a,
        "vA",
        vec![
            vlan(&good(b"tagged 802.1Q"), &[(0x8100, 100)]),
            vlan(
                &good(b"tagged 802.1ad+802.1Q"),
                &[(0x88a8, 10), (0x8100, 20)],
            ),
            bad_checksum,
            udp_too_long,
            zero_udp_len,
            ip_total_too_long,
            good(&[]),
            good(b"untagged, last"),
        ],
    );
    let mut got = Vec::new();
    let mut buf = [0u8; 128];
    while let Ok(n) = receiver.recv(&mut buf) {
        got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        if got.last().is_some_and(|g| g == "untagged, last") {
            break;
        }
    }
    let log = relay.stop();
    assert_eq!(
        got,
        [
            "tagged 802.1Q",
            "tagged 802.1ad+802.1Q",
            "",
            "untagged, last"
        ],
        "{log}"
    );
    let flow = ["flow=rpf", "packets_in"];
    assert_eq!(counter(&log, &flow, "packets_in"), 4);
    assert_eq!(counter(&log, &flow, "drop_bad_checksum"), 1);
    assert_eq!(
        counter(&log, &flow, "drop_truncated"),
        2,
        "UDP and IP lengths past the frame"
    );
    assert_eq!(
        counter(&log, &flow, "drop_malformed"),
        1,
        "UDP length below 8"
    );
    // IPv6 frames for an IPv4 flow never pass the kernel filter.
    let _ = ipv6_udp;
}

#[test]
fn the_relays_own_output_is_not_received_again() {
    let Some(t) = Topology::new() else { return };
    // Flow "first" sends out of its own input interface to the group flow
    // "second" listens to there. A socket can't hear its own host's
    // multicast (loopback is off); a packet socket sees the outgoing frame
    // unless it drops PACKET_OUTGOING, which it must.
    let relay = t.relay(
        r#"
[[flow]]
name = "first"
input = { interface = "vRA", address = "239.1.1.1", port = 5000, ingress = "packet" }
outputs = [
  { interface = "vRA", address = "239.1.1.2", port = 5000 },
  { interface = "vRB", address = "239.2.2.2", port = 6000 },
]

[[flow]]
name = "second"
input = { interface = "vRA", address = "239.1.1.2", port = 5000, ingress = "packet" }
outputs = [ { interface = "vRB", address = "239.2.2.3", port = 6000 } ]
"#,
        &[],
    );
    let rx = t.receiver("239.2.2.2:6000", 300, &[]);
    t.send("239.1.1.1:5000", &["--count", "300", "--rate", "10000"]);
    let out = finish(rx);
    std::thread::sleep(std::time::Duration::from_millis(200));
    let log = relay.stop();
    clean(&out);
    assert_eq!(field(&out, "valid"), 300, "{out}");
    assert_eq!(
        counter(&log, &["flow=first", "packets_in"], "packets_in"),
        300
    );
    assert_eq!(
        counter(&log, &["output=239.1.1.2:5000@vRA"], "packets_out"),
        300
    );
    assert_eq!(
        counter(&log, &["flow=second", "packets_in"], "packets_in"),
        0,
        "the relay's own output was received: {log}"
    );
}
