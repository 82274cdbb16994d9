//! Counters never go down, not even across a reload (issue 26): a reload
//! that changes a flow builds it anew (new sockets, new counters), and
//! what readers see goes on from where it stood. The real daemon in the
//! two-leg topology (tests/common), an RTP stream on both legs, and a
//! chain of reloads, each changing flow `f` another way:
//!
//! 1. an output added (the flow's shard moves: removed, then added);
//! 2. a second leg and `redundancy = "merge"` (replaced in place: one
//!    `Replace` command, the first leg kept);
//! 3. merge to failover (in place again);
//! 4. every leg's interface down (a pause), the flow changed while
//!    paused (stopped and configured anew), and the interfaces up;
//! 5. back to one input and one output, then merged with both again
//!    (each replaced while relaying): what went away goes on from where
//!    it stood when it comes back.
//!
//! Checked generically, not on a list of names: every `_total` series of
//! `/metrics` and every counter of `stats --json` (every number but the
//! gauges of the counter table, `mcrelay_control::counters::gauges`) is
//! at least what it was in every earlier
//! read that had it. A scraper reads `/metrics` all along, the reloads
//! included, so a moment in between where a counter dips is caught too.
//!
//! Needs root (CI runs as root); skips with a message otherwise.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{Topology, ctl, in_netns, leg_toml, loadgen, scrape_in, stop_sender, wait_until};
use mcrelay_testkit::metrics::{fell, totals};
use serde_json::Value;

const LEG0: &str = "239.26.1.1:5000";
const LEG1: &str = "239.26.3.1:5000";
const OUT: &str = "239.26.2.1:5000";
const OUT2: &str = "239.26.2.2:5000";
const METRICS: &str = "127.0.0.1:9466";
const RATE: u64 = 500;

fn socket(t: &Topology) -> PathBuf {
    t.dir.join("control.sock")
}

fn config(t: &Topology, inputs: &str, outputs: &[&str], settings: &str) -> String {
    let outs: Vec<String> = outputs.iter().map(|o| leg_toml("vRB", o)).collect();
    format!(
        "[daemon]\nuser = \"nobody\"\ncontrol_socket = \"{}\"\nmetrics_listen = \"{METRICS}\"\n\n\
         [[flow]]\nname = \"f\"\npayload = \"rtp\"\n{inputs}\noutputs = [{}]\n{settings}\n",
        socket(t).display(),
        outs.join(", ")
    )
}

fn one_input() -> String {
    format!("input = {}", leg_toml("vRA1", LEG0))
}

fn two_legs() -> String {
    format!(
        "inputs = [{}, {}]",
        leg_toml("vRA1", LEG0),
        leg_toml("vRA2", LEG1)
    )
}

/// `loadgen legs`: one RTP stream onto both legs, until stopped.
fn sender(t: &Topology) -> Child {
    t.command(&t.a, &loadgen())
        .args(["legs", "--json", "--rate", &RATE.to_string()])
        .args(["--leg", &format!("{LEG0}@vA1")])
        .args(["--leg", &format!("{LEG1}@vA2")])
        .args(["--count", &(RATE * 600).to_string(), "--no-end-marker"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn sender")
}

/// `GET /metrics` from inside `ns`, `None` if the endpoint closed the
/// connection early.
fn try_scrape(ns: &str) -> Option<String> {
    use std::io::{Read, Write};
    in_netns(ns, || {
        let mut c = std::net::TcpStream::connect(METRICS).ok()?;
        c.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
        let mut body = String::new();
        c.read_to_string(&mut body).ok()?;
        body.lines().next()?.contains(" 200 ").then_some(body)
    })
}

/// Every counter of a `stats --json`, by its path (flows by name, outputs
/// by label, legs by input, workers by index; the counter table's
/// `gauges` left out).
fn counters(v: &Value, path: &str, gauges: &[&str], out: &mut BTreeMap<String, u64>) {
    match v {
        Value::Number(n) => {
            // The field's name: `.workers[1]` is `workers`.
            let key = path.rsplit('.').next().unwrap_or(path);
            let key = key.split('[').next().unwrap_or(key);
            if let Some(n) = n.as_u64()
                && !gauges.contains(&key)
            {
                out.insert(path.to_owned(), n);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let id = ["name", "label", "input", "class", "peer"]
                    .iter()
                    .find_map(|k| item.get(k).and_then(Value::as_str))
                    .map_or_else(|| i.to_string(), str::to_owned);
                counters(item, &format!("{path}[{id}]"), gauges, out);
            }
        }
        Value::Object(map) => {
            for (k, item) in map {
                counters(item, &format!("{path}.{k}"), gauges, out);
            }
        }
        _ => {}
    }
}

/// The reads so far, each new one checked against the highest of each
/// series seen before it.
#[derive(Default)]
struct Reads {
    metrics: BTreeMap<String, f64>,
    stats: BTreeMap<String, u64>,
    /// A reload took a leg or an output away: their series may be
    /// missing (never lower when they come back).
    shrunk: bool,
}

impl Reads {
    fn read(&mut self, t: &Topology, when: &str) {
        let m = totals(&scrape_in(&t.r, METRICS));
        let (code, out) = ctl(&socket(t), &["stats", "--json"]);
        assert_eq!(code, 0, "{out}");
        let mut s = BTreeMap::new();
        counters(
            &serde_json::from_str(&out).expect("stats --json"),
            "",
            &mcrelay_control::counters::gauges(),
            &mut s,
        );
        let down = fell(&self.metrics, &m);
        assert!(down.is_empty(), "{when}: /metrics went down: {down:#?}");
        let down = fell(&self.stats, &s);
        assert!(down.is_empty(), "{when}: stats --json went down: {down:#?}");
        // The series every read had must all still be there while flow f
        // has the same outputs and legs (checked by the caller's plan:
        // nothing is removed here).
        let gone: Vec<&String> = self
            .metrics
            .keys()
            .filter(|k| !m.contains_key(*k))
            .collect();
        assert!(
            self.shrunk || gone.is_empty(),
            "{when}: /metrics lost {gone:#?}"
        );
        self.metrics.extend(m);
        self.stats.extend(s);
    }
}

fn packets_in(t: &Topology) -> u64 {
    common::snapshot(&socket(t))
        .flow("f")
        .map_or(0, |f| f.packets_in)
}

/// Reload `config`, check the reads before, right after and once more
/// traffic went through.
fn reload(t: &Topology, reads: &mut Reads, config: &str, what: &str) {
    reads.read(t, &format!("before {what}"));
    let path = t.dir.join("mcrelay.toml");
    let tmp = t.dir.join("mcrelay.toml.new");
    fs::write(&tmp, config).expect("config");
    fs::rename(&tmp, &path).expect("rename");
    let (code, said) = ctl(&socket(t), &["reload"]);
    assert_eq!(code, 0, "{what}: {said}");
    assert!(said.contains("changed: f"), "{what}: {said}");
    reads.read(t, &format!("right after {what}"));
    let at = packets_in(t);
    wait_until(&format!("traffic after {what}"), || {
        let s = common::snapshot(&socket(t));
        match s.flow("f") {
            Some(f) if f.state.is_running() && f.packets_in >= at + RATE / 2 => Ok(()),
            _ => Err(format!("{s:?}")),
        }
    });
    reads.read(t, &format!("after {what} and more traffic"));
}

#[test]
fn every_total_is_monotonic_across_reloads_that_change_the_flow() {
    let Some(t) = Topology::two_legs("cr", 26) else {
        return;
    };
    let relay = t.relay(&config(&t, &one_input(), &[OUT], ""), &[]);
    let tx = sender(&t);
    wait_until("traffic into f", || {
        let n = packets_in(&t);
        if n >= RATE {
            Ok(())
        } else {
            Err(n.to_string())
        }
    });
    // A scraper all along: each scrape no lower than the one before.
    let stop = Arc::new(AtomicBool::new(false));
    let scraper = {
        let (stop, ns) = (Arc::clone(&stop), t.r.clone());
        std::thread::spawn(move || {
            let mut seen: BTreeMap<String, f64> = BTreeMap::new();
            let mut scrapes = 0_u64;
            while !stop.load(Ordering::Relaxed) {
                // The endpoint may close a connection to make room for a
                // newer one from the same address (the test's own reads).
                let Some(text) = try_scrape(&ns) else {
                    continue;
                };
                let now = totals(&text);
                let down = fell(&seen, &now);
                if !down.is_empty() {
                    return Err(format!("scrape {scrapes}: {down:#?}"));
                }
                seen.extend(now);
                scrapes += 1;
            }
            Ok(scrapes)
        })
    };
    let mut reads = Reads::default();
    reload(
        &t,
        &mut reads,
        &config(&t, &one_input(), &[OUT, OUT2], ""),
        "an output added",
    );
    reload(
        &t,
        &mut reads,
        &config(&t, &two_legs(), &[OUT, OUT2], "redundancy = \"merge\""),
        "a second leg, merged",
    );
    reload(
        &t,
        &mut reads,
        &config(
            &t,
            &two_legs(),
            &[OUT, OUT2],
            "redundancy = \"failover\"\nfailover_after_ms = 200",
        ),
        "merge to failover",
    );
    // A pause (every leg's interface down) and the flow changed while
    // paused: stopped and configured anew, not replaced.
    for dev in ["vRA1", "vRA2"] {
        t.ip(&t.r, &["link", "set", dev, "down"]);
    }
    wait_until("flow f paused", || {
        let s = common::snapshot(&socket(&t));
        match s.flow("f") {
            Some(f) if !f.state.is_running() => Ok(()),
            _ => Err(format!("{s:?}")),
        }
    });
    reads.read(&t, "paused");
    let path = t.dir.join("mcrelay.toml");
    fs::write(
        &path,
        config(
            &t,
            &two_legs(),
            &[OUT, OUT2],
            "redundancy = \"failover\"\nfailover_after_ms = 300",
        ),
    )
    .expect("config");
    let (code, said) = ctl(&socket(&t), &["reload"]);
    assert_eq!(code, 0, "{said}");
    reads.read(&t, "changed while paused");
    for dev in ["vRA1", "vRA2"] {
        t.ip(&t.r, &["link", "set", dev, "up"]);
    }
    let at = packets_in(&t);
    wait_until("traffic after the pause", || {
        let n = packets_in(&t);
        if n >= at + RATE / 2 {
            Ok(())
        } else {
            Err(n.to_string())
        }
    });
    reads.read(&t, "resumed");
    // Back to one input and one output, then merged with both again
    // (replaced while relaying): the merge's, the second leg's and the
    // second output's series are missing in between and go on from
    // where they stood after.
    reads.shrunk = true;
    reload(
        &t,
        &mut reads,
        &config(&t, &one_input(), &[OUT], ""),
        "back to one input and one output",
    );
    reload(
        &t,
        &mut reads,
        &config(&t, &two_legs(), &[OUT, OUT2], "redundancy = \"merge\""),
        "merged again, both outputs",
    );
    stop.store(true, Ordering::Relaxed);
    let scrapes = scraper.join().expect("scraper");
    stop_sender(tx);
    let log = relay.stop();
    match scrapes {
        Ok(n) => eprintln!("{n} scrapes, none lower than the one before"),
        Err(e) => panic!("a scrape went down: {e}\n{log}"),
    }
    assert!(
        reads.metrics.len() > 40,
        "too few series to mean anything: {:?}",
        reads.metrics.keys()
    );
}
