//! One captured frame → the UDP payload it carries for a flow, or the reason
//! it carries none. Every field is read through [`Bytes`], which checks the
//! length before each access, so no input can make this panic; lengths the
//! headers claim are checked against the bytes actually captured.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ops::Range;

use crate::checksum;

/// Ethertypes.
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
/// VLAN tags looked through in a frame (802.1ad outer plus 802.1Q inner).
pub const MAX_VLAN_TAGS: usize = 2;
/// IPv6 extension headers walked before giving up on reaching UDP.
pub const MAX_IPV6_EXTENSIONS: usize = 8;

const IPPROTO_HOPOPTS: u8 = 0;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_ROUTING: u8 = 43;
const IPPROTO_FRAGMENT: u8 = 44;
const IPPROTO_AH: u8 = 51;
const IPPROTO_DSTOPTS: u8 = 60;

/// Which datagrams a flow takes: the filter the kernel ran, checked again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowMatch {
    /// Destination address (the group, or a unicast address of the host).
    pub destination: IpAddr,
    /// Destination UDP port.
    pub port: u16,
    /// Required source address (SSM), if any.
    pub source: Option<IpAddr>,
}

/// A frame that carries a datagram for the flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    /// Where the UDP payload lies in the frame (may be empty).
    pub payload: Range<usize>,
    /// The sender's address.
    pub source: IpAddr,
    /// VLAN tags found in the frame itself (tags the NIC or kernel
    /// stripped are not counted).
    pub vlan_tags: usize,
}

/// Why a frame carries nothing to relay. Each is a counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reject {
    /// Shorter than its headers say, or than any header needs.
    Truncated,
    /// Headers that contradict themselves: IPv4 IHL < 5, a version that
    /// doesn't match the ethertype, a UDP length below 8, an IPv6
    /// extension chain longer than [`MAX_IPV6_EXTENSIONS`], more than
    /// [`MAX_VLAN_TAGS`] VLAN tags.
    Malformed,
    /// An IP fragment: fragments are not reassembled.
    Fragment,
    /// A UDP or IPv4 header checksum that doesn't match.
    BadChecksum,
    /// Not IP, not UDP, or not this flow's destination, port or source.
    NotThisFlow,
}

impl Reject {
    /// Every reason, for tables of counters.
    pub const ALL: [Reject; 5] = [
        Reject::Truncated,
        Reject::Malformed,
        Reject::Fragment,
        Reject::BadChecksum,
        Reject::NotThisFlow,
    ];

    /// The reason's name in counters and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Reject::Truncated => "truncated",
            Reject::Malformed => "malformed",
            Reject::Fragment => "fragment",
            Reject::BadChecksum => "bad_checksum",
            Reject::NotThisFlow => "not_this_flow",
        }
    }
}

/// Bounds-checked big-endian reads from a byte slice.
#[derive(Debug, Clone, Copy)]
struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    fn u8(self, at: usize) -> Result<u8, Reject> {
        self.0.get(at).copied().ok_or(Reject::Truncated)
    }

    fn u16(self, at: usize) -> Result<u16, Reject> {
        let b = self.slice(at, 2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn slice(self, at: usize, len: usize) -> Result<&'a [u8], Reject> {
        let end = at.checked_add(len).ok_or(Reject::Truncated)?;
        self.0.get(at..end).ok_or(Reject::Truncated)
    }

    fn array<const N: usize>(self, at: usize) -> Result<[u8; N], Reject> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.slice(at, N)?);
        Ok(out)
    }
}

/// Parse an Ethernet frame (as an AF_PACKET `SOCK_RAW` socket delivers it)
/// for `flow`. `verify_checksums`: check the UDP checksum (false when the
/// kernel says it was already verified, or is not filled in yet because the
/// frame came from this host's own stack over a virtual link).
pub fn parse(frame: &[u8], flow: &FlowMatch, verify_checksums: bool) -> Result<Datagram, Reject> {
    let bytes = Bytes(frame);
    let mut ethertype = bytes.u16(12)?;
    let mut l3 = 14;
    let mut vlan_tags = 0;
    while ethertype == ETH_P_8021Q || ethertype == ETH_P_8021AD {
        if vlan_tags == MAX_VLAN_TAGS {
            return Err(Reject::Malformed);
        }
        ethertype = bytes.u16(l3 + 2)?;
        l3 += 4;
        vlan_tags += 1;
    }
    let packet = Bytes(frame.get(l3..).ok_or(Reject::Truncated)?);
    let (source, udp_start, ip_payload_end) = match (ethertype, flow.destination) {
        (ETH_P_IP, IpAddr::V4(group)) => ipv4(packet, group, flow.source)?,
        (ETH_P_IPV6, IpAddr::V6(group)) => ipv6(packet, group, flow.source)?,
        _ => return Err(Reject::NotThisFlow),
    };
    let udp = Bytes(
        packet
            .0
            .get(udp_start..ip_payload_end)
            .ok_or(Reject::Truncated)?,
    );
    let udp_len = usize::from(udp.u16(4)?);
    if udp_len < 8 {
        return Err(Reject::Malformed);
    }
    if udp_len > udp.0.len() {
        return Err(Reject::Truncated);
    }
    if udp.u16(2)? != flow.port {
        return Err(Reject::NotThisFlow);
    }
    let checksum = udp.u16(6)?;
    let datagram = udp.slice(0, udp_len)?;
    let must_verify = match source {
        // Zero means "no checksum" in IPv4 only; IPv6 requires one.
        IpAddr::V4(_) => checksum != 0,
        IpAddr::V6(_) => true,
    };
    if verify_checksums && must_verify && !checksum::udp_ok(source, flow.destination, datagram) {
        return Err(Reject::BadChecksum);
    }
    let start = l3 + udp_start + 8;
    Ok(Datagram {
        payload: start..l3 + udp_start + udp_len,
        source,
        vlan_tags,
    })
}

/// Checks an IPv4 header; returns the source, where UDP starts and where
/// the IP payload ends (the total length: Ethernet may pad short frames).
fn ipv4(
    packet: Bytes<'_>,
    group: Ipv4Addr,
    source: Option<IpAddr>,
) -> Result<(IpAddr, usize, usize), Reject> {
    let first = packet.u8(0)?;
    let header_len = usize::from(first & 0x0f) * 4;
    if first >> 4 != 4 || header_len < 20 {
        return Err(Reject::Malformed);
    }
    let header = packet.slice(0, header_len)?;
    let total = usize::from(packet.u16(2)?);
    if total < header_len {
        return Err(Reject::Malformed);
    }
    if total > packet.0.len() {
        return Err(Reject::Truncated);
    }
    if !checksum::ipv4_header_ok(header) {
        return Err(Reject::BadChecksum);
    }
    let from = IpAddr::V4(Ipv4Addr::from(packet.array::<4>(12)?));
    let to = Ipv4Addr::from(packet.array::<4>(16)?);
    if to != group || source.is_some_and(|s| s != from) {
        return Err(Reject::NotThisFlow);
    }
    // More-fragments flag or a fragment offset: part of a fragmented datagram.
    if packet.u16(6)? & 0x3fff != 0 {
        return Err(Reject::Fragment);
    }
    if packet.u8(9)? != IPPROTO_UDP {
        return Err(Reject::NotThisFlow);
    }
    Ok((from, header_len, total))
}

/// Checks an IPv6 header and walks its extension headers to UDP.
fn ipv6(
    packet: Bytes<'_>,
    group: Ipv6Addr,
    source: Option<IpAddr>,
) -> Result<(IpAddr, usize, usize), Reject> {
    if packet.u8(0)? >> 4 != 6 {
        return Err(Reject::Malformed);
    }
    let payload_len = usize::from(packet.u16(4)?);
    let end = 40 + payload_len;
    if end > packet.0.len() {
        return Err(Reject::Truncated);
    }
    let from = IpAddr::V6(Ipv6Addr::from(packet.array::<16>(8)?));
    let to = Ipv6Addr::from(packet.array::<16>(24)?);
    if to != group || source.is_some_and(|s| s != from) {
        return Err(Reject::NotThisFlow);
    }
    let mut next = packet.u8(6)?;
    let mut at = 40;
    for _ in 0..=MAX_IPV6_EXTENSIONS {
        let len = match next {
            IPPROTO_UDP => return Ok((from, at, end)),
            IPPROTO_FRAGMENT => return Err(Reject::Fragment),
            IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS => {
                (usize::from(packet.u8(at + 1)?) + 1) * 8
            }
            IPPROTO_AH => (usize::from(packet.u8(at + 1)?) + 2) * 4,
            _ => return Err(Reject::NotThisFlow),
        };
        next = packet.u8(at)?;
        at += len;
        if at > end {
            return Err(Reject::Truncated);
        }
    }
    Err(Reject::Malformed)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::testframes::{ipv4_udp, ipv6_udp, vlan};

    pub(crate) fn v4_flow() -> FlowMatch {
        FlowMatch {
            destination: "239.1.1.1".parse().unwrap(),
            port: 5000,
            source: None,
        }
    }

    pub(crate) fn v6_flow() -> FlowMatch {
        FlowMatch {
            destination: "ff3e::1:1".parse().unwrap(),
            port: 5000,
            source: None,
        }
    }

    #[test]
    fn ipv4_payload_is_found_byte_exact() {
        let f = ipv4_udp("10.0.0.1", "239.1.1.1", 5000, b"hello");
        let d = parse(&f, &v4_flow(), true).unwrap();
        assert_eq!(&f[d.payload.clone()], b"hello");
        assert_eq!(d.source, "10.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(d.vlan_tags, 0);
    }

    #[test]
    fn zero_length_payload_is_a_datagram() {
        let f = ipv4_udp("10.0.0.1", "239.1.1.1", 5000, b"");
        let d = parse(&f, &v4_flow(), true).unwrap();
        assert!(d.payload.is_empty());
        let f = ipv6_udp("fd01::1", "ff3e::1:1", 5000, &[], b"");
        assert!(parse(&f, &v6_flow(), true).unwrap().payload.is_empty());
    }

    #[test]
    fn ethernet_padding_after_a_short_packet_is_ignored() {
        let mut f = ipv4_udp("10.0.0.1", "239.1.1.1", 5000, b"x");
        f.resize(60, 0);
        let d = parse(&f, &v4_flow(), true).unwrap();
        assert_eq!(&f[d.payload], b"x");
    }

    #[test]
    fn vlan_tags_are_looked_through() {
        let f = vlan(
            &ipv4_udp("10.0.0.1", "239.1.1.1", 5000, b"tagged"),
            &[(0x8100, 100)],
        );
        let d = parse(&f, &v4_flow(), true).unwrap();
        assert_eq!(&f[d.payload.clone()], b"tagged");
        assert_eq!(d.vlan_tags, 1);
        let qinq = vlan(
            &ipv4_udp("10.0.0.1", "239.1.1.1", 5000, b"qinq"),
            &[(0x88a8, 10), (0x8100, 20)],
        );
        let d = parse(&qinq, &v4_flow(), true).unwrap();
        assert_eq!((&qinq[d.payload.clone()], d.vlan_tags), (&b"qinq"[..], 2));
        let three = vlan(
            &ipv4_udp("10.0.0.1", "239.1.1.1", 5000, b"x"),
            &[(0x88a8, 1), (0x8100, 2), (0x8100, 3)],
        );
        assert_eq!(parse(&three, &v4_flow(), true), Err(Reject::Malformed));
    }

    #[test]
    fn truncated_frames_at_every_length_are_rejected_without_panicking() {
        let f = ipv4_udp("10.0.0.1", "239.1.1.1", 5000, b"payload");
        for cut in 0..f.len() {
            assert_eq!(
                parse(&f[..cut], &v4_flow(), true),
                Err(Reject::Truncated),
                "cut {cut}"
            );
        }
        let f = ipv6_udp("fd01::1", "ff3e::1:1", 5000, &[(0, 8)], b"payload");
        for cut in 0..f.len() {
            assert_eq!(
                parse(&f[..cut], &v6_flow(), true),
                Err(Reject::Truncated),
                "cut {cut}"
            );
        }
    }

    #[test]
    fn udp_length_larger_than_the_frame_is_truncated() {
        let mut f = ipv4_udp("10.0.0.1", "239.1.1.1", 5000, b"abcd");
        let udp = 14 + 20;
        f[udp + 4..udp + 6].copy_from_slice(&100u16.to_be_bytes());
        assert_eq!(parse(&f, &v4_flow(), false), Err(Reject::Truncated));
        f[udp + 4..udp + 6].copy_from_slice(&7u16.to_be_bytes());
        assert_eq!(parse(&f, &v4_flow(), false), Err(Reject::Malformed));
    }

    #[test]
    fn ipv4_ihl_below_five_is_malformed() {
        let mut f = ipv4_udp("10.0.0.1", "239.1.1.1", 5000, b"abcd");
        f[14] = 0x44;
        assert_eq!(parse(&f, &v4_flow(), true), Err(Reject::Malformed));
        f[14] = 0x65; // version 6 behind an IPv4 ethertype
        assert_eq!(parse(&f, &v4_flow(), true), Err(Reject::Malformed));
    }

    #[test]
    fn ipv4_options_are_skipped() {
        let f = crate::testframes::ipv4_udp_with_options("10.0.0.1", "239.1.1.1", 5000, b"opt", 2);
        let d = parse(&f, &v4_flow(), true).unwrap();
        assert_eq!(&f[d.payload], b"opt");
    }

    #[test]
    fn fragments_are_rejected_as_such() {
        let mut f = ipv4_udp("10.0.0.1", "239.1.1.1", 5000, b"abcd");
        f[14 + 6] = 0x20; // more fragments
        crate::testframes::fix_ipv4_checksum(&mut f, 14);
        assert_eq!(parse(&f, &v4_flow(), true), Err(Reject::Fragment));
        let f = ipv6_udp("fd01::1", "ff3e::1:1", 5000, &[(44, 8)], b"frag");
        assert_eq!(parse(&f, &v6_flow(), true), Err(Reject::Fragment));
    }

    #[test]
    fn bad_checksums_are_rejected_unless_already_verified() {
        let mut f = ipv4_udp("10.0.0.1", "239.1.1.1", 5000, b"abcd");
        let last = f.len() - 1;
        f[last] ^= 0xff;
        assert_eq!(parse(&f, &v4_flow(), true), Err(Reject::BadChecksum));
        assert!(
            parse(&f, &v4_flow(), false).is_ok(),
            "the kernel vouched for it"
        );
        // A zero UDP checksum means none in IPv4...
        f[14 + 20 + 6..14 + 20 + 8].fill(0);
        assert!(parse(&f, &v4_flow(), true).is_ok());
        // ...but not in IPv6.
        let mut f = ipv6_udp("fd01::1", "ff3e::1:1", 5000, &[], b"abcd");
        f[14 + 40 + 6..14 + 40 + 8].fill(0);
        assert_eq!(parse(&f, &v6_flow(), true), Err(Reject::BadChecksum));
        // The IPv4 header checksum is always checked.
        let mut f = ipv4_udp("10.0.0.1", "239.1.1.1", 5000, b"abcd");
        f[14 + 8] = 1; // TTL changed, header checksum not
        assert_eq!(parse(&f, &v4_flow(), false), Err(Reject::BadChecksum));
    }

    #[test]
    fn other_destinations_ports_sources_and_protocols_are_not_this_flow() {
        let f = ipv4_udp("10.0.0.1", "239.1.1.2", 5000, b"x");
        assert_eq!(parse(&f, &v4_flow(), true), Err(Reject::NotThisFlow));
        let f = ipv4_udp("10.0.0.1", "239.1.1.1", 5001, b"x");
        assert_eq!(parse(&f, &v4_flow(), true), Err(Reject::NotThisFlow));
        let ssm = FlowMatch {
            source: Some("10.0.0.9".parse().unwrap()),
            ..v4_flow()
        };
        let f = ipv4_udp("10.0.0.1", "239.1.1.1", 5000, b"x");
        assert_eq!(parse(&f, &ssm, true), Err(Reject::NotThisFlow));
        let f = ipv6_udp("fd01::1", "ff3e::1:1", 5000, &[], b"x");
        assert_eq!(
            parse(&f, &v4_flow(), true),
            Err(Reject::NotThisFlow),
            "v6 frame, v4 flow"
        );
        let mut f = ipv4_udp("10.0.0.1", "239.1.1.1", 5000, b"x");
        f[14 + 9] = 6; // TCP
        crate::testframes::fix_ipv4_checksum(&mut f, 14);
        assert_eq!(parse(&f, &v4_flow(), true), Err(Reject::NotThisFlow));
        let mut f = ipv4_udp("10.0.0.1", "239.1.1.1", 5000, b"x");
        f[12..14].copy_from_slice(&0x0806u16.to_be_bytes()); // ARP
        assert_eq!(parse(&f, &v4_flow(), true), Err(Reject::NotThisFlow));
    }

    #[test]
    fn ipv6_extension_headers_are_walked_to_udp() {
        let f = ipv6_udp(
            "fd01::1",
            "ff3e::1:1",
            5000,
            &[(0, 8), (60, 16), (43, 24)],
            b"ext",
        );
        let d = parse(&f, &v6_flow(), true).unwrap();
        assert_eq!(&f[d.payload], b"ext");
        let f = ipv6_udp("fd01::1", "ff3e::1:1", 5000, &[(51, 16)], b"ah");
        assert_eq!(&f[parse(&f, &v6_flow(), true).unwrap().payload], b"ah");
    }

    #[test]
    fn ipv6_extension_chains_that_run_past_the_frame_or_never_end() {
        let mut f = ipv6_udp("fd01::1", "ff3e::1:1", 5000, &[(0, 8)], b"x");
        f[14 + 40 + 1] = 200; // hop-by-hop claims 1608 bytes
        assert_eq!(parse(&f, &v6_flow(), true), Err(Reject::Truncated));
        let chain: Vec<(u8, usize)> = vec![(60, 8); MAX_IPV6_EXTENSIONS + 1];
        let f = ipv6_udp("fd01::1", "ff3e::1:1", 5000, &chain, b"x");
        assert_eq!(parse(&f, &v6_flow(), true), Err(Reject::Malformed));
        let mut f = ipv6_udp("fd01::1", "ff3e::1:1", 5000, &[], b"x");
        f[14 + 4..14 + 6].copy_from_slice(&1000u16.to_be_bytes());
        assert_eq!(parse(&f, &v6_flow(), true), Err(Reject::Truncated));
    }
}
