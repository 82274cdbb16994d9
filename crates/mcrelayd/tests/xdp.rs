//! `ingress = "xdp"` end to end, in namespaces (topology in
//! `common/mod.rs`, with the input link's MTU lowered to 1500: a UMEM frame
//! holds 1792 bytes): the helper loads and attaches the XDP program and
//! binds the AF_XDP socket, the worker relays from its RX ring byte-exact;
//! other traffic on the input interface (another port of the same group,
//! unicast UDP, TCP) still reaches the kernel's stack; the program is
//! detached when the daemon stops, when it is SIGKILLed, and attached
//! again when it restarts; an interface whose MTU allows larger frames is
//! refused with the limit named.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::process::Command;

use mcrelay_control::FlowState;

mod common;
use common::*;

const FLOW: &str = r#"
[[flow]]
name = "xdp"
input = { interface = "vRA", address = "239.1.1.1", port = 5000, ingress = "xdp" }
outputs = [ { interface = "vRB", address = "239.2.2.2", port = 6000 } ]
"#;

/// A topology whose input link (vA-vRA) has a 1500-byte MTU.
fn topology() -> Option<Topology> {
    let t = Topology::new()?;
    t.fit_input_to_umem();
    Some(t)
}

/// Whether an XDP program is attached to `dev` in namespace `ns`.
fn attached(ns: &str, dev: &str) -> bool {
    let out = Command::new("ip")
        .args(["-n", ns, "-d", "link", "show", "dev", dev])
        .output()
        .expect("ip link show");
    let text = String::from_utf8_lossy(&out.stdout);
    text.contains("prog/xdp") || text.contains(" xdp")
}

fn wait_attached(t: &Topology, want: bool) {
    wait_until(
        if want {
            "the XDP program attached to vRA"
        } else {
            "the XDP program detached from vRA"
        },
        || {
            if attached(&t.r, "vRA") == want {
                Ok(())
            } else {
                Err(format!("attached: {}", !want))
            }
        },
    );
}

/// Relay 1000 datagrams of mixed sizes up to the largest a 1500 MTU
/// carries, and check every one arrived byte-exact.
fn relays_byte_exact(t: &Topology) {
    t.relays_mixed_sizes_byte_exact(&[("vB", "239.2.2.2:6000")]);
}

#[test]
fn xdp_ingress_relays_byte_exact_and_leaves_other_traffic_alone() {
    let Some(t) = topology() else { return };
    let relay = t.relay(FLOW, &[]);
    assert!(
        relay.log().contains("xdp ingress on an AF_XDP socket"),
        "{}",
        relay.log()
    );
    wait_attached(&t, true);
    relays_byte_exact(&t);

    // Other traffic on vRA: another port of the same group, unicast UDP
    // and TCP all reach R's own sockets past the program.
    let (group_other, unicast, listener) = in_netns(&t.r, || {
        let g = UdpSocket::bind("0.0.0.0:5002").expect("bind 5002");
        g.join_multicast_v4(&"239.1.1.1".parse().unwrap(), &"10.10.1.2".parse().unwrap())
            .expect("join");
        g.set_read_timeout(Some(DEADLINE)).expect("timeout");
        let u = UdpSocket::bind("10.10.1.2:5003").expect("bind 5003");
        u.set_read_timeout(Some(DEADLINE)).expect("timeout");
        let l = TcpListener::bind("10.10.1.2:7000").expect("listen");
        (g, u, l)
    });
    in_netns(&t.a, || {
        let s = UdpSocket::bind("10.10.1.1:0").expect("bind");
        s.send_to(b"same group, other port", "239.1.1.1:5002")
            .expect("send");
        s.send_to(b"unicast", "10.10.1.2:5003").expect("send");
        let mut c = TcpStream::connect_timeout(&"10.10.1.2:7000".parse().unwrap(), DEADLINE)
            .expect("TCP across the XDP program");
        c.write_all(b"tcp").expect("write");
    });
    let mut buf = [0u8; 64];
    let n = group_other.recv(&mut buf).expect("other port of the group");
    assert_eq!(&buf[..n], b"same group, other port");
    let n = unicast.recv(&mut buf).expect("unicast");
    assert_eq!(&buf[..n], b"unicast");
    let (mut conn, _) = listener.accept().expect("accept");
    conn.set_read_timeout(Some(DEADLINE)).expect("timeout");
    let mut got = [0u8; 3];
    conn.read_exact(&mut got).expect("read");
    assert_eq!(&got, b"tcp");

    let log = relay.stop();
    let flow = ["flow=xdp", "packets_in"];
    assert_eq!(counter(&log, &flow, "packets_in"), 1000, "{log}");
    for reason in ["truncated", "malformed", "fragment", "not_this_flow"] {
        assert_eq!(
            counter(&log, &flow, &format!("drop_{reason}")),
            0,
            "{reason}"
        );
    }
    // Stopped: the link closed with the daemon, nothing stays attached.
    wait_attached(&t, false);
}

#[test]
fn the_program_is_detached_after_sigkill_and_attached_again_on_restart() {
    let Some(t) = topology() else { return };
    let relay = t.relay(FLOW, &[]);
    wait_attached(&t, true);
    signal(&relay.child, libc::SIGKILL);
    // The daemon's fds close with it (its zygote and helper follow it,
    // PR_SET_PDEATHSIG, and hold no copy of the link).
    wait_attached(&t, false);
    drop(relay);
    let relay = t.relay(FLOW, &[]);
    wait_attached(&t, true);
    relays_byte_exact(&t);
    let log = relay.stop();
    assert_eq!(
        counter(&log, &["flow=xdp", "packets_in"], "packets_in"),
        1000
    );
    wait_attached(&t, false);
}

#[test]
fn an_mtu_above_the_umem_frame_is_refused_naming_the_limit() {
    // Topology::new's links have a 9200-byte MTU.
    let Some(t) = Topology::new() else { return };
    let relay = t.relay(FLOW, &[]);
    wait_until("the refusal logged", || {
        let log = relay.log();
        if log.contains("receives frames up to 1792 bytes") {
            Ok(())
        } else {
            Err(log)
        }
    });
    assert!(!attached(&t.r, "vRA"), "nothing attached");
    relay.stop();
}

fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Send 200 datagrams to the flow and wait until its counter saw them.
fn relays_more(t: &Topology, socket: &Path) {
    let before = snapshot(socket).flow("xdp").expect("flow").packets_in;
    t.send("239.1.1.1:5000", &["--count", "200", "--rate", "10000"]);
    wait_flow(socket, "xdp", "relaying", |_, n| n >= before + 200);
}

/// The flow's program follows the flow through a link flap, the death of
/// the privileged helper and reloads that remove, re-add and change it.
#[test]
fn link_flap_helper_death_and_reload_keep_the_program_in_step() {
    let Some(t) = topology() else { return };
    let socket = t.dir.join("control.sock");
    let relay = t.relay(FLOW, &[]);
    wait_flow(&socket, "xdp", "running", |s, _| s.is_running());
    wait_attached(&t, true);
    relays_more(&t, &socket);

    // Link flap: the flow pauses while vRA is down and reopens (a new
    // program, a new socket) once it is up again.
    t.ip(&t.r, &["link", "set", "vRA", "down"]);
    wait_flow(&socket, "xdp", "paused", |s, _| {
        matches!(s, FlowState::InterfaceDown { .. })
    });
    t.ip(&t.r, &["link", "set", "vRA", "up"]);
    wait_flow(&socket, "xdp", "resumed", |s, _| s.is_running());
    wait_attached(&t, true);
    relays_more(&t, &socket);

    // The helper dies: the daemon holds the link, so the running flow
    // keeps its program, and a new helper is forked.
    let daemon = relay.child.id();
    let zygote = *children(daemon).first().expect("zygote");
    let helper = *children(zygote).first().expect("helper");
    sh(&["kill", "-KILL", &helper.to_string()]);
    wait_until("a new helper", || match children(zygote)[..] {
        [new] if new != helper => Ok(()),
        ref other => Err(format!("{other:?}")),
    });
    assert!(attached(&t.r, "vRA"), "the program stayed");
    relays_more(&t, &socket);

    // A reload that removes the flow detaches its program; one that adds
    // it back (through the new helper) attaches it again.
    let path = t.dir.join("mcrelay.toml");
    let text = std::fs::read_to_string(&path).expect("config");
    let other = FLOW
        .replace("name = \"xdp\"", "name = \"socket\"")
        .replace(", ingress = \"xdp\"", "");
    reload_config(&relay, &socket, &path, &text.replace(FLOW, &other));
    wait_attached(&t, false);
    reload_config(&relay, &socket, &path, &text);
    wait_flow(&socket, "xdp", "running", |s, _| s.is_running());
    wait_attached(&t, true);
    relays_more(&t, &socket);

    // A reload that changes the flow (its output's TTL): the old flow's
    // program holds vRA, so the flow is stopped before its successor
    // attaches its own (break-before-make), instead of the new one being
    // refused with EBUSY. It relays again, with the new TTL.
    let ttl = text.replace("port = 6000 }", "port = 6000, ttl = 7 }");
    reload_config(&relay, &socket, &path, &ttl);
    assert!(
        relay.log().contains("stopped before its successor starts"),
        "{}",
        relay.log()
    );
    wait_flow(&socket, "xdp", "running", |s, _| s.is_running());
    wait_attached(&t, true);
    let rx = t.receiver("239.2.2.2:6000", 300, &[]);
    t.send("239.1.1.1:5000", &["--count", "300", "--rate", "10000"]);
    let out = finish(rx);
    clean(&out);
    assert_eq!(field(&out, "valid"), 300, "{out}");
    assert_eq!(field(&out, "ttl"), 7, "{out}");
    relay.stop();
    wait_attached(&t, false);
}

/// A warm standby receives on its xdp input and relays nothing until it
/// is made active.
#[test]
fn a_standby_daemon_discards_on_its_xdp_input_until_active() {
    let Some(t) = topology() else { return };
    let socket = t.dir.join("control.sock");
    let config = format!(
        "[daemon]\nuser = \"nobody\"\ncontrol_socket = \"{}\"\nmode = \"standby\"\n{FLOW}",
        socket.display()
    );
    let relay = t.relay(&config, &[]);
    wait_attached(&t, true);
    t.send("239.1.1.1:5000", &["--count", "200", "--rate", "10000"]);
    wait_until("200 discarded in standby", || {
        let s = snapshot(&socket);
        let f = s.flow("xdp").ok_or("no flow")?;
        if f.standby_discarded >= 200 {
            Ok(())
        } else {
            Err(format!("{} discarded", f.standby_discarded))
        }
    });
    assert_eq!(
        snapshot(&socket).flow("xdp").expect("flow").outputs[0].packets_out,
        0
    );
    let (code, out) = ctl(&socket, &["active"]);
    assert_eq!(code, 0, "{out}");
    relays_byte_exact(&t);
    relay.stop();
}

const LEG_A: &str = "239.7.1.1";
const LEG_B: &str = "239.7.2.1";
const STREAM: u16 = 1000;

/// Datagram `seq` of an RTP stream, its payload naming it.
fn rtp_datagram(seq: u16) -> Vec<u8> {
    let mut d = vec![0u8; 12 + 200];
    let _ = mcrelay_wire::rtp::build(&mut d, 96, seq, u32::from(seq) * 3000, 0x5eed);
    for (i, b) in d[12..].iter_mut().enumerate() {
        *b = u8::try_from((usize::from(seq) * 31 + i) % 256).unwrap_or(0);
    }
    d
}

/// Two legs of one flow, an xdp one and a socket one (on one interface:
/// an interface holds one XDP program), with disjoint losses planted:
/// the merge puts out every datagram once, byte-exact.
#[test]
fn an_xdp_leg_and_a_socket_leg_merge() {
    let Some(t) = topology() else { return };
    let config = format!(
        "\n[[flow]]\nname = \"merge\"\ninputs = [\
         {{ interface = \"vRA\", address = \"{LEG_A}\", port = 5004, ingress = \"xdp\" }}, \
         {{ interface = \"vRA\", address = \"{LEG_B}\", port = 5004 }}]\n\
         redundancy = \"merge\"\npayload = \"rtp\"\n\
         outputs = [{{ interface = \"vRB\", address = \"239.7.3.1\", port = 5004 }}]\n"
    );
    let relay = t.relay(&config, &[]);
    wait_attached(&t, true);
    let receiver = in_netns(&t.b, || {
        let s = UdpSocket::bind("0.0.0.0:5004").expect("bind");
        s.join_multicast_v4(&"239.7.3.1".parse().unwrap(), &"10.10.2.2".parse().unwrap())
            .expect("join");
        s.set_read_timeout(Some(DEADLINE)).expect("timeout");
        s
    });
    std::thread::sleep(std::time::Duration::from_millis(100));
    // Sent from a thread while this one reads (the receiver's buffer
    // holds a few hundred).
    let a = t.a.clone();
    let sender = std::thread::spawn(move || {
        in_netns(&a, || {
            let s = UdpSocket::bind("10.10.1.1:0").expect("bind");
            for seq in 0..STREAM {
                let d = rtp_datagram(seq);
                // Leg A misses every tenth, leg B every tenth but five later.
                if seq % 10 != 3 {
                    s.send_to(&d, (LEG_A, 5004)).expect("leg A");
                }
                if seq % 10 != 8 {
                    s.send_to(&d, (LEG_B, 5004)).expect("leg B");
                }
                if seq % 50 == 0 {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
            }
        })
    });
    let mut seen = vec![0u32; usize::from(STREAM)];
    let mut buf = [0u8; 2048];
    let mut got = 0;
    while got < STREAM {
        let n = receiver.recv(&mut buf).unwrap_or_else(|e| {
            panic!(
                "{got} of {STREAM} merged datagrams, then {e}:\n{}",
                relay.log()
            )
        });
        let seq = u16::from_be_bytes([buf[2], buf[3]]);
        assert_eq!(&buf[..n], &rtp_datagram(seq)[..], "byte-exact {seq}");
        seen[usize::from(seq)] += 1;
        got += 1;
    }
    assert!(seen.iter().all(|&c| c == 1), "each once: {seen:?}");
    sender.join().expect("sender");
    relay.stop();
}

/// Loop turns of every worker, from the control socket.
fn loop_turns(socket: &Path) -> Vec<u64> {
    snapshot(socket)
        .workers
        .iter()
        .map(|w| w.loop_turns)
        .collect()
}

/// `latency = "low"`: the worker serving the flow never sleeps (its loop
/// turns while idle are many thousands per second, where a sleeping
/// worker turns about ten times, on its 100 ms tick), and the flow relays
/// byte-exact as ever.
#[test]
fn latency_low_busy_polls_the_flows_worker() {
    let Some(t) = topology() else { return };
    let socket = t.dir.join("control.sock");
    let relay = t.relay(
        &FLOW.replace("outputs =", "latency = \"low\"\noutputs ="),
        &[],
    );
    assert!(relay.log().contains("busy polling"), "{}", relay.log());
    let before = loop_turns(&socket);
    let start = std::time::Instant::now();
    std::thread::sleep(std::time::Duration::from_secs(1));
    let after = loop_turns(&socket);
    let secs = start.elapsed().as_secs_f64();
    let rates: Vec<f64> = before
        .iter()
        .zip(&after)
        .map(|(b, a)| (a - b) as f64 / secs)
        .collect();
    // One worker busy (the flow's), the others asleep.
    assert!(
        rates.iter().any(|&r| r > 2000.0),
        "a busy-polling worker: {rates:?} turns/s"
    );
    assert!(
        rates.iter().any(|&r| r < 100.0),
        "the other worker sleeps: {rates:?} turns/s"
    );
    relays_byte_exact(&t);
    relay.stop();
}

/// Failover with an xdp leg (the primary) and a socket leg (the backup),
/// on one interface: while both send, the output carries each number once;
/// when the xdp leg goes silent the flow switches to the socket leg
/// within `failover_after_ms` and the rest of the stream comes from it,
/// byte-exact, nothing repeated.
#[test]
fn an_xdp_primary_fails_over_to_a_socket_leg() {
    let Some(t) = topology() else { return };
    let socket = t.dir.join("control.sock");
    let config = format!(
        "\n[[flow]]\nname = \"failover\"\ninputs = [\
         {{ interface = \"vRA\", address = \"{LEG_A}\", port = 5004, ingress = \"xdp\" }}, \
         {{ interface = \"vRA\", address = \"{LEG_B}\", port = 5004 }}]\n\
         redundancy = \"failover\"\nfailover_after_ms = 100\npayload = \"rtp\"\n\
         outputs = [{{ interface = \"vRB\", address = \"239.7.3.1\", port = 5004 }}]\n"
    );
    let relay = t.relay(&config, &[]);
    wait_attached(&t, true);
    let receiver = in_netns(&t.b, || {
        let s = UdpSocket::bind("0.0.0.0:5004").expect("bind");
        s.join_multicast_v4(&"239.7.3.1".parse().unwrap(), &"10.10.2.2".parse().unwrap())
            .expect("join");
        s.set_read_timeout(Some(DEADLINE)).expect("timeout");
        s
    });
    std::thread::sleep(std::time::Duration::from_millis(100));
    let silent_from: u16 = 300;
    let a = t.a.clone();
    let sender = std::thread::spawn(move || {
        in_netns(&a, move || {
            let s = UdpSocket::bind("10.10.1.1:0").expect("bind");
            for seq in 0..STREAM {
                let d = rtp_datagram(seq);
                // The xdp leg (A) goes silent from `silent_from` on.
                if seq < silent_from {
                    s.send_to(&d, (LEG_A, 5004)).expect("leg A");
                }
                s.send_to(&d, (LEG_B, 5004)).expect("leg B");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        })
    });
    let mut seen = vec![0u32; usize::from(STREAM)];
    let mut buf = [0u8; 2048];
    loop {
        let n = match receiver.recv(&mut buf) {
            Ok(n) => n,
            Err(_) if seen[usize::from(STREAM) - 1] > 0 => break,
            Err(e) => panic!("{e} before the last number:\n{}", relay.log()),
        };
        let seq = u16::from_be_bytes([buf[2], buf[3]]);
        assert_eq!(&buf[..n], &rtp_datagram(seq)[..], "byte-exact {seq}");
        seen[usize::from(seq)] += 1;
        if seq == STREAM - 1 {
            break;
        }
    }
    sender.join().expect("sender");
    assert!(seen.iter().all(|&c| c <= 1), "none repeated: {seen:?}");
    let before: Vec<u16> = (0..silent_from)
        .filter(|&s| seen[usize::from(s)] == 0)
        .collect();
    assert!(before.is_empty(), "lost while both legs sent: {before:?}");
    // After the switch (at most failover_after_ms, a few hundred numbers
    // on a loaded machine), every number comes from the socket leg.
    let tail: Vec<u16> = (silent_from + 400..STREAM)
        .filter(|&s| seen[usize::from(s)] == 0)
        .collect();
    assert!(tail.is_empty(), "lost after the switch: {tail:?}");
    let s = snapshot(&socket);
    let r = s
        .flow("failover")
        .and_then(|f| f.redundancy.as_ref())
        .expect("redundancy");
    assert_eq!(r.active_input, 1, "on the socket leg: {r:?}");
    assert!(r.switches >= 1, "{r:?}");
    relay.stop();
}
