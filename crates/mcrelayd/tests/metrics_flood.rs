//! `/metrics` under a connection flood (issue 27, item 6): one address
//! opens well over a thousand connections a second, each holding half a
//! request, while a scraper at another address scrapes. The per-address
//! cap keeps the flood to its own share of the endpoint, so at least 99 %
//! of the scrapes succeed (before the cap, the flood displaced the
//! scraper's connections: 3 of 32 failed at 1 200 connections/s). And
//! with `daemon.metrics_allow`, a peer outside it is closed at accept,
//! counted, while an allowed scraper is served.
//!
//! The daemon runs in R; the flood comes from A (10.10.1.1 → 10.10.1.2),
//! the scraper from B (10.10.2.2 → 10.10.2.1): every packet stays inside
//! the test's namespaces. Needs root (CI runs as root); skips with a
//! message otherwise.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

mod common;
use common::*;

const PORT: u16 = 9464;
/// Connections a second the flood aims for, over its threads.
const FLOOD_RATE: u64 = 3000;
const FLOOD_THREADS: u64 = 4;
/// Connections each flood thread keeps open (its oldest closed first).
const FLOOD_HELD: usize = 200;
const SCRAPES: u32 = 100;
/// Flows of the daemon under test.
const FLOWS: usize = 50;

/// The daemon in R with [`FLOWS`] flows (nothing is sent to them: they
/// give a scrape its realistic size) and the endpoint on every address.
fn config(t: &Topology, allow: Option<&str>) -> String {
    let flows: String = (1..=FLOWS)
        .map(|i| {
            format!(
                "[[flow]]\nname = \"f{i}\"\ninput = {{ interface = \"vRA\", address = \"239.1.1.{i}\", port = 5000 }}\n\
                 outputs = [ {{ interface = \"vRB\", address = \"239.2.2.{i}\", port = 6000 }} ]\n"
            )
        })
        .collect();
    format!(
        "[daemon]\nuser = \"nobody\"\ncontrol_socket = \"{}\"\nmetrics_listen = \"0.0.0.0:{PORT}\"\n{}{flows}",
        t.dir.join("control.sock").display(),
        allow.map_or(String::new(), |a| format!("metrics_allow = {a}\n")),
    )
}

/// A thread of this test in namespace `ns`, running `f` until `stop`.
fn in_ns_background<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> JoinHandle<T> {
    let path = PathBuf::from("/var/run/netns").join(ns);
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).expect("netns file");
        enter_netns(&file);
        f()
    })
}

/// The flood: `FLOOD_THREADS` threads in A, each paced to its share of
/// [`FLOOD_RATE`], each connection sending the first half of a request
/// and holding it. Returns the stop flag, the connection count and the
/// threads.
fn flood(
    t: &Topology,
    target: SocketAddr,
) -> (Arc<AtomicBool>, Arc<AtomicU64>, Vec<JoinHandle<()>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicU64::new(0));
    let threads = (0..FLOOD_THREADS)
        .map(|_| {
            let (stop, opened) = (Arc::clone(&stop), Arc::clone(&opened));
            in_ns_background(&t.a, move || {
                let gap = Duration::from_secs(1)
                    / u32::try_from(FLOOD_RATE / FLOOD_THREADS).expect("rate");
                let mut held = VecDeque::with_capacity(FLOOD_HELD);
                let mut next = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(mut c) = TcpStream::connect_timeout(&target, Duration::from_secs(1)) {
                        let _ = c.write_all(b"GET /metrics HTTP/1.1\r\nHost: flood\r\n");
                        opened.fetch_add(1, Ordering::Relaxed);
                        if held.len() == FLOOD_HELD {
                            held.pop_front();
                        }
                        held.push_back(c);
                    }
                    next += gap;
                    let now = Instant::now();
                    if next > now {
                        std::thread::sleep(next - now);
                    } else if now - next > Duration::from_millis(100) {
                        // Fell behind (a loaded machine): don't burst to catch up.
                        next = now;
                    }
                }
            })
        })
        .collect();
    (stop, opened, threads)
}

/// One scrape of `target`; the reply, or what went wrong.
fn scrape(target: SocketAddr) -> Result<String, String> {
    let mut c = TcpStream::connect_timeout(&target, Duration::from_secs(10))
        .map_err(|e| format!("connect: {e}"))?;
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: scraper\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut reply = String::new();
    c.read_to_string(&mut reply)
        .map_err(|e| format!("read: {e}"))?;
    if reply.starts_with("HTTP/1.1 200") && reply.contains("\nmcrelay_up 1\n") {
        Ok(reply)
    } else {
        Err(format!("reply: {:?}", &reply[..reply.len().min(200)]))
    }
}

/// The value of the sample `series` (name and labels, as written) in a
/// scrape.
fn value(reply: &str, series: &str) -> u64 {
    reply
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in:\n{reply}"))
}

#[test]
fn a_connection_flood_from_one_address_does_not_push_out_a_scraper() {
    let Some(t) = Topology::new() else { return };
    let relay = t.relay(&config(&t, None), &[]);
    let flood_target: SocketAddr = format!("10.10.1.2:{PORT}").parse().expect("addr");
    let scrape_target: SocketAddr = format!("10.10.2.1:{PORT}").parse().expect("addr");
    let (stop, opened, threads) = flood(&t, flood_target);
    // The flood is under way before the first scrape.
    wait_until("the flood under way", || {
        let n = opened.load(Ordering::Relaxed);
        if n >= 500 {
            Ok(())
        } else {
            Err(format!("{n} connections"))
        }
    });
    let began = (Instant::now(), opened.load(Ordering::Relaxed));
    let results = in_ns_background(&t.b, move || {
        (0..SCRAPES)
            .map(|_| {
                let r = scrape(scrape_target);
                std::thread::sleep(Duration::from_millis(20));
                r
            })
            .collect::<Vec<_>>()
    })
    .join()
    .expect("scraper");
    let rate = (opened.load(Ordering::Relaxed) - began.1) as f64 / began.0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for th in threads {
        let _ = th.join();
    }
    let failed: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    let last = results
        .iter()
        .rev()
        .find_map(|r| r.as_ref().ok())
        .cloned()
        .unwrap_or_default();
    eprintln!(
        "flood at {rate:.0} connections/s from one address: {} of {SCRAPES} scrapes failed {failed:?}",
        failed.len()
    );
    assert!(
        failed.len() * 100 <= SCRAPES as usize,
        "{} of {SCRAPES} scrapes failed under a flood of {rate:.0} connections/s: {failed:?}\n{}",
        failed.len(),
        relay.log()
    );
    // The flood really was one: well over a thousand connections a
    // second on an idle machine; on a loaded one at least some hundreds.
    assert!(
        rate >= 400.0,
        "the flood reached only {rate:.0} connections/s"
    );
    // What it cost the flood: its own connections, displaced, counted.
    let displaced = value(
        &last,
        "mcrelay_metrics_connections_displaced_total{reason=\"address_cap\"}",
    );
    assert!(displaced > 0, "{last}");
    relay.stop();
}

#[test]
fn a_peer_outside_the_allow_list_is_closed_at_accept_and_counted() {
    let Some(t) = Topology::new() else { return };
    let relay = t.relay(
        &config(&t, Some("[\"10.10.2.0/24\", \"127.0.0.1/32\"]")),
        &[],
    );
    let refused_target: SocketAddr = format!("10.10.1.2:{PORT}").parse().expect("addr");
    let allowed_target: SocketAddr = format!("10.10.2.1:{PORT}").parse().expect("addr");
    for _ in 0..3 {
        let reply = in_ns_background(&t.a, move || {
            let mut c = TcpStream::connect_timeout(&refused_target, Duration::from_secs(10))
                .map_err(|e| format!("connect: {e}"))?;
            c.set_read_timeout(Some(Duration::from_secs(10)))
                .map_err(|e| e.to_string())?;
            let _ = c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
            let mut reply = Vec::new();
            match c.read_to_end(&mut reply) {
                Ok(_) => Ok(String::from_utf8_lossy(&reply).into_owned()),
                Err(e) => Err(format!("read: {e}")),
            }
        })
        .join()
        .expect("thread");
        // Closed with a reset, or at least with no reply.
        assert!(
            reply.as_ref().is_err_and(|e| e.contains("reset")) || reply.as_deref() == Ok(""),
            "a peer outside the allow-list got {reply:?}"
        );
    }
    let reply = in_ns_background(&t.b, move || scrape(allowed_target))
        .join()
        .expect("thread")
        .expect("an allowed scraper is served");
    assert_eq!(
        value(
            &reply,
            "mcrelay_metrics_connections_refused_total{reason=\"not_allowed\"}"
        ),
        3,
        "{reply}"
    );
    assert!(relay.log().contains("allow"), "{}", relay.log());
    relay.stop();
}
