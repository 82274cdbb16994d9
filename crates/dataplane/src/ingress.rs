//! How a flow's datagrams arrive: a UDP socket bound to the group (the
//! kernel's UDP stack did the parsing), or an AF_PACKET socket on the input
//! interface (`ingress = "packet"`: frames the reverse-path filter would
//! have dropped, parsed here by [`mcrelay_wire`]). Both end in the same
//! place: a payload in a receive buffer, copied once into a pool buffer.
//!
//! Packet sockets are read with multishot `recvmsg` on provided buffers:
//! each buffer then starts with an `io_uring_recvmsg_out` header and the
//! `PACKET_AUXDATA` control message (which says whether the UDP checksum is
//! still to be checked), followed by the frame.

use std::net::UdpSocket;
use std::ops::Range;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use io_uring::types::RecvMsgOut;
use mcrelay_wire::{FlowMatch, Reject, auxdata};

use crate::counters::FrameDrops;

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

#[allow(unsafe_code)]
fn zeroed_msghdr() -> libc::msghdr {
    // SAFETY: `msghdr` is plain data for which all-zero is valid (null
    // pointers, zero lengths).
    unsafe { std::mem::zeroed() }
}

/// The `msghdr` every multishot `recvmsg` on a packet socket names: no
/// address, room for the auxdata control message. The kernel reads only
/// its lengths, when the request is submitted.
#[derive(Debug)]
pub(crate) struct PacketReceive {
    header: Box<libc::msghdr>,
}

impl PacketReceive {
    pub(crate) fn new() -> Self {
        let mut header = Box::new(zeroed_msghdr());
        header.msg_controllen = auxdata::CONTROL_BYTES;
        Self { header }
    }

    /// For the SQE; stable for the worker's lifetime (boxed).
    pub(crate) fn header(&self) -> *const libc::msghdr {
        &raw const *self.header
    }

    /// Where the payload of the frame in `buffer` (as a completion filled
    /// it) lies within `buffer`, or `None` after counting why there is none.
    pub(crate) fn payload(
        &self,
        buffer: &[u8],
        filter: &FlowMatch,
        drops: &FrameDrops,
    ) -> Option<Range<usize>> {
        let Ok(out) = RecvMsgOut::parse(buffer, &self.header) else {
            drops.count(Reject::Truncated);
            return None;
        };
        if out.is_payload_truncated() {
            // Larger than a receive buffer: larger than any relayable frame.
            drops.count(Reject::Truncated);
            return None;
        }
        let frame = out.payload_data();
        let verify = auxdata::checksum_needs_checking(out.control_data());
        match mcrelay_wire::parse(frame, filter, verify) {
            Ok(d) => {
                // The frame is the tail of `buffer`.
                let base = buffer.len() - frame.len();
                Some(base + d.payload.start..base + d.payload.end)
            }
            Err(reason) => {
                drops.count(reason);
                None
            }
        }
    }
}
