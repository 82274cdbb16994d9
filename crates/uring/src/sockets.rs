//! What the data plane asks of sockets it was given (it never opens one:
//! the privileged helper does, with `mcrelay-sockets`): whether an output takes
//! UDP GSO, and how many datagrams the kernel dropped on an ingress socket.
//! The calls themselves live in `mcrelay-sys`.

use std::os::fd::AsFd;

pub use mcrelay_sys::sockopt::{receive_drops, supports_gso};

/// The kernel's drop count for one flow's ingress, read by the control
/// plane from a duplicate of the ingress socket while the worker uses the
/// original. A UDP socket counts socket-buffer overflows (`SO_MEMINFO`); a
/// packet socket counts every frame it dropped, ring full included, in
/// `PACKET_STATISTICS` — which resets on each read, so the reads are
/// summed here; an AF_XDP socket its RX-ring-full and other drops
/// (`XDP_STATISTICS`, cumulative).
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

    /// The duplicates, in leg order.
    pub fn fds(&self) -> impl Iterator<Item = &std::os::fd::OwnedFd> {
        self.legs.iter().map(|(fd, _)| fd)
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
            None => match mcrelay_sys::xdp::xsk_statistics(fd) {
                // An AF_XDP socket (`ingress = "xdp"`): frames dropped for
                // a full RX ring, and for no free UMEM frame or one too
                // small; cumulative.
                Ok(x) => x.rx_dropped.saturating_add(x.rx_ring_full),
                Err(_) => receive_drops(fd).unwrap_or(0),
            },
        })
    }
}

/// `tp_drops` of `PACKET_STATISTICS` since the last read, or `None` for a
/// socket that isn't AF_PACKET.
fn packet_statistics_drops(socket: &impl AsFd) -> Option<u64> {
    // `struct tpacket_stats_v3`: tp_packets, tp_drops, tp_freeze_q_cnt (the
    // first two are `struct tpacket_stats` for older ring versions).
    let mut stats = [0u32; 3];
    let (result, _) = mcrelay_sys::sockopt::get_u32s(
        socket,
        libc::SOL_PACKET,
        libc::PACKET_STATISTICS,
        &mut stats,
    );
    result.ok().map(|()| u64::from(stats[1]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;

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
