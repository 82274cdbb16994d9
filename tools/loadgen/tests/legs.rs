//! `loadgen legs` into `loadgen legs-recv` over loopback (no relay): the
//! receiver's account of the two legs' copies matches the sender's plan.

use std::net::UdpSocket;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const LOADGEN: &str = env!("CARGO_BIN_EXE_loadgen");

/// A loopback port nobody uses right now.
fn free_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("bind")
        .port()
}

fn receiver(dir: &Path, port: u16, expect: u64) -> Child {
    let ready = dir.join(format!("ready-{port}"));
    let mut child = Command::new(LOADGEN)
        .args([
            "legs-recv",
            "--json",
            "--group",
            &format!("127.0.0.1:{port}"),
        ])
        .args(["--expect", &expect.to_string(), "--duration", "60"])
        .arg("--ready-file")
        .arg(&ready)
        .stdout(Stdio::piped())
        .spawn()
        .expect("receiver");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready.exists() {
        assert!(child.try_wait().expect("wait").is_none(), "receiver exited");
        assert!(Instant::now() < deadline, "receiver never ready");
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

/// A child's one-line JSON summary (flat objects of numbers, booleans
/// and lists of numbers: read with [`num`], [`list`] and [`leg`]).
fn json(child: Child) -> String {
    let out = child.wait_with_output().expect("wait");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    text
}

/// The text after `"key":` in `json`.
fn after<'a>(json: &'a str, key: &str) -> &'a str {
    let tag = format!("\"{key}\":");
    let at = json
        .find(&tag)
        .unwrap_or_else(|| panic!("no {key} in {json}"));
    &json[at + tag.len()..]
}

fn num(json: &str, key: &str) -> u64 {
    let v = after(json, key);
    let end = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    v[..end]
        .parse()
        .unwrap_or_else(|_| panic!("{key} not a number in {json}"))
}

fn list(json: &str, key: &str) -> Vec<u64> {
    let v = after(json, key);
    let inner = &v[1..v.find(']').expect("list end")];
    inner
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().expect("number"))
        .collect()
}

/// Leg `i`'s object in a sender's summary.
fn leg(json: &str, i: usize) -> &str {
    after(json, "legs")
        .split("{\"dest\"")
        .nth(i + 1)
        .unwrap_or_else(|| panic!("no leg {i} in {json}"))
}

/// Both legs to one receiver: it sees every number (the losses are
/// disjoint), each copy the other leg also sent as a duplicate, and
/// numbers only the 20 ms late leg sent as late.
fn both_legs_into_one_receiver(extra: &[&str], check: impl Fn(&str, &str)) {
    let dir = std::env::temp_dir().join(format!("loadgen-legs-{}", free_port()));
    std::fs::create_dir_all(&dir).expect("dir");
    let port = free_port();
    let rx = receiver(&dir, port, 2000);
    let leg = format!("127.0.0.1:{port}@lo");
    let tx = Command::new(LOADGEN)
        .args(["legs", "--json", "--leg", &leg, "--leg", &leg])
        .args(["--count", "2000", "--rate", "4000", "--delay-ms", "0,20"])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .expect("sender");
    let sent = json(tx);
    let got = json(rx);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(got.contains("\"ended\":true"), "{got}");
    assert_eq!(num(&got, "corrupt"), 0, "{got}");
    check(&sent, &got);
}

#[test]
fn disjoint_losses_leave_nothing_missing_and_the_rest_twice() {
    both_legs_into_one_receiver(&["--loss", "5,5", "--seed", "3"], |sent, got| {
        let lost0 = list(leg(sent, 0), "losses");
        let lost1 = list(leg(sent, 1), "losses");
        assert!(!lost0.is_empty() && !lost1.is_empty(), "{sent}");
        assert!(lost0.iter().all(|s| !lost1.contains(s)), "disjoint: {sent}");
        assert_eq!(num(got, "missing"), 0, "{got}");
        let twice = 2000 - (lost0.len() + lost1.len()) as u64;
        assert_eq!(num(got, "duplicates"), twice, "{got}");
        assert_eq!(list(got, "duplicated_seqs").len() as u64, twice);
        // Leg 0's losses come only from leg 1, 20 ms (80 numbers) late.
        let late = list(got, "late_seqs");
        assert!(lost0.iter().all(|s| late.contains(s)), "{got}");
        assert_eq!(num(leg(sent, 0), "sent"), 2000 - lost0.len() as u64);
    });
}

#[test]
fn a_gap_on_one_leg_leaves_the_other_legs_losses_missing() {
    both_legs_into_one_receiver(&["--loss", "0,5", "--gap", "0:500-1000"], |sent, got| {
        assert_eq!(
            list(leg(sent, 0), "dropped"),
            (500..1000).collect::<Vec<u64>>()
        );
        let lost1 = list(leg(sent, 1), "losses");
        let want: Vec<u64> = lost1
            .iter()
            .copied()
            .filter(|s| (500..1000).contains(s))
            .collect();
        assert_eq!(list(got, "missing_seqs"), want, "{got}");
    });
}
