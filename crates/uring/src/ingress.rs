//! How a flow's datagrams arrive: a UDP socket bound to the group (the
//! kernel's UDP stack did the parsing), or an AF_PACKET socket on the input
//! interface (`ingress = "packet"`: frames the reverse-path filter would
//! have dropped, read from a mapped packet ring and parsed by
//! [`mcrelay_wire`]). Both end in the same place: a payload copied once
//! into a pool buffer.

use std::net::UdpSocket;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use mcrelay_wire::FlowMatch;

/// A flow's ingress socket, as the helper opened it.
#[derive(Debug)]
pub enum IngressSocket {
    /// Bound to the input's address and port, joined to its group.
    Udp(UdpSocket),
    /// AF_PACKET on the input interface, with the flow's BPF filter.
    Packet {
        /// The packet socket.
        socket: OwnedFd,
        /// What the filter lets through, checked again on each frame.
        filter: FlowMatch,
        /// A UDP socket joined to the group, unbound, never read: it keeps
        /// the membership that makes IGMP/MLD-snooping switches and the
        /// NIC's multicast filter deliver the group. `None` for a unicast
        /// input.
        membership: Option<UdpSocket>,
    },
}

impl IngressSocket {
    /// The descriptor the worker receives on.
    pub fn fd(&self) -> RawFd {
        match self {
            IngressSocket::Udp(s) => s.as_raw_fd(),
            IngressSocket::Packet { socket, .. } => socket.as_raw_fd(),
        }
    }

    /// A duplicate of the receiving descriptor (for the kernel's drop
    /// counter, read by the control plane).
    pub fn try_clone_fd(&self) -> std::io::Result<OwnedFd> {
        match self {
            IngressSocket::Udp(s) => Ok(OwnedFd::from(s.try_clone()?)),
            IngressSocket::Packet { socket, .. } => socket.try_clone(),
        }
    }

    /// The filter, for a packet socket.
    pub(crate) fn packet_filter(&self) -> Option<FlowMatch> {
        match self {
            IngressSocket::Udp(_) => None,
            IngressSocket::Packet { filter, .. } => Some(*filter),
        }
    }
}
