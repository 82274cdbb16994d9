//! Bytes on the wire, before they are a datagram: where AF_PACKET ingress
//! (`ingress = "packet"`) sits in the packet path. The privileged helper
//! attaches [`bpf::flow_filter`] to a flow's packet socket so the kernel
//! passes only that flow's frames; the worker walks the frames of its
//! TPACKET_V3 ring blocks with [`tpacket::frames`] (or a TPACKET_V2 slot with
//! [`tpacket::frame_v2`]) and reads each with
//! [`frame::parse`] — Ethernet with up to two VLAN tags, IPv4 with options,
//! IPv6 with extension headers, UDP with its length and checksum checked —
//! and relays the payload it finds exactly as socket ingress would. Every
//! frame that isn't relayed gets a [`frame::Reject`] reason, which the
//! worker counts.
//!
//! Pure: no sockets, no allocation in [`frame::parse`] or
//! [`tpacket::frames`], no `unsafe`, no panics on any input (each read
//! checks the length first). Fuzzed through [`fuzz_frame`].
//!
//! Once a datagram is in hand, [`health`] reads what it carries — the RTP
//! header ([`rtp`]) and MPEG-TS packet headers ([`ts`]) — for the
//! per-input stream health of flows with a `payload` other than `udp`,
//! without changing it. Same rules; fuzzed through [`fuzz_health`].
//!
//! Also the daemon's other parser of kernel bytes, [`rtnetlink`] (link
//! messages from a `NETLINK_ROUTE` socket), here so it is reachable from
//! outside the daemon's binary; fuzzed through [`fuzz_rtnetlink`]. And
//! [`neighbour`], the route and neighbour answers that give a unicast
//! `egress = "xdp"` output its next hop's MAC ([`fuzz_neighbour`]).
#![forbid(unsafe_code)]

pub mod bpf;
pub mod checksum;
pub mod egress;
pub mod frame;
pub mod health;
pub mod neighbour;
pub mod rtnetlink;
pub mod rtp;
pub mod rtp_seq;
#[cfg(any(test, feature = "test-support"))]
pub mod testframes;
pub mod tpacket;
pub mod ts;
pub mod xdp;

pub use frame::{Datagram, FlowMatch, Reject, parse};

/// Fuzz entry point (also run over a corpus and random inputs in the normal
/// tests): parse arbitrary bytes as a frame for an IPv4 and an IPv6 flow,
/// with and without checksum checks, and check what is returned is inside
/// the frame.
pub fn fuzz_frame(data: &[u8]) {
    let flows = [
        FlowMatch {
            destination: std::net::Ipv4Addr::new(239, 1, 1, 1).into(),
            port: 5000,
            source: None,
        },
        FlowMatch {
            destination: "ff3e::1:1"
                .parse()
                .unwrap_or(std::net::Ipv6Addr::UNSPECIFIED)
                .into(),
            port: 5000,
            source: None,
        },
    ];
    for flow in &flows {
        for verify in [true, false] {
            if let Ok(d) = parse(data, flow, verify) {
                assert!(d.payload.start <= d.payload.end && d.payload.end <= data.len());
            }
        }
    }
    for f in tpacket::frames(data).take(64).flatten() {
        let _ = parse(f.bytes, &flows[0], f.verify_checksum);
    }
    if let Ok(f) = tpacket::frame_v2(data) {
        let _ = parse(f.bytes, &flows[0], f.verify_checksum);
    }
}

/// Fuzz entry point for stream health (also run over a corpus and random
/// inputs in the normal tests): split `data` into datagrams (each preceded
/// by a 2-byte big-endian length, the last taking what is left) and feed
/// them to a tracker of every payload mode with a clock advancing by the
/// length byte, checking the counters stay consistent.
pub fn fuzz_health(data: &[u8]) {
    use health::{InputTracker, Payload};
    let mut trackers = Payload::ALL.map(|p| InputTracker::new(p, 90_000));
    let mut rest = data;
    let mut now = 0u64;
    let mut datagrams = 0u64;
    while !rest.is_empty() {
        let (d, next) = match *rest {
            [a, b, ref tail @ ..] => {
                let n = usize::from(u16::from_be_bytes([a, b])).min(tail.len());
                now += u64::from(a) * 1_000_000 + u64::from(b);
                tail.split_at(n)
            }
            _ => (rest, &[][..]),
        };
        for t in &mut trackers {
            t.observe(d, now);
        }
        datagrams += 1;
        rest = next;
    }
    for t in &trackers {
        assert_eq!(t.arrival().last_ns, (datagrams > 0).then_some(now));
        let r = t.rtp();
        assert_eq!(
            r.packets + r.malformed,
            if t.payload().has_rtp() { datagrams } else { 0 }
        );
        let ts = t.ts();
        assert!(ts.pids <= ts::PIDS as u64);
        assert!(ts.continuity_errors <= ts.packets);
    }
}

/// Fuzz entry point for [`rtnetlink`]: walk arbitrary bytes as a netlink
/// datagram, apply every link message to a table, and check the walk
/// advances (at most one item per header's worth of bytes, plus one), a
/// message whose length is malformed ends it, and applying a message
/// twice changes nothing the second time.
pub fn fuzz_rtnetlink(data: &[u8]) {
    use rtnetlink::{LinkTable, Malformed, Message, NLMSG_HDRLEN, messages};
    let mut table = LinkTable::default();
    let mut n = 0usize;
    let mut walk = messages(data);
    while let Some(m) = walk.next() {
        n += 1;
        assert!(n <= data.len() / NLMSG_HDRLEN + 1, "walk did not advance");
        match m {
            Ok(Message::Link(link)) => {
                table.apply(&link);
                assert!(
                    !table.apply(&link),
                    "a message applied twice changed the table"
                );
                if let Some(name) = &link.name {
                    let _ = table.state(name);
                }
            }
            Ok(_) | Err(Malformed::ShortLink { .. }) => {}
            Err(Malformed::Truncated { .. } | Malformed::BadLength { .. }) => {
                assert!(walk.next().is_none(), "walk went on after a bad length");
            }
        }
    }
}

/// Fuzz entry point for [`neighbour`]: walk arbitrary bytes as route and
/// neighbour answers; the walk advances, stops after a malformed length,
/// and whatever parses gives a next hop or a refusal, a MAC or none.
pub fn fuzz_neighbour(data: &[u8]) {
    use rtnetlink::{Malformed, NLMSG_HDRLEN};
    let mut n = 0usize;
    let mut walk = neighbour::answers(data);
    while let Some(a) = walk.next() {
        n += 1;
        assert!(n <= data.len() / NLMSG_HDRLEN + 1, "walk did not advance");
        match a {
            Ok((_, neighbour::Answer::Route(r))) => {
                let _ = neighbour::next_hop(&r, std::net::Ipv4Addr::new(10, 0, 0, 1), 1)
                    .map_err(|e| e.to_string());
            }
            Ok((_, neighbour::Answer::Neighbour(nb))) => {
                if let Some(mac) = nb.usable_mac() {
                    assert!(mac.iter().any(|&b| b != 0), "an all-zero MAC was usable");
                }
                let _ = nb.state_name();
            }
            Ok(_) | Err(Malformed::ShortLink { .. }) => {}
            Err(Malformed::Truncated { .. } | Malformed::BadLength { .. }) => {
                assert!(walk.next().is_none(), "walk went on after a bad length");
            }
        }
    }
}
