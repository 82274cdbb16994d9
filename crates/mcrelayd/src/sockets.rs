//! Opening a flow's sockets before it starts (at start-up or on a reload),
//! with the warnings an operator needs when the kernel grants less buffer
//! than asked.

use std::collections::HashMap;

use anyhow::{Context, bail};
use mcrelay_config::Flow;
use mcrelay_dataplane::sockets::{
    EGRESS_SEND_BUFFER_BYTES, interface_index, open_egress, open_ingress,
};
use mcrelay_dataplane::{FlowSockets, OutputSocket};

/// Open `flow`'s ingress and output sockets; interface indexes are cached
/// in `ifindex`.
pub fn open_flow(flow: &Flow, ifindex: &mut HashMap<String, u32>) -> anyhow::Result<FlowSockets> {
    let mut index_of = |name: &str| -> anyhow::Result<u32> {
        if let Some(&i) = ifindex.get(name) {
            return Ok(i);
        }
        let i = interface_index(name).with_context(|| format!("flow {:?}", flow.name))?;
        ifindex.insert(name.to_owned(), i);
        Ok(i)
    };
    let input = &flow.input;
    if input.ingress == mcrelay_config::IngressKind::Packet {
        bail!(
            "flow {:?}: ingress = \"packet\" (AF_PACKET) is not supported by this build yet; \
             use ingress = \"socket\"",
            flow.name
        );
    }
    let ingress = open_ingress(input, index_of(&input.interface)?).with_context(|| {
        format!(
            "flow {:?}: opening input {}:{} on {}",
            flow.name, input.address, input.port, input.interface
        )
    })?;
    let requested = usize::try_from(input.receive_buffer_bytes).unwrap_or(usize::MAX);
    if ingress.receive_buffer_bytes < requested {
        tracing::warn!(
            flow = %flow.name,
            requested,
            granted = ingress.receive_buffer_bytes,
            "receive buffer clamped by net.core.rmem_max; raise it (sysctl -w net.core.rmem_max={requested}) to absorb bursts"
        );
    }
    let mut outputs = Vec::with_capacity(flow.outputs.len());
    for o in &flow.outputs {
        let label = format!("{}", std::net::SocketAddr::new(o.address, o.port));
        let socket = open_egress(o, index_of(&o.interface)?).with_context(|| {
            format!(
                "flow {:?}: opening output {label} on {}",
                flow.name, o.interface
            )
        })?;
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
        outputs.push(OutputSocket::new(label, socket, o.queue_depth));
    }
    Ok(FlowSockets::new(flow.name.clone(), ingress.socket, outputs))
}
