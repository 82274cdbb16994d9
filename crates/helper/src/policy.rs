//! What the helper will open: exactly the sockets of the flows in the
//! configuration it loaded itself, from the root-owned file it was started
//! with. A request names a flow and nothing else — no interface, group,
//! port or option — so a compromised daemon can only obtain the sockets the
//! configuration already defines.

use std::io;

use mcrelay_config::{Config, Flow, IngressKind};

use crate::opened::OpenedFlow;
use crate::packet::open_packet_ingress;
use crate::sockets::{interface_index, open_egress_or_pending, open_ingress};

/// The flows the helper may open sockets for.
#[derive(Debug, Clone)]
pub struct Policy {
    config: Config,
}

/// Why the helper would not, or could not, open a flow's sockets. Each
/// message names the flow and says what to change.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// No flow of that name in the helper's configuration.
    #[error(
        "no flow named {0:?} in the configuration the helper loaded; add it to the file and reload"
    )]
    UnknownFlow(String),
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
    /// Opening, binding or joining a leg's ingress socket failed.
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

impl Policy {
    /// The policy of a loaded configuration.
    pub fn new(config: Config) -> Self {
        Policy { config }
    }

    /// The configuration it enforces.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The flow called `name`, if the helper may open it: it exists and its
    /// ingress kind is supported. Pure: opens nothing, looks up nothing.
    pub fn allowed(&self, name: &str) -> Result<&Flow, Refusal> {
        let flow = self
            .config
            .flows
            .by_name(name)
            .ok_or_else(|| Refusal::UnknownFlow(name.to_owned()))?;
        Ok(flow)
    }

    /// Open every leg's ingress socket and every output socket of the
    /// flow called `name`, exactly as the configuration defines them.
    /// Interfaces are looked up first, so a missing one opens nothing.
    pub fn open_flow(&self, name: &str) -> Result<OpenedFlow, Refusal> {
        let flow = self.allowed(name)?;
        let interface = |field: String, name: &str| {
            interface_index(name).map_err(|source| Refusal::Interface {
                flow: flow.name.clone(),
                field,
                source,
            })
        };
        let leg_field = |i: usize| {
            if flow.inputs.len() == 1 {
                "input".to_owned()
            } else {
                format!("inputs[{i}]")
            }
        };
        let leg_indexes = flow
            .inputs
            .iter()
            .enumerate()
            .map(|(i, input)| interface(format!("{}.interface", leg_field(i)), &input.interface))
            .collect::<Result<Vec<u32>, Refusal>>()?;
        // SRT outputs are the daemon's own (no privilege needed): only the
        // UDP outputs are opened here, in order.
        let output_indexes = flow
            .udp_outputs()
            .enumerate()
            .map(|(i, o)| interface(format!("outputs[{i}].interface"), &o.interface))
            .collect::<Result<Vec<u32>, Refusal>>()?;
        let mut legs = Vec::with_capacity(flow.inputs.len());
        for (input, ifindex) in flow.inputs.iter().zip(leg_indexes) {
            let open = match input.ingress {
                IngressKind::Socket => open_ingress,
                IngressKind::Packet => open_packet_ingress,
            };
            legs.push(open(input, ifindex).map_err(|source| Refusal::Ingress {
                flow: flow.name.clone(),
                input: input.to_string(),
                source,
            })?);
        }
        let mut outputs = Vec::with_capacity(flow.outputs.len());
        let mut unconnected = Vec::new();
        for (index, (output, ifindex)) in flow.udp_outputs().zip(output_indexes).enumerate() {
            let (socket, pending) =
                open_egress_or_pending(output, ifindex).map_err(|source| Refusal::Egress {
                    flow: flow.name.clone(),
                    index,
                    output: output.to_string(),
                    source,
                })?;
            if let Some(e) = pending {
                unconnected.push((index, e.raw_os_error().unwrap_or(0)));
            }
            outputs.push(socket);
        }
        Ok(OpenedFlow {
            legs,
            outputs,
            unconnected,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;

    /// The policy of [`FLOWS`], with a free port for `lo-flow`'s input.
    fn policy() -> Policy {
        let free = || {
            let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
            s.local_addr().expect("addr").port().to_string()
        };
        let text = FLOWS
            .replace("FREE_PORT2", &free())
            .replace("FREE_PORT3", &free())
            .replace("FREE_PORT", &free());
        Policy::new(mcrelay_config::parse(&text, "test.toml").expect("valid config"))
    }

    const FLOWS: &str = r#"
[[flow]]
name = "lo-flow"
input = { interface = "lo", address = "127.0.0.1", port = FREE_PORT }
outputs = [
  { interface = "lo", address = "127.0.0.1", port = 9 },
  { interface = "lo", address = "127.0.0.1", port = 10, ttl = 3 },
]

[[flow]]
name = "captured"
input = { interface = "lo", address = "239.1.1.1", port = 5000, ingress = "packet" }
outputs = [{ interface = "lo", address = "127.0.0.1", port = 9 }]

[[flow]]
name = "two-legs"
inputs = [
  { interface = "lo", address = "127.0.0.1", port = FREE_PORT2 },
  { interface = "lo", address = "127.0.0.1", port = FREE_PORT3 },
]
redundancy = "failover"
outputs = [{ interface = "lo", address = "127.0.0.1", port = 9 }]

[[flow]]
name = "missing-leg"
inputs = [
  { interface = "lo", address = "127.0.0.1", port = 11 },
  { interface = "nosuchif1", address = "127.0.0.1", port = 11 },
]
redundancy = "failover"
outputs = [{ interface = "lo", address = "127.0.0.1", port = 10 }]

[[flow]]
name = "missing-if"
input = { interface = "lo", address = "127.0.0.1", port = 9 }
outputs = [{ interface = "nosuchif0", address = "127.0.0.1", port = 12 }]
"#;

    #[test]
    fn unknown_flows_are_refused() {
        let p = policy();
        let e = p.open_flow("lo-flowX").expect_err("unknown");
        assert!(matches!(e, Refusal::UnknownFlow(ref n) if n == "lo-flowX"));
        assert!(e.to_string().contains("no flow named \"lo-flowX\""), "{e}");
        // Names match exactly: no trimming, no case folding.
        assert!(p.open_flow(" lo-flow").is_err());
        assert!(p.open_flow("LO-FLOW").is_err());
        assert!(p.open_flow("").is_err());
    }

    #[test]
    fn packet_ingress_flows_are_allowed_like_any_other() {
        let p = policy();
        assert_eq!(p.allowed("captured").expect("allowed").name, "captured");
    }

    #[test]
    fn missing_interface_is_refused_clearly() {
        let e = policy().open_flow("missing-if").expect_err("no such if");
        let text = e.to_string();
        assert!(
            text.starts_with(
                "flow \"missing-if\": outputs[0].interface: interface \"nosuchif0\" does not exist"
            ),
            "{text}"
        );
    }

    #[test]
    fn opens_exactly_the_configured_sockets() {
        let p = policy();
        let s = p.open_flow("lo-flow").expect("open");
        assert_eq!(s.outputs.len(), 2);
        let peers: Vec<u16> = s
            .outputs
            .iter()
            .map(|o| o.peer_addr().expect("connected").port())
            .collect();
        assert_eq!(peers, [9, 10], "config order");
        assert_eq!(s.outputs[1].ttl().expect("ttl"), 3);
        assert_eq!(s.legs.len(), 1);
        let ingress = UdpSocket::from(s.legs.into_iter().next().expect("one leg").socket);
        assert!(ingress.local_addr().expect("bound").ip().is_loopback());
        assert!(p.allowed("lo-flow").is_ok());
        assert_eq!(p.config().flows.len(), 5);
    }

    #[test]
    fn opens_every_leg_in_order() {
        let p = policy();
        let s = p.open_flow("two-legs").expect("open");
        let wanted: Vec<u16> = p
            .allowed("two-legs")
            .expect("allowed")
            .inputs
            .iter()
            .map(|i| i.port)
            .collect();
        let bound: Vec<u16> = s
            .legs
            .into_iter()
            .map(|l| {
                assert!(l.membership.is_none(), "a unicast socket leg");
                UdpSocket::from(l.socket)
                    .local_addr()
                    .expect("bound")
                    .port()
            })
            .collect();
        assert_eq!(bound, wanted);
        assert_eq!(s.outputs.len(), 1);
        let e = p.open_flow("missing-leg").expect_err("no such if");
        assert!(
            e.to_string().starts_with(
                "flow \"missing-leg\": inputs[1].interface: interface \"nosuchif1\" does not exist"
            ),
            "{e}"
        );
    }
}
