//! Which network interfaces exist and are up, from rtnetlink link messages
//! (`RTM_NEWLINK` / `RTM_DELLINK`, as notifications or as the answer to an
//! `RTM_GETLINK` dump). Pure: bytes in, a [`LinkTable`] out; the socket
//! that reads them is mcrelayd's `netlink` module (which imports this one
//! as `links`). Fuzzed through [`crate::fuzz_rtnetlink`].
//!
//! Parsing checks every length before it reads, so no input — truncated,
//! lying about its lengths, or random — can make it panic or read out of
//! bounds; a message with a malformed length ends the walk over its
//! datagram (a link message too short for its `ifinfomsg` is an error, but
//! its length still says where the next message starts).

use std::collections::BTreeMap;
use std::fmt;

/// `sizeof(struct nlmsghdr)`.
pub const NLMSG_HDRLEN: usize = 16;
/// `sizeof(struct ifinfomsg)`.
pub const IFINFOMSG_LEN: usize = 16;
/// `sizeof(struct rtattr)`.
pub(crate) const RTA_HDRLEN: usize = 4;

pub const NLMSG_ERROR: u16 = 2;
pub const NLMSG_DONE: u16 = 3;
pub const RTM_NEWLINK: u16 = 16;
pub const RTM_DELLINK: u16 = 17;
pub const RTM_GETLINK: u16 = 18;

pub const NLM_F_REQUEST: u16 = 0x1;
/// A dump was interrupted by a change; its content may be inconsistent.
pub const NLM_F_DUMP_INTR: u16 = 0x10;
pub const NLM_F_DUMP: u16 = 0x300;

const IFLA_IFNAME: u16 = 3;
const IFLA_OPERSTATE: u16 = 16;
/// `NLA_F_NESTED | NLA_F_NET_BYTEORDER`: flag bits of an attribute type.
pub(crate) const NLA_TYPE_FLAGS: u16 = 0xc000;

const IFF_UP: u32 = 0x1;
const IFF_RUNNING: u32 = 0x40;
/// The carrier is on (`netif_carrier_ok`): what `ip link` shows as
/// `LOWER_UP`.
const IFF_LOWER_UP: u32 = 0x1_0000;
/// Waiting for an external event (e.g. 802.1X authentication).
const IFF_DORMANT: u32 = 0x2_0000;
/// `AF_UNSPEC`: the family of a device's own link messages. Others (e.g.
/// `AF_BRIDGE` port messages, whose `RTM_DELLINK` means "left the bridge",
/// not "deleted") are not about the device's existence.
const AF_UNSPEC: u8 = 0;

/// `NLMSG_ALIGN`: lengths round up to 4 bytes.
pub(crate) fn align4(n: usize) -> usize {
    n.saturating_add(3) & !3
}

pub(crate) fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    let bytes = b.get(at..at.checked_add(2)?)?;
    Some(u16::from_ne_bytes(bytes.try_into().ok()?))
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    let bytes = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_ne_bytes(bytes.try_into().ok()?))
}

/// Why a datagram's walk stopped early.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Malformed {
    /// Fewer bytes left than a header needs.
    Truncated { left: usize },
    /// A message claims a length below its header's or beyond the datagram.
    BadLength { claimed: usize, left: usize },
    /// A link message too short for its `ifinfomsg`.
    ShortLink { len: usize },
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Malformed::Truncated { left } => {
                write!(f, "{left} trailing bytes, too few for a header")
            }
            Malformed::BadLength { claimed, left } => {
                write!(f, "message claims {claimed} bytes with {left} left")
            }
            Malformed::ShortLink { len } => write!(f, "link message of {len} bytes"),
        }
    }
}

/// What a link message says about one interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkMessage {
    /// `RTM_DELLINK`: the interface is gone.
    pub deleted: bool,
    /// `ifi_family`.
    pub family: u8,
    /// `ifi_index`.
    pub index: u32,
    /// `ifi_flags`.
    pub flags: u32,
    /// `IFLA_IFNAME`, if present (up to its NUL).
    pub name: Option<String>,
    /// `IFLA_OPERSTATE` (`IF_OPER_*`), if present.
    pub operstate: Option<u8>,
}

impl LinkMessage {
    /// Administratively up (`IFF_UP`) and able to pass traffic: either
    /// operationally up (`IFF_RUNNING`; also set for "unknown", which is
    /// what carrier-less virtual devices report while they work), or the
    /// carrier is on (`IFF_LOWER_UP`) and the device is not dormant.
    ///
    /// The carrier counts on its own because `IFF_RUNNING` follows the
    /// operational state, which the kernel's link watcher updates
    /// asynchronously, batched at most once a second (`linkwatch`; only
    /// some events are "urgent"): for up to a second after a veth or NIC
    /// comes up, `ip link` already shows `UP,LOWER_UP` and traffic flows,
    /// yet `IFF_RUNNING` is still clear. A daemon started then saw every
    /// interface down, paused every flow ("interface va down") and resumed
    /// them only when the late notification arrived.
    pub fn is_up(&self) -> bool {
        let carrier = self.flags & IFF_LOWER_UP != 0 && self.flags & IFF_DORMANT == 0;
        self.flags & IFF_UP != 0 && (self.flags & IFF_RUNNING != 0 || carrier)
    }
}

/// One netlink message of interest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Link(LinkMessage),
    /// The end of a dump (`NLMSG_DONE`); `interrupted` if the kernel saw
    /// the table change while dumping (`NLM_F_DUMP_INTR`).
    Done {
        seq: u32,
        interrupted: bool,
    },
    /// `NLMSG_ERROR`: `errno` 0 is an acknowledgement.
    Error {
        seq: u32,
        errno: i32,
    },
    /// Anything else, by type.
    Other {
        kind: u16,
    },
}

/// The messages of one datagram, in order. Stops (after yielding one
/// error) at the first message whose length is malformed.
#[derive(Debug, Clone)]
pub struct Messages<'a> {
    rest: &'a [u8],
}

/// Walk the netlink messages in `datagram`.
pub fn messages(datagram: &[u8]) -> Messages<'_> {
    Messages { rest: datagram }
}

/// The fixed fields of a netlink message header (`struct nlmsghdr`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Header {
    pub kind: u16,
    pub flags: u16,
    pub seq: u32,
}

/// Split the first netlink message off `rest`: its header and body, with
/// `rest` moved past it (4-aligned). A truncated header or a length that
/// doesn't fit empties `rest`, so an iterator over it ends after the error.
pub(crate) fn next_message<'a>(rest: &mut &'a [u8]) -> Result<(Header, &'a [u8]), Malformed> {
    let b: &'a [u8] = rest;
    let left = b.len();
    let (Some(len), Some(kind), Some(flags), Some(seq)) =
        (u32_at(b, 0), u16_at(b, 4), u16_at(b, 6), u32_at(b, 8))
    else {
        *rest = &[];
        return Err(Malformed::Truncated { left });
    };
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    if len < NLMSG_HDRLEN || len > left {
        *rest = &[];
        return Err(Malformed::BadLength { claimed: len, left });
    }
    let body = b.get(NLMSG_HDRLEN..len).unwrap_or_default();
    *rest = b.get(align4(len).min(left)..).unwrap_or_default();
    Ok((Header { kind, flags, seq }, body))
}

impl Iterator for Messages<'_> {
    type Item = Result<Message, Malformed>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let (Header { kind, flags, seq }, body) = match next_message(&mut self.rest) {
            Ok(m) => m,
            Err(e) => return Some(Err(e)),
        };
        Some(match kind {
            RTM_NEWLINK | RTM_DELLINK => link(body, kind == RTM_DELLINK).map(Message::Link),
            NLMSG_DONE => Ok(Message::Done {
                seq,
                interrupted: flags & NLM_F_DUMP_INTR != 0,
            }),
            NLMSG_ERROR => Ok(Message::Error {
                seq,
                errno: u32_at(body, 0).map_or(0, |e| i32::from_ne_bytes(e.to_ne_bytes())),
            }),
            kind => Ok(Message::Other { kind }),
        })
    }
}

/// An `ifinfomsg` and its attributes.
fn link(body: &[u8], deleted: bool) -> Result<LinkMessage, Malformed> {
    let short = Malformed::ShortLink { len: body.len() };
    let family = *body.first().ok_or_else(|| short.clone())?;
    let index = u32_at(body, 4).ok_or_else(|| short.clone())?;
    let flags = u32_at(body, 8).ok_or_else(|| short.clone())?;
    if body.len() < IFINFOMSG_LEN {
        return Err(short);
    }
    let mut message = LinkMessage {
        deleted,
        family,
        index,
        flags,
        name: None,
        operstate: None,
    };
    let mut attrs = body.get(IFINFOMSG_LEN..).unwrap_or_default();
    // A malformed attribute ends the list; what came before stands.
    while let (Some(len), Some(kind)) = (u16_at(attrs, 0), u16_at(attrs, 2)) {
        let len = usize::from(len);
        if len < RTA_HDRLEN || len > attrs.len() {
            break;
        }
        let value = attrs.get(RTA_HDRLEN..len).unwrap_or_default();
        match kind & !NLA_TYPE_FLAGS {
            IFLA_IFNAME => {
                let name = value.split(|&b| b == 0).next().unwrap_or_default();
                message.name = Some(String::from_utf8_lossy(name).into_owned());
            }
            IFLA_OPERSTATE => message.operstate = value.first().copied(),
            _ => {}
        }
        attrs = attrs
            .get(align4(len).min(attrs.len())..)
            .unwrap_or_default();
    }
    Ok(message)
}

/// An `RTM_GETLINK` dump request with sequence number `seq`.
pub fn dump_request(seq: u32) -> [u8; NLMSG_HDRLEN + IFINFOMSG_LEN] {
    let mut m = [0u8; NLMSG_HDRLEN + IFINFOMSG_LEN];
    let len = u32::try_from(m.len()).unwrap_or(u32::MAX);
    m[0..4].copy_from_slice(&len.to_ne_bytes());
    m[4..6].copy_from_slice(&RTM_GETLINK.to_ne_bytes());
    m[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    m[8..12].copy_from_slice(&seq.to_ne_bytes());
    // nlmsg_pid 0 (the kernel fills in ours); ifinfomsg all zero:
    // AF_UNSPEC, every interface.
    m
}

/// One interface as last reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub name: String,
    pub up: bool,
}

/// Whether an interface can carry a flow now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterfaceState {
    Up,
    Down,
    Missing,
}

/// The interfaces of this network namespace, by index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkTable {
    by_index: BTreeMap<u32, Link>,
}

impl LinkTable {
    /// Apply one message; whether the table changed.
    pub fn apply(&mut self, m: &LinkMessage) -> bool {
        if m.family != AF_UNSPEC {
            return false;
        }
        if m.deleted {
            return self.by_index.remove(&m.index).is_some();
        }
        let name = match (&m.name, self.by_index.get(&m.index)) {
            (Some(name), _) => name.clone(),
            (None, Some(known)) => known.name.clone(),
            // Nothing to call it by.
            (None, None) => return false,
        };
        let link = Link {
            name,
            up: m.is_up(),
        };
        self.by_index.insert(m.index, link.clone()) != Some(link)
    }

    /// The state of the interface called `name`.
    pub fn state(&self, name: &str) -> InterfaceState {
        match self.by_index.values().find(|l| l.name == name) {
            None => InterfaceState::Missing,
            Some(l) if l.up => InterfaceState::Up,
            Some(_) => InterfaceState::Down,
        }
    }

    /// Every interface's name and index (an interface deleted and
    /// created again has a new one).
    pub fn indexes(&self) -> impl Iterator<Item = (&str, u32)> {
        self.by_index.iter().map(|(&i, l)| (l.name.as_str(), i))
    }

    pub fn len(&self) -> usize {
        self.by_index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_index.is_empty()
    }
}

/// Why a flow can't run with its interfaces as they are, naming the first
/// interface (in `names` order) that is missing or down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blocked {
    Down(String),
    Missing(String),
}

/// `None` if every interface in `names` is up.
pub fn blocked<'a>(table: &LinkTable, names: impl IntoIterator<Item = &'a str>) -> Option<Blocked> {
    names.into_iter().find_map(|name| match table.state(name) {
        InterfaceState::Up => None,
        InterfaceState::Down => Some(Blocked::Down(name.to_owned())),
        InterfaceState::Missing => Some(Blocked::Missing(name.to_owned())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
        let len = u16::try_from(RTA_HDRLEN + value.len()).unwrap();
        let mut a = Vec::new();
        a.extend_from_slice(&len.to_ne_bytes());
        a.extend_from_slice(&kind.to_ne_bytes());
        a.extend_from_slice(value);
        a.resize(align4(a.len()), 0);
        a
    }

    fn header(len: usize, kind: u16, flags: u16, seq: u32) -> Vec<u8> {
        let mut h = Vec::new();
        h.extend_from_slice(&u32::try_from(len).unwrap().to_ne_bytes());
        h.extend_from_slice(&kind.to_ne_bytes());
        h.extend_from_slice(&flags.to_ne_bytes());
        h.extend_from_slice(&seq.to_ne_bytes());
        h.extend_from_slice(&0u32.to_ne_bytes());
        h
    }

    /// A link message as the kernel builds it: `ifinfomsg`, then
    /// `IFLA_IFNAME` and `IFLA_OPERSTATE` among other attributes.
    fn link_message(kind: u16, family: u8, index: u32, flags: u32, name: &str) -> Vec<u8> {
        let mut body = vec![family, 0];
        body.extend_from_slice(&1u16.to_ne_bytes()); // ARPHRD_ETHER
        body.extend_from_slice(&index.to_ne_bytes());
        body.extend_from_slice(&flags.to_ne_bytes());
        body.extend_from_slice(&0xffff_ffffu32.to_ne_bytes());
        body.extend(attr(4, &1500u32.to_ne_bytes())); // IFLA_MTU
        let mut cname = name.as_bytes().to_vec();
        cname.push(0);
        body.extend(attr(IFLA_IFNAME, &cname));
        body.extend(attr(
            IFLA_OPERSTATE,
            &[if flags & IFF_RUNNING != 0 { 6 } else { 2 }],
        ));
        body.extend(attr(IFLA_NESTED_EXAMPLE | 0x8000, &attr(1, &[1, 2, 3])));
        let mut m = header(NLMSG_HDRLEN + body.len(), kind, 0, 0);
        m.extend(body);
        m
    }
    const IFLA_NESTED_EXAMPLE: u16 = 26; // IFLA_AF_SPEC

    const UP_RUNNING: u32 = IFF_UP | IFF_RUNNING | 0x1000;

    #[test]
    fn parses_new_and_del_link() {
        let mut datagram = link_message(RTM_NEWLINK, 0, 7, UP_RUNNING, "vRA");
        datagram.extend(link_message(RTM_DELLINK, 0, 8, IFF_UP, "vRB"));
        let got: Vec<_> = messages(&datagram).collect();
        assert_eq!(
            got,
            vec![
                Ok(Message::Link(LinkMessage {
                    deleted: false,
                    family: 0,
                    index: 7,
                    flags: UP_RUNNING,
                    name: Some("vRA".into()),
                    operstate: Some(6),
                })),
                Ok(Message::Link(LinkMessage {
                    deleted: true,
                    family: 0,
                    index: 8,
                    flags: IFF_UP,
                    name: Some("vRB".into()),
                    operstate: Some(2),
                })),
            ]
        );
    }

    #[test]
    fn done_error_and_others() {
        let mut d = header(NLMSG_HDRLEN + 4, NLMSG_DONE, NLM_F_DUMP_INTR, 9);
        d.extend_from_slice(&0u32.to_ne_bytes());
        let mut e = header(NLMSG_HDRLEN + 4, NLMSG_ERROR, 0, 3);
        e.extend_from_slice(&(-105i32).to_ne_bytes());
        d.extend(e);
        d.extend(header(NLMSG_HDRLEN, 24, 0, 0)); // RTM_NEWROUTE, empty
        let got: Vec<_> = messages(&d).collect();
        assert_eq!(
            got,
            vec![
                Ok(Message::Done {
                    seq: 9,
                    interrupted: true
                }),
                Ok(Message::Error {
                    seq: 3,
                    errno: -105
                }),
                Ok(Message::Other { kind: 24 }),
            ]
        );
    }

    #[test]
    fn lengths_that_lie_stop_the_walk() {
        let good = link_message(RTM_NEWLINK, 0, 1, UP_RUNNING, "lo");
        let mut d = good.clone();
        d.extend(header(1000, RTM_NEWLINK, 0, 0));
        let got: Vec<_> = messages(&d).collect();
        assert_eq!(got.len(), 2);
        assert!(got[0].is_ok());
        assert!(matches!(
            got[1],
            Err(Malformed::BadLength { claimed: 1000, .. })
        ));
        // Below the header's own length.
        let got: Vec<_> = messages(&header(3, RTM_NEWLINK, 0, 0)).collect();
        assert!(matches!(
            got[..],
            [Err(Malformed::BadLength { claimed: 3, .. })]
        ));
        // Trailing bytes too few for a header.
        let got: Vec<_> = messages(&[1, 2, 3]).collect();
        assert_eq!(got, vec![Err(Malformed::Truncated { left: 3 })]);
        // A link message without room for its ifinfomsg.
        let mut short = header(NLMSG_HDRLEN + 8, RTM_NEWLINK, 0, 0);
        short.extend_from_slice(&[0; 8]);
        let got: Vec<_> = messages(&short).collect();
        assert_eq!(got, vec![Err(Malformed::ShortLink { len: 8 })]);
        // An attribute whose length runs past the message: the fields
        // before it stand, the name is not invented.
        let mut m = good;
        let at = NLMSG_HDRLEN + IFINFOMSG_LEN;
        m[at..at + 2].copy_from_slice(&u16::MAX.to_ne_bytes());
        let Some(Ok(Message::Link(l))) = messages(&m).next() else {
            panic!("link expected");
        };
        assert_eq!((l.index, l.name), (1, None));
    }

    #[test]
    fn up_means_admin_up_and_running_or_carrier_on() {
        let m = |flags| LinkMessage {
            deleted: false,
            family: 0,
            index: 1,
            flags,
            name: None,
            operstate: None,
        };
        assert!(m(IFF_UP | IFF_RUNNING).is_up());
        assert!(m(IFF_UP | IFF_RUNNING | IFF_LOWER_UP).is_up());
        assert!(
            m(IFF_UP | IFF_LOWER_UP).is_up(),
            "carrier on, operational state not updated yet (linkwatch): up"
        );
        assert!(!m(IFF_UP).is_up(), "no carrier");
        assert!(!m(IFF_RUNNING).is_up(), "admin down");
        assert!(!m(IFF_LOWER_UP).is_up(), "admin down, carrier on");
        assert!(
            !m(IFF_UP | IFF_LOWER_UP | IFF_DORMANT).is_up(),
            "dormant: carrier but not usable"
        );
    }

    fn apply_all(table: &mut LinkTable, datagram: &[u8]) -> bool {
        let mut changed = false;
        for m in messages(datagram) {
            if let Ok(Message::Link(l)) = m {
                changed |= table.apply(&l);
            }
        }
        changed
    }

    #[test]
    fn table_follows_up_down_rename_delete_and_ignores_bridge_ports() {
        let mut t = LinkTable::default();
        assert_eq!(t.state("vRA"), InterfaceState::Missing);
        assert!(apply_all(
            &mut t,
            &link_message(RTM_NEWLINK, 0, 5, UP_RUNNING, "vRA")
        ));
        assert_eq!(t.state("vRA"), InterfaceState::Up);
        assert!(
            !apply_all(&mut t, &link_message(RTM_NEWLINK, 0, 5, UP_RUNNING, "vRA")),
            "same again: no change"
        );
        assert!(apply_all(
            &mut t,
            &link_message(RTM_NEWLINK, 0, 5, IFF_UP, "vRA")
        ));
        assert_eq!(t.state("vRA"), InterfaceState::Down);
        // A bridge port leaving its bridge is not the device going away.
        assert!(!apply_all(
            &mut t,
            &link_message(RTM_DELLINK, 7, 5, IFF_UP, "vRA")
        ));
        assert_eq!(t.state("vRA"), InterfaceState::Down);
        // Renamed: the old name is gone.
        assert!(apply_all(
            &mut t,
            &link_message(RTM_NEWLINK, 0, 5, UP_RUNNING, "wan0")
        ));
        assert_eq!(t.state("vRA"), InterfaceState::Missing);
        assert_eq!(t.state("wan0"), InterfaceState::Up);
        assert!(apply_all(
            &mut t,
            &link_message(RTM_DELLINK, 0, 5, UP_RUNNING, "wan0")
        ));
        assert_eq!(t.state("wan0"), InterfaceState::Missing);
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn blocked_names_the_first_problem() {
        let mut t = LinkTable::default();
        apply_all(&mut t, &link_message(RTM_NEWLINK, 0, 1, UP_RUNNING, "in"));
        apply_all(&mut t, &link_message(RTM_NEWLINK, 0, 2, IFF_UP, "out"));
        assert_eq!(blocked(&t, ["in"]), None);
        assert_eq!(
            blocked(&t, ["in", "out"]),
            Some(Blocked::Down("out".into()))
        );
        assert_eq!(
            blocked(&t, ["in", "gone", "out"]),
            Some(Blocked::Missing("gone".into()))
        );
    }

    #[test]
    fn dump_request_parses_as_a_getlink() {
        let r = dump_request(42);
        let got: Vec<_> = messages(&r).collect();
        assert_eq!(got, vec![Ok(Message::Other { kind: RTM_GETLINK })]);
        assert_eq!(u16_at(&r, 6), Some(NLM_F_REQUEST | NLM_F_DUMP));
        assert_eq!(u32_at(&r, 8), Some(42));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Arbitrary bytes never panic, and the walk ends.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut t = LinkTable::default();
            let mut n = 0;
            for m in messages(&bytes) {
                n += 1;
                if let Ok(Message::Link(l)) = m {
                    t.apply(&l);
                }
            }
            prop_assert!(n <= bytes.len() / NLMSG_HDRLEN + 1);
        }

        /// Valid messages with random names, flags and corrupted bytes
        /// anywhere: still no panic.
        #[test]
        fn corrupted_link_messages_never_panic(
            name in "[a-z0-9]{1,15}",
            flags in any::<u32>(),
            index in any::<u32>(),
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..8),
            cut in any::<usize>(),
        ) {
            let mut d = link_message(RTM_NEWLINK, 0, index, flags, &name);
            let whole = d.clone();
            let Some(Ok(Message::Link(l))) = messages(&whole).next() else {
                panic!("valid message");
            };
            prop_assert_eq!(l.name.as_deref(), Some(name.as_str()));
            for (at, byte) in flips {
                let len = d.len();
                d[at % len] = byte;
            }
            d.truncate(cut % (d.len() + 1));
            let mut t = LinkTable::default();
            for m in messages(&d) {
                if let Ok(Message::Link(l)) = m {
                    t.apply(&l);
                }
            }
        }
    }
}
