//! Issue 26 with the real daemon: counters that never go down under a
//! reordering stream, a gap no reader hides from another, and a failover
//! between two independent ffmpeg encoders that an ffmpeg receiver
//! decodes straight through with `rtp_rewrite`.
//!
//! ```text
//!  ns A (senders)             ns R (mcrelayd)                    ns B (receiver)
//!  vA1 10.26.1.1 <--veth--> vRA1 10.26.1.2  leg 0: 239.26.1.1:5000
//!  vA2 10.26.3.1 <--veth--> vRA2 10.26.3.2  leg 1: 239.26.3.1:5000
//!                           vRB  10.26.2.1 <--veth--> vB 10.26.2.2   out: 239.26.2.1:5000
//! ```
//!
//! Namespaces are `hl-*`, removed at the end; every packet leaves from
//! inside them.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    Relay, Topology, ctl, leg_toml, loadgen, scrape_in, signal, wait_for_packets_in, wait_until,
};
use serde_json::Value;

const LEG0: &str = "239.26.1.1:5000";
const LEG1: &str = "239.26.3.1:5000";
const OUT: &str = "239.26.2.1:5000";
const METRICS: &str = "127.0.0.1:9466";

fn topology() -> Option<Topology> {
    let t = Topology::two_legs("hl", 26)?;
    // Each leg's group leaves A on its own link (ffmpeg picks the
    // interface by route).
    t.ip(&t.a, &["route", "add", "239.26.1.1/32", "dev", "vA1"]);
    t.ip(&t.a, &["route", "add", "239.26.3.1/32", "dev", "vA2"]);
    Some(t)
}

fn socket(t: &Topology) -> PathBuf {
    t.dir.join("control.sock")
}

/// mcrelayd in R with one flow `f` from `inputs` to OUT, `settings`
/// added; returns once the flow relays.
fn start(t: &Topology, inputs: &str, settings: &str) -> Relay {
    let config = format!(
        "[daemon]\nuser = \"nobody\"\ncontrol_socket = \"{}\"\nmetrics_listen = \"{METRICS}\"\n\n\
         [[flow]]\nname = \"f\"\n{inputs}\noutputs = [{}]\n{settings}\n",
        socket(t).display(),
        leg_toml("vRB", OUT),
    );
    let relay = t.relay(&config, &[]);
    wait_until("flow f relaying", || {
        let s = common::snapshot(&socket(t));
        match s.flow("f") {
            Some(f) if f.state.is_running() => Ok(()),
            _ => Err(format!("{s:?}")),
        }
    });
    relay
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

/// Every `_total` sample of a scrape: series (name and labels) to value.
fn totals(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let name = series.split('{').next()?;
            name.ends_with("_total")
                .then(|| Some((series.to_owned(), value.parse().ok()?)))?
        })
        .collect()
}

fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{series} ")))
        .and_then(|v| v.parse().ok())
}

/// The probe of issue 26: a lossless RTP stream with every 10th datagram
/// 50 numbers late (and, once, 300 numbers not sent: a 300 ms gap), at
/// 1 kpps through one flow, `/metrics` scraped as fast as it answers.
/// No `_total` ever goes down (`rtp_lost_packets_total` went down 12
/// times in 107 scrapes before); the gap is shown to every reader, the
/// control socket's and the scraper's, not only to the first; `lost` is
/// the 300 numbers never sent, nothing of the reordering.
#[test]
fn counters_never_go_down_and_no_reader_hides_a_gap() {
    let Some(t) = topology() else { return };
    const N: u16 = 6000;
    // Every number n with n % 10 == 5 is sent after n + 50.
    let mut order: Vec<u16> = Vec::new();
    for s in 0..N {
        if s % 10 != 5 || s + 50 >= N {
            order.push(s);
        }
        if s >= 55 && s % 10 == 5 {
            order.push(s - 50);
        }
    }
    assert_eq!(order.len(), usize::from(N));
    let recording = t.dir.join("reordered.rec");
    let mut file = Vec::new();
    for &s in &order {
        let mut d = vec![0u8; 200];
        let _ = mcrelay_wire::rtp::build(&mut d, 33, s, u32::from(s) * 90, 0x2626);
        mcrelay_loadgen::legs::write_record(&mut file, &d).expect("record");
    }
    fs::write(&recording, file).expect("write recording");

    let inputs = format!("input = {}", leg_toml("vRA1", LEG0));
    let relay = start(&t, &inputs, "payload = \"rtp\"");
    let mut sender = t
        .command(&t.a, &loadgen())
        .args(["legs", "--json", "--rate", "1000", "--no-end-marker"])
        .args(["--leg", &format!("{LEG0}@vA1")])
        .args(["--gap", "0:3000-3300"])
        .arg("--replay")
        .arg(&recording)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn sender");

    let mut previous: BTreeMap<String, f64> = BTreeMap::new();
    let mut decreases: Vec<String> = Vec::new();
    let mut scrapes = 0u32;
    let mut gap_checked = false;
    let input = format!("{LEG0}@vRA1");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let done = sender.try_wait().expect("try_wait").is_some();
        let m = scrape_in(&t.r, METRICS);
        let now = totals(&m);
        for (series, v) in &now {
            if let Some(&before) = previous.get(series)
                && *v < before
            {
                decreases.push(format!("{series}: {before} -> {v}"));
            }
        }
        previous = now;
        scrapes += 1;
        // Past the gap, arrivals going on: every reader sees it.
        let packets = sample(
            &m,
            &format!("mcrelay_input_rtp_packets_total{{flow=\"f\",input=\"{input}\"}}"),
        )
        .unwrap_or(0.0);
        if !gap_checked && (3500.0..5000.0).contains(&packets) {
            for _ in 0..2 {
                let s = stats(&t);
                let gap = flow(&s)["health"]["max_gap_ns"].as_u64().unwrap_or(0);
                assert!(gap >= 250_000_000, "the control socket's read: {gap} ns");
            }
            let gap = sample(
                &scrape_in(&t.r, METRICS),
                &format!("mcrelay_input_max_gap_seconds{{flow=\"f\",input=\"{input}\"}}"),
            )
            .unwrap_or(0.0);
            assert!(gap >= 0.25, "the scraper after two control reads: {gap} s");
            gap_checked = true;
        }
        if done {
            break;
        }
        assert!(Instant::now() < deadline, "the sender never finished");
    }
    let out = sender.wait_with_output().expect("sender");
    assert!(out.status.success(), "sender failed");
    assert!(gap_checked, "never saw the stream past its gap");
    assert!(scrapes > 20, "{scrapes} scrapes");
    assert!(decreases.is_empty(), "counters went down: {decreases:?}");
    // The numbers never sent are lost once the input settles; the late
    // ones are reordered, never lost, those of the run the gap jumped
    // over included. One more is lost: the first datagram after the gap
    // (3255, one of the late ones) is a jump its successor (3306) does
    // not confirm, a stray to the sequence engine, as it is to merge
    // and failover.
    wait_until(
        "lost settled at the 300 unsent numbers and the stray",
        || {
            let s = stats(&t);
            let rtp = &flow(&s)["health"]["rtp"];
            match (rtp["lost"].as_u64(), rtp["reordered"].as_u64()) {
                (Some(301), Some(r)) if r > 500 => Ok(()),
                _ => Err(format!("{rtp}")),
            }
        },
    );
    relay.stop();
}

/// ffmpeg on PATH, or a message saying why the test is skipped.
fn have_ffmpeg() -> bool {
    let ok = [("ffmpeg", "-version"), ("iptables", "--version")]
        .iter()
        .all(|(p, v)| {
            Command::new(p)
                .arg(v)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
    if !ok {
        eprintln!(
            "SKIPPED: ffmpeg or iptables is not installed (CI installs them: .ci/steps/25-stream-health.sh)"
        );
    }
    ok
}

/// An ffmpeg encoder in A: MPEG-TS in RTP (each its own SSRC, sequence
/// numbers and timestamps), 25 intra-only frames a second, to `group` on
/// the leg's link, until [`stop_encoder`] (or 120 s, should the test
/// fail before it).
fn encoder(t: &Topology, group: &str, local: &str) -> Child {
    t.command(&t.a, Path::new("ffmpeg"))
        .args(["-hide_banner", "-nostdin", "-loglevel", "error", "-re"])
        .args([
            "-f",
            "lavfi",
            "-i",
            "testsrc=size=320x240:rate=25:duration=120",
        ])
        .args(["-c:v", "mpeg2video", "-g", "1", "-b:v", "2M"])
        .args([
            "-f",
            "rtp_mpegts",
            &format!("rtp://{group}?localaddr={local}&ttl=8&pkt_size=1328"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ffmpeg encoder")
}

/// Stop an [`encoder`] (SIGTERM: ffmpeg exits with 255); it must not
/// have failed before.
fn stop_encoder(e: Child, what: &str) {
    signal(&e, libc::SIGTERM);
    let out = e.wait_with_output().expect(what);
    assert!(
        out.status.success() || out.status.code() == Some(255),
        "{what}: {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The ffmpeg receiver in B: RTP via an SDP file, decoded, each frame
/// counted (`-progress`), until it gets SIGTERM.
fn decoder(t: &Topology) -> (Child, PathBuf) {
    let (addr, port) = OUT.split_once(':').expect("group:port");
    let sdp = t.dir.join("out.sdp");
    fs::write(
        &sdp,
        format!(
            "v=0\r\no=- 0 0 IN IP4 10.26.2.2\r\ns=mcrelay\r\nc=IN IP4 {addr}/16\r\nt=0 0\r\n\
             m=video {port} RTP/AVP 33\r\na=rtpmap:33 MP2T/90000\r\n"
        ),
    )
    .expect("write sdp");
    let progress = t.dir.join("progress.txt");
    let _ = fs::remove_file(&progress);
    let child = t
        .command(&t.b, Path::new("ffmpeg"))
        .args(["-hide_banner", "-nostdin", "-loglevel", "warning"])
        .args(["-protocol_whitelist", "file,udp,rtp"])
        // Room for seconds of the stream (the kernel caps it at
        // `rmem_max`): on a loaded machine the receiver may get no CPU
        // for a while, and what is counted is the relay's delivery.
        .args(["-buffer_size", "4194304"])
        .arg("-i")
        .arg(&sdp)
        .args(["-map", "0:v", "-fps_mode", "passthrough", "-f", "null", "-"])
        .arg("-progress")
        .arg(&progress)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ffmpeg receiver");
    (child, progress)
}

/// The last `frame=` the receiver reported.
fn frames(progress: &Path) -> u64 {
    fs::read_to_string(progress)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("frame="))
        .filter_map(|v| v.trim().parse().ok())
        .next_back()
        .unwrap_or(0)
}

/// With `MCRELAY_GST_RECEIVER=1` (a measurement, not run in CI): a
/// GStreamer receiver in B beside ffmpeg (RTP jitter buffer, MP2T depay,
/// TS demux, MPEG-2 decode), printing each decoded frame; `None` when the
/// variable is unset or an element is missing.
fn gst_decoder(t: &Topology) -> Option<(Child, PathBuf)> {
    std::env::var_os("MCRELAY_GST_RECEIVER")?;
    let elements = [
        "udpsrc",
        "rtpjitterbuffer",
        "rtpmp2tdepay",
        "tsdemux",
        "mpeg2dec",
    ];
    if !elements.iter().all(|e| {
        Command::new("gst-inspect-1.0")
            .arg(e)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }) {
        eprintln!("MCRELAY_GST_RECEIVER: a GStreamer element is missing ({elements:?})");
        return None;
    }
    let (addr, port) = OUT.split_once(':').expect("group:port");
    let log = t.dir.join("gst-frames.txt");
    let child = t
        .command(&t.b, Path::new("gst-launch-1.0"))
        .args([
            "-v",
            "udpsrc",
            &format!("address={addr}"),
            &format!("port={port}"),
        ])
        .arg("caps=application/x-rtp,media=video,clock-rate=90000,encoding-name=MP2T,payload=33")
        .args(["!", "rtpjitterbuffer", "latency=200", "!", "rtpmp2tdepay"])
        .args(["!", "tsdemux", "!", "mpegvideoparse", "!", "mpeg2dec"])
        .args(["!", "fakesink", "silent=false"])
        .stdout(fs::File::create(&log).expect("gst log"))
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn gst-launch-1.0");
    Some((child, log))
}

/// Frames the GStreamer receiver decoded (its fakesink's chain lines).
fn gst_frames(log: &Path) -> u64 {
    let n = fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("fakesink") && l.contains("chain"))
        .count();
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// Leg 0's datagrams dropped (`true`) or let through as they reach R
/// (the encoder goes on sending: dropped at A it would see EPERM).
fn cut_leg0(t: &Topology, cut: bool) {
    let op = if cut { "-I" } else { "-D" };
    t.iptables(&t.r, &[op, "INPUT", "-i", "vRA1", "-j", "DROP"]);
}

/// How many sockets in `ns` have joined `group` (its users in
/// `/proc/net/igmp`, where the address is the `u32` of its bytes, in
/// hex).
fn joined(t: &Topology, ns: &str, group: &str) -> u32 {
    let ip: std::net::Ipv4Addr = group.parse().expect("an IPv4 group");
    let hex = format!("{:08X}", u32::from_le_bytes(ip.octets()));
    let out = t
        .command(ns, Path::new("cat"))
        .arg("/proc/net/igmp")
        .output()
        .expect("read /proc/net/igmp");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next()? == hex).then(|| w.next()?.parse().ok())?
        })
        .unwrap_or(0)
}

/// Bytes waiting in the receive queues of the UDP sockets bound to
/// `port` in `ns` (`/proc/net/udp`: `tx_queue:rx_queue` in hex).
fn udp_queued(t: &Topology, ns: &str, port: u16) -> u64 {
    let out = t
        .command(ns, Path::new("cat"))
        .arg("/proc/net/udp")
        .output()
        .expect("read /proc/net/udp");
    let local = format!(":{port:04X}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let _slot = w.next()?;
            let bound = w.next()?;
            let queues = w.nth(2)?;
            bound.ends_with(&local).then_some(queues)
        })
        .filter_map(|q| u64::from_str_radix(q.split_once(':')?.1, 16).ok())
        .sum()
}

/// What the relay sent, read from a recording of its output
/// (`legs-recv --record`): datagrams, SSRCs, the times a sequence number
/// was not the previous one plus one, and the video frames the MPEG-TS
/// payload starts (transport packets with the payload unit start
/// indicator whose payload opens a video PES packet, `00 00 01 E0`-`EF`;
/// ffmpeg's muxer puts each frame in a PES packet of its own).
#[derive(Debug, Default)]
struct Sent {
    datagrams: u64,
    ssrcs: std::collections::BTreeSet<u32>,
    seq_breaks: u64,
    frames: u64,
}

fn sent_by_relay(recording: &Path) -> Sent {
    let file = fs::File::open(recording).expect("open the output recording");
    let datagrams = mcrelay_loadgen::legs::read_records(std::io::BufReader::new(file))
        .expect("read the output recording");
    let mut sent = Sent::default();
    let mut previous: Option<u16> = None;
    for d in &datagrams {
        let h = mcrelay_wire::rtp::parse(d).expect("the relay sent RTP");
        sent.datagrams += 1;
        sent.ssrcs.insert(h.ssrc);
        if previous.is_some_and(|p| h.sequence != p.wrapping_add(1)) {
            sent.seq_breaks += 1;
        }
        previous = Some(h.sequence);
        let ts = d.get(h.payload.clone()).unwrap_or_default();
        for p in ts.chunks_exact(188) {
            let start = match (p[1] & 0x40 != 0, (p[3] >> 4) & 3) {
                (true, 1) => 4,
                (true, 3) => 5 + usize::from(p[4]),
                _ => continue,
            };
            if p.get(start..start + 4)
                .is_some_and(|pes| pes[..3] == [0, 0, 1] && (0xe0..=0xef).contains(&pes[3]))
            {
                sent.frames += 1;
            }
        }
    }
    sent
}

/// One failover run's outcome.
struct Run {
    /// Frames the ffmpeg receiver decoded.
    decoded: u64,
    /// What the relay sent, recorded beside the receiver.
    sent: Sent,
    switches: u64,
    /// The flow's `redundancy` object at the end.
    redundancy: Value,
    /// What the ffmpeg receiver said.
    receiver: String,
}

/// One run, every step taken on an event the relay reports, none on the
/// clock: encoder 0 on leg 0 until the relay has forwarded 250 of its
/// datagrams (over a second of frames), encoder 1 on leg 1 until 100 are
/// on standby; leg 0 cut until the relay has failed over and forwarded
/// 250 of leg 1's, then let through again until the relay has reverted
/// and forwarded 250 more of leg 0's; encoder 1 stopped, then encoder 0
/// (no switch at the end). In B, the ffmpeg receiver and, beside it, a
/// recorder of the output, both joined before the first datagram.
fn failover_run(rtp_rewrite: bool) -> Run {
    let t = topology().expect("root, checked by the caller");
    let inputs = format!(
        "inputs = [{}, {}]",
        leg_toml("vRA1", LEG0),
        leg_toml("vRA2", LEG1)
    );
    // Detection exactly 300 ms (`failover_gap_factor = 0`): what is
    // measured here is the switch itself, not the adaptive detection.
    let settings = format!(
        "payload = \"rtp-mpegts\"\nredundancy = \"failover\"\nfailover_after_ms = 300\nfailover_gap_factor = 0\nrevert_after_s = 1\nrtp_rewrite = {rtp_rewrite}"
    );
    let relay = start(&t, &inputs, &settings);
    let recording = t.dir.join("out.rec");
    let ready = t.dir.join("recorder-ready");
    let recorder = t
        .command(&t.b, &loadgen())
        .args(["legs-recv", "--group", OUT, "--interface", "vB", "--json"])
        .args(["--payload", "any", "--duration", "600"])
        .args(["--rcvbuf", common::RECEIVER_RCVBUF])
        .arg("--record")
        .arg(&recording)
        .arg("--ready-file")
        .arg(&ready)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the recorder");
    let (rx, progress) = decoder(&t);
    let gst = gst_decoder(&t);
    let receivers = 2 + u32::from(gst.is_some());
    let group = OUT.split_once(':').expect("group:port").0;
    wait_until("the receivers joined the output group", || {
        match joined(&t, &t.b, group) {
            n if n >= receivers && ready.exists() => Ok(()),
            n => Err(format!("{n} of {receivers} joined")),
        }
    });
    let leg = |s: &Value, i: usize, key: &str| {
        flow(s)["redundancy"]["legs"][i][key].as_u64().unwrap_or(0)
    };
    let active = |s: &Value| flow(s)["redundancy"]["active_input"].as_u64();
    let switches = |s: &Value| flow(s)["redundancy"]["switches"].as_u64().unwrap_or(0);
    let wait_for = |what: &str, done: &dyn Fn(&Value) -> bool| -> Value {
        wait_until(what, || {
            let s = stats(&t);
            if done(&s) {
                Ok(s)
            } else {
                Err(format!("{}", flow(&s)["redundancy"]))
            }
        })
    };
    let enc0 = encoder(&t, LEG0, "10.26.1.1");
    wait_for("leg 0 forwarded", &|s| leg(s, 0, "forwarded") >= 250);
    let enc1 = encoder(&t, LEG1, "10.26.3.1");
    wait_for("leg 1 on standby", &|s| leg(s, 1, "standby") >= 100);
    cut_leg0(&t, true);
    let s = wait_for("the failover to leg 1", &|s| active(s) == Some(1));
    let from = leg(&s, 1, "forwarded");
    wait_for("leg 1 forwarded", &|s| leg(s, 1, "forwarded") >= from + 250);
    cut_leg0(&t, false);
    let s = wait_for("the revert to leg 0", &|s| {
        active(s) == Some(0) && switches(s) >= 2
    });
    let from = leg(&s, 0, "forwarded");
    wait_for("leg 0 forwarded again", &|s| {
        leg(s, 0, "forwarded") >= from + 250
    });
    stop_encoder(enc1, "encoder 1");
    stop_encoder(enc0, "encoder 0");
    // The relay has sent all it took in: its input sockets are empty and
    // every datagram it forwarded has left (a send completes once the
    // datagram is in the receivers' queues); then the recorder, told to
    // stop, drains its queue.
    wait_until("the relay drained", || {
        let s = stats(&t);
        let f = flow(&s);
        let forwarded = leg(&s, 0, "forwarded") + leg(&s, 1, "forwarded");
        let out = f["outputs"][0]["packets_out"].as_u64().unwrap_or(0);
        let queued = udp_queued(&t, &t.r, 5000);
        if out == forwarded && queued == 0 {
            Ok(())
        } else {
            Err(format!(
                "{out} out of {forwarded} forwarded, {queued} bytes queued"
            ))
        }
    });
    let recorded = receiver_summary_after_term(recorder);
    assert_eq!(
        recorded["kernel_drops"], 0,
        "the recorder missed some of the output: {recorded}"
    );
    let sent = sent_by_relay(&recording);
    // The receiver has decoded what it can of that (all but the last two
    // frames, which it holds; see the test), however far behind the load
    // left it; or its count has stood still for 10 s.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = (frames(&progress), Instant::now());
    while last.0 + 2 < sent.frames
        && last.1.elapsed() < Duration::from_secs(10)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(100));
        let n = frames(&progress);
        if n != last.0 {
            last = (n, Instant::now());
        }
    }
    signal(&rx, libc::SIGTERM);
    let out = rx.wait_with_output().expect("receiver");
    let receiver = String::from_utf8_lossy(&out.stderr).into_owned();
    if let Some((mut g, log)) = gst {
        let _ = g.kill();
        let _ = g.wait();
        eprintln!(
            "rtp_rewrite = {rtp_rewrite}: GStreamer decoded {} frames",
            gst_frames(&log)
        );
    }
    let s = stats(&t);
    let redundancy = flow(&s)["redundancy"].clone();
    let run = Run {
        decoded: frames(&progress),
        sent,
        switches: switches(&s),
        redundancy,
        receiver,
    };
    eprintln!(
        "rtp_rewrite = {rtp_rewrite}: {} frames decoded of {:?} sent by the relay, {} switches; redundancy: {}; receiver said:\n{}",
        run.decoded, run.sent, run.switches, run.redundancy, run.receiver
    );
    relay.stop();
    run
}

/// A receiver's summary once it has been told to stop (SIGTERM).
fn receiver_summary_after_term(rx: Child) -> Value {
    signal(&rx, libc::SIGTERM);
    receiver_summary(rx)
}

/// Main and backup from two independent encoders (different SSRCs,
/// numbering and timestamps), a failover and a revert. With
/// `rtp_rewrite` the output is one RTP stream (one SSRC, every number
/// the previous one plus one) and the ffmpeg receiver decodes it
/// straight through: no packet dropped as too late, none missed, every
/// frame the relay sent decoded but the one each switch cuts short and
/// the last two (which ffmpeg holds until a next one that never comes).
/// Without it, it drops the backup's packets as too late after the
/// switch (measured, not asserted: the figure is in the log).
///
/// Every step waits on the relay's counters, not the clock, and the
/// frames are counted against what the relay sent (recorded beside the
/// receiver), not against what the encoders made: on a loaded machine
/// the encoders run late and in bursts, and how many frames 300 ms of
/// detection costs depends on that, not on the relay.
#[test]
fn ffmpeg_decodes_straight_through_a_failover_with_rtp_rewrite() {
    if !common::is_root() {
        eprintln!("SKIPPED: namespace tests need root (CI runs them as root)");
        return;
    }
    if !have_ffmpeg() {
        return;
    }
    let with = failover_run(true);
    // A failover and a revert (two more for every time an encoder,
    // starved of CPU, fell silent past the detection time: a real
    // outage to the relay).
    assert!(with.switches >= 2, "{} switches", with.switches);
    assert_eq!(with.redundancy["late"], 0, "{}", with.redundancy);
    assert_eq!(with.redundancy["duplicates"], 0, "{}", with.redundancy);
    assert_eq!(with.sent.ssrcs.len(), 1, "one SSRC out: {:?}", with.sent);
    assert_eq!(with.sent.seq_breaks, 0, "numbers continue: {:?}", with.sent);
    for said in ["too late", "missed"] {
        assert!(
            !with.receiver.contains(said),
            "the receiver said {said:?}:\n{}",
            with.receiver
        );
    }
    // The last two frames are never decoded: the TS demuxer holds the
    // last PES packet and the MPEG-2 parser the frame before it until a
    // next one starts, which never comes. Each switch cuts a frame short
    // (the dead leg's last frame ends where the leg died, the new leg's
    // datagrams join it mid-frame): decoded damaged (measured), or not at
    // all.
    let allowed = 2 + with.switches;
    assert!(
        with.decoded <= with.sent.frames && with.decoded + allowed >= with.sent.frames,
        "with rtp_rewrite {} frames decoded of {} sent ({} switches)",
        with.decoded,
        with.sent.frames,
        with.switches
    );
    let without = failover_run(false);
    assert!(without.switches >= 2, "{} switches", without.switches);
    eprintln!(
        "frames decoded: {} of {} with rtp_rewrite, {} of {} without",
        with.decoded, with.sent.frames, without.decoded, without.sent.frames
    );
}

// The fault rows of issue 26, one leg misbehaving while the other is
// clean, 1 kpps RTP. Each leg is played by its own `loadgen legs
// --replay` of a recording made here, so the legs can differ in any
// header field; both start together.

/// A recording of RTP datagrams with these (sequence number, SSRC).
fn recording(t: &Topology, name: &str, seqs: &[(u16, u32)]) -> PathBuf {
    let path = t.dir.join(name);
    let mut file = Vec::new();
    for &(s, ssrc) in seqs {
        let mut d = vec![0u8; 200];
        let _ = mcrelay_wire::rtp::build(&mut d, 33, s, u32::from(s) * 90, ssrc);
        mcrelay_loadgen::legs::write_record(&mut file, &d).expect("record");
    }
    fs::write(&path, file).expect("write recording");
    path
}

/// The receiver in B: `legs-recv --payload any`, numbers counted from
/// 0, `expect` of them; joined before this returns.
fn legs_receiver(t: &Topology, expect: u64) -> Child {
    let ready = t.dir.join("receiver-ready");
    let _ = fs::remove_file(&ready);
    let mut child = t
        .command(&t.b, &loadgen())
        .args(["legs-recv", "--group", OUT, "--interface", "vB", "--json"])
        .args(["--payload", "any", "--first-seq", "0"])
        .args(["--expect", &expect.to_string(), "--duration", "60"])
        .args(["--rcvbuf", common::RECEIVER_RCVBUF])
        .arg("--ready-file")
        .arg(&ready)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn receiver");
    wait_until("the receiver ready", || {
        if ready.exists() {
            Ok(())
        } else if let Some(status) = child.try_wait().expect("try_wait") {
            panic!("the receiver exited ({status}) before it was ready");
        } else {
            Err("no ready file".into())
        }
    });
    std::thread::sleep(Duration::from_millis(50));
    child
}

/// Both legs played at once, leg `i` from `legs[i]`; waits for both.
fn play(t: &Topology, legs: [&[(u16, u32)]; 2]) {
    let senders: Vec<Child> = legs
        .iter()
        .zip([(LEG0, "vA1"), (LEG1, "vA2")])
        .enumerate()
        .map(|(i, (seqs, (group, dev)))| {
            let rec = recording(t, &format!("leg{i}.rec"), seqs);
            t.command(&t.a, &loadgen())
                .args(["legs", "--json", "--rate", "1000"])
                .args(["--leg", &format!("{group}@{dev}")])
                .arg("--replay")
                .arg(&rec)
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn sender")
        })
        .collect();
    for s in senders {
        let out = s.wait_with_output().expect("sender");
        assert!(out.status.success(), "sender failed");
    }
}

fn receiver_summary(rx: Child) -> Value {
    let out = rx.wait_with_output().expect("receiver");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "receiver failed: {text}");
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn two_legs() -> String {
    format!(
        "inputs = [{}, {}]",
        leg_toml("vRA1", LEG0),
        leg_toml("vRA2", LEG1)
    )
}

const MERGE: &str = "payload = \"rtp\"\nredundancy = \"merge\"\nmerge_window_ms = 100";
const FAILOVER: &str = "payload = \"rtp\"\nredundancy = \"failover\"\nfailover_after_ms = 300";
const SSRC_A: u32 = 0x2626_000a;
const SSRC_B: u32 = 0x2626_000b;

fn stream(n: u16, ssrc: u32) -> Vec<(u16, u32)> {
    (0..n).map(|s| (s, ssrc)).collect()
}

/// `stream(n)` with one stray datagram, numbered `ahead` past the one
/// before it, after number `at`.
fn with_stray(n: u16, ssrc: u32, at: u16, ahead: u16) -> Vec<(u16, u32)> {
    let mut v = stream(n, ssrc);
    v.insert(usize::from(at) + 1, (at.wrapping_add(ahead), ssrc));
    v
}

/// Row 1: one datagram numbered current + 2000 on one leg of a merge.
/// Before: the output fell silent 1.95 s and 1950 numbers were missing.
/// Now: nothing missing, nothing twice.
#[test]
fn a_stray_jump_on_one_merge_leg_costs_the_output_nothing() {
    let Some(t) = topology() else { return };
    let relay = start(&t, &two_legs(), MERGE);
    let rx = legs_receiver(&t, 3000);
    play(
        &t,
        [&stream(3000, SSRC_A), &with_stray(3000, SSRC_A, 1500, 2000)],
    );
    let got = receiver_summary(rx);
    assert_eq!(got["ended"], true, "{got}");
    assert_eq!(got["missing"], 0, "{got}");
    assert_eq!(got["duplicates"], 0, "{got}");
    relay.stop();
}

/// Row 2: the same on the active leg of a failover. Before: 1.94 s
/// silent, no switch. Now: nothing missing.
#[test]
fn a_stray_jump_on_the_active_failover_leg_costs_the_output_nothing() {
    let Some(t) = topology() else { return };
    let relay = start(&t, &two_legs(), FAILOVER);
    let rx = legs_receiver(&t, 3000);
    play(
        &t,
        [&with_stray(3000, SSRC_A, 1500, 2000), &stream(3000, SSRC_A)],
    );
    let got = receiver_summary(rx);
    assert_eq!(got["ended"], true, "{got}");
    assert_eq!(got["missing"], 0, "{got}");
    assert_eq!(got["duplicates"], 0, "{got}");
    relay.stop();
}

/// Row 3: legs with different SSRCs, the same numbering: merged, not
/// doubled (before: 17 000 out for 10 000 sent).
#[test]
fn legs_differing_only_in_ssrc_merge_into_one_stream() {
    let Some(t) = topology() else { return };
    let relay = start(&t, &two_legs(), MERGE);
    let rx = legs_receiver(&t, 3000);
    play(&t, [&stream(3000, SSRC_A), &stream(3000, SSRC_B)]);
    let got = receiver_summary(rx);
    assert_eq!(got["ended"], true, "{got}");
    assert_eq!(got["missing"], 0, "{got}");
    assert_eq!(got["duplicates"], 0, "{got}");
    let s = stats(&t);
    let out = flow(&s)["outputs"][0]["packets_out"].as_u64().unwrap_or(0);
    assert!(out <= 3001, "{out} datagrams out for 3000 numbers: {s}");
    relay.stop();
}

/// Row 4: one leg later than the window (5 s behind, window 1 s):
/// its copies are late and dropped, never sent a second time (before:
/// every number went out twice and `duplicates` said 0).
#[test]
fn a_leg_later_than_the_window_sends_nothing_twice() {
    let Some(t) = topology() else { return };
    // A window of 1 s (the issue's second case), still 4 s short of the
    // late leg's lateness: a leg silent for a window while another
    // carries a numbering of its own is a restart to the sequence engine,
    // and at 100 ms a stall of leg 0's sender on a loaded machine was
    // enough (once in 4 loaded runs, 99 numbers short).
    let relay = start(
        &t,
        &two_legs(),
        "payload = \"rtp\"\nredundancy = \"merge\"\nmerge_window_ms = 1000",
    );
    let rx = legs_receiver(&t, 11_000);
    // Leg 1 starts 5 s after leg 0, its own sender started late, and
    // ends while leg 0 still sends: all the while 5000 numbers behind.
    // (When the on-time leg stops first, what the late one sends next is
    // another matter: after the window with no other leg, a restart, the
    // engine's call. Leg 0 used to stop after exactly 11 000 numbers, so
    // a leg-1 sender that started a moment more than 5 s after leg 0's
    // outlived it on a loaded machine, and its last numbers went out
    // again, counted as duplicates.) Leg 0 is stopped once the relay has
    // taken in all of leg 1 and sent numbers 0 to 11 000.
    let rec0 = recording(&t, "leg0.rec", &stream(40_000, SSRC_A));
    let rec1 = recording(&t, "leg1.rec", &stream(6000, SSRC_A));
    let spawn = |group: &str, dev: &str, rec: &Path| {
        t.command(&t.a, &loadgen())
            .args(["legs", "--json", "--rate", "1000", "--no-end-marker"])
            .args(["--leg", &format!("{group}@{dev}")])
            .arg("--replay")
            .arg(rec)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn sender")
    };
    let s0 = spawn(LEG0, "vA1", &rec0);
    std::thread::sleep(Duration::from_millis(5000));
    let s1 = spawn(LEG1, "vA2", &rec1);
    assert!(s1.wait_with_output().expect("sender").status.success());
    wait_until("leg 1 taken in and numbers to 11 000 sent", || {
        let s = stats(&t);
        let f = flow(&s);
        let leg1 = f["redundancy"]["legs"][1]["health"]["rtp"]["packets"].as_u64();
        let out = f["outputs"][0]["packets_out"].as_u64();
        match (leg1, out) {
            (Some(6000..), Some(11_000..)) => Ok(()),
            _ => Err(format!("leg 1 {leg1:?} in, {out:?} out: {f}")),
        }
    });
    let sent0 = common::stop_sender(s0);
    // The relay has taken in every datagram and sent every number leg 0
    // sent (a send completes once the datagram is in the receiver's
    // queue, which the receiver drains when told to stop), however far
    // behind the load left it: a fixed wait let a late relay's tail count
    // as missing. Anything sent twice has been sent by then too.
    wait_for_packets_in(&socket(&t), "f", sent0 + 6000);
    wait_until("every number sent", || {
        let s = stats(&t);
        match flow(&s)["outputs"][0]["packets_out"].as_u64() {
            Some(out) if out >= sent0 => Ok(()),
            out => Err(format!("{out:?} out of {sent0}: {}", flow(&s))),
        }
    });
    signal(&rx, libc::SIGTERM);
    let got = receiver_summary(rx);
    assert_eq!(got["missing"], 0, "{got}");
    assert_eq!(got["duplicates"], 0, "{got}");
    relay.stop();
}

/// Row 5: an encoder restart keeping its SSRC, numbering 1000 back, on
/// both legs (merge and failover): the new numbering goes out within a
/// few packets (before: 1000 datagrams dropped as duplicates).
#[test]
fn an_encoder_restart_numbering_back_goes_out() {
    let Some(t) = topology() else { return };
    for settings in [MERGE, FAILOVER] {
        let relay = start(&t, &two_legs(), settings);
        let mut seqs = stream(2000, SSRC_A);
        seqs.extend((1000..3000).map(|s| (s, SSRC_A)));
        play(&t, [&seqs, &seqs]);
        let s = wait_until("the output settled", || {
            let s = stats(&t);
            let out = flow(&s)["outputs"][0]["packets_out"].as_u64().unwrap_or(0);
            if out >= 4000 - 10 {
                Ok(s)
            } else {
                Err(format!("{out} out: {s}"))
            }
        });
        let out = flow(&s)["outputs"][0]["packets_out"].as_u64().unwrap_or(0);
        assert!(
            (4000 - 10..=4002).contains(&out),
            "{settings}: {out} out for 4000 datagrams a leg"
        );
        relay.stop();
        let _ = fs::remove_file(socket(&t));
    }
}
