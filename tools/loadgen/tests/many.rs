//! `loadgen many-send` / `many-recv` end to end on the loopback interface
//! (no root): round-robin over several groups, every datagram checked and
//! counted per group; a group the sender skips is named as lossy.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const LOADGEN: &str = env!("CARGO_BIN_EXE_loadgen");
/// Generous for a loaded 2-core machine; a passing run never waits it out.
const DEADLINE: Duration = Duration::from_secs(60);

fn port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("free port")
        .port()
}

/// A field of a flat JSON line, as text.
fn field<'a>(json: &'a str, key: &str) -> &'a str {
    let at = json
        .find(&format!("\"{key}\":"))
        .unwrap_or_else(|| panic!("{key} missing in {json}"));
    json[at + key.len() + 3..]
        .split([',', '}'])
        .next()
        .unwrap_or("")
}

/// Receive `groups` groups from `first` (expecting `per_group` each) while
/// `send_groups` of them are sent to; the receiver's JSON line.
fn run(first: &str, groups: u32, send_groups: u32, per_group: u64) -> String {
    let ready = std::env::temp_dir().join(format!("loadgen-many-{}-{first}", std::process::id()));
    let _ = std::fs::remove_file(&ready);
    let rx = Command::new(LOADGEN)
        .args([
            "many-recv",
            "--first",
            first,
            "--groups",
            &groups.to_string(),
        ])
        .args(["--interface", "lo", "--per-group", &per_group.to_string()])
        .args(["--json", "--duration", "60", "--idle-exit", "2"])
        .arg("--ready-file")
        .arg(&ready)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn many-recv");
    let deadline = Instant::now() + DEADLINE;
    while !ready.exists() {
        assert!(Instant::now() < deadline, "receiver never ready");
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = std::fs::remove_file(&ready);
    let sent = Command::new(LOADGEN)
        .args([
            "many-send",
            "--first",
            first,
            "--groups",
            &send_groups.to_string(),
        ])
        .args([
            "--source",
            "127.0.0.1",
            "--loop",
            "--rate",
            "20000",
            "--size",
            "200",
        ])
        .args(["--per-group", &per_group.to_string(), "--json"])
        .output()
        .expect("many-send");
    assert!(
        sent.status.success(),
        "{}",
        String::from_utf8_lossy(&sent.stderr)
    );
    let sent = String::from_utf8_lossy(&sent.stdout).into_owned();
    assert_eq!(
        field(&sent, "sent"),
        (u64::from(send_groups) * per_group).to_string(),
        "{sent}"
    );
    let out = rx.wait_with_output().expect("many-recv");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn every_group_delivers_every_datagram_checked() {
    let p = port();
    let out = run(&format!("239.255.{}.1:{p}", p % 200 + 1), 6, 6, 200);
    for (key, want) in [
        ("received", "1200"),
        ("valid", "1200"),
        ("corrupt", "0"),
        ("groups_seen", "6"),
        ("lost", "0"),
        ("lossy_groups", "0"),
        ("duplicates", "0"),
        ("reordered", "0"),
    ] {
        assert_eq!(field(&out, key), want, "{key}: {out}");
    }
}

#[test]
fn a_silent_group_is_named_with_its_loss() {
    let p = port();
    // Six groups joined, the first five sent to: group 5 lost all 50.
    let out = run(&format!("239.254.{}.1:{p}", p % 200 + 1), 6, 5, 50);
    assert_eq!(field(&out, "groups_seen"), "5", "{out}");
    assert_eq!(field(&out, "lost"), "50", "{out}");
    assert_eq!(field(&out, "lossy"), "\"5:50\"", "{out}");
}
