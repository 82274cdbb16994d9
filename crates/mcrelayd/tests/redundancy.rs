//! SMPTE 2022-7 merge and input failover (issue 17) with the real daemon.
//!
//! ```text
//!  ns A (sender)              ns R (mcrelayd)                    ns B (receiver)
//!  vA1 10.20.1.1 <--veth--> vRA1 10.20.1.2  leg 0: 239.21.1.1:5000
//!  vA2 10.20.3.1 <--veth--> vRA2 10.20.3.2  leg 1: 239.21.3.1:5000
//!                           vRB  10.20.2.1 <--veth--> vB 10.20.2.2   out: 239.21.2.1:5000
//! ```
//!
//! `loadgen legs` in A plays one RTP stream onto both legs from a seeded
//! plan (disjoint planted losses, one leg delayed, a leg stopped and
//! restarted) and prints which numbers each leg did not send;
//! `loadgen legs-recv` in B checks every datagram byte by byte and lists
//! the missing, duplicated and late sequence numbers. Namespaces are
//! `rt-*`, removed at the end; every packet leaves from inside them.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use common::{Relay, Topology, ctl, loadgen, scrape_in, signal, wait_until};
use serde_json::Value;

/// Datagrams a second of every stream here: a sequence number is a
/// millisecond.
const RATE: u64 = 1000;
const LEG0: &str = "239.21.1.1:5000";
const LEG1: &str = "239.21.3.1:5000";
const OUT: &str = "239.21.2.1:5000";
const SSRC: u32 = 0x4d43_0001;
/// The daemon's `/metrics`, on R's loopback.
const METRICS: &str = "127.0.0.1:9465";

/// A and R joined by two veth paths, R and B by one.
fn topology() -> Option<Topology> {
    let t = Topology::bare("rt")?;
    let veth = |ns1: &str, d1: &str, ns2: &str, d2: &str| {
        common::sh(&[
            "ip", "link", "add", d1, "netns", ns1, "mtu", "9200", "type", "veth", "peer", "name",
            d2, "netns", ns2, "mtu", "9200",
        ]);
    };
    veth(&t.a, "vA1", &t.r, "vRA1");
    veth(&t.a, "vA2", &t.r, "vRA2");
    veth(&t.r, "vRB", &t.b, "vB");
    for (ns, dev, v4) in [
        (&t.a, "vA1", "10.20.1.1/24"),
        (&t.r, "vRA1", "10.20.1.2/24"),
        (&t.a, "vA2", "10.20.3.1/24"),
        (&t.r, "vRA2", "10.20.3.2/24"),
        (&t.r, "vRB", "10.20.2.1/24"),
        (&t.b, "vB", "10.20.2.2/24"),
    ] {
        t.ip(ns, &["addr", "add", v4, "dev", dev]);
        t.ip(ns, &["link", "set", dev, "up"]);
    }
    t.ip(&t.b, &["route", "add", "224.0.0.0/4", "dev", "vB"]);
    // Carrier on every link before the daemon starts (else its flow
    // begins paused, "interface down").
    for (ns, dev) in [
        (&t.a, "vA1"),
        (&t.a, "vA2"),
        (&t.r, "vRA1"),
        (&t.r, "vRA2"),
        (&t.r, "vRB"),
        (&t.b, "vB"),
    ] {
        wait_until(&format!("{dev} up"), || {
            let out = Command::new("ip")
                .args(["-n", ns, "-o", "link", "show", "dev", dev])
                .output()
                .expect("ip link");
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            if text.contains("state UP") {
                Ok(())
            } else {
                Err(text)
            }
        });
    }
    for key in ["all", "default", "vRA1", "vRA2", "vRB"] {
        t.rp_filter(key, 0);
    }
    Some(t)
}

fn leg_toml(iface: &str, group: &str) -> String {
    let (addr, port) = group.split_once(':').expect("group:port");
    format!("{{ interface = \"{iface}\", address = \"{addr}\", port = {port} }}")
}

/// The daemon's file: metrics on R's loopback, one flow `f` from
/// `inputs` (a TOML `input = ...` or `inputs = [...]` line) to OUT on vRB,
/// with `settings`.
fn config(t: &Topology, inputs: &str, settings: &str) -> String {
    format!(
        "[daemon]\nuser = \"nobody\"\ncontrol_socket = \"{}\"\nmetrics_listen = \"{METRICS}\"\n\n\
         [[flow]]\nname = \"f\"\n{inputs}\noutputs = [{}]\n{settings}\n",
        t.dir.join("control.sock").display(),
        leg_toml("vRB", OUT),
    )
}

fn two_legs() -> String {
    format!(
        "inputs = [{}, {}]",
        leg_toml("vRA1", LEG0),
        leg_toml("vRA2", LEG1)
    )
}

/// `mcrelayd check` in R, then the daemon: a configuration the daemon
/// refuses fails here, with its message.
fn start(t: &Topology, config: &str) -> Relay {
    let path = t.dir.join("check.toml");
    fs::write(&path, config).expect("write config");
    let out = t
        .command(&t.r, Path::new(common::MCRELAYD))
        .arg("check")
        .arg("--config")
        .arg(&path)
        .output()
        .expect("mcrelayd check");
    assert!(
        out.status.success(),
        "mcrelayd check refused the redundancy configuration:\n{}{}\n{config}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let relay = t.relay(config, &[]);
    wait_until("flow f relaying", || {
        let s = common::snapshot(&socket(t));
        match s.flow("f") {
            Some(f) if f.state.is_running() => Ok(()),
            _ => Err(format!("{s:?}")),
        }
    });
    relay
}

fn socket(t: &Topology) -> PathBuf {
    t.dir.join("control.sock")
}

/// The receiver in B of `loadgen legs`' stream: `legs-recv` on OUT,
/// joined before this returns.
fn receiver(t: &Topology, expect: u64) -> Child {
    let ssrc = SSRC.to_string();
    receiver_with(t, &["--expect", &expect.to_string(), "--ssrc", &ssrc])
}

/// `legs-recv` in B on OUT with `extra`, joined before this returns.
fn receiver_with(t: &Topology, extra: &[&str]) -> Child {
    let ready = t.dir.join("receiver-ready");
    let _ = fs::remove_file(&ready);
    let child = t
        .command(&t.b, &loadgen())
        .args(["legs-recv", "--group", OUT, "--interface", "vB", "--json"])
        .args(["--rcvbuf", common::RECEIVER_RCVBUF])
        .arg("--ready-file")
        .arg(&ready)
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn receiver");
    ready_or_exit(child, &ready, "receiver")
}

/// Wait until `child` has created `ready` (it is bound and joined), and
/// let the IGMP join settle on the veth; fail at once if it exits first.
fn ready_or_exit(mut child: Child, ready: &Path, what: &str) -> Child {
    wait_until(&format!("the {what} ready"), || {
        if ready.exists() {
            Ok(())
        } else if let Some(status) = child.try_wait().expect("try_wait") {
            panic!("the {what} exited ({status}) before it was ready");
        } else {
            Err("no ready file".into())
        }
    });
    std::thread::sleep(std::time::Duration::from_millis(50));
    child
}

/// `loadgen legs` in A onto both legs, in the background.
///
/// It runs at the lowest real-time priority (`chrt --fifo 1`, where
/// allowed): it sleeps between datagrams (1000 a second), and on a loaded
/// machine an ordinary sender stalls for tens of milliseconds, which
/// stretches the legs' planned skew (`max_skew_ms`) past what the merge
/// tests assume. The relay runs as it would in production.
fn sender(t: &Topology, args: &[&str]) -> Child {
    static RT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let rt = *RT.get_or_init(|| {
        Command::new("chrt")
            .args(["--fifo", "1", "true"])
            .status()
            .is_ok_and(|s| s.success())
    });
    let mut c = if rt {
        let mut c = t.command(&t.a, Path::new("chrt"));
        c.args(["--fifo", "1"]).arg(loadgen());
        c
    } else {
        t.command(&t.a, &loadgen())
    };
    c.args(["legs", "--json", "--rate", &RATE.to_string()])
        .args(["--ssrc", &SSRC.to_string()])
        .args([
            "--leg",
            &format!("{LEG0}@vA1"),
            "--leg",
            &format!("{LEG1}@vA2"),
        ])
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn sender")
}

/// A child's JSON summary, once it exits successfully.
fn summary(child: Child, what: &str) -> Value {
    let out = child.wait_with_output().expect(what);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{what} failed: {text}");
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{what}: {e}: {text}"))
}

fn numbers(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .filter_map(Value::as_u64)
        .collect()
}

fn stats(t: &Topology) -> Value {
    let (code, out) = ctl(&socket(t), &["stats", "--json"]);
    assert_eq!(code, 0, "{out}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn flow(s: &Value) -> &Value {
    s["flows"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["name"] == "f"))
        .unwrap_or_else(|| panic!("no flow f in {s}"))
}

/// Flow f's redundancy counters in `stats --json`.
fn redundancy(s: &Value) -> &Value {
    &flow(s)["redundancy"]
}

/// `/metrics` of the daemon, fetched from inside R.
fn metrics(t: &Topology) -> String {
    scrape_in(&t.r, METRICS)
}

/// The value of family `name` for flow f (summed over any further
/// labels); `None` when no sample has it.
fn metric(text: &str, name: &str) -> Option<f64> {
    let samples: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains("flow=\"f\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!samples.is_empty()).then(|| samples.iter().sum())
}

/// The value of family `name` for flow f's input `input`
/// (`address:port@interface`).
fn input_metric(text: &str, name: &str, input: &str) -> Option<f64> {
    let key = format!("{name}{{flow=\"f\",input=\"{input}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.parse().ok())
}

/// Leg `leg`'s `input` label on /metrics.
fn leg_label(leg: usize) -> String {
    let (group, iface) = [(LEG0, "vRA1"), (LEG1, "vRA2")][leg];
    format!("{group}@{iface}")
}

/// Wait until `/metrics` says flow f forwards from leg `leg` (its
/// `mcrelay_flow_active_input` is 1).
fn wait_for_active_leg(t: &Topology, leg: usize) {
    let label = leg_label(leg);
    wait_until(&format!("flow f forwarding from leg {leg}"), || {
        let m = metrics(t);
        match input_metric(&m, "mcrelay_flow_active_input", &label) {
            Some(1.0) => Ok(()),
            other => Err(format!("active_input{{input={label}}} = {other:?}")),
        }
    });
}

/// Wait until flow f's metric `name` satisfies `ok`. Polled over HTTP
/// from this process (no process start per poll), so it keeps up with
/// the stream on a loaded machine.
fn wait_for_metric(t: &Topology, what: &str, name: &str, ok: impl Fn(f64) -> bool) -> f64 {
    wait_until(what, || {
        let m = metrics(t);
        match metric(&m, name) {
            Some(v) if ok(v) => Ok(v),
            other => Err(format!("{name} = {other:?}")),
        }
    })
}

/// Wait until `stats --json` and `/metrics` both show flow f's merge
/// counters as the plan says; the counters of the last numbers settle
/// once their merge window has passed.
fn expect_merge_counters(t: &Topology, recovered: u64, duplicates: u64, lost: u64) {
    wait_until("the merge counters matching the plan", || {
        let s = stats(t);
        let r = redundancy(&s);
        let got = (
            r["recovered"].as_u64(),
            r["duplicates"].as_u64(),
            r["lost"].as_u64(),
        );
        if got == (Some(recovered), Some(duplicates), Some(lost)) {
            Ok(())
        } else {
            Err(format!(
                "stats: recovered/duplicates/lost {got:?}, want ({recovered}, {duplicates}, {lost}): {}",
                flow(&s)
            ))
        }
    });
    wait_until("the merge metrics matching the plan", || {
        let m = metrics(t);
        let got = [
            "mcrelay_flow_merge_recovered_packets_total",
            "mcrelay_flow_merge_duplicate_packets_total",
            "mcrelay_flow_merge_lost_packets_total",
        ]
        .map(|n| metric(&m, n));
        let want = [recovered, duplicates, lost].map(|v| Some(v as f64));
        if got == want {
            Ok(())
        } else {
            Err(format!("metrics {got:?}, want {want:?}"))
        }
    });
}

/// Leg `leg`'s planted losses and unsent numbers in the sender's summary.
fn leg_list(sent: &Value, leg: usize, key: &str) -> Vec<u64> {
    numbers(&sent["legs"][leg][key])
}

/// The receiver saw the whole stream, each datagram valid, once.
fn complete(t: &Topology, rx: &Value, count: u64) {
    if !whole(rx, count) {
        // The relay's side of it, for the failure message.
        let s = stats(t);
        panic!(
            "the output is not the whole stream, once, valid (ended, nothing missing, no duplicates, received {count}):\nreceiver: {rx}\nflow f: {}",
            flow(&s)
        );
    }
}

/// Whether receiver summary `rx` is the whole stream of `count`, once,
/// valid.
fn whole(rx: &Value, count: u64) -> bool {
    rx["ended"] == true
        && rx["missing"] == 0
        && rx["duplicates"] == 0
        && rx["received"] == count
        && ["corrupt", "foreign", "not_rtp", "truncated", "beyond"]
            .iter()
            .all(|k| rx[*k] == 0)
}

/// Why a run of [`merge`] is made again instead of judged.
enum Again {
    /// A stalled sender stretched the legs' skew (ms) to near the hold.
    Skew(f64),
    /// The relay was stalled longer than the hold less the skew: numbers
    /// it skipped arrived afterwards from the late leg (its `late` count).
    RelayStalled(u64),
}

/// Merge with disjoint 5 % losses on each leg and leg 1 20 ms behind:
/// the output is complete, byte-exact and free of duplicates; with
/// `merge_delay_ms = 0` only numbers recovered from the late leg (leg 0's
/// losses) arrive late, with 50 they all arrive in order. The counters
/// match the plan.
fn merge(merge_delay_ms: u64) {
    // With a hold, the skew must stay under it: a sender that stalled
    // between a number's successor and the number stretched the skew
    // itself, so a run whose skew came within 5 ms of the hold says
    // nothing about the relay and is made again (at most 3 times). So is
    // one where the relay itself was descheduled for longer than the hold
    // less the skew (a loaded 2-core machine): the hold ran out in its
    // time before it read the late leg's copies, which it then counted as
    // late. The hold's timing in the relay's own time is the core's
    // fake-clock tests' job.
    for attempt in 1..=3 {
        match merge_once(merge_delay_ms) {
            Some(Again::Skew(skew)) => eprintln!(
                "attempt {attempt}: a stalled sender stretched the legs' skew to {skew} ms, too close to the {merge_delay_ms} ms hold; again"
            ),
            Some(Again::RelayStalled(late)) => eprintln!(
                "attempt {attempt}: the output missed numbers whose copies reached the relay after the {merge_delay_ms} ms hold ({late} late): the relay was stalled; again"
            ),
            None => return,
        }
    }
    panic!("in 3 runs either the sender or the relay stalled past the hold each time");
}

/// One run of [`merge`]: judged (`None`, also when skipped, not root), or
/// why it must be made again.
fn merge_once(merge_delay_ms: u64) -> Option<Again> {
    let t = topology()?;
    // The widest window (1000 ms): a number's fate (recovered or not) is
    // settled in the relay's time, when its window closes, so a relay
    // stalled longer than window - skew on a loaded machine would see
    // the late leg's copy after it closed and count one more recovered
    // than the plan. The default window's accounting is the core's
    // fake-clock tests' job.
    let settings = format!(
        "payload = \"rtp\"\nredundancy = \"merge\"\nmerge_delay_ms = {merge_delay_ms}\nmerge_window_ms = 1000"
    );
    let relay = start(&t, &config(&t, &two_legs(), &settings));
    let count = 4000;
    let rx = receiver(&t, count);
    let tx = sender(
        &t,
        &[
            "--count",
            &count.to_string(),
            "--loss",
            "5,5",
            "--delay-ms",
            "0,20",
            "--seed",
            &(17 + merge_delay_ms).to_string(),
        ],
    );
    let sent = summary(tx, "sender");
    let got = summary(rx, "receiver");
    let lost0 = leg_list(&sent, 0, "losses");
    let lost1 = leg_list(&sent, 1, "losses");
    assert!(
        lost0.len() > 100 && lost1.len() > 100,
        "5 % of 4000 planted on each leg: {sent}"
    );
    for leg in 0..2 {
        assert_eq!(sent["legs"][leg]["send_errors"], 0, "{sent}");
    }
    let skew = sent["max_skew_ms"].as_f64().expect("max_skew_ms");
    if merge_delay_ms > 0 && skew > (merge_delay_ms - 5) as f64 {
        relay.stop();
        return Some(Again::Skew(skew));
    }
    if merge_delay_ms > 0 && !whole(&got, count) {
        let late = redundancy(&stats(&t))["late"].as_u64().unwrap_or(0);
        if late > 0 {
            relay.stop();
            return Some(Again::RelayStalled(late));
        }
    }
    complete(&t, &got, count);
    let late = numbers(&got["late_seqs"]);
    eprintln!(
        "merge_delay_ms {merge_delay_ms}: {} + {} planted losses, {} late (at most {} numbers behind); legs' real skew at most {skew} ms",
        lost0.len(),
        lost1.len(),
        late.len(),
        got["max_lateness"]
    );
    if merge_delay_ms == 0 {
        let stray: Vec<u64> = late
            .iter()
            .copied()
            .filter(|s| lost0.binary_search(s).is_err())
            .collect();
        assert!(
            stray.is_empty(),
            "late but not recovered from the delayed leg: {stray:?}\n{got}"
        );
        assert!(
            !late.is_empty(),
            "merge_delay_ms = 0 held nothing back, so numbers recovered from the \
             20 ms late leg arrive after higher ones: {got}"
        );
    } else {
        assert!(late.is_empty(), "out of sequence order: {got}");
    }
    // Every number lost on one leg was recovered from the other; every
    // other number came twice (the end marker too), one copy dropped.
    let recovered = (lost0.len() + lost1.len()) as u64;
    expect_merge_counters(&t, recovered, count - recovered + 1, 0);
    relay.stop();
    None
}

#[test]
fn merge_without_delay_is_complete_and_only_recovered_numbers_are_late() {
    merge(0);
}

#[test]
fn merge_with_delay_is_complete_and_in_sequence_order() {
    merge(50);
}

/// Leg 0 (on time, 5 % lost) goes down in the middle of the stream; leg 1
/// (20 ms behind, nothing lost) carries on: nothing is lost on the output.
#[test]
fn merge_loses_nothing_when_a_legs_interface_goes_down() {
    let Some(t) = topology() else { return };
    let settings = "payload = \"rtp\"\nredundancy = \"merge\"";
    let relay = start(&t, &config(&t, &two_legs(), settings));
    let count = 5000;
    let rx = receiver(&t, count);
    let tx = sender(
        &t,
        &[
            "--count",
            &count.to_string(),
            "--loss",
            "5,0",
            "--delay-ms",
            "0,20",
        ],
    );
    // A third of the way in (both legs count): vRA1 goes down.
    wait_for_metric(
        &t,
        "a third of the stream in",
        "mcrelay_flow_received_packets_total",
        |v| v >= (2 * count / 3) as f64,
    );
    t.ip(&t.r, &["link", "set", "vRA1", "down"]);
    let sent = summary(tx, "sender");
    let got = summary(rx, "receiver");
    complete(&t, &got, count);
    let after = stats(&t);
    assert!(
        flow(&after)["packets_in"].as_u64() < Some(2 * count),
        "leg 0 really went down (fewer datagrams in than both legs sent): {after}\n{sent}"
    );
    let m = metrics(&t);
    assert_eq!(
        metric(&m, "mcrelay_flow_merge_lost_packets_total"),
        Some(0.0),
        "{m}"
    );
    relay.stop();
}

/// Failover: leg 0 (the primary, 20 ms behind leg 1) stops for numbers
/// 2000..3500 (1.5 s) and starts again. The output resumes from leg 1
/// within `failover_after_ms` + 50 ms of leg 0's last datagram, losing at
/// most that many milliseconds of numbers. Once leg 0 has been back for
/// `revert_after_s` the flow returns to it; leg 0 being behind, its first
/// numbers then were already sent from leg 1 and must not be sent again.
/// The switches and the active leg are reported.
#[test]
fn failover_switches_to_the_backup_and_back_without_repeating_numbers() {
    let Some(t) = topology() else { return };
    let failover_after_ms = 100;
    let settings = format!(
        "payload = \"rtp\"\nredundancy = \"failover\"\nfailover_after_ms = {failover_after_ms}\nrevert_after_s = 1"
    );
    let relay = start(&t, &config(&t, &two_legs(), &settings));
    let count = 6500;
    let (stop, restart) = (2000u64, 3500u64);
    let primary_delay_ms = 20;
    let rx = receiver(&t, count);
    let spawned = Instant::now();
    let tx = sender(
        &t,
        &[
            "--count",
            &count.to_string(),
            "--delay-ms",
            &format!("{primary_delay_ms},0"),
            "--gap",
            &format!("0:{stop}-{restart}"),
        ],
    );
    wait_for_active_leg(&t, 1);
    wait_for_active_leg(&t, 0);
    // Leg 0 is back at `restart` numbers (+ its delay) after the sender
    // started, which is after it was spawned: a return seen sooner than
    // revert_after_s after that came too early.
    let returned = spawned.elapsed();
    let earliest = std::time::Duration::from_millis((restart + primary_delay_ms) * 1000 / RATE)
        + std::time::Duration::from_secs(1);
    assert!(
        returned >= earliest,
        "back on leg 0 {returned:?} after the sender was spawned: before leg 0 had been back for revert_after_s ({earliest:?})"
    );
    let sent = summary(tx, "sender");
    let got = summary(rx, "receiver");
    assert_eq!(got["ended"], true, "{got}");
    assert_eq!(got["duplicates"], 0, "no number repeated: {got}");
    assert_eq!(
        got["late"], 0,
        "no number older than one already sent: {got}"
    );
    for key in ["corrupt", "foreign", "not_rtp", "truncated", "beyond"] {
        assert_eq!(got[key], 0, "{key}: {got}");
    }
    // Leg 0's last datagram (number stop - 1) arrives its delay after
    // leg 1's; the output resumes within failover_after_ms + 50 ms of
    // it, so at most that many milliseconds of leg 1's numbers, from
    // `stop` on, are lost. Going back to leg 0, which is behind, loses
    // nothing.
    let budget = RATE * (primary_delay_ms + failover_after_ms + 50) / 1000;
    let missing = numbers(&got["missing_seqs"]);
    eprintln!(
        "failover lost {} numbers (budget {budget}); back on leg 0 {returned:?} after the sender was spawned (earliest allowed {earliest:?})",
        missing.len()
    );
    assert!(
        missing.iter().all(|&s| (stop..stop + budget).contains(&s)),
        "lost beyond the failover's {budget} numbers from {stop}: {missing:?}\n{got}\n{sent}"
    );
    let s = stats(&t);
    let r = redundancy(&s);
    assert_eq!(r["active_input"], 0, "back on leg 0: {s}");
    assert_eq!(r["switches"], 2, "{s}");
    let m = metrics(&t);
    for (leg, active) in [(0, 1.0), (1, 0.0)] {
        assert_eq!(
            input_metric(&m, "mcrelay_flow_active_input", &leg_label(leg)),
            Some(active),
            "leg {leg}: {m}"
        );
    }
    assert_eq!(
        metric(&m, "mcrelay_flow_input_switches_total"),
        Some(2.0),
        "{m}"
    );
    // Each switch is logged (by the supervisor, on its next tick).
    for leg in [1, 0] {
        let line = format!("input switch: now forwarding from input {leg}");
        wait_until(&format!("{line:?} logged"), || {
            let log = relay.log();
            if log.contains(&line) {
                Ok(())
            } else {
                Err(log)
            }
        });
    }
    relay.stop();
}

/// Leg 1's veth (vA2 <-> vRA2) is deleted and created again under the
/// same names mid-stream: the kernel drops the group membership with
/// the interface, so the daemon, told of the new index by netlink,
/// replaces the flow by itself on its worker (make before break, the
/// merge state taken over) and leg 1 joins again. The output loses
/// nothing meanwhile (leg 0 carries it); then a second stream with leg 0
/// silent arrives whole, from leg 1 alone.
#[test]
fn a_legs_interface_deleted_and_created_again_joins_again_without_a_gap() {
    let Some(t) = topology() else { return };
    let settings = "payload = \"rtp\"\nredundancy = \"merge\"";
    let relay = start(&t, &config(&t, &two_legs(), settings));
    // More than the merge's span (4096): the second stream, starting
    // again at 0, restarts the merge instead of arriving late.
    let count = 5000;
    let rx = receiver(&t, count);
    let tx = sender(&t, &["--count", &count.to_string()]);
    wait_for_metric(
        &t,
        "a fifth of the stream in",
        "mcrelay_flow_received_packets_total",
        |v| v >= (2 * count / 5) as f64,
    );
    t.ip(&t.r, &["link", "del", "vRA2"]);
    common::sh(&[
        "ip", "link", "add", "vA2", "netns", &t.a, "mtu", "9200", "type", "veth", "peer", "name",
        "vRA2", "netns", &t.r, "mtu", "9200",
    ]);
    for (ns, dev, v4) in [
        (&t.a, "vA2", "10.20.3.1/24"),
        (&t.r, "vRA2", "10.20.3.2/24"),
    ] {
        t.ip(ns, &["addr", "add", v4, "dev", dev]);
        t.ip(ns, &["link", "set", dev, "up"]);
    }
    t.rp_filter("vRA2", 0);
    wait_until("the daemon rejoining leg 1", || {
        let log = relay.log();
        if log.contains("its leg joins again") {
            Ok(())
        } else {
            Err(log)
        }
    });
    assert!(
        !relay.log().contains("could not join again"),
        "{}",
        relay.log()
    );
    summary(tx, "sender");
    let got = summary(rx, "receiver");
    complete(&t, &got, count);

    // Leg 0 silent (a gap over the whole stream): only leg 1 delivers.
    let forwarded = |m: &str| {
        input_metric(m, "mcrelay_input_forwarded_packets_total", &leg_label(1)).unwrap_or(0.0)
    };
    let before = forwarded(&metrics(&t));
    let second = 1500;
    let ssrc = SSRC.to_string();
    let rx = receiver_with(
        &t,
        &[
            "--expect",
            &second.to_string(),
            "--ssrc",
            &ssrc,
            "--duration",
            "30",
        ],
    );
    let tx = sender(
        &t,
        &[
            "--count",
            &second.to_string(),
            "--gap",
            &format!("0:0-{second}"),
        ],
    );
    summary(tx, "second sender");
    let got = summary(rx, "second receiver");
    complete(&t, &got, second);
    let m = metrics(&t);
    assert!(
        forwarded(&m) - before >= second as f64,
        "leg 1 forwarded the second stream ({before} before):\n{m}"
    );
    relay.stop();
}

/// A running one-leg flow gets a second leg by reload while the stream
/// runs; what the receiver saw.
fn reload_adding_a_leg() -> Option<Value> {
    let t = topology()?;
    let one = format!("input = {}", leg_toml("vRA1", LEG0));
    let relay = start(&t, &config(&t, &one, "payload = \"rtp\""));
    let count = 8000;
    let rx = receiver(&t, count);
    let mut tx = sender(&t, &["--count", &count.to_string()]);
    wait_for_metric(
        &t,
        "a second of the stream in",
        "mcrelay_flow_received_packets_total",
        |v| v >= 1000.0,
    );
    let path = t.dir.join("mcrelay.toml");
    fs::write(
        &path,
        config(&t, &two_legs(), "payload = \"rtp\"\nredundancy = \"merge\""),
    )
    .expect("rewrite config");
    let (code, said) = ctl(&socket(&t), &["reload"]);
    assert_eq!(code, 0, "reload: {said}\n{}", relay.log());
    // The new leg is merged: its copies are dropped as duplicates.
    wait_for_metric(
        &t,
        "the new leg's copies merged",
        "mcrelay_flow_merge_duplicate_packets_total",
        |v| v > 0.0,
    );
    assert!(
        tx.try_wait().expect("try_wait").is_none(),
        "the reload took effect while the stream ran"
    );
    summary(tx, "sender");
    let got = summary(rx, "receiver");
    relay.stop();
    eprintln!(
        "reload: {} missing, {} repeated: {}",
        got["missing"], got["duplicates"], got["duplicated_seqs"]
    );
    assert_eq!(got["ended"], true, "the end marker arrived: {got}");
    for key in ["corrupt", "foreign", "not_rtp", "truncated", "beyond"] {
        assert_eq!(got[key], 0, "{key}: {got}");
    }
    Some(got)
}

/// The issue's reload promise: adding a leg to a running flow loses
/// nothing on the leg it had.
#[test]
fn reload_adding_a_leg_loses_nothing_on_the_existing_leg() {
    let Some(got) = reload_adding_a_leg() else {
        return;
    };
    assert_eq!(got["missing"], 0, "nothing lost: {got}");
}

/// The merge's promise (each sequence number forwarded once, so none
/// after a higher one) across the reload that makes the flow a merge:
/// the new flow takes over from the old one on its worker
/// (`Command::Replace`, `Core::take_over`).
#[test]
fn reload_adding_a_leg_repeats_no_sequence_number() {
    let Some(got) = reload_adding_a_leg() else {
        return;
    };
    assert_eq!(got["duplicates"], 0, "no number twice: {got}");
    assert_eq!(got["late"], 0, "nothing out of order: {got}");
}

/// ffmpeg on PATH, or a message saying why the test is skipped.
fn have_ffmpeg() -> bool {
    let ok = Command::new("ffmpeg")
        .arg("-version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!(
            "SKIPPED: ffmpeg is not installed (CI installs it: .ci/steps/25-stream-health.sh)"
        );
    }
    ok
}

/// `ffmpeg -v error` decoding `file`: what it printed.
fn decode_errors(file: &Path) -> String {
    let out = Command::new("ffmpeg")
        .args(["-hide_banner", "-nostdin", "-v", "error", "-i"])
        .arg(file)
        .args(["-f", "null", "-"])
        .output()
        .expect("ffmpeg");
    format!(
        "{}{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        if out.status.success() {
            String::new()
        } else {
            format!("exit status {}", out.status)
        }
    )
}

/// A real encoder's stream (ffmpeg `-f rtp_mpegts`, recorded once on A's
/// loopback) played onto both legs with disjoint 5 % losses, leg 1 20 ms
/// behind, merged in order (`merge_delay_ms = 200`): the received
/// transport stream decodes without a single error, while either leg
/// alone would not.
#[test]
fn a_real_encoders_stream_merged_from_two_lossy_legs_decodes_cleanly() {
    if !have_ffmpeg() {
        return;
    }
    let Some(t) = topology() else { return };
    let recording = t.dir.join("encoder.rec");
    let ready = t.dir.join("recorder-ready");
    let recorder = t
        .command(&t.a, &loadgen())
        .args(["legs-recv", "--group", "127.0.0.1:5004", "--payload", "any"])
        .args(["--json", "--record"])
        .arg(&recording)
        .arg("--ready-file")
        .arg(&ready)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn recorder");
    let recorder = ready_or_exit(recorder, &ready, "recorder");
    let status = t
        .command(&t.a, Path::new("ffmpeg"))
        .args(["-hide_banner", "-nostdin", "-loglevel", "error"])
        .args(["-f", "lavfi", "-i", "testsrc=size=320x240:rate=25"])
        .args(["-f", "lavfi", "-i", "sine=frequency=1000:sample_rate=48000"])
        .args(["-t", "3", "-c:v", "mpeg2video", "-b:v", "1M", "-c:a", "mp2"])
        .args([
            "-f",
            "rtp_mpegts",
            "rtp://127.0.0.1:5004?localaddr=127.0.0.1&pkt_size=1328",
        ])
        .status()
        .expect("ffmpeg");
    assert!(status.success(), "ffmpeg failed");
    // Loopback delivered every datagram before ffmpeg exited: the
    // recorder takes what is queued and stops.
    signal(&recorder, libc::SIGTERM);
    let rec = summary(recorder, "recorder");
    let datagrams = fs::File::open(&recording)
        .and_then(mcrelay_loadgen::legs::read_records)
        .expect("recording");
    let count = datagrams.len() as u64;
    assert!(count > 100, "3 s at 1 Mbit/s: {rec}");
    let seqs: Vec<u16> = datagrams
        .iter()
        .map(|d| mcrelay_loadgen::legs::parse_rtp(d).expect("RTP").sequence)
        .collect();
    let first = seqs[0];
    assert!(
        seqs.iter()
            .zip(0u16..)
            .all(|(&s, i)| s == first.wrapping_add(i)),
        "the recording is the whole stream, in order: {rec}"
    );

    // In order for the file (a hold), with room for a stalled sender on
    // a loaded machine: 200 ms against the 20 ms skew.
    let settings = "payload = \"rtp-mpegts\"\nredundancy = \"merge\"\nmerge_delay_ms = 200\nmerge_window_ms = 1000";
    let relay = start(&t, &config(&t, &two_legs(), settings));
    let received = t.dir.join("received.ts");
    let rx = receiver_with(
        &t,
        &[
            "--payload",
            "any",
            "--first-seq",
            &first.to_string(),
            "--expect",
            &count.to_string(),
            "--save-payload",
            received.to_str().expect("utf-8 path"),
        ],
    );
    let tx = sender(
        &t,
        &[
            "--loss",
            "5,5",
            "--delay-ms",
            "0,20",
            "--seed",
            "5",
            "--replay",
            recording.to_str().expect("utf-8 path"),
        ],
    );
    let sent = summary(tx, "sender");
    let got = summary(rx, "receiver");
    assert_eq!(got["ended"], true, "{got}");
    assert_eq!(got["missing"], 0, "{got}");
    assert_eq!(got["duplicates"], 0, "{got}");
    assert_eq!(got["late"], 0, "{got}");
    let errors = decode_errors(&received);
    assert!(
        errors.is_empty(),
        "ffmpeg decoding the relayed stream:\n{errors}"
    );

    // Either leg alone: the decoder notices its 5 % (so the check above
    // can fail).
    let lost0 = leg_list(&sent, 0, "losses");
    assert!(!lost0.is_empty(), "{sent}");
    let alone = t.dir.join("leg0.ts");
    let mut ts = Vec::new();
    for (i, d) in datagrams.iter().enumerate() {
        if lost0.binary_search(&(i as u64)).is_err() {
            let h = mcrelay_loadgen::legs::parse_rtp(d).expect("RTP");
            ts.extend_from_slice(&d[h.payload]);
        }
    }
    fs::write(&alone, ts).expect("write leg 0 alone");
    assert!(
        !decode_errors(&alone).is_empty(),
        "ffmpeg found no error in leg 0 alone"
    );
    relay.stop();
}
