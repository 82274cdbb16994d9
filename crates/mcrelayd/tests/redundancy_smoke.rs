//! The wiring of a flow with two inputs, with the real daemon in network
//! namespaces: A sends one RTP stream twice, over two veth pairs into R
//! (vA–vRA and vA2–vRA2), with disjoint planted losses (every tenth
//! datagram missing on one leg, a different tenth on the other); R merges
//! them (`redundancy = "merge"`) onto one output to B. The output has every
//! datagram exactly once, byte for byte, and `mcrelayctl stats --json`
//! and `flows` show both legs under the flow with what each forwarded and
//! lost, and what the merge recovered.
//!
//! This proves the path from the config file to the core and back out to
//! the reports; the merge rules themselves are the core's, tested there
//! (crates/relay/src/redundancy), and the full scenarios (skew,
//! delay, failover, reload, a real encoder) are tests/redundancy*.rs.
//!
//! A reload that adds the second leg to a running one-leg flow loses
//! nothing of the stream on the first (the flow is replaced make before
//! break).
//!
//! The streams are sent by a thread of this test inside A's network
//! namespace (`setns`), from sockets bound to A's addresses, and received
//! by one inside B's.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{DEADLINE, Topology, ctl, sh, stats_json};
use mcrelay_wire::rtp;

/// Datagrams in the stream.
const COUNT: u16 = 2000;
const LEG_A: Ipv4Addr = Ipv4Addr::new(239, 7, 1, 1);
const LEG_B: Ipv4Addr = Ipv4Addr::new(239, 7, 2, 1);
const OUT: Ipv4Addr = Ipv4Addr::new(239, 7, 3, 1);
const PORT: u16 = 5004;

/// Run `f` on a thread inside network namespace `ns`.
fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let path = PathBuf::from("/var/run/netns").join(ns);
    std::thread::spawn(move || {
        let file = fs::File::open(&path).expect("netns file");
        enter(&file);
        f()
    })
}

/// What a receiver in B counted: copies per sequence number.
type Copies = BTreeMap<u16, u32>;

/// A receiver in B counting the output's copies of each number, joined
/// when this returns; it stops once told the last number sent (through
/// the sender returned) and `done(copies, last)`, or at the deadline.
fn counting_receiver(
    t: &Topology,
    done: fn(&Copies, u16) -> bool,
) -> (
    std::thread::JoinHandle<Copies>,
    std::sync::mpsc::Sender<u16>,
) {
    let (joined_tx, joined_rx) = std::sync::mpsc::channel();
    let (last_tx, last_rx) = std::sync::mpsc::channel::<u16>();
    let receiver = in_netns(&t.b, move || {
        let s = output_receiver();
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .expect("timeout");
        let _ = joined_tx.send(());
        let mut copies = Copies::new();
        let mut last = None;
        let deadline = Instant::now() + DEADLINE;
        let mut buf = [0u8; 2048];
        while Instant::now() < deadline {
            if let Ok(n) = s.recv(&mut buf)
                && let Some(h) = rtp::parse(&buf[..n])
            {
                *copies.entry(h.sequence).or_default() += 1;
            }
            last = last.or_else(|| last_rx.try_recv().ok());
            if last.is_some_and(|l| done(&copies, l)) {
                break;
            }
        }
        copies
    });
    joined_rx
        .recv_timeout(DEADLINE)
        .expect("receiver joined in B");
    // Let the IGMP join settle on the veth.
    std::thread::sleep(Duration::from_millis(50));
    (receiver, last_tx)
}

/// A socket in B receiving the output: a 64 MiB receive buffer
/// (`SO_RCVBUFFORCE`: the test runs as root), so a receiving thread that a
/// loaded machine leaves unscheduled for a while loses nothing.
#[allow(unsafe_code)]
fn output_receiver() -> UdpSocket {
    use std::os::fd::AsRawFd;
    let s = UdpSocket::bind(SocketAddrV4::new(OUT, PORT)).expect("bind in B");
    s.join_multicast_v4(&OUT, &Ipv4Addr::new(10, 10, 2, 2))
        .expect("join in B");
    let bytes: libc::c_int = 64 << 20;
    // SAFETY: `bytes` is a live c_int for the call and its size is passed;
    // the kernel only reads it.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&raw const bytes).cast(),
            libc::socklen_t::try_from(std::mem::size_of_val(&bytes)).unwrap_or(4),
        )
    };
    assert_eq!(rc, 0, "SO_RCVBUFFORCE: {}", std::io::Error::last_os_error());
    s
}

#[allow(unsafe_code)]
fn enter(file: &fs::File) {
    use std::os::fd::AsRawFd;
    // SAFETY: setns on a descriptor this function borrows, for the calling
    // thread only (network namespace); no memory is passed.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
}

/// Datagram `seq` of the stream: an RTP header and a payload that names it.
fn datagram(seq: u16) -> Vec<u8> {
    let mut d = vec![0u8; 12 + 200];
    let _ = rtp::build(&mut d, 96, seq, u32::from(seq) * 3000, 0x5eed);
    for (i, b) in d[12..].iter_mut().enumerate() {
        *b = ((usize::from(seq) * 31 + i) % 256).to_le_bytes()[0];
    }
    d
}

/// Lost on leg A / leg B: disjoint, 10 % each.
fn lost_on_a(seq: u16) -> bool {
    seq % 10 == 3
}
fn lost_on_b(seq: u16) -> bool {
    seq % 10 == 8
}

/// A socket in A bound to `local`, sending multicast out of its interface.
fn sender(local: Ipv4Addr) -> UdpSocket {
    let s = UdpSocket::bind(SocketAddrV4::new(local, 0)).expect("bind in A");
    socket2::SockRef::from(&s)
        .set_multicast_if_v4(&local)
        .expect("IP_MULTICAST_IF");
    s
}

fn stats(socket: &Path) -> serde_json::Value {
    stats_json(socket)
}

fn merged(s: &serde_json::Value) -> &serde_json::Value {
    s["flows"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["name"] == "merged"))
        .unwrap_or_else(|| panic!("no flow merged in {s}"))
}

/// The topology of tests/common with a second path from A into R (vA2 in
/// A, 10.10.3.1; vRA2 in R, 10.10.3.2).
fn two_paths() -> Option<Topology> {
    let t = Topology::new()?;
    sh(&[
        "ip", "link", "add", "vA2", "netns", &t.a, "type", "veth", "peer", "name", "vRA2", "netns",
        &t.r,
    ]);
    for (ns, dev, v4) in [
        (&t.a, "vA2", "10.10.3.1/24"),
        (&t.r, "vRA2", "10.10.3.2/24"),
    ] {
        t.ip(ns, &["addr", "add", v4, "dev", dev]);
        t.ip(ns, &["link", "set", dev, "up"]);
    }
    t.rp_filter("vRA2", 0);
    Some(t)
}

/// Flow `name`, RTP to `OUT` on vRB, from leg A only, or (`both`) merged
/// from legs A and B.
fn flow_toml(name: &str, both: bool) -> String {
    let a = format!("{{ interface = \"vRA\", address = \"{LEG_A}\", port = {PORT} }}");
    let b = format!("{{ interface = \"vRA2\", address = \"{LEG_B}\", port = {PORT} }}");
    let input = if both {
        format!("inputs = [{a}, {b}]\nredundancy = \"merge\"")
    } else {
        format!("input = {a}")
    };
    format!(
        "\n[[flow]]\nname = \"{name}\"\n{input}\npayload = \"rtp\"\n\
         outputs = [{{ interface = \"vRB\", address = \"{OUT}\", port = {PORT} }}]\n"
    )
}

#[test]
fn two_socket_legs_merge_into_one_complete_output() {
    let Some(t) = two_paths() else { return };
    let relay = t.relay(&flow_toml("merged", true), &[]);
    let socket = t.dir.join("control.sock");

    // The receiver in B: every datagram of the output, until it has one
    // of each number or the deadline (a failing test) passes.
    let (joined_tx, joined_rx) = std::sync::mpsc::channel();
    let receiver = in_netns(&t.b, move || {
        let s = output_receiver();
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        let _ = joined_tx.send(());
        let mut got: Vec<Vec<u8>> = Vec::new();
        let mut distinct = std::collections::BTreeSet::new();
        let deadline = Instant::now() + DEADLINE;
        let mut buf = [0u8; 2048];
        while distinct.len() < usize::from(COUNT) && Instant::now() < deadline {
            if let Ok(n) = s.recv(&mut buf) {
                let d = buf[..n].to_vec();
                if let Some(h) = rtp::parse(&d) {
                    distinct.insert(h.sequence);
                }
                got.push(d);
            }
        }
        // A late duplicate would come right after: look a little longer.
        let until = Instant::now() + Duration::from_millis(500);
        while Instant::now() < until {
            if let Ok(n) = s.recv(&mut buf) {
                got.push(buf[..n].to_vec());
            }
        }
        got
    });
    joined_rx
        .recv_timeout(DEADLINE)
        .expect("receiver joined in B");
    // Let the IGMP join settle on the veth.
    std::thread::sleep(Duration::from_millis(50));

    // The stream, each datagram on both legs but for the planted losses.
    in_netns(&t.a, || {
        let a = sender(Ipv4Addr::new(10, 10, 1, 1));
        let b = sender(Ipv4Addr::new(10, 10, 3, 1));
        for seq in 0..COUNT {
            let d = datagram(seq);
            if !lost_on_a(seq) {
                a.send_to(&d, SocketAddrV4::new(LEG_A, PORT))
                    .expect("leg A");
            }
            if !lost_on_b(seq) {
                b.send_to(&d, SocketAddrV4::new(LEG_B, PORT))
                    .expect("leg B");
            }
            std::thread::sleep(Duration::from_micros(300));
        }
    })
    .join()
    .expect("sender");

    let got = receiver.join().expect("receiver");
    let mut by_seq: BTreeMap<u16, Vec<&Vec<u8>>> = BTreeMap::new();
    for d in &got {
        let h = rtp::parse(d).expect("RTP on the output");
        by_seq.entry(h.sequence).or_default().push(d);
    }
    let missing: Vec<u16> = (0..COUNT).filter(|s| !by_seq.contains_key(s)).collect();
    assert!(
        missing.is_empty(),
        "output misses {} numbers: {:?}...\n{}",
        missing.len(),
        &missing[..missing.len().min(20)],
        relay.log()
    );
    for (seq, copies) in &by_seq {
        assert_eq!(copies.len(), 1, "number {seq} left {} times", copies.len());
        assert_eq!(*copies[0], datagram(*seq), "number {seq} changed");
    }

    // What the reports say: the merge's counters settle once the last
    // numbers' window has passed.
    let planted = u64::from(COUNT / 10) * 2;
    let both = u64::from(COUNT) - planted;
    let deadline = Instant::now() + DEADLINE;
    let s = loop {
        let s = stats(&socket);
        let r = &merged(&s)["redundancy"];
        if r["recovered"].as_u64() == Some(planted) && r["duplicates"].as_u64() == Some(both) {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "merge counters never settled: {s}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let f = merged(&s);
    let r = &f["redundancy"];
    assert_eq!(r["mode"], "merge", "{f}");
    assert_eq!(r["lost"], 0, "{f}");
    let legs = r["legs"].as_array().expect("legs");
    assert_eq!(legs.len(), 2, "{f}");
    assert_eq!(legs[0]["input"], format!("{LEG_A}:{PORT} on vRA"));
    assert_eq!(legs[1]["input"], format!("{LEG_B}:{PORT} on vRA2"));
    let forwarded: u64 = legs
        .iter()
        .map(|l| l["forwarded"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(forwarded, u64::from(COUNT), "{f}");
    // Each leg's own stream health saw its own losses.
    for leg in legs {
        assert_eq!(leg["health"]["rtp"]["lost"], COUNT / 10, "{leg}");
        assert_eq!(leg["health"]["rtp"]["packets"], COUNT - COUNT / 10, "{leg}");
    }
    assert_eq!(
        f["packets_in"].as_u64(),
        Some(2 * u64::from(COUNT) - planted),
        "{f}"
    );
    assert_eq!(f["outputs"][0]["packets_out"], COUNT, "{f}");

    let (code, table) = ctl(&socket, &["flows"]);
    assert_eq!(code, 0, "{table}");
    assert!(
        table.contains(&format!("<= {LEG_A}:{PORT} on vRA"))
            && table.contains(&format!("<= {LEG_B}:{PORT} on vRA2"))
            && table.contains(&format!("merge: recovered {planted}")),
        "{table}"
    );
    // The final report has them too.
    let log = relay.stop();
    assert!(
        log.contains(&format!(
            "final redundancy flow=merged mode=merge recovered={planted} duplicates={both} lost=0"
        )),
        "{log}"
    );
    assert_eq!(log.matches("final leg flow=merged").count(), 2, "{log}");
}

#[test]
fn a_reload_adding_a_leg_loses_nothing_on_the_running_one() {
    let Some(t) = two_paths() else { return };
    let relay = t.relay(&flow_toml("grow", false), &[]);
    let socket = t.dir.join("control.sock");

    // Every number up to the last one sent must arrive.
    let (receiver, last_tx) = counting_receiver(&t, |copies, last| {
        (0..=last).all(|seq| copies.contains_key(&seq))
    });

    // The stream on both legs (only A's is received before the reload),
    // until told to stop: it lasts as long as the reload takes.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopping = std::sync::Arc::clone(&stop);
    let sender = in_netns(&t.a, move || {
        let a = sender(Ipv4Addr::new(10, 10, 1, 1));
        let b = sender(Ipv4Addr::new(10, 10, 3, 1));
        let mut seq = 0u16;
        loop {
            let d = datagram(seq);
            a.send_to(&d, SocketAddrV4::new(LEG_A, PORT))
                .expect("leg A");
            b.send_to(&d, SocketAddrV4::new(LEG_B, PORT))
                .expect("leg B");
            if stopping.load(std::sync::atomic::Ordering::Relaxed) || seq == 60_000 {
                return seq;
            }
            seq += 1;
            std::thread::sleep(Duration::from_micros(500));
        }
    });
    let packets_in = |n: u64| {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let s = stats(&socket);
            let f = s["flows"]
                .as_array()
                .and_then(|f| f.iter().find(|f| f["name"] == "grow").cloned())
                .unwrap_or_default();
            if f["packets_in"].as_u64() >= Some(n) && f["state"]["state"] == "running" {
                return f;
            }
            assert!(Instant::now() < deadline, "flow grow stuck: {s}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    packets_in(500);
    // Add leg B.
    let config = format!(
        "[daemon]\nuser = \"nobody\"\ncontrol_socket = \"{}\"\n{}",
        socket.display(),
        flow_toml("grow", true)
    );
    fs::write(t.dir.join("mcrelay.toml"), config).expect("rewrite config");
    let (code, said) = ctl(&socket, &["reload"]);
    assert_eq!(code, 0, "{said}");
    assert!(said.contains("changed: grow"), "{said}");
    // The new flow relays both legs.
    let deadline = Instant::now() + DEADLINE;
    loop {
        let s = stats(&socket);
        let legs = s["flows"][0]["redundancy"]["legs"].clone();
        if legs[0]["forwarded"].as_u64() > Some(0)
            && legs[1]["health"]["rtp"]["packets"].as_u64() > Some(200)
        {
            break;
        }
        assert!(Instant::now() < deadline, "the merged flow never ran: {s}");
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let last = sender.join().expect("sender");
    let _ = last_tx.send(last);
    let copies = receiver.join().expect("receiver");
    let missing: Vec<u16> = (0..=last).filter(|s| !copies.contains_key(s)).collect();
    let twice: usize = copies.values().filter(|&&n| n > 1).count();
    assert!(
        missing.is_empty(),
        "the reload lost {} of {} numbers: {:?}...\n{}\n{}",
        missing.len(),
        u32::from(last) + 1,
        &missing[..missing.len().min(20)],
        stats(&socket),
        relay.log()
    );
    // Only the overlap of the old and the new sockets (about one loop
    // turn) may leave twice.
    assert!(
        twice <= usize::from(last) / 10,
        "{twice} of {last} numbers left twice"
    );
    eprintln!(
        "reload: {} numbers, none lost, {twice} twice",
        u32::from(last) + 1
    );
    assert!(
        relay.log().contains("replaced by the reload"),
        "{}",
        relay.log()
    );
    relay.stop();
}

#[test]
fn failover_switches_to_the_backup_leg_once_and_says_so() {
    let Some(t) = two_paths() else { return };
    let config = format!(
        "\n[[flow]]\nname = \"fo\"\ninputs = [\
         {{ interface = \"vRA\", address = \"{LEG_A}\", port = {PORT} }}, \
         {{ interface = \"vRA2\", address = \"{LEG_B}\", port = {PORT} }}]\n\
         redundancy = \"failover\"\npayload = \"rtp\"\nfailover_after_ms = 100\nrevert_after_s = 0\n\
         outputs = [{{ interface = \"vRB\", address = \"{OUT}\", port = {PORT} }}]\n"
    );
    let relay = t.relay(&config, &[]);
    let socket = t.dir.join("control.sock");
    // Numbers are missing while the switch is pending: up to the last.
    let (receiver, last_tx) = counting_receiver(&t, |copies, last| copies.contains_key(&last));

    // Both legs carry the stream; leg A (the primary) stops after the
    // first 400 numbers, leg B carries on until told to stop.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopping = std::sync::Arc::clone(&stop);
    let sender = in_netns(&t.a, move || {
        let a = sender(Ipv4Addr::new(10, 10, 1, 1));
        let b = sender(Ipv4Addr::new(10, 10, 3, 1));
        let mut seq = 0u16;
        loop {
            let d = datagram(seq);
            if seq < 400 {
                a.send_to(&d, SocketAddrV4::new(LEG_A, PORT))
                    .expect("leg A");
            }
            b.send_to(&d, SocketAddrV4::new(LEG_B, PORT))
                .expect("leg B");
            if (seq > 400 && stopping.load(std::sync::atomic::Ordering::Relaxed)) || seq == 60_000 {
                return seq;
            }
            seq += 1;
            std::thread::sleep(Duration::from_micros(500));
        }
    });
    // Wait for the switch, seen in the counters.
    let deadline = Instant::now() + DEADLINE;
    let s = loop {
        let s = stats(&socket);
        let r = &s["flows"][0]["redundancy"];
        if r["switches"].as_u64() == Some(1) && r["legs"][1]["forwarded"].as_u64() > Some(200) {
            break s;
        }
        assert!(Instant::now() < deadline, "no switch to leg B: {s}");
        std::thread::sleep(Duration::from_millis(20));
    };
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let last = sender.join().expect("sender");
    let _ = last_tx.send(last);
    let copies = receiver.join().expect("receiver");
    let r = &s["flows"][0]["redundancy"];
    assert_eq!(r["mode"], "failover", "{s}");
    assert_eq!(r["active_input"], 1, "{s}");
    assert!(r["legs"][1]["standby"].as_u64() > Some(0), "{s}");
    // Never a number twice; what is missing is what leg B carried while
    // leg A's silence was being noticed (about failover_after_ms).
    assert!(copies.values().all(|&n| n == 1), "repeats on the output");
    let missing = (0..=last).filter(|s| !copies.contains_key(s)).count();
    assert!(missing < 1000, "{missing} of {last} numbers missing");
    // The supervisor logs the switch from the counters, once a second.
    let deadline = Instant::now() + DEADLINE;
    while !relay.log().contains("input switch") {
        assert!(
            Instant::now() < deadline,
            "switch not logged:\n{}",
            relay.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = relay.stop();
    assert_eq!(log.matches("input switch").count(), 1, "{log}");
    assert!(
        log.contains("final redundancy flow=fo mode=failover") && log.contains("switches=1"),
        "{log}"
    );
}
