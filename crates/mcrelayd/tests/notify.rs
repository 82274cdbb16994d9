//! What systemd hears first: the datagram that carries `READY=1` must also
//! carry `STATUS=`, at start and after a reload, so `systemctl status` (and
//! `systemctl show -p StatusText`) is never empty while the unit is active.
//! Sent apart, the status followed a second later, at the next tick.
//!
//! The daemon runs on loopback with a flow between two loopback ports (it
//! binds them; nothing is sent), its notify socket ours.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("mcrelayd-notify-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig}");
}

/// The next datagram containing `want`, waiting at most 30 s (a loaded
/// machine starting the daemon, its helper and its worker).
fn next_with(socket: &UnixDatagram, want: &str, seen: &mut Vec<String>) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        let Ok(n) = socket.recv(&mut buf) else {
            continue;
        };
        let message = String::from_utf8_lossy(&buf[..n]).into_owned();
        seen.push(message.clone());
        if message.lines().any(|l| l == want) {
            return message;
        }
    }
    panic!("no {want:?} from mcrelayd within 30 s; saw {seen:?}");
}

#[test]
fn ready_carries_the_status_at_start_and_after_a_reload() {
    let dir = scratch("ready");
    let notify_path = dir.join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    // The daemon notifies after dropping to `nobody` when started as root.
    std::fs::set_permissions(&notify_path, std::fs::Permissions::from_mode(0o666)).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let base = 20000 + (std::process::id() % 20000) as u16;
    let config = dir.join("mcrelay.toml");
    std::fs::write(
        &config,
        format!(
            r#"[daemon]
user = "nobody"
control_socket = "{}"
cores = [0]

[[flow]]
name = "loop"
input = {{ interface = "lo", address = "127.0.0.1", port = {} }}
outputs = [{{ interface = "lo", address = "127.0.0.1", port = {} }}]
"#,
            dir.join("control.sock").display(),
            base,
            base + 1
        ),
    )
    .unwrap();
    let daemon = Daemon(
        Command::new(env!("CARGO_BIN_EXE_mcrelayd"))
            .args(["--config", config.to_str().unwrap()])
            .env("NOTIFY_SOCKET", &notify_path)
            .env_remove("WATCHDOG_USEC")
            .env_remove("JOURNAL_STREAM")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run mcrelayd"),
    );
    let mut seen = Vec::new();
    let ready = next_with(&notify, "READY=1", &mut seen);
    assert!(
        ready
            .lines()
            .any(|l| l.starts_with("STATUS=running; 1 flows (1 relaying)")),
        "READY=1 without the status: {ready:?} (seen {seen:?})"
    );
    signal(&daemon.0, "-HUP");
    next_with(&notify, "RELOADING=1", &mut seen);
    let ready = next_with(&notify, "READY=1", &mut seen);
    assert!(
        ready.lines().any(|l| l.starts_with("STATUS=running;")),
        "READY=1 after the reload without the status: {ready:?}"
    );
    signal(&daemon.0, "-TERM");
    next_with(&notify, "STOPPING=1", &mut seen);
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}
