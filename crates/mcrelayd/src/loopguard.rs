//! The run-time loop guard (issue 27): no configuration or routing change
//! can make the relay feed itself. Each UDP ingress socket of a flow
//! carries a classic BPF filter ([`mcrelay_wire::bpf::loop_guard`]) naming
//! the local address and port of each of the flow's egress sockets; a
//! datagram from one of them — the relay's own, come back — reaches the
//! worker without payload and is counted as `drop_loop`, never relayed.
//! The filter runs in the kernel; the worker's cost is one compare of the
//! received length. Attached by the supervisor (no privilege needed) when
//! the flow's sockets are opened, and again when a late output connects
//! (its local address exists only then).
//!
//! Packet ingress (`AF_PACKET`) keeps its own filter, locked by the helper:
//! it already drops frames this host sent on that interface
//! (`PACKET_OUTGOING`); a loop through the network is refused only by
//! `check` there.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;

use mcrelay_uring::FlowSockets;
use mcrelay_uring::ingress::IngressSocket;

/// The local addresses of `outputs` that have one (bound and connected).
pub fn own_endpoints<'a>(outputs: impl Iterator<Item = &'a UdpSocket>) -> Vec<SocketAddr> {
    outputs
        .filter_map(|s| s.local_addr().ok())
        .filter(|a| a.port() != 0 && !a.ip().is_unspecified())
        .collect()
}

/// Put the guard on every UDP leg of `shards` (all the flow's shards: a
/// datagram from any of the flow's outputs is its own). Failure is logged;
/// the flow relays unguarded (the configuration check still holds).
pub fn arm(flow: &str, shards: &[FlowSockets]) {
    let own = own_endpoints(
        shards
            .iter()
            .flat_map(|s| s.outputs.iter().map(|o| &o.socket)),
    );
    for shard in shards {
        for leg in &shard.legs {
            if let IngressSocket::Udp(socket) = leg {
                arm_socket(flow, socket, &own);
            }
        }
    }
}

/// Put the guard for `own` on one UDP ingress socket.
/// A packet socket (its filter is the helper's, locked) is left alone.
pub fn arm_socket(flow: &str, socket: &impl AsFd, own: &[SocketAddr]) {
    let Some(local) = socket2::SockRef::from(socket)
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
    else {
        return;
    };
    let v6 = local.is_ipv6();
    let program: Vec<libc::sock_filter> = mcrelay_wire::bpf::loop_guard(v6, own)
        .into_iter()
        .map(|i| libc::sock_filter {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        })
        .collect();
    if let Err(e) = mcrelay_sys::sockopt::attach_filter(socket, &program) {
        tracing::warn!(
            flow,
            "loop guard not attached: {e}; the flow relays unguarded"
        );
    }
}
