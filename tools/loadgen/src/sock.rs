//! The libc glue of the tools: opening sender and receiver sockets
//! (multicast interface, TTL, loop, group and source-specific joins, large
//! receive buffers) and moving datagrams in batches with `sendmmsg` /
//! `recvmmsg`, reading each received datagram's TTL / hop limit, its
//! kernel receive timestamp (`SO_TIMESTAMPNS`) and the socket's drop counter
//! from its control messages; and the clock reads the latency stamps use.
#![allow(unsafe_code)]

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::ops::Range;
use std::os::fd::AsRawFd;

use mcrelay_sys::sockopt;
use nix::time::{ClockId, clock_gettime};
use socket2::{Domain, Protocol, Socket, Type};

/// Most datagrams per `sendmmsg` / `recvmmsg` (the kernel's `UIO_MAXIOV`).
pub const MAX_BATCH: usize = 1024;
/// Largest UDP payload (IPv6 without jumbograms).
pub const MAX_DATAGRAM: usize = 65_527;
/// Receive buffer asked for (`SO_RCVBUFFORCE`, else `SO_RCVBUF`).
pub const RCVBUF: usize = 8 << 20;

/// Which interface multicast goes out of / is joined on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Iface {
    /// Let the kernel choose (by route).
    Any,
    /// By index (`--interface NAME`).
    Index(u32),
    /// By one of its addresses (`--interface-addr ADDR`).
    Addr(IpAddr),
}

impl Iface {
    /// From the `--interface` / `--interface-addr` options (the name wins).
    pub fn from_options(name: Option<&str>, addr: Option<IpAddr>) -> io::Result<Self> {
        match (name, addr) {
            (Some(n), _) => interface_index(n).map(Self::Index),
            (None, Some(a)) => Ok(Self::Addr(a)),
            (None, None) => Ok(Self::Any),
        }
    }

    /// The interface index (0 = any); addresses are looked up.
    pub fn index(self) -> io::Result<u32> {
        match self {
            Self::Any => Ok(0),
            Self::Index(i) => Ok(i),
            Self::Addr(a) => index_of_address(a),
        }
    }
}

pub use mcrelay_sys::net::{index_of_address, interface_index};

fn domain(a: IpAddr) -> Domain {
    if a.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    }
}

fn v4_of(a: IpAddr) -> io::Result<Ipv4Addr> {
    match a {
        IpAddr::V4(v) => Ok(v),
        IpAddr::V6(_) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{a} is not an IPv4 address"),
        )),
    }
}

/// How a sender is set up.
#[derive(Debug, Clone, Copy)]
pub struct SenderOptions {
    pub dest: SocketAddr,
    /// Multicast output interface.
    pub iface: Iface,
    /// Local address to send from.
    pub source: Option<IpAddr>,
    /// TTL / hop limit, unicast and multicast.
    pub ttl: u32,
    /// Loop multicast back to local receivers.
    pub multicast_loop: bool,
}

/// A UDP socket connected to `dest`, multicast out of the chosen interface,
/// with the TTL and loop setting asked for and a large send buffer.
pub fn sender(o: &SenderOptions) -> io::Result<UdpSocket> {
    let s = Socket::new(domain(o.dest.ip()), Type::DGRAM, Some(Protocol::UDP))?;
    if let Some(addr) = o.source {
        s.bind(&SocketAddr::new(addr, 0).into())?;
    }
    // Best effort: a bigger buffer only smooths bursts.
    let _ = s.set_send_buffer_size(4 << 20);
    match o.dest.ip() {
        IpAddr::V4(_) => {
            match o.iface {
                Iface::Any => {}
                Iface::Index(i) => sockopt::multicast_if_v4(&s, i, Ipv4Addr::UNSPECIFIED)?,
                Iface::Addr(a) => sockopt::multicast_if_v4(&s, 0, v4_of(a)?)?,
            }
            s.set_multicast_ttl_v4(o.ttl)?;
            s.set_ttl_v4(o.ttl)?;
            s.set_multicast_loop_v4(o.multicast_loop)?;
        }
        IpAddr::V6(_) => {
            let index = o.iface.index()?;
            if index != 0 {
                s.set_multicast_if_v6(index)?;
            }
            s.set_multicast_hops_v6(o.ttl)?;
            s.set_unicast_hops_v6(o.ttl)?;
            s.set_multicast_loop_v6(o.multicast_loop)?;
        }
    }
    s.connect(&o.dest.into())?;
    Ok(s.into())
}

/// How a receiver is set up.
#[derive(Debug, Clone, Copy)]
pub struct ReceiverOptions {
    /// A group to join, or a unicast address to bind.
    pub addr: SocketAddr,
    /// Interface to join on.
    pub iface: Iface,
    /// Source-specific join.
    pub source: Option<IpAddr>,
    /// Deliver each datagram's TTL / hop limit as a control message (the
    /// validating receiver; not the relay).
    pub control: bool,
}

/// Ask for a receive buffer of `bytes` (`SO_RCVBUFFORCE`, else
/// `SO_RCVBUF`, which the kernel caps at `net.core.rmem_max`); best
/// effort: returns the size the kernel granted (0 if unreadable).
pub fn request_receive_buffer(s: &impl std::os::fd::AsFd, bytes: usize) -> usize {
    let _ = sockopt::force_receive_buffer(s, bytes);
    let s = socket2::SockRef::from(s);
    s.recv_buffer_size().unwrap_or(0)
}

/// A bound (and, for a group, joined) receiver with a large receive buffer;
/// also returns the receive buffer size the kernel granted.
pub fn receiver(o: &ReceiverOptions) -> io::Result<(UdpSocket, usize)> {
    let ip = o.addr.ip();
    let s = Socket::new(domain(ip), Type::DGRAM, Some(Protocol::UDP))?;
    if ip.is_multicast() {
        s.set_reuse_address(true)?;
    }
    request_receive_buffer(&s, RCVBUF);
    let on: libc::c_int = 1;
    let setsockopt = sockopt::set::<libc::c_int>;
    if ip.is_ipv4() {
        if ip.is_multicast() {
            s.set_multicast_all_v4(false)?;
        }
        if o.control {
            setsockopt(&s, libc::IPPROTO_IP, libc::IP_RECVTTL, &on)?;
        }
    } else {
        s.set_only_v6(true)?;
        if ip.is_multicast() {
            s.set_multicast_all_v6(false)?;
        }
        if o.control {
            setsockopt(&s, libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT, &on)?;
        }
    }
    // Binding the group address itself keeps other groups on the port out.
    s.bind(&o.addr.into())?;
    if ip.is_multicast() {
        join(&s, ip, o.source, o.iface)?;
    }
    let granted = s.recv_buffer_size().unwrap_or(0);
    Ok((s.into(), granted))
}

/// Join `group` (source-specific when `source` is given) on `iface`:
/// IPv4 by address with `IP_ADD_MEMBERSHIP` / `IP_ADD_SOURCE_MEMBERSHIP`,
/// otherwise by index with `MCAST_JOIN_GROUP` / `MCAST_JOIN_SOURCE_GROUP`.
pub fn join(s: &Socket, group: IpAddr, source: Option<IpAddr>, iface: Iface) -> io::Result<()> {
    match (group, iface) {
        (IpAddr::V4(g), Iface::Addr(_) | Iface::Any) => {
            let local = match iface {
                Iface::Addr(a) => v4_of(a)?,
                _ => Ipv4Addr::UNSPECIFIED,
            };
            match source {
                Some(src) => s.join_ssm_v4(&v4_of(src)?, &g, &local),
                None => {
                    s.join_multicast_v4_n(&g, &socket2::InterfaceIndexOrAddress::Address(local))
                }
            }
        }
        _ => {
            let ifindex = iface.index()?;
            match source {
                Some(src) => sockopt::join_source_group(s, group, src, ifindex),
                None => sockopt::join_any_source_group(s, group, ifindex),
            }
        }
    }
}

/// `len` zeroed C structs.
fn zeroed_vec<T: Copy>(len: usize) -> Vec<T> {
    // SAFETY: only instantiated with `iovec` and `mmsghdr`, plain C structs
    // for which all-zero (null pointers, zero lengths) is valid.
    vec![unsafe { zeroed::<T>() }; len]
}

/// Reusable `sendmmsg` state.
pub struct SendBatch {
    iov: Vec<libc::iovec>,
    msgs: Vec<libc::mmsghdr>,
}

impl std::fmt::Debug for SendBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendBatch")
            .field("capacity", &self.iov.len())
            .finish()
    }
}

impl SendBatch {
    /// Up to `capacity` (clamped to 1..=[`MAX_BATCH`]) datagrams per call.
    pub fn new(capacity: usize) -> Self {
        let n = capacity.clamp(1, MAX_BATCH);
        Self {
            iov: zeroed_vec(n),
            msgs: zeroed_vec(n),
        }
    }

    /// Send `datagrams` (at most the capacity; the rest are ignored) on a
    /// connected socket with one `sendmmsg`; returns how many went.
    pub fn send<'a>(
        &mut self,
        s: &UdpSocket,
        datagrams: impl IntoIterator<Item = &'a [u8]>,
    ) -> io::Result<usize> {
        let mut n = 0;
        for ((d, iov), msg) in datagrams
            .into_iter()
            .zip(self.iov.iter_mut())
            .zip(self.msgs.iter_mut())
        {
            *iov = libc::iovec {
                iov_base: d.as_ptr().cast_mut().cast(),
                iov_len: d.len(),
            };
            msg.msg_hdr.msg_iov = iov;
            msg.msg_hdr.msg_iovlen = 1;
            n += 1;
        }
        if n == 0 {
            return Ok(0);
        }
        let count = libc::c_uint::try_from(n).unwrap_or(0);
        // SAFETY: `msgs[..n]` have no name or control and point at
        // `iov[..n]`, which point at the borrowed datagrams; all outlive the
        // call and the kernel only reads them.
        let rc = unsafe { libc::sendmmsg(s.as_raw_fd(), self.msgs.as_mut_ptr(), count, 0) };
        usize::try_from(rc).map_err(|_| io::Error::last_os_error())
    }
}

/// What the kernel said about one received datagram.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Meta {
    /// Bytes stored (at most the buffer stride).
    pub len: usize,
    /// Longer than the buffer: cut off (`MSG_TRUNC`).
    pub truncated: bool,
    /// TTL / hop limit, when control messages were asked for.
    pub ttl: Option<u8>,
    /// When the kernel received it (`CLOCK_REALTIME`, ns since the epoch),
    /// with control messages on and [`enable_rx_timestamps`] set.
    pub kernel_time_ns: Option<u64>,
}

/// Control buffer per datagram: room for the TTL / hop limit message
/// (24 bytes) and an `SCM_TIMESTAMPNS` (32 bytes), with room to spare.
type Control = [u64; 12];

/// Reusable `recvmmsg` state: `capacity` buffers of `stride` bytes.
pub struct RecvBatch {
    stride: usize,
    bufs: Vec<u8>,
    iov: Vec<libc::iovec>,
    msgs: Vec<libc::mmsghdr>,
    control: Vec<Control>,
    meta: Vec<Meta>,
    with_control: bool,
}

impl std::fmt::Debug for RecvBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvBatch")
            .field("capacity", &self.iov.len())
            .field("stride", &self.stride)
            .finish()
    }
}

impl RecvBatch {
    /// `capacity` (clamped to 1..=[`MAX_BATCH`]) buffers of `stride` bytes;
    /// `control` parses TTL / hop-limit control messages.
    pub fn new(capacity: usize, stride: usize, control: bool) -> Self {
        let n = capacity.clamp(1, MAX_BATCH);
        let stride = stride.max(1);
        Self {
            stride,
            bufs: vec![0; n * stride],
            iov: zeroed_vec(n),
            msgs: zeroed_vec(n),
            control: vec![[0; 12]; if control { n } else { 0 }],
            meta: vec![Meta::default(); n],
            with_control: control,
        }
    }

    /// Receive up to the capacity with one `recvmmsg`: blocks for the
    /// first datagram (up to the socket's read timeout), then takes what
    /// else is queued. Returns how many arrived.
    pub fn recv(&mut self, s: &UdpSocket) -> io::Result<usize> {
        let n = self.iov.len();
        for (i, (buf, (iov, msg))) in self
            .bufs
            .chunks_exact_mut(self.stride)
            .zip(self.iov.iter_mut().zip(self.msgs.iter_mut()))
            .enumerate()
        {
            *iov = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            };
            msg.msg_hdr.msg_iov = iov;
            msg.msg_hdr.msg_iovlen = 1;
            msg.msg_hdr.msg_flags = 0;
            msg.msg_len = 0;
            if let Some(c) = self.control.get_mut(i) {
                msg.msg_hdr.msg_control = c.as_mut_ptr().cast();
                msg.msg_hdr.msg_controllen = size_of::<Control>();
            }
        }
        let count = libc::c_uint::try_from(n).unwrap_or(1);
        // SAFETY: `msgs[..n]` point at `iov[..n]` (disjoint `stride`-byte
        // chunks of `bufs`) and, with control, at `control[..n]`; all are
        // owned by `self`, exclusively borrowed for the call, and sized as
        // declared. MSG_WAITFORONE returns once at least one arrived.
        let rc = unsafe {
            libc::recvmmsg(
                s.as_raw_fd(),
                self.msgs.as_mut_ptr(),
                count,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        let got = usize::try_from(rc).map_err(|_| io::Error::last_os_error())?;
        for i in 0..got.min(n) {
            let hdr = &self.msgs[i].msg_hdr;
            let mut m = Meta {
                len: usize::try_from(self.msgs[i].msg_len)
                    .unwrap_or(0)
                    .min(self.stride),
                truncated: hdr.msg_flags & libc::MSG_TRUNC != 0,
                ttl: None,
                kernel_time_ns: None,
            };
            if self.with_control {
                (m.ttl, m.kernel_time_ns) = control_of(hdr);
            }
            self.meta[i] = m;
        }
        Ok(got.min(n))
    }

    /// Datagram `i` of the last [`recv`](Self::recv) and what the kernel
    /// said about it.
    pub fn get(&self, i: usize) -> (&[u8], Meta) {
        let m = self.meta.get(i).copied().unwrap_or_default();
        let start = i.saturating_mul(self.stride);
        let data = self.bufs.get(start..start + m.len).unwrap_or(&[]);
        (data, m)
    }

    /// [`get`](Self::get), writable (the latency stamp is taken out of
    /// the datagram in place before it is checked).
    pub fn get_mut(&mut self, i: usize) -> (&mut [u8], Meta) {
        let m = self.meta.get(i).copied().unwrap_or_default();
        let start = i.saturating_mul(self.stride);
        let data = self.bufs.get_mut(start..start + m.len).unwrap_or(&mut []);
        (data, m)
    }

    /// The datagrams `range` of the last receive, for re-sending.
    pub fn datagrams(&self, range: Range<usize>) -> impl Iterator<Item = &[u8]> {
        range.map(|i| self.get(i).0)
    }
}

/// The TTL / hop limit and the kernel receive timestamp (`CLOCK_REALTIME`
/// ns) in a received message's control data.
fn control_of(hdr: &libc::msghdr) -> (Option<u8>, Option<u64>) {
    let (mut ttl, mut stamp) = (None, None);
    // SAFETY: `hdr` was filled by recvmmsg: `msg_control` points at our
    // control buffer and `msg_controllen` is within it. CMSG_FIRSTHDR only
    // reads those two fields.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(hdr) };
    while !c.is_null() {
        // SAFETY: `c` is a non-null header CMSG_FIRSTHDR/NXTHDR found inside
        // the control buffer; read unaligned to assume no alignment.
        let header = unsafe { c.read_unaligned() };
        // SAFETY: the data of `c` lies within the control buffer.
        let data = unsafe { libc::CMSG_DATA(c) };
        if (header.cmsg_level == libc::IPPROTO_IP && header.cmsg_type == libc::IP_TTL)
            || (header.cmsg_level == libc::IPPROTO_IPV6 && header.cmsg_type == libc::IPV6_HOPLIMIT)
        {
            // SAFETY: both messages carry one c_int of data, read unaligned.
            let v = unsafe { data.cast::<libc::c_int>().read_unaligned() };
            ttl = u8::try_from(v).ok();
        } else if header.cmsg_level == libc::SOL_SOCKET
            && header.cmsg_type == libc::SCM_TIMESTAMPNS
            && header.cmsg_len >= TIMESTAMP_CMSG_LEN as _
        {
            // SAFETY: an SCM_TIMESTAMPNS message carries one timespec, and
            // its length (checked above) says it is all inside the control
            // buffer; read unaligned.
            let ts = unsafe { data.cast::<libc::timespec>().read_unaligned() };
            stamp = timespec_ns(&ts);
        }
        // SAFETY: `hdr` and `c` are a valid pair as above; NXTHDR returns
        // null past the end of `msg_controllen`.
        c = unsafe { libc::CMSG_NXTHDR(hdr, c) };
    }
    (ttl, stamp)
}

/// `CMSG_LEN(sizeof(struct timespec))`: the header (a multiple of the
/// alignment) and one timespec.
const TIMESTAMP_CMSG_LEN: usize = size_of::<libc::cmsghdr>() + size_of::<libc::timespec>();

fn timespec_ns(ts: &libc::timespec) -> Option<u64> {
    let secs = u64::try_from(ts.tv_sec).ok()?;
    let nanos = u64::try_from(ts.tv_nsec).ok()?;
    secs.checked_mul(1_000_000_000)?.checked_add(nanos)
}

/// Ask the kernel to stamp every datagram this socket receives
/// (`SO_TIMESTAMPNS`: `CLOCK_REALTIME` when the packet entered the
/// receiving namespace's stack, delivered as `SCM_TIMESTAMPNS`; read with
/// [`RecvBatch`] built with control messages on).
pub fn enable_rx_timestamps(s: &UdpSocket) -> io::Result<()> {
    let on: libc::c_int = 1;
    sockopt::set(s, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, &on)
}

/// `clock`'s time in ns (`clock_gettime`; the vDSO for the two clocks
/// below), 0 if the clock can't be read.
fn clock_ns(clock: ClockId) -> u64 {
    clock_gettime(clock).map_or(0, |ts| timespec_ns(ts.as_ref()).unwrap_or(0))
}

/// `CLOCK_MONOTONIC` in ns: one clock for every network namespace of the
/// host, so a sender's stamp and a receiver's reading compare directly.
pub fn monotonic_ns() -> u64 {
    clock_ns(ClockId::CLOCK_MONOTONIC)
}

/// `CLOCK_REALTIME` in ns since the epoch (what kernel receive timestamps
/// use).
pub fn realtime_ns() -> u64 {
    clock_ns(ClockId::CLOCK_REALTIME)
}

/// Datagrams the kernel dropped for this socket (receive buffer full),
/// from `SO_MEMINFO`; `None` if the kernel does not say.
pub fn socket_drops(s: &UdpSocket) -> Option<u32> {
    // The kernel's counter is 32 bits wide.
    sockopt::receive_drops(s).and_then(|d| u32::try_from(d).ok())
}

/// Ask for 1 ns timer slack so short sleeps wake on time (best effort).
pub fn tight_timer_slack() {
    let _ = nix::sys::prctl::set_timerslack(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interfaces_by_name_and_by_address_agree() {
        let lo = interface_index("lo").expect("lo");
        assert_eq!(
            index_of_address(IpAddr::from([127, 0, 0, 1])).ok(),
            Some(lo)
        );
        assert_eq!(
            Iface::from_options(Some("lo"), None).ok(),
            Some(Iface::Index(lo))
        );
        assert_eq!(Iface::from_options(None, None).ok(), Some(Iface::Any));
        assert!(interface_index("no-such-if0").is_err());
        assert!(index_of_address(IpAddr::from([192, 0, 2, 123])).is_err());
    }

    #[test]
    fn batches_carry_datagrams_and_ttl() {
        let (rx, _) = receiver(&ReceiverOptions {
            addr: "127.0.0.1:0".parse().expect("addr"),
            iface: Iface::Any,
            source: None,
            control: true,
        })
        .expect("receiver");
        let dest = rx.local_addr().expect("addr");
        let tx = sender(&SenderOptions {
            dest,
            iface: Iface::Any,
            source: None,
            ttl: 11,
            multicast_loop: false,
        })
        .expect("sender");
        let data: Vec<Vec<u8>> = (1..=5).map(|n| vec![n; usize::from(n) * 10]).collect();
        let mut sb = SendBatch::new(8);
        assert_eq!(sb.send(&tx, data.iter().map(Vec::as_slice)).ok(), Some(5));
        rx.set_read_timeout(Some(std::time::Duration::from_secs(2)))
            .expect("timeout");
        // A stride of 30 truncates the 40- and 50-byte datagrams.
        let mut rb = RecvBatch::new(8, 30, true);
        let mut got = Vec::new();
        while got.len() < 5 {
            let n = rb.recv(&rx).expect("recv");
            got.extend((0..n).map(|i| {
                let (d, m) = rb.get(i);
                (d.to_vec(), m)
            }));
        }
        for (i, (d, m)) in got.iter().enumerate() {
            let want = &data[i][..data[i].len().min(30)];
            assert_eq!(d.as_slice(), want);
            assert_eq!((m.truncated, m.ttl), (data[i].len() > 30, Some(11)));
        }
        assert_eq!(socket_drops(&rx), Some(0));
    }
}
