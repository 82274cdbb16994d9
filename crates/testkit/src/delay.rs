//! A delayed link for namespace tests: `nfdelay` (this crate's binary) fed
//! by an iptables `NFQUEUE` rule in a router namespace, since this kernel
//! has no netem. Loss is a separate `-m statistic ... -j DROP` rule.

use std::io::{self, BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long `nfdelay` may take to bind its queue on a loaded machine.
const READY_DEADLINE: Duration = Duration::from_secs(30);

/// Where the `nfdelay` binary is: `$MCRELAY_NFDELAY`, else beside the
/// running test's target directory (`cargo test --workspace` builds it;
/// alone, `cargo build -p mcrelay-testkit`).
pub fn nfdelay_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("MCRELAY_NFDELAY") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    // target/debug/deps/<test> -> target/debug/nfdelay
    exe.parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("nfdelay"))
        .unwrap_or_else(|| PathBuf::from("nfdelay"))
}

/// Packets matching an iptables rule in a namespace, held for a fixed delay.
/// The rule is inserted once `nfdelay` is ready (so nothing is dropped for
/// want of a listener) and removed, and `nfdelay` ended, on drop.
#[derive(Debug)]
pub struct DelayedLink {
    netns: String,
    rule: Vec<String>,
    child: Child,
}

impl DelayedLink {
    /// Delay what `rule` matches in `netns` (iptables arguments after `-I`:
    /// a chain, then matches, e.g. `["FORWARD", "-i", "veth-a"]`) by `delay`,
    /// through NFQUEUE number `queue`.
    pub fn start(netns: &str, queue: u16, delay: Duration, rule: &[&str]) -> io::Result<Self> {
        let binary = nfdelay_binary();
        if !binary.exists() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{} is missing: cargo build -p mcrelay-testkit",
                    binary.display()
                ),
            ));
        }
        let mut child = Command::new("ip")
            .args(["netns", "exec", netns])
            .arg(&binary)
            .args(["--queue", &queue.to_string()])
            .args(["--delay-ms", &delay.as_millis().to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| io::Error::other("no stdout"))?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = tx.send(BufReader::new(stdout).read_line(&mut line).map(|_| line));
        });
        let ready = rx.recv_timeout(READY_DEADLINE);
        if !matches!(&ready, Ok(Ok(line)) if line.starts_with("nfdelay: ready")) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(io::Error::other(format!(
                "nfdelay did not become ready: {ready:?}"
            )));
        }
        let mut rule: Vec<String> = rule.iter().map(|s| s.to_string()).collect();
        rule.extend(["-j", "NFQUEUE", "--queue-num"].map(String::from));
        rule.push(queue.to_string());
        let link = DelayedLink {
            netns: netns.to_owned(),
            rule,
            child,
        };
        link.iptables("-I")?;
        Ok(link)
    }

    fn iptables(&self, op: &str) -> io::Result<()> {
        let status = Command::new("ip")
            .args(["netns", "exec", &self.netns, "iptables", op])
            .args(&self.rule)
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "iptables {op} {:?} failed: {status}",
                self.rule
            )))
        }
    }
}

impl Drop for DelayedLink {
    fn drop(&mut self) {
        let _ = self.iptables("-D");
        // The child is ours: ended by its own handle (its PID), never by name.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
