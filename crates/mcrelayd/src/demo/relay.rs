//! The daemon under demonstration: `mcrelayd` started in the relay
//! namespace (stopped on drop), asked over its control socket, and its CPU
//! time read from `/proc`.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::error::{DemoError, IoContext};
use mcrelay_control::{Request, Snapshot};

use super::netns::Topology;
use super::{POLL, START_TIMEOUT, sys};

/// The daemon, started in the relay namespace; stopped on drop.
pub(super) struct Daemon {
    child: Child,
    log: PathBuf,
    pub(super) socket: PathBuf,
}

impl Daemon {
    pub(super) fn start(
        topology: &Topology,
        dir: &Path,
        config_text: &str,
        stop: &AtomicBool,
    ) -> Result<Self, DemoError> {
        let socket = dir.join("control.sock");
        let config = dir.join("mcrelay.toml");
        std::fs::write(&config, config_text).ctx(|| format!("writing {}", config.display()))?;
        let log = dir.join("mcrelayd.log");
        let log_file = std::fs::File::create(&log).ctx(|| format!("creating {}", log.display()))?;
        let exe = std::env::current_exe().ctx(|| "finding this executable".into())?;
        // `ip netns exec` enters the namespace and execs the daemon, so the
        // child's PID is the daemon's. Its own process group keeps a
        // terminal's Ctrl-C away from it: the demo stops it, in order.
        let child = Command::new("ip")
            .args(["netns", "exec", &topology.relay])
            .arg(exe)
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().ctx(|| "log file".into())?)
            .stderr(log_file)
            .process_group(0)
            .spawn()
            .ctx(|| "starting mcrelayd in the relay namespace".into())?;
        let mut daemon = Daemon { child, log, socket };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            // Up, and every flow relaying: a freshly created veth reports
            // its carrier a moment after it is set up, and until then the
            // daemon holds the flows that use it.
            if ask::<Snapshot>(&daemon.socket, Request::Flows).is_ok_and(|s| {
                !s.flows.is_empty()
                    && s.flows
                        .iter()
                        .all(|f| f.state == mcrelay_control::FlowState::Running)
            }) {
                return Ok(daemon);
            }
            if stop.load(Ordering::Relaxed) {
                return Err(DemoError::Interrupted);
            }
            if let Some(status) = daemon.exited() {
                return Err(DemoError::DaemonExited {
                    status,
                    when: "starting",
                    log: daemon.log_tail(),
                });
            }
            if Instant::now() > deadline {
                return Err(DemoError::DaemonSilent {
                    timeout: START_TIMEOUT,
                    log: daemon.log_tail(),
                });
            }
            std::thread::sleep(POLL);
        }
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it has exited (and so is reaped).
    pub(super) fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The last lines of its log, indented.
    pub(super) fn log_tail(&self) -> String {
        let mut text = String::new();
        let _ = std::fs::File::open(&self.log).and_then(|mut f| f.read_to_string(&mut text));
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(20)..];
        format!(
            "mcrelayd's log ({}):\n    {}",
            self.log.display(),
            tail.join("\n    ")
        )
    }

    /// SIGTERM, then wait (SIGKILL after 5 s); its exit status.
    pub(super) fn stop(&mut self) -> Option<std::process::ExitStatus> {
        if let Some(status) = self.exited() {
            return Some(status);
        }
        let _ = sys::terminate(self.pid());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Some(status) = self.exited() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        self.child.wait().ok()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// User plus system clock ticks of `pid` (all its threads) and of its
/// descendants (the daemon's privileged zygote and the helper it forked).
pub(super) fn cpu_ticks(pid: u32) -> Option<u64> {
    let own = stat_ticks(pid)?;
    let children: u64 = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok())
                .collect::<Vec<_>>()
        })
        .filter_map(cpu_ticks)
        .sum();
    Some(own + children)
}

/// utime + stime from `/proc/PID/stat`.
fn stat_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_ticks(&stat)
}

/// utime + stime (fields 14 and 15) of a `/proc/PID/stat` line; the
/// command name (field 2) may hold spaces and parentheses.
fn parse_stat_ticks(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// One request on the daemon's control socket, its decoded reply.
pub(super) fn ask<T: serde::de::DeserializeOwned>(
    socket: &Path,
    request: Request,
) -> Result<T, DemoError> {
    Ok(mcrelay_control::client::ask(
        socket,
        &request,
        Duration::from_secs(5),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields() {
        let line = "1234 (mcrelayd (x) y) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 3 0";
        assert_eq!(parse_stat_ticks(line), Some(325));
        assert_eq!(parse_stat_ticks("garbage"), None);
        assert_eq!(parse_stat_ticks("1 (x) S 1 2"), None);
    }
}
