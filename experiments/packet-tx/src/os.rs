//! The libc calls the measurement needs: a send-only AF_PACKET socket bound
//! to an interface, `PACKET_QDISC_BYPASS`, and the thread's CPU time.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// `setsockopt(fd, level, name, value)` for a plain-data `value`.
fn setsockopt<T: Copy>(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    let len = libc::socklen_t::try_from(size_of::<T>())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `value` points at `len` initialised bytes of a `Copy` (plain
    // data) value that outlives the call; the kernel only reads them.
    let rc =
        unsafe { libc::setsockopt(fd.as_raw_fd(), level, name, (&raw const *value).cast(), len) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// An `AF_PACKET` `SOCK_RAW` socket of protocol 0 (it receives nothing:
/// no protocol hook, so the kernel delivers it no copies of traffic),
/// bound to `ifindex` so a `sendmsg` without an address goes out there,
/// with `SO_SNDBUF` `send_buffer` (forced, as root) and, if `bypass`,
/// `PACKET_QDISC_BYPASS` (frames go straight to the driver's transmit).
/// With `vnet_hdr`, `PACKET_VNET_HDR`: every frame sent starts with a
/// `virtio_net_hdr` (segmentation and checksum offload requests).
pub fn open_packet_egress(
    ifindex: u32,
    send_buffer: i32,
    bypass: bool,
    vnet_hdr: bool,
) -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let b = fd.as_fd();
    // SAFETY: `sockaddr_ll` is plain data for which all-zero is valid.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = u16::try_from(libc::AF_PACKET).unwrap_or(0);
    addr.sll_protocol = 0;
    addr.sll_ifindex =
        i32::try_from(ifindex).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let len = libc::socklen_t::try_from(size_of::<libc::sockaddr_ll>()).unwrap_or(0);
    // SAFETY: `addr` is a valid `sockaddr_ll` of `len` bytes that outlives
    // the call; the kernel only reads it.
    if unsafe { libc::bind(b.as_raw_fd(), (&raw const addr).cast(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    setsockopt(b, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, &send_buffer)?;
    if bypass {
        setsockopt(b, libc::SOL_PACKET, libc::PACKET_QDISC_BYPASS, &1i32)?;
    }
    if vnet_hdr {
        /// `PACKET_VNET_HDR` of linux/if_packet.h.
        const PACKET_VNET_HDR: libc::c_int = 15;
        setsockopt(b, libc::SOL_PACKET, PACKET_VNET_HDR, &1i32)?;
    }
    Ok(fd)
}

/// User and system CPU time of the calling thread, in nanoseconds.
pub fn thread_cpu_ns() -> io::Result<(u64, u64)> {
    // SAFETY: `rusage` is plain data for which all-zero is valid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable `rusage` for the call.
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &raw mut usage) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let ns = |t: libc::timeval| {
        u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000
            + u64::try_from(t.tv_usec).unwrap_or(0) * 1_000
    };
    Ok((ns(usage.ru_utime), ns(usage.ru_stime)))
}
