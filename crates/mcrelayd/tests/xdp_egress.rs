//! `egress = "xdp"` end to end, in namespaces (topology in
//! `common/mod.rs`): the helper binds an AF_XDP socket with a TX ring to
//! queue 0 of the output interface, the worker writes each datagram into
//! a UMEM frame behind the output's prebuilt Ethernet/IPv4/UDP header and
//! a receiver in B gets every datagram byte-exact: from a socket input,
//! from an xdp input, fanned out to two interfaces; and after a link flap
//! of the output interface and reloads that remove and re-add the flow.
//! (Beside `tests/xdp.rs`, the ingress side, in its own file.)

use std::path::Path;

mod common;
use common::*;

const FLOW: &str = r#"
[[flow]]
name = "xdpout"
input = { interface = "vRA", address = "239.1.1.1", port = 5000 }
outputs = [ { interface = "vRB", address = "239.2.2.2", port = 6000, egress = "xdp" } ]
"#;

/// Relay 1000 datagrams of mixed sizes to `group` on B's `interface`
/// (`count` datagrams in, each once out) and check every one arrived
/// byte-exact.
fn relays_byte_exact(t: &Topology, interface: &str, groups: &[&str]) {
    let receivers: Vec<(&str, &str)> = groups.iter().map(|&g| (interface, g)).collect();
    t.relays_mixed_sizes_byte_exact(&receivers);
}

/// The daemon's final counters of the flow's output `label`.
fn output_counter(log: &str, label: &str, key: &str) -> u64 {
    counter(log, &["flow=xdpout", &format!("output={label}")], key)
}

#[test]
fn socket_ingress_xdp_egress_relays_byte_exact() {
    let Some(t) = Topology::new() else { return };
    let relay = t.relay(FLOW, &[]);
    assert!(
        relay.log().contains("xdp egress on an AF_XDP socket"),
        "{}",
        relay.log()
    );
    relays_byte_exact(&t, "vB", &["239.2.2.2:6000"]);
    let log = relay.stop();
    let label = "239.2.2.2:6000@vRB";
    assert_eq!(output_counter(&log, label, "packets_out"), 1000, "{log}");
    assert_eq!(output_counter(&log, label, "drop_send_error"), 0, "{log}");
    assert_eq!(
        output_counter(&log, label, "bytes_out"),
        250 * (1316 + 64 + 1472 + 700),
        "{log}"
    );
}

#[test]
fn xdp_ingress_and_xdp_egress_relay_byte_exact() {
    let Some(t) = Topology::new() else { return };
    t.fit_input_to_umem();
    let relay = t.relay(
        &FLOW.replace("port = 5000 }", "port = 5000, ingress = \"xdp\" }"),
        &[],
    );
    let log = relay.log();
    assert!(log.contains("xdp ingress on an AF_XDP socket"), "{log}");
    assert!(log.contains("xdp egress on an AF_XDP socket"), "{log}");
    relays_byte_exact(&t, "vB", &["239.2.2.2:6000"]);
    let log = relay.stop();
    assert_eq!(
        output_counter(&log, "239.2.2.2:6000@vRB", "packets_out"),
        1000,
        "{log}"
    );
}

/// A second link from R to B, vRC 10.10.3.1 <-> vC 10.10.3.2.
fn second_output_link(t: &Topology) {
    sh(&[
        "ip", "link", "add", "vRC", "netns", &t.r, "type", "veth", "peer", "name", "vC", "netns",
        &t.b,
    ]);
    t.ip(&t.r, &["addr", "add", "10.10.3.1/24", "dev", "vRC"]);
    t.ip(&t.b, &["addr", "add", "10.10.3.2/24", "dev", "vC"]);
    t.ip(&t.r, &["link", "set", "vRC", "up"]);
    t.ip(&t.b, &["link", "set", "vC", "up"]);
    wait_link_up(&t.r, "vRC");
}

#[test]
fn one_flow_fans_out_to_two_xdp_interfaces() {
    let Some(t) = Topology::new() else { return };
    second_output_link(&t);
    let config = FLOW.replace(
        "egress = \"xdp\" } ]",
        "egress = \"xdp\" }, { interface = \"vRC\", address = \"239.2.2.3\", port = 6000, egress = \"xdp\" } ]",
    );
    let relay = t.relay(&config, &[]);
    let rx_c = t.receiver_on("vC", "239.2.2.3:6000", 1000, &[]);
    relays_byte_exact(&t, "vB", &["239.2.2.2:6000"]);
    let out = finish(rx_c);
    clean(&out);
    assert_eq!(field(&out, "valid"), 1000, "{out}");
    let log = relay.stop();
    for label in ["239.2.2.2:6000@vRB", "239.2.2.3:6000@vRC"] {
        assert_eq!(output_counter(&log, label, "packets_out"), 1000, "{log}");
    }
}

/// Send 200 datagrams and wait until the output sent them.
fn relays_more(t: &Topology, socket: &Path) {
    let sent = |s: &mcrelay_control::Snapshot| {
        s.flow("xdpout")
            .and_then(|f| f.outputs.first())
            .map_or(0, |o| o.packets_out)
    };
    let before = sent(&snapshot(socket));
    t.send("239.1.1.1:5000", &["--count", "200", "--rate", "10000"]);
    wait_until("200 more sent on the xdp output", || {
        let n = sent(&snapshot(socket));
        if n >= before + 200 {
            Ok(())
        } else {
            Err(format!("{n} sent, {before} before"))
        }
    });
}

/// The output's link flaps (frames wait or are counted while it is down;
/// delivery resumes once it is up), and reloads that remove the flow
/// (closing its AF_XDP socket, freeing queue 0) and add it back (a new
/// socket bound to the same queue) leave a working xdp output.
#[test]
fn link_flap_and_reload_keep_the_xdp_output_working() {
    let Some(t) = Topology::new() else { return };
    let socket = t.dir.join("control.sock");
    let relay = t.relay(FLOW, &[]);
    relays_more(&t, &socket);

    t.ip(&t.r, &["link", "set", "vRB", "down"]);
    t.send("239.1.1.1:5000", &["--count", "100", "--rate", "10000"]);
    t.ip(&t.r, &["link", "set", "vRB", "up"]);
    wait_link_up(&t.r, "vRB");
    wait_flow(&socket, "xdpout", "running", |s, _| s.is_running());
    relays_byte_exact(&t, "vB", &["239.2.2.2:6000"]);

    let path = t.dir.join("mcrelay.toml");
    let text = std::fs::read_to_string(&path).expect("config");
    let other = FLOW
        .replace("name = \"xdpout\"", "name = \"plain\"")
        .replace(", egress = \"xdp\"", "");
    reload_config(&relay, &socket, &path, &text.replace(FLOW, &other));
    wait_until("the xdp flow gone", || {
        if snapshot(&socket).flow("xdpout").is_none() {
            Ok(())
        } else {
            Err("still there".into())
        }
    });
    reload_config(&relay, &socket, &path, &text);
    wait_flow(&socket, "xdpout", "back", |s, _| s.is_running());
    relays_byte_exact(&t, "vB", &["239.2.2.2:6000"]);

    // A reload that changes the flow (its output's TTL): the old flow
    // holds queue 0 of vRB, so it is stopped before its successor starts
    // (break-before-make) instead of refusing the new one with EBUSY.
    // The reload succeeds, the flow runs again and its frames carry the
    // new TTL.
    let ttl = text.replace("egress = \"xdp\"", "egress = \"xdp\", ttl = 9");
    reload_config(&relay, &socket, &path, &ttl);
    assert!(
        relay.log().contains("stopped before its successor starts"),
        "{}",
        relay.log()
    );
    wait_flow(&socket, "xdpout", "running, changed", |s, _| s.is_running());
    let rx = t.receiver_on("vB", "239.2.2.2:6000", 500, &[]);
    t.send("239.1.1.1:5000", &["--count", "500", "--rate", "20000"]);
    let out = finish(rx);
    clean(&out);
    assert_eq!(field(&out, "valid"), 500, "{out}");
    assert_eq!(field(&out, "ttl"), 9, "{out}");
    relay.stop();
}

/// Unicast xdp outputs: their frames carry the next hop's MAC, read from
/// R's neighbour table when the flow starts (R has no entry yet: the
/// daemon makes the kernel resolve it). One output to B's address on the
/// vRB link; one out of vRC to an address B holds behind a gateway (R
/// routes 10.10.9.0/24 via B's 10.10.3.2: the frames carry vC's MAC and
/// 10.10.9.9). Both delivered byte-exact; the first follows a change of
/// B's MAC while it runs. Then a reload sends the first
/// to an address no host answers for: the reload fails, naming the
/// address, the interface and the neighbour state, and the other flow
/// relays on.
#[test]
fn unicast_xdp_outputs_get_their_next_hops_mac() {
    let Some(t) = Topology::new() else { return };
    second_output_link(&t);
    t.ip(&t.b, &["addr", "add", "10.10.9.9/32", "dev", "vC"]);
    t.ip(
        &t.r,
        &[
            "route",
            "add",
            "10.10.9.0/24",
            "via",
            "10.10.3.2",
            "dev",
            "vRC",
        ],
    );
    let config = r#"
[[flow]]
name = "xdpout"
input = { interface = "vRA", address = "239.1.1.1", port = 5000 }
outputs = [ { interface = "vRB", address = "10.10.2.2", port = 6000, egress = "xdp" } ]

[[flow]]
name = "routed"
input = { interface = "vRA", address = "239.1.1.2", port = 5000 }
outputs = [ { interface = "vRC", address = "10.10.9.9", port = 6001, egress = "xdp" } ]
"#;
    let relay = t.relay(config, &[]);
    let socket = t.dir.join("control.sock");
    for name in ["xdpout", "routed"] {
        wait_until(&format!("flow {name} running"), || {
            match snapshot(&socket).flow(name) {
                Some(f) if f.state.is_running() => Ok(()),
                other => Err(format!("{:?}\n{}", other.map(|f| &f.state), relay.log())),
            }
        });
    }
    let log = relay.log();
    assert!(log.contains("next hop resolved"), "{log}");
    relays_byte_exact(&t, "vB", &["10.10.2.2:6000"]);
    let rx = t.receiver_on("vC", "10.10.9.9:6001", 500, &[]);
    t.send(
        "239.1.1.2:5000",
        &["--count", "500", "--rate", "20000", "--size", "1316,64"],
    );
    let out = finish(rx);
    clean(&out);
    assert_eq!(field(&out, "valid"), 500, "{out}");

    // B's vB gets a new MAC and R's neighbour entry says so (as when a
    // host is replaced and announces itself): the running output follows
    // (the daemon's neighbour watcher), and B receives again. Frames to
    // the old MAC would be dropped by vB.
    t.ip(&t.b, &["link", "set", "vB", "address", "02:00:00:00:30:99"]);
    t.ip(
        &t.r,
        &[
            "neigh",
            "replace",
            "10.10.2.2",
            "lladdr",
            "02:00:00:00:30:99",
            "dev",
            "vRB",
            "nud",
            "permanent",
        ],
    );
    wait_until("the daemon following the new MAC", || {
        let log = relay.log();
        if log.contains("the next hop's MAC changed") {
            Ok(())
        } else {
            Err(log)
        }
    });
    relays_byte_exact(&t, "vB", &["10.10.2.2:6000"]);

    // No host answers for 10.10.2.99: the changed flow doesn't start,
    // and the reload says why.
    let path = t.dir.join("mcrelay.toml");
    let text = std::fs::read_to_string(&path).expect("config");
    std::fs::write(&path, text.replace("10.10.2.2", "10.10.2.99")).expect("rewrite");
    let (code, said) = ctl(&socket, &["reload"]);
    assert_ne!(code, 0, "{said}");
    assert!(
        said.contains("no MAC address for 10.10.2.99 on vRB"),
        "{said}\n{}",
        relay.log()
    );
    let s = snapshot(&socket);
    match s.flow("xdpout").map(|f| &f.state) {
        Some(mcrelay_control::FlowState::OpenFailed { error }) => {
            assert!(error.contains("10.10.2.99"), "{error}");
        }
        other => panic!("{other:?}"),
    }
    let rx = t.receiver_on("vC", "10.10.9.9:6001", 200, &[]);
    t.send("239.1.1.2:5000", &["--count", "200", "--rate", "10000"]);
    let out = finish(rx);
    clean(&out);
    assert_eq!(field(&out, "valid"), 200, "{out}");
    relay.stop();
}

/// Configurations the xdp egress can't serve are refused before anything
/// starts, naming why (`mcrelayd --check`, no root needed); a unicast one
/// passes (its next hop is resolved when the flow starts).
#[test]
fn ipv6_xdp_outputs_are_refused_by_check_and_unicast_ones_pass() {
    let dir = std::env::temp_dir().join(format!("mcrelay-xdpout-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    for (output, why) in [
        (
            r#"{ interface = "eth1", address = "ff3e::1", port = 6000, egress = "xdp" }"#,
            Some("takes IPv4 outputs only"),
        ),
        (
            r#"{ interface = "eth1", address = "10.0.0.2", port = 6000, egress = "xdp" }"#,
            None,
        ),
    ] {
        let path = dir.join("c.toml");
        std::fs::write(
            &path,
            format!(
                "[[flow]]\nname = \"x\"\ninput = {{ interface = \"eth0\", address = \"239.1.1.1\", port = 5000 }}\noutputs = [{output}]\n"
            ),
        )
        .expect("write");
        let out = std::process::Command::new(MCRELAYD)
            .args(["check", "--offline", "--config"])
            .arg(&path)
            .output()
            .expect("mcrelayd --check");
        let said = String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout);
        match why {
            Some(why) => {
                assert!(!out.status.success(), "{said}");
                assert!(said.contains(why), "{said}");
            }
            None => assert!(out.status.success(), "{said}"),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
