//! Loopback flows for the io_uring driver's tests (feature `uring`): a
//! flow's sockets as the helper would open them (`mcrelay_sockets`'s
//! `open_ingress`/`open_egress` on `lo`), its input on a free port of
//! 127.0.0.1, each output sent to a receiver the test reads.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::time::Duration;

use mcrelay_config::{IngressKind, Input, Output};
use mcrelay_sockets::{interface_index, open_egress, open_ingress};
use mcrelay_uring::{FlowSockets, IngressSocket, OutputSocket};

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// An output's receiver on 127.0.0.1: an 8 MiB receive buffer (a test
/// reads it after the worker relayed a burst), reads time out after
/// `timeout`.
pub fn receiver(timeout: Duration) -> UdpSocket {
    let r = UdpSocket::bind((LOCALHOST, 0)).expect("bind a receiver");
    r.set_read_timeout(Some(timeout)).expect("read timeout");
    socket2::SockRef::from(&r)
        .set_recv_buffer_size(8 << 20)
        .expect("receive buffer");
    r
}

/// Flow `name`: a UDP input on a free loopback port (4 MiB receive
/// buffer) and one output of queue depth 256 per receiver, labelled by
/// its port. Returns the sockets and the address to send to.
pub fn flow(name: &str, receivers: &[&UdpSocket]) -> (FlowSockets, SocketAddr) {
    let lo = interface_index("lo").expect("lo");
    let port = crate::free_udp_port();
    let input = Input {
        interface: "lo".into(),
        address: LOCALHOST,
        port,
        source: None,
        ingress: IngressKind::Socket,
        receive_buffer_bytes: 4 << 20,
        fec: None,
        srt: None,
        rist: None,
    };
    let outputs = receivers
        .iter()
        .map(|r| {
            let out = Output {
                egress: Default::default(),
                interface: "lo".into(),
                address: LOCALHOST,
                port: r.local_addr().expect("receiver address").port(),
                ttl: 64,
                source_address: None,
                queue_depth: 256,
                fec: None,
                rist: None,
                srt: None,
            };
            OutputSocket::new(
                out.port.to_string(),
                open_egress(&out, lo).expect("egress"),
                256,
            )
        })
        .collect();
    let ingress = open_ingress(&input, lo).expect("ingress").socket;
    let sockets = FlowSockets::new(name.into(), IngressSocket::Udp(ingress.into()), outputs);
    (sockets, SocketAddr::new(LOCALHOST, port))
}
