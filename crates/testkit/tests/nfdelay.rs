//! `nfdelay` delays what an NFQUEUE rule hands it, and loses nothing:
//! UDP round trips between two namespaces, with and without a 30 ms delay
//! on one side's output. Needs root (skips otherwise).

use std::net::UdpSocket;
use std::process::Command;
use std::time::{Duration, Instant};

use mcrelay_testkit::delay::DelayedLink;
use mcrelay_testkit::in_netns;

fn sh(args: &[&str]) {
    let status = Command::new(args[0])
        .args(&args[1..])
        .status()
        .expect("run");
    assert!(status.success(), "{args:?}: {status}");
}

/// Two namespaces joined by a veth pair, removed on drop.
struct Pair {
    a: String,
    b: String,
}

impl Pair {
    fn new() -> Self {
        let id = std::process::id();
        let (a, b) = (format!("nfd-a-{id}"), format!("nfd-b-{id}"));
        sh(&["ip", "netns", "add", &a]);
        sh(&["ip", "netns", "add", &b]);
        let pair = Pair { a, b };
        sh(&[
            "ip", "link", "add", "nfd0", "netns", &pair.a, "type", "veth", "peer", "name", "nfd1",
            "netns", &pair.b,
        ]);
        for (ns, dev, addr) in [
            (&pair.a, "nfd0", "10.77.0.1/24"),
            (&pair.b, "nfd1", "10.77.0.2/24"),
        ] {
            sh(&["ip", "-n", ns, "addr", "add", addr, "dev", dev]);
            sh(&["ip", "-n", ns, "link", "set", dev, "up"]);
            sh(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        pair
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// Round-trip times of `n` datagrams from a to b's echo; panics on a loss.
fn round_trips(pair: &Pair, n: usize) -> Vec<Duration> {
    let echo = in_netns(&pair.b, || {
        UdpSocket::bind("10.77.0.2:0").expect("bind echo")
    });
    let port = echo.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        while let Ok((len, from)) = echo.recv_from(&mut buf) {
            let _ = echo.send_to(&buf[..len], from);
        }
    });
    in_netns(&pair.a, move || {
        let s = UdpSocket::bind("10.77.0.1:0").expect("bind");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        (0..n)
            .map(|i| {
                let i = u8::try_from(i).unwrap_or(u8::MAX);
                let t = Instant::now();
                s.send_to(&[i; 16], ("10.77.0.2", port)).expect("send");
                let mut buf = [0u8; 64];
                let (len, _) = s.recv_from(&mut buf).expect("the echo comes back");
                assert_eq!(&buf[..len], &[i; 16]);
                t.elapsed()
            })
            .collect()
    })
}

#[test]
fn a_delayed_link_adds_the_delay_and_loses_nothing() {
    if !nix_is_root() {
        eprintln!("skipped: needs root (network namespaces, iptables)");
        return;
    }
    let pair = Pair::new();
    let plain = round_trips(&pair, 20);
    let link = DelayedLink::start(
        &pair.a,
        41,
        Duration::from_millis(30),
        &["OUTPUT", "-p", "udp"],
    )
    .expect("start nfdelay");
    let delayed = round_trips(&pair, 20);
    drop(link);
    let fastest = |v: &[Duration]| v.iter().min().copied().unwrap_or_default();
    assert!(fastest(&plain) < Duration::from_millis(25), "{plain:?}");
    assert!(
        fastest(&delayed) >= Duration::from_millis(30),
        "{delayed:?}"
    );
    // The rule is gone with the link: fast again.
    let after = round_trips(&pair, 5);
    assert!(fastest(&after) < Duration::from_millis(25), "{after:?}");
}

fn nix_is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0\n"))
        .unwrap_or(false)
}
