//! SRT outputs end to end, with libsrt's own tools on the other side. In
//! network namespaces (topology in `common/mod.rs`: a multicast sender in
//! A, the relay in R, the SRT peers in B dialling R's 10.10.2.1); needs
//! root and `srt-live-transmit` (CI installs srt-tools), skips with a
//! message otherwise.
//!
//! - 10 `srt-live-transmit` callers (AES-256) and one GStreamer `srtsrc` on
//!   one listener port each receive the multicast input byte-exact; one
//!   joining mid-stream starts on a TS packet boundary; a caller with the
//!   wrong passphrase is refused and logged, the others lose nothing; a
//!   second flow on the same port is picked by its stream ID.
//! - mcrelay as caller to `srt-live-transmit` in listener mode: it retries
//!   with back-off until the listener appears, then delivers byte-exact.
//! - 5 % random loss (iptables `statistic`) both ways between relay and
//!   callers, `latency_ms = 400`: no residual loss at the callers.

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
    let t = Topology::new()?;
    // As docs/operations.md asks for SRT outputs: room for bursts between
    // the worker and the SRT thread (the default, 10, drops under load).
    sh(&[
        "ip",
        "netns",
        "exec",
        &t.r,
        "sysctl",
        "-qw",
        "net.unix.max_dgram_qlen=512",
    ]);
    Some(t)
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
    let script = format!(
        "import socket,time\n\
         d=open('{}','rb').read()\n\
         s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
         s.bind(('10.10.1.1',0))\n\
         s.setsockopt(socket.IPPROTO_IP,socket.IP_MULTICAST_TTL,4)\n\
         s.setsockopt(socket.IPPROTO_IP,socket.IP_MULTICAST_IF,socket.inet_aton('10.10.1.1'))\n\
         t0=time.monotonic()\n\
         for n,i in enumerate(range(0,len(d),{DATAGRAM})):\n\
         \x20   w=t0+n/{rate}-time.monotonic()\n\
         \x20   if w>0: time.sleep(w)\n\
         \x20   s.sendto(d[i:i+{DATAGRAM}],('239.1.1.1',5000))\n",
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
    assert_eq!(first, None, "{}: first difference", path.display());
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
             passphrase = \"{PASS}\", key_length = 32, latency_ms = 200, max_callers = 12 }}"
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
    let expected_callers = 10 + usize::from(gst.is_some());
    wait_log(&relay, "SRT caller connected", expected_callers);

    // A wrong passphrase is refused in the handshake and logged.
    let wrong = srt_receiver(
        &t,
        "srt://10.10.2.1:9000?streamid=cam&passphrase=not%20the%20passphrase&pbkeylen=32",
        &t.dir.join("wrong.ts"),
    );
    wait_log(&relay, "refused in the handshake", 1);

    // The stream, and a caller joining in its middle.
    let late_out = t.dir.join("late.ts");
    let half = std::thread::scope(|s| {
        let h = s.spawn(|| send_file(&t, &file, 1500));
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
    assert_eq!(srt.max_callers, 12);
    assert!(
        srt.callers
            .iter()
            .all(|c| c.dropped == 0 && c.stream_id == "cam"),
        "{srt:?}"
    );
    let (code, text) = ctl(&socket, &["flows"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("srt listener: 12/12 callers"), "{text}");
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

#[test]
fn five_percent_loss_both_ways_leaves_no_residual_loss() {
    let Some(t) = topology() else { return };
    if !have("iptables") {
        eprintln!("SKIPPED: iptables not installed");
        return;
    }
    let n = 6000;
    let file = stream(&t, n);
    let want = fs::read(&file).expect("stream");
    let relay = t.relay(
        &config(
            "{ protocol = \"srt\", address = \"10.10.2.1\", port = 9000, stream_id = \"cam\", latency_ms = 400 }",
        ),
        &[],
    );
    let outs: Vec<PathBuf> = (0..3)
        .map(|i| t.dir.join(format!("lossy-{i}.ts")))
        .collect();
    let callers: Vec<Child> = outs
        .iter()
        .map(|o| srt_receiver(&t, "srt://10.10.2.1:9000?streamid=cam&latency=400", o))
        .collect();
    wait_log(&relay, "SRT caller connected", 3);
    // 5 % of every UDP datagram between relay and callers, both ways, in B.
    for chain in ["INPUT", "OUTPUT"] {
        t.drop_randomly(&t.b, &["-A", chain, "-p", "udp"], "0.05");
    }
    send_file(&t, &file, 1000);
    for (c, o) in callers.into_iter().zip(&outs) {
        finish(c, o, want.len());
        same(o, &want);
    }
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
fn a_frozen_caller_and_a_handshake_flood_cost_the_others_nothing() {
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
    wait_log(&relay, "SRT caller connected", 4);
    // The frozen caller neither reads nor acknowledges from now on.
    signal(&frozen, libc::SIGSTOP);
    let junk = flood(&t, 20_000);
    send_file(&t, &file, 1000);
    // The frozen one is gone (peer idle timeout, or its buffer full).
    wait_log(&relay, "SRT caller disconnected", 1);
    for o in &outs {
        wait_size(o, want.len() - 4096);
    }
    assert_eq!(
        count(&relay.log(), "SRT caller disconnected"),
        1,
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
