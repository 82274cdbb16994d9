//! The Internet checksum (RFC 1071) for IPv4 headers and UDP over IPv4 and
//! IPv6, computed over the bytes as captured.

use std::net::IpAddr;

/// Ones'-complement sum of `data` as big-endian 16-bit words (an odd last
/// byte is padded with zero), folded into `sum`.
fn add(mut sum: u64, data: &[u8]) -> u64 {
    let mut words = data.chunks_exact(2);
    for w in &mut words {
        sum += u64::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        sum += u64::from(u16::from_be_bytes([*last, 0]));
    }
    sum
}

fn fold(mut sum: u64) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    #[allow(clippy::cast_possible_truncation)] // folded to 16 bits above
    let sum = sum as u16;
    sum
}

/// Whether an IPv4 header (options included) sums to all ones.
pub fn ipv4_header_ok(header: &[u8]) -> bool {
    fold(add(0, header)) == 0xffff
}

/// Whether a UDP datagram (header and payload, checksum field as received)
/// sums to all ones with its pseudo-header.
pub fn udp_ok(source: IpAddr, destination: IpAddr, datagram: &[u8]) -> bool {
    fold(udp_sum(source, destination, datagram)) == 0xffff
}

fn udp_sum(source: IpAddr, destination: IpAddr, datagram: &[u8]) -> u64 {
    let len = datagram.len() as u64;
    let sum = match (source, destination) {
        (IpAddr::V4(s), IpAddr::V4(d)) => add(add(0, &s.octets()), &d.octets()),
        (IpAddr::V6(s), IpAddr::V6(d)) => add(add(0, &s.octets()), &d.octets()),
        // Mixed families can't be one datagram; this sum never matches.
        _ => return 0,
    };
    add(sum + 17 + len, datagram)
}

/// The checksum field value for a UDP datagram whose checksum field is
/// zero (for building test frames).
pub fn udp_checksum(source: IpAddr, destination: IpAddr, datagram: &[u8]) -> u16 {
    match !fold(udp_sum(source, destination, datagram)) {
        0 => 0xffff,
        c => c,
    }
}

/// The header checksum field value for an IPv4 header whose checksum field
/// is zero.
pub fn ipv4_header_checksum(header: &[u8]) -> u16 {
    !fold(add(0, header))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc1071_example() {
        // The example of RFC 1071 section 3: sum 0xddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(add(0, &data)), 0xddf2);
    }

    #[test]
    fn a_computed_checksum_verifies_and_a_flipped_bit_does_not() {
        let (s, d): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "239.1.1.1".parse().unwrap());
        let mut udp = vec![0x13, 0x88, 0x13, 0x88, 0x00, 0x0b, 0, 0, b'a', b'b', b'c'];
        let c = udp_checksum(s, d, &udp);
        udp[6..8].copy_from_slice(&c.to_be_bytes());
        assert!(udp_ok(s, d, &udp));
        udp[9] ^= 1;
        assert!(!udp_ok(s, d, &udp));
    }
}
