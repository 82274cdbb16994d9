//! The prebuilt Ethernet + IPv4 + UDP header of one multicast destination
//! (a template), and the three fields that change per datagram: the IP
//! total length, the IP header checksum and the UDP length. The UDP
//! checksum is 0 ("not computed", allowed for IPv4 by RFC 768).

use std::net::Ipv4Addr;

/// Ethernet (14) + IPv4 without options (20) + UDP (8).
pub const HEADER_LEN: usize = 42;
const ETH_LEN: usize = 14;
const IP_LEN: usize = 20;
const UDP_LEN: usize = 8;

/// The multicast MAC address of an IPv4 group: 01:00:5e followed by the
/// low 23 bits of the group (RFC 1112).
pub fn multicast_mac(group: Ipv4Addr) -> [u8; 6] {
    let o = group.octets();
    [0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]]
}

/// One destination's headers, with zero lengths and checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Template {
    bytes: [u8; HEADER_LEN],
}

/// Where the addresses and ports of a template come from.
#[derive(Debug, Clone, Copy)]
pub struct Endpoints {
    pub source_mac: [u8; 6],
    pub source: Ipv4Addr,
    pub source_port: u16,
    pub group: Ipv4Addr,
    pub port: u16,
    pub ttl: u8,
}

impl Template {
    pub fn new(e: &Endpoints) -> Self {
        let mut b = [0u8; HEADER_LEN];
        b[0..6].copy_from_slice(&multicast_mac(e.group));
        b[6..12].copy_from_slice(&e.source_mac);
        b[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        let ip = &mut b[ETH_LEN..ETH_LEN + IP_LEN];
        ip[0] = 0x45; // version 4, 5 words
        // [1] DSCP/ECN 0, [2..4] total length per datagram, [4..6] id 0:
        // the datagram is atomic (DF set, RFC 6864).
        ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes());
        ip[8] = e.ttl;
        ip[9] = 17; // UDP
        // [10..12] checksum per datagram.
        ip[12..16].copy_from_slice(&e.source.octets());
        ip[16..20].copy_from_slice(&e.group.octets());
        let udp = &mut b[ETH_LEN + IP_LEN..];
        udp[0..2].copy_from_slice(&e.source_port.to_be_bytes());
        udp[2..4].copy_from_slice(&e.port.to_be_bytes());
        // [4..6] length per datagram, [6..8] checksum 0.
        Self { bytes: b }
    }

    /// Write the headers for a `payload_len`-byte UDP payload into `out`;
    /// `None` if the datagram would not fit an IPv4 total length.
    pub fn fill(&self, out: &mut [u8; HEADER_LEN], payload_len: usize) -> Option<()> {
        let udp_len = u16::try_from(payload_len + UDP_LEN).ok()?;
        let total = u16::try_from(payload_len + UDP_LEN + IP_LEN).ok()?;
        *out = self.bytes;
        out[ETH_LEN + 2..ETH_LEN + 4].copy_from_slice(&total.to_be_bytes());
        let sum = ipv4_checksum(&out[ETH_LEN..ETH_LEN + IP_LEN]);
        out[ETH_LEN + 10..ETH_LEN + 12].copy_from_slice(&sum.to_be_bytes());
        out[ETH_LEN + IP_LEN + 4..ETH_LEN + IP_LEN + 6].copy_from_slice(&udp_len.to_be_bytes());
        Some(())
    }
}

/// The Internet checksum (RFC 1071) of an IPv4 header whose checksum
/// field is zero.
pub fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !u16::try_from(sum).unwrap_or(0xffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_mac_keeps_the_low_23_bits() {
        assert_eq!(
            multicast_mac(Ipv4Addr::new(239, 129, 2, 3)),
            [0x01, 0x00, 0x5e, 0x01, 0x02, 0x03]
        );
    }

    #[test]
    fn checksum_matches_a_known_header() {
        // The worked example of RFC 1071's successors (Wikipedia's IPv4
        // header checksum example): checksum 0xb861.
        let h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(ipv4_checksum(&h), 0xb861);
    }

    #[test]
    fn filled_header_has_lengths_and_a_verifying_checksum() {
        let t = Template::new(&Endpoints {
            source_mac: [2, 0, 0, 0, 0, 1],
            source: Ipv4Addr::new(10, 20, 1, 1),
            source_port: 4000,
            group: Ipv4Addr::new(239, 1, 1, 1),
            port: 5000,
            ttl: 7,
        });
        let mut h = [0u8; HEADER_LEN];
        t.fill(&mut h, 1316).unwrap();
        assert_eq!(&h[12..14], &[0x08, 0x00]);
        assert_eq!(u16::from_be_bytes([h[16], h[17]]), 1316 + 28);
        assert_eq!(h[22], 7);
        assert_eq!(u16::from_be_bytes([h[38], h[39]]), 1316 + 8);
        assert_eq!(&h[40..42], &[0, 0]);
        // A header with its checksum in place sums to 0xffff.
        assert_eq!(ipv4_checksum(&h[14..34]), 0);
        assert!(t.fill(&mut h, 65_600).is_none());
    }
}
