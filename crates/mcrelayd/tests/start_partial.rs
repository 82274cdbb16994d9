//! One flow that can't open doesn't stop the daemon (issue 27, item 3):
//! before, a flow whose sockets failed at start (here a unicast input on
//! an address this host doesn't have: `EADDRNOTAVAIL`) made the whole
//! daemon exit with status 1 — under systemd, `ExecStartPre` passed and
//! the unit failed. Now the other flows start and the failed one is
//! `open_failed` in status, retried like one that failed on a reload.
//! Loopback only; nothing is sent.

mod common;

use std::fs;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{MCRELAYD, is_root, signal};
use mcrelay_control::{DaemonState, FlowState};

#[test]
fn a_flow_that_cannot_open_at_start_leaves_the_others_running() {
    let dir = std::env::temp_dir().join(format!("mcrelay-start-partial-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("dir");
    let socket = dir.join("ctl.sock");
    let user = if is_root() { "user = \"nobody\"\n" } else { "" };
    let config = dir.join("mcrelay.toml");
    fs::write(
        &config,
        format!(
            "[daemon]\n{user}cores = [0]\ncontrol_socket = \"{}\"\n\
             [[flow]]\nname = \"bad\"\ninput = {{ interface = \"lo\", address = \"192.0.2.77\", port = 5000 }}\n\
             outputs = [{{ interface = \"lo\", address = \"239.9.27.2\", port = 5000 }}]\n\
             [[flow]]\nname = \"good\"\ninput = {{ interface = \"lo\", address = \"239.9.27.1\", port = 5001 }}\n\
             outputs = [{{ interface = \"lo\", address = \"239.9.27.3\", port = 5001 }}]\n",
            socket.display()
        ),
    )
    .expect("config");
    let log = dir.join("mcrelayd.log");
    let mut child = Command::new(MCRELAYD)
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).expect("log"))
        .spawn()
        .expect("mcrelayd");
    let deadline = Instant::now() + common::DEADLINE;
    let started = loop {
        let text = fs::read_to_string(&log).unwrap_or_default();
        if text.contains("relaying;") {
            break Ok(text);
        }
        if let Ok(Some(status)) = child.try_wait() {
            break Err(format!("mcrelayd exited ({status}) at start:\n{text}"));
        }
        if Instant::now() > deadline {
            break Err(format!("mcrelayd did not start:\n{text}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let result = started.map(|text| (common::snapshot(&socket), text));
    if matches!(child.try_wait(), Ok(None)) {
        signal(&child, libc::SIGTERM);
    }
    let _ = child.wait();
    let _ = fs::remove_dir_all(&dir);
    let (snapshot, text) = result.unwrap_or_else(|e| panic!("{e}"));
    let good = snapshot.flow("good").expect("good flow");
    assert_eq!(good.state, FlowState::Running, "{text}");
    let bad = snapshot.flow("bad").expect("bad flow");
    assert!(
        matches!(&bad.state, FlowState::OpenFailed { error } if error.contains("assign requested address")),
        "{:?}\n{text}",
        bad.state
    );
    assert!(
        matches!(&snapshot.state, DaemonState::Degraded(_)),
        "{:?}",
        snapshot.state
    );
    assert!(text.contains("not started:"), "{text}");
}
