//! The relay end to end in network namespaces this test builds and removes
//! (the topology is in `common/mod.rs`).
//! Needs root (CI runs as root); skips with a message otherwise.

use std::fs;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::*;

const SIZES: &str = "1,1472,1500,1501,4096,4097,8972,9000,9001";

fn one_to_one(receive: &str) {
    let Some(t) = Topology::new() else { return };
    let relay = t.relay(
        r#"
[[flow]]
name = "one"
input = { interface = "vRA", address = "239.1.1.1", port = 5000 }
outputs = [ { interface = "vRB", address = "239.2.2.2", port = 6000, ttl = 7 } ]
"#,
        &["--receive", receive],
    );
    // 9 sizes x 100; the 9001-byte ones are dropped, the 1-byte ones arrive
    // too short to carry a header (counted as "short").
    let rx = t.receiver("239.2.2.2:6000", 800, &[]);
    t.send(
        "239.1.1.1:5000",
        &["--count", "900", "--rate", "20000", "--size", SIZES],
    );
    let out = finish(rx);
    let log = relay.stop();
    clean(&out);
    assert_eq!(
        (field(&out, "valid"), field(&out, "short")),
        (700, 100),
        "{out}"
    );
    assert_eq!(
        (field(&out, "min_len"), field(&out, "max_len")),
        (1, 9000),
        "{out}"
    );
    assert_eq!(
        field(&out, "ttl"),
        7,
        "TTL on the wire is the configured one"
    );
    assert_eq!(
        counter(&log, &["flow=one", "packets_in"], "packets_in"),
        900
    );
    assert_eq!(
        counter(&log, &["flow=one", "packets_in"], "drop_oversize"),
        100
    );
    assert_eq!(
        counter(&log, &["output=239.2.2.2:6000"], "packets_out"),
        800
    );
}

#[test]
fn ipv4_one_to_one_sizes_ttl_and_oversize() {
    one_to_one("auto");
}

#[test]
fn ipv4_one_to_one_rearmed_receives() {
    one_to_one("single");
}

#[test]
fn fan_out_one_to_four_multicast_and_unicast() {
    let Some(t) = Topology::new() else { return };
    let relay = t.relay(
        r#"
[[flow]]
name = "fan"
input = { interface = "vRA", address = "239.1.1.1", port = 5000 }
outputs = [
  { interface = "vRB", address = "239.2.2.2", port = 6000 },
  { interface = "vRB", address = "239.2.2.3", port = 6001 },
  { interface = "vRB", address = "239.2.2.4", port = 6002 },
  { interface = "vRB", address = "10.10.2.2", port = 6003 },
]
"#,
        &[],
    );
    let groups = [
        "239.2.2.2:6000",
        "239.2.2.3:6001",
        "239.2.2.4:6002",
        "10.10.2.2:6003",
    ];
    let rxs: Vec<Child> = groups.iter().map(|g| t.receiver(g, 3000, &[])).collect();
    t.send(
        "239.1.1.1:5000",
        &["--count", "3000", "--rate", "30000", "--size", "1316"],
    );
    let outs: Vec<String> = rxs.into_iter().map(finish).collect();
    let log = relay.stop();
    for (g, out) in groups.iter().zip(outs) {
        clean(&out);
        assert_eq!(
            (field(&out, "valid"), field(&out, "lost")),
            (3000, 0),
            "{g}: {out}\n{log}"
        );
    }
}

#[test]
fn ipv6_one_to_one() {
    let Some(t) = Topology::new() else { return };
    let relay = t.relay(
        r#"
[[flow]]
name = "v6"
input = { interface = "vRA", address = "ff3e::1:1", port = 5000 }
outputs = [ { interface = "vRB", address = "ff3e::2:2", port = 6000, ttl = 5 } ]
"#,
        &[],
    );
    let rx = t.receiver("[ff3e::2:2]:6000", 2000, &[]);
    t.send(
        "[ff3e::1:1]:5000",
        &[
            "--count",
            "2000",
            "--rate",
            "20000",
            "--size",
            "1,1316,8952",
        ],
    );
    let out = finish(rx);
    let log = relay.stop();
    clean(&out);
    assert_eq!(field(&out, "received"), 2000, "{out}\n{log}");
    assert_eq!(field(&out, "ttl"), 5, "hop limit on the wire");
}

/// A source-specific flow relays its source's datagrams and not those of a
/// second source on the same group (sent first, as run 2).
fn ssm(group: &str, right: &str, wrong: &str, out_group: &str) {
    let Some(t) = Topology::new() else { return };
    if wrong.contains(':') {
        t.ip(
            &t.a,
            &[
                "-6",
                "addr",
                "add",
                &format!("{wrong}/64"),
                "dev",
                "vA",
                "nodad",
            ],
        );
    } else {
        t.ip(&t.a, &["addr", "add", &format!("{wrong}/24"), "dev", "vA"]);
    }
    let bare = |a: &str| {
        a.trim_start_matches('[')
            .split(']')
            .next()
            .unwrap_or(a)
            .to_owned()
    };
    let relay = t.relay(
        &format!(
            r#"
[[flow]]
name = "ssm"
input = {{ interface = "vRA", address = "{}", port = 5000, source = "{right}" }}
outputs = [ {{ interface = "vRB", address = "{}", port = 6000 }} ]
"#,
            bare(group),
            bare(out_group)
        ),
        &[],
    );
    let dest = format!("{group}:5000");
    let rx = t.receiver(&format!("{out_group}:6000"), 1000, &[]);
    for (source, run) in [(wrong, "2"), (right, "1")] {
        t.send(
            &dest,
            &[
                "--count", "1000", "--rate", "20000", "--bind", source, "--run-id", run,
            ],
        );
    }
    let out = finish(rx);
    let log = relay.stop();
    clean(&out);
    assert_eq!(
        (field(&out, "received"), field(&out, "valid")),
        (1000, 1000),
        "{out}"
    );
    assert_eq!(
        counter(&log, &["flow=ssm", "packets_in"], "packets_in"),
        1000
    );
}

#[test]
fn ssm_ignores_other_sources() {
    ssm("232.1.1.1", "10.10.1.1", "10.10.1.3", "239.2.2.2");
}

#[test]
fn ipv6_ssm_ignores_other_sources() {
    ssm("[ff3e::8000:1]", "fd01::1", "fd01::3", "[ff3e::2:2]");
}

#[test]
fn gso_groups_same_size_datagrams_and_falls_back_when_refused() {
    let Some(t) = Topology::new() else { return };
    // The unicast host is behind a 1500-byte route: 4000-byte datagrams
    // must be fragmented, which a GSO send can't do (the kernel answers
    // EINVAL), so that output falls back to single sends.
    t.ip(
        &t.r,
        &["route", "add", "10.10.2.2/32", "dev", "vRB", "mtu", "1500"],
    );
    let relay = t.relay(
        r#"
[[flow]]
name = "gso"
# 64 MiB: 4000-byte datagrams at 20 kpps fill the default 4 MiB in about
# 25 ms; a worker starved that long on a loaded machine (seen in CI: 344
# kernel drops) is not what this test is about.
input = { interface = "vRA", address = "239.1.1.1", port = 5000, receive_buffer_bytes = 67108864 }
outputs = [
  { interface = "vRB", address = "239.2.2.2", port = 6000 },
  { interface = "vRB", address = "10.10.2.2", port = 6001 },
]
"#,
        &[],
    );
    let groups = ["239.2.2.2:6000", "10.10.2.2:6001"];
    let rxs: Vec<Child> = groups.iter().map(|g| t.receiver(g, 4000, &[])).collect();
    // Batches of 64 arrive together, so the worker sees runs of equal size.
    t.send(
        "239.1.1.1:5000",
        &["--count", "4000", "--rate", "20000", "--size", "4000"],
    );
    let outs: Vec<String> = rxs.into_iter().map(finish).collect();
    let log = relay.stop();
    for (g, out) in groups.iter().zip(&outs) {
        if g.starts_with("239.") {
            clean(out);
        } else {
            // The refused GSO run is resent one by one after whatever
            // this output already had in flight behind it (other runs
            // submitted in the same turns): that one reordering, once,
            // at most the output's queue depth (256 by default), is the
            // documented cost of the fallback.
            assert_eq!(
                (field(out, "corrupt"), field(out, "duplicates")),
                (0, 0),
                "{out}"
            );
            assert!(field(out, "reordered") <= 256, "{out}");
        }
        assert_eq!(
            (field(out, "valid"), field(out, "lost")),
            (4000, 0),
            "{g}: {out}\n{log}"
        );
    }
    let multicast = ["output=239.2.2.2:6000"];
    assert!(
        counter(&log, &multicast, "gso_sends") > 0,
        "same-size datagrams went out as GSO sends:\n{log}"
    );
    assert_eq!(counter(&log, &multicast, "gso_fallbacks"), 0, "{log}");
    let unicast = ["output=10.10.2.2:6001"];
    assert!(
        counter(&log, &unicast, "gso_fallbacks") > 0,
        "the refused GSO send was noticed:\n{log}"
    );
    assert_eq!(counter(&log, &unicast, "drop_send_error"), 0, "{log}");
}

#[test]
fn pool_exhaustion_is_counted_and_recovers() {
    let Some(t) = Topology::new() else { return };
    let relay = t.relay(
        r#"
[pools]
small = 16
standard = 1
jumbo = 1
[[flow]]
name = "tiny"
input = { interface = "vRA", address = "239.1.1.1", port = 5000, receive_buffer_bytes = 65536 }
outputs = [ { interface = "vRB", address = "239.2.2.2", port = 6000 } ]
"#,
        &[],
    );
    // An unpaced burst of 20 000 overruns 16 buffers (and a 64 KiB socket
    // buffer, so the burst is dropped rather than queued); then a slow stream
    // (run 2) must arrive whole: the pool recovered. The slow stream goes in
    // chunks of 8, each sent once the relay has taken in the one before, so
    // a chunk always fits in the socket buffer and the pool however late
    // the worker runs (a paced stream at 2 kpps overran them whenever the
    // worker waited more than ~8 ms for a CPU).
    let rx = t.receiver("239.2.2.2:6000", 1_000_000, &["--run-id", "2"]);
    t.send(
        "239.1.1.1:5000",
        &[
            "--count", "20000", "--rate", "0", "--size", "1316", "--run-id", "1",
        ],
    );
    // The burst is over once the relay holds no buffer and its socket is
    // empty (the burst's tail may still be queued there when the sender
    // exits).
    let socket = t.dir.join("control.sock");
    wait_until("the burst drained", || {
        let stats = snapshot(&socket);
        let held: u32 = stats
            .workers
            .iter()
            .flat_map(|w| &w.pools)
            .map(|p| p.in_use)
            .sum();
        let queued = udp_rx_queue(&t.r, 5000);
        if held == 0 && queued == 0 {
            Ok(())
        } else {
            Err(format!("{held} buffers held, {queued} bytes queued"))
        }
    });
    let mut taken = snapshot(&socket).flow("tiny").map_or(0, |f| f.packets_in);
    for chunk in 0..63u64 {
        let n = (500 - chunk * 8).min(8);
        t.send(
            "239.1.1.1:5000",
            &[
                "--count",
                &n.to_string(),
                "--rate",
                "0",
                "--size",
                "1316",
                "--run-id",
                "2",
                "--stream-id",
                &chunk.to_string(),
            ],
        );
        taken += n;
        wait_for_packets_in(&socket, "tiny", taken);
    }
    t.end_marker(&t.a, "239.1.1.1:5000", Some("vA"));
    let out = finish(rx);
    let log = relay.stop();
    let exhausted = counter(&log, &["flow=tiny", "packets_in"], "drop_pool_exhausted")
        + counter(&log, &["output=239.2.2.2:6000"], "drop_backlog");
    assert!(exhausted > 0, "the burst was dropped and counted:\n{log}");
    assert_eq!(
        field(&out, "unique"),
        500,
        "the slow stream after the burst arrives whole: {out}\n{log}"
    );
}

/// Bytes waiting in the receive queues of namespace `ns`'s UDP sockets
/// bound to `port` (`/proc/net/udp`).
fn udp_rx_queue(ns: &str, port: u16) -> u64 {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "cat", "/proc/net/udp"])
        .output()
        .expect("/proc/net/udp");
    let local = format!(":{port:04X}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let queues = cols.get(4)?.split_once(':')?;
            cols.get(1)?
                .ends_with(&local)
                .then(|| u64::from_str_radix(queues.1, 16).ok())?
        })
        .sum()
}

#[test]
fn unreachable_unicast_output_does_not_hurt_the_others() {
    let Some(t) = Topology::new() else { return };
    let relay = t.relay(
        r#"
[[flow]]
name = "mixed"
input = { interface = "vRA", address = "239.1.1.1", port = 5000 }
outputs = [
  { interface = "vRB", address = "10.10.2.2", port = 6999 },
  { interface = "vRB", address = "10.10.2.77", port = 6000 },
  { interface = "vRB", address = "239.2.2.2", port = 6000 },
]
"#,
        &[],
    );
    let rx = t.receiver("239.2.2.2:6000", 3000, &[]);
    t.send(
        "239.1.1.1:5000",
        &["--count", "3000", "--rate", "20000", "--size", "1316"],
    );
    let out = finish(rx);
    let log = relay.stop();
    clean(&out);
    assert_eq!(
        (field(&out, "valid"), field(&out, "lost")),
        (3000, 0),
        "{out}"
    );
    let refused = counter(&log, &["output=10.10.2.2:6999"], "drop_send_error");
    assert!(
        refused > 0,
        "port-unreachable sends are counted as errors:\n{log}"
    );
}

/// A number from the JSON that `mcrelayctl ... --json` printed: the value
/// of `key` after the first occurrence of `after`.
fn json_after(json: &str, after: &str, key: &str) -> i64 {
    let at = json
        .find(after)
        .unwrap_or_else(|| panic!("{after} missing in {json}"));
    field(&json[at..].replace(": ", ":"), key)
}

/// GET `url` from inside namespace `ns` (python's urllib: no curl needed).
fn http_get(ns: &str, url: &str) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "python3", "-c"])
        .arg(format!(
            "import urllib.request; print(urllib.request.urlopen('{url}', timeout=5).read().decode())"
        ))
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "GET {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn control_socket_and_metrics_report_traffic_and_shrug_off_bad_clients() {
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    let Some(t) = Topology::new() else { return };
    let socket = t.dir.join("control.sock");
    let relay = t.relay(
        &format!(
            r#"
[daemon]
user = "nobody"
control_socket = "{}"
metrics_listen = "127.0.0.1:9464"
[[flow]]
name = "one"
input = {{ interface = "vRA", address = "239.1.1.1", port = 5000 }}
outputs = [ {{ interface = "vRB", address = "239.2.2.2", port = 6000 }} ]
"#,
            socket.display()
        ),
        &[],
    );
    // A client that connects and never reads, and one that sends 1 MB
    // without a newline: neither may stall the daemon.
    let _silent = UnixStream::connect(&socket).expect("connect");
    // And one that asks for a lot and never reads a reply.
    let mut greedy = UnixStream::connect(&socket).expect("connect");
    greedy
        .set_write_timeout(Some(Duration::from_secs(3)))
        .expect("timeout");
    for _ in 0..2000 {
        if greedy.write_all(b"{\"v\":1,\"cmd\":\"stats\"}\n").is_err() {
            break;
        }
    }
    let mut flood = UnixStream::connect(&socket).expect("connect");
    let _ = flood.write_all(&vec![b'x'; 1 << 20]);
    let rx = t.receiver("239.2.2.2:6000", u64::MAX, &[]);
    // 2000 datagrams/s, scraped once traffic is seen and stopped after the
    // scrape: the endpoint answers during traffic with a count that is
    // under way. The end marker follows the last datagram, so the relay
    // counts one more than the sender sent.
    let sender = t.sender(&t.a, "239.1.1.1:5000", Some("vA"), None, 2000);
    wait_for_packets_in(&socket, "one", 1);
    let during = http_get(&t.r, "http://127.0.0.1:9464/metrics");
    let so_far: u64 = during
        .lines()
        .find_map(|l| l.strip_prefix("mcrelay_flow_received_packets_total{flow=\"one\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no received counter while relaying:\n{during}"));
    let sent = stop_sender(sender);
    assert!(
        (1..=sent).contains(&so_far),
        "mid-stream scrape shows traffic under way: {so_far} of {sent}"
    );
    t.end_marker(&t.a, "239.1.1.1:5000", Some("vA"));
    let out = finish(rx);
    assert_eq!(field(&out, "valid"), whole(sent), "{out}");
    let relayed = whole(sent + 1);

    let (code, stats) = ctl(&socket, &["stats", "--json"]);
    assert_eq!(code, 0, "{stats}");
    assert_eq!(
        json_after(&stats, "\"name\": \"one\"", "packets_in"),
        relayed,
        "{stats}"
    );
    assert_eq!(
        json_after(&stats, "\"label\"", "packets_out"),
        relayed,
        "{stats}"
    );
    let (code, flows) = ctl(&socket, &["flows", "--sample", "0.2"]);
    assert_eq!(code, 0, "{flows}");
    assert!(
        flows.contains("one") && flows.contains("239.2.2.2:6000"),
        "{flows}"
    );
    let (code, status) = ctl(&socket, &["status"]);
    assert_eq!(code, 0, "{status}");
    let (code, top) = ctl(
        &socket,
        &["top", "--plain", "--iterations", "2", "--interval", "0.2"],
    );
    assert_eq!(code, 0, "{top}");
    assert!(top.contains("one"), "{top}");

    let metrics = http_get(&t.r, "http://127.0.0.1:9464/metrics");
    assert!(
        metrics.contains(&format!(
            "mcrelay_flow_received_packets_total{{flow=\"one\"}} {relayed}"
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "mcrelay_output_sent_packets_total{{flow=\"one\",output=\"239.2.2.2:6000@vRB\"}} {relayed}"
        )),
        "{metrics}"
    );

    // A malformed request gets an error reply; the daemon goes on.
    let mut bad = UnixStream::connect(&socket).expect("connect");
    bad.write_all(b"{\"v\":1,\"cmd\":\"format-disk\"}\n")
        .expect("write");
    let mut reply = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(&bad), &mut reply).expect("reply");
    assert!(reply.contains("\"ok\":false"), "{reply}");

    // Another user (the daemon runs as nobody) is refused, even when the
    // socket's mode lets it in.
    sh(&["chmod", "0666", &socket.display().to_string()]);
    let out = Command::new("setpriv")
        .args(["--reuid=12345", "--regid=12345", "--clear-groups"])
        .arg(mcrelayctl())
        .arg("--socket")
        .arg(&socket)
        .arg("status")
        .output()
        .expect("setpriv");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("permission denied"),
        "{said}"
    );

    let log = relay.stop();
    assert_eq!(
        whole(counter(&log, &["flow=one", "packets_in"], "packets_in")),
        relayed
    );
}

#[test]
fn reload_adds_and_removes_flows_without_touching_the_others() {
    let Some(t) = Topology::new() else { return };
    let socket = t.dir.join("control.sock");
    let config = |flows: &str| {
        format!(
            r#"
[daemon]
user = "nobody"
control_socket = "{}"
[[flow]]
name = "steady"
input = {{ interface = "vRA", address = "239.1.1.1", port = 5000 }}
outputs = [ {{ interface = "vRB", address = "239.2.2.2", port = 6000 }} ]
{flows}"#,
            socket.display()
        )
    };
    let leaving = r#"
[[flow]]
name = "leaving"
input = { interface = "vRA", address = "239.1.1.2", port = 5000 }
outputs = [ { interface = "vRB", address = "239.2.2.3", port = 6000 } ]
"#;
    let joining = r#"
[[flow]]
name = "joining"
input = { interface = "vRA", address = "239.1.1.3", port = 5000 }
outputs = [ { interface = "vRB", address = "239.2.2.4", port = 6000 } ]
"#;
    let relay = t.relay(&config(leaving), &[]);
    let path = t.dir.join("mcrelay.toml");
    // The steady stream, with reloads in the middle of it: it runs from
    // before the first reload until after the last (seen, not assumed).
    let rx = t.receiver("239.2.2.2:6000", u64::MAX, &[]);
    let sender = t.sender(&t.a, "239.1.1.1:5000", Some("vA"), None, 10_000);
    wait_for_packets_in(&socket, "steady", 1000);
    fs::write(&path, config(joining)).expect("rewrite config");
    let (code, said) = ctl(&socket, &["reload"]);
    assert_eq!(code, 0, "{said}");
    assert!(
        said.contains("added: joining") && said.contains("removed: leaving"),
        "{said}"
    );
    // An invalid file is rejected, over the socket and on SIGHUP, and
    // everything keeps running as it was.
    fs::write(&path, "[[flow]]\nname = 3\n").expect("break config");
    let (code, said) = ctl(&socket, &["reload"]);
    assert_eq!(code, 1, "{said}");
    assert!(
        said.contains("rejected") && said.contains("error"),
        "{said}"
    );
    // Wait for the SIGHUP's own rejection (the socket's was logged too):
    // only then may the file change again, else the reload could read it
    // half-written (an empty file is a valid config without flows).
    let rejected = relay.log().matches("reload rejected").count();
    sh(&["kill", "-HUP", &relay.child.id().to_string()]);
    wait_until("SIGHUP's reload rejected", || {
        let log = relay.log();
        if log.matches("reload rejected").count() > rejected {
            Ok(())
        } else {
            Err(log)
        }
    });
    fs::write(&path, config(joining)).expect("restore config");
    let n = snapshot(&socket).flow("steady").map_or(0, |f| f.packets_in);
    wait_for_packets_in(&socket, "steady", n + 1000);
    let sent = whole(stop_sender(sender));
    t.end_marker(&t.a, "239.1.1.1:5000", Some("vA"));
    let out = finish(rx);
    clean(&out);
    assert_eq!(
        (field(&out, "valid"), field(&out, "unique")),
        (sent, sent),
        "the unchanged flow lost nothing across the reloads: {out}\n{}",
        relay.log()
    );
    // The added flow relays; the removed one doesn't.
    // The removed flow's receiver listens until the added one has got
    // everything, sent after the removed flow's traffic.
    let joined = t.receiver("239.2.2.4:6000", 500, &[]);
    let left = t.receiver("239.2.2.3:6000", 1, &[]);
    for group in ["239.1.1.2:5000", "239.1.1.3:5000"] {
        t.send(group, &["--count", "500", "--rate", "10000"]);
    }
    let joined = finish(joined);
    assert_eq!(field(&joined, "valid"), 500, "{joined}");
    let left = terminate(left);
    assert_eq!(field(&left, "received"), 0, "{left}");
    let (code, flows) = ctl(&socket, &["flows", "--sample", "0"]);
    assert_eq!(code, 0);
    assert!(
        flows.contains("joining") && !flows.contains("leaving"),
        "{flows}"
    );
    relay.stop();
}

#[test]
fn an_overloaded_flow_does_not_starve_a_light_one_on_the_same_worker() {
    let Some(t) = Topology::new() else { return };
    // One worker (CPU 1), two flows: "heavy" fans out 1→96 from an
    // unpaced sender (several times what one core relays), "light" carries
    // 2 kpps to one output.
    let heavy_outputs: String = (0..96)
        .map(|i| format!("  {{ interface = \"vRB\", address = \"239.2.3.{i}\", port = 6000 }},\n"))
        .collect();
    let relay = t.relay(
        &format!(
            r#"
[daemon]
user = "nobody"
cores = [1]
control_socket = "{}"
[[flow]]
name = "heavy"
input = {{ interface = "vRA", address = "239.1.1.1", port = 5000 }}
outputs = [
{heavy_outputs}]
[[flow]]
name = "light"
input = {{ interface = "vRA", address = "239.1.1.9", port = 5009 }}
outputs = [ {{ interface = "vRB", address = "239.2.2.9", port = 6009 }} ]
"#,
            t.dir.join("control.sock").display()
        ),
        &[],
    );
    let light_rx = t.receiver("239.2.2.9:6009", 6000, &["--run-id", "2"]);
    // The heavy sender runs from before the light stream (seen relaying)
    // until after it.
    let heavy = t
        .command(&t.a, &loadgen())
        .args([
            "send",
            "--dest",
            "239.1.1.1:5000",
            "--interface",
            "vA",
            "--rate",
            "0",
            "--duration",
            "600",
            "--size",
            "1316",
            "--run-id",
            "1",
            "--json",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("heavy sender");
    wait_for_packets_in(&t.dir.join("control.sock"), "heavy", 10_000);
    t.send(
        "239.1.1.9:5009",
        &[
            "--count", "6000", "--rate", "2000", "--size", "1316", "--run-id", "2",
        ],
    );
    let out = finish(light_rx);
    stop_sender(heavy);
    let log = relay.stop();
    eprintln!(
        "{}",
        log.lines()
            .filter(|l| l.starts_with("final flow") || l.contains("239.2.3.0:"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let heavy_in = counter(&log, &["flow=heavy", "packets_in"], "packets_in");
    let heavy_kernel = counter(&log, &["flow=heavy", "packets_in"], "drop_kernel");
    let heavy_backlog: u64 = (0..96)
        .map(|i| counter(&log, &[&format!("output=239.2.3.{i}:6000")], "drop_backlog"))
        .sum();
    assert!(
        heavy_kernel + heavy_backlog > 0,
        "the heavy flow really was overloaded (else this test proves nothing):\n{log}"
    );
    assert_eq!(
        (field(&out, "valid"), field(&out, "lost")),
        (6000, 0),
        "the light flow is lossless next to an overloaded one (heavy in {heavy_in}, kernel drops {heavy_kernel}, backlog drops {heavy_backlog}): {out}\n{log}"
    );
}

/// `/proc/<pid>/status` as (uids, CapEff, CapPrm, CapAmb).
fn proc_status(pid: u32) -> (String, u64, u64, u64) {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let line = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .map(str::trim)
            .unwrap_or_else(|| panic!("{key} missing"))
            .to_owned()
    };
    let cap = |key: &str| u64::from_str_radix(&line(key), 16).expect("hex");
    (line("Uid:"), cap("CapEff:"), cap("CapPrm:"), cap("CapAmb:"))
}

/// The zygote: mcrelayd's child process.
fn zygote_of(pid: u32) -> u32 {
    let children =
        fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).expect("children");
    children
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .expect("mcrelayd has a zygote child")
}

/// The helper: the zygote's child process.
fn helper_of(pid: u32) -> u32 {
    zygote_of(zygote_of(pid))
}

const CAP_NET_ADMIN: u64 = 1 << 12;

#[test]
fn root_start_drops_to_the_user_and_survives_its_helper_dying() {
    let Some(t) = Topology::new() else { return };
    let relay = t.relay(
        r#"
[[flow]]
name = "one"
input = { interface = "vRA", address = "239.1.1.1", port = 5000 }
outputs = [ { interface = "vRB", address = "239.2.2.2", port = 6000 } ]
"#,
        &[],
    );
    let pid = relay.child.id();
    let (uid, eff, prm, amb) = proc_status(pid);
    assert_eq!(
        uid.split_whitespace().collect::<Vec<_>>(),
        ["65534"; 4],
        "runs as nobody"
    );
    assert_eq!((eff, prm, amb), (0, 0, 0), "no capabilities left");
    let (helper_uid, helper_eff, _, _) = proc_status(helper_of(pid));
    assert!(
        helper_uid.starts_with("65534"),
        "the helper runs as nobody too: {helper_uid}"
    );
    assert_ne!(
        helper_eff & CAP_NET_ADMIN,
        0,
        "the helper keeps CAP_NET_ADMIN"
    );

    // The zygote, and with it the helper, is killed while traffic flows
    // (none can come back privileged; tests/zygote.rs kills the helper
    // alone), which goes on until the flow has relayed another 5000.
    let socket = t.dir.join("control.sock");
    let rx = t.receiver("239.2.2.2:6000", u64::MAX, &[]);
    let sender = t.sender(&t.a, "239.1.1.1:5000", Some("vA"), None, 10_000);
    wait_for_packets_in(&socket, "one", 5000);
    sh(&["kill", "-KILL", &zygote_of(pid).to_string()]);
    let n = snapshot(&socket).flow("one").map_or(0, |f| f.packets_in);
    wait_for_packets_in(&socket, "one", n + 5000);
    let sent = whole(stop_sender(sender));
    t.end_marker(&t.a, "239.1.1.1:5000", Some("vA"));
    let out = finish(rx);
    assert_eq!(
        (field(&out, "valid"), field(&out, "unique")),
        (sent, sent),
        "running flows keep running when the helper dies: {out}\n{}",
        relay.log()
    );
    let (code, status) = ctl(&socket, &["status"]);
    assert_eq!(code, 0, "{status}");
    assert!(
        status.contains("degraded") && status.contains("helper"),
        "{status}"
    );
    let log = relay.stop();
    assert!(log.contains("privileged helper exited"), "{log}");
}

#[test]
fn ambient_capabilities_stay_with_the_helper() {
    let Some(t) = Topology::new() else { return };
    // Like systemd's User=mcrelay + AmbientCapabilities=: an ordinary user
    // holding network capabilities; the socket directory is its own.
    let run = t.dir.join("run");
    fs::create_dir(&run).expect("run dir");
    sh(&["chown", "nobody", &run.display().to_string()]);
    let relay = t.relay_with(
        &format!(
            r#"
[daemon]
control_socket = "{}"
[[flow]]
name = "one"
input = {{ interface = "vRA", address = "239.1.1.1", port = 5000 }}
outputs = [ {{ interface = "vRB", address = "239.2.2.2", port = 6000 }} ]
"#,
            run.join("control.sock").display()
        ),
        &[],
        &AMBIENT_START,
        &[],
    );
    let pid = relay.child.id();
    let (uid, eff, prm, amb) = proc_status(pid);
    assert!(uid.starts_with("65534"), "{uid}");
    assert_eq!(
        (eff, prm, amb),
        (0, 0, 0),
        "the daemon dropped its capabilities"
    );
    let (_, helper_eff, _, helper_amb) = proc_status(helper_of(pid));
    assert_ne!(
        helper_eff & CAP_NET_ADMIN,
        0,
        "the helper kept CAP_NET_ADMIN"
    );
    assert_ne!(helper_amb & CAP_NET_ADMIN, 0, "as an ambient capability");
    let rx = t.receiver("239.2.2.2:6000", 1000, &[]);
    t.send("239.1.1.1:5000", &["--count", "1000", "--rate", "10000"]);
    let out = finish(rx);
    assert_eq!(field(&out, "valid"), 1000, "{out}");
    relay.stop();
}

#[test]
fn systemd_hears_ready_status_watchdog_reloading_and_stopping() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::UnixDatagram;
    let Some(t) = Topology::new() else { return };
    let path = t.dir.join("notify.sock");
    let notify = UnixDatagram::bind(&path).expect("bind notify socket");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).expect("chmod");
    notify.set_read_timeout(Some(DEADLINE)).expect("timeout");
    let relay = t.relay_with(
        r#"
[[flow]]
name = "one"
input = { interface = "vRA", address = "239.1.1.1", port = 5000 }
outputs = [ { interface = "vRB", address = "239.2.2.2", port = 6000 } ]
"#,
        &[],
        &[],
        &[
            ("NOTIFY_SOCKET", path.display().to_string()),
            ("WATCHDOG_USEC", "2000000".into()),
        ],
    );
    let mut seen: Vec<String> = Vec::new();
    let mut wait_for = |want: &str| {
        let deadline = Instant::now() + DEADLINE;
        while Instant::now() < deadline {
            let mut buf = [0u8; 4096];
            let Ok(n) = notify.recv(&mut buf) else { break };
            let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
            seen.push(msg.clone());
            if msg.starts_with(want) {
                return msg;
            }
        }
        panic!("no {want} from mcrelayd; saw {seen:?}");
    };
    wait_for("READY=1");
    let status = wait_for("STATUS=");
    assert!(
        status.contains("running") && status.contains("1 flows"),
        "{status}"
    );
    wait_for("WATCHDOG=1");
    sh(&["kill", "-HUP", &relay.child.id().to_string()]);
    let reloading = wait_for("RELOADING=1");
    assert!(reloading.contains("MONOTONIC_USEC="), "{reloading}");
    wait_for("READY=1");
    sh(&["kill", "-TERM", &relay.child.id().to_string()]);
    wait_for("STOPPING=1");
}
