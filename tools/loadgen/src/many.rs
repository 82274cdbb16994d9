//! Many groups at once (`loadgen many-send` / `loadgen many-recv`): the
//! load of a relay carrying hundreds or thousands of flows.
//!
//! Group `i` of a range is the range's first address plus `i` (IPv4),
//! e.g. `239.10.0.1`, `239.10.0.2`, ... The sender goes round-robin over
//! the groups at one aggregate rate: datagram `n` goes to group
//! `n % groups` with stream id `n % groups` and sequence `n / groups`, so
//! every group carries the same count. One receiver joins every group of
//! a range on one socket (bound to the port, `IP_MULTICAST_ALL` off) and
//! checks every datagram with [`crate::payload::check`]; the stream id
//! says which flow it belongs to, so loss, duplicates and reordering are
//! counted per group.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};

use crate::tracker::Streams;

/// Group `index` of the range starting at `first`; `None` past the end of
/// the address space.
pub fn group(first: Ipv4Addr, index: u32) -> Option<Ipv4Addr> {
    u32::from(first).checked_add(index).map(Ipv4Addr::from)
}

/// Which group and sequence number datagram `n` of a round-robin over
/// `groups` groups carries.
pub fn slot(n: u64, groups: u32) -> (u32, u64) {
    let g = u64::from(groups.max(1));
    (u32::try_from(n % g).unwrap_or(0), n / g)
}

/// What one receiver saw of `groups` groups that were each sent
/// `per_group` datagrams.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Summary {
    /// Datagrams lost over every group not excluded.
    pub lost: u64,
    /// Groups not excluded that lost at least one datagram (or got none).
    pub lossy_groups: u64,
    /// The first few of those, as `(group index, lost)`.
    pub lossy: Vec<(u32, u64)>,
    /// Datagrams lost by the excluded groups.
    pub excluded_lost: u64,
    /// Groups (not excluded) that delivered anything at all.
    pub groups_seen: u64,
    pub duplicates: u64,
    pub reordered: u64,
}

/// How many lossy groups a summary names.
pub const NAMED_LOSSY: usize = 20;

/// Loss per group of `streams`, each group expected to deliver
/// `per_group` datagrams; groups in `exclude` (e.g. a flow a reload
/// changed) are counted apart.
pub fn summarize(streams: &Streams, groups: u32, per_group: u64, exclude: &[u32]) -> Summary {
    let mut s = Summary::default();
    for g in 0..groups {
        let (unique, dup, reord) = streams
            .streams
            .get(&g)
            .map_or((0, 0, 0), |t| (t.unique(), t.duplicates, t.reordered));
        let lost = per_group.saturating_sub(unique);
        if exclude.contains(&g) {
            s.excluded_lost += lost;
            continue;
        }
        s.duplicates += dup;
        s.reordered += reord;
        s.groups_seen += u64::from(unique > 0);
        if lost > 0 {
            s.lost += lost;
            s.lossy_groups += 1;
            if s.lossy.len() < NAMED_LOSSY {
                s.lossy.push((g, lost));
            }
        }
    }
    s
}

/// A datagram addressed to group `g` of the range at `first`:port.
pub fn destination(first: SocketAddrV4, g: u32) -> Option<SocketAddr> {
    group(*first.ip(), g).map(|ip| SocketAddr::new(IpAddr::V4(ip), first.port()))
}

/// One unconnected sender bound to `source` (the sender namespace's
/// address), multicast out of the interface that has it; `multicast_loop`
/// loops it back to this host too (loopback tests).
pub fn sender(source: Ipv4Addr, ttl: u32, multicast_loop: bool) -> std::io::Result<UdpSocket> {
    let s = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    s.bind(&SocketAddr::new(IpAddr::V4(source), 0).into())?;
    // Best effort: a bigger buffer only smooths bursts.
    let _ = s.set_send_buffer_size(4 << 20);
    s.set_multicast_if_v4(&source)?;
    s.set_multicast_ttl_v4(ttl)?;
    s.set_multicast_loop_v4(multicast_loop)?;
    Ok(s.into())
}

/// A receiver of `groups` groups from `first` on `port`: the socket to
/// read, and the one holding the memberships.
#[derive(Debug)]
pub struct Receiver {
    /// Bound to the port on any address, `IP_MULTICAST_ALL` on and no
    /// membership of its own: it takes every group joined on this host.
    pub socket: UdpSocket,
    /// Never bound: it only joins the groups. The kernel walks the
    /// membership list of every socket bound to a datagram's port for each
    /// datagram (`ip_mc_sf_allow`), so a thousand joins on the reading
    /// socket itself would cost the receiving CPU — on a veth, the relay's
    /// own — a thousand steps per datagram.
    pub joins: socket2::Socket,
}

/// [`Receiver`] of `groups` groups from `first` on `port`, joined on
/// interface `iface`. Each join counts against
/// `net.ipv4.igmp_max_memberships` (per socket): the error says so.
pub fn receiver(
    first: Ipv4Addr,
    groups: u32,
    port: u16,
    iface: crate::sock::Iface,
) -> std::io::Result<Receiver> {
    let (socket, _) = crate::sock::receiver(&crate::sock::ReceiverOptions {
        addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
        iface,
        source: None,
        control: false,
    })?;
    socket2::SockRef::from(&socket).set_multicast_all_v4(true)?;
    let joins = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    for g in 0..groups {
        let ip = group(first, g).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "group range overflows")
        })?;
        crate::sock::join(&joins, IpAddr::V4(ip), None, iface).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!(
                    "joining {ip} (group {g} of {groups}): {e}; one socket joins them all, so \
                     net.ipv4.igmp_max_memberships must be at least {groups}"
                ),
            )
        })?;
    }
    Ok(Receiver { socket, joins })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload;

    #[test]
    fn groups_count_up_from_the_first() {
        let first = Ipv4Addr::new(239, 10, 0, 1);
        assert_eq!(group(first, 0), Some(first));
        assert_eq!(group(first, 255), Some(Ipv4Addr::new(239, 10, 1, 0)));
        assert_eq!(group(first, 999), Some(Ipv4Addr::new(239, 10, 3, 232)));
        assert_eq!(group(Ipv4Addr::BROADCAST, 1), None);
    }

    #[test]
    fn round_robin_gives_every_group_the_same_count() {
        let mut per = [0u64; 7];
        for n in 0..70 {
            let (g, seq) = slot(n, 7);
            assert_eq!(seq, per[g as usize], "sequences count up per group");
            per[g as usize] += 1;
        }
        assert_eq!(per, [10; 7]);
        assert_eq!(slot(5, 0), (0, 5), "no groups: one");
    }

    fn datagram(stream: u32, seq: u64) -> Vec<u8> {
        let mut b = vec![0u8; 64];
        payload::write(&mut b, 1, stream, seq);
        b
    }

    #[test]
    fn summary_names_lossy_groups_and_sets_excluded_apart() {
        let mut s = Streams::new(1 << 16);
        // Group 0 complete, group 1 misses seq 2, group 2 silent, group 3
        // (excluded) misses everything after 0; a duplicate on group 0.
        for seq in 0..4 {
            s.on_datagram(&datagram(0, seq), 1).expect("valid");
            if seq != 2 {
                s.on_datagram(&datagram(1, seq), 1).expect("valid");
            }
        }
        s.on_datagram(&datagram(0, 3), 1).expect("valid");
        s.on_datagram(&datagram(3, 0), 1).expect("valid");
        let sum = summarize(&s, 4, 4, &[3]);
        assert_eq!(
            sum,
            Summary {
                lost: 5,
                lossy_groups: 2,
                lossy: vec![(1, 1), (2, 4)],
                excluded_lost: 3,
                groups_seen: 2,
                duplicates: 1,
                reordered: 0,
            }
        );
    }
}
