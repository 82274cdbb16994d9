//! The ingress of an `ingress = "xdp"` input (needs `CAP_BPF`,
//! `CAP_NET_ADMIN` and `CAP_NET_RAW`): an XDP program on the input
//! interface ([`mcrelay_wire::xdp::program`]) steering the flow's frames
//! to an AF_XDP socket bound to the interface's queue 0, everything else
//! passed to the kernel's stack; plus, for a group, the UDP socket holding
//! the membership (as packet ingress has).
//!
//! What crosses to the daemon: the AF_XDP socket, the UMEM's memfd (the
//! worker maps it and the rings, [`mcrelay_sys::xdp::XskRings`]) and the
//! `bpf_link` that holds the program on the interface. The link is the
//! attachment: when its last fd closes (the flow stops, the daemon exits
//! or is killed) the kernel detaches the program, so nothing is left
//! behind. The helper keeps no copy.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use mcrelay_config::{Input, Output};
use mcrelay_sys::xdp::{self, XskGeometry};

use crate::packet::{flow_match, membership_socket};
use crate::udp::Ingress;

/// The geometry of every xdp leg's socket (the worker maps it alike).
pub const GEOMETRY: XskGeometry = xdp::INGRESS_GEOMETRY;

/// The receive queue the socket binds to. One queue: on a multi-queue NIC
/// steer the group to queue 0 (`ethtool -N ... action 0`) or use one
/// combined channel (`ethtool -L ... combined 1`); veth has one.
pub const QUEUE: u32 = 0;

/// An xdp leg's fds beside its AF_XDP socket.
#[derive(Debug)]
pub struct XdpFds {
    /// The UMEM (a memfd of [`GEOMETRY`]`.umem_len()` bytes).
    pub umem: OwnedFd,
    /// The `bpf_link` attaching the program: the program stays on the
    /// interface exactly as long as an fd of it is open.
    pub link: OwnedFd,
}

/// Load and attach the flow's XDP program on `ifindex`, and open, bind
/// and map the AF_XDP socket it redirects to. Refuses an interface whose
/// MTU allows frames above [`xdp::MAX_FRAME`] bytes (no multi-buffer), and
/// an interface that already has an XDP program (`EBUSY`).
pub fn open_xdp_ingress(input: &Input, ifindex: u32) -> io::Result<Ingress> {
    let mtu = xdp::interface_mtu(&input.interface)?;
    // Ethernet header and one VLAN tag on top of the MTU.
    if mtu + 18 > xdp::MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "interface {} has MTU {mtu}: ingress = \"xdp\" receives frames up to {} bytes (an MTU of at most {}; no multi-buffer AF_XDP yet); lower the MTU or use ingress = \"packet\"",
                input.interface,
                xdp::MAX_FRAME,
                xdp::MAX_FRAME - 18
            ),
        ));
    }
    let map = xdp::create_xsk_map(QUEUE + 1)?;
    let program = mcrelay_wire::xdp::program(&flow_match(input), map.as_raw_fd())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    let prog = xdp::load_xdp_program(&program)?;
    let xsk = xdp::xsk_socket()?;
    let (umem, zero_copy) = xdp::setup_xsk(&xsk, ifindex, QUEUE, GEOMETRY, BIND_RETRY)?;
    xdp::xsk_map_insert(&map, QUEUE, &xsk)?;
    // Membership first: the program only steers, the NIC's multicast
    // filter and snooping switches need the join.
    let membership = if input.address.is_multicast() {
        Some(membership_socket(input, ifindex)?)
    } else {
        None
    };
    let link = xdp::attach_xdp(&prog, ifindex).map_err(|e| {
        if e.raw_os_error() == Some(libc::EBUSY) {
            io::Error::new(
                e.kind(),
                format!(
                    "interface {} already has an XDP program ({e}); detach it (ip link set dev {} xdp off) or use ingress = \"packet\"",
                    input.interface, input.interface
                ),
            )
        } else {
            e
        }
    })?;
    tracing::debug!(
        interface = %input.interface,
        zero_copy,
        "xdp ingress attached"
    );
    Ok(Ingress {
        socket: xsk,
        receive_buffer_bytes: 0,
        membership,
        xdp: Some(XdpFds { umem, link }),
    })
}

/// An `egress = "xdp"` output's AF_XDP socket and its UMEM's memfd (the
/// worker maps the TX and completion rings and the UMEM,
/// [`mcrelay_sys::xdp::XskTx`]). They travel after every output socket of
/// the flow's `SOCKETS` reply, socket then memfd, in output order; the
/// output keeps its UDP socket too (its local address is the frames'
/// source address and port).
#[derive(Debug)]
pub struct XdpEgressFds {
    /// The AF_XDP socket, bound to queue [`QUEUE`] of the output
    /// interface, with a TX ring.
    pub socket: OwnedFd,
    /// The UMEM (a memfd of [`xdp::EGRESS_GEOMETRY`]`.umem_len()` bytes).
    pub umem: OwnedFd,
}

/// How long an XDP input's socket and [`open_xdp_egress`] retry a bind the
/// queue refuses (`EBUSY`).
const BIND_RETRY: std::time::Duration = std::time::Duration::from_secs(2);

/// Open an `egress = "xdp"` output's AF_XDP socket on `ifindex`, queue
/// [`QUEUE`], with a TX ring. `EBUSY` (said with the fix) when the queue
/// already has an AF_XDP socket.
pub fn open_xdp_egress(output: &Output, ifindex: u32) -> io::Result<XdpEgressFds> {
    let socket = xdp::xsk_socket()?;
    // A socket closed a moment ago (its flow removed by a reload) lets go
    // of the queue a little later: the kernel releases its buffer pool
    // from a work queue. Bind is retried for a while.
    let bound = xdp::setup_xsk_tx(&socket, ifindex, QUEUE, xdp::EGRESS_GEOMETRY, BIND_RETRY);
    let (umem, zero_copy) = bound
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::EBUSY) {
                io::Error::new(
                    e.kind(),
                    format!(
                        "queue {QUEUE} of interface {} already has an AF_XDP socket ({e}); another program (or a flow still being replaced) holds it: use egress = \"socket\" or stop the other one",
                        output.interface
                    ),
                )
            } else {
                e
            }
        })?;
    tracing::debug!(interface = %output.interface, zero_copy, "xdp egress bound");
    Ok(XdpEgressFds { socket, umem })
}
