//! Headers for AF_PACKET egress (issue 19's egress lever): the product's
//! prebuilt Ethernet + IPv4 + UDP header ([`mcrelay_wire::egress`], which
//! `egress = "xdp"` sends), plus what only this experiment needs: the
//! header of a GSO frame whose UDP checksum the kernel finishes.

pub use mcrelay_wire::egress::{Endpoints, HEADER_LEN, Template};

const ETH_LEN: usize = 14;
const IP_LEN: usize = 20;
const UDP_LEN: usize = 8;

/// [`Template::fill`] for a frame whose UDP checksum the kernel finishes
/// (`CHECKSUM_PARTIAL`, e.g. per segment of a GSO frame): the checksum
/// field holds the folded pseudo-header sum (addresses, protocol, UDP
/// length), not complemented.
pub fn fill_partial_checksum(
    template: &Template,
    out: &mut [u8; HEADER_LEN],
    payload_len: usize,
) -> Option<()> {
    template.fill(out, payload_len)?;
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

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use super::*;

    const SOURCE: Ipv4Addr = Ipv4Addr::new(10, 20, 1, 1);
    const GROUP: Ipv4Addr = Ipv4Addr::new(239, 1, 1, 1);

    fn template(ttl: u8) -> Template {
        Template::new(&Endpoints {
            source_mac: [2, 0, 0, 0, 0, 1],
            source: SOURCE,
            source_port: 4000,
            destination: GROUP,
            destination_mac: mcrelay_wire::egress::multicast_mac(GROUP),
            port: 5000,
            ttl,
        })
    }

    #[test]
    fn a_partial_checksum_completes_to_a_verifying_one() {
        let (source, group, t) = (SOURCE, GROUP, template(1));
        let payload = [7u8; 101];
        let mut h = [0u8; HEADER_LEN];
        fill_partial_checksum(&t, &mut h, payload.len()).unwrap();
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
}
