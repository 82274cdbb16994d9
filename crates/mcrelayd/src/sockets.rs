//! Where a flow's sockets come from, before it starts (at start-up or on a
//! reload): the privileged helper process when the daemon started with
//! privileges (it keeps them; the daemon drops its own), or the daemon
//! itself when it never had any (a developer's unprivileged run). Both
//! warn when the kernel grants less buffer than asked.

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use mcrelay_config::{EgressKind, Flow, IngressKind, Input, Output};
use mcrelay_relay::fec::{Direction, FecLayout};
use mcrelay_relay::{LegId, Redundancy};
use mcrelay_sockets::packet::flow_match;
use mcrelay_sockets::{
    EGRESS_SEND_BUFFER_BYTES, HelperClient, HelperError, OpenFlowError, OpenedFlow, OpenedLeg,
    Zygote, ZygoteError, hung_up, open_flow, watch_hangup,
};
use mcrelay_uring::{
    FecOutput, FecSocket, FlowSockets, IngressSocket, OutputSocket, RistEnd, RistSocket,
};

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
        /// The helper's pid, to end it when it stops answering.
        pid: u32,
        zygote: Zygote,
        /// Called (from a watcher thread) when the helper hangs up.
        on_exit: Option<HelperWaker>,
    },
}

/// Where the helper program is installed (the .deb puts it there).
pub const DEFAULT_HELPER: &str = "/usr/libexec/mcrelay/mcrelay-helper";

/// The helper program's file name, next to `mcrelayd` in a build tree.
const HELPER_NAME: &str = "mcrelay-helper";

/// The helper program to start: `explicit` (`--helper`) when given; else
/// `mcrelay-helper` next to this executable, if there is one (a build
/// tree: `target/debug/`); else [`DEFAULT_HELPER`].
pub fn helper_program(explicit: Option<&Path>) -> Result<PathBuf, SpawnHelperError> {
    if let Some(path) = explicit {
        return Ok(path.to_owned());
    }
    let exe = std::env::current_exe().map_err(SpawnHelperError::OwnExecutable)?;
    let beside = exe.with_file_name(HELPER_NAME);
    Ok(if beside.is_file() {
        beside
    } else {
        PathBuf::from(DEFAULT_HELPER)
    })
}

/// Refuse a helper program that others than its owner (and root) may
/// replace: it will hold the network capabilities.
fn check_program(path: &Path) -> Result<(), SpawnHelperError> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).map_err(|source| SpawnHelperError::Program {
        path: path.to_owned(),
        source,
    })?;
    if !meta.is_file() || meta.mode() & 0o022 != 0 {
        return Err(SpawnHelperError::Unsafe {
            path: path.to_owned(),
            mode: meta.mode() & 0o7777,
        });
    }
    Ok(())
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
    /// Start the privileged zygote (`program --config FILE [--user
    /// USER]`, the `mcrelay-helper` program, fd 3 its end of the
    /// connection; `user` when started as root) and have it fork the first
    /// helper. Call it from the main thread before any other thread starts:
    /// the zygote's parent-death signal follows this thread.
    pub fn spawn_helper(
        program: &Path,
        config: &Path,
        user: Option<&str>,
    ) -> Result<Self, SpawnHelperError> {
        check_program(program)?;
        let config = config
            .to_str()
            .ok_or(SpawnHelperError::ConfigPathNotUtf8)?
            .to_owned();
        let mut args = vec!["--config", &config];
        args.extend(user.iter().flat_map(|u| ["--user", u]));
        let mut zygote =
            Zygote::spawn(program, &args).map_err(|source| SpawnHelperError::Zygote {
                program: program.to_owned(),
                source,
            })?;
        let (pid, client) = first_helper(&mut zygote)?;
        tracing::info!(
            pid,
            zygote = zygote.pid(),
            program = %program.display(),
            "privileged helper started"
        );
        Ok(Opener::Helper {
            client,
            pid,
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

    /// Replace a dead or stuck helper with a new one from the zygote, as
    /// privileged as the first; its pid. A helper still there (stuck: it
    /// stopped answering) is killed first, so it can't answer late.
    pub fn restart_helper(&mut self) -> Result<u32, RestartHelperError> {
        let Opener::Helper {
            client,
            pid,
            zygote,
            on_exit,
        } = self
        else {
            return Err(RestartHelperError::NoHelper);
        };
        end_helper(*pid, client);
        let (new_pid, new) = first_helper(zygote)?;
        *client = new;
        *pid = new_pid;
        let pid = new_pid;
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

    /// Why the helper is gone or unusable, if it is: its connection hung
    /// up, or a request to it went unanswered (timed out) or out of step,
    /// so it can't be trusted to answer the next one.
    pub fn helper_exited(&mut self) -> Option<String> {
        match self {
            Opener::Helper { client, zygote, .. } => {
                match hung_up(client.as_fd(), Some(Duration::ZERO)) {
                    Ok(false) => client
                        .broken()
                        .map(|why| format!("privileged helper stopped answering: {why}")),
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
        let mut opened = match self {
            Opener::Direct => open_flow(flow)?,
            Opener::Helper { client, .. } => {
                client
                    .open_flow(&flow.name)
                    .map_err(|source| OpenError::Helper {
                        flow: flow.name.clone(),
                        source,
                    })?
            }
        };
        // The helper opens the UDP outputs (an SRT output is the daemon's
        // own), then the FEC destinations, then the RIST outputs' RTCP
        // sockets; each extra socket is mapped to its output by config
        // index, SRT outputs in between or not.
        let inputs = flow.receive_inputs();
        let send_outputs = flow.send_outputs();
        // Last, each `egress = "xdp"` output's AF_XDP socket and UMEM.
        let xdp_count = flow
            .outputs
            .iter()
            .filter(|o| o.egress == EgressKind::Xdp)
            .count();
        let mut xdp_fds = opened
            .take_xdp_outputs(xdp_count)
            .unwrap_or_default()
            .into_iter();
        if opened.outputs.len() != send_outputs.len()
            || opened.legs.len() != inputs.len()
            || xdp_fds.len() != xdp_count
        {
            return Err(OpenError::Count {
                flow: flow.name.clone(),
                opened: (opened.legs.len(), opened.outputs.len()),
                configured: (inputs.len(), send_outputs.len()),
            });
        }
        let OpenedFlow {
            mut legs,
            mut outputs,
            unconnected,
            ..
        } = opened;
        let udp_outputs = flow.udp_outputs().count();
        // After the outputs, each FEC output's column then row socket
        // (one left unconnected now stays so: its sends fail, counted).
        let mut parity_sockets = outputs.split_off(udp_outputs);
        let fec_outputs_count = flow.outputs.iter().filter(|o| o.fec.is_some()).count();
        let rist_output_sockets =
            parity_sockets.split_off((2 * fec_outputs_count).min(parity_sockets.len()));
        let unconnected: Vec<(usize, i32)> = unconnected
            .into_iter()
            .filter(|&(i, _)| i < udp_outputs)
            .collect();
        // After the UDP legs (an SRT leg is the daemon's own), each FEC
        // leg's column then row socket.
        let mut fec_sockets = legs.split_off(flow.udp_inputs().count());
        let fec_legs_count = flow.inputs.iter().filter(|i| i.fec.is_some()).count();
        let rist_leg_sockets = fec_sockets.split_off((2 * fec_legs_count).min(fec_sockets.len()));
        let rist = rist_sockets(flow, rist_leg_sockets, rist_output_sockets);
        let fec_legs = flow
            .inputs
            .iter()
            .enumerate()
            .filter(|(_, i)| i.fec.is_some())
            .flat_map(|(leg, _)| [(leg, Direction::Column), (leg, Direction::Row)]);
        let fec: Vec<FecSocket> = fec_legs
            .zip(fec_sockets)
            .map(|((leg, direction), s)| FecSocket {
                leg: LegId(u8::try_from(leg).unwrap_or(u8::MAX)),
                direction,
                socket: IngressSocket::Udp(s.socket.into()),
            })
            .collect();
        let (outputs, unconnected) = crate::srt::with_srt_outputs(flow, outputs, unconnected)
            .map_err(|source| OpenError::Srt {
                flow: flow.name.clone(),
                source,
            })?;
        let pending = crate::outputs::pending(flow, &outputs, &unconnected)?;
        // The helper opened the UDP legs; an SRT leg is a socket pair's
        // end, fed by the SRT thread.
        let mut srt_legs = crate::srt::srt_inputs(flow)
            .map_err(|source| OpenError::Srt {
                flow: flow.name.clone(),
                source,
            })?
            .into_iter()
            .peekable();
        let mut udp_legs = legs.into_iter();
        let mut legs = Vec::with_capacity(flow.inputs.len());
        for (i, input) in flow.inputs.iter().enumerate() {
            if srt_legs.peek().is_some_and(|(leg, _)| *leg == i) {
                if let Some((_, s)) = srt_legs.next() {
                    legs.push(IngressSocket::Udp(s));
                }
                continue;
            }
            let Some(leg) = udp_legs.next() else {
                break;
            };
            legs.push(udp_leg(flow, input, leg));
        }
        let outputs = flow
            .outputs
            .iter()
            .zip(outputs)
            .map(|(o, socket)| {
                let label = output_label(o);
                if o.srt.is_some() {
                    return Ok(OutputSocket::new(label, socket, o.queue_depth));
                }
                if o.egress == EgressKind::Xdp {
                    let Some(fds) = xdp_fds.next() else {
                        return Err(OpenError::Count {
                            flow: flow.name.clone(),
                            opened: (legs.len(), xdp_count),
                            configured: (inputs.len(), xdp_count),
                        });
                    };
                    let xsk = xdp_output(o, &socket, fds).map_err(|source| OpenError::Xdp {
                        flow: flow.name.clone(),
                        output: label.clone(),
                        source,
                    })?;
                    return Ok(OutputSocket::new(label, socket, o.queue_depth).with_xsk(xsk));
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
                Ok(OutputSocket::new(label, socket, o.queue_depth))
            })
            .collect::<Result<Vec<_>, OpenError>>()?;
        Ok((
            FlowSockets::with_legs(flow.name.clone(), legs, redundancy(flow), outputs)
                .with_health(crate::health::settings(flow))
                .with_fec(fec)
                .with_fec_outputs(fec_outputs(flow, parity_sockets))
                .with_busy_poll(flow.latency == mcrelay_config::Latency::Low)
                .with_rist(rist),
            pending,
        ))
    }
}

/// A UDP or packet leg as the worker takes it (the receive buffer the
/// kernel granted is checked here, once).
fn udp_leg(flow: &Flow, input: &Input, leg: OpenedLeg) -> IngressSocket {
    let requested = usize::try_from(input.receive_buffer_bytes).unwrap_or(usize::MAX);
    if leg.receive_buffer_bytes < requested && input.ingress != IngressKind::Xdp {
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
        IngressKind::Xdp => match leg.xdp {
            Some(xdp) => IngressSocket::Xdp {
                socket: leg.socket,
                filter: flow_match(input),
                umem: xdp.umem,
                link: xdp.link,
                membership: leg.membership,
            },
            // The helper sent an xdp leg without its UMEM and link (never:
            // `OpenedFlow::from_reply` pairs them); the worker then finds
            // no ring and logs.
            None => IngressSocket::Packet {
                socket: leg.socket,
                filter: flow_match(input),
                membership: leg.membership,
            },
        },
    }
}

/// The RTCP sockets (port + 1) of `flow`'s RIST legs (`legs`, in leg
/// order) and RIST outputs (`outputs`, in output order), named by leg
/// number and config output index.
fn rist_sockets(
    flow: &Flow,
    legs: Vec<mcrelay_sockets::OpenedLeg>,
    outputs: Vec<std::net::UdpSocket>,
) -> Vec<RistSocket> {
    let rist_legs = flow
        .inputs
        .iter()
        .enumerate()
        .filter_map(|(i, input)| Some((i, input.rist?)));
    let mut all: Vec<RistSocket> = rist_legs
        .zip(legs)
        .map(|((leg, r), s)| RistSocket {
            end: RistEnd::Leg(LegId(u8::try_from(leg).unwrap_or(u8::MAX))),
            buffer_ms: r.buffer_ms,
            socket: s.socket.into(),
            peer: None,
        })
        .collect();
    let rist_outputs = flow
        .outputs
        .iter()
        .enumerate()
        .filter_map(|(i, o)| Some((i, o, o.rist?)));
    all.extend(
        rist_outputs
            .zip(outputs)
            .map(|((index, o, r), socket)| RistSocket {
                end: RistEnd::Output(index),
                buffer_ms: r.buffer_ms,
                socket,
                peer: Some(std::net::SocketAddr::new(
                    o.address,
                    o.port.saturating_add(1),
                )),
            }),
    );
    all
}

/// The FEC of `flow`'s outputs with `fec`, on `sockets` (each one's
/// column then row socket, in output order).
fn fec_outputs(flow: &Flow, sockets: Vec<std::net::UdpSocket>) -> Vec<FecOutput> {
    let mut sockets = sockets.into_iter();
    let mut all = Vec::new();
    for (index, o) in flow.outputs.iter().enumerate() {
        let Some(fec) = o.fec else { continue };
        let (Some(column), Some(row)) = (sockets.next(), sockets.next()) else {
            break;
        };
        let label = |offset: u16| {
            let mut p = o.clone();
            p.port = p.port.saturating_add(offset);
            output_label(&p)
        };
        all.push(FecOutput {
            output: index,
            layout: FecLayout {
                columns: fec.columns,
                rows: fec.rows,
                row_stream: fec.columns >= 2,
            },
            column: OutputSocket::new(label(2), column, o.queue_depth),
            row: OutputSocket::new(label(4), row, o.queue_depth),
        });
    }
    all
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
            rtp_rewrite,
            gap_factor,
        } => Redundancy::Failover {
            after_ns: u64::from(after_ms) * MS,
            revert_after_ns: (revert_after_s > 0).then(|| u64::from(revert_after_s) * 1000 * MS),
            rtp: flow.health.payload.has_rtp(),
            rtp_rewrite: (rtp_rewrite && flow.health.payload.has_rtp())
                .then_some(flow.health.rtp_clock_hz),
            gap_factor,
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

/// End the helper `pid` on `client`'s connection if it is still there: a
/// stuck one (stopped, or blocked). A dead one is not signalled: its
/// connection hung up, and the zygote (which ignores `SIGCHLD`) has
/// reaped it, so its pid may be reused. The helper runs as this process's
/// user, so this process may signal it; `SIGKILL` also ends a stopped
/// process. The window between the check and the signal is the helper
/// dying and its pid being reused within microseconds; pids cycle through
/// `pid_max` first.
fn end_helper(pid: u32, client: &HelperClient) {
    if !matches!(hung_up(client.as_fd(), Some(Duration::ZERO)), Ok(false)) {
        return;
    }
    let Ok(raw) = i32::try_from(pid) else { return };
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), nix::sys::signal::SIGKILL) {
        Ok(()) => tracing::warn!(pid, "ended the privileged helper that stopped answering"),
        Err(nix::errno::Errno::ESRCH) => {}
        Err(e) => tracing::warn!(pid, "cannot end the old privileged helper: {e}"),
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
    #[error("finding mcrelayd's own executable (to find mcrelay-helper beside it)")]
    OwnExecutable(#[source] std::io::Error),
    #[error(
        "the privileged helper program {}; install it there or name it with --helper",
        path.display()
    )]
    Program {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the privileged helper program {} is not a regular file only its owner may change \
         (mode {mode:o}); it would hold the network capabilities: chmod go-w it",
        path.display()
    )]
    Unsafe { path: PathBuf, mode: u32 },
    #[error("the config path is not UTF-8")]
    ConfigPathNotUtf8,
    #[error("starting {}", program.display())]
    Zygote {
        program: PathBuf,
        #[source]
        source: ZygoteError,
    },
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
    /// Opened in this process (no helper).
    #[error(transparent)]
    Open(#[from] OpenFlowError),
    #[error(transparent)]
    Pending(#[from] crate::outputs::PendingError),
    #[error("flow {flow:?}: output {output} (egress = \"xdp\"): {source}")]
    Xdp {
        flow: String,
        output: String,
        #[source]
        source: std::io::Error,
    },
    #[error("flow {flow:?}: SRT output: {source}")]
    Srt {
        flow: String,
        #[source]
        source: std::io::Error,
    },
}

/// What the worker needs of an `egress = "xdp"` output beside its AF_XDP
/// socket: the frames' header, built once from the output's UDP socket
/// (its local address and port, which routing and `source_address` chose
/// when it was connected), the interface's MAC address and the
/// destination's: a group's multicast MAC, or for a unicast destination
/// its next hop's from the neighbour table ([`crate::neighbour`], which
/// may wait up to [`crate::neighbour::RESOLVE_WAIT`] for ARP); and the
/// largest payload the interface's MTU carries.
fn xdp_output(
    o: &Output,
    socket: &std::net::UdpSocket,
    fds: mcrelay_sockets::xdp::XdpEgressFds,
) -> std::io::Result<mcrelay_uring::worker::XskOutput> {
    let invalid = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, why);
    let (SocketAddr::V4(local), std::net::IpAddr::V4(destination)) =
        (socket.local_addr()?, o.address)
    else {
        return Err(invalid("not an IPv4 output".into()));
    };
    if local.ip().is_unspecified() {
        return Err(invalid(format!(
            "no source address on {} yet (the frames' headers are built once, when the flow starts)",
            o.interface
        )));
    }
    let source_mac = mcrelay_sys::xdp::interface_mac(&o.interface)?;
    let mtu = mcrelay_sys::xdp::interface_mtu(&o.interface)? as usize;
    let (destination_mac, next_hop) = if destination.is_multicast() {
        (mcrelay_wire::egress::multicast_mac(destination), None)
    } else {
        let resolved = crate::neighbour::resolve_mac(
            &o.interface,
            destination,
            crate::neighbour::RESOLVE_WAIT,
        )?;
        tracing::info!(
            output = %SocketAddr::new(o.address, o.port),
            interface = %o.interface,
            next_hop = %resolved.next_hop,
            next_hop_mac = %format_mac(resolved.mac),
            "xdp egress to a unicast destination: next hop resolved"
        );
        let mac = std::sync::Arc::new(mcrelay_uring::worker::NextHopMac::new(resolved.mac));
        crate::neighbour::follow(&resolved, &mac, output_label(o));
        (resolved.mac, Some(mac))
    };
    let header = mcrelay_wire::egress::Template::new(&mcrelay_wire::egress::Endpoints {
        source_mac,
        source: *local.ip(),
        source_port: local.port(),
        destination,
        destination_mac,
        port: o.port,
        ttl: o.ttl,
    });
    Ok(mcrelay_uring::worker::XskOutput {
        socket: fds.socket,
        umem: fds.umem,
        header,
        max_payload: mtu.saturating_sub(28),
        next_hop,
    })
}

/// `aa:bb:cc:dd:ee:ff`.
pub(crate) fn format_mac(mac: [u8; 6]) -> String {
    let [a, b, c, d, e, f] = mac;
    format!("{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{f:02x}")
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

    /// The extra sockets after the UDP outputs (FEC destinations, RIST
    /// RTCP) name their outputs by config index, SRT outputs in between
    /// or not (the config once refused output FEC beside an SRT output
    /// for fear of this mapping).
    #[test]
    fn extra_sockets_name_outputs_by_config_index_beside_srt() {
        let text = "[[flow]]\nname = \"f\"\n\
             input = { interface = \"a\", address = \"10.0.0.1\", port = 5000, protocol = \"rist\" }\n\
             outputs = [{ protocol = \"srt\", address = \"0.0.0.0\", port = 9000 },\
             { interface = \"c\", address = \"239.2.2.2\", port = 6000, fec = { columns = 5, rows = 5 } },\
             { interface = \"c\", address = \"10.0.0.9\", port = 7000, protocol = \"rist\", buffer_ms = 300 }]\n";
        let c = mcrelay_config::parse(text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
        let flow = &c.flows.as_slice()[0];
        let udp = || std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let fec = fec_outputs(flow, vec![udp(), udp()]);
        assert_eq!(fec.len(), 1);
        assert_eq!(fec[0].output, 1);
        assert_eq!(fec[0].column.label, "239.2.2.2:6002@c");
        let rist = rist_sockets(flow, Vec::new(), vec![udp()]);
        assert_eq!(rist.len(), 1);
        assert_eq!(rist[0].end, RistEnd::Output(2));
        assert_eq!(rist[0].buffer_ms, 300);
        assert_eq!(rist[0].peer, Some("10.0.0.9:7001".parse().expect("addr")));
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
                rtp: true,
                rtp_rewrite: None,
                gap_factor: 4
            }
        );
        assert_eq!(
            redundancy(&flow(
                "redundancy = \"failover\"\nfailover_after_ms = 7\nrevert_after_s = 0\nfailover_gap_factor = 0"
            )),
            Redundancy::Failover {
                after_ns: 7_000_000,
                revert_after_ns: None,
                rtp: false,
                rtp_rewrite: None,
                gap_factor: 0
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
