//! The next hop's MAC address for a unicast `egress = "xdp"` output, from
//! rtnetlink: an `RTM_GETROUTE` request says which next hop (the
//! destination itself, or a gateway) and which interface the kernel
//! would send to, an `RTM_GETNEIGH` request what the neighbour table
//! knows of that next hop. Both are reads an unprivileged socket may make.
//! Pure: requests are built into arrays, answers parsed from bytes with
//! every length checked first (no input can make it panic); the socket
//! that carries them is mcrelayd's `neighbour` module. Fuzzed through
//! [`crate::fuzz_neighbour`].

use std::fmt;
use std::net::Ipv4Addr;

use crate::rtnetlink::{
    Header, Malformed, NLA_TYPE_FLAGS, NLM_F_REQUEST, NLMSG_ERROR, RTA_HDRLEN, align4,
    next_message, u16_at, u32_at,
};

pub const RTM_NEWROUTE: u16 = 24;
pub const RTM_GETROUTE: u16 = 26;
pub const RTM_NEWNEIGH: u16 = 28;
pub const RTM_GETNEIGH: u16 = 30;

/// `sizeof(struct rtmsg)`.
const RTMSG_LEN: usize = 12;
/// `sizeof(struct ndmsg)`.
const NDMSG_LEN: usize = 12;
const AF_INET: u8 = 2;

const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
/// An IPv6 (or other family's) gateway of an IPv4 route (RFC 5549).
const RTA_VIA: u16 = 18;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;

/// `rtm_type` of a route to a host reached through an interface.
pub const RTN_UNICAST: u8 = 1;

pub const NUD_INCOMPLETE: u16 = 0x01;
pub const NUD_REACHABLE: u16 = 0x02;
pub const NUD_STALE: u16 = 0x04;
pub const NUD_DELAY: u16 = 0x08;
pub const NUD_PROBE: u16 = 0x10;
pub const NUD_FAILED: u16 = 0x20;
pub const NUD_NOARP: u16 = 0x40;
pub const NUD_PERMANENT: u16 = 0x80;

/// States whose link-layer address the kernel itself would send to:
/// confirmed (`REACHABLE`), not recently confirmed but still believed
/// (`STALE`, `DELAY`, `PROBE`: the kernel sends to it while it checks),
/// or set by hand (`PERMANENT`, `NOARP`).
const USABLE: u16 = NUD_REACHABLE | NUD_STALE | NUD_DELAY | NUD_PROBE | NUD_PERMANENT | NUD_NOARP;

/// An `RTM_GETROUTE` request: the route the kernel would use to send to
/// `destination` out of interface `oif` (its answer is one
/// `RTM_NEWROUTE`).
pub fn route_request(seq: u32, destination: Ipv4Addr, oif: u32) -> [u8; 44] {
    let mut m = [0u8; 44];
    header(&mut m, RTM_GETROUTE, seq);
    // rtmsg: family, dst_len 32, the rest 0.
    m[16] = AF_INET;
    m[17] = 32;
    attribute(&mut m[28..36], RTA_DST, destination.octets());
    attribute(&mut m[36..44], RTA_OIF, oif.to_ne_bytes());
    m
}

/// An `RTM_GETNEIGH` request: the neighbour table's entry for `address`
/// on interface `ifindex` (answered by one `RTM_NEWNEIGH`, or `ENOENT`).
pub fn neighbour_request(seq: u32, address: Ipv4Addr, ifindex: u32) -> [u8; 36] {
    let mut m = [0u8; 36];
    header(&mut m, RTM_GETNEIGH, seq);
    // ndmsg: family, pad, pad, ifindex, state 0, flags 0, type 0 (the
    // kernel refuses a get request with any of those set).
    m[16] = AF_INET;
    m[20..24].copy_from_slice(&ifindex.to_ne_bytes());
    attribute(&mut m[28..36], NDA_DST, address.octets());
    m
}

fn header(m: &mut [u8], kind: u16, seq: u32) {
    let len = u32::try_from(m.len()).unwrap_or(u32::MAX);
    m[0..4].copy_from_slice(&len.to_ne_bytes());
    m[4..6].copy_from_slice(&kind.to_ne_bytes());
    m[6..8].copy_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    m[8..12].copy_from_slice(&seq.to_ne_bytes());
}

fn attribute(at: &mut [u8], kind: u16, value: [u8; 4]) {
    at[0..2].copy_from_slice(&8u16.to_ne_bytes());
    at[2..4].copy_from_slice(&kind.to_ne_bytes());
    at[4..8].copy_from_slice(&value);
}

/// What an `RTM_NEWROUTE` answer says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// `rtm_type` (`RTN_*`).
    pub kind: u8,
    /// `RTA_OIF`: the interface it leaves through.
    pub oif: Option<u32>,
    /// `RTA_GATEWAY`: the next hop, when not the destination itself.
    pub gateway: Option<Ipv4Addr>,
    /// `RTA_VIA`: a gateway of another family (not served).
    pub via_other_family: bool,
}

/// What an `RTM_NEWNEIGH` answer says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Neighbour {
    /// `ndm_ifindex`.
    pub ifindex: u32,
    /// `ndm_state` (`NUD_*`).
    pub state: u16,
    /// `NDA_DST` of an IPv4 (`AF_INET`) entry.
    pub address: Option<Ipv4Addr>,
    /// `NDA_LLADDR`, when it is 6 bytes.
    pub mac: Option<[u8; 6]>,
}

impl Neighbour {
    /// The MAC address to send to, when the entry has one the kernel
    /// would use itself (`REACHABLE`, `STALE`, `DELAY`, `PROBE`,
    /// `PERMANENT`, `NOARP`); `None` while it is being
    /// resolved (`INCOMPLETE`), failed, or has no (or an all-zero)
    /// address.
    pub fn usable_mac(&self) -> Option<[u8; 6]> {
        self.mac
            .filter(|m| m.iter().any(|&b| b != 0) && self.state & USABLE != 0)
    }

    /// The state's name, for messages.
    pub fn state_name(&self) -> &'static str {
        state_name(self.state)
    }
}

/// `ndm_state`'s name as `ip neigh` prints it.
pub fn state_name(state: u16) -> &'static str {
    match state {
        0 => "NONE",
        NUD_INCOMPLETE => "INCOMPLETE",
        NUD_REACHABLE => "REACHABLE",
        NUD_STALE => "STALE",
        NUD_DELAY => "DELAY",
        NUD_PROBE => "PROBE",
        NUD_FAILED => "FAILED",
        NUD_NOARP => "NOARP",
        NUD_PERMANENT => "PERMANENT",
        _ => "(several states)",
    }
}

/// One message of an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Route(Route),
    Neighbour(Neighbour),
    /// `NLMSG_ERROR` (the kernel's negative errno; 0 is an
    /// acknowledgement).
    Error(i32),
    /// Anything else (`NLMSG_DONE`, ...), by type.
    Other(u16),
}

/// Every message in `datagram`, with its sequence number. Stops (after
/// yielding one error) at the first whose length is malformed.
pub fn answers(datagram: &[u8]) -> Answers<'_> {
    Answers { rest: datagram }
}

/// See [`answers`].
#[derive(Debug, Clone)]
pub struct Answers<'a> {
    rest: &'a [u8],
}

impl Iterator for Answers<'_> {
    type Item = Result<(u32, Answer), Malformed>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let (Header { kind, seq, .. }, body) = match next_message(&mut self.rest) {
            Ok(m) => m,
            Err(e) => return Some(Err(e)),
        };
        let answer = match kind {
            RTM_NEWROUTE => route(body).map(Answer::Route),
            RTM_NEWNEIGH => neighbour(body).map(Answer::Neighbour),
            NLMSG_ERROR => Ok(Answer::Error(
                u32_at(body, 0).map_or(0, |e| i32::from_ne_bytes(e.to_ne_bytes())),
            )),
            kind => Ok(Answer::Other(kind)),
        };
        Some(answer.map(|a| (seq, a)))
    }
}

/// The attributes after a fixed header of `fixed` bytes, as (type, value).
fn attributes(body: &[u8], fixed: usize) -> impl Iterator<Item = (u16, &[u8])> {
    let mut rest = body.get(fixed..).unwrap_or_default();
    std::iter::from_fn(move || {
        let (len, kind) = (u16_at(rest, 0)?, u16_at(rest, 2)?);
        let len = usize::from(len);
        // A malformed attribute ends the list; what came before stands.
        if len < RTA_HDRLEN || len > rest.len() {
            return None;
        }
        let value = rest.get(RTA_HDRLEN..len).unwrap_or_default();
        rest = rest.get(align4(len).min(rest.len())..).unwrap_or_default();
        Some((kind & !NLA_TYPE_FLAGS, value))
    })
}

fn ipv4(value: &[u8]) -> Option<Ipv4Addr> {
    <[u8; 4]>::try_from(value).ok().map(Ipv4Addr::from)
}

fn route(body: &[u8]) -> Result<Route, Malformed> {
    if body.len() < RTMSG_LEN {
        return Err(Malformed::ShortLink { len: body.len() });
    }
    let mut r = Route {
        kind: body[7],
        oif: None,
        gateway: None,
        via_other_family: false,
    };
    for (kind, value) in attributes(body, RTMSG_LEN) {
        match kind {
            RTA_OIF => r.oif = u32_at(value, 0),
            RTA_GATEWAY => r.gateway = ipv4(value),
            RTA_VIA => r.via_other_family = true,
            _ => {}
        }
    }
    Ok(r)
}

fn neighbour(body: &[u8]) -> Result<Neighbour, Malformed> {
    let short = Malformed::ShortLink { len: body.len() };
    if body.len() < NDMSG_LEN {
        return Err(short);
    }
    let mut n = Neighbour {
        ifindex: u32_at(body, 4).ok_or_else(|| short.clone())?,
        state: u16_at(body, 8).ok_or(short)?,
        address: None,
        mac: None,
    };
    // Only an IPv4 entry's destination is an IPv4 address (a bridge's
    // forwarding entry has a 4-byte NDA_DST too: a VXLAN remote).
    let inet = body[0] == AF_INET;
    for (kind, value) in attributes(body, NDMSG_LEN) {
        match kind {
            NDA_DST if inet => n.address = ipv4(value),
            NDA_LLADDR => n.mac = <[u8; 6]>::try_from(value).ok(),
            _ => {}
        }
    }
    Ok(n)
}

/// Why a route can't carry a unicast xdp output's frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextHopRefusal {
    /// Not a route to a host through an interface (`local`, `broadcast`,
    /// `blackhole`, ...): its `rtm_type`.
    NotUnicast(u8),
    /// It leaves through another interface (its index), or names none.
    OtherInterface(Option<u32>),
    /// Its gateway is of another family (`via inet6`).
    ForeignGateway,
}

impl fmt::Display for NextHopRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NextHopRefusal::NotUnicast(2) => write!(f, "it is an address of this host"),
            NextHopRefusal::NotUnicast(3) => write!(f, "it is a broadcast address"),
            NextHopRefusal::NotUnicast(t) => write!(f, "its route is not a unicast one (type {t})"),
            NextHopRefusal::OtherInterface(Some(i)) => {
                write!(f, "its route leaves through interface index {i}")
            }
            NextHopRefusal::OtherInterface(None) => write!(f, "its route names no interface"),
            NextHopRefusal::ForeignGateway => write!(f, "its route's gateway is not IPv4"),
        }
    }
}

/// The next hop whose MAC the frames to `destination` carry: the route's
/// gateway, or the destination itself when it is on the link. The route
/// must be a unicast one leaving through `ifindex`.
pub fn next_hop(
    route: &Route,
    destination: Ipv4Addr,
    ifindex: u32,
) -> Result<Ipv4Addr, NextHopRefusal> {
    if route.kind != RTN_UNICAST {
        return Err(NextHopRefusal::NotUnicast(route.kind));
    }
    if route.oif != Some(ifindex) {
        return Err(NextHopRefusal::OtherInterface(route.oif));
    }
    if route.via_other_family {
        return Err(NextHopRefusal::ForeignGateway);
    }
    Ok(route.gateway.unwrap_or(destination))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rtnetlink::NLMSG_HDRLEN;

    const DST: Ipv4Addr = Ipv4Addr::new(10, 10, 2, 2);
    const GW: Ipv4Addr = Ipv4Addr::new(10, 10, 2, 254);

    fn message(kind: u16, seq: u32, body: &[u8]) -> Vec<u8> {
        let mut m = vec![0u8; NLMSG_HDRLEN];
        let len = u32::try_from(NLMSG_HDRLEN + body.len()).unwrap_or(0);
        m[0..4].copy_from_slice(&len.to_ne_bytes());
        m[4..6].copy_from_slice(&kind.to_ne_bytes());
        m[8..12].copy_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(body);
        while m.len() % 4 != 0 {
            m.push(0);
        }
        m
    }

    fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut a = Vec::new();
        a.extend_from_slice(&u16::try_from(4 + value.len()).unwrap_or(0).to_ne_bytes());
        a.extend_from_slice(&kind.to_ne_bytes());
        a.extend_from_slice(value);
        while a.len() % 4 != 0 {
            a.push(0);
        }
        a
    }

    fn route_answer(kind: u8, oif: u32, gateway: Option<Ipv4Addr>) -> Vec<u8> {
        let mut body = vec![AF_INET, 32, 0, 0, 254, 0, 0, kind, 0, 0, 0, 0];
        body.extend(attr(RTA_DST, &DST.octets()));
        body.extend(attr(RTA_OIF, &oif.to_ne_bytes()));
        if let Some(g) = gateway {
            body.extend(attr(RTA_GATEWAY, &g.octets()));
        }
        message(RTM_NEWROUTE, 7, &body)
    }

    fn neighbour_answer(state: u16, mac: Option<[u8; 6]>) -> Vec<u8> {
        let mut body = vec![AF_INET, 0, 0, 0];
        body.extend_from_slice(&5u32.to_ne_bytes());
        body.extend_from_slice(&state.to_ne_bytes());
        body.extend_from_slice(&[0, 1]);
        body.extend(attr(NDA_DST, &DST.octets()));
        if let Some(m) = mac {
            body.extend(attr(NDA_LLADDR, &m));
        }
        message(RTM_NEWNEIGH, 8, &body)
    }

    fn only(datagram: &[u8]) -> (u32, Answer) {
        let all: Vec<_> = answers(datagram).collect();
        assert_eq!(all.len(), 1, "{all:?}");
        all.into_iter()
            .next()
            .and_then(Result::ok)
            .expect("one answer")
    }

    #[test]
    fn requests_carry_their_lengths_and_attributes() {
        let r = route_request(3, DST, 5);
        assert_eq!(u32_at(&r, 0), Some(44));
        assert_eq!(u16_at(&r, 4), Some(RTM_GETROUTE));
        assert_eq!(u32_at(&r, 8), Some(3));
        assert_eq!(r[16], AF_INET);
        assert_eq!(r[17], 32);
        let attrs: Vec<_> = attributes(&r[NLMSG_HDRLEN..], RTMSG_LEN).collect();
        assert_eq!(
            attrs,
            vec![
                (RTA_DST, &DST.octets()[..]),
                (RTA_OIF, &5u32.to_ne_bytes()[..])
            ]
        );
        let n = neighbour_request(4, GW, 9);
        assert_eq!(u32_at(&n, 0), Some(36));
        assert_eq!(u16_at(&n, 4), Some(RTM_GETNEIGH));
        assert_eq!(u32_at(&n, 20), Some(9));
        assert_eq!(&n[24..28], &[0, 0, 0, 0], "state, flags and type 0");
        let attrs: Vec<_> = attributes(&n[NLMSG_HDRLEN..], NDMSG_LEN).collect();
        assert_eq!(attrs, vec![(NDA_DST, &GW.octets()[..])]);
    }

    #[test]
    fn the_next_hop_is_the_gateway_or_the_destination() {
        let (seq, a) = only(&route_answer(RTN_UNICAST, 5, None));
        assert_eq!(seq, 7);
        let Answer::Route(r) = a else {
            panic!("not a route")
        };
        assert_eq!(next_hop(&r, DST, 5), Ok(DST));
        let Answer::Route(r) = only(&route_answer(RTN_UNICAST, 5, Some(GW))).1 else {
            panic!("not a route")
        };
        assert_eq!(r.gateway, Some(GW));
        assert_eq!(next_hop(&r, DST, 5), Ok(GW));
        assert_eq!(
            next_hop(&r, DST, 6),
            Err(NextHopRefusal::OtherInterface(Some(5)))
        );
        let Answer::Route(local) = only(&route_answer(2, 1, None)).1 else {
            panic!("not a route")
        };
        let e = next_hop(&local, DST, 1).expect_err("local");
        assert_eq!(e.to_string(), "it is an address of this host");
    }

    #[test]
    fn only_a_resolved_entry_gives_a_mac() {
        let mac = [2, 0, 0, 0, 0, 9];
        for (state, usable) in [
            (NUD_REACHABLE, true),
            (NUD_STALE, true),
            (NUD_DELAY, true),
            (NUD_PROBE, true),
            (NUD_PERMANENT, true),
            (NUD_INCOMPLETE, false),
            (NUD_FAILED, false),
            (0, false),
        ] {
            let Answer::Neighbour(n) = only(&neighbour_answer(state, Some(mac))).1 else {
                panic!("not a neighbour")
            };
            assert_eq!(n.ifindex, 5);
            assert_eq!(n.address, Some(DST));
            assert_eq!(n.usable_mac(), usable.then_some(mac), "{}", n.state_name());
        }
        let Answer::Neighbour(n) = only(&neighbour_answer(NUD_REACHABLE, None)).1 else {
            panic!("not a neighbour")
        };
        assert_eq!(n.usable_mac(), None, "no address");
        let Answer::Neighbour(n) = only(&neighbour_answer(NUD_STALE, Some([0; 6]))).1 else {
            panic!("not a neighbour")
        };
        assert_eq!(n.usable_mac(), None, "an all-zero address");
    }

    #[test]
    fn errors_and_malformed_lengths() {
        let e = message(NLMSG_ERROR, 9, &(-2i32).to_ne_bytes());
        assert_eq!(only(&e), (9, Answer::Error(-2)));
        let mut bad = route_answer(RTN_UNICAST, 5, None);
        bad[0..4].copy_from_slice(&1000u32.to_ne_bytes());
        let all: Vec<_> = answers(&bad).collect();
        assert!(
            matches!(all[..], [Err(Malformed::BadLength { .. })]),
            "{all:?}"
        );
        let short = message(RTM_NEWNEIGH, 1, &[AF_INET, 0, 0]);
        assert!(matches!(
            answers(&short).next(),
            Some(Err(Malformed::ShortLink { len: 3 }))
        ));
        // Every prefix of a good answer parses or is refused, never panics.
        let good = neighbour_answer(NUD_REACHABLE, Some([1; 6]));
        for n in 0..good.len() {
            for a in answers(&good[..n]) {
                let _ = a;
            }
        }
    }
}
