//! The run-time loop guard with the real daemon (issue 27, item 2): a
//! configuration that passes `check` (unicast 10.10.1.2:5000 in, unicast
//! 10.10.2.2:6000 out) becomes a loop after a change outside it — here a
//! DNAT rule in the relay's namespace sending the output back to the
//! input, as a mistaken NAT or routing change would. Without the guard one
//! datagram went round forever (the issue saw 1.48 M relayed in 3 s from
//! one); with it each datagram the relay sent comes back once, is counted
//! as `drop_loop` and goes no further: relayed = sent, nothing amplified.
//! Root only (namespaces, iptables); skips with a message otherwise.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Topology, loadgen, stats_json};

const SENT: u64 = 2000;

#[test]
fn a_routing_change_that_loops_the_output_back_is_dropped_and_counted() {
    let Some(t) = Topology::new() else { return };
    if Command::new("iptables").arg("--version").output().is_err() {
        eprintln!("SKIPPED: iptables is not installed");
        return;
    }
    let socket = t.dir.join("control.sock");
    let relay = t.relay(
        r#"
[[flow]]
name = "loopy"
input = { interface = "vRA", address = "10.10.1.2", port = 5000 }
outputs = [{ interface = "vRB", address = "10.10.2.2", port = 6000 }]
"#,
        &[],
    );
    // The change that loops it: the relay's own output, sent back in.
    t.iptables(
        &t.r,
        &[
            "-t",
            "nat",
            "-A",
            "OUTPUT",
            "-p",
            "udp",
            "-d",
            "10.10.2.2",
            "--dport",
            "6000",
            "-j",
            "DNAT",
            "--to-destination",
            "10.10.1.2:5000",
        ],
    );
    let status = t
        .command(&t.a, &loadgen())
        .args(["send", "--dest", "10.10.1.2:5000", "--interface", "vA"])
        .args([
            "--count",
            &SENT.to_string(),
            "--rate",
            "2000",
            "--size",
            "1316",
        ])
        .stdout(std::process::Stdio::null())
        .status()
        .expect("sender");
    assert!(status.success());
    // Every datagram relayed once and back once.
    let deadline = Instant::now() + common::DEADLINE;
    let (packets_in, looped, out) = loop {
        let s = stats_json(&socket);
        let f = &s["flows"][0];
        let packets_in = f["packets_in"].as_u64().unwrap_or(0);
        let looped = f["drops"]["loop"].as_u64().unwrap_or(0);
        let out = f["outputs"][0]["packets_out"].as_u64().unwrap_or(0);
        if looped >= SENT || packets_in > SENT || Instant::now() > deadline {
            break (packets_in, looped, out);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // A little longer: a storm would keep counting.
    std::thread::sleep(Duration::from_millis(500));
    let s = stats_json(&socket);
    let later_in = s["flows"][0]["packets_in"].as_u64().unwrap_or(0);
    let nat = Command::new("ip")
        .args([
            "netns", "exec", &t.r, "iptables", "-t", "nat", "-L", "OUTPUT", "-v", "-n",
        ])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let metrics_line = format!(
        "in={packets_in} later_in={later_in} loop={looped} out={out}; drops {}; nat:\n{nat}",
        s["flows"][0]["drops"]
    );
    let log = relay.stop();
    eprintln!("loop guard: {metrics_line}");
    assert_eq!(
        (packets_in, later_in, out),
        (SENT, SENT, SENT),
        "relayed more than was sent (amplified): {metrics_line}\n{log}"
    );
    assert_eq!(
        looped, SENT,
        "every relayed datagram came back once: {metrics_line}\n{log}"
    );
    let line = log
        .lines()
        .find(|l| l.contains("final flow=loopy"))
        .unwrap_or_default();
    assert!(line.contains(&format!("drop_loop={SENT}")), "{line}\n{log}");
}
