//! Stream health with the real daemon in network namespaces (A sends, R
//! relays, see tests/common): streams with planted faults give exactly
//! those counts in `mcrelayctl stats --json` and on `/metrics`; an input
//! that stops goes silent within `silence_ms` + 100 ms and active again
//! when it resumes; a real encoder's stream (ffmpeg `-f rtp_mpegts`)
//! relayed through the daemon shows zero errors.
//!
//! The crafted streams are sent by a thread of this test that has entered
//! A's network namespace (`setns`), from a socket bound to A's address.

mod common;

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Topology, ctl, in_netns, scrape_in, stats_json};
use mcrelay_wire::{rtp, ts};

const METRICS: &str = "10.10.1.2:9464";

/// A socket in A, bound to A's address, sending multicast out of vA.
fn sender() -> UdpSocket {
    let s = UdpSocket::bind("10.10.1.1:0").expect("bind in A");
    let sock = socket2::SockRef::from(&s);
    sock.set_multicast_if_v4(&Ipv4Addr::new(10, 10, 1, 1))
        .expect("IP_MULTICAST_IF");
    s
}

/// Send `datagrams` from A to `group`:5000, 200 µs apart.
fn send_from_a(t: &Topology, group: Ipv4Addr, datagrams: Vec<Vec<u8>>) {
    in_netns(&t.a, move || {
        let s = sender();
        for d in &datagrams {
            s.send_to(d, SocketAddrV4::new(group, 5000)).expect("send");
            std::thread::sleep(Duration::from_micros(200));
        }
    });
}

fn stats(socket: &Path) -> serde_json::Value {
    stats_json(socket)
}

fn flow<'a>(s: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    s["flows"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["name"] == name))
        .unwrap_or_else(|| panic!("no flow {name} in {s}"))
}

/// Poll `stats --json` until flow `name` has received `packets`.
fn wait_for_packets(socket: &Path, name: &str, packets: u64) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = stats(socket);
        if flow(&s, name)["packets_in"].as_u64() >= Some(packets) {
            return s;
        }
        assert!(Instant::now() < deadline, "flow {name} stuck: {s}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `/metrics` of the daemon in R, fetched from inside R.
fn metrics(t: &Topology) -> String {
    scrape_in(&t.r, METRICS)
}

/// The value of `name{flow="flow",input="input"}` in `text`.
fn metric(text: &str, name: &str, flow: &str, input: &str) -> f64 {
    let key = format!("{name}{{flow=\"{flow}\",input=\"{input}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in:\n{text}"))
}

fn config(extra_flows: &str) -> String {
    format!("metrics_listen = \"{METRICS}\"\n{extra_flows}")
}

fn flow_toml(name: &str, group: &str, out: &str, settings: &str) -> String {
    format!(
        "\n[[flow]]\nname = \"{name}\"\ninput = {{ interface = \"vRA\", address = \"{group}\", port = 5000 }}\n\
         outputs = [{{ interface = \"vRB\", address = \"{out}\", port = 5000 }}]\n{settings}\n"
    )
}

/// The daemon section with metrics, then `flows`.
fn daemon_config(t: &Topology, flows: &str) -> String {
    format!(
        "[daemon]\nuser = \"nobody\"\ncontrol_socket = \"{}\"\n{}",
        t.dir.join("control.sock").display(),
        config(flows)
    )
}

fn rtp_datagram(seq: u16, ssrc: u32) -> Vec<u8> {
    let mut d = vec![0u8; 12 + 7 * ts::PACKET];
    let _ = rtp::build(&mut d, 33, seq, u32::from(seq) * 900, ssrc);
    for (i, p) in d[12..].chunks_exact_mut(ts::PACKET).enumerate() {
        let cc = (u32::from(seq) * 7 + u32::try_from(i).unwrap()) % 16;
        ts::build(p, 0x100, u8::try_from(cc).unwrap(), true, None);
    }
    d
}

#[test]
fn planted_faults_are_counted_exactly_and_silence_is_seen() {
    let Some(t) = Topology::new() else { return };
    let flows = [
        flow_toml("rtp", "239.9.1.1", "239.9.2.1", "payload = \"rtp\""),
        flow_toml("ts", "239.9.1.2", "239.9.2.2", "payload = \"mpegts\""),
        flow_toml(
            "quiet",
            "239.9.1.3",
            "239.9.2.3",
            "payload = \"rtp-mpegts\"\nsilence_ms = 300",
        ),
    ]
    .concat();
    let relay = t.relay(&daemon_config(&t, &flows), &[]);
    let socket = t.dir.join("control.sock");

    // RTP: 0..=99 clean; 100 and 101 lost; 110 twice; 121 before 120;
    // then a new SSRC from 5000.
    let mut seqs: Vec<(u16, u32)> = Vec::new();
    for s in 0..=99 {
        seqs.push((s, 1));
    }
    for s in 102..=150u16 {
        match s {
            110 => seqs.extend([(110, 1), (110, 1)]),
            120 => seqs.push((121, 1)),
            121 => seqs.push((120, 1)),
            s => seqs.push((s, 1)),
        }
    }
    for s in 5000..5050 {
        seqs.push((s, 2));
    }
    let sent = seqs.len() as u64;
    send_from_a(
        &t,
        Ipv4Addr::new(239, 9, 1, 1),
        seqs.iter()
            .map(|&(s, ssrc)| rtp_datagram(s, ssrc))
            .collect(),
    );

    // TS: 7 packets a datagram on PID 0x100 and null packets, with
    // planted continuity faults: a skip (error), one repeat (allowed), an
    // adaptation-only packet with a stray counter (ignored), a packet
    // three times (one error), a jump flagged as a discontinuity (none).
    let mut packets: Vec<[u8; ts::PACKET]> = Vec::new();
    let mut push = |pid: u16, cc: u8, payload: bool, af: Option<u8>| {
        let mut p = [0xffu8; ts::PACKET];
        ts::build(&mut p, pid, cc, payload, af);
        packets.push(p);
    };
    let mut cc = 0u8;
    for i in 0..200u32 {
        match i {
            50 => cc = (cc + 2) & 15,                             // skip: error
            80 => push(0x100, cc, true, None),                    // repeat once: allowed
            100 => push(0x100, (cc + 9) & 15, false, Some(0x10)), // adaptation only
            120 => {
                push(0x100, cc, true, None);
                push(0x100, cc, true, None); // third time: error
            }
            150 => {
                cc = (cc + 7) & 15;
                push(0x100, cc, true, Some(0x80)); // discontinuity: fine
            }
            _ => {}
        }
        cc = (cc + 1) & 15;
        push(0x100, cc, true, None);
        if i % 10 == 0 {
            push(ts::NULL_PID, u8::try_from(i % 16).unwrap(), true, None);
        }
    }
    let ts_datagrams: Vec<Vec<u8>> = packets
        .chunks(7)
        .filter(|c| c.len() == 7)
        .map(|c| c.concat())
        .collect();
    let ts_sent = ts_datagrams.len() as u64;
    send_from_a(&t, Ipv4Addr::new(239, 9, 1, 2), ts_datagrams);

    wait_for_packets(&socket, "rtp", sent);
    let s = wait_for_packets(&socket, "ts", ts_sent);
    let rtp = &flow(&s, "rtp")["health"]["rtp"];
    assert_eq!(rtp["packets"], sent, "{rtp}");
    assert_eq!(rtp["lost"], 2, "{rtp}");
    assert_eq!(rtp["duplicates"], 1, "{rtp}");
    assert_eq!(rtp["reordered"], 1, "{rtp}");
    assert_eq!(rtp["ssrc_changes"], 1, "{rtp}");
    assert_eq!(rtp["malformed"], 0, "{rtp}");
    assert_eq!(rtp["ssrc"], 2, "{rtp}");
    assert_eq!(rtp["payload_type"], 33, "{rtp}");
    let tsh = &flow(&s, "ts")["health"]["ts"];
    assert_eq!(tsh["continuity_errors"], 2, "{tsh}");
    assert_eq!(tsh["sync_errors"], 0, "{tsh}");
    assert_eq!(tsh["transport_errors"], 0, "{tsh}");
    assert_eq!(tsh["pids"], 2, "{tsh}");
    assert_eq!(tsh["packets"], ts_sent * 7, "{tsh}");

    let m = metrics(&t);
    let input = "239.9.1.1:5000@vRA";
    for (name, want) in [
        ("mcrelay_input_rtp_lost_packets_total", 2.0),
        ("mcrelay_input_rtp_duplicate_packets_total", 1.0),
        ("mcrelay_input_rtp_reordered_packets_total", 1.0),
        ("mcrelay_input_rtp_ssrc_changes_total", 1.0),
        ("mcrelay_input_rtp_malformed_packets_total", 0.0),
    ] {
        assert_eq!(metric(&m, name, "rtp", input), want, "{name}");
    }
    assert!(metric(&m, "mcrelay_input_rtp_jitter_seconds", "rtp", input) >= 0.0);
    let input = "239.9.1.2:5000@vRA";
    assert_eq!(
        metric(&m, "mcrelay_input_ts_continuity_errors_total", "ts", input),
        2.0
    );
    assert_eq!(
        metric(&m, "mcrelay_input_ts_sync_errors_total", "ts", input),
        0.0
    );
    assert!(metric(&m, "mcrelay_input_max_gap_seconds", "ts", input) >= 0.0);

    // Silence: "quiet" (silence_ms 300) has had nothing: silent, once
    // 300 ms have passed since it was added; `status` names it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, status) = ctl(&socket, &["status"]);
        if status.contains("silent:   quiet") {
            break;
        }
        assert!(Instant::now() < deadline, "{status}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // It resumes: active again, then stops: silent within 400 ms.
    let group = Ipv4Addr::new(239, 9, 1, 3);
    let feed = |t: &Topology| {
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let ns = t.a.clone();
        let feeder = std::thread::spawn(move || {
            in_netns(&ns, move || {
                let s = sender();
                let mut seq = 0u16;
                let mut last = Instant::now();
                while done_rx.try_recv().is_err() {
                    s.send_to(&rtp_datagram(seq, 7), SocketAddrV4::new(group, 5000))
                        .expect("send");
                    last = Instant::now();
                    seq = seq.wrapping_add(1);
                    std::thread::sleep(Duration::from_millis(10));
                }
                last
            })
        });
        (done_tx, feeder)
    };
    let quiet = |s: &serde_json::Value| flow(s, "quiet")["health"]["silent"].as_bool();
    let wait_active = || {
        let deadline = Instant::now() + Duration::from_secs(10);
        while quiet(&stats(&socket)) != Some(false) {
            assert!(Instant::now() < deadline, "never active");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let (done, feeder) = feed(&t);
    wait_active();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(quiet(&stats(&socket)), Some(false), "active while fed");
    done.send(()).expect("stop feeder");
    let last = feeder.join().expect("feeder");
    std::thread::sleep(
        (last + Duration::from_millis(400)).saturating_duration_since(Instant::now()),
    );
    let s = stats(&socket);
    assert_eq!(
        quiet(&s),
        Some(true),
        "silent 400 ms after the last datagram: {s}"
    );
    // The supervisor logs each change once, on its 1 s tick: seen silent,
    // then fed until it logs the input active again.
    let wait_log = |what: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !relay.log().contains(what) {
            assert!(
                Instant::now() < deadline,
                "no {what:?} in:\n{}",
                relay.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_log("input silent: no datagram for 300 ms flow=quiet");
    let (done, feeder) = feed(&t);
    wait_active();
    wait_log("input active again flow=quiet");
    done.send(()).expect("stop feeder");
    feeder.join().expect("feeder");
    let log = relay.stop();
    assert_eq!(
        log.matches("input active again flow=quiet").count(),
        1,
        "{log}"
    );
}

#[test]
fn a_real_encoders_stream_shows_no_errors() {
    if Command::new("ffmpeg")
        .arg("-version")
        .stdout(Stdio::null())
        .status()
        .is_err()
    {
        eprintln!(
            "SKIPPED: ffmpeg is not installed (CI installs it: .ci/steps/25-stream-health.sh)"
        );
        return;
    }
    let Some(t) = Topology::new() else { return };
    let flows = flow_toml("enc", "239.9.1.4", "239.9.2.4", "payload = \"rtp-mpegts\"");
    let _relay = t.relay(&daemon_config(&t, &flows), &[]);
    let socket = t.dir.join("control.sock");
    let status = Command::new("ip")
        .args([
            "netns",
            "exec",
            &t.a,
            "ffmpeg",
            "-hide_banner",
            "-loglevel",
            "error",
        ])
        .args(["-re", "-f", "lavfi", "-i", "testsrc=size=320x240:rate=25"])
        .args(["-f", "lavfi", "-i", "sine=frequency=1000:sample_rate=48000"])
        .args(["-t", "4", "-c:v", "mpeg2video", "-b:v", "1M", "-c:a", "mp2"])
        .args([
            "-f",
            "rtp_mpegts",
            "rtp://239.9.1.4:5000?localaddr=10.10.1.1&ttl=1&pkt_size=1328",
        ])
        .stdin(Stdio::null())
        .status()
        .expect("ffmpeg");
    assert!(status.success(), "ffmpeg failed");
    let s = wait_for_packets(&socket, "enc", 50);
    let f = flow(&s, "enc");
    let h = &f["health"];
    for key in [
        "lost",
        "duplicates",
        "reordered",
        "ssrc_changes",
        "malformed",
        "resyncs",
    ] {
        assert_eq!(h["rtp"][key], 0, "rtp {key}: {h}");
    }
    for key in ["continuity_errors", "sync_errors", "transport_errors"] {
        assert_eq!(h["ts"][key], 0, "ts {key}: {h}");
    }
    assert_eq!(h["rtp"]["packets"], f["packets_in"], "{f}");
    assert_eq!(h["rtp"]["payload_type"], 33, "{h}");
    assert!(
        h["ts"]["pids"].as_u64() >= Some(3),
        "PAT, PMT, video, audio: {h}"
    );
    let m = metrics(&t);
    let input = "239.9.1.4:5000@vRA";
    for name in [
        "mcrelay_input_rtp_lost_packets_total",
        "mcrelay_input_rtp_duplicate_packets_total",
        "mcrelay_input_rtp_reordered_packets_total",
        "mcrelay_input_ts_continuity_errors_total",
        "mcrelay_input_ts_sync_errors_total",
    ] {
        assert_eq!(metric(&m, name, "enc", input), 0.0, "{name}");
    }
}
