//! The ingress of an `ingress = "packet"` flow (needs `CAP_NET_RAW`): an
//! AF_PACKET socket on the input interface that sees frames before the
//! kernel's IP layer — so before the reverse-path filter drops a source on
//! an unroutable subnet — restricted by a BPF filter to the flow's own
//! datagrams, plus a plain UDP socket that only holds the group membership.
//!
//! The one `unsafe` left is binding to a `sockaddr_ll`, which neither nix
//! nor socket2 builds from an interface index.
#![allow(unsafe_code)]

use std::io;
use std::mem::size_of;
use std::net::{IpAddr, UdpSocket};
use std::os::fd::AsRawFd;

use mcrelay_config::Input;
use mcrelay_wire::FlowMatch;
use mcrelay_wire::bpf::{Instruction, flow_filter};
use socket2::{Domain, Protocol, Socket, Type};

use mcrelay_sys::sockopt::set as setsockopt;

use crate::udp::{Ingress, join_group, set_receive_buffer};

/// `PACKET_IGNORE_OUTGOING` (linux/if_packet.h, Linux 4.20+).
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;

/// What the flow's filter passes, from its configured input.
pub fn flow_match(input: &Input) -> FlowMatch {
    FlowMatch {
        destination: input.address,
        port: input.port,
        source: input.source,
    }
}

/// Open the packet socket of a flow: filter attached and locked before it
/// is bound (so no other frame is ever queued), frames this host sends
/// ignored, receive buffer as configured, bound to the input interface.
/// For a multicast input, also a UDP socket joined to the group there.
pub fn open_packet_ingress(input: &Input, ifindex: u32) -> io::Result<Ingress> {
    // Protocol 0 (none): the socket receives nothing until it is bound.
    // socket2 adds SOCK_CLOEXEC.
    let socket = Socket::new(Domain::PACKET, Type::RAW, None)?;
    attach_filter(&socket, &flow_filter(&flow_match(input)))?;
    // The unprivileged daemon gets this socket: it must not be able to
    // replace the filter with one that reads the whole interface.
    setsockopt(
        &socket,
        libc::SOL_SOCKET,
        libc::SO_LOCK_FILTER,
        &1 as &libc::c_int,
    )?;
    // The filter drops outgoing frames too; this spares the kernel cloning
    // them at all (ignored where the kernel predates it).
    let _ = setsockopt(
        &socket,
        libc::SOL_PACKET,
        PACKET_IGNORE_OUTGOING,
        &1 as &libc::c_int,
    );
    set_receive_buffer(&socket, input.receive_buffer_bytes)?;
    let granted = socket.recv_buffer_size()? / 2;
    bind_to_interface(&socket, ifindex)?;
    let membership = if input.address.is_multicast() {
        Some(membership_socket(input, ifindex)?)
    } else {
        None
    };
    Ok(Ingress {
        socket: socket.into(),
        receive_buffer_bytes: granted,
        membership,
        xdp: None,
    })
}

fn attach_filter(socket: &Socket, program: &[Instruction]) -> io::Result<()> {
    let fprog = libc::sock_fprog {
        len: u16::try_from(program.len())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
        // `Instruction` is `repr(C)` with the fields of `sock_filter`.
        filter: program.as_ptr().cast::<libc::sock_filter>().cast_mut(),
    };
    setsockopt(socket, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &fprog)
}

fn bind_to_interface(socket: &Socket, ifindex: u32) -> io::Result<()> {
    // SAFETY: `sockaddr_ll` is plain data for which all-zero is valid.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    // AF_PACKET (17) and ETH_P_ALL (3) fit their 16-bit fields.
    addr.sll_family = libc::sa_family_t::try_from(libc::AF_PACKET).unwrap_or(17);
    addr.sll_protocol = u16::try_from(libc::ETH_P_ALL).unwrap_or(3).to_be();
    addr.sll_ifindex =
        libc::c_int::try_from(ifindex).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let len = libc::socklen_t::try_from(size_of::<libc::sockaddr_ll>())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `addr` is a valid `sockaddr_ll` of `len` bytes that outlives
    // the call; the kernel only reads it.
    let rc = unsafe { libc::bind(socket.as_raw_fd(), (&raw const addr).cast(), len) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A UDP socket, never bound (so it never queues a datagram), joined to
/// the group on the input interface: the membership makes the host send
/// IGMP/MLD reports, so snooping switches forward the group, and programs
/// the NIC's multicast filter.
pub(crate) fn membership_socket(input: &Input, ifindex: u32) -> io::Result<UdpSocket> {
    let domain = match input.address {
        IpAddr::V4(_) => Domain::IPV4,
        IpAddr::V6(_) => Domain::IPV6,
    };
    let socket = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
    join_group(&socket, input.address, input.source, ifindex)?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn input(address: &str) -> Input {
        Input {
            interface: "lo".to_owned(),
            address: address.parse().expect("address"),
            port: 5000,
            source: None,
            ingress: mcrelay_config::IngressKind::Packet,
            receive_buffer_bytes: 1 << 20,
            fec: None,
            srt: None,
            rist: None,
        }
    }

    fn has_cap_net_raw() -> bool {
        let status = std::fs::read_to_string("/proc/thread-self/status").expect("status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .is_some_and(|eff| eff & (1 << 13) != 0) // CAP_NET_RAW
    }

    #[test]
    fn the_packet_socket_receives_only_its_flow_on_loopback() {
        if !has_cap_net_raw() {
            eprintln!("SKIPPED: AF_PACKET needs CAP_NET_RAW (CI runs as root)");
            return;
        }
        let lo = crate::udp::interface_index("lo").expect("lo");
        let ingress = open_packet_ingress(&input("127.0.0.1"), lo).expect("open");
        assert!(ingress.membership.is_none(), "unicast input: no membership");
        let packet = Socket::from(ingress.socket);
        packet
            .set_read_timeout(Some(std::time::Duration::from_secs(60)))
            .expect("timeout");
        let sender = UdpSocket::bind("127.0.0.1:0").expect("bind");
        sender
            .send_to(b"other port", "127.0.0.1:5001")
            .expect("send");
        sender
            .send_to(b"for the flow", "127.0.0.1:5000")
            .expect("send");
        let mut buf = [std::mem::MaybeUninit::new(0u8); 2048];
        let n = packet.recv(&mut buf).expect("a frame");
        // SAFETY: `recv` initialised the first `n` bytes.
        let frame: Vec<u8> = buf[..n]
            .iter()
            .map(|b| unsafe { b.assume_init() })
            .collect();
        let flow = flow_match(&input("127.0.0.1"));
        // Loopback frames carry a checksum that is not filled in yet.
        let d = mcrelay_wire::parse(&frame, &flow, false).expect("the flow's datagram");
        assert_eq!(&frame[d.payload], b"for the flow");
        let _ = packet.as_fd();
        // The filter is locked: whoever holds the socket can't remove it.
        let detach = setsockopt(
            &packet,
            libc::SOL_SOCKET,
            libc::SO_DETACH_FILTER,
            &0 as &libc::c_int,
        );
        assert_eq!(detach.map_err(|e| e.raw_os_error()), Err(Some(libc::EPERM)));
    }

    #[test]
    fn a_multicast_input_gets_a_membership_socket() {
        if !has_cap_net_raw() {
            eprintln!("SKIPPED: AF_PACKET needs CAP_NET_RAW (CI runs as root)");
            return;
        }
        let lo = crate::udp::interface_index("lo").expect("lo");
        match open_packet_ingress(&input("239.255.77.1"), lo) {
            Ok(ingress) => {
                let m = ingress.membership.expect("membership");
                assert!(m.local_addr().is_ok_and(|a| a.port() == 0), "never bound");
            }
            // Loopback without the MULTICAST flag refuses the join.
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ENODEV), "{e}"),
        }
    }
}
