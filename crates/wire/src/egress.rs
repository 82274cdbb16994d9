//! Frames for `egress = "xdp"`: the prebuilt Ethernet + IPv4 + UDP header
//! of one IPv4 output (a [`Template`], built once when the output is
//! placed; its destination MAC is the group's for a multicast output, the
//! next hop's, from the neighbour table, for a unicast one), and the three fields that change per datagram,
//! filled by [`Template::fill`]: the IP total length, the IP header
//! checksum and the UDP length. The UDP checksum is 0 ("not computed",
//! allowed for IPv4 by RFC 768). A frame is the filled header followed by
//! the payload ([`Template::write_frame`]), written into an AF_XDP UMEM
//! frame and sent on the socket's TX ring: it skips the kernel's UDP/IP
//! output path and the qdisc.
//!
//! (First written for issue 19's AF_PACKET egress lever;
//! `experiments/packet-tx` uses this one.)
//!
//! Pure and allocation-free: a fill is a 42-byte copy, two length stores
//! and a 20-byte checksum.

use std::net::Ipv4Addr;

use crate::checksum::ipv4_header_checksum;

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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoints {
    /// The output interface's MAC address.
    pub source_mac: [u8; 6],
    /// The source address (the output socket's, as routing chose it).
    pub source: Ipv4Addr,
    /// The source port (the output socket's).
    pub source_port: u16,
    /// The destination address: a multicast group or a unicast host.
    pub destination: Ipv4Addr,
    /// The destination MAC: for a group its [`multicast_mac`], for a
    /// unicast host its next hop's (the host's, or its gateway's).
    pub destination_mac: [u8; 6],
    /// The destination port.
    pub port: u16,
    /// IP TTL.
    pub ttl: u8,
}

impl Template {
    /// The headers to `e.destination:e.port` (at `e.destination_mac`) from
    /// `e.source:e.source_port`.
    pub fn new(e: &Endpoints) -> Self {
        let mut b = [0u8; HEADER_LEN];
        b[0..6].copy_from_slice(&e.destination_mac);
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
        ip[16..20].copy_from_slice(&e.destination.octets());
        let udp = &mut b[ETH_LEN + IP_LEN..];
        udp[0..2].copy_from_slice(&e.source_port.to_be_bytes());
        udp[2..4].copy_from_slice(&e.port.to_be_bytes());
        // [4..6] length per datagram, [6..8] checksum 0.
        Self { bytes: b }
    }

    /// The destination MAC the frames carry.
    pub fn destination_mac(&self) -> [u8; 6] {
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&self.bytes[0..6]);
        mac
    }

    /// Send to `mac` from now on (a unicast next hop that changed its
    /// address).
    pub fn set_destination_mac(&mut self, mac: [u8; 6]) {
        self.bytes[0..6].copy_from_slice(&mac);
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

    /// Write the whole frame (headers, then `payload`) at the start of
    /// `out`; its length, or `None` when it doesn't fit `out` (or an IPv4
    /// total length).
    pub fn write_frame(&self, out: &mut [u8], payload: &[u8]) -> Option<usize> {
        let len = HEADER_LEN.checked_add(payload.len())?;
        let (head, rest) = out.get_mut(..len)?.split_first_chunk_mut::<HEADER_LEN>()?;
        self.fill(head, payload.len())?;
        rest.copy_from_slice(payload);
        Some(len)
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::{FlowMatch, parse};

    const SOURCE: Ipv4Addr = Ipv4Addr::new(10, 20, 1, 1);
    const GROUP: Ipv4Addr = Ipv4Addr::new(239, 129, 2, 3);

    fn template(ttl: u8) -> Template {
        Template::new(&Endpoints {
            source_mac: [2, 0, 0, 0, 0, 1],
            source: SOURCE,
            source_port: 4000,
            destination: GROUP,
            destination_mac: multicast_mac(GROUP),
            port: 5000,
            ttl,
        })
    }

    #[test]
    fn a_changed_destination_mac_is_in_the_next_frame() {
        let mut t = template(1);
        assert_eq!(t.destination_mac(), multicast_mac(GROUP));
        t.set_destination_mac([2, 0, 0, 0, 0, 7]);
        let mut out = [0u8; 100];
        let n = t.write_frame(&mut out, &[1, 2, 3]).expect("fits");
        assert_eq!(out[..6], [2, 0, 0, 0, 0, 7]);
        assert_eq!(out[6..12], [2, 0, 0, 0, 0, 1], "source MAC kept");
        assert_eq!(n, HEADER_LEN + 3);
    }

    #[test]
    fn group_mac_keeps_the_low_23_bits() {
        assert_eq!(multicast_mac(GROUP), [0x01, 0x00, 0x5e, 0x01, 0x02, 0x03]);
    }

    #[test]
    fn filled_header_has_lengths_and_a_verifying_checksum() {
        let t = template(7);
        let mut h = [0u8; HEADER_LEN];
        t.fill(&mut h, 1316).expect("fits");
        assert_eq!(&h[12..14], &[0x08, 0x00]);
        assert_eq!(u16::from_be_bytes([h[16], h[17]]), 1316 + 28);
        assert_eq!(h[22], 7);
        assert_eq!(u16::from_be_bytes([h[38], h[39]]), 1316 + 8);
        assert_eq!(&h[40..42], &[0, 0]);
        assert!(crate::checksum::ipv4_header_ok(&h[14..34]));
        assert!(t.fill(&mut h, 65_600).is_none());
    }

    #[test]
    fn a_written_frame_parses_as_the_flows_datagram() {
        let t = template(1);
        let mut out = vec![0u8; 2048];
        for len in [0, 1, 1316, 2048 - HEADER_LEN] {
            let payload: Vec<u8> = (0..len)
                .map(|i| u8::try_from(i % 251).unwrap_or(0))
                .collect();
            let n = t.write_frame(&mut out, &payload).expect("fits");
            assert_eq!(n, HEADER_LEN + len);
            let flow = FlowMatch {
                destination: IpAddr::V4(GROUP),
                port: 5000,
                source: Some(IpAddr::V4(SOURCE)),
            };
            // Checksums verified: the IP header's, and UDP's 0 accepted.
            let d = parse(&out[..n], &flow, true).expect("parses");
            assert_eq!(&out[d.payload], &payload[..]);
            assert_eq!(d.source, IpAddr::V4(SOURCE));
            assert_eq!(out[..6], multicast_mac(GROUP));
            assert_eq!(out[6..12], [2, 0, 0, 0, 0, 1]);
        }
        assert!(
            t.write_frame(&mut out, &[0; 2048 - HEADER_LEN + 1])
                .is_none(),
            "a frame longer than the buffer is refused"
        );
    }
}
