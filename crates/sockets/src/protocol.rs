//! The messages between the daemon and the helper: one short UTF-8 text
//! record per message on the `SOCK_SEQPACKET` socket (the record is the
//! framing, so there are no terminators or length prefixes), readable in
//! `strace`. Pure: no sockets, so every rule here is unit-tested and fuzzed.
//!
//! Requests, daemon to helper, at most [`MAX_REQUEST_BYTES`]:
//! - `PING` — is the helper alive?
//! - `RELOAD` — re-read the configuration file the helper was started with
//!   (never a configuration sent by the daemon: a compromised daemon must
//!   not be able to widen what it may obtain);
//! - `OPEN <flow>` — open the sockets of the flow with this exact name in the
//!   helper's own configuration (the name is the rest of the record; it may
//!   contain spaces but no control characters).
//!
//! Replies, helper to daemon, at most [`MAX_REPLY_BYTES`]:
//! - `PONG`;
//! - `RELOADED <flows>`;
//! - `SOCKETS <legs> <count>` — with the first `min(count, 253)` fds
//!   attached: per leg (input) in config order its ingress socket and,
//!   for a packet leg on a group, the socket holding its membership; then
//!   each output's socket in config order. `<legs>` says which: one item
//!   per leg, comma-separated, each the receive buffer the kernel granted
//!   its ingress socket, followed by `+m` when a membership socket comes
//!   with it (`4194304,8388608+m`), then by `+x` for an `ingress = "xdp"`
//!   leg, whose ingress fd is its AF_XDP socket and whose membership (if
//!   any) is followed by two more fds: the UMEM's memfd and the `bpf_link`
//!   holding its XDP program on the interface. When `count` exceeds what one message
//!   can carry, `MORE <n>` records follow, each with the next `n` fds;
//! - `REFUSED <reason>` — a request that was malformed or not allowed, or
//!   that failed; the connection stays usable.

use std::fmt;

/// Largest request the helper reads; anything longer is refused.
pub const MAX_REQUEST_BYTES: usize = 1024;
/// Largest reply; longer refusal reasons are cut to fit.
pub const MAX_REPLY_BYTES: usize = 4096;
/// Longest flow name a request can carry.
pub const MAX_FLOW_NAME_BYTES: usize = MAX_REQUEST_BYTES - OPEN.len();
// Every name a config accepts fits in a request.
const _: () = assert!(mcrelay_config::MAX_FLOW_NAME_BYTES <= MAX_FLOW_NAME_BYTES);

const PING: &str = "PING";
const RELOAD: &str = "RELOAD";
const OPEN: &str = "OPEN ";
const PONG: &str = "PONG";
const RELOADED: &str = "RELOADED ";
const SOCKETS: &str = "SOCKETS ";
const MORE: &str = "MORE ";
const REFUSED: &str = "REFUSED ";

/// What the daemon asks of the helper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Open the ingress socket and every output socket of the flow called
    /// `flow` in the helper's configuration.
    OpenFlow {
        /// The flow's name, exactly as in the configuration file.
        flow: String,
    },
    /// Re-read the configuration file the helper was started with.
    Reload,
    /// Answer `Pong`.
    Ping,
}

/// What the helper answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The flow's sockets: `count` fds (each leg's, then the outputs in
    /// config order), the first batch attached to this message and the rest
    /// to the [`Reply::MoreSockets`] messages that follow.
    Sockets {
        /// What each leg's fds are, in config order (1 to
        /// [`MAX_LEG_SOCKETS`] of them: the inputs, then their FEC and
        /// RIST sockets).
        legs: Vec<LegHeader>,
        /// Total fds, over this message and its continuations.
        count: usize,
        /// Outputs opened but not connected (no route or source address
        /// yet), by output index, with the errno; encoded as a third field
        /// `index:errno,...`, absent when empty.
        unconnected: Vec<(usize, i32)>,
        /// `egress = "xdp"` outputs: the last `2 × xdp_outputs` fds are
        /// their AF_XDP sockets and UMEM memfds (`count` includes them);
        /// encoded as `+x<n>` after the count, absent when 0.
        xdp_outputs: usize,
    },
    /// A continuation of [`Reply::Sockets`] carrying the next `count` fds.
    MoreSockets {
        /// Fds attached to this message.
        count: usize,
    },
    /// The configuration file was read again; it has `flows` flows.
    Reloaded {
        /// Flows in the newly loaded configuration.
        flows: usize,
    },
    /// Answer to `Ping`.
    Pong,
    /// The request was malformed, not allowed by the configuration, or
    /// failed; the reason says which and how to fix it.
    Refused(String),
}

/// One leg of a [`Reply::Sockets`]: its ingress fd, and whether a
/// membership socket follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LegHeader {
    /// `SO_RCVBUF` the kernel granted the leg's ingress socket.
    pub receive_buffer_bytes: usize,
    /// A packet leg on a group: the UDP socket holding its membership
    /// follows its ingress fd.
    pub membership: bool,
    /// An xdp leg: the UMEM memfd and the XDP program's link follow.
    pub xdp: bool,
}

impl LegHeader {
    /// Fds the leg takes in the reply: its ingress, its membership, and
    /// an xdp leg's UMEM and link.
    pub fn fds(&self) -> usize {
        1 + usize::from(self.membership) + 2 * usize::from(self.xdp)
    }
}

/// Why a message could not be decoded (or encoded).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// A zero-length message.
    #[error("empty message")]
    Empty,
    /// Longer than the limit.
    #[error("message is {len} bytes; the limit is {limit}")]
    TooLong {
        /// The message's length.
        len: usize,
        /// The limit for its direction.
        limit: usize,
    },
    /// Not UTF-8 text.
    #[error("message is not UTF-8 text")]
    NotUtf8,
    /// An unknown request or reply keyword.
    #[error("unknown message {0}; expected {1}")]
    Unknown(Shown, &'static str),
    /// `PING`/`RELOAD`/`PONG` with something after it.
    #[error("{0} takes no argument")]
    UnexpectedArgument(&'static str),
    /// `OPEN` without a name.
    #[error("OPEN needs a flow name: OPEN <flow>")]
    MissingFlowName,
    /// A flow name longer than [`MAX_FLOW_NAME_BYTES`].
    #[error("flow name is {0} bytes; the limit is {MAX_FLOW_NAME_BYTES}")]
    FlowNameTooLong(usize),
    /// A flow name with control characters (no configured flow has them).
    #[error("flow name {0} contains control characters")]
    ControlCharacters(Shown),
    /// A reply number that is not a plain decimal.
    #[error("{0} is not a decimal number")]
    BadNumber(Shown),
}

/// Untrusted text for an error message: escaped (`{:?}`) and cut to 64
/// characters, so a hostile peer cannot fill the log or forge lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shown(String);

impl Shown {
    fn new(text: &str) -> Self {
        const MAX: usize = 64;
        match text.char_indices().nth(MAX) {
            Some((cut, _)) => Shown(format!("{:?}...", &text[..cut])),
            None => Shown(format!("{text:?}")),
        }
    }
}

impl fmt::Display for Shown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn text(bytes: &[u8], limit: usize) -> Result<&str, ProtocolError> {
    if bytes.is_empty() {
        return Err(ProtocolError::Empty);
    }
    if bytes.len() > limit {
        return Err(ProtocolError::TooLong {
            len: bytes.len(),
            limit,
        });
    }
    std::str::from_utf8(bytes).map_err(|_| ProtocolError::NotUtf8)
}

fn check_flow_name(name: &str) -> Result<(), ProtocolError> {
    if name.is_empty() {
        return Err(ProtocolError::MissingFlowName);
    }
    if name.len() > MAX_FLOW_NAME_BYTES {
        return Err(ProtocolError::FlowNameTooLong(name.len()));
    }
    if name.chars().any(char::is_control) {
        return Err(ProtocolError::ControlCharacters(Shown::new(name)));
    }
    Ok(())
}

/// A plain decimal (digits only: no sign, no spaces) that fits a usize.
fn number(s: &str) -> Result<usize, ProtocolError> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ProtocolError::BadNumber(Shown::new(s)));
    }
    s.parse()
        .map_err(|_| ProtocolError::BadNumber(Shown::new(s)))
}

/// The leg list of a `SOCKETS` reply with no leg.
const NO_LEGS: &str = "-";

/// The most receive sockets a flow's inputs bring, each listed in a
/// `SOCKETS` reply: every input's own and, with `fec`, its two FEC
/// sockets (or with RIST its RTCP socket; an input has one or the
/// other). Was `MAX_LEGS`, so a flow with FEC on two inputs (six
/// sockets) was refused as a malformed reply and never started.
pub const MAX_LEG_SOCKETS: usize = 3 * mcrelay_config::MAX_LEGS;

/// `bytes[+m][+x],...` of a `SOCKETS` reply: no leg (`-`) or 1 to
/// [`MAX_LEG_SOCKETS`] legs.
fn leg_list(list: &str) -> Result<Vec<LegHeader>, ProtocolError> {
    // No leg the helper opens: a flow whose inputs are all SRT (the
    // daemon's own).
    if list == NO_LEGS {
        return Ok(Vec::new());
    }
    let legs = list
        .split(',')
        .take(MAX_LEG_SOCKETS + 1)
        .map(|item| {
            let (item, xdp) = match item.strip_suffix("+x") {
                Some(rest) => (rest, true),
                None => (item, false),
            };
            let (bytes, membership) = match item.strip_suffix("+m") {
                Some(bytes) => (bytes, true),
                None => (item, false),
            };
            Ok(LegHeader {
                receive_buffer_bytes: number(bytes)?,
                membership,
                xdp,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if legs.len() > MAX_LEG_SOCKETS {
        return Err(ProtocolError::BadNumber(Shown::new(list)));
    }
    Ok(legs)
}

/// `index:errno,index:errno...` of a `SOCKETS` reply (at most 256 items).
fn unconnected_list(list: &str) -> Result<Vec<(usize, i32)>, ProtocolError> {
    list.split(',')
        .take(256)
        .map(|item| {
            let (index, errno) = item
                .split_once(':')
                .ok_or_else(|| ProtocolError::BadNumber(Shown::new(item)))?;
            let errno = i32::try_from(number(errno)?)
                .map_err(|_| ProtocolError::BadNumber(Shown::new(errno)))?;
            Ok((number(index)?, errno))
        })
        .collect()
}

const REQUESTS: &str = "PING, RELOAD or OPEN <flow>";
const REPLIES: &str = "PONG, RELOADED, SOCKETS, MORE or REFUSED";

impl Request {
    /// Decode one request record. Never panics; every malformed input is an
    /// error the helper answers with `Refused`.
    pub fn decode(bytes: &[u8]) -> Result<Self, ProtocolError> {
        let s = text(bytes, MAX_REQUEST_BYTES)?;
        if let Some(name) = s.strip_prefix(OPEN) {
            check_flow_name(name)?;
            return Ok(Request::OpenFlow {
                flow: name.to_owned(),
            });
        }
        match s.split_once(' ') {
            None if s == PING => Ok(Request::Ping),
            None if s == RELOAD => Ok(Request::Reload),
            None if s == OPEN.trim_end() => Err(ProtocolError::MissingFlowName),
            Some((PING, _)) => Err(ProtocolError::UnexpectedArgument(PING)),
            Some((RELOAD, _)) => Err(ProtocolError::UnexpectedArgument(RELOAD)),
            _ => Err(ProtocolError::Unknown(Shown::new(s), REQUESTS)),
        }
    }

    /// Encode as one record; fails only for a flow name no request can
    /// carry (empty, too long, or with control characters).
    pub fn encode(&self) -> Result<Vec<u8>, ProtocolError> {
        Ok(match self {
            Request::Ping => PING.as_bytes().to_vec(),
            Request::Reload => RELOAD.as_bytes().to_vec(),
            Request::OpenFlow { flow } => {
                check_flow_name(flow)?;
                [OPEN.as_bytes(), flow.as_bytes()].concat()
            }
        })
    }
}

impl fmt::Display for Request {
    /// For logs: the flow name escaped and cut short.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Request::Ping => f.write_str("ping"),
            Request::Reload => f.write_str("reload"),
            Request::OpenFlow { flow } => write!(f, "open flow {}", Shown::new(flow)),
        }
    }
}

impl Reply {
    /// Decode one reply record. Never panics.
    pub fn decode(bytes: &[u8]) -> Result<Self, ProtocolError> {
        let s = text(bytes, MAX_REPLY_BYTES)?;
        if let Some(reason) = s.strip_prefix(REFUSED) {
            return Ok(Reply::Refused(reason.to_owned()));
        }
        if s == PONG {
            return Ok(Reply::Pong);
        }
        if let Some(n) = s.strip_prefix(RELOADED) {
            return Ok(Reply::Reloaded { flows: number(n)? });
        }
        if let Some(n) = s.strip_prefix(MORE) {
            return Ok(Reply::MoreSockets { count: number(n)? });
        }
        if let Some(rest) = s.strip_prefix(SOCKETS) {
            let (legs, count) = rest
                .split_once(' ')
                .ok_or_else(|| ProtocolError::Unknown(Shown::new(s), REPLIES))?;
            let (count, unconnected) = match count.split_once(' ') {
                Some((count, list)) => (count, unconnected_list(list)?),
                None => (count, Vec::new()),
            };
            let (count, xdp_outputs) = match count.split_once("+x") {
                Some((count, n)) => (count, number(n)?),
                None => (count, 0),
            };
            return Ok(Reply::Sockets {
                legs: leg_list(legs)?,
                count: number(count)?,
                unconnected,
                xdp_outputs,
            });
        }
        if s.starts_with(PONG) {
            return Err(ProtocolError::UnexpectedArgument(PONG));
        }
        Err(ProtocolError::Unknown(Shown::new(s), REPLIES))
    }

    /// Encode as one record of at most [`MAX_REPLY_BYTES`]; a longer
    /// refusal reason is cut (at a character boundary) to fit.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Reply::Pong => PONG.as_bytes().to_vec(),
            Reply::Reloaded { flows } => format!("{RELOADED}{flows}").into_bytes(),
            Reply::Sockets {
                legs,
                count,
                unconnected,
                xdp_outputs,
            } => {
                let mut text = SOCKETS.to_owned();
                if legs.is_empty() {
                    text.push_str(NO_LEGS);
                }
                for (i, leg) in legs.iter().enumerate() {
                    if i > 0 {
                        text.push(',');
                    }
                    text.push_str(&leg.receive_buffer_bytes.to_string());
                    if leg.membership {
                        text.push_str("+m");
                    }
                    if leg.xdp {
                        text.push_str("+x");
                    }
                }
                text.push_str(&format!(" {count}"));
                if *xdp_outputs > 0 {
                    text.push_str(&format!("+x{xdp_outputs}"));
                }
                for (i, (index, errno)) in unconnected.iter().enumerate() {
                    text.push(if i == 0 { ' ' } else { ',' });
                    text.push_str(&format!("{index}:{errno}"));
                }
                text.into_bytes()
            }
            Reply::MoreSockets { count } => format!("{MORE}{count}").into_bytes(),
            Reply::Refused(reason) => {
                let room = MAX_REPLY_BYTES - REFUSED.len();
                let mut cut = reason.len().min(room);
                while !reason.is_char_boundary(cut) {
                    cut -= 1;
                }
                [REFUSED.as_bytes(), &reason.as_bytes()[..cut]].concat()
            }
        }
    }
}

/// Fuzz entry point for request decoding: decodes `data` as a request, and
/// checks the codec's invariants — a decoded request re-encodes within the
/// size limit and decodes to itself; a refusal of it encodes and decodes.
/// Panics only when one of those invariants is broken (a bug for the
/// fuzzer to find), never on any input by itself.
pub fn fuzz_request(data: &[u8]) {
    match Request::decode(data) {
        Ok(request) => {
            let bytes = request.encode();
            assert!(bytes.is_ok(), "decoded {request:?} does not encode");
            let bytes = bytes.unwrap_or_default();
            assert!(bytes.len() <= MAX_REQUEST_BYTES);
            assert_eq!(Request::decode(&bytes), Ok(request));
        }
        Err(e) => {
            let reply = Reply::Refused(format!("malformed request: {e}"));
            let bytes = reply.encode();
            assert!(bytes.len() <= MAX_REPLY_BYTES);
            assert!(matches!(Reply::decode(&bytes), Ok(Reply::Refused(_))));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn requests_round_trip() {
        for (request, wire) in [
            (Request::Ping, "PING"),
            (Request::Reload, "RELOAD"),
            (
                Request::OpenFlow {
                    flow: "camera-1".into(),
                },
                "OPEN camera-1",
            ),
            (
                Request::OpenFlow {
                    flow: "a flow with spaces ✓".into(),
                },
                "OPEN a flow with spaces ✓",
            ),
        ] {
            assert_eq!(request.encode().expect("encode"), wire.as_bytes());
            assert_eq!(Request::decode(wire.as_bytes()), Ok(request));
        }
    }

    fn leg(receive_buffer_bytes: usize, membership: bool) -> LegHeader {
        LegHeader {
            receive_buffer_bytes,
            membership,
            xdp: false,
        }
    }

    #[test]
    fn an_xdp_leg_round_trips() {
        let reply = Reply::Sockets {
            legs: vec![
                LegHeader {
                    receive_buffer_bytes: 0,
                    membership: true,
                    xdp: true,
                },
                leg(4096, false),
            ],
            count: 5,
            unconnected: vec![],
            xdp_outputs: 0,
        };
        let text = reply.encode();
        assert_eq!(String::from_utf8_lossy(&text), "SOCKETS 0+m+x,4096 5");
        assert_eq!(Reply::decode(&text).expect("decode"), reply);
        let Reply::Sockets { legs, .. } = reply else {
            unreachable!()
        };
        assert_eq!(legs[0].fds(), 4);
    }

    #[test]
    fn leg_lists_are_bounded_and_strict() {
        for bad in [
            "SOCKETS 1,2,3,4,5,6,7,8,9,10,11,12,13 19",
            "SOCKETS ,1 3",
            "SOCKETS 1+q 3",
            "SOCKETS 1+x+m 3",
            "SOCKETS +x 3",
            "SOCKETS +m 3",
            "SOCKETS 1,,2 3",
        ] {
            assert!(
                matches!(
                    Reply::decode(bad.as_bytes()),
                    Err(ProtocolError::BadNumber(_))
                ),
                "{bad}"
            );
        }
        assert_eq!(leg(1, true).fds(), 2);
        assert_eq!(leg(1, false).fds(), 1);
        // Two inputs with FEC: their own sockets, then two FEC sockets
        // each (a flow the daemon used to refuse as a malformed reply).
        let six = "SOCKETS 4194304,4194304,4194304,4194304,4194304,4194304 7";
        match Reply::decode(six.as_bytes()) {
            Ok(Reply::Sockets { legs, count, .. }) => {
                assert_eq!((legs.len(), count), (6, 7));
            }
            other => panic!("{other:?}"),
        }
        let twelve = ["1"; MAX_LEG_SOCKETS].join(",");
        assert!(Reply::decode(format!("SOCKETS {twelve} 13").as_bytes()).is_ok());
    }

    #[test]
    fn replies_round_trip() {
        for (reply, wire) in [
            (Reply::Pong, "PONG"),
            (Reply::Reloaded { flows: 3 }, "RELOADED 3"),
            (
                Reply::Sockets {
                    legs: vec![leg(4_194_304, false)],
                    count: 3,
                    unconnected: vec![],
                    xdp_outputs: 0,
                },
                "SOCKETS 4194304 3",
            ),
            (
                Reply::Sockets {
                    legs: vec![],
                    count: 1,
                    unconnected: vec![],
                    xdp_outputs: 0,
                },
                "SOCKETS - 1",
            ),
            (
                Reply::Sockets {
                    legs: vec![leg(4096, false)],
                    count: 4,
                    unconnected: vec![(1, 101), (2, 99)],
                    xdp_outputs: 0,
                },
                "SOCKETS 4096 4 1:101,2:99",
            ),
            (
                Reply::Sockets {
                    legs: vec![leg(4096, false)],
                    count: 5,
                    unconnected: vec![(0, 101)],
                    xdp_outputs: 2,
                },
                "SOCKETS 4096 5+x2 0:101",
            ),
            (
                Reply::Sockets {
                    legs: vec![leg(4096, false), leg(8192, true)],
                    count: 5,
                    unconnected: vec![(0, 101)],
                    xdp_outputs: 0,
                },
                "SOCKETS 4096,8192+m 5 0:101",
            ),
            (Reply::MoreSockets { count: 253 }, "MORE 253"),
            (
                Reply::Refused("no flow named \"x\"\nsecond line".into()),
                "REFUSED no flow named \"x\"\nsecond line",
            ),
            (Reply::Refused(String::new()), "REFUSED "),
        ] {
            assert_eq!(reply.encode(), wire.as_bytes());
            assert_eq!(Reply::decode(wire.as_bytes()), Ok(reply));
        }
    }

    #[test]
    fn malformed_requests_are_errors() {
        let long = vec![b'a'; MAX_REQUEST_BYTES + 1];
        let cases: [(&[u8], &str); 12] = [
            (b"", "empty message"),
            (&long, "1025 bytes; the limit is 1024"),
            (b"PING\xff", "not UTF-8"),
            (b"ping", "unknown message \"ping\""),
            (b"PING ", "PING takes no argument"),
            (b"RELOAD now", "RELOAD takes no argument"),
            (b"OPEN", "OPEN needs a flow name"),
            (b"OPEN ", "OPEN needs a flow name"),
            (b"OPEN a\nb", "control characters"),
            (b"OPEN a\0", "control characters"),
            (b"OPENx", "unknown message"),
            (b" PING", "unknown message"),
        ];
        for (bytes, message) in cases {
            let e = Request::decode(bytes).expect_err("malformed");
            assert!(e.to_string().contains(message), "{bytes:?}: {e}");
        }
        // The longest name fits exactly.
        let name = "n".repeat(MAX_FLOW_NAME_BYTES);
        let r = Request::OpenFlow { flow: name.clone() };
        assert_eq!(r.encode().expect("fits").len(), MAX_REQUEST_BYTES);
        let r = Request::OpenFlow { flow: name + "n" };
        assert!(matches!(r.encode(), Err(ProtocolError::FlowNameTooLong(_))));
    }

    #[test]
    fn malformed_replies_are_errors() {
        for bytes in [
            &b""[..],
            b"PONG ",
            b"RELOADED",
            b"RELOADED -1",
            b"RELOADED +1",
            b"RELOADED 99999999999999999999999",
            b"SOCKETS 1",
            b"SOCKETS 1 2 3",
            b"SOCKETS x 2",
            b"MORE",
            b"REFUSED",
            b"\xc3",
        ] {
            assert!(Reply::decode(bytes).is_err(), "{bytes:?}");
        }
    }

    #[test]
    fn long_refusals_are_cut_at_a_char_boundary() {
        let reason = "é".repeat(MAX_REPLY_BYTES);
        let bytes = Reply::Refused(reason).encode();
        assert!(bytes.len() <= MAX_REPLY_BYTES);
        assert!(bytes.len() >= MAX_REPLY_BYTES - 1);
        assert!(matches!(Reply::decode(&bytes), Ok(Reply::Refused(_))));
    }

    #[test]
    fn errors_show_untrusted_text_escaped_and_short() {
        let hostile = format!("X\n{}", "y".repeat(500));
        let e = Request::decode(hostile.as_bytes()).expect_err("unknown");
        let shown = e.to_string();
        assert!(!shown.contains('\n'), "{shown}");
        assert!(shown.len() < 160, "{shown}");
    }

    fn request() -> impl Strategy<Value = Request> {
        prop_oneof![
            Just(Request::Ping),
            Just(Request::Reload),
            "[^\\p{Cc}]{1,200}".prop_map(|flow| Request::OpenFlow { flow }),
        ]
    }

    fn reply() -> impl Strategy<Value = Reply> {
        prop_oneof![
            Just(Reply::Pong),
            any::<usize>().prop_map(|flows| Reply::Reloaded { flows }),
            (
                proptest::collection::vec((any::<usize>(), any::<bool>(), any::<bool>()), 0..=4),
                any::<usize>(),
                proptest::collection::vec((any::<usize>(), 0..i32::MAX), 0..8),
                0usize..4
            )
                .prop_map(|(legs, count, unconnected, xdp_outputs)| Reply::Sockets {
                    legs: legs
                        .into_iter()
                        .map(|(receive_buffer_bytes, membership, xdp)| LegHeader {
                            receive_buffer_bytes,
                            membership,
                            xdp,
                        })
                        .collect(),
                    count,
                    unconnected,
                    xdp_outputs,
                }),
            any::<usize>().prop_map(|count| Reply::MoreSockets { count }),
            ".{0,300}".prop_map(Reply::Refused),
        ]
    }

    proptest! {
        #[test]
        fn any_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..1100)) {
            fuzz_request(&data);
            let _ = Reply::decode(&data);
        }

        #[test]
        fn keyword_prefixed_bytes_never_panic(
            head in prop_oneof![Just("OPEN "), Just("PING"), Just("RELOAD"), Just("")],
            tail in ".{0,64}",
        ) {
            fuzz_request(format!("{head}{tail}").as_bytes());
        }

        #[test]
        fn valid_requests_round_trip(r in request()) {
            let bytes = r.encode().expect("valid");
            prop_assert_eq!(Request::decode(&bytes), Ok(r));
        }

        #[test]
        fn valid_replies_round_trip(r in reply()) {
            prop_assert_eq!(Reply::decode(&r.encode()), Ok(r));
        }
    }
}
