//! Socket options: nix's typed options where it has them, and one raw
//! `setsockopt` / `getsockopt` pair for those it has not (multicast joins by
//! interface index, `SO_MEMINFO`, `PACKET_STATISTICS`, `SO_PEERGROUPS`,
//! socket filters) — the only `unsafe` in this crate's socket code.
//!
//! Never on the packet path: sockets are set up before a flow starts, and
//! the drop counters are read by the control plane.
#![allow(unsafe_code)]

use std::io;
use std::mem::size_of;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd};

use nix::sys::socket::{setsockopt, sockopt};

/// `setsockopt` with a plain-data value, for options nix has no type for.
///
/// `T` must be the C layout the kernel expects for `(level, name)`
/// (`#[repr(C)]` libc structs, integers); the kernel only reads it. If `T`
/// holds a pointer (a `sock_fprog`), the kernel reads through it too —
/// only reads, checked by the kernel, so a wrong one fails with `EFAULT`
/// instead of touching memory.
pub fn set<T: Copy>(
    socket: &impl AsFd,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    let len = libc::socklen_t::try_from(size_of::<T>())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `value` points to a live, initialised `T` of `len` bytes for
    // the duration of the call; the kernel only reads it.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_fd().as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            len,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Attach the classic BPF `program` to `socket` (`SO_ATTACH_FILTER`),
/// replacing the one it had; no privilege needed on a socket this process
/// holds (unless the filter was locked, `SO_LOCK_FILTER`).
pub fn attach_filter(socket: &impl AsFd, program: &[libc::sock_filter]) -> io::Result<()> {
    let fprog = libc::sock_fprog {
        len: u16::try_from(program.len())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
        // Only read by the kernel, during the call (`set`'s contract).
        filter: program.as_ptr().cast_mut(),
    };
    set(socket, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &fprog)
}

/// `getsockopt` of an option whose value is an array of `u32` (or of a
/// struct of `u32`s) whose length depends on the kernel, which nix's typed
/// getters refuse. Returns the call's result and the length in bytes the
/// kernel reported: on success how much it wrote into `buf`, and for
/// options that fail with `ERANGE` when `buf` is short (`SO_PEERGROUPS`),
/// how much it needs.
pub fn get_u32s(
    socket: &impl AsFd,
    level: libc::c_int,
    name: libc::c_int,
    buf: &mut [u32],
) -> (io::Result<()>, usize) {
    let Ok(mut len) = libc::socklen_t::try_from(size_of_val(buf)) else {
        return (Err(io::Error::from(io::ErrorKind::InvalidInput)), 0);
    };
    // SAFETY: `buf` is a writable buffer of `len` bytes and `len` a valid
    // in/out length; the kernel writes at most `len` bytes into it.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_fd().as_raw_fd(),
            level,
            name,
            buf.as_mut_ptr().cast(),
            &raw mut len,
        )
    };
    let result = if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    };
    (result, usize::try_from(len).unwrap_or(0))
}

/// Whether the kernel takes UDP GSO (`UDP_SEGMENT`) on this socket: setting
/// the socket's default segment size to 0 (no segmentation) succeeds exactly
/// when the option exists.
pub fn supports_gso(socket: &impl AsFd) -> bool {
    setsockopt(socket, sockopt::UdpGsoSegment, &0).is_ok()
}

/// `SO_MEMINFO` (asm-generic value, as on x86-64 and aarch64; libc doesn't
/// export it).
const SO_MEMINFO: libc::c_int = 55;

/// Datagrams the kernel dropped on this socket because its receive buffer
/// was full (`SK_MEMINFO_DROPS` from `SO_MEMINFO`); `None` if the kernel
/// doesn't say.
pub fn receive_drops(socket: &impl AsFd) -> Option<u64> {
    let mut info = [0u32; 9];
    let (result, len) = get_u32s(socket, libc::SOL_SOCKET, SO_MEMINFO, &mut info);
    let drops = usize::try_from(libc::SK_MEMINFO_DROPS).ok()?;
    let filled = len / size_of::<u32>();
    (result.is_ok() && drops < filled).then(|| u64::from(info[drops]))
}

/// Request a receive buffer of `bytes`: `SO_RCVBUFFORCE` first, which with
/// `CAP_NET_ADMIN` is not clamped to `net.core.rmem_max`; on `EPERM` (no
/// `CAP_NET_ADMIN`) plain `SO_RCVBUF`, which the kernel clamps.
pub fn force_receive_buffer(socket: &impl AsFd, bytes: usize) -> io::Result<()> {
    let bytes = bytes.min(usize::try_from(libc::c_int::MAX).unwrap_or(usize::MAX));
    match setsockopt(socket, sockopt::RcvBufForce, &bytes) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EPERM) => Ok(setsockopt(socket, sockopt::RcvBuf, &bytes)?),
        Err(e) => Err(e.into()),
    }
}

/// Request a send buffer of `bytes`, the same way: `SO_SNDBUFFORCE` with
/// `CAP_NET_ADMIN`, else `SO_SNDBUF` (clamped to `net.core.wmem_max`).
pub fn force_send_buffer(socket: &impl AsFd, bytes: usize) -> io::Result<()> {
    let bytes = bytes.min(usize::try_from(libc::c_int::MAX).unwrap_or(usize::MAX));
    match setsockopt(socket, sockopt::SndBufForce, &bytes) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EPERM) => Ok(setsockopt(socket, sockopt::SndBuf, &bytes)?),
        Err(e) => Err(e.into()),
    }
}

/// `addr` (port 0) as a `sockaddr_storage`, as the `MCAST_*` requests take
/// it.
pub fn sockaddr_storage(addr: IpAddr) -> libc::sockaddr_storage {
    // SAFETY: `sockaddr_storage` is plain data for which all-zero is valid.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match SocketAddr::new(addr, 0) {
        SocketAddr::V4(a) => {
            let sin: libc::sockaddr_in = *nix::sys::socket::SockaddrIn::from(a).as_ref();
            write_prefix(&mut storage, &sin);
        }
        SocketAddr::V6(a) => {
            let sin6: libc::sockaddr_in6 = *nix::sys::socket::SockaddrIn6::from(a).as_ref();
            write_prefix(&mut storage, &sin6);
        }
    }
    storage
}

/// Copy a `sockaddr_in` or `sockaddr_in6` to the start of `storage`.
fn write_prefix<T: Copy>(storage: &mut libc::sockaddr_storage, addr: &T) {
    const { assert!(size_of::<libc::sockaddr_in6>() <= size_of::<libc::sockaddr_storage>()) };
    // SAFETY: `T` is `sockaddr_in` or `sockaddr_in6` (the only callers),
    // both no larger than `sockaddr_storage` (asserted above) and, like it,
    // plain data; `sockaddr_storage` is aligned for either, as the sockets
    // API requires; the two don't overlap.
    unsafe { (&raw mut *storage).cast::<T>().write(*addr) };
}

/// The `(level, option)` of a multicast request for `group`'s family.
fn mcast_level(group: IpAddr) -> libc::c_int {
    if group.is_ipv4() {
        libc::IPPROTO_IP
    } else {
        libc::IPPROTO_IPV6
    }
}

/// Join `group` from `source` on interface `ifindex` (IPv4 or IPv6):
/// `MCAST_JOIN_SOURCE_GROUP`, which, unlike `IP_ADD_SOURCE_MEMBERSHIP`,
/// names the interface by index.
pub fn join_source_group(
    socket: &impl AsFd,
    group: IpAddr,
    source: IpAddr,
    ifindex: u32,
) -> io::Result<()> {
    let req = libc::group_source_req {
        gsr_interface: ifindex,
        gsr_group: sockaddr_storage(group),
        gsr_source: sockaddr_storage(source),
    };
    set(
        socket,
        mcast_level(group),
        libc::MCAST_JOIN_SOURCE_GROUP,
        &req,
    )
}

/// Join `group` (any source) on interface `ifindex` (0: the kernel's
/// choice by route): `MCAST_JOIN_GROUP`.
pub fn join_any_source_group(socket: &impl AsFd, group: IpAddr, ifindex: u32) -> io::Result<()> {
    let req = libc::group_req {
        gr_interface: ifindex,
        gr_group: sockaddr_storage(group),
    };
    set(socket, mcast_level(group), libc::MCAST_JOIN_GROUP, &req)
}

/// Send IPv4 multicast out of interface `ifindex` (0: none named), or
/// out of the interface holding `local` (unspecified: none named):
/// `IP_MULTICAST_IF` with an `ip_mreqn`, which, unlike socket2's
/// `set_multicast_if_v4`, can name the interface by index.
pub fn multicast_if_v4(socket: &impl AsFd, ifindex: u32, local: Ipv4Addr) -> io::Result<()> {
    let req = libc::ip_mreqn {
        imr_multiaddr: libc::in_addr { s_addr: 0 },
        imr_address: libc::in_addr {
            s_addr: u32::from(local).to_be(),
        },
        imr_ifindex: libc::c_int::try_from(ifindex)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
    };
    set(socket, libc::IPPROTO_IP, libc::IP_MULTICAST_IF, &req)
}

/// A `SocketAddrV4` / `SocketAddrV6` back from a storage (tests).
#[cfg(test)]
fn from_storage(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    use nix::sys::socket::SockaddrLike;
    let len = libc::socklen_t::try_from(size_of::<libc::sockaddr_storage>()).ok()?;
    // SAFETY: `storage` is a valid, initialised `sockaddr_storage` of `len`
    // bytes.
    let s = unsafe {
        nix::sys::socket::SockaddrStorage::from_raw((&raw const *storage).cast(), Some(len))
    }?;
    if let Some(v4) = s.as_sockaddr_in() {
        return Some(SocketAddr::V4(std::net::SocketAddrV4::from(*v4)));
    }
    s.as_sockaddr_in6()
        .map(|v6| SocketAddr::V6(std::net::SocketAddrV6::from(*v6)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv6Addr, UdpSocket};

    #[test]
    fn storage_holds_the_address_with_port_zero() {
        for addr in [
            IpAddr::V4(Ipv4Addr::new(239, 1, 2, 3)),
            IpAddr::V6(Ipv6Addr::new(0xff3e, 0, 0, 0, 0, 0, 0, 0x1234)),
        ] {
            let back = from_storage(&sockaddr_storage(addr)).expect("an inet address");
            assert_eq!(back, SocketAddr::new(addr, 0));
        }
    }

    #[test]
    fn a_fresh_socket_has_dropped_nothing_and_takes_gso() {
        let s = UdpSocket::bind("127.0.0.1:0").expect("bind");
        assert_eq!(receive_drops(&s), Some(0));
        assert!(supports_gso(&s), "Linux >= 4.18 has UDP_SEGMENT");
    }

    #[test]
    fn loopback_joins_by_index() {
        let lo = crate::net::interface_index("lo").expect("lo");
        let s = UdpSocket::bind("0.0.0.0:0").expect("bind");
        let group = IpAddr::V4(Ipv4Addr::new(239, 255, 77, 1));
        join_source_group(&s, group, IpAddr::V4(Ipv4Addr::LOCALHOST), lo).expect("ssm join");
        let t = UdpSocket::bind("0.0.0.0:0").expect("bind");
        join_any_source_group(&t, group, lo).expect("asm join");
        // The same join twice is refused by the kernel: proof it was made.
        let e = join_any_source_group(&t, group, lo).expect_err("joined already");
        assert_eq!(e.raw_os_error(), Some(libc::EADDRINUSE));
    }

    #[test]
    fn multicast_goes_out_of_the_interface_named() {
        let lo = crate::net::interface_index("lo").expect("lo");
        let s = UdpSocket::bind("127.0.0.1:0").expect("bind");
        multicast_if_v4(&s, lo, Ipv4Addr::UNSPECIFIED).expect("by index");
        multicast_if_v4(&s, 0, Ipv4Addr::LOCALHOST).expect("by address");
        let e = multicast_if_v4(&s, u32::MAX, Ipv4Addr::UNSPECIFIED).expect_err("too big");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let e = multicast_if_v4(&s, 0, Ipv4Addr::new(192, 0, 2, 1)).expect_err("not ours");
        assert_eq!(e.raw_os_error(), Some(libc::EADDRNOTAVAIL));
    }

    #[test]
    fn buffers_are_granted_within_limits() {
        let s = UdpSocket::bind("127.0.0.1:0").expect("bind");
        force_receive_buffer(&s, 1 << 20).expect("rcvbuf");
        force_send_buffer(&s, 1 << 20).expect("sndbuf");
        let got = nix::sys::socket::getsockopt(&s, sockopt::RcvBuf).expect("get");
        assert!(got >= 4096, "{got}");
    }
}
