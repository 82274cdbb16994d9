//! `mcrelayctl top` in a real terminal: tmux runs it in a 160×48 pane,
//! `send-keys` presses keys, `capture-pane` reads the screen, and every
//! step waits for what it expects to see (never a fixed sleep).
//!
//! - Against a recorded daemon (a control socket this test serves, with a
//!   thousand flows, one with two input legs, whose counters grow by a
//!   fixed plan per request): sort,
//!   filter, scroll, help, resize and quit, then the terminal is back in
//!   cooked mode on its main screen. Needs tmux, not root.
//! - Against the real daemon in network namespaces (root), with traffic
//!   on one flow: the rate sort, the state filter, folding, the daemon
//!   going away, and SIGTERM restoring the terminal.
//!
//! Without tmux each test skips with a message; CI installs it
//! (`.ci/steps/26-top-tmux.sh`).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use mcrelay_control::{ReloadOutcome, Request, Response, Snapshot, Summary, parse_request};
use serde_json::json;

mod common;
use common::*;

/// One tmux server of our own (`tmux -S SOCKET`) with one session,
/// `top`, killed (and its socket removed) on drop.
struct Tmux {
    server: PathBuf,
}

static NEXT: AtomicU32 = AtomicU32::new(0);

impl Tmux {
    /// `command` (a shell command line) in a new detached 160×48 session;
    /// `None` (the test skips) without tmux.
    fn start(command: &str) -> Option<Tmux> {
        if tmux_missing() {
            return None;
        }
        let t = Tmux {
            server: std::env::temp_dir().join(format!(
                "mcr-top-{}-{}.tmux",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            )),
        };
        t.tmux(&[
            "new-session",
            "-d",
            "-x",
            "160",
            "-y",
            "48",
            "-s",
            "top",
            command,
        ]);
        Some(t)
    }

    fn tmux(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(&self.server)
            .args(args)
            .output()
            .expect("tmux");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Press keys by tmux's names (`Enter`, `End`, `r`, ...).
    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "top"];
        args.extend_from_slice(keys);
        self.tmux(&args);
    }

    /// Type `text` as it is.
    fn type_text(&self, text: &str) {
        self.tmux(&["send-keys", "-t", "top", "-l", text]);
    }

    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-t", "top"])
    }

    /// The screen once `seen` holds for it (polled; at most [`DEADLINE`]).
    fn wait_for(&self, what: &str, seen: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let screen = self.screen();
            if seen(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "not on screen within {DEADLINE:?}: {what}\n{screen}"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// The screen once it shows every one of `needles`.
    fn wait_for_all(&self, needles: &[&str]) -> String {
        self.wait_for(&format!("{needles:?}"), |s| has_all(s, needles))
    }

    /// The pid of the program the pane's shell runs (mcrelayctl).
    fn program_pid(&self) -> String {
        let shell = self.tmux(&["display-message", "-p", "-t", "top", "#{pane_pid}"]);
        let shell = shell.trim();
        let children = std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children"))
            .expect("the shell's children");
        children
            .split_whitespace()
            .next()
            .unwrap_or_else(|| panic!("the pane's shell {shell} runs nothing"))
            .to_owned()
    }
}

/// Whether tmux is missing (then the test skips, saying so).
fn tmux_missing() -> bool {
    let missing = Command::new("tmux").arg("-V").output().is_err();
    if missing {
        eprintln!("SKIPPED: tmux is not installed (CI installs it: .ci/steps/26-top-tmux.sh)");
    }
    missing
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(&self.server)
            .arg("kill-server")
            .output();
        let _ = std::fs::remove_file(&self.server);
    }
}

/// The shell command a pane runs: top, then what became of the terminal
/// (its exit status; whether raw mode was left on), then `cat` keeps the
/// pane open for the test to read it.
fn top_then_report(socket: &Path, interval: &str) -> String {
    format!(
        "'{ctl}' --socket '{socket}' top --interval {interval}; echo \"top exited $?\"; \
         if stty -a | grep -q -- -icanon; then echo 'terminal left raw'; \
         else echo 'terminal restored'; fi; exec cat",
        ctl = mcrelayctl().display(),
        socket = socket.display(),
    )
}

fn has_all(screen: &str, needles: &[&str]) -> bool {
    needles.iter().all(|n| screen.contains(n))
}

/// The first row of the flow table (the line under its column titles).
fn first_row(screen: &str) -> &str {
    let mut lines = screen.lines();
    lines.find(|l| l.contains("│FLOW "));
    lines.next().unwrap_or("")
}

/// Whether feed-0001's two legs are drawn under it, above its output.
fn legs_under_feed_0001(screen: &str) -> bool {
    let rows: Vec<&str> = screen
        .lines()
        .skip_while(|l| !l.contains("▾ feed-0001"))
        .take(4)
        .collect();
    rows.len() == 4
        && rows[1].contains("├─")
        && rows[1].contains(" merge ")
        && rows[1].contains("← 239.30.0.1:5000 on va")
        && rows[2].contains("← 239.31.0.1:5000 on vb")
        && rows[3].contains("└─")
        && rows[3].contains("→ 239.20.0.1:6000")
}

/// A daemon's control socket answered from a plan: flow `feed-NNNN`
/// receives NNNN packets per second, `feed-0777` also drops 5 a second,
/// and `feed-0500` waits for its interface. Each request is one second
/// later than the one before.
struct Recorded {
    requests: u64,
}

impl Recorded {
    fn snapshot(n: u64) -> Snapshot {
        let flows: Vec<_> = (0..1000u64)
            .map(|i| {
                let packets = n * i;
                let mut flow = json!({
                    "name": format!("feed-{i:04}"), "worker": i % 2,
                    "input": format!("239.10.{}.{}:5000 on va", i / 250, i % 250),
                    "packets_in": packets, "bytes_in": packets * 1316,
                    "drops": { "oversize": 0, "pool_exhausted": 0,
                               "kernel": if i == 777 { 5 * n } else { 0 } },
                    "receive_errors": 0,
                    "outputs": [{
                        "label": format!("239.20.{}.{}:6000", i / 250, i % 250),
                        "packets_out": packets, "bytes_out": packets * 1316,
                        "drops_backlog": 0, "drops_send_error": 0, "last_error": null,
                        "in_flight_high_water": 4,
                    }],
                });
                if i == 1 {
                    let leg = |input: &str, forwarded: u64| {
                        json!({ "input": input, "forwarded": forwarded, "standby": 0,
                                "kernel_drops": 0, "health": { "payload": "rtp",
                                "silent": false, "silence_ms": 1000, "max_gap_ns": 0 } })
                    };
                    flow["redundancy"] = json!({
                        "mode": "merge", "recovered": n, "duplicates": n, "lost": 0,
                        "resets": 0, "switches": 0, "active_input": 0, "late": 0,
                        "not_rtp": 0,
                        "legs": [leg("239.30.0.1:5000 on va", n), leg("239.31.0.1:5000 on vb", 0)],
                    });
                }
                if i == 500 {
                    flow["state"] = json!({ "state": "waiting_for_interface", "interface": "vX" });
                }
                flow
            })
            .collect();
        let pools = |w: u64| {
            json!([
                { "class": "small", "buffer_bytes": 1500, "capacity": 4096, "in_use": w,
                  "high_water": 9, "taken": n, "exhausted": 0 },
                { "class": "jumbo", "buffer_bytes": 9000, "capacity": 512, "in_use": 0,
                  "high_water": 0, "taken": 0, "exhausted": 0 },
            ])
        };
        let workers: Vec<_> = [0u64, 1]
            .iter()
            .map(|&w| {
                json!({
                    "index": w, "cpu": w, "receive_mode": "io_uring multishot",
                    "loop_turns": 1000 * n, "completions": 3000 * n,
                    "sends_submitted": 900 * n, "pools": pools(w),
                })
            })
            .collect();
        serde_json::from_value(json!({
            "version": "0.1.0", "pid": 31337, "uptime_seconds": 100 + n,
            "taken_at_unix_ms": 1_700_000_000_000u64 + 1000 * n,
            "state": { "state": "degraded", "reason": "1 flow not relaying" },
            "config_path": "/etc/mcrelay/recorded.toml",
            "workers": workers,
            "flows": flows,
        }))
        .expect("a recorded snapshot")
    }
}

impl Recorded {
    /// The reply to one request line, as the daemon would give it.
    fn answer(&mut self, line: &[u8]) -> Response {
        match parse_request(line) {
            Ok(Request::Status { summary: true }) => {
                self.requests += 1;
                Response::ok(&Summary::of(&Self::snapshot(self.requests)))
            }
            Ok(Request::Status { summary: false } | Request::Flows | Request::Stats) => {
                self.requests += 1;
                Response::ok(&Self::snapshot(self.requests))
            }
            Ok(Request::Reload { .. }) => Response::ok(&ReloadOutcome::default()),
            Ok(Request::Standby | Request::Active) => {
                Response::error("a recorded daemon has no mode to set")
            }
            Err(e) => Response::error(e),
        }
    }
}

/// Serve [`Recorded`] on a Unix socket at `path`, one request per
/// connection as the daemon does, until the process ends.
fn serve_recorded(path: &Path) {
    let listener = UnixListener::bind(path).expect("bind the recorded daemon's socket");
    std::thread::spawn(move || {
        let mut daemon = Recorded { requests: 0 };
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut line = Vec::new();
            if BufReader::new(&conn).read_until(b'\n', &mut line).is_err() {
                continue;
            }
            let reply = daemon.answer(&line).encode();
            let _ = conn.write_all(reply.as_bytes());
        }
    });
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl TempDir {
    /// A fresh directory for one test, with [`Recorded`] serving on its
    /// `control.sock`.
    fn with_recorded_daemon(test: &str) -> (TempDir, PathBuf) {
        let dir = TempDir(
            std::env::temp_dir().join(format!("mcrelay-top-{test}-{}", std::process::id())),
        );
        std::fs::create_dir_all(&dir.0).expect("temp dir");
        let socket = dir.0.join("control.sock");
        serve_recorded(&socket);
        (dir, socket)
    }
}

/// Piped, `top` prints the text frames without being asked to, with no
/// terminal control sequences, and `--iterations` ends it.
#[test]
fn piped_output_stays_plain() {
    let (_dir, socket) = TempDir::with_recorded_daemon("piped");
    let out = Command::new(mcrelayctl())
        .arg("--socket")
        .arg(&socket)
        .args(["top", "--iterations", "2", "--interval", "0.1"])
        .output()
        .expect("mcrelayctl");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains('\x1b'), "no escape sequences:\n{text}");
    assert_eq!(
        text.matches("mcrelayd 0.1.0, pid 31337").count(),
        2,
        "{text}"
    );
    assert!(
        text.contains("feed-0999") && text.contains("EXHAUSTED"),
        "{text}"
    );
}

#[test]
fn a_thousand_recorded_flows_sorted_filtered_scrolled_then_quit() {
    let (_dir, socket) = TempDir::with_recorded_daemon("tmux");
    let Some(tmux) = Tmux::start(&top_then_report(&socket, "0.2")) else {
        return;
    };
    // Each step waits until the whole screen shows what it expects: a
    // capture may catch a frame half drawn, never for long.

    // The first screen: every pane, flows by name, and rates once the
    // second snapshot is in.
    tmux.wait_for("the first screen, with rates", |s| {
        has_all(
            s,
            &[
                "mcrelayd 0.1.0 pid 31337 degraded: 1 flow not relaying",
                "flows: 1000 of 1000 · sort name ↑",
                " workers ",
                " pools ",
                " flow feed-0000 ",
                "q quit",
                " pkt/s ",
                "rows 1-",
                " of 2002 ",
                "merge: recovered ",
            ],
        ) && first_row(s).contains("▾ feed-0000")
            && legs_under_feed_0001(s)
    });

    // Sort by rate: the fastest flow first, selected, its TREND drawn.
    tmux.keys(&["r"]);
    tmux.wait_for("sorted by rate", |s| {
        let row = first_row(s);
        has_all(s, &["sort rate ↓", " flow feed-0999 ", "999 pkt/s"])
            && row.contains("▾ feed-0999")
            && row.contains('█')
    });
    // By drops: the one flow that drops, and every reason listed below.
    tmux.keys(&["d"]);
    tmux.wait_for("sorted by drops", |s| {
        let row = first_row(s);
        row.contains("feed-0777")
            && row.contains("kernel=")
            && s.contains("ingress drops: oversize 0 · pool_exhausted 0 · kernel ")
    });

    // Filter by a name glob, applied as it is typed; Enter keeps it.
    tmux.keys(&["/"]);
    tmux.type_text("feed-07?7");
    tmux.wait_for_all(&["filter flows by name", "feed-07?7▏", "flows: 10 of 1000"]);
    tmux.keys(&["Enter"]);
    tmux.wait_for("the glob kept", |s| {
        has_all(
            s,
            &[
                "flows: 10 of 1000 · sort drops ↓ · name feed-07?7",
                "q quit",
            ],
        ) && !s.contains("feed-0001")
    });
    // By state: the one flow not running.
    tmux.keys(&["c", "f", "f"]);
    tmux.wait_for("the flows not running", |s| {
        let row = first_row(s);
        has_all(s, &["flows: 1 of 1000", "state not_running"])
            && row.contains("feed-0500")
            && row.contains("waiting vX")
    });

    // Scroll to the last row of 2000, by name.
    tmux.keys(&["c", "n", "End"]);
    tmux.wait_for("the last row", |s| {
        has_all(
            s,
            &[
                "-2002 of 2002",
                "└─",
                "→ 239.20.3.249:6000",
                " flow feed-0999 ",
            ],
        ) && !s.contains("feed-0000")
    });
    // Fold every flow: one row each.
    tmux.keys(&["-"]);
    tmux.wait_for_all(&["-1000 of 1000", "▸ feed-0999"]);

    // Help over the view; any key closes it.
    tmux.keys(&["?"]);
    tmux.wait_for_all(&["mcrelayctl top: keys", "filter by state"]);
    tmux.keys(&["x"]);
    tmux.wait_for("the help closed", |s| {
        !s.contains("mcrelayctl top: keys") && s.contains("q quit")
    });

    // A smaller terminal: the selected flow's pane and HEALTH go.
    tmux.tmux(&["resize-window", "-t", "top", "-x", "100", "-y", "24"]);
    tmux.wait_for("the view fitted to 100x24", |s| {
        s.lines().count() <= 24
            && has_all(s, &[" pools ", "DROPS", "q quit"])
            && !s.contains(" flow feed-")
            && !s.contains("HEALTH")
    });

    // q: top exits 0, the main screen is back and the terminal cooked.
    tmux.keys(&["q"]);
    tmux.wait_for("top gone and the terminal restored", |s| {
        has_all(s, &["top exited 0", "terminal restored"]) && !s.contains("flows:")
    });
}

#[test]
fn the_live_view_of_a_real_daemon() {
    if tmux_missing() {
        return;
    }
    let Some(t) = Topology::new() else { return };
    let socket = t.dir.join("control.sock");
    let relay = t.relay(
        r#"
[[flow]]
name = "one"
input = { interface = "vRA", address = "239.1.1.1", port = 5000 }
outputs = [ { interface = "vRB", address = "239.2.2.1", port = 6000 } ]

[[flow]]
name = "two"
input = { interface = "vRA", address = "239.1.1.2", port = 5000 }
outputs = [
    { interface = "vRB", address = "239.2.2.2", port = 6000 },
    { interface = "vRB", address = "239.2.2.3", port = 6000 },
]

[[flow]]
name = "late"
input = { interface = "vRA", address = "239.1.1.3", port = 5000 }
outputs = [ { interface = "vRC", address = "239.2.2.4", port = 6000 } ]
"#,
        &[],
    );
    let tx = t.sender(&t.a, "239.1.1.2:5000", Some("vA"), None, 500);
    wait_for_packets_in(&socket, "two", 50);

    let tmux = Tmux::start(&top_then_report(&socket, "0.5")).expect("tmux, checked above");
    // By name, with rates (from the second snapshot on).
    tmux.wait_for("the first screen, with rates", |s| {
        has_all(
            s,
            &[
                "flows: 3 of 3 · sort name ↑",
                "▾ two",
                "→ 239.2.2.3:6000",
                "waiting vRC",
                "239.1.1.1:5000 on vRA",
                " workers ",
                " pools ",
                " pkt/s ",
            ],
        ) && first_row(s).contains("late")
    });
    // Sorted by rate, the flow with traffic comes first, relaying,
    // selected, its rate not zero.
    tmux.keys(&["r"]);
    tmux.wait_for("two first, by rate, with a rate", |s| {
        let row = first_row(s);
        row.contains("▾ two")
            && row.contains("running")
            && row.contains("b/s")
            && !row.contains(" 0 b/s")
            && has_all(s, &[" flow two ", "received ", "health: udp"])
    });
    // The state filter: only the flow waiting for its interface.
    tmux.keys(&["f", "f"]);
    tmux.wait_for("the flows not running", |s| {
        has_all(s, &["flows: 1 of 3", "state not_running"]) && first_row(s).contains("late")
    });
    tmux.keys(&["c"]);
    tmux.wait_for_all(&["flows: 3 of 3 · sort rate ↓ · name * · state all"]);
    // Enter folds the selected flow's outputs away.
    tmux.keys(&["Home", "Enter"]);
    tmux.wait_for("two folded", |s| {
        let mut rows = s.lines().skip_while(|l| !l.contains("│FLOW ")).skip(1);
        rows.next().is_some_and(|r| r.contains("▸ two"))
            && rows.next().is_some_and(|r| r.contains("▾ late"))
    });

    // The daemon goes away: the view says so and keeps the last snapshot.
    let log = relay.stop();
    stop_sender(tx);
    tmux.wait_for(&format!("the daemon gone\n{log}"), |s| {
        has_all(s, &["daemon not answering: connecting to", "▸ two"])
    });

    // SIGTERM: top restores the terminal and exits 0.
    let pid = tmux.program_pid();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    tmux.wait_for("top gone and the terminal restored", |s| {
        has_all(s, &["top exited 0", "terminal restored"]) && !s.contains("flows:")
    });
}
