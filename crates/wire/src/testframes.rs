//! Builders of well-formed frames, for tests and experiments: compiled
//! only for this crate's tests or with the `test-support` feature, never
//! in the product build.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::checksum::{ipv4_header_checksum, udp_checksum};

const MAC_DST: [u8; 6] = [0x01, 0x00, 0x5e, 0x01, 0x01, 0x01];
const MAC_SRC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0x01];

fn udp(source: IpAddr, destination: IpAddr, port: u16, payload: &[u8]) -> Vec<u8> {
    let len = u16::try_from(8 + payload.len()).unwrap_or(u16::MAX);
    let mut d = Vec::with_capacity(8 + payload.len());
    d.extend_from_slice(&40000u16.to_be_bytes());
    d.extend_from_slice(&port.to_be_bytes());
    d.extend_from_slice(&len.to_be_bytes());
    d.extend_from_slice(&[0, 0]);
    d.extend_from_slice(payload);
    let c = udp_checksum(source, destination, &d);
    d[6..8].copy_from_slice(&c.to_be_bytes());
    d
}

fn ethernet(ethertype: u16) -> Vec<u8> {
    let mut f = Vec::with_capacity(1514);
    f.extend_from_slice(&MAC_DST);
    f.extend_from_slice(&MAC_SRC);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f
}

/// An Ethernet frame with an IPv4 UDP datagram from `source` to
/// `destination`:`port`.
pub fn ipv4_udp(source: &str, destination: &str, port: u16, payload: &[u8]) -> Vec<u8> {
    ipv4_udp_with_options(source, destination, port, payload, 0)
}

/// As [`ipv4_udp`], with `option_words` 4-byte words of IPv4 options (NOPs
/// ending in EOL).
pub fn ipv4_udp_with_options(
    source: &str,
    destination: &str,
    port: u16,
    payload: &[u8],
    option_words: u8,
) -> Vec<u8> {
    let s: Ipv4Addr = source.parse().expect("IPv4 source");
    let d: Ipv4Addr = destination.parse().expect("IPv4 destination");
    let datagram = udp(s.into(), d.into(), port, payload);
    let header_len = 20 + 4 * usize::from(option_words);
    let total = u16::try_from(header_len + datagram.len()).unwrap_or(u16::MAX);
    let mut f = ethernet(0x0800);
    f.push(0x40 | (5 + option_words));
    f.push(0);
    f.extend_from_slice(&total.to_be_bytes());
    f.extend_from_slice(&[0x12, 0x34, 0x40, 0x00, 64, 17, 0, 0]);
    f.extend_from_slice(&s.octets());
    f.extend_from_slice(&d.octets());
    let mut options = vec![1u8; 4 * usize::from(option_words)];
    if let Some(last) = options.last_mut() {
        *last = 0;
    }
    f.extend_from_slice(&options);
    fix_ipv4_checksum(&mut f, 14);
    f.extend_from_slice(&datagram);
    f
}

/// Recompute the header checksum of the IPv4 header at `at`.
pub fn fix_ipv4_checksum(frame: &mut [u8], at: usize) {
    let header_len = usize::from(frame[at] & 0x0f) * 4;
    frame[at + 10..at + 12].fill(0);
    let c = ipv4_header_checksum(&frame[at..at + header_len]);
    frame[at + 10..at + 12].copy_from_slice(&c.to_be_bytes());
}

/// An Ethernet frame with an IPv6 UDP datagram; `extensions` is a chain of
/// (header type, length in bytes) placed before UDP: 0, 43 and 60 take a
/// multiple of 8, 51 (AH) a multiple of 4, 44 (fragment) 8.
pub fn ipv6_udp(
    source: &str,
    destination: &str,
    port: u16,
    extensions: &[(u8, usize)],
    payload: &[u8],
) -> Vec<u8> {
    let s: Ipv6Addr = source.parse().expect("IPv6 source");
    let d: Ipv6Addr = destination.parse().expect("IPv6 destination");
    let datagram = udp(s.into(), d.into(), port, payload);
    let mut chain = Vec::new();
    for (i, &(kind, len)) in extensions.iter().enumerate() {
        let next = extensions.get(i + 1).map_or(17, |e| e.0);
        let mut h = vec![0u8; len];
        h[0] = next;
        h[1] = u8::try_from(if kind == 51 { len / 4 - 2 } else { len / 8 - 1 }).unwrap_or(0);
        chain.extend_from_slice(&h);
    }
    let payload_len = u16::try_from(chain.len() + datagram.len()).unwrap_or(u16::MAX);
    let mut f = ethernet(0x86dd);
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&payload_len.to_be_bytes());
    f.push(extensions.first().map_or(17, |e| e.0));
    f.push(64);
    f.extend_from_slice(&s.octets());
    f.extend_from_slice(&d.octets());
    f.extend_from_slice(&chain);
    f.extend_from_slice(&datagram);
    f
}

/// `frame` with VLAN tags `(tpid, vid)` inserted after the MAC addresses,
/// outermost first.
pub fn vlan(frame: &[u8], tags: &[(u16, u16)]) -> Vec<u8> {
    let mut f = frame[..12].to_vec();
    for &(tpid, vid) in tags {
        f.extend_from_slice(&tpid.to_be_bytes());
        f.extend_from_slice(&vid.to_be_bytes());
    }
    f.extend_from_slice(&frame[12..]);
    f
}
