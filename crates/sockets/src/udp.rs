//! Opening the sockets a flow needs, before the flow starts (never on the
//! packet path): the ingress socket that joins the group, and one connected
//! egress socket per output. They run in the privileged helper, which passes
//! the sockets to the daemon, or in the daemon itself when it has no
//! privileges ([`crate::open_flow`]); the daemon also reconnects outputs
//! with [`connect_egress`], which needs none.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::OwnedFd;

use mcrelay_config::{Input, Output};
use mcrelay_sys::sockopt::{
    force_receive_buffer, force_send_buffer, join_source_group, multicast_if_v4,
};
use socket2::{Domain, Protocol, Socket, Type};

/// `SO_SNDBUF` requested for egress sockets.
pub const EGRESS_SEND_BUFFER_BYTES: usize = 4 << 20;

/// An ingress socket and the receive buffer the kernel actually granted.
#[derive(Debug)]
pub struct Ingress {
    /// `ingress = "socket"`: a UDP socket bound to the input's address and
    /// port, joined to its group. `ingress = "packet"`: an AF_PACKET socket
    /// on the input interface ([`crate::packet`]).
    pub socket: OwnedFd,
    /// `SO_RCVBUF` as granted: the request with `CAP_NET_ADMIN`
    /// (`SO_RCVBUFFORCE`); without it, at most `net.core.rmem_max`.
    pub receive_buffer_bytes: usize,
    /// Packet ingress of a group: the UDP socket holding the membership.
    pub membership: Option<UdpSocket>,
    /// `ingress = "xdp"`: the UMEM and the XDP program's link
    /// ([`crate::xdp`]); `socket` is then the AF_XDP socket.
    pub xdp: Option<crate::xdp::XdpFds>,
}

pub use mcrelay_sys::net::interface_index;

fn domain(addr: IpAddr) -> Domain {
    if addr.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    }
}

/// Request a receive buffer of `bytes`: `SO_RCVBUFFORCE`, not clamped to
/// `net.core.rmem_max`, with `CAP_NET_ADMIN`; else plain `SO_RCVBUF`.
pub(crate) fn set_receive_buffer(socket: &Socket, bytes: u32) -> io::Result<()> {
    force_receive_buffer(socket, usize::try_from(bytes).unwrap_or(usize::MAX))
}

/// Open, bind and join the ingress socket of a flow.
///
/// The receive buffer is `input.receive_buffer_bytes`, beyond
/// `net.core.rmem_max` when the process has `CAP_NET_ADMIN`;
/// [`Ingress::receive_buffer_bytes`] reports what the kernel granted.
pub fn open_ingress(input: &Input, ifindex: u32) -> io::Result<Ingress> {
    let socket = Socket::new(domain(input.address), Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_reuse_address(true)?;
    if input.address.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    set_receive_buffer(&socket, input.receive_buffer_bytes)?;
    // Linux reports double the usable size it set.
    let granted = socket.recv_buffer_size()? / 2;
    socket.bind(&scoped(input.address, input.port, &input.interface)?.into())?;
    if input.address.is_multicast() {
        // Only this group's datagrams, even if another socket on the host
        // joins a different group on the same port.
        match input.address {
            IpAddr::V4(_) => socket.set_multicast_all_v4(false)?,
            IpAddr::V6(_) => socket.set_multicast_all_v6(false)?,
        }
        join_group(&socket, input.address, input.source, ifindex)?;
    }
    Ok(Ingress {
        socket: OwnedFd::from(socket),
        receive_buffer_bytes: granted,
        membership: None,
        xdp: None,
    })
}

/// Join `group` on interface `ifindex`, from `source` only if given.
pub(crate) fn join_group(
    socket: &Socket,
    group: IpAddr,
    source: Option<IpAddr>,
    ifindex: u32,
) -> io::Result<()> {
    match (group, source) {
        (_, Some(source)) => join_source_group(socket, group, source, ifindex),
        (IpAddr::V4(g), None) => {
            socket.join_multicast_v4_n(&g, &socket2::InterfaceIndexOrAddress::Index(ifindex))
        }
        (IpAddr::V6(g), None) => socket.join_multicast_v6(&g, ifindex),
    }
}

/// Open one output's egress socket: multicast interface by index, TTL or
/// hop limit from the config, loopback off, optional source address, and
/// connected to the destination so a plain send needs no address.
pub fn open_egress(output: &Output, ifindex: u32) -> io::Result<UdpSocket> {
    match open_egress_or_pending(output, ifindex)? {
        (socket, None) => Ok(socket),
        (_, Some(e)) => Err(e),
    }
}

/// Whether `e`, from binding an output's source address or connecting it,
/// is a state of the network that can change (no route yet, the address
/// not (yet) assigned, e.g. an IPv6 address gone with a link flap) rather
/// than a mistake: the output is kept and its connection retried.
pub fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ENETUNREACH
                | libc::EHOSTUNREACH
                | libc::EADDRNOTAVAIL
                | libc::ENETDOWN
                | libc::ENODEV
        )
    )
}

/// Bind `socket` to `output`'s source address (if any) and connect it to
/// its destination: the last steps of [`open_egress`], which need no
/// privilege, so the daemon can retry them on a socket the helper opened.
/// Binding again a socket already bound (`EINVAL`) is not an error.
///
/// An IPv6 link-local unicast address (`fe80::/10`) means nothing without
/// its link: the output's interface is its scope (without one, `connect`
/// fails with `EINVAL`, which made a config that `check` accepted stop the
/// daemon at start, issue 27).
pub fn connect_egress(socket: &UdpSocket, output: &Output) -> io::Result<()> {
    let socket = socket2::SockRef::from(socket);
    if let Some(source) = output.source_address {
        match socket.bind(&scoped(source, 0, &output.interface)?.into()) {
            Err(e) if e.raw_os_error() != Some(libc::EINVAL) => return Err(e),
            _ => {}
        }
    }
    socket.connect(&scoped(output.address, output.port, &output.interface)?.into())
}

/// `address:port`, with `interface` as the scope of an IPv6 link-local
/// unicast address.
fn scoped(address: IpAddr, port: u16, interface: &str) -> io::Result<SocketAddr> {
    match address {
        IpAddr::V6(a) if a.is_unicast_link_local() => Ok(SocketAddr::V6(
            std::net::SocketAddrV6::new(a, port, 0, interface_index(interface)?),
        )),
        a => Ok(SocketAddr::new(a, port)),
    }
}

/// The RTCP socket of a RIST output (`protocol = "rist"`, its port + 1):
/// set up as [`open_egress`] sets up an output (interface, TTL, loopback
/// off, source address) but not connected, so the receivers' NACKs come
/// back from wherever they are (a multicast output's receivers answer
/// from their own addresses, which a socket connected to the group would
/// filter out); the worker sends its reports with `send_to`. A source
/// address missing now is not an error: the kernel picks one per send.
pub fn open_rtcp_egress(output: &Output, ifindex: u32) -> io::Result<UdpSocket> {
    let socket = Socket::new(domain(output.address), Type::DGRAM, Some(Protocol::UDP))?;
    set_egress_options(&socket, output, ifindex)?;
    if let Some(source) = output.source_address {
        match socket.bind(&scoped(source, 0, &output.interface)?.into()) {
            Err(e) if !is_transient(&e) => return Err(e),
            _ => {}
        }
    }
    socket.set_nonblocking(true)?;
    Ok(UdpSocket::from(socket))
}

fn set_egress_options(socket: &Socket, output: &Output, ifindex: u32) -> io::Result<()> {
    let ttl = u32::from(output.ttl);
    match output.address {
        IpAddr::V4(addr) if addr.is_multicast() => {
            multicast_if_v4(socket, ifindex, Ipv4Addr::UNSPECIFIED)?;
            socket.set_multicast_ttl_v4(ttl)?;
            socket.set_multicast_loop_v4(false)?;
        }
        IpAddr::V4(_) => socket.set_ttl_v4(ttl)?,
        IpAddr::V6(addr) if addr.is_multicast() => {
            socket.set_multicast_if_v6(ifindex)?;
            socket.set_multicast_hops_v6(ttl)?;
            socket.set_multicast_loop_v6(false)?;
        }
        IpAddr::V6(_) => socket.set_unicast_hops_v6(ttl)?,
    }
    Ok(())
}

/// [`open_egress`], except that a source address or route that is missing
/// now ([`is_transient`]) still gives the socket, not connected, with the
/// error: its connection is retried later with [`connect_egress`] (sends
/// meanwhile fail with `EDESTADDRREQ`, counted).
pub fn open_egress_or_pending(
    output: &Output,
    ifindex: u32,
) -> io::Result<(UdpSocket, Option<io::Error>)> {
    let socket = Socket::new(domain(output.address), Type::DGRAM, Some(Protocol::UDP))?;
    // Room for a full queue of jumbo datagrams, so a send waits on the
    // output's queue depth (counted) rather than on socket memory. This
    // also keeps sends in order: a send the socket can't take at once is
    // retried by io_uring when there is room, and later ones could pass it.
    let _ = force_send_buffer(&socket, EGRESS_SEND_BUFFER_BYTES);
    set_egress_options(&socket, output, ifindex)?;
    let socket = UdpSocket::from(socket);
    match connect_egress(&socket, output) {
        Ok(()) => Ok((socket, None)),
        Err(e) if is_transient(&e) => Ok((socket, Some(e))),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_interface_is_a_clear_error() {
        let e = interface_index("nosuchif0").expect_err("missing");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(
            e.to_string().contains("\"nosuchif0\" does not exist"),
            "{e}"
        );
        assert!(interface_index("lo").is_ok());
    }

    fn unicast_input(port: u16, receive_buffer_bytes: u32) -> Input {
        Input {
            interface: "lo".to_owned(),
            address: IpAddr::from([127, 0, 0, 1]),
            port,
            source: None,
            ingress: mcrelay_config::IngressKind::Socket,
            receive_buffer_bytes,
            fec: None,
            srt: None,
            rist: None,
        }
    }

    fn has_cap_net_admin() -> bool {
        let status = std::fs::read_to_string("/proc/thread-self/status").expect("status");
        let eff = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .map(|v| u64::from_str_radix(v.trim(), 16).expect("hex"))
            .expect("CapEff line");
        eff & (1 << 12) != 0 // CAP_NET_ADMIN
    }

    #[test]
    fn receive_buffer_beyond_rmem_max_with_cap_net_admin() {
        let rmem_max: u32 = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
            .expect("rmem_max")
            .trim()
            .parse()
            .expect("number");
        // Above rmem_max, and far above the kernel's minimum.
        let requested = rmem_max.saturating_mul(2).clamp(1 << 20, 1 << 28);
        let ingress = open_ingress(&unicast_input(0, requested), 1).expect("open");
        let granted = ingress.receive_buffer_bytes;
        if has_cap_net_admin() {
            assert_eq!(granted, requested as usize, "SO_RCVBUFFORCE takes it whole");
        } else {
            eprintln!("no CAP_NET_ADMIN: checking the SO_RCVBUF fallback only");
            assert!(
                granted <= rmem_max as usize,
                "{granted} > rmem_max {rmem_max}"
            );
            assert!(granted > 0);
        }
    }

    #[test]
    fn unicast_ingress_receives_and_egress_sends() {
        let ingress = open_ingress(&unicast_input(0, 1 << 20), 1).expect("open");
        let ingress_socket = UdpSocket::from(ingress.socket);
        let addr = ingress_socket.local_addr().expect("addr");
        let listener = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let out = Output {
            egress: Default::default(),
            interface: "lo".to_owned(),
            address: IpAddr::from([127, 0, 0, 1]),
            port: listener.local_addr().expect("addr").port(),
            ttl: 64,
            source_address: None,
            queue_depth: 16,
            fec: None,
            rist: None,
            srt: None,
        };
        let egress = open_egress(&out, interface_index("lo").expect("lo")).expect("egress");
        egress.send(b"out").expect("send");
        let t = Some(std::time::Duration::from_secs(60));
        listener.set_read_timeout(t).expect("timeout");
        let mut buf = [0u8; 16];
        let (n, from) = listener.recv_from(&mut buf).expect("recv");
        assert_eq!(&buf[..n], b"out");
        assert_eq!(from, egress.local_addr().expect("addr"));
        egress.send_to(b"in", addr).expect("send to ingress");
        ingress_socket.set_read_timeout(t).expect("timeout");
        let n = ingress_socket.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..n], b"in");
    }
}
