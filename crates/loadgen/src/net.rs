//! Sockets for the tools: opening sender/receiver sockets and moving
//! datagrams in batches with `sendmmsg` / `recvmmsg` (with the TTL or hop
//! limit of each received datagram from its control message).
#![allow(unsafe_code)]

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

use socket2::{Domain, Protocol, Socket, Type};

/// Most datagrams per `sendmmsg` / `recvmmsg`.
pub const MAX_BATCH: usize = 64;
/// Receive buffer per datagram: above the largest relayable payload.
pub const RECV_BUF: usize = 9216;

pub fn interface_index(name: &str) -> io::Result<u32> {
    let c =
        std::ffi::CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `c` is a NUL-terminated string alive for the call.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no interface {name:?}"),
        ))
    } else {
        Ok(i)
    }
}

fn setsockopt<T>(s: &Socket, level: libc::c_int, name: libc::c_int, v: &T) -> io::Result<()> {
    let len = libc::socklen_t::try_from(size_of::<T>())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `v` is a live `T` of `len` bytes; the kernel only reads it.
    let rc = unsafe { libc::setsockopt(s.as_raw_fd(), level, name, (v as *const T).cast(), len) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn domain(a: IpAddr) -> Domain {
    if a.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    }
}

/// A sender connected to `dest` (from `bind`, if given): multicast out of
/// `ifindex` (if given), with
/// `ttl`, multicast loopback as asked, and a large send buffer.
pub fn sender(
    dest: SocketAddr,
    ifindex: Option<u32>,
    bind: Option<IpAddr>,
    ttl: u32,
    multicast_loop: bool,
) -> io::Result<UdpSocket> {
    let s = Socket::new(domain(dest.ip()), Type::DGRAM, Some(Protocol::UDP))?;
    if let Some(addr) = bind {
        s.bind(&SocketAddr::new(addr, 0).into())?;
    }
    let _ = s.set_send_buffer_size(8 << 20);
    match dest.ip() {
        IpAddr::V4(_) => {
            if let Some(i) = ifindex {
                let req = libc::ip_mreqn {
                    imr_multiaddr: libc::in_addr { s_addr: 0 },
                    imr_address: libc::in_addr { s_addr: 0 },
                    imr_ifindex: libc::c_int::try_from(i).unwrap_or(0),
                };
                setsockopt(&s, libc::IPPROTO_IP, libc::IP_MULTICAST_IF, &req)?;
            }
            s.set_multicast_ttl_v4(ttl)?;
            s.set_ttl_v4(ttl)?;
            s.set_multicast_loop_v4(multicast_loop)?;
        }
        IpAddr::V6(_) => {
            if let Some(i) = ifindex {
                s.set_multicast_if_v6(i)?;
            }
            s.set_multicast_hops_v6(ttl)?;
            s.set_unicast_hops_v6(ttl)?;
            s.set_multicast_loop_v6(multicast_loop)?;
        }
    }
    s.connect(&dest.into())?;
    Ok(s.into())
}

/// A receiver bound to `addr`, joined to it on `ifindex` when it is a group
/// (source-specific when `source` is given), reporting each datagram's
/// TTL / hop limit, with a large receive buffer.
pub fn receiver(addr: SocketAddr, ifindex: u32, source: Option<IpAddr>) -> io::Result<UdpSocket> {
    let s = Socket::new(domain(addr.ip()), Type::DGRAM, Some(Protocol::UDP))?;
    s.set_reuse_address(true)?;
    let big: libc::c_int = 16 << 20;
    if setsockopt(&s, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &big).is_err() {
        let _ = s.set_recv_buffer_size(16 << 20);
    }
    let on: libc::c_int = 1;
    match addr.ip() {
        IpAddr::V4(g) => {
            s.set_multicast_all_v4(false)?;
            setsockopt(&s, libc::IPPROTO_IP, libc::IP_RECVTTL, &on)?;
            s.bind(&addr.into())?;
            if g.is_multicast() {
                join(&s, addr.ip(), source, ifindex)?;
            }
        }
        IpAddr::V6(g) => {
            s.set_only_v6(true)?;
            s.set_multicast_all_v6(false)?;
            setsockopt(&s, libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT, &on)?;
            s.bind(&addr.into())?;
            if g.is_multicast() {
                join(&s, addr.ip(), source, ifindex)?;
            }
        }
    }
    Ok(s.into())
}

fn storage(a: IpAddr) -> libc::sockaddr_storage {
    let sa = socket2::SockAddr::from(SocketAddr::new(a, 0));
    // SAFETY: all-zero is a valid `sockaddr_storage`.
    let mut st: libc::sockaddr_storage = unsafe { zeroed() };
    let n = (sa.len() as usize).min(size_of::<libc::sockaddr_storage>());
    // SAFETY: `sa` holds `sa.len()` initialised bytes; `st` has room for `n`.
    unsafe {
        std::ptr::copy_nonoverlapping(sa.as_ptr().cast::<u8>(), (&raw mut st).cast::<u8>(), n)
    };
    st
}

/// `MCAST_JOIN_GROUP` / `MCAST_JOIN_SOURCE_GROUP`, by interface index.
pub fn join(s: &Socket, group: IpAddr, source: Option<IpAddr>, ifindex: u32) -> io::Result<()> {
    let level = if group.is_ipv4() {
        libc::IPPROTO_IP
    } else {
        libc::IPPROTO_IPV6
    };
    match source {
        Some(src) => {
            let req = libc::group_source_req {
                gsr_interface: ifindex,
                gsr_group: storage(group),
                gsr_source: storage(src),
            };
            setsockopt(s, level, libc::MCAST_JOIN_SOURCE_GROUP, &req)
        }
        None => {
            let req = libc::group_req {
                gr_interface: ifindex,
                gr_group: storage(group),
            };
            setsockopt(s, level, libc::MCAST_JOIN_GROUP, &req)
        }
    }
}

/// Send `bufs` (each one datagram) on a connected socket with one
/// `sendmmsg`; how many went.
pub fn send_batch(s: &UdpSocket, bufs: &[&[u8]]) -> io::Result<usize> {
    let n = bufs.len().min(MAX_BATCH);
    // SAFETY: all-zero is valid for `iovec` and `mmsghdr` (null pointers,
    // zero lengths).
    let mut iov: [libc::iovec; MAX_BATCH] = unsafe { zeroed() };
    // SAFETY: as above.
    let mut msgs: [libc::mmsghdr; MAX_BATCH] = unsafe { zeroed() };
    for i in 0..n {
        iov[i] = libc::iovec {
            iov_base: bufs[i].as_ptr().cast_mut().cast(),
            iov_len: bufs[i].len(),
        };
        msgs[i].msg_hdr.msg_iov = &raw mut iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
    }
    let count = libc::c_uint::try_from(n).unwrap_or(0);
    // SAFETY: `msgs[..n]` point at `iov[..n]`, which point at the caller's
    // buffers; all outlive the call and the kernel only reads them.
    let rc = unsafe { libc::sendmmsg(s.as_raw_fd(), msgs.as_mut_ptr(), count, 0) };
    usize::try_from(rc).map_err(|_| io::Error::last_os_error())
}

/// One received datagram: its length and TTL / hop limit (if reported).
#[derive(Debug, Clone, Copy, Default)]
pub struct Received {
    pub len: usize,
    pub ttl: Option<u8>,
}

/// Receive up to `MAX_BATCH` datagrams into `bufs` with one blocking
/// `recvmmsg` (returns after the first, taking whatever else is queued).
pub fn recv_batch(
    s: &UdpSocket,
    bufs: &mut [[u8; RECV_BUF]],
    out: &mut [Received; MAX_BATCH],
) -> io::Result<usize> {
    let n = bufs.len().min(MAX_BATCH);
    // SAFETY: all-zero is valid for these plain C structs.
    let mut iov: [libc::iovec; MAX_BATCH] = unsafe { zeroed() };
    // SAFETY: as above.
    let mut msgs: [libc::mmsghdr; MAX_BATCH] = unsafe { zeroed() };
    let mut control = [[0u64; 8]; MAX_BATCH];
    for i in 0..n {
        iov[i] = libc::iovec {
            iov_base: bufs[i].as_mut_ptr().cast(),
            iov_len: RECV_BUF,
        };
        msgs[i].msg_hdr.msg_iov = &raw mut iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
        msgs[i].msg_hdr.msg_control = control[i].as_mut_ptr().cast();
        msgs[i].msg_hdr.msg_controllen = size_of::<[u64; 8]>();
    }
    let count = libc::c_uint::try_from(n).unwrap_or(0);
    // SAFETY: `msgs[..n]` point at `iov[..n]` (the caller's buffers, each
    // `RECV_BUF` bytes) and at `control[..n]`, all alive and exclusively
    // ours for the call; `MSG_WAITFORONE` returns after the first datagram.
    let rc = unsafe {
        libc::recvmmsg(
            s.as_raw_fd(),
            msgs.as_mut_ptr(),
            count,
            libc::MSG_WAITFORONE,
            std::ptr::null_mut(),
        )
    };
    let got = usize::try_from(rc).map_err(|_| io::Error::last_os_error())?;
    for i in 0..got {
        out[i] = Received {
            len: msgs[i].msg_len as usize,
            ttl: ttl_of(&msgs[i].msg_hdr),
        };
    }
    Ok(got)
}

fn ttl_of(hdr: &libc::msghdr) -> Option<u8> {
    // SAFETY: `hdr` was filled by `recvmmsg`; the CMSG macros walk its
    // control buffer within `msg_controllen`.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(hdr) };
    while !c.is_null() {
        // SAFETY: `c` is a non-null header inside the control buffer.
        let header = unsafe { &*c };
        let (level, kind) = (header.cmsg_level, header.cmsg_type);
        if (level == libc::IPPROTO_IP && kind == libc::IP_TTL)
            || (level == libc::IPPROTO_IPV6 && kind == libc::IPV6_HOPLIMIT)
        {
            // SAFETY: both options carry one `c_int` of data.
            let data = unsafe { libc::CMSG_DATA(c) };
            // SAFETY: `data` points at the option's `c_int`, possibly unaligned.
            let v = unsafe { data.cast::<libc::c_int>().read_unaligned() };
            return u8::try_from(v).ok();
        }
        // SAFETY: `hdr` and `c` are a valid pair as above.
        c = unsafe { libc::CMSG_NXTHDR(hdr, c) };
    }
    None
}
