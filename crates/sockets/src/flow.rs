//! Opening one flow's sockets, exactly as the configuration defines them:
//! [`open_flow`]. The one place it is written: the privileged helper calls
//! it for a flow its own configuration allows, the daemon calls it itself
//! when it runs without privileges (a developer's run; no helper).

use std::io;

use mcrelay_config::{EgressKind, Flow, IngressKind};

use crate::opened::OpenedFlow;
use crate::packet::open_packet_ingress;
use crate::udp::{interface_index, open_egress_or_pending, open_ingress, open_rtcp_egress};

/// Why a flow's sockets could not be opened. Each message names the flow,
/// the field or the input or output, and what the kernel said.
#[derive(Debug, thiserror::Error)]
pub enum OpenFlowError {
    /// An interface of the flow does not exist on this host.
    #[error(
        "flow {flow:?}: {field}: {source}; fix the name in the configuration or create the interface"
    )]
    Interface {
        /// The flow.
        flow: String,
        /// `input.interface`, `inputs[i].interface` or
        /// `outputs[i].interface`.
        field: String,
        /// From [`interface_index`]: names the interface.
        source: io::Error,
    },
    /// Opening, binding or joining a leg's ingress socket failed (an
    /// `ingress = "packet"` leg needs `CAP_NET_RAW`: `EPERM` without it).
    #[error("flow {flow:?}: cannot open the input socket ({input}): {source}")]
    Ingress {
        /// The flow.
        flow: String,
        /// The input, as `interface address:port`.
        input: String,
        /// What the kernel said.
        source: io::Error,
    },
    /// Opening one output's socket failed.
    #[error("flow {flow:?}: cannot open outputs[{index}] ({output}): {source}")]
    Egress {
        /// The flow.
        flow: String,
        /// The output's position in the flow.
        index: usize,
        /// The output, as `interface address:port`.
        output: String,
        /// What the kernel said.
        source: io::Error,
    },
}

/// Open every leg's ingress socket and every output socket of `flow`, in
/// config order, then the 2022-1 FEC ports of legs and outputs with `fec`,
/// then the RTCP ports (port + 1) of RIST legs and outputs
/// (`Flow::receive_inputs`, `Flow::send_outputs`; a RIST output's RTCP
/// socket is left unconnected, see [`open_rtcp_egress`]). Interfaces are looked up first (at every call: one may
/// have been re-created with another index since), so a missing one opens
/// nothing. An output whose source address or route is missing now comes
/// back opened but not connected, listed in [`OpenedFlow::unconnected`].
pub fn open_flow(flow: &Flow) -> Result<OpenedFlow, OpenFlowError> {
    let interface = |field: String, name: &str| {
        interface_index(name).map_err(|source| OpenFlowError::Interface {
            flow: flow.name.clone(),
            field,
            source,
        })
    };
    // The helper's legs are the UDP ones (`Flow::receive_inputs`); an
    // SRT leg is the daemon's own.
    let udp_legs: Vec<usize> = (0..flow.inputs.len())
        .filter(|&i| flow.inputs.get(i).is_some_and(|l| l.srt.is_none()))
        .collect();
    let leg_field = |k: usize| {
        let Some(&i) = udp_legs.get(k) else {
            return "fec input".to_owned();
        };
        if flow.inputs.len() == 1 {
            "input".to_owned()
        } else {
            format!("inputs[{i}]")
        }
    };
    // The legs, then the 2022-1 FEC ports of legs with `fec`.
    let inputs = flow.receive_inputs();
    let leg_indexes = inputs
        .iter()
        .enumerate()
        .map(|(i, input)| interface(format!("{}.interface", leg_field(i)), &input.interface))
        .collect::<Result<Vec<u32>, OpenFlowError>>()?;
    // The outputs, then the FEC destinations of outputs with `fec`.
    let send_outputs = flow.send_outputs();
    let output_indexes = send_outputs
        .iter()
        .enumerate()
        .map(|(i, o)| interface(format!("outputs[{i}].interface"), &o.interface))
        .collect::<Result<Vec<u32>, OpenFlowError>>()?;
    let mut legs = Vec::with_capacity(inputs.len());
    for (input, ifindex) in inputs.iter().zip(leg_indexes) {
        let open = match input.ingress {
            IngressKind::Socket => open_ingress,
            IngressKind::Packet => open_packet_ingress,
            IngressKind::Xdp => crate::xdp::open_xdp_ingress,
        };
        legs.push(
            open(input, ifindex).map_err(|source| OpenFlowError::Ingress {
                flow: flow.name.clone(),
                input: input.to_string(),
                source,
            })?,
        );
    }
    let mut outputs = Vec::with_capacity(send_outputs.len());
    let mut unconnected = Vec::new();
    let mut xdp_outputs = Vec::new();
    // The last ones are the RIST outputs' RTCP sockets (not connected).
    let rtcp_from = send_outputs.len() - flow.outputs.iter().filter(|o| o.rist.is_some()).count();
    for (index, (output, ifindex)) in send_outputs.iter().zip(output_indexes).enumerate() {
        let egress_error = |source| OpenFlowError::Egress {
            flow: flow.name.clone(),
            index,
            output: output.to_string(),
            source,
        };
        if index >= rtcp_from {
            outputs.push(open_rtcp_egress(output, ifindex).map_err(egress_error)?);
            continue;
        }
        let (socket, pending) = open_egress_or_pending(output, ifindex).map_err(egress_error)?;
        if output.egress == EgressKind::Xdp {
            // The frames' source address and port are the UDP socket's:
            // it must be connected now.
            if let Some(e) = pending {
                return Err(egress_error(io::Error::new(
                    e.kind(),
                    format!(
                        "egress = \"xdp\" needs the output's route and source address when the flow starts ({e}); the frames' headers are built from them once"
                    ),
                )));
            }
            xdp_outputs.push(crate::xdp::open_xdp_egress(output, ifindex).map_err(egress_error)?);
        } else if let Some(e) = pending {
            unconnected.push((index, e.raw_os_error().unwrap_or(0)));
        }
        outputs.push(socket);
    }
    Ok(OpenedFlow {
        legs,
        outputs,
        unconnected,
        xdp_outputs,
    })
}
