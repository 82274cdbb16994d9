//! The `loadgen` binary end to end on the loopback interface (no root):
//! sender → receiver over unicast IPv4 / IPv6 and over multicast on `lo`,
//! and sender → baseline relay → two receivers; every byte checked.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const LOADGEN: &str = env!("CARGO_BIN_EXE_loadgen");

/// A port free right now on `127.0.0.1`.
fn port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// An integer (or `null` → -1) from a JSON line.
fn field(json: &str, key: &str) -> i64 {
    let at = json
        .find(&format!("\"{key}\":"))
        .unwrap_or_else(|| panic!("{key} missing in {json}"));
    let v = json[at + key.len() + 3..]
        .split([',', '}'])
        .next()
        .unwrap_or("");
    if v == "null" {
        -1
    } else {
        v.parse()
            .unwrap_or_else(|_| panic!("{key} is not a number in {json}"))
    }
}

fn ready_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("loadgen-ready-{}-{tag}", std::process::id()))
}

/// How long a test waits for something it started before failing:
/// generous for a loaded 2-core machine; a passing run never waits it out.
const DEADLINE: Duration = Duration::from_secs(60);

/// Start `loadgen recv` with `args`; returns once it has joined. It stops
/// on an event (`expect` datagrams, an end marker of run 999), never on
/// an idle timeout; `--duration` only bounds a failing test.
fn receiver(group: &str, expect: u64, args: &[&str]) -> Child {
    let ready = ready_path(&group.replace([':', '[', ']', '.'], "_"));
    let _ = std::fs::remove_file(&ready);
    let child = Command::new(LOADGEN)
        .args(["recv", "--group", group, "--json", "--idle-exit", "0"])
        .args(["--duration", "60", "--end-run-id", "999"])
        .args(["--expect", &expect.to_string()])
        .arg("--ready-file")
        .arg(&ready)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn recv");
    let deadline = Instant::now() + DEADLINE;
    while !ready.exists() {
        assert!(Instant::now() < deadline, "receiver on {group} never ready");
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = std::fs::remove_file(&ready);
    child
}

/// Run `loadgen send --json` to `dest` with `args`; its JSON line.
fn send(dest: &str, args: &[&str]) -> String {
    let out = Command::new(LOADGEN)
        .args(["send", "--dest", dest, "--json"])
        .args(args)
        .output()
        .expect("send");
    assert!(
        out.status.success(),
        "send failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn finish(rx: Child) -> String {
    let out = rx.wait_with_output().expect("recv");
    assert!(out.status.success(), "recv failed");
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn unicast_sizes_ttl_and_short_datagrams() {
    let dest = format!("127.0.0.1:{}", port());
    let rx = receiver(&dest, 1200, &[]);
    // 6 sizes x 200; the 1- and 23-byte ones are too short for a header.
    let sent = send(
        &dest,
        &[
            "--count",
            "1200",
            "--rate",
            "50000",
            "--ttl",
            "9",
            "--sizes",
            "1,23,24,100,1316,9000",
        ],
    );
    assert_eq!(field(&sent, "sent"), 1200, "{sent}");
    let out = finish(rx);
    assert_eq!(
        (
            field(&out, "received"),
            field(&out, "valid"),
            field(&out, "short"),
            field(&out, "corrupt"),
            field(&out, "duplicates"),
            field(&out, "lost"),
        ),
        (1200, 800, 400, 0, 0, 0),
        "{out}"
    );
    assert_eq!(
        (field(&out, "min_len"), field(&out, "max_len")),
        (1, 9000),
        "{out}"
    );
    assert_eq!(field(&out, "received_ttl"), 9, "TTL on the wire: {out}");
}

#[test]
fn an_end_marker_stops_the_receiver_and_is_not_counted() {
    let dest = format!("127.0.0.1:{}", port());
    // More expected than will come, no idle exit: only the marker (run
    // 999, sent after the traffic) can end this receiver before 60 s.
    let start = Instant::now();
    let rx = receiver(&dest, 1_000_000, &[]);
    send(&dest, &["--count", "300", "--rate", "50000"]);
    send(&dest, &["--count", "1", "--run-id", "999"]);
    let out = finish(rx);
    assert!(start.elapsed() < Duration::from_secs(60), "{out}");
    assert_eq!(
        (
            field(&out, "valid"),
            field(&out, "wrong_run"),
            field(&out, "unique")
        ),
        (300, 1, 300),
        "{out}"
    );
}

#[test]
fn zero_count_sends_nothing() {
    let sent = send(&format!("127.0.0.1:{}", port()), &["--count", "0"]);
    assert_eq!(field(&sent, "sent"), 0, "{sent}");
}

#[test]
fn multicast_on_loopback_every_byte_checked() {
    let p = port();
    let group = format!("239.255.{}.{}:{p}", p % 200 + 1, p % 250 + 1);
    let rx = receiver(&group, 1000, &["--interface-addr", "127.0.0.1"]);
    let sent = send(
        &group,
        &[
            "--interface-addr",
            "127.0.0.1",
            "--loop",
            "--count",
            "1000",
            "--rate",
            "50000",
            "--sizes",
            "24,25,100,1472,1500,1501,4096,9000",
            "--ttl",
            "3",
        ],
    );
    assert_eq!(field(&sent, "sent"), 1000, "{sent}");
    let out = finish(rx);
    assert_eq!(
        (
            field(&out, "received"),
            field(&out, "valid"),
            field(&out, "corrupt"),
            field(&out, "duplicates"),
            field(&out, "lost"),
        ),
        (1000, 1000, 0, 0, 0),
        "{out}"
    );
    assert_eq!(
        (field(&out, "min_len"), field(&out, "max_len")),
        (24, 9000),
        "{out}"
    );
    assert_eq!(field(&out, "received_ttl"), 3, "TTL on the wire: {out}");
}

#[test]
fn ipv6_unicast_hop_limit() {
    // Skip where the host has no IPv6 loopback.
    let Ok(probe) = std::net::UdpSocket::bind("[::1]:0") else {
        eprintln!("SKIPPED: no ::1");
        return;
    };
    let dest = format!("[::1]:{}", probe.local_addr().expect("addr").port());
    drop(probe);
    let rx = receiver(&dest, 500, &[]);
    send(
        &dest,
        &[
            "--count",
            "500",
            "--rate",
            "50000",
            "--sizes",
            "1,1316,8952",
            "--ttl",
            "5",
        ],
    );
    let out = finish(rx);
    assert_eq!(
        (
            field(&out, "received"),
            field(&out, "valid"),
            field(&out, "short")
        ),
        (500, 333, 167),
        "{out}"
    );
    assert_eq!(
        (field(&out, "corrupt"), field(&out, "lost")),
        (0, 0),
        "{out}"
    );
    assert_eq!(
        field(&out, "received_ttl"),
        5,
        "hop limit on the wire: {out}"
    );
}

#[test]
fn baseline_relay_forwards_everything_to_every_output() {
    let (input, out_a, out_b) = (port(), port(), port());
    let (dest_a, dest_b) = (format!("127.0.0.1:{out_a}"), format!("127.0.0.1:{out_b}"));
    let rx_a = receiver(&dest_a, 600, &[]);
    let rx_b = receiver(&dest_b, 600, &[]);
    let relay = Command::new(LOADGEN)
        .args(["relay", "--input", &format!("127.0.0.1:{input}")])
        .args(["--output", &dest_a, "--output", &dest_b])
        .args([
            "--output-interface-addr",
            "127.0.0.1",
            "--ttl",
            "4",
            "--json",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("relay");
    // The relay has no ready file: wait until its input port is bound.
    let bound = format!(":{input:04X} ");
    let deadline = Instant::now() + DEADLINE;
    while !std::fs::read_to_string("/proc/net/udp").is_ok_and(|t| t.contains(&bound)) {
        assert!(Instant::now() < deadline, "relay never bound {input}");
        std::thread::sleep(Duration::from_millis(5));
    }
    send(
        &format!("127.0.0.1:{input}"),
        &[
            "--count",
            "600",
            "--rate",
            "20000",
            "--sizes",
            "24,1316,9000",
        ],
    );
    let (a, b) = (finish(rx_a), finish(rx_b));
    let status = Command::new("kill")
        .args(["-TERM", &relay.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let out = relay.wait_with_output().expect("relay exits");
    assert!(out.status.success(), "relay exits cleanly on SIGTERM");
    let totals = String::from_utf8(out.stdout).expect("utf-8");
    assert_eq!(
        (
            field(&totals, "packets_in"),
            field(&totals, "packets_out"),
            field(&totals, "drops")
        ),
        (600, 1200, 0),
        "{totals}"
    );
    for out in [a, b] {
        assert_eq!(
            (
                field(&out, "valid"),
                field(&out, "lost"),
                field(&out, "reordered"),
                field(&out, "duplicates"),
                field(&out, "corrupt"),
            ),
            (600, 0, 0, 0, 0),
            "{out}"
        );
        assert_eq!(field(&out, "received_ttl"), 4, "the relay's TTL: {out}");
    }
}

#[test]
fn relay_stops_after_its_duration() {
    let start = Instant::now();
    let out = Command::new(LOADGEN)
        .args(["relay", "--input", &format!("127.0.0.1:{}", port())])
        .args(["--output", "127.0.0.1:9", "--duration", "0.3"])
        .output()
        .expect("relay");
    assert!(out.status.success());
    // By itself (without --duration it runs until SIGTERM); how soon is
    // not this test's business on a loaded machine.
    assert!(start.elapsed() < DEADLINE);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("in 0 out 0"), "{text}");
}

#[test]
fn rtp_mpegts_framing_and_a_copy_to_a_second_leg_every_byte_checked() {
    let (a, b) = (
        format!("127.0.0.1:{}", port()),
        format!("127.0.0.1:{}", port()),
    );
    let ts = ["--payload", "rtp-mpegts"];
    let (rx_a, rx_b) = (receiver(&a, 500, &ts), receiver(&b, 500, &ts));
    let sent = send(
        &a,
        &[
            "--payload",
            "rtp-mpegts",
            "--copy-dest",
            &b,
            "--count",
            "500",
            "--rate",
            "20000",
            "--size",
            "1316",
        ],
    );
    assert_eq!(
        (field(&sent, "sent"), field(&sent, "copies_sent")),
        (500, 500),
        "{sent}"
    );
    // RTP + 7 TS packets on the wire; the receiver checked every RTP and
    // TS header and every payload byte inside.
    assert_eq!(field(&sent, "bytes"), 500 * 1328, "{sent}");
    for out in [finish(rx_a), finish(rx_b)] {
        assert_eq!(
            (
                field(&out, "valid"),
                field(&out, "corrupt"),
                field(&out, "duplicates"),
                field(&out, "lost"),
            ),
            (500, 0, 0, 0),
            "{out}"
        );
    }
}

#[test]
fn a_receiver_expecting_another_framing_counts_every_datagram_corrupt() {
    let dest = format!("127.0.0.1:{}", port());
    let rx = receiver(&dest, 200, &["--payload", "rtp-mpegts"]);
    // RTP carrying the plain payload, not TS packets.
    send(
        &dest,
        &["--payload", "rtp", "--count", "200", "--rate", "20000"],
    );
    let out = finish(rx);
    assert_eq!(
        (
            field(&out, "received"),
            field(&out, "valid"),
            field(&out, "corrupt")
        ),
        (200, 0, 200),
        "{out}"
    );
}
