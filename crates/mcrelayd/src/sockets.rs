//! Where a flow's sockets come from, before it starts (at start-up or on a
//! reload): the privileged helper process when the daemon started with
//! privileges (it keeps them; the daemon drops its own), or the daemon
//! itself when it never had any (a developer's unprivileged run). Both
//! warn when the kernel grants less buffer than asked.

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use mcrelay_config::{Flow, IngressKind, Output};
use mcrelay_helper::packet::{flow_match, open_packet_ingress};
use mcrelay_helper::sockets::open_egress_or_pending;
use mcrelay_helper::{
    EGRESS_SEND_BUFFER_BYTES, HelperClient, HelperError, OpenedFlow, Zygote, ZygoteError, hung_up,
    interface_index, open_ingress, watch_hangup,
};
use mcrelay_relay::Redundancy;
use mcrelay_uring::{FlowSockets, IngressSocket, OutputSocket};

use crate::outputs::Unconnected;

/// The source of sockets.
pub enum Opener {
    /// Open them in this process (no privileges to separate). Interfaces
    /// are looked up at every open: one may have been re-created with
    /// another index since.
    Direct,
    /// Ask the privileged helper, which checks every request against the
    /// config file it read itself. The zygote forks a new one, with the
    /// same privileges, when it dies.
    Helper {
        client: HelperClient,
        zygote: Zygote,
        /// Called (from a watcher thread) when the helper hangs up.
        on_exit: Option<HelperWaker>,
    },
}

/// What wakes the supervisor when the helper dies.
pub type HelperWaker = Arc<dyn Fn() + Send + Sync>;

impl std::fmt::Debug for Opener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Opener::Direct => f.write_str("Direct"),
            Opener::Helper { client, zygote, .. } => f
                .debug_struct("Helper")
                .field("client", client)
                .field("zygote", zygote)
                .finish_non_exhaustive(),
        }
    }
}

impl Opener {
    /// Start the privileged zygote (`mcrelayd helper --config FILE
    /// [--user USER]`, fd 3 its end of the connection; `user` when started
    /// as root) and have it fork the first helper. Call it from the main
    /// thread before any other thread starts: the zygote's parent-death
    /// signal follows this thread.
    pub fn spawn_helper(config: &Path, user: Option<&str>) -> Result<Self, SpawnHelperError> {
        let exe = std::env::current_exe().map_err(SpawnHelperError::OwnExecutable)?;
        let config = config
            .to_str()
            .ok_or(SpawnHelperError::ConfigPathNotUtf8)?
            .to_owned();
        let mut args = vec!["helper", "--config", &config];
        args.extend(user.iter().flat_map(|u| ["--user", u]));
        let mut zygote = Zygote::spawn(&exe, &args).map_err(SpawnHelperError::Zygote)?;
        let (pid, client) = first_helper(&mut zygote)?;
        tracing::info!(pid, zygote = zygote.pid(), "privileged helper started");
        Ok(Opener::Helper {
            client,
            zygote,
            on_exit: None,
        })
    }

    /// Call `waker` whenever the helper dies, from a watcher thread.
    pub fn on_helper_exit(&mut self, waker: HelperWaker) -> Result<(), WatchError> {
        if let Opener::Helper {
            client, on_exit, ..
        } = self
        {
            watch(client, Arc::clone(&waker))?;
            *on_exit = Some(waker);
        }
        Ok(())
    }

    /// Replace a dead helper with a new one from the zygote, as privileged
    /// as the first; its pid.
    pub fn restart_helper(&mut self) -> Result<u32, RestartHelperError> {
        let Opener::Helper {
            client,
            zygote,
            on_exit,
        } = self
        else {
            return Err(RestartHelperError::NoHelper);
        };
        let (pid, new) = first_helper(zygote)?;
        *client = new;
        if let Some(waker) = on_exit {
            watch(client, Arc::clone(waker))?;
        }
        Ok(pid)
    }

    pub fn direct() -> Self {
        Opener::Direct
    }

    /// Tell the helper to re-read the config file (a reload may only add
    /// flows the file now defines).
    pub fn reload(&mut self) -> Result<(), HelperReloadError> {
        if let Opener::Helper { client, .. } = self {
            client.reload().map_err(HelperReloadError)?;
        }
        Ok(())
    }

    /// [`Self::reload`] in two halves: ask the helper to re-read its file
    /// now (while this process reads its own); whether an answer is due.
    pub fn start_reload(&mut self) -> Result<bool, HelperReloadError> {
        match self {
            Opener::Helper { client, .. } => {
                client.start_reload().map_err(HelperReloadError)?;
                Ok(true)
            }
            Opener::Direct => Ok(false),
        }
    }

    /// The helper's answer to [`Self::start_reload`] (nothing when none is
    /// due).
    pub fn finish_reload(&mut self) -> Result<(), HelperReloadError> {
        if let Opener::Helper { client, .. } = self {
            client.finish_reload().map_err(HelperReloadError)?;
        }
        Ok(())
    }

    /// Why the helper is gone, if it is: its connection hung up.
    pub fn helper_exited(&mut self) -> Option<String> {
        match self {
            Opener::Helper { client, zygote, .. } => {
                match hung_up(client.as_fd(), Some(Duration::ZERO)) {
                    Ok(false) => None,
                    Ok(true) => Some(match zygote.exited() {
                        Some(why) => format!("privileged helper exited with its zygote: {why}"),
                        None => "privileged helper exited (its connection closed)".to_owned(),
                    }),
                    Err(e) => Some(format!("privileged helper: {e}")),
                }
            }
            Opener::Direct => None,
        }
    }

    /// `flow`'s legs' ingress sockets and its output sockets, in config
    /// order, and the outputs among them not connected yet (see
    /// [`crate::outputs`]).
    pub fn open(
        &mut self,
        flow: &Flow,
    ) -> Result<(FlowSockets, Vec<(Unconnected, std::io::Error)>), OpenError> {
        let opened = match self {
            Opener::Direct => open_here(flow)?,
            Opener::Helper { client, .. } => {
                client
                    .open_flow(&flow.name)
                    .map_err(|source| OpenError::Helper {
                        flow: flow.name.clone(),
                        source,
                    })?
            }
        };
        let udp_outputs = flow.udp_outputs().count();
        if opened.outputs.len() != udp_outputs || opened.legs.len() != flow.inputs.len() {
            return Err(OpenError::Count {
                flow: flow.name.clone(),
                opened: (opened.legs.len(), opened.outputs.len()),
                configured: (flow.inputs.len(), udp_outputs),
            });
        }
        let OpenedFlow {
            legs,
            outputs,
            unconnected,
        } = opened;
        let (outputs, unconnected) = crate::srt::with_srt_outputs(flow, outputs, unconnected)
            .map_err(|source| OpenError::Srt {
                flow: flow.name.clone(),
                source,
            })?;
        let pending = crate::outputs::pending(flow, &outputs, &unconnected)?;
        let legs = flow
            .inputs
            .iter()
            .zip(legs)
            .map(|(input, leg)| {
                let requested = usize::try_from(input.receive_buffer_bytes).unwrap_or(usize::MAX);
                if leg.receive_buffer_bytes < requested {
                    tracing::warn!(
                        flow = %flow.name,
                        input = %input,
                        requested,
                        granted = leg.receive_buffer_bytes,
                        "receive buffer clamped by net.core.rmem_max; raise it (sysctl -w net.core.rmem_max={requested}) to absorb bursts"
                    );
                }
                match input.ingress {
                    IngressKind::Socket => IngressSocket::Udp(leg.socket.into()),
                    IngressKind::Packet => IngressSocket::Packet {
                        socket: leg.socket,
                        filter: flow_match(input),
                        membership: leg.membership,
                    },
                }
            })
            .collect();
        let outputs = flow
            .outputs
            .iter()
            .zip(outputs)
            .map(|(o, socket)| {
                let label = output_label(o);
                if o.srt.is_some() {
                    return OutputSocket::new(label, socket, o.queue_depth);
                }
                // Linux reports double the usable size it set.
                let granted = socket2::SockRef::from(&socket)
                    .send_buffer_size()
                    .unwrap_or(0)
                    / 2;
                if granted < EGRESS_SEND_BUFFER_BYTES {
                    tracing::warn!(
                        flow = %flow.name,
                        output = %label,
                        granted,
                        "send buffer clamped by net.core.wmem_max; raise it (sysctl -w net.core.wmem_max={EGRESS_SEND_BUFFER_BYTES}) so fan-out bursts queue instead of dropping"
                    );
                }
                OutputSocket::new(label, socket, o.queue_depth)
            })
            .collect();
        Ok((
            FlowSockets::with_legs(flow.name.clone(), legs, redundancy(flow), outputs)
                .with_health(crate::health::settings(flow)),
            pending,
        ))
    }
}

/// The data plane's rule for `flow`'s legs (times in nanoseconds).
pub fn redundancy(flow: &Flow) -> Redundancy {
    const MS: u64 = 1_000_000;
    match flow.redundancy {
        mcrelay_config::Redundancy::Single => Redundancy::Single,
        mcrelay_config::Redundancy::Merge {
            delay_ms,
            window_ms,
        } => Redundancy::Merge {
            delay_ns: u64::from(delay_ms) * MS,
            window_ns: u64::from(window_ms) * MS,
        },
        mcrelay_config::Redundancy::Failover {
            after_ms,
            revert_after_s,
        } => Redundancy::Failover {
            after_ns: u64::from(after_ms) * MS,
            revert_after_ns: (revert_after_s > 0).then(|| u64::from(revert_after_s) * 1000 * MS),
            rtp: flow.health.payload.has_rtp(),
        },
    }
}

/// After the helper exited (`why`): a new one from the zygote, logged;
/// or, if that fails, sockets opened here from now on, without privileges.
/// The problem to report, if one remains.
pub fn restart_helper(opener: &mut Opener, why: &str) -> Option<String> {
    tracing::error!("{why}; running flows continue; restarting it");
    match opener.restart_helper() {
        Ok(pid) => {
            tracing::info!(pid, "privileged helper restarted, with its privileges");
            None
        }
        Err(e) => {
            *opener = Opener::direct();
            let state = format!(
                "{why}; could not restart it ({}); opening sockets without privileges \
                 (restart the service to restore them)",
                crate::chain::Chain(&e)
            );
            tracing::warn!("{state}");
            Some(state)
        }
    }
}

/// A helper from `zygote`, answering a ping.
fn first_helper(zygote: &mut Zygote) -> Result<(u32, HelperClient), FirstHelperError> {
    let (pid, mut client) = zygote.helper().map_err(FirstHelperError::Start)?;
    client.ping().map_err(FirstHelperError::NoAnswer)?;
    Ok((pid, client))
}

/// Call `waker` once `client`'s helper hangs up.
fn watch(client: &HelperClient, waker: HelperWaker) -> Result<(), WatchError> {
    let fd = client
        .as_fd()
        .try_clone_to_owned()
        .map_err(WatchError::Duplicate)?;
    watch_hangup(fd, move || waker()).map_err(WatchError::Thread)?;
    Ok(())
}

/// Why the privileged helper (and its zygote) did not start.
#[derive(Debug, thiserror::Error)]
pub enum SpawnHelperError {
    #[error("finding mcrelayd's own executable")]
    OwnExecutable(#[source] std::io::Error),
    #[error("the config path is not UTF-8")]
    ConfigPathNotUtf8,
    #[error(transparent)]
    Zygote(ZygoteError),
    #[error(transparent)]
    FirstHelper(#[from] FirstHelperError),
}

/// Why a helper forked from the zygote is not usable.
#[derive(Debug, thiserror::Error)]
pub enum FirstHelperError {
    #[error("starting the privileged helper")]
    Start(#[source] ZygoteError),
    #[error("the privileged helper did not answer")]
    NoAnswer(#[source] HelperError),
}

/// Why the helper's connection cannot be watched for its exit.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("duplicating the helper connection to watch it")]
    Duplicate(#[source] std::io::Error),
    #[error("starting the helper watcher")]
    Thread(#[source] std::io::Error),
}

/// Why a dead helper was not replaced.
#[derive(Debug, thiserror::Error)]
pub enum RestartHelperError {
    #[error("no privileged helper to restart")]
    NoHelper,
    #[error(transparent)]
    FirstHelper(#[from] FirstHelperError),
    #[error(transparent)]
    Watch(#[from] WatchError),
}

/// The helper refused or failed to re-read the config file.
#[derive(Debug, thiserror::Error)]
#[error("the privileged helper could not reload the config")]
pub struct HelperReloadError(#[source] pub HelperError);

/// Why a flow's sockets could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("flow {flow:?}: the privileged helper")]
    Helper {
        flow: String,
        #[source]
        source: HelperError,
    },
    #[error(
        "flow {flow:?}: the helper opened {} inputs and {} outputs, the config has {} and {} (do the daemon and the helper read the same file?)",
        opened.0, opened.1, configured.0, configured.1
    )]
    Count {
        flow: String,
        /// Legs and outputs.
        opened: (usize, usize),
        configured: (usize, usize),
    },
    #[error("flow {flow:?}")]
    Interface {
        flow: String,
        #[source]
        source: std::io::Error,
    },
    #[error("flow {flow:?}: opening {kind} input {address}:{port} on {interface}")]
    Input {
        flow: String,
        kind: IngressKind,
        address: std::net::IpAddr,
        port: u16,
        interface: String,
        #[source]
        source: std::io::Error,
    },
    #[error("flow {flow:?}: opening output {address}:{port} on {interface}")]
    Output {
        flow: String,
        address: std::net::IpAddr,
        port: u16,
        interface: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Pending(#[from] crate::outputs::PendingError),
    #[error("flow {flow:?}: SRT output: {source}")]
    Srt {
        flow: String,
        #[source]
        source: std::io::Error,
    },
}

/// An output's label in counters and metrics: `address:port@interface`,
/// unique within a flow (two outputs may send the same group out of
/// different interfaces).
pub fn output_label(o: &Output) -> String {
    match &o.srt {
        None => format!("{}@{}", SocketAddr::new(o.address, o.port), o.interface),
        Some(s) => crate::srt::label(o.socket_addr(), s),
    }
}

/// `flow`'s sockets, opened in this process (no helper).
fn open_here(flow: &Flow) -> Result<OpenedFlow, OpenError> {
    let index_of = |name: &str| -> Result<u32, OpenError> {
        interface_index(name).map_err(|source| OpenError::Interface {
            flow: flow.name.clone(),
            source,
        })
    };
    let mut legs = Vec::with_capacity(flow.inputs.len());
    for input in &flow.inputs {
        let open = match input.ingress {
            IngressKind::Socket => open_ingress,
            // Needs CAP_NET_RAW, which an unprivileged run lacks: EPERM, said.
            IngressKind::Packet => open_packet_ingress,
        };
        legs.push(
            open(input, index_of(&input.interface)?).map_err(|source| OpenError::Input {
                flow: flow.name.clone(),
                kind: input.ingress,
                address: input.address,
                port: input.port,
                interface: input.interface.clone(),
                source,
            })?,
        );
    }
    let mut outputs = Vec::with_capacity(flow.outputs.len());
    let mut unconnected = Vec::new();
    for (i, o) in flow.udp_outputs().enumerate() {
        let (socket, pending) =
            open_egress_or_pending(o, index_of(&o.interface)?).map_err(|source| {
                OpenError::Output {
                    flow: flow.name.clone(),
                    address: o.address,
                    port: o.port,
                    interface: o.interface.clone(),
                    source,
                }
            })?;
        if let Some(e) = pending {
            unconnected.push((i, e.raw_os_error().unwrap_or(0)));
        }
        outputs.push(socket);
    }
    Ok(OpenedFlow {
        legs,
        outputs,
        unconnected,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(extra: &str) -> Flow {
        let text = format!(
            "[[flow]]\nname = \"f\"\ninputs = [\
             {{ interface = \"a\", address = \"239.1.1.1\", port = 5000 }}, \
             {{ interface = \"b\", address = \"239.1.1.1\", port = 5000 }}]\n\
             outputs = [{{ interface = \"c\", address = \"239.2.2.2\", port = 5000 }}]\n{extra}"
        );
        let c = mcrelay_config::parse(&text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
        c.flows.as_slice()[0].clone()
    }

    #[test]
    fn the_config_becomes_the_cores_rule_in_nanoseconds() {
        assert_eq!(
            redundancy(&flow(
                "redundancy = \"merge\"\npayload = \"rtp\"\nmerge_delay_ms = 20\nmerge_window_ms = 80"
            )),
            Redundancy::Merge {
                delay_ns: 20_000_000,
                window_ns: 80_000_000
            }
        );
        assert_eq!(
            redundancy(&flow("redundancy = \"failover\"\npayload = \"rtp-mpegts\"")),
            Redundancy::Failover {
                after_ns: 100_000_000,
                revert_after_ns: Some(10_000_000_000),
                rtp: true
            }
        );
        assert_eq!(
            redundancy(&flow(
                "redundancy = \"failover\"\nfailover_after_ms = 7\nrevert_after_s = 0"
            )),
            Redundancy::Failover {
                after_ns: 7_000_000,
                revert_after_ns: None,
                rtp: false
            }
        );
        let one = mcrelay_config::parse(
            "[[flow]]\nname = \"g\"\ninput = { interface = \"a\", address = \"239.1.1.1\", port = 5000 }\n\
             outputs = [{ interface = \"c\", address = \"239.2.2.2\", port = 5000 }]\n",
            "t.toml",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(redundancy(&one.flows.as_slice()[0]), Redundancy::Single);
    }
}
