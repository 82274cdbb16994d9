//! SRT outputs end to end, with libsrt's own tools on the other side. In
//! network namespaces (topology in `common/mod.rs`: a multicast sender in
//! A, the relay in R, the SRT peers in B dialling R's 10.10.2.1); needs
//! root and `srt-live-transmit` (CI installs srt-tools), skips with a
//! message otherwise.
//!
//! - One caller per AES key length (128, 192, 256 bits), byte-exact.
//! - A frozen caller (SIGSTOP), one that vanishes mid-stream (SIGKILL) and a
//!   flood of junk handshakes: the other callers receive byte-exact.
//! - 10 `srt-live-transmit` callers (AES-256) and one GStreamer `srtsrc` on
//!   one listener port each receive the multicast input byte-exact; one
//!   joining mid-stream starts on a TS packet boundary; a caller with the
//!   wrong passphrase is refused and logged, the others lose nothing; a
//!   second flow on the same port is picked by its stream ID.
//! - mcrelay as caller to `srt-live-transmit` in listener mode: it retries
//!   with back-off until the listener appears, then delivers byte-exact.
//! - A listener on 0.0.0.0 on the port of an `ingress = "packet"` input's
//!   group (which the config allows): its socket receives the group's
//!   datagrams too, and its caller still receives the flow byte-exact.
//! - 5 % random loss (iptables `statistic`) both ways and 40 ms RTT
//!   (nfdelay) between relay and callers, `latency_ms = 200`: no residual
//!   loss at the callers over 60 s, the figure (CI's; set
//!   `MCRELAY_SRT_LOSS_SECONDS` for a shorter local run).
//! - SRT inputs: an ffmpeg caller to a listener input relayed to multicast
//!   byte-exact (a second caller refused); an input calling
//!   `srt-live-transmit` in listener mode, byte-exact; failover between an
//!   SRT leg and a multicast leg and back.
//! - Past the relay's sending capacity (relay on one CPU, 10 callers at
//!   10 000 datagrams/s): the newest late caller goes each second, counted
//!   and logged, new callers are refused meanwhile, and after the
//!   overload the callers that stayed and a new one receive a stream
//!   byte-exact.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

mod common;
use common::*;

const PASS: &str = "mcrelay-srt-test-passphrase";
/// Datagrams of 7 TS packets.
const DATAGRAM: usize = 1316;

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn topology() -> Option<Topology> {
    if !have("srt-live-transmit") {
        eprintln!("SKIPPED: srt-live-transmit not installed (apt-get install srt-tools)");
        return None;
    }
    Topology::new()
}

/// A TS-like stream: `n` datagrams of seven 188-byte packets, each
/// starting with the sync byte, numbered, the rest a fixed pattern.
fn stream(t: &Topology, n: usize) -> PathBuf {
    let mut data = Vec::with_capacity(n * DATAGRAM);
    for k in 0..u32::try_from(n * 7).expect("small") {
        let mut p = [0u8; 188];
        p[0] = 0x47;
        p[1..5].copy_from_slice(&k.to_be_bytes());
        for (j, b) in p.iter_mut().enumerate().skip(5) {
            *b = k.to_le_bytes()[0]
                .wrapping_mul(31)
                .wrapping_add(j.to_le_bytes()[0]);
        }
        data.extend_from_slice(&p);
    }
    let path = t.dir.join("stream.ts");
    fs::write(&path, data).expect("write stream");
    path
}

/// Sends `file` from A to 239.1.1.1:5000 in datagrams of 1316 bytes at
/// `rate` per second, and waits for the end.
fn send_file(t: &Topology, file: &Path, rate: u32) {
    send_file_and_tail(t, file, rate, 0);
}

/// [`send_file`], then `tail` more datagrams of TS null packets: a live
/// stream goes on, and SRT (live mode) detects a loss only when a later
/// packet arrives, so the file's last datagram needs some behind it.
fn send_file_and_tail(t: &Topology, file: &Path, rate: u32, tail: u32) {
    send_around(t, file, rate, 0, tail);
}

/// [`send_file_and_tail`] with `lead` datagrams of TS null packets before
/// the file too (SRT's first second, before its RTT estimate settles,
/// retransmits less eagerly: a stream joined in its course).
fn send_around(t: &Topology, file: &Path, rate: u32, lead: u32, tail: u32) {
    let script = format!(
        "import socket,time\n\
         d=open('{}','rb').read()\n\
         s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
         s.bind(('10.10.1.1',0))\n\
         s.setsockopt(socket.IPPROTO_IP,socket.IP_MULTICAST_TTL,4)\n\
         s.setsockopt(socket.IPPROTO_IP,socket.IP_MULTICAST_IF,socket.inet_aton('10.10.1.1'))\n\
         z=(bytes([0x47,0x1f,0xff,0x10])+bytes(184))*7\n\
         for k in range({lead}):\n\
         \x20   time.sleep(1/{rate})\n\
         \x20   s.sendto(z,('239.1.1.1',5000))\n\
         t0=time.monotonic()\n\
         for n,i in enumerate(range(0,len(d),{DATAGRAM})):\n\
         \x20   w=t0+n/{rate}-time.monotonic()\n\
         \x20   if w>0: time.sleep(w)\n\
         \x20   s.sendto(d[i:i+{DATAGRAM}],('239.1.1.1',5000))\n\
         for k in range({tail}):\n\
         \x20   time.sleep(1/{rate})\n\
         \x20   s.sendto(z,('239.1.1.1',5000))\n",
        file.display()
    );
    let status = Command::new("ip")
        .args(["netns", "exec", &t.a, "python3", "-c", &script])
        .status()
        .expect("python3 sender");
    assert!(status.success(), "sender failed");
}

/// `srt-live-transmit` in B writing what it receives from `uri` to `out`.
fn srt_receiver(t: &Topology, uri: &str, out: &Path) -> Child {
    Command::new("ip")
        .args([
            "netns",
            "exec",
            &t.b,
            "srt-live-transmit",
            "-q",
            "-a:no",
            uri,
            "file://con",
        ])
        .stdout(fs::File::create(out).expect("output file"))
        .stderr(Stdio::null())
        .spawn()
        .expect("srt-live-transmit")
}

fn kill(mut c: Child) {
    signal(&c, libc::SIGTERM);
    if c.try_wait().ok().flatten().is_none() {
        std::thread::sleep(Duration::from_millis(200));
        let _ = c.kill();
    }
    let _ = c.wait();
}

fn count(log: &str, what: &str) -> usize {
    log.lines().filter(|l| l.contains(what)).count()
}

fn wait_log(relay: &Relay, what: &str, n: usize) {
    wait_until(&format!("{n} × {what:?} in the relay's log"), || {
        let log = relay.log();
        if count(&log, what) >= n {
            Ok(())
        } else {
            Err(format!("{} so far:\n{log}", count(&log, what)))
        }
    });
}

/// Waits until `path` holds all but the last stdio buffer of `size`
/// bytes (srt-live-transmit writes `file://con` through a 4 KiB buffer),
/// then stops the receiver (SIGINT: it flushes and exits).
fn finish(mut rx: Child, path: &Path, size: usize) {
    wait_until(&format!("{} to hold {size} bytes", path.display()), || {
        let got = fs::metadata(path).map_or(0, |m| usize::try_from(m.len()).unwrap_or(0));
        if got + 4096 >= size {
            Ok(())
        } else {
            Err(format!("{got} bytes"))
        }
    });
    // What is still on its way (less than a buffer) arrives well within a
    // second at these rates; then the receiver flushes on SIGINT.
    std::thread::sleep(Duration::from_millis(1000));
    signal(&rx, libc::SIGINT);
    wait_until("the receiver to exit", || match rx.try_wait() {
        Ok(Some(_)) => Ok(()),
        _ => Err("running".into()),
    });
}

fn wait_size(path: &Path, size: usize) {
    wait_until(&format!("{} to hold {size} bytes", path.display()), || {
        let got = fs::metadata(path).map_or(0, |m| usize::try_from(m.len()).unwrap_or(0));
        if got >= size {
            Ok(())
        } else {
            Err(format!("{got} bytes"))
        }
    });
}

fn same(path: &Path, want: &[u8]) {
    let got = fs::read(path).expect("read output");
    assert_eq!(got.len(), want.len(), "{}: length", path.display());
    let first = got.iter().zip(want).position(|(a, b)| a != b);
    assert_eq!(
        first,
        None,
        "{}: first difference; {}",
        path.display(),
        packet_numbers(&got, first.unwrap_or(0))
    );
}

/// The numbers [`stream`] wrote into the TS packets around `at`, as
/// received: says whether a difference is a packet lost, repeated or
/// out of order.
fn packet_numbers(got: &[u8], at: usize) -> String {
    let first = (at / 188).saturating_sub(8);
    let numbers: Vec<String> = got
        .chunks_exact(188)
        .skip(first)
        .take(24)
        .map(|p| match p.get(1..5) {
            Some(&[a, b, c, d]) if p[0] == 0x47 => u32::from_be_bytes([a, b, c, d]).to_string(),
            _ => "?".to_owned(),
        })
        .collect();
    format!("packets {first}.. hold numbers {}", numbers.join(" "))
}

fn config(outputs: &str) -> String {
    format!(
        "[[flow]]\nname = \"cam\"\ninput = {{ interface = \"vRA\", address = \"239.1.1.1\", port = 5000 }}\n\
         outputs = [{outputs}]\n\
         [[flow]]\nname = \"other\"\ninput = {{ interface = \"vRA\", address = \"239.1.1.2\", port = 5000 }}\n\
         outputs = [{{ protocol = \"srt\", address = \"10.10.2.1\", port = 9000, stream_id = \"other\" }}]\n"
    )
}

#[test]
fn listener_serves_ten_callers_byte_exact_and_refuses_a_wrong_passphrase() {
    let Some(t) = topology() else { return };
    let n = 3000;
    let file = stream(&t, n);
    let want = fs::read(&file).expect("stream");
    let relay = t.relay(
        &config(&format!(
            "{{ protocol = \"srt\", address = \"10.10.2.1\", port = 9000, stream_id = \"cam\", \
             passphrase = \"{PASS}\", key_length = 32, latency_ms = 200, max_callers = 14 }}"
        )),
        &[],
    );
    let uri = format!("srt://10.10.2.1:9000?streamid=cam&passphrase={PASS}&pbkeylen=32")
        .replace(' ', "%20");
    let outs: Vec<PathBuf> = (0..10)
        .map(|i| t.dir.join(format!("caller-{i}.ts")))
        .collect();
    let callers: Vec<Child> = outs.iter().map(|o| srt_receiver(&t, &uri, o)).collect();
    let gst_out = t.dir.join("gst.ts");
    let gst = have("gst-launch-1.0").then(|| {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &t.b,
                "gst-launch-1.0",
                "-q",
                "-e",
                "srtsrc",
            ])
            .arg("uri=srt://10.10.2.1:9000?mode=caller")
            .arg("streamid=cam")
            .arg(format!("passphrase={PASS}"))
            .args(["!", "filesink"])
            .arg(format!("location={}", gst_out.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("gst-launch-1.0")
    });
    // And ffmpeg's srt:// protocol as a caller, writing the raw bytes it
    // receives (the data demuxer and muxer: no remuxing).
    let ff_out = t.dir.join("ffmpeg.ts");
    let ff = have("ffmpeg").then(|| {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &t.b,
                "ffmpeg",
                "-nostdin",
                "-hide_banner",
                "-loglevel",
                "error",
                "-f",
                "data",
                "-i",
            ])
            .arg(format!(
                "srt://10.10.2.1:9000?mode=caller&streamid=cam&passphrase={PASS}&pbkeylen=32"
            ))
            .args([
                "-map",
                "0",
                "-c",
                "copy",
                "-flush_packets",
                "1",
                "-f",
                "data",
                "-y",
            ])
            .arg(&ff_out)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("ffmpeg")
    });
    let expected_callers = 10 + usize::from(gst.is_some()) + usize::from(ff.is_some());
    wait_log(&relay, "SRT caller connected", expected_callers);

    // A wrong passphrase is refused in the handshake and logged.
    let wrong = srt_receiver(
        &t,
        "srt://10.10.2.1:9000?streamid=cam&passphrase=not%20the%20passphrase&pbkeylen=32",
        &t.dir.join("wrong.ts"),
    );
    wait_log(&relay, "refused in the handshake", 1);

    // The stream, and a caller joining in its middle. 500 datagrams/s:
    // 14 encrypted callers of a 1500/s stream starved this 2-core machine
    // under CI load (one caller got 90 % of it); the rate is not what
    // this test is about (the SRT cost experiment measures that).
    let late_out = t.dir.join("late.ts");
    let half = std::thread::scope(|s| {
        let h = s.spawn(|| send_file(&t, &file, 500));
        std::thread::sleep(Duration::from_millis(700));
        let late = srt_receiver(&t, &uri, &late_out);
        h.join().expect("sender");
        late
    });
    // Nobody was dropped before the receivers stop; each caller's counters.
    wait_size(&outs[0], want.len() - 4096);
    let socket = t.dir.join("control.sock");
    let srt = wait_until("every caller counted", || {
        let s = snapshot(&socket);
        let srt = s
            .flow("cam")
            .and_then(|f| f.outputs.first())
            .and_then(|o| o.srt.clone())
            .ok_or("no srt output")?;
        let full = srt.callers.iter().filter(|c| c.sent == n as u64).count();
        if full >= expected_callers && srt.refused >= 1 {
            Ok(srt)
        } else {
            Err(format!("{srt:?}"))
        }
    });
    assert!(srt.listener);
    assert_eq!(srt.max_callers, 14);
    assert!(
        srt.callers
            .iter()
            .all(|c| c.dropped == 0 && c.stream_id == "cam"),
        "{srt:?}"
    );
    let (code, text) = ctl(&socket, &["flows"]);
    assert_eq!(code, 0, "{text}");
    assert!(
        // The callers, and the one that joined mid-stream.
        text.contains(&format!(
            "srt listener: {}/14 callers",
            expected_callers + 1
        )),
        "{text}"
    );
    assert!(text.contains("=> 10.10.2.2:"), "{text}");
    assert_eq!(
        count(&relay.log(), "SRT caller disconnected"),
        0,
        "{}",
        relay.log()
    );
    for (c, o) in callers.into_iter().zip(&outs) {
        finish(c, o, want.len());
        same(o, &want);
    }
    if let Some(g) = gst {
        finish(g, &gst_out, want.len());
        same(&gst_out, &want);
    }
    if let Some(mut f) = ff {
        // ffmpeg writes each packet through (-flush_packets 1): the whole
        // stream is in the file once it is that long; then it is ended.
        wait_size(&ff_out, want.len());
        std::thread::sleep(Duration::from_millis(500));
        signal(&f, libc::SIGINT);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while f.try_wait().ok().flatten().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = f.kill();
        let _ = f.wait();
        same(&ff_out, &want);
    }
    // The late caller got a tail of the stream, whole TS packets from a
    // datagram boundary (if it connected before the end).
    std::thread::sleep(Duration::from_millis(500));
    signal(&half, libc::SIGINT);
    let _ = half.wait_with_output();
    let late = fs::read(&late_out).expect("late output");
    assert_eq!(late.len() % DATAGRAM, 0, "late caller: not whole datagrams");
    if !late.is_empty() {
        assert_eq!(late[0], 0x47, "late caller starts off a TS packet");
        assert!(
            want.ends_with(&late),
            "late caller: not a tail of the stream"
        );
    }
    kill(wrong);
    let _ = relay.stop();
}

/// AES-128, -192 and -256: one flow with an SRT output of each key
/// length on one listener port (told apart by stream ID), one
/// `srt-live-transmit` caller each with that key length: each receives
/// the stream byte-exact, encrypted with its output's key length.
#[test]
fn each_aes_key_length_serves_its_caller_byte_exact() {
    let Some(t) = topology() else { return };
    let n = 1000;
    let file = stream(&t, n);
    let want = fs::read(&file).expect("stream");
    let lengths = [16, 24, 32];
    let outputs: Vec<String> = lengths
        .iter()
        .map(|k| {
            format!(
                "{{ protocol = \"srt\", address = \"10.10.2.1\", port = 9000, stream_id = \"k{k}\", \
                 passphrase = \"{PASS}\", key_length = {k} }}"
            )
        })
        .collect();
    let relay = t.relay(&config(&outputs.join(", ")), &[]);
    let outs: Vec<PathBuf> = lengths
        .iter()
        .map(|k| t.dir.join(format!("aes-{k}.ts")))
        .collect();
    let callers: Vec<Child> = lengths
        .iter()
        .zip(&outs)
        .map(|(k, o)| {
            let uri = format!("srt://10.10.2.1:9000?streamid=k{k}&passphrase={PASS}&pbkeylen={k}");
            srt_receiver(&t, &uri, o)
        })
        .collect();
    wait_log(&relay, "SRT caller connected", lengths.len());
    send_file(&t, &file, 500);
    for (c, o) in callers.into_iter().zip(&outs) {
        finish(c, o, want.len());
        same(o, &want);
    }
    // Each output served its one caller the whole stream, none refused
    // (the counters are published each second).
    let socket = t.dir.join("control.sock");
    for k in lengths {
        let o = wait_until(&format!("k{k}'s counters"), || {
            let s = snapshot(&socket);
            let o = s
                .flow("cam")
                .and_then(|f| {
                    f.outputs
                        .iter()
                        .find(|o| o.label.ends_with(&format!("streamid=k{k}")))
                })
                .and_then(|o| o.srt.clone())
                .ok_or("no such SRT output")?;
            if o.sent == n as u64 {
                Ok(o)
            } else {
                Err(format!("{o:?}"))
            }
        });
        assert_eq!((o.connects, o.refused), (1, 0), "k{k}: {o:?}");
    }
    let _ = relay.stop();
}

#[test]
fn caller_mode_retries_until_the_listener_is_up_then_delivers_byte_exact() {
    let Some(t) = topology() else { return };
    let n = 1500;
    let file = stream(&t, n);
    let want = fs::read(&file).expect("stream");
    let relay = t.relay(
        &config(
            "{ protocol = \"srt\", mode = \"caller\", address = \"10.10.2.2\", port = 9100, latency_ms = 120 }",
        ),
        &[],
    );
    // Nothing listens yet: the relay retries with back-off.
    wait_log(&relay, "SRT caller could not connect", 1);
    let out = t.dir.join("listener.ts");
    let listener = srt_receiver(&t, "srt://:9100?mode=listener", &out);
    wait_log(&relay, "SRT caller connected to its listener", 1);
    send_file(&t, &file, 1500);
    finish(listener, &out, want.len());
    same(&out, &want);
    let _ = relay.stop();
}

/// An `ingress = "packet"` input of a group and an SRT listener on
/// 0.0.0.0 on the group's port: the config allows it (the packet socket
/// binds no port, docs/configuration.md), and it works: the listener's
/// socket receives the group's datagrams too (the membership is the
/// host's), libsrt drops them as no connection's, and its caller
/// receives the flow byte-exact.
#[test]
fn a_wildcard_listener_on_a_packet_inputs_group_port_serves_its_caller() {
    let Some(t) = topology() else { return };
    let n = 1000;
    let file = stream(&t, n);
    let want = fs::read(&file).expect("stream");
    let relay = t.relay(
        "[[flow]]\nname = \"cam\"\n\
         input = { interface = \"vRA\", address = \"239.1.1.1\", port = 5000, ingress = \"packet\" }\n\
         outputs = [{ protocol = \"srt\", address = \"0.0.0.0\", port = 5000 }]\n",
        &[],
    );
    let out = t.dir.join("wildcard.ts");
    let rx = srt_receiver(&t, "srt://10.10.2.1:5000", &out);
    wait_log(&relay, "SRT caller connected", 1);
    // R's UDP counters: the group's datagrams reach a UDP socket, the
    // listener's (nothing else holds port 5000; the caller's own
    // datagrams, a few hundred control packets, come on top).
    let udp = |key: &str| {
        let out = Command::new("ip")
            .args(["netns", "exec", &t.r, "nstat", "-az", key])
            .output()
            .expect("nstat");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let in_before = udp("UdpInDatagrams");
    send_file(&t, &file, 500);
    finish(rx, &out, want.len());
    same(&out, &want);
    let got_in = udp("UdpInDatagrams") - in_before;
    eprintln!("R: {got_in} UDP datagrams received");
    assert!(
        got_in >= n as u64,
        "the group's datagrams reached no socket: {got_in}"
    );
    let _ = relay.stop();
}

/// How long the loss test streams: the 60 s (what CI runs), or
/// `MCRELAY_SRT_LOSS_SECONDS` for a shorter (or longer) local run.
fn loss_seconds() -> u32 {
    std::env::var("MCRELAY_SRT_LOSS_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&s| s > 0)
        .unwrap_or(60)
}

#[test]
fn five_percent_loss_and_40ms_rtt_leave_no_residual_loss() {
    let Some(t) = topology() else { return };
    if !have("iptables") {
        eprintln!("SKIPPED: iptables not installed");
        return;
    }
    let rate = 1000;
    let seconds = loss_seconds();
    let n = usize::try_from(rate * seconds).expect("small");
    let file = stream(&t, n);
    let want = fs::read(&file).expect("stream");
    let relay = t.relay(
        &config(
            "{ protocol = \"srt\", address = \"10.10.2.1\", port = 9000, stream_id = \"cam\", latency_ms = 200 }",
        ),
        &[],
    );
    // 40 ms RTT: what the callers in B send (acknowledgements, loss
    // reports) held 40 ms by nfdelay; 5 % of every UDP datagram dropped
    // both ways in B, the drop rule on OUTPUT ahead of the delay.
    let _delay = mcrelay_testkit::delay::DelayedLink::start(
        &t.b,
        7,
        Duration::from_millis(40),
        &["OUTPUT", "-p", "udp"],
    )
    .expect("nfdelay (cargo build -p mcrelay-testkit)");
    for (op, chain) in [("-A", "INPUT"), ("-I", "OUTPUT")] {
        t.drop_randomly(&t.b, &[op, chain, "-p", "udp"], "0.05");
    }
    let outs: Vec<PathBuf> = (0..3)
        .map(|i| t.dir.join(format!("lossy-{i}.ts")))
        .collect();
    let callers: Vec<Child> = outs
        .iter()
        .map(|o| srt_receiver(&t, "srt://10.10.2.1:9000?streamid=cam&latency=200", o))
        .collect();
    wait_log(&relay, "SRT caller connected", 3);
    send_around(&t, &file, rate, 1000, 500);
    // libsrt's view, while the callers are still connected (published
    // each second): the link lost and SRT retransmitted, at 40 ms RTT.
    let srt = wait_until("the three callers' counters", || {
        let srt = snapshot(&t.dir.join("control.sock"))
            .flow("cam")
            .and_then(|f| f.outputs.first())
            .and_then(|o| o.srt.clone())
            .ok_or("no srt output")?;
        if srt.callers.len() == 3 && srt.callers.iter().all(|c| c.retransmitted > 0) {
            Ok(srt)
        } else {
            Err(format!("{srt:?}"))
        }
    });
    for c in &srt.callers {
        assert!(c.rtt_us >= 30_000, "RTT not delayed: {c:?}");
    }
    let null = |d: &[u8]| d.starts_with(&[0x47, 0x1f, 0xff]);
    for (c, o) in callers.into_iter().zip(&outs) {
        // The lead (what of it arrived: its loss is not checked), the
        // file, then (some of) the tail.
        finish(c, o, want.len() + DATAGRAM * 1000 + 8192);
        let all = fs::read(o).expect("output");
        let skip = all.chunks(DATAGRAM).take_while(|d| null(d)).count();
        let got = all.get(skip * DATAGRAM..).unwrap_or_default();
        assert!(got.len() >= want.len(), "{}: short", o.display());
        let first = got.iter().zip(&want).position(|(a, b)| a != b);
        assert_eq!(
            first,
            None,
            "{}: first difference; {}; callers {:?}",
            o.display(),
            packet_numbers(got, first.unwrap_or(0)),
            srt.callers
        );
    }
    eprintln!(
        "loss test: {seconds} s, {n} datagrams, callers {:?}",
        srt.callers
    );
    let _ = relay.stop();
}

/// The relay's config file and control socket, written like
/// `Topology::relay` does, for a reload.
fn rewrite(t: &Topology, config: &str) {
    let text = format!(
        "[daemon]\nuser = \"nobody\"\ncontrol_socket = \"{}\"\n{config}",
        t.dir.join("control.sock").display()
    );
    fs::write(t.dir.join("mcrelay.toml"), text).expect("write config");
}

/// Sends `count` datagrams of junk to R's SRT port from B, as fast as
/// python goes: handshakes that are not, from many source ports.
fn flood(t: &Topology, count: u32) -> Child {
    let script = format!(
        "import socket,os\n\
         for i in range({count}):\n\
         \x20   s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
         \x20   s.bind(('10.10.2.2',0))\n\
         \x20   s.sendto(os.urandom(64+i%400),('10.10.2.1',9000))\n\
         \x20   s.close()\n"
    );
    Command::new("ip")
        .args(["netns", "exec", &t.b, "python3", "-c", &script])
        .spawn()
        .expect("flood")
}

#[test]
fn a_frozen_caller_one_that_vanishes_and_a_handshake_flood_cost_the_others_nothing() {
    let Some(t) = topology() else { return };
    let n = 6000;
    let file = stream(&t, n);
    let want = fs::read(&file).expect("stream");
    let relay = t.relay(
        &config(
            "{ protocol = \"srt\", address = \"10.10.2.1\", port = 9000, stream_id = \"cam\" }",
        ),
        &[],
    );
    let uri = "srt://10.10.2.1:9000?streamid=cam";
    let outs: Vec<PathBuf> = (0..3).map(|i| t.dir.join(format!("ok-{i}.ts"))).collect();
    let callers: Vec<Child> = outs.iter().map(|o| srt_receiver(&t, uri, o)).collect();
    let frozen = srt_receiver(&t, uri, &t.dir.join("frozen.ts"));
    // And one that vanishes mid-stream (SIGKILL: no shutdown message).
    let quitter = srt_receiver(&t, uri, &t.dir.join("quitter.ts"));
    wait_log(&relay, "SRT caller connected", 5);
    // The frozen caller neither reads nor acknowledges from now on.
    signal(&frozen, libc::SIGSTOP);
    let junk = flood(&t, 20_000);
    std::thread::scope(|s| {
        let h = s.spawn(|| send_file(&t, &file, 1000));
        std::thread::sleep(Duration::from_millis(1500));
        let mut quitter = quitter;
        let _ = quitter.kill();
        let _ = quitter.wait();
        h.join().expect("sender");
    });
    // The frozen one and the one that vanished are gone (peer idle
    // timeout, or their buffers full).
    wait_log(&relay, "SRT caller disconnected", 2);
    for o in &outs {
        wait_size(o, want.len() - 4096);
    }
    assert_eq!(
        count(&relay.log(), "SRT caller disconnected"),
        2,
        "{}",
        relay.log()
    );
    for (c, o) in callers.into_iter().zip(&outs) {
        finish(c, o, want.len());
        same(o, &want);
    }
    let _ = junk.wait_with_output();
    signal(&frozen, libc::SIGCONT);
    kill(frozen);
    let _ = relay.stop();
}

#[test]
fn reload_replacing_and_removing_srt_outputs_keeps_the_other_callers() {
    let Some(t) = topology() else { return };
    let n = 3000;
    let file = stream(&t, n);
    let want = fs::read(&file).expect("stream");
    let cam = "{ protocol = \"srt\", address = \"10.10.2.1\", port = 9000, stream_id = \"cam\" }";
    let relay = t.relay(&config(cam), &[]);
    let outs: Vec<PathBuf> = (0..3).map(|i| t.dir.join(format!("kept-{i}.ts"))).collect();
    let callers: Vec<Child> = outs
        .iter()
        .map(|o| srt_receiver(&t, "srt://10.10.2.1:9000?streamid=cam", o))
        .collect();
    let other = srt_receiver(
        &t,
        "srt://10.10.2.1:9000?streamid=other",
        &t.dir.join("other.ts"),
    );
    wait_log(&relay, "SRT caller connected", 4);
    // "cam" changes (a UDP output added: replaced make before break, its
    // SRT output taken over), "other" goes, "third" comes on the same port.
    rewrite(
        &t,
        &format!(
            "[[flow]]\nname = \"cam\"\ninput = {{ interface = \"vRA\", address = \"239.1.1.1\", port = 5000 }}\n\
             outputs = [{cam}, {{ interface = \"vRB\", address = \"10.10.2.2\", port = 7000 }}]\n\
             [[flow]]\nname = \"third\"\ninput = {{ interface = \"vRA\", address = \"239.1.1.3\", port = 5000 }}\n\
             outputs = [{{ protocol = \"srt\", address = \"10.10.2.1\", port = 9000, stream_id = \"third\" }}]\n"
        ),
    );
    let (code, out) = ctl(&t.dir.join("control.sock"), &["reload"]);
    assert_eq!(code, 0, "{out}");
    wait_log(&relay, "SRT output taken over by the reloaded flow", 1);
    // other's output (and its caller) goes with its flow.
    wait_log(&relay, "SRT output removed flow=other", 1);
    // third's output is on the listener before its caller calls (one
    // calling earlier is refused, an unknown stream ID, and gives up).
    wait_log(&relay, "SRT output added flow=third", 1);
    let third = srt_receiver(
        &t,
        "srt://10.10.2.1:9000?streamid=third",
        &t.dir.join("third.ts"),
    );
    wait_log(&relay, "SRT caller connected", 5);
    send_file(&t, &file, 1500);
    for o in &outs {
        wait_size(o, want.len() - 4096);
    }
    // cam's callers stayed through the reload.
    assert_eq!(
        count(&relay.log(), "SRT caller disconnected"),
        0,
        "{}",
        relay.log()
    );
    for (c, o) in callers.into_iter().zip(&outs) {
        finish(c, o, want.len());
        same(o, &want);
    }
    kill(other);
    kill(third);
    let _ = relay.stop();
}

// ---------------------------------------------------------------------
// SRT inputs: an SRT connection feeds a flow like any leg. The SRT peers
// are in A (10.10.1.1, dialling or dialled by R's 10.10.1.2); the flow's
// multicast output goes to B, where a receiver writes what arrives.
// ---------------------------------------------------------------------

/// A valid MPEG-TS stream (PID 0x100, continuity counter counting, no
/// adaptation field) of `n` datagrams of seven packets, numbered in the
/// payload, so the flow's TS health can check its continuity.
fn ts_stream(t: &Topology, n: usize) -> PathBuf {
    let mut data = Vec::with_capacity(n * DATAGRAM);
    for k in 0..u32::try_from(n * 7).expect("small") {
        let mut p = [0u8; 188];
        p[0] = 0x47;
        p[1] = 0x01;
        p[2] = 0x00;
        p[3] = 0x10 | (k.to_le_bytes()[0] & 0x0f);
        p[4..8].copy_from_slice(&k.to_be_bytes());
        for (j, b) in p.iter_mut().enumerate().skip(8) {
            *b = k.to_le_bytes()[0]
                .wrapping_mul(17)
                .wrapping_add(j.to_le_bytes()[0]);
        }
        data.extend_from_slice(&p);
    }
    let path = t.dir.join("ts-stream.ts");
    fs::write(&path, data).expect("write stream");
    path
}

/// A receiver in B joined to 239.2.2.2:6000 on vB that appends every
/// datagram to `out` until it holds `size` bytes (or 5 minutes pass);
/// returns once it has joined.
fn multicast_receiver(t: &Topology, out: &Path, size: usize) -> Child {
    let ready = t.dir.join(format!(
        "ready-{}",
        out.file_name().and_then(|n| n.to_str()).unwrap_or("rx")
    ));
    let script = format!(
        "import socket,struct,time\n\
         s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
         s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
         s.setsockopt(socket.SOL_SOCKET,socket.SO_RCVBUF,8<<20)\n\
         s.bind(('239.2.2.2',6000))\n\
         s.setsockopt(socket.IPPROTO_IP,socket.IP_ADD_MEMBERSHIP,struct.pack('4s4s',socket.inet_aton('239.2.2.2'),socket.inet_aton('10.10.2.2')))\n\
         s.settimeout(1.0)\n\
         open('{ready}','w').close()\n\
         o=open('{out}','wb',buffering=0)\n\
         n=0\n\
         end=time.monotonic()+300\n\
         while n<{size} and time.monotonic()<end:\n\
         \x20   try: d=s.recv(65536)\n\
         \x20   except socket.timeout: continue\n\
         \x20   o.write(d); n+=len(d)\n",
        ready = ready.display(),
        out = out.display(),
    );
    let child = Command::new("ip")
        .args(["netns", "exec", &t.b, "python3", "-c", &script])
        .spawn()
        .expect("python3 receiver");
    wait_until("the multicast receiver to join", || {
        if ready.exists() {
            Ok(())
        } else {
            Err("not yet".into())
        }
    });
    // Let the IGMP join settle on the veth.
    std::thread::sleep(Duration::from_millis(100));
    child
}

/// Waits for a receiver started by [`multicast_receiver`] to have all
/// it expected and exit.
fn receiver_done(mut rx: Child) {
    wait_until("the multicast receiver to have everything", || {
        match rx.try_wait() {
            Ok(Some(_)) => Ok(()),
            _ => Err("running".into()),
        }
    });
}

/// A command in its own process group, ended with it when dropped (or
/// by [`kill_group`]): the group's id is the child's own PID.
struct Group(Child);

impl Drop for Group {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        let c = &mut self.0;
        if c.try_wait().ok().flatten().is_some() {
            return;
        }
        let pgid = i32::try_from(c.id()).expect("pid");
        // SAFETY: kill(2) with the negative PID of a process group this
        // test created; no memory is involved.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        let _ = c.wait();
    }
}

fn in_group(mut c: Command) -> Group {
    use std::os::unix::process::CommandExt;
    c.process_group(0);
    Group(c.spawn().expect("spawn"))
}

/// Ends the process group led by `c` (a pipeline started by
/// [`in_group`]), by its PID: SIGTERM first, then SIGKILL on drop.
#[allow(unsafe_code)]
fn kill_group(g: Group) {
    let pgid = i32::try_from(g.0.id()).expect("pid");
    // SAFETY: kill(2) with the negative PID of a process group this test
    // created; no memory is involved.
    unsafe { libc::kill(-pgid, libc::SIGTERM) };
    std::thread::sleep(Duration::from_millis(300));
    drop(g);
}

/// Sends SIGINT to the process group led by `g` (see [`in_group`]).
#[allow(unsafe_code)]
fn interrupt_group(g: &Group) {
    let pgid = i32::try_from(g.0.id()).expect("pid");
    // SAFETY: kill(2) with the negative PID of a process group this test
    // created; no memory is involved.
    unsafe { libc::kill(-pgid, libc::SIGINT) };
}

/// Python writing `file` to its stdout in 1316-byte writes (atomic on a
/// pipe) at `rate` per second, then holding the pipe open for `hold` s.
fn pacer(file: &Path, rate: u32, hold: u32) -> String {
    format!(
        "import sys,time\n\
         d=open('{}','rb').read()\n\
         o=sys.stdout.buffer\n\
         t0=time.monotonic()\n\
         for n,i in enumerate(range(0,len(d),{DATAGRAM})):\n\
         \x20   w=t0+n/{rate}-time.monotonic()\n\
         \x20   if w>0: time.sleep(w)\n\
         \x20   o.write(d[i:i+{DATAGRAM}]); o.flush()\n\
         time.sleep({hold})\n",
        file.display()
    )
}

/// Sends `file` from A's loopback to 127.0.0.1:`port` in 1316-byte
/// datagrams at `rate` per second (to an SRT tool's UDP source in A).
fn send_local(t: &Topology, file: &Path, port: u16, rate: u32) {
    let script = format!(
        "import socket,time\n\
         d=open('{}','rb').read()\n\
         s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
         s.bind(('127.0.0.1',0))\n\
         t0=time.monotonic()\n\
         for n,i in enumerate(range(0,len(d),{DATAGRAM})):\n\
         \x20   w=t0+n/{rate}-time.monotonic()\n\
         \x20   if w>0: time.sleep(w)\n\
         \x20   s.sendto(d[i:i+{DATAGRAM}],('127.0.0.1',{port}))\n",
        file.display()
    );
    let status = Command::new("ip")
        .args(["netns", "exec", &t.a, "python3", "-c", &script])
        .status()
        .expect("python3 sender");
    assert!(status.success(), "sender failed");
}

fn srt_input_config(input: &str) -> String {
    format!(
        "[[flow]]\nname = \"in\"\npayload = \"mpegts\"\ninput = {input}\n\
         outputs = [{{ interface = \"vRB\", address = \"239.2.2.2\", port = 6000 }}]\n"
    )
}

fn srt_input(socket: &Path) -> mcrelay_control::SrtInputSnapshot {
    snapshot(socket)
        .flow("in")
        .and_then(|f| f.srt_inputs.first().cloned())
        .expect("an SRT input in the snapshot")
}

#[test]
fn srt_input_from_an_ffmpeg_caller_is_relayed_to_multicast_byte_exact() {
    let Some(t) = topology() else { return };
    if !have("ffmpeg") {
        eprintln!("SKIPPED: ffmpeg not installed");
        return;
    }
    let n = 2000;
    let file = ts_stream(&t, n);
    let want = fs::read(&file).expect("stream");
    let out = t.dir.join("from-ffmpeg.ts");
    let rx = multicast_receiver(&t, &out, want.len());
    let relay = t.relay(
        &srt_input_config(
            "{ protocol = \"srt\", address = \"10.10.1.2\", port = 9000, latency_ms = 120 }",
        ),
        &[],
    );
    let socket = t.dir.join("control.sock");
    // ffmpeg in A calls the relay's SRT input and sends the stream as it
    // comes from the pacer: raw 1316-byte messages (the data muxer, no
    // remuxing), so what arrives must be the file itself. `-blocksize`:
    // the data demuxer sends each read as it comes, and a read of
    // ffmpeg's 32 KiB buffer after a stall under load would end mid-way
    // through a 1316-byte message (a short one, then the rest: 2001
    // messages for 2000); one message per read keeps them whole.
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &t.a, "sh", "-c"]).arg(format!(
        "python3 -c \"$PACER\" | ffmpeg -nostdin -hide_banner -loglevel error \
         -blocksize {DATAGRAM} -f data -raw_packet_size {DATAGRAM} -i pipe:0 -map 0 -c copy -flush_packets 1 \
         -f data 'srt://10.10.1.2:9000?mode=caller&pkt_size={DATAGRAM}&latency=120000'"
    ));
    c.env("PACER", pacer(&file, 1000, 60));
    let ffmpeg = in_group(c);
    wait_log(&relay, "SRT caller connected", 1);
    // A second caller while one is connected is refused and counted.
    let mut second = Command::new("ip");
    second.args([
        "netns",
        "exec",
        &t.a,
        "srt-live-transmit",
        "-q",
        "-a:no",
        "udp://127.0.0.1:7005",
        "srt://10.10.1.2:9000",
    ]);
    let second = in_group(second);
    wait_until("the second caller refused", || {
        let s = srt_input(&socket);
        if s.refused >= 1 {
            Ok(())
        } else {
            Err(format!("{s:?}"))
        }
    });
    kill_group(second);
    receiver_done(rx);
    same(&out, &want);
    // The SRT thread publishes its counters once a second.
    let s = wait_until("the SRT input's counters", || {
        let s = srt_input(&socket);
        if s.delivered == n as u64 {
            Ok(s)
        } else {
            Err(format!("{s:?}"))
        }
    });
    assert!(s.listener, "{s:?}");
    assert_eq!((s.drop_queue_full, s.drop_flow_gone), (0, 0), "{s:?}");
    let peer = s.peer.expect("connected");
    assert_eq!(peer.received, n as u64);
    assert!(peer.peer.starts_with("10.10.1.1:"), "{peer:?}");
    // The worker saw it as the flow's input: counted, TS health clean.
    let snap = snapshot(&socket);
    let f = snap.flow("in").expect("flow");
    assert_eq!(f.packets_in, n as u64);
    assert_eq!(f.outputs[0].packets_out, n as u64);
    let ts = f.health.ts.clone().expect("TS health");
    assert_eq!(ts.packets, 7 * n as u64, "{ts:?}");
    assert_eq!((ts.sync_errors, ts.continuity_errors), (0, 0), "{ts:?}");
    assert!(f.input.starts_with("srt://10.10.1.2:9000"), "{}", f.input);
    let (code, text) = ctl(&socket, &["flows"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("srt input"), "{text}");
    kill_group(ffmpeg);
    let _ = relay.stop();
}

#[test]
fn srt_input_calls_srt_live_transmit_listener_and_relays_byte_exact() {
    let Some(t) = topology() else { return };
    let n = 1500;
    let file = ts_stream(&t, n);
    let want = fs::read(&file).expect("stream");
    let out = t.dir.join("from-listener.ts");
    let rx = multicast_receiver(&t, &out, want.len());
    let relay = t.relay(
        &srt_input_config(
            "{ protocol = \"srt\", mode = \"caller\", address = \"10.10.1.1\", port = 9100, \
             stream_id = \"cam\", passphrase = \"mcrelay-srt-test-passphrase\", key_length = 24 }",
        ),
        &[],
    );
    // Nothing listens yet: the input retries with back-off.
    wait_log(&relay, "SRT caller could not connect", 1);
    let mut c = Command::new("ip");
    c.args([
        "netns",
        "exec",
        &t.a,
        "srt-live-transmit",
        "-q",
        "udp://127.0.0.1:7000",
    ])
    .arg(format!(
        "srt://:9100?mode=listener&passphrase={PASS}&pbkeylen=24"
    ))
    .stdout(Stdio::null());
    let listener = in_group(c);
    wait_log(&relay, "SRT caller connected to its listener", 1);
    send_local(&t, &file, 7000, 1500);
    receiver_done(rx);
    same(&out, &want);
    let s = wait_until("the SRT input's counters", || {
        let s = srt_input(&t.dir.join("control.sock"));
        if s.delivered == n as u64 {
            Ok(s)
        } else {
            Err(format!("{s:?}"))
        }
    });
    assert!(!s.listener, "{s:?}");
    assert!(s.connect_failures >= 1, "{s:?}");
    assert_eq!(s.peer.map(|p| p.stream_id), Some("cam".to_owned()));
    kill_group(listener);
    let _ = relay.stop();
}

#[test]
fn failover_between_an_srt_leg_and_a_multicast_leg() {
    let Some(t) = topology() else { return };
    let relay = t.relay(
        "[[flow]]\nname = \"in\"\nredundancy = \"failover\"\nfailover_after_ms = 300\nrevert_after_s = 1\n\
         inputs = [{ protocol = \"srt\", address = \"10.10.1.2\", port = 9000, latency_ms = 80 }, \
                   { interface = \"vRA\", address = \"239.1.1.1\", port = 5000 }]\n\
         outputs = [{ interface = \"vRB\", address = \"239.2.2.2\", port = 6000 }]\n",
        &[],
    );
    let socket = t.dir.join("control.sock");
    let caller = || {
        let mut c = Command::new("ip");
        c.args([
            "netns",
            "exec",
            &t.a,
            "srt-live-transmit",
            "-q",
            "udp://127.0.0.1:7001",
            "srt://10.10.1.2:9000?latency=80",
        ])
        .stdout(Stdio::null());
        in_group(c)
    };
    let srt_peer = caller();
    wait_log(&relay, "SRT caller connected", 1);
    // Both legs carry a stream: the SRT one through the caller's UDP
    // source in A, the multicast one from A's vA.
    let srt_tx = t.sender(&t.a, "127.0.0.1:7001", None, None, 500);
    let mc_tx = t.sender(&t.a, "239.1.1.1:5000", Some("vA"), None, 500);
    let legs = |s: &mcrelay_control::Snapshot| {
        let f = s.flow("in").expect("flow");
        let r = f.redundancy.clone().expect("legs");
        (f.clone(), r)
    };
    // The SRT leg is first: active while healthy.
    wait_until("the SRT leg active and forwarding", || {
        let (_, r) = legs(&snapshot(&socket));
        if r.active_input == 0 && r.legs[0].forwarded > 200 && r.legs[1].standby > 0 {
            Ok(())
        } else {
            Err(format!("{r:?}"))
        }
    });
    // Its peer goes: the flow fails over to the multicast leg.
    kill_group(srt_peer);
    let (before, _) = legs(&snapshot(&socket));
    wait_until("failover to the multicast leg", || {
        let (f, r) = legs(&snapshot(&socket));
        if r.active_input == 1
            && r.switches >= 1
            && f.outputs[0].packets_out > before.outputs[0].packets_out + 200
        {
            Ok(())
        } else {
            Err(format!("{r:?}"))
        }
    });
    // It comes back: after revert_after_s the SRT leg is active again.
    let srt_peer = caller();
    wait_until("revert to the SRT leg", || {
        let (f, r) = legs(&snapshot(&socket));
        let connected = f.srt_inputs.first().is_some_and(|s| s.peer.is_some());
        if r.active_input == 0 && r.switches >= 2 && connected {
            Ok(())
        } else {
            Err(format!("{r:?} {:?}", f.srt_inputs))
        }
    });
    let (f, _) = legs(&snapshot(&socket));
    let s = &f.srt_inputs[0];
    assert!(s.connects >= 2 && s.disconnects >= 1, "{s:?}");
    assert_eq!((s.drop_queue_full, s.drop_flow_gone), (0, 0), "{s:?}");
    stop_sender(srt_tx);
    stop_sender(mc_tx);
    kill_group(srt_peer);
    let _ = relay.stop();
}

/// A pipe's reader for a caller of the overload test: counts the bytes
/// (written to OUT when it ends) and holds the last HELD of them; once
/// the packet MARK (hex) has passed, writes them to OUT.tail, creates
/// OUT.done and exits. Arguments: HELD MARK OUT. No double quotes: it is
/// passed through `sh -c "..."`.
const SINK: &str = "import os,sys,collections
k=int(sys.argv[1]);m=bytes.fromhex(sys.argv[2]);o=sys.argv[3]
q=collections.deque();h=0;n=0;p=b'';done=False
while True:
    d=os.read(0,1<<16)
    if not d: break
    n+=len(d);q.append(d);h+=len(d)
    while h-len(q[0])>=k: h-=len(q.popleft())
    if m in p+d:
        done=True;break
    p=(p+d)[-len(m):]
open(o,'w').write(str(n))
if done:
    open(o+'.tail','wb').write(b''.join(q))
    open(o+'.done','w').close()
";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Ten `srt-live-transmit` callers (`-a:no`: one connection each) of a
/// relay whose SRT sending can't keep up: the relay pinned to one CPU,
/// 10 000 datagrams/s of 1316 bytes to each caller for 8 s. Every
/// caller's libsrt then holds a second or more of the stream, which
/// arrives far past its receivers' latency (docs/benchmarks.md, "SRT
/// outputs"). Most callers late at once is the relay's own limit
/// (`mcrelay_srt::late`): the newest late caller is disconnected, one a
/// second (counted, `late_disconnects`, and logged with the reason),
/// and new callers are refused meanwhile (`refused`, `holding`), so
/// those served longest keep their streams; every datagram a remaining
/// caller missed is counted (sent or dropped), and the disconnected
/// callers' srt-live-transmit ended. Once the overload has passed and the
/// hold ended, a check stream reaches every caller that stayed and a new
/// one whole: byte-exact from its first datagram to its last. Before,
/// nobody was disconnected: all ten kept callers past their ceiling, each
/// receiving a share, late.
#[test]
fn callers_past_the_relays_sending_capacity_go_newest_first_and_a_new_caller_starts_whole() {
    let Some(t) = topology() else { return };
    if !have("taskset") {
        eprintln!("SKIPPED: taskset not installed (util-linux)");
        return;
    }
    const CALLERS: usize = 10;
    const RATE: u32 = 10_000;
    const COUNT: u32 = 80_000;
    let relay = t.relay_with(
        &config(
            "{ protocol = \"srt\", address = \"10.10.2.1\", port = 9000, stream_id = \"cam\", max_callers = 16 }",
        ),
        &[],
        &["taskset", "-c", "0"],
        &[],
    );
    let socket = t.dir.join("control.sock");
    let route = |s: &mcrelay_control::Snapshot| {
        s.flow("cam")
            .and_then(|f| f.outputs.iter().find_map(|o| o.srt.clone()))
            .ok_or_else(|| "no SRT output".to_owned())
    };
    // After the overload every caller still connected receives a check
    // stream, so each keeps what it received last (a file of everything
    // would take a gigabyte): `sink` counts the bytes, holds the last
    // `held` of them and writes them out when the check stream's last
    // packet has passed (or at the end). SIGINT ends srt-live-transmit
    // cleanly; the shell and the sink ignore it.
    let n = 2000;
    let file = stream(&t, n);
    let want = fs::read(&file).expect("stream");
    let last_packet = &want[want.len() - 188..];
    let held = want.len() + (1 << 20);
    let sinks: Vec<PathBuf> = (0..=CALLERS)
        .map(|i| t.dir.join(format!("caller-{i}")))
        .collect();
    let caller = |out: &Path| {
        let mut c = Command::new("sh");
        c.arg("-c").arg(format!(
            "trap '' INT; ip netns exec {} srt-live-transmit -q -a:no \
             'srt://10.10.2.1:9000?streamid=cam' file://con 2>/dev/null | python3 -c \"{}\" {held} {} {}",
            t.b,
            SINK,
            hex(last_packet),
            out.display()
        ));
        in_group(c)
    };
    let callers: Vec<Group> = sinks[..CALLERS].iter().map(|o| caller(o)).collect();
    wait_log(&relay, "SRT caller connected", CALLERS);
    let mut load = t
        .command(&t.a, &loadgen())
        .args(["send", "--dest", "239.1.1.1:5000", "--interface", "vA"])
        .args(["--rate", &RATE.to_string(), "--count", &COUNT.to_string()])
        .args(["--size", &DATAGRAM.to_string()])
        .stdout(Stdio::null())
        .spawn()
        .expect("loadgen");
    // The relay finds itself behind and sheds its newest caller.
    wait_log(&relay, "SRT output past its sending capacity", 1);
    wait_log(&relay, "SRT output refuses new callers", 1);
    // A caller arriving now is refused, counted.
    let refused_before = route(&snapshot(&socket)).expect("route").refused;
    let late_caller = srt_receiver(
        &t,
        "srt://10.10.2.1:9000?streamid=cam",
        &t.dir.join("refused.ts"),
    );
    wait_until("the caller arriving in the overload to be refused", || {
        let r = route(&snapshot(&socket))?;
        if r.refused > refused_before && r.holding {
            Ok(())
        } else {
            Err(format!("{r:?}"))
        }
    });
    kill(late_caller);
    let status = load.wait().expect("loadgen");
    assert!(status.success(), "loadgen failed");
    // Every datagram the SRT thread read is accounted for, per remaining
    // caller (each connected before the first); the counters are
    // published each second.
    wait_until("every datagram accounted for per caller", || {
        let r = route(&snapshot(&socket))?;
        let settled =
            r.datagrams > 0 && r.callers.iter().all(|c| c.sent + c.dropped == r.datagrams);
        if settled && r.datagrams + 10 >= u64::from(COUNT) / 2 {
            Ok(r)
        } else {
            Err(format!("{r:?}"))
        }
    });
    // Each disconnect for falling behind is logged with its reason, and
    // every caller either remains or was counted as disconnected (once
    // the last second's verdicts are published).
    let r = wait_until("the log and the counters to agree", || {
        let r = route(&snapshot(&socket))?;
        let log = relay.log();
        let shed = count(&log, "SRT output past its sending capacity")
            + count(&log, "SRT caller fell behind")
            + count(&log, "SRT caller can't keep up");
        if r.late_disconnects == shed as u64
            && r.callers.len() as u64 + r.disconnects == CALLERS as u64
        {
            Ok(r)
        } else {
            Err(format!("{shed} logged, {r:?}\n{log}"))
        }
    });
    assert!(r.late_disconnects >= 1, "{r:?}");
    assert!(r.disconnects >= r.late_disconnects, "{r:?}");
    eprintln!(
        "{} of {CALLERS} callers disconnected for falling behind, {} remain",
        r.late_disconnects,
        r.callers.len()
    );
    // The hold ends once the sending keeps up (10 s after the last shed).
    // A caller may still be shed while the relay drains what it queued
    // before the load ended, so who stayed is read only after the hold.
    let served = wait_until("the output to accept callers again", || {
        let r = route(&snapshot(&socket))?;
        if r.holding {
            Err(format!("{r:?}"))
        } else {
            Ok(r)
        }
    });
    // The callers the relay disconnected have ended (srt-live-transmit
    // -a:no exits on a broken connection); the others stay connected.
    let alive = |callers: &mut [Group]| {
        callers
            .iter_mut()
            .filter_map(|g| g.0.try_wait().ok())
            .filter(Option::is_none)
            .count()
    };
    let mut callers = callers;
    wait_until("the disconnected callers to end", || {
        let connected = route(&snapshot(&socket))?.callers.len();
        let left = alive(&mut callers[..]);
        if left == connected {
            Ok(())
        } else {
            Err(format!("{left} callers running, {connected} connected"))
        }
    });
    let stayed: Vec<usize> = (0..CALLERS)
        .filter(|&i| callers[i].0.try_wait().ok().flatten().is_none())
        .collect();
    assert!(!stayed.is_empty(), "every caller was disconnected: {r:?}");
    // A new caller, after the overload, beside those that stayed.
    let fresh = caller(&sinks[CALLERS]);
    wait_until("the new caller to connect", || {
        let r = route(&snapshot(&socket))?;
        if r.connects > served.connects && r.callers.len() == stayed.len() + 1 {
            Ok(())
        } else {
            Err(format!("{r:?}"))
        }
    });
    // The check stream, then a second of null packets behind it (SRT
    // detects a loss only when a later packet arrives, and the receivers
    // write through a stdio buffer).
    send_file_and_tail(&t, &file, 500, 500);
    let whole: Vec<&PathBuf> = stayed
        .iter()
        .map(|&i| &sinks[i])
        .chain([&sinks[CALLERS]])
        .collect();
    for out in &whole {
        let done = out.with_extension("done");
        wait_until(
            &format!("{} to see the check stream end", out.display()),
            || {
                if done.exists() {
                    Ok(())
                } else {
                    Err(fs::read_to_string(out).unwrap_or_else(|_| "running".into()))
                }
            },
        );
    }
    // Each caller that stayed, and the new one, received the check stream
    // whole: byte-exact from its first datagram to its last (the new
    // caller: from the first byte it received).
    for out in &whole {
        let got = fs::read(out.with_extension("tail")).expect("tail");
        let end = got
            .windows(188)
            .rposition(|w| w == last_packet)
            .map(|p| p + 188)
            .unwrap_or_else(|| panic!("{}: no end of the check stream", out.display()));
        let start = end.checked_sub(want.len());
        let got = start.and_then(|s| got.get(s..end)).unwrap_or_default();
        let first = got.iter().zip(&want).position(|(a, b)| a != b);
        assert_eq!(
            (got.len(), first),
            (want.len(), None),
            "{}: the check stream is not whole (length, first difference)",
            out.display()
        );
    }
    let fresh_got = fs::read(sinks[CALLERS].with_extension("tail")).expect("tail");
    assert!(
        fresh_got.starts_with(&want),
        "the new caller's stream does not start whole with the check stream"
    );
    eprintln!(
        "{} callers that stayed and the new one received the check stream whole",
        stayed.len()
    );
    // The callers end (each one's count is printed); only a group whose
    // leader still runs is signalled (a reaped one's id may be reused).
    callers.push(fresh);
    for g in &mut callers {
        if g.0.try_wait().ok().flatten().is_none() {
            interrupt_group(g);
        }
    }
    for (mut g, out) in callers.into_iter().zip(&sinks) {
        wait_until("a caller to end", || match g.0.try_wait() {
            Ok(Some(_)) => Ok(()),
            _ => Err("running".into()),
        });
        let bytes = fs::read_to_string(out).unwrap_or_default();
        eprintln!(
            "caller {}: received {} datagrams",
            out.display(),
            bytes.trim().parse::<u64>().unwrap_or(0) / DATAGRAM as u64
        );
    }
    eprintln!("{:?}", route(&snapshot(&socket)));
    let _ = relay.stop();
}
