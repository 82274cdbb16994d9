//! The tools end to end on loopback (no root): sender → receiver, and
//! sender → baseline relay → receiver, every byte checked.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const LOADGEN: &str = env!("CARGO_BIN_EXE_loadgen");

fn port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

fn field(json: &str, key: &str) -> i64 {
    let at = json
        .find(&format!("\"{key}\":"))
        .unwrap_or_else(|| panic!("{key} missing in {json}"));
    json[at + key.len() + 3..]
        .split([',', '}'])
        .next()
        .and_then(|v| v.parse().ok())
        .expect("number")
}

fn receiver(port: u16, expect: u64, ready: &std::path::Path) -> std::process::Child {
    let child = Command::new(LOADGEN)
        .args([
            "recv",
            "--group",
            &format!("127.0.0.1:{port}"),
            "--json",
            "--idle-exit",
            "2",
            "--duration",
            "20",
        ])
        .args([
            "--expect",
            &expect.to_string(),
            "--ready-file",
            ready.to_str().expect("utf-8"),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn recv");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !ready.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

fn send(port: u16, count: u64) {
    let ok = Command::new(LOADGEN)
        .args([
            "send",
            "--dest",
            &format!("127.0.0.1:{port}"),
            "--rate",
            "20000",
            "--count",
            &count.to_string(),
        ])
        .args(["--size", "24,100,1316,1500,4096,9000"])
        .status()
        .expect("send");
    assert!(ok.success());
}

#[test]
fn sender_to_receiver_every_byte_checked() {
    let (p, ready) = (
        port(),
        std::env::temp_dir().join(format!("loadgen-ready-{}", std::process::id())),
    );
    let rx = receiver(p, 1200, &ready);
    send(p, 1200);
    let out = String::from_utf8(rx.wait_with_output().expect("recv").stdout).expect("utf-8");
    let _ = std::fs::remove_file(&ready);
    assert_eq!(
        (
            field(&out, "valid"),
            field(&out, "corrupt"),
            field(&out, "duplicates")
        ),
        (1200, 0, 0),
        "{out}"
    );
    assert_eq!((field(&out, "min_len"), field(&out, "max_len")), (24, 9000));
}

#[test]
fn baseline_relay_forwards_everything() {
    let (input, output) = (port(), port());
    let ready = std::env::temp_dir().join(format!("loadgen-ready-relay-{}", std::process::id()));
    let rx = receiver(output, 600, &ready);
    let mut relay = Command::new(LOADGEN)
        .args([
            "relay",
            "--input",
            &format!("127.0.0.1:{input}"),
            "--input-interface",
            "lo",
        ])
        .args([
            "--output",
            &format!("127.0.0.1:{output}"),
            "--output-interface",
            "lo",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("relay");
    std::thread::sleep(Duration::from_millis(300));
    send(input, 600);
    let out = String::from_utf8(rx.wait_with_output().expect("recv").stdout).expect("utf-8");
    let _ = std::fs::remove_file(&ready);
    let _ = Command::new("kill")
        .args(["-TERM", &relay.id().to_string()])
        .status();
    let status = relay.wait().expect("relay exits");
    assert!(status.success(), "relay exits cleanly on SIGTERM");
    assert_eq!(
        (
            field(&out, "valid"),
            field(&out, "lost"),
            field(&out, "reordered")
        ),
        (600, 0, 0),
        "{out}"
    );
}
