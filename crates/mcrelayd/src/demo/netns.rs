//! The demo's throwaway topology: three network namespaces joined by two
//! veth pairs, built with iproute2 and removed when the [`Topology`] is
//! dropped (normal end, error or signal; not SIGKILL: a later run removes
//! what a killed one left, see [`remove_leftovers`]).
//!
//! ```text
//!  <prefix>-snd (sender)      <prefix>-relay (mcrelayd)              <prefix>-rcv (receivers)
//!  vsend 192.0.2.1 <--veth--> vin 192.0.2.2 | vout 198.51.100.1 <--veth--> vrecv 198.51.100.2
//! ```

use std::io;
use std::path::Path;
use std::process::{Command, Stdio};

/// Prefix of every namespace the demo creates; the rest is the PID of the
/// demo process and a role.
pub const PREFIX: &str = "mcrelay-demo-";

/// Interfaces and addresses, as in the module's picture.
pub const SENDER_IF: &str = "vsend";
pub const SENDER_ADDR: &str = "192.0.2.1/24";
pub const RELAY_IN_IF: &str = "vin";
pub const RELAY_IN_ADDR: &str = "192.0.2.2/24";
pub const RELAY_OUT_IF: &str = "vout";
pub const RELAY_OUT_ADDR: &str = "198.51.100.1/24";
pub const RECEIVER_IF: &str = "vrecv";
pub const RECEIVER_ADDR: &str = "198.51.100.2/24";

/// Why the topology could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// `ip` itself is missing or would not start.
    #[error("cannot run `ip` (iproute2): {0}; install iproute2 (e.g. apt install iproute2)")]
    NoIp(#[source] io::Error),
    /// The first `ip netns add` failed: no namespaces here.
    #[error(
        "network namespaces are not available: `ip netns add {name}` failed: {stderr}\n\
         The demo needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and a kernel with network \
         namespaces (CONFIG_NET_NS); in a container, start it with --privileged."
    )]
    Unavailable { name: String, stderr: String },
    /// A later step failed.
    #[error("`ip {args}` failed: {stderr}")]
    Step { args: String, stderr: String },
}

/// The three namespaces; removed on drop.
#[derive(Debug)]
pub struct Topology {
    pub sender: String,
    pub relay: String,
    pub receivers: String,
    /// The namespaces created so far (all three once `build` returned).
    created: Vec<String>,
}

impl Topology {
    /// The names for the demo process `pid`.
    pub fn names(pid: u32) -> [String; 3] {
        ["snd", "relay", "rcv"].map(|role| format!("{PREFIX}{pid}-{role}"))
    }

    /// Create the namespaces and links. On error, whatever was created is
    /// removed again.
    pub fn build(pid: u32) -> Result<Self, TopologyError> {
        let [sender, relay, receivers] = Self::names(pid);
        let mut t = Topology {
            sender,
            relay,
            receivers,
            created: Vec::new(),
        };
        for ns in [t.sender.clone(), t.relay.clone(), t.receivers.clone()] {
            match ip(&["netns", "add", &ns]) {
                Ok(()) => t.created.push(ns.clone()),
                Err(TopologyError::Step { stderr, .. }) if t.created.is_empty() => {
                    return Err(TopologyError::Unavailable { name: ns, stderr });
                }
                Err(e) => return Err(e),
            }
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        let veth = |a_ns: &str, a: &str, b_ns: &str, b: &str| {
            ip(&[
                "link", "add", a, "netns", a_ns, "mtu", "9200", "type", "veth", "peer", "name", b,
                "netns", b_ns, "mtu", "9200",
            ])
        };
        veth(&t.sender, SENDER_IF, &t.relay, RELAY_IN_IF)?;
        veth(&t.relay, RELAY_OUT_IF, &t.receivers, RECEIVER_IF)?;
        for (ns, dev, addr) in [
            (&t.sender, SENDER_IF, SENDER_ADDR),
            (&t.relay, RELAY_IN_IF, RELAY_IN_ADDR),
            (&t.relay, RELAY_OUT_IF, RELAY_OUT_ADDR),
            (&t.receivers, RECEIVER_IF, RECEIVER_ADDR),
        ] {
            ip(&["-n", ns, "addr", "add", addr, "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        // Multicast leaves the sender, and arrives at the receivers, on
        // their one link.
        ip(&[
            "-n",
            &t.sender,
            "route",
            "add",
            "224.0.0.0/4",
            "dev",
            SENDER_IF,
        ])?;
        ip(&[
            "-n",
            &t.receivers,
            "route",
            "add",
            "224.0.0.0/4",
            "dev",
            RECEIVER_IF,
        ])?;
        Ok(t)
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        // Deleting a namespace deletes its veth ends (and so their peers).
        for ns in self.created.drain(..) {
            if let Err(e) = ip(&["netns", "del", &ns]) {
                eprintln!("mcrelayd demo: could not remove namespace {ns}: {e}");
            }
        }
    }
}

/// Run `ip ARGS`; its stderr becomes the error.
fn ip(args: &[&str]) -> Result<(), TopologyError> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(TopologyError::NoIp)?;
    if out.status.success() {
        Ok(())
    } else {
        Err(TopologyError::Step {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// Namespaces named `<PREFIX><pid>-...` whose demo process is gone (it
/// was killed with SIGKILL, say), removed; returns their names.
pub fn remove_leftovers() -> Vec<String> {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // `name` or `name (id: 3)`.
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = leftover_pid(name) else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        // A daemon that outlived its demo (killed with SIGKILL) still runs
        // in the relay namespace: stop it first.
        if let Ok(pids) = Command::new("ip").args(["netns", "pids", name]).output() {
            for p in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-TERM", p]).status();
            }
        }
        if ip(&["netns", "del", name]).is_ok() {
            removed.push(name.to_owned());
        }
    }
    removed
}

/// The PID in a demo namespace's name.
fn leftover_pid(name: &str) -> Option<u32> {
    name.strip_prefix(PREFIX)?.split('-').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_prefix_and_pid() {
        let names = Topology::names(4242);
        assert_eq!(
            names,
            [
                "mcrelay-demo-4242-snd",
                "mcrelay-demo-4242-relay",
                "mcrelay-demo-4242-rcv"
            ]
        );
        for n in &names {
            assert_eq!(leftover_pid(n), Some(4242));
        }
        assert_eq!(leftover_pid("mcr-a-1-0"), None);
        assert_eq!(leftover_pid("mcrelay-demo-x-snd"), None);
    }
}
