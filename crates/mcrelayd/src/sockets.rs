//! Where a flow's sockets come from, before it starts (at start-up or on a
//! reload): the privileged helper process when the daemon started with
//! privileges (it keeps them; the daemon drops its own), or the daemon
//! itself when it never had any (a developer's unprivileged run). Both
//! warn when the kernel grants less buffer than asked.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Child;

use anyhow::{Context, bail};
use mcrelay_config::{Flow, IngressKind, Output};
use mcrelay_dataplane::{FlowSockets, IngressSocket, OutputSocket};
use mcrelay_helper::packet::{flow_match, open_packet_ingress};
use mcrelay_helper::{
    EGRESS_SEND_BUFFER_BYTES, HelperClient, interface_index, open_egress, open_ingress,
};

/// The source of sockets.
#[derive(Debug)]
pub enum Opener {
    /// Open them in this process (no privileges to separate). Interfaces
    /// are looked up at every open: one may have been re-created with
    /// another index since.
    Direct,
    /// Ask the privileged helper, which checks every request against the
    /// config file it read itself.
    Helper { client: HelperClient, child: Child },
}

impl Opener {
    /// Start the helper (`mcrelayd helper --config FILE`, fd 3 its end of
    /// the connection). Call it from the main thread before any other
    /// thread starts: the helper's parent-death signal follows this thread.
    pub fn spawn_helper(config: &Path) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("finding mcrelayd's own executable")?;
        let config = config
            .to_str()
            .context("the config path is not UTF-8")?
            .to_owned();
        let (child, mut client) =
            mcrelay_helper::spawn_helper(&exe, &["helper", "--config", &config])
                .context("starting the privileged helper")?;
        client
            .ping()
            .context("the privileged helper did not answer")?;
        tracing::info!(pid = child.id(), "privileged helper started");
        Ok(Opener::Helper { client, child })
    }

    pub fn direct() -> Self {
        Opener::Direct
    }

    /// Tell the helper to re-read the config file (a reload may only add
    /// flows the file now defines).
    pub fn reload(&mut self) -> anyhow::Result<()> {
        if let Opener::Helper { client, .. } = self {
            client
                .reload()
                .context("the privileged helper could not reload the config")?;
        }
        Ok(())
    }

    /// Why the helper is gone, if it is.
    pub fn helper_exited(&mut self) -> Option<String> {
        match self {
            Opener::Helper { child, .. } => match child.try_wait() {
                Ok(Some(status)) => Some(format!("privileged helper exited ({status})")),
                Ok(None) => None,
                Err(e) => Some(format!("privileged helper: {e}")),
            },
            Opener::Direct => None,
        }
    }

    /// `flow`'s ingress and output sockets, in config order.
    pub fn open(&mut self, flow: &Flow) -> anyhow::Result<FlowSockets> {
        let opened = match self {
            Opener::Direct => open_here(flow)?,
            Opener::Helper { client, .. } => {
                let mut opened = client
                    .open_flow(&flow.name)
                    .with_context(|| format!("flow {:?}: the privileged helper", flow.name))?;
                // A packet flow on a group: the membership socket comes
                // last (the count check below catches one that's missing).
                let membership = if flow.input.ingress == IngressKind::Packet
                    && flow.input.address.is_multicast()
                {
                    opened.outputs.pop()
                } else {
                    None
                };
                if opened.outputs.len() != flow.outputs.len() {
                    bail!(
                        "flow {:?}: the helper opened {} outputs, the config has {} (do the daemon and the helper read the same file?)",
                        flow.name,
                        opened.outputs.len(),
                        flow.outputs.len()
                    );
                }
                Opened {
                    ingress: opened.ingress,
                    membership,
                    granted: opened.ingress_receive_buffer_bytes,
                    outputs: opened.outputs,
                }
            }
        };
        let Opened {
            ingress,
            membership,
            granted,
            outputs,
        } = opened;
        let ingress = match flow.input.ingress {
            IngressKind::Socket => IngressSocket::Udp(ingress.into()),
            IngressKind::Packet => IngressSocket::Packet {
                socket: ingress,
                filter: flow_match(&flow.input),
                membership,
            },
        };
        let requested = usize::try_from(flow.input.receive_buffer_bytes).unwrap_or(usize::MAX);
        if granted < requested {
            tracing::warn!(
                flow = %flow.name,
                requested,
                granted,
                "receive buffer clamped by net.core.rmem_max; raise it (sysctl -w net.core.rmem_max={requested}) to absorb bursts"
            );
        }
        let outputs = flow
            .outputs
            .iter()
            .zip(outputs)
            .map(|(o, socket)| {
                let label = output_label(o);
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
        Ok(FlowSockets::new(flow.name.clone(), ingress, outputs)
            .with_health(crate::health::settings(flow)))
    }
}

/// An output's label in counters and metrics: `address:port@interface`,
/// unique within a flow (two outputs may send the same group out of
/// different interfaces).
pub fn output_label(o: &Output) -> String {
    format!("{}@{}", SocketAddr::new(o.address, o.port), o.interface)
}

/// A flow's sockets, from the helper or opened here.
struct Opened {
    ingress: std::os::fd::OwnedFd,
    membership: Option<std::net::UdpSocket>,
    granted: usize,
    outputs: Vec<std::net::UdpSocket>,
}

fn open_here(flow: &Flow) -> anyhow::Result<Opened> {
    let index_of = |name: &str| -> anyhow::Result<u32> {
        interface_index(name).with_context(|| format!("flow {:?}", flow.name))
    };
    let input = &flow.input;
    let open = match input.ingress {
        IngressKind::Socket => open_ingress,
        // Needs CAP_NET_RAW, which an unprivileged run lacks: EPERM, said.
        IngressKind::Packet => open_packet_ingress,
    };
    let ingress = open(input, index_of(&input.interface)?).with_context(|| {
        format!(
            "flow {:?}: opening {} input {}:{} on {}",
            flow.name, input.ingress, input.address, input.port, input.interface
        )
    })?;
    let mut outputs = Vec::with_capacity(flow.outputs.len());
    for o in &flow.outputs {
        let socket = open_egress(o, index_of(&o.interface)?).with_context(|| {
            format!(
                "flow {:?}: opening output {}:{} on {}",
                flow.name, o.address, o.port, o.interface
            )
        })?;
        outputs.push(socket);
    }
    Ok(Opened {
        ingress: ingress.socket,
        membership: ingress.membership,
        granted: ingress.receive_buffer_bytes,
        outputs,
    })
}
