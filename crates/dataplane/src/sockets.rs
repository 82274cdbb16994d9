//! What the data plane asks of sockets it was given (it never opens one:
//! the privileged helper, `mcrelay-helper`, does): whether an output takes
//! UDP GSO, and how many datagrams the kernel dropped on an ingress socket.
#![allow(unsafe_code)]

use std::io;
use std::mem::size_of;
use std::net::UdpSocket;
use std::os::fd::AsRawFd;

/// `setsockopt` with a plain-data value.
pub(crate) fn setsockopt<T>(
    socket: &impl AsRawFd,
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
            socket.as_raw_fd(),
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

/// Whether the kernel takes UDP GSO (`UDP_SEGMENT`) on this socket: setting
/// the socket's default segment size to 0 (no segmentation) succeeds exactly
/// when the option exists. Probed once per output, before the flow starts.
pub fn supports_gso(socket: &UdpSocket) -> bool {
    setsockopt(socket, libc::SOL_UDP, libc::UDP_SEGMENT, &0 as &libc::c_int).is_ok()
}

/// `SO_MEMINFO` (asm-generic value, as on x86-64 and aarch64; libc doesn't
/// export it).
const SO_MEMINFO: libc::c_int = 55;

/// Datagrams the kernel dropped on this socket because its receive buffer
/// was full (`SK_MEMINFO_DROPS` from `SO_MEMINFO`); `None` if the kernel
/// doesn't say.
pub fn receive_drops(socket: &impl AsRawFd) -> Option<u64> {
    let mut info = [0u32; 9];
    let mut len = libc::socklen_t::try_from(size_of_val(&info)).ok()?;
    // SAFETY: `info` is a writable buffer of `len` bytes and `len` a valid
    // in/out length; the kernel writes at most `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_MEMINFO,
            info.as_mut_ptr().cast(),
            &raw mut len,
        )
    };
    let drops = usize::try_from(libc::SK_MEMINFO_DROPS).ok()?;
    let filled = usize::try_from(len).ok()? / size_of::<u32>();
    (rc == 0 && drops < filled).then(|| u64::from(info[drops]))
}

/// The kernel's drop count for one flow's ingress, read by the control
/// plane from a duplicate of the ingress socket while the worker uses the
/// original. A UDP socket counts socket-buffer overflows (`SO_MEMINFO`); a
/// packet socket counts every frame it dropped, ring full included, in
/// `PACKET_STATISTICS` — which resets on each read, so the reads are
/// summed here.
///
/// A flow with several legs watches each leg's socket: [`KernelDrops::get`]
/// is their sum, [`KernelDrops::leg`] one leg's.
#[derive(Debug)]
pub struct KernelDrops {
    /// Per leg: the duplicate, and its packet drops summed so far.
    legs: Vec<(std::os::fd::OwnedFd, std::sync::atomic::AtomicU64)>,
}

impl KernelDrops {
    /// Watch `fd` (a duplicate of a flow's ingress socket).
    pub fn new(fd: std::os::fd::OwnedFd) -> Self {
        Self::legs(vec![fd])
    }

    /// Watch `fds`, duplicates of each leg's ingress socket, in leg order.
    pub fn legs(fds: Vec<std::os::fd::OwnedFd>) -> Self {
        Self {
            legs: fds
                .into_iter()
                .map(|fd| (fd, std::sync::atomic::AtomicU64::new(0)))
                .collect(),
        }
    }

    /// Drops so far, over every leg.
    pub fn get(&self) -> u64 {
        (0..self.legs.len()).filter_map(|i| self.leg(i)).sum()
    }

    /// Drops so far of leg `leg`.
    pub fn leg(&self, leg: usize) -> Option<u64> {
        use std::sync::atomic::Ordering::Relaxed;
        let (fd, packet_drops) = self.legs.get(leg)?;
        Some(match packet_statistics_drops(fd) {
            Some(new) => packet_drops.fetch_add(new, Relaxed) + new,
            None => receive_drops(fd).unwrap_or(0),
        })
    }
}

/// `tp_drops` of `PACKET_STATISTICS` since the last read, or `None` for a
/// socket that isn't AF_PACKET.
fn packet_statistics_drops(socket: &impl AsRawFd) -> Option<u64> {
    // `struct tpacket_stats_v3`: tp_packets, tp_drops, tp_freeze_q_cnt (the
    // first two are `struct tpacket_stats` for older ring versions).
    let mut stats = [0u32; 3];
    let mut len = libc::socklen_t::try_from(size_of_val(&stats)).ok()?;
    // SAFETY: `stats` is a writable buffer of `len` bytes and `len` a valid
    // in/out length; the kernel writes at most `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_STATISTICS,
            stats.as_mut_ptr().cast(),
            &raw mut len,
        )
    };
    (rc == 0).then(|| u64::from(stats[1]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_socket_has_dropped_nothing() {
        let s = UdpSocket::bind("127.0.0.1:0").expect("bind");
        assert_eq!(receive_drops(&s), Some(0));
        assert_eq!(packet_statistics_drops(&s), None, "not a packet socket");
        assert_eq!(KernelDrops::new(s.into()).get(), 0);
    }

    #[test]
    fn loopback_udp_sockets_take_gso() {
        let s = UdpSocket::bind("127.0.0.1:0").expect("bind");
        assert!(supports_gso(&s), "Linux >= 4.18 has UDP_SEGMENT");
    }
}
