//! README "A first stream: ffmpeg → mcrelay → ffplay" (issue 27, item 8),
//! run as written: the three shell blocks marked `<!-- walkthrough: sender
//! -->`, `relay` and `receiver` are read from README.md and run, unchanged,
//! in three network namespaces wired as the README describes (sender `eth0`
//! ↔ relay `eth0`, relay `eth1` ↔ receiver `eth0`). So README and test
//! can't drift: edit a command there and this runs the edit.
//!
//! What the test supplies around the blocks, as a newcomer's machine would:
//! a working directory with `target/release/mcrelayd` and `mcrelayctl` (the
//! binaries cargo built for this test), a `sudo` that just runs its command
//! (the test is root), and, for the relay, a private `/run` (a tmpfs in the
//! namespace's own mount namespace) so its default control socket
//! `/run/mcrelay/control.sock` is its own. The sender's ffmpeg runs until
//! the test ends it (its process group); the receiver's ffprobe must name
//! the stream `mpeg2video`, and the relay's final counters must show the
//! stream relayed.
//!
//! Needs root and ffmpeg/ffprobe (CI installs them: .ci/steps/28-walkthrough.sh);
//! skips with a message otherwise, unless `MCRELAY_REQUIRE_FFMPEG=1`.

mod common;

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{MCRELAYD, Topology, mcrelayctl, sh};

/// The shell block after `<!-- walkthrough: NAME -->` in README.md.
fn block(readme: &str, name: &str) -> String {
    let marker = format!("<!-- walkthrough: {name} -->");
    let after = readme
        .split_once(&marker)
        .unwrap_or_else(|| panic!("README.md has no {marker}"))
        .1;
    let body = after
        .trim_start()
        .strip_prefix("```sh\n")
        .unwrap_or_else(|| panic!("{marker} is not followed by a ```sh block"));
    let end = body
        .find("\n```")
        .unwrap_or_else(|| panic!("the block after {marker} doesn't end"));
    body[..=end].to_owned()
}

fn have(program: &str) -> bool {
    Command::new(program)
        .arg("-version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A child in its own process group, ended with the group (every process
/// the block started) when dropped.
struct Group(Child, &'static str);

impl Group {
    fn spawn(mut c: Command, what: &'static str) -> Self {
        c.process_group(0);
        Group(c.spawn().unwrap_or_else(|e| panic!("{what}: {e}")), what)
    }

    /// `sig` to every process of the group; whether any was there.
    #[allow(unsafe_code)]
    fn signal(&self, sig: i32) -> bool {
        let pgid = i32::try_from(self.0.id()).expect("pid");
        // SAFETY: kill(2) on the process group this test created; no
        // memory is passed.
        unsafe { libc::kill(-pgid, sig) == 0 }
    }

    /// SIGTERM to the group, then wait until every process of it is gone
    /// (the shell may go first; the daemon then still writes its final
    /// counters); SIGKILL after 20 s.
    fn stop(&mut self) {
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let _ = self.0.try_wait();
            if !self.signal(0) {
                break;
            }
            if Instant::now() > deadline {
                self.signal(libc::SIGKILL);
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.wait();
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            eprintln!("ending the {} block", self.1);
            self.stop();
        }
    }
}

/// `sh -c` running `script` in namespace `ns`, from `work`, with the test's
/// `sudo` and binaries; `prelude` runs first (as root, not from README).
fn in_ns(ns: &str, work: &Path, prelude: &str, script: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, "sh", "-c"])
        .arg(format!(
            "{prelude}cd '{}' && set -e\n{script}",
            work.display()
        ))
        .env(
            "PATH",
            format!(
                "{}:{}",
                work.join("bin").display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        );
    c
}

#[test]
fn the_readme_walkthrough_relays_an_ffmpeg_stream_to_ffprobe() {
    if !common::is_root() {
        eprintln!("SKIPPED: the README walk-through needs root (network namespaces)");
        return;
    }
    if !have("ffmpeg") || !have("ffprobe") {
        assert!(
            std::env::var_os("MCRELAY_REQUIRE_FFMPEG").is_none(),
            "MCRELAY_REQUIRE_FFMPEG is set but ffmpeg/ffprobe are missing"
        );
        eprintln!("SKIPPED: ffmpeg and ffprobe are not installed (apt-get install ffmpeg)");
        return;
    }
    let readme = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
        .expect("README.md");
    let (sender, relay, receiver) = (
        block(&readme, "sender"),
        block(&readme, "relay"),
        block(&readme, "receiver"),
    );
    let Some(t) = Topology::bare("mcr-wt") else {
        return;
    };
    // sender eth0 <-> relay eth0; relay eth1 <-> receiver eth0.
    sh(&[
        "ip", "link", "add", "eth0", "netns", &t.a, "type", "veth", "peer", "name", "eth0",
        "netns", &t.r,
    ]);
    sh(&[
        "ip", "link", "add", "eth1", "netns", &t.r, "type", "veth", "peer", "name", "eth0",
        "netns", &t.b,
    ]);
    for (ns, dev, addr) in [
        (&t.a, "eth0", "192.0.2.1/24"),
        (&t.r, "eth0", "192.0.2.2/24"),
        (&t.r, "eth1", "198.51.100.1/24"),
        (&t.b, "eth0", "198.51.100.2/24"),
    ] {
        t.ip(ns, &["addr", "add", addr, "dev", dev]);
        t.ip(ns, &["link", "set", dev, "up"]);
    }
    // A newcomer's checkout: target/release/{mcrelayd,mcrelayctl}; and a
    // sudo that runs its command (we are root).
    let work = t.dir.join("work");
    for d in ["target/release", "bin"] {
        fs::create_dir_all(work.join(d)).expect("work dir");
    }
    symlink(MCRELAYD, work.join("target/release/mcrelayd")).expect("link");
    symlink(mcrelayctl(), work.join("target/release/mcrelayctl")).expect("link");
    let sudo = work.join("bin/sudo");
    fs::write(&sudo, "#!/bin/sh\nexec \"$@\"\n").expect("sudo");
    fs::set_permissions(&sudo, fs::Permissions::from_mode(0o755)).expect("chmod");

    let relay_log = t.dir.join("relay.log");
    let mut relay_cmd = in_ns(
        &t.r,
        &work,
        "mount -t tmpfs -o mode=0755 tmpfs /run && ",
        &relay,
    );
    relay_cmd
        .env("RUST_LOG", "info")
        .stdout(fs::File::create(&relay_log).expect("log"))
        .stderr(
            fs::File::options()
                .append(true)
                .open(&relay_log)
                .expect("log"),
        );
    let mut relay_group = Group::spawn(relay_cmd, "relay");
    let log = || fs::read_to_string(&relay_log).unwrap_or_default();
    common::wait_until("the README's relay started", || {
        if log().contains("relaying;") {
            Ok(())
        } else {
            Err(log())
        }
    });

    let rx_out = t.dir.join("receiver.out");
    let mut rx_cmd = in_ns(&t.b, &work, "", &receiver);
    rx_cmd
        .stdout(fs::File::create(&rx_out).expect("out"))
        .stderr(fs::File::create(t.dir.join("receiver.err")).expect("err"));
    let mut rx = Group::spawn(rx_cmd, "receiver");
    let mut tx_cmd = in_ns(&t.a, &work, "", &sender);
    tx_cmd.stdout(Stdio::null()).stderr(Stdio::null());
    let tx = Group::spawn(tx_cmd, "sender");

    let status = common::wait_until("the receiver's ffprobe to finish", || {
        match rx.0.try_wait() {
            Ok(Some(status)) => Ok(status),
            _ => Err(log()),
        }
    });
    drop(tx);
    relay_group.stop();
    let printed = fs::read_to_string(&rx_out).unwrap_or_default();
    let log = log();
    assert!(
        status.success()
            && printed
                .lines()
                .any(|l| l.trim().trim_end_matches(',') == "mpeg2video"),
        "the receiver's ffprobe ({status}) printed {printed:?}; relay log:\n{log}"
    );
    // The final counters: "final" lines appear once the daemon stopped.
    let packets_in = common::counter(&log, &["final flow=camera "], "packets_in");
    let packets_out = common::counter(&log, &["final output flow=camera "], "packets_out");
    assert!(
        packets_in > 0 && packets_out > 0,
        "in {packets_in}, out {packets_out}:\n{log}"
    );
    assert!(log.contains("ok: 1 flow"), "check's summary:\n{log}");
}
