//! Headers for AF_PACKET egress (issue 19's egress lever): the prebuilt
//! Ethernet + IPv4 + UDP header of one IPv4 multicast destination (a
//! [`Template`]), and the three fields
//! that change per datagram, filled by [`Template::fill`]: the IP total
//! length, the IP header checksum and the UDP length. The UDP checksum is
//! 0 ("not computed", allowed for IPv4 by RFC 768). A frame is the filled
//! header followed by the payload, handed to an `AF_PACKET` socket bound
//! to the output interface; it skips the kernel's UDP/IP output path.
//!
//! Pure and allocation-free: a fill is a 42-byte copy, two length stores
//! and a 20-byte checksum.

use std::net::Ipv4Addr;

use mcrelay_wire::checksum::ipv4_header_checksum;

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
        let sum = ipv4_header_checksum(&out[ETH_LEN..ETH_LEN + IP_LEN]);
        out[ETH_LEN + 10..ETH_LEN + 12].copy_from_slice(&sum.to_be_bytes());
        out[ETH_LEN + IP_LEN + 4..ETH_LEN + IP_LEN + 6].copy_from_slice(&udp_len.to_be_bytes());
        Some(())
    }
}

impl Template {
    /// [`Template::fill`] for a frame whose UDP checksum the kernel
    /// finishes (`CHECKSUM_PARTIAL`, e.g. per segment of a GSO frame): the
    /// checksum field holds the folded pseudo-header sum (addresses,
    /// protocol, UDP length), not complemented.
    pub fn fill_partial_checksum(
        &self,
        out: &mut [u8; HEADER_LEN],
        payload_len: usize,
    ) -> Option<()> {
        self.fill(out, payload_len)?;
        let udp_len = u32::try_from(payload_len + UDP_LEN).ok()?;
        let mut sum: u32 = 17 + udp_len;
        for w in out[ETH_LEN + 12..ETH_LEN + 20].chunks_exact(2) {
            sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        let sum = u16::try_from(sum).ok()?;
        out[ETH_LEN + IP_LEN + 6..].copy_from_slice(&sum.to_be_bytes());
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use mcrelay_wire::{FlowMatch, parse};

    const SOURCE: Ipv4Addr = Ipv4Addr::new(10, 20, 1, 1);
    const GROUP: Ipv4Addr = Ipv4Addr::new(239, 1, 1, 1);

    fn template(ttl: u8) -> Template {
        Template::new(&Endpoints {
            source_mac: [2, 0, 0, 0, 0, 1],
            source: SOURCE,
            source_port: 4000,
            group: GROUP,
            port: 5000,
            ttl,
        })
    }

    #[test]
    fn group_mac_keeps_the_low_23_bits() {
        assert_eq!(
            multicast_mac(Ipv4Addr::new(239, 129, 2, 3)),
            [0x01, 0x00, 0x5e, 0x01, 0x02, 0x03]
        );
    }

    #[test]
    fn filled_header_has_lengths_and_a_verifying_checksum() {
        let t = template(7);
        let mut h = [0u8; HEADER_LEN];
        t.fill(&mut h, 1316).unwrap();
        assert_eq!(&h[12..14], &[0x08, 0x00]);
        assert_eq!(u16::from_be_bytes([h[16], h[17]]), 1316 + 28);
        assert_eq!(h[22], 7);
        assert_eq!(u16::from_be_bytes([h[38], h[39]]), 1316 + 8);
        assert_eq!(&h[40..42], &[0, 0]);
        assert!(mcrelay_wire::checksum::ipv4_header_ok(&h[14..34]));
        assert!(t.fill(&mut h, 65_600).is_none());
    }

    #[test]
    fn a_partial_checksum_completes_to_a_verifying_one() {
        let (source, group, t) = (SOURCE, GROUP, template(1));
        let payload = [7u8; 101];
        let mut h = [0u8; HEADER_LEN];
        t.fill_partial_checksum(&mut h, payload.len()).unwrap();
        // What the kernel does for CHECKSUM_PARTIAL: sum the UDP header
        // (with the partial sum in its checksum field) and payload, store
        // the complement.
        let mut datagram = h[34..].to_vec();
        datagram.extend_from_slice(&payload);
        let mut sum: u32 = datagram
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        let c = !u16::try_from(sum).unwrap();
        datagram[6..8].copy_from_slice(&c.to_be_bytes());
        assert!(mcrelay_wire::checksum::udp_ok(
            IpAddr::V4(source),
            IpAddr::V4(group),
            &datagram
        ));
    }

    #[test]
    fn a_filled_frame_parses_as_the_flows_datagram() {
        let (source, group, t) = (SOURCE, GROUP, template(1));
        for len in [0, 1, 1316, 8972] {
            let mut frame = vec![0u8; HEADER_LEN + len];
            let mut h = [0u8; HEADER_LEN];
            t.fill(&mut h, len).unwrap();
            frame[..HEADER_LEN].copy_from_slice(&h);
            for (i, b) in frame[HEADER_LEN..].iter_mut().enumerate() {
                *b = u8::try_from(i % 251).unwrap();
            }
            let flow = FlowMatch {
                destination: IpAddr::V4(group),
                port: 5000,
                source: Some(IpAddr::V4(source)),
            };
            // Checksums verified: the IP header's, and UDP's 0 accepted.
            let d = parse(&frame, &flow, true).unwrap();
            assert_eq!(d.payload, HEADER_LEN..HEADER_LEN + len);
            assert_eq!(d.source, IpAddr::V4(source));
            // The group's MAC (01:00:5e + 23 bits) is the destination.
            assert_eq!(frame[..6], multicast_mac(group));
        }
    }
}
