//! The daemon as systemd sees it, without systemd: its log stream and its
//! notifications, each checked by standing in for the service manager.
//! (deploy/nspawn/run.sh checks the same under a real systemd.)
//!
//! Journal: under systemd the daemon's and the helper's log lines reach
//! journald's stream socket, named by `JOURNAL_STREAM=dev:ino`. Each line
//! must carry the `<N>` syslog prefix of its level (journald files
//! unprefixed lines at PRIORITY=6, hiding warnings and errors from
//! `journalctl -p warning`) and no ANSI colour, and the helper must follow
//! `daemon.log_level` too. Here the daemon's stderr is one end of a Unix
//! stream socket pair whose device and inode go in `JOURNAL_STREAM`; its
//! control socket path is a regular file, so it starts (as root: with its
//! privileged helper), logs, fails with an error and exits.
//!
//! Notify: the datagram that carries `READY=1` must also carry `STATUS=`,
//! at start and after a reload, so `systemctl status` (and `systemctl show
//! -p StatusText`) is never empty while the unit is active. Sent apart, the
//! status followed a second later, at the next tick.
//!
//! Both run the daemon on loopback with one flow between two loopback
//! ports (it binds them; nothing is sent).

use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "mcrelayd-under-systemd-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `dir/mcrelay.toml`: one loopback flow on ports `port` and `port + 1`.
fn loopback_config(dir: &Path, control_socket: &Path, log_level: &str, port: u16) -> PathBuf {
    let config = dir.join("mcrelay.toml");
    std::fs::write(
        &config,
        format!(
            r#"[daemon]
user = "nobody"
control_socket = "{}"
log_level = "{log_level}"
cores = [0]

[[flow]]
name = "loop"
input = {{ interface = "lo", address = "127.0.0.1", port = {port} }}
outputs = [{{ interface = "lo", address = "127.0.0.1", port = {} }}]
"#,
            control_socket.display(),
            port + 1
        ),
    )
    .unwrap();
    config
}

/// Loopback ports for this test process, two per `slot`.
fn ports(slot: u16) -> u16 {
    20000 + u16::try_from(std::process::id() % 4000).unwrap() * 8 + 2 * slot
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
}

/// journald's end of a stream, the process's end (for its stderr) and
/// the `JOURNAL_STREAM` value naming the latter.
fn journal_pair() -> (UnixStream, UnixStream, String) {
    let (journal, stream) = UnixStream::pair().unwrap();
    let meta = std::fs::File::from(std::os::fd::OwnedFd::from(stream.try_clone().unwrap()))
        .metadata()
        .unwrap();
    (journal, stream, format!("{}:{}", meta.dev(), meta.ino()))
}

/// Everything the daemon writes to stderr with `log_level`, with stderr
/// a socket named by `JOURNAL_STREAM` (or not, `as_journal` false).
fn run_daemon(name: &str, slot: u16, log_level: &str, as_journal: bool) -> String {
    let dir = scratch(name);
    let not_a_socket = dir.join("control.sock");
    std::fs::write(&not_a_socket, "a regular file").unwrap();
    let config = loopback_config(&dir, &not_a_socket, log_level, ports(slot));
    let (mut journal, stream, journal_stream) = journal_pair();
    let mut command = Command::new(env!("CARGO_BIN_EXE_mcrelayd"));
    command
        .args(["--config", config.to_str().unwrap()])
        .env_remove("RUST_LOG")
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::os::fd::OwnedFd::from(stream));
    if as_journal {
        command.env("JOURNAL_STREAM", journal_stream);
    } else {
        command.env_remove("JOURNAL_STREAM");
    }
    let mut child = command.spawn().expect("run mcrelayd");
    drop(command); // our copy of the socket's daemon end
    let mut out = String::new();
    // EOF once the daemon and its helper have both exited.
    journal.read_to_string(&mut out).unwrap();
    let status = child.wait().unwrap();
    assert!(!status.success(), "the daemon should fail: {out}");
    let _ = std::fs::remove_dir_all(&dir);
    out
}

#[test]
fn journal_lines_carry_their_priority_and_no_colour() {
    let out = run_daemon("info", 0, "info", true);
    assert!(!out.contains('\x1b'), "ANSI escape in the journal: {out:?}");
    let error = out
        .lines()
        .find(|l| l.contains("is not a socket"))
        .unwrap_or_else(|| panic!("no control-socket error logged:\n{out}"));
    assert!(
        error.starts_with("<3>"),
        "error not at priority 3: {error:?}"
    );
    let info: Vec<&str> = out.lines().filter(|l| l.starts_with("<6>")).collect();
    if is_root() {
        // The helper's own lines, through its own subscriber.
        assert!(
            info.iter().any(|l| l.contains("helper")),
            "no <6> line from the helper:\n{out}"
        );
    }
    // Every line is prefixed, the daemon's final error included (its
    // plain `mcrelayd: ...` summary is for a terminal only).
    for line in out.lines() {
        assert!(line.starts_with('<'), "unprefixed line {line:?} in:\n{out}");
    }
}

#[test]
fn daemon_and_helper_follow_log_level() {
    let out = run_daemon("error", 1, "error", true);
    assert!(
        out.lines().any(|l| l.starts_with("<3>")),
        "no error line:\n{out}"
    );
    let below: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("<4>") || l.starts_with("<6>") || l.starts_with("<7>"))
        .collect();
    assert!(
        below.is_empty(),
        "lines below log_level = \"error\": {below:?}"
    );
}

#[test]
fn without_journal_stream_there_is_no_prefix_and_no_colour() {
    let out = run_daemon("plain", 2, "info", false);
    assert!(
        !out.contains('\x1b'),
        "ANSI escape on a non-terminal: {out:?}"
    );
    assert!(
        out.lines()
            .any(|l| l.contains("ERROR") && l.contains("is not a socket")),
        "{out}"
    );
    assert!(!out.lines().any(|l| l.starts_with("<3>")), "{out}");
}

#[test]
fn check_errors_reach_the_journal_as_errors() {
    // ExecStartPre runs `mcrelayd check`: its errors are what the operator
    // looks for with `journalctl -p err` when the unit does not start.
    let dir = scratch("check");
    let config = dir.join("broken.toml");
    std::fs::write(&config, "[daemon]\nlog_level = \"loud\"\n").unwrap();
    let (mut journal, stream, journal_stream) = journal_pair();
    let mut command = Command::new(env!("CARGO_BIN_EXE_mcrelayd"));
    command
        .args(["check", "--config", config.to_str().unwrap()])
        .env("JOURNAL_STREAM", journal_stream)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::os::fd::OwnedFd::from(stream));
    let status = command.status().expect("run mcrelayd check");
    drop(command);
    assert!(!status.success());
    let mut out = String::new();
    journal.read_to_string(&mut out).unwrap();
    assert!(out.contains("log_level"), "{out}");
    assert!(out.lines().count() >= 2, "{out}");
    for line in out.lines() {
        assert!(line.starts_with("<3>"), "not at priority 3: {line:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
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
    let config = loopback_config(&dir, &dir.join("control.sock"), "info", ports(3));
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

#[test]
fn config_errors_reach_the_journal_at_error_priority() {
    let dir = scratch("bad-config");
    let config = dir.join("mcrelay.toml");
    std::fs::write(&config, "[daemon]\nno_such_key = 1\n[[flow]]\nname = 3\n").unwrap();
    let (mut journal, stream, journal_stream) = journal_pair();
    let mut command = Command::new(env!("CARGO_BIN_EXE_mcrelayd"));
    command
        .args(["--config", config.to_str().unwrap()])
        .env_remove("RUST_LOG")
        .env_remove("NOTIFY_SOCKET")
        .env("JOURNAL_STREAM", journal_stream)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::os::fd::OwnedFd::from(stream));
    let mut child = command.spawn().expect("run mcrelayd");
    drop(command);
    let mut out = String::new();
    journal.read_to_string(&mut out).unwrap();
    assert!(!child.wait().unwrap().success(), "a bad config must fail");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.contains("no_such_key"),
        "the error names the key:\n{out}"
    );
    for line in out.lines() {
        assert!(
            line.starts_with("<3>"),
            "{line:?} not at error priority in:\n{out}"
        );
    }
}
