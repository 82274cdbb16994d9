//! `send --timestamp` → `recv --latency` end to end on loopback (unicast
//! 127.0.0.1, no root): every stamped datagram is still checked clean, each
//! delay is timed by the kernel's receive stamp, and the percentiles come
//! out ordered and plausible.

use std::io::Read as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const LOADGEN: &str = env!("CARGO_BIN_EXE_loadgen");
/// Generous for a loaded 2-core machine; a passing run never waits it out.
const DEADLINE: Duration = Duration::from_secs(60);

/// An integer (or `null` → -1) after `"key":` in `json` (the first one).
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

fn port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// Receive `count` datagrams sent with `send_args`; the receiver's JSON.
fn round(count: u64, recv_args: &[&str], send_args: &[&str]) -> String {
    let addr = format!("127.0.0.1:{}", port());
    let ready = std::env::temp_dir().join(format!(
        "loadgen-latency-ready-{}-{}",
        std::process::id(),
        addr.replace([':', '.'], "_")
    ));
    let _ = std::fs::remove_file(&ready);
    let mut rx = Command::new(LOADGEN)
        .args(["recv", "--group", &addr, "--json", "--idle-exit", "0"])
        .args(["--duration", "60", "--run-id", "7"])
        .args(["--expect", &count.to_string()])
        .arg("--ready-file")
        .arg(&ready)
        .args(recv_args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn recv");
    let deadline = Instant::now() + DEADLINE;
    while !ready.exists() {
        assert!(Instant::now() < deadline, "receiver never ready");
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = std::fs::remove_file(&ready);
    let out = Command::new(LOADGEN)
        .args(["send", "--dest", &addr, "--run-id", "7", "--json"])
        .args(["--count", &count.to_string(), "--rate", "20000"])
        .args(send_args)
        .output()
        .expect("send");
    assert!(
        out.status.success(),
        "send failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = rx.wait().expect("recv exits");
    let mut json = String::new();
    rx.stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut json)
        .expect("read");
    assert!(status.success(), "recv failed: {json}");
    json
}

#[test]
fn stamped_datagrams_check_clean_and_are_timed_by_the_kernel() {
    let n = 2000;
    let json = round(n, &["--latency"], &["--timestamp", "--size", "32,100,1316"]);
    assert_eq!(field(&json, "valid"), 2000, "{json}");
    assert_eq!(
        (field(&json, "corrupt"), field(&json, "lost")),
        (0, 0),
        "{json}"
    );
    let lat = &json[json.find("\"latency\":").expect("a latency object")..];
    assert_eq!(field(lat, "count"), 2000, "{lat}");
    assert_eq!(field(lat, "kernel_stamped"), 2000, "{lat}");
    assert_eq!(
        (field(lat, "user_stamped"), field(lat, "unstamped")),
        (0, 0),
        "{lat}"
    );
    assert_eq!(field(lat, "negative"), 0, "{lat}");
    let p: Vec<i64> = ["min_ns", "p50_ns", "p90_ns", "p99_ns", "p999_ns", "max_ns"]
        .iter()
        .map(|k| field(lat, k))
        .collect();
    assert!(p.windows(2).all(|w| w[0] <= w[1]), "not ordered: {p:?}");
    // Loopback delivery takes microseconds; even a descheduled sender
    // leaves the median far below a second.
    assert!(p[0] > 0 && p[1] < 1_000_000_000, "{p:?}");
}

#[test]
fn without_stamps_the_receiver_counts_them_unstamped() {
    let json = round(500, &["--latency"], &[]);
    assert_eq!(field(&json, "valid"), 500, "{json}");
    let lat = &json[json.find("\"latency\":").expect("a latency object")..];
    assert_eq!(
        (field(lat, "count"), field(lat, "unstamped")),
        (0, 500),
        "{lat}"
    );
    // And without --latency there is no latency object at all.
    let plain = round(100, &[], &["--timestamp"]);
    assert!(!plain.contains("\"latency\""), "{plain}");
    // Stamped but not taken out: the stamp bytes read as corruption.
    assert_eq!(field(&plain, "corrupt"), 100, "{plain}");
}

#[test]
fn too_short_for_a_stamp_is_refused() {
    let out = Command::new(LOADGEN)
        .args([
            "send",
            "--dest",
            "127.0.0.1:9",
            "--timestamp",
            "--size",
            "31",
        ])
        .output()
        .expect("send");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("at least 32 bytes"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
