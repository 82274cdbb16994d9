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
    /// `ingress = "xdp"`: an AF_XDP socket bound to the input interface's
    /// queue, fed by the XDP program the `link` holds on the interface.
    Xdp {
        /// The AF_XDP socket (its fill and RX rings are mapped from it).
        socket: OwnedFd,
        /// What the XDP program steers here, checked again on each frame.
        filter: FlowMatch,
        /// The UMEM's memfd, mapped by the worker.
        umem: OwnedFd,
        /// The `bpf_link` holding the program on the interface: closed
        /// with the leg, which detaches the program.
        link: OwnedFd,
        /// As for `Packet`.
        membership: Option<UdpSocket>,
    },
}

impl IngressSocket {
    /// The descriptor the worker receives on.
    pub fn fd(&self) -> RawFd {
        match self {
            IngressSocket::Udp(s) => s.as_raw_fd(),
            IngressSocket::Packet { socket, .. } | IngressSocket::Xdp { socket, .. } => {
                socket.as_raw_fd()
            }
        }
    }

    /// A duplicate of the receiving descriptor (for the kernel's drop
    /// counter, read by the control plane).
    pub fn try_clone_fd(&self) -> std::io::Result<OwnedFd> {
        match self {
            IngressSocket::Udp(s) => Ok(OwnedFd::from(s.try_clone()?)),
            IngressSocket::Packet { socket, .. } | IngressSocket::Xdp { socket, .. } => {
                socket.try_clone()
            }
        }
    }

    /// The filter, for a packet socket.
    pub(crate) fn packet_filter(&self) -> Option<FlowMatch> {
        match self {
            IngressSocket::Udp(_) => None,
            IngressSocket::Packet { filter, .. } | IngressSocket::Xdp { filter, .. } => {
                Some(*filter)
            }
        }
    }

    /// An xdp leg's fill and RX rings and UMEM, mapped.
    pub(crate) fn xsk_rings(&self) -> Option<std::io::Result<mcrelay_sys::xdp::XskRings>> {
        match self {
            IngressSocket::Xdp { socket, umem, .. } => Some(mcrelay_sys::xdp::XskRings::map(
                socket,
                umem,
                mcrelay_sys::xdp::INGRESS_GEOMETRY,
            )),
            _ => None,
        }
    }
}
