//! An output with `protocol = "srt"`: an SRT listener that many callers
//! connect to, or an SRT caller that connects out (see
//! [`crate::model::SrtOutput`]); an input with it: one SRT connection,
//! as listener (one caller at a time) or caller, whose datagrams feed the
//! flow (see [`crate::model::SrtInput`]). The daemon opens SRT sockets without
//! privileges, so a listener's port must be 1024 or above.

use std::collections::HashMap;
use std::fmt::Display;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::Range;

use toml::de::DeTable;

use super::{Dotted, Indexed, SrtSide, Walker};
use crate::model::*;

/// Keys only an SRT output takes.
pub(super) const SRT_ONLY_KEYS: &[&str] = &[
    "mode",
    "latency_ms",
    "passphrase",
    "key_length",
    "max_callers",
    "stream_id",
];
/// Keys only a UDP input takes.
const UDP_ONLY_INPUT_KEYS: &[&str] = &[
    "interface",
    "source",
    "ingress",
    "receive_buffer_bytes",
    "fec",
    "buffer_ms",
];
/// Keys only a UDP output takes.
const UDP_ONLY_KEYS: &[&str] = &[
    "interface",
    "ttl",
    "source_address",
    "queue_depth",
    "buffer_ms",
];
/// libsrt's longest stream ID.
const MAX_STREAM_ID: usize = 512;

impl Walker<'_> {
    /// The `protocol` of the output or input at `at`: `Some(true)` for
    /// `"srt"`, `Some(false)` for `"udp"` or absent, `None` (with an
    /// error) otherwise.
    pub(super) fn is_srt(
        &mut self,
        t: &DeTable<'_>,
        p: &str,
        at: impl Display + Copy,
    ) -> Option<bool> {
        let Some(v) = t.get("protocol") else {
            return Some(false);
        };
        match self.string(v, p, Dotted(at, "protocol"))? {
            "udp" | "rist" => Some(false),
            "srt" => Some(true),
            other => {
                self.err(
                    &v.span(),
                    format!(
                        "{p}{at}.protocol {other:?} is not known; use \"udp\", \"rist\" or \"srt\""
                    ),
                );
                None
            }
        }
    }

    /// Refuses the SRT keys on a UDP output or input (`what`) at `at`.
    pub(super) fn no_srt_keys(
        &mut self,
        t: &DeTable<'_>,
        p: &str,
        at: impl Display + Copy,
        what: &str,
    ) -> bool {
        let mut ok = true;
        for (k, _) in t.iter() {
            let k_str: &str = k.get_ref().as_ref();
            if SRT_ONLY_KEYS.contains(&k_str) {
                self.err(
                    &k.span(),
                    format!("{p}{at}.{k_str} is only for an SRT {what}; add protocol = \"srt\" or remove it"),
                );
                ok = false;
            }
        }
        ok
    }

    /// An SRT input (`input` or a leg of `inputs`, at `at`; its table
    /// `t`, written at `span`): one SRT connection feeding the flow.
    pub(super) fn srt_input(
        &mut self,
        t: &DeTable<'_>,
        span: &Range<usize>,
        p: &str,
        at: &str,
    ) -> Option<Input> {
        let mut ok = true;
        for (k, _) in t.iter() {
            let k_str: &str = k.get_ref().as_ref();
            if UDP_ONLY_INPUT_KEYS.contains(&k_str) {
                self.err(
                    &k.span(),
                    format!("{p}{at}.{k_str} does not apply to an SRT input (it binds or calls address:port); remove it"),
                );
                ok = false;
            }
        }
        let link = self.srt_link(t, span, p, at, "input");
        let (Some(l), true) = (link, ok) else {
            return None;
        };
        Some(Input {
            interface: String::new(),
            address: l.address,
            port: l.port,
            source: None,
            ingress: IngressKind::Socket,
            receive_buffer_bytes: DEFAULT_RECEIVE_BUFFER_BYTES,
            fec: None,
            rist: None,
            srt: Some(SrtInput {
                mode: l.mode,
                latency_ms: l.latency_ms,
                passphrase: l.passphrase,
                key_length: l.key_length,
                stream_id: l.stream_id,
            }),
        })
    }

    /// An SRT output (its table `t`, written at `span`).
    pub(super) fn srt_output(
        &mut self,
        t: &DeTable<'_>,
        span: &Range<usize>,
        p: &str,
        i: usize,
    ) -> Option<Output> {
        let at = Indexed("outputs", i);
        let path = |key: &'static str| Dotted(at, key);
        let mut ok = true;
        for (k, _) in t.iter() {
            let k_str: &str = k.get_ref().as_ref();
            if UDP_ONLY_KEYS.contains(&k_str) {
                self.err(
                    &k.span(),
                    format!("{p}outputs[{i}].{k_str} does not apply to an SRT output (it binds or calls address:port); remove it"),
                );
                ok = false;
            }
        }
        let link = self.srt_link(t, span, p, at, "output");
        let mode = link.as_ref().map_or(SrtMode::Listener, |l| l.mode);
        let mut max_callers = DEFAULT_SRT_MAX_CALLERS;
        if let Some(v) = t.get("max_callers") {
            if mode == SrtMode::Caller {
                self.err(
                    &v.span(),
                    format!(
                        "{p}{} is only for mode = \"listener\"; remove it",
                        path("max_callers")
                    ),
                );
                ok = false;
            } else {
                match self.ranged(
                    v,
                    p,
                    path("max_callers"),
                    1,
                    i128::from(MAX_SRT_MAX_CALLERS),
                ) {
                    Some(n) => max_callers = u32::try_from(n).unwrap_or(DEFAULT_SRT_MAX_CALLERS),
                    None => ok = false,
                }
            }
        }
        let (Some(l), true) = (link, ok) else {
            return None;
        };
        Some(Output {
            egress: Default::default(),
            interface: String::new(),
            address: l.address,
            port: l.port,
            ttl: DEFAULT_UNICAST_TTL,
            source_address: None,
            queue_depth: DEFAULT_OUTPUT_QUEUE_DEPTH,
            fec: None,
            rist: None,
            srt: Some(SrtOutput {
                mode: l.mode,
                latency_ms: l.latency_ms,
                passphrase: l.passphrase,
                key_length: l.key_length,
                max_callers,
                stream_id: l.stream_id,
            }),
        })
    }

    /// What an SRT output and an SRT input share: `mode`, `address`,
    /// `port`, `latency_ms`, `passphrase`, `key_length`, `stream_id` of
    /// the table `t` at `at` (an `output` or an `input`, for messages).
    /// `None` after reporting any error.
    pub(super) fn srt_link(
        &mut self,
        t: &DeTable<'_>,
        span: &Range<usize>,
        p: &str,
        at: impl Display + Copy,
        what: &str,
    ) -> Option<SrtLink> {
        let path = |key: &'static str| Dotted(at, key);
        let mut ok = true;
        let mode = match t.get("mode") {
            None => SrtMode::Listener,
            Some(v) => match self.string(v, p, path("mode")) {
                Some("listener") => SrtMode::Listener,
                Some("caller") => SrtMode::Caller,
                Some(other) => {
                    self.err(
                        &v.span(),
                        format!(
                            "{p}{} {other:?} is not known; use \"listener\" or \"caller\"",
                            path("mode")
                        ),
                    );
                    ok = false;
                    SrtMode::Listener
                }
                None => {
                    ok = false;
                    SrtMode::Listener
                }
            },
        };
        let address = match t.get("address") {
            Some(v) => {
                match self.ip(v, p, path("address")) {
                    Some(a) if a.is_multicast() => {
                        self.err(&v.span(), format!("{p}{} {a} is a multicast group; an SRT {what} needs a unicast address", path("address")));
                        None
                    }
                    Some(a) if a.is_unspecified() && mode == SrtMode::Caller => {
                        self.err(
                            &v.span(),
                            format!(
                                "{p}{} {a} is unspecified; a caller needs the listener's address",
                                path("address")
                            ),
                        );
                        None
                    }
                    a => a,
                }
            }
            None => {
                let example = if mode == SrtMode::Listener {
                    "\"0.0.0.0\""
                } else {
                    "\"192.0.2.10\""
                };
                self.missing(span, p, path("address"), "address", example);
                None
            }
        };
        let port = match t.get("port") {
            Some(v) => match self.port(v, p, path("port")) {
                Some(n) if n < 1024 && mode == SrtMode::Listener => {
                    self.err(&v.span(), format!("{p}{} {n} is a privileged port; the daemon opens SRT listeners without privileges, use 1024-65535", path("port")));
                    None
                }
                n => n,
            },
            None => {
                self.missing(span, p, path("port"), "port", "9000");
                None
            }
        };
        let mut latency_ms = DEFAULT_SRT_LATENCY_MS;
        if let Some(v) = t.get("latency_ms") {
            match self.ranged(v, p, path("latency_ms"), 0, i128::from(MAX_SRT_LATENCY_MS)) {
                Some(n) => latency_ms = u32::try_from(n).unwrap_or(DEFAULT_SRT_LATENCY_MS),
                None => ok = false,
            }
        }
        let mut passphrase = None;
        if let Some(v) = t.get("passphrase") {
            match self.string(v, p, path("passphrase")) {
                Some(s) if (10..=79).contains(&s.chars().count()) && s.is_ascii() => {
                    passphrase = Some(s.to_owned());
                }
                Some(_) => {
                    // The passphrase itself is never echoed.
                    self.err(
                        &v.span(),
                        format!(
                            "{p}{} must be 10 to 79 ASCII characters (SRT's limits)",
                            path("passphrase")
                        ),
                    );
                    ok = false;
                }
                None => ok = false,
            }
        }
        let mut key_length = DEFAULT_SRT_KEY_LENGTH;
        if let Some(v) = t.get("key_length") {
            match self.int(v, p, path("key_length")) {
                Some((n @ (16 | 24 | 32), _)) if passphrase.is_some() => {
                    key_length = u8::try_from(n).unwrap_or(DEFAULT_SRT_KEY_LENGTH);
                }
                Some((16 | 24 | 32, _)) => {
                    self.err(
                        &v.span(),
                        format!(
                            "{p}{} needs a passphrase; add passphrase or remove key_length",
                            path("key_length")
                        ),
                    );
                    ok = false;
                }
                Some((_, text)) => {
                    let msg = format!(
                        "{p}{} {text} is not an AES key length; use 16, 24 or 32 (bytes)",
                        path("key_length")
                    );
                    self.err(&v.span(), msg);
                    ok = false;
                }
                None => ok = false,
            }
        }
        let mut stream_id = None;
        if let Some(v) = t.get("stream_id") {
            match self.string(v, p, path("stream_id")) {
                Some("") => {
                    self.err(
                        &v.span(),
                        format!(
                            "{p}{} is empty; remove it or give a name",
                            path("stream_id")
                        ),
                    );
                    ok = false;
                }
                Some(s) if s.len() > MAX_STREAM_ID || s.chars().any(char::is_control) => {
                    self.err(&v.span(), format!("{p}{} must be at most {MAX_STREAM_ID} bytes without control characters", path("stream_id")));
                    ok = false;
                }
                Some(s) => stream_id = Some(s.to_owned()),
                None => ok = false,
            }
        }
        let (Some(address), Some(port), true) = (address, port, ok) else {
            return None;
        };
        Some(SrtLink {
            mode,
            address,
            port,
            latency_ms,
            passphrase,
            key_length,
            stream_id,
        })
    }
}

/// Every SRT listener of the file so far (inputs and outputs, every
/// flow) and every port a UDP input holds (its own; a RIST input's RTCP
/// port, + 1; a 2022-1 FEC input's + 2 and + 4), by port, to find an SRT
/// listener that can't be opened beside them:
///
/// - One `address:port` is one libsrt listener (its flows told apart by
///   stream ID); two listeners on one port whose addresses overlap (a
///   wildcard and an address it covers, or one address written two ways)
///   are two UDP sockets the kernel refuses to bind beside each other.
/// - libsrt binds its UDP socket without `SO_REUSEADDR`, so the kernel
///   binds no other UDP socket on its port whose address overlaps its own
///   (the same address, or either a wildcard covering the other): a
///   `ingress = "socket"` input there (bound with `SO_REUSEADDR`) fails to
///   bind, whichever comes first. Tried in a namespace: a socket bound to
///   239.1.1.1:9000 and a listener on 0.0.0.0:9000 (or `::`) refuse each
///   other with `EADDRINUSE`; a listener on a unicast address beside it,
///   or on 0.0.0.0 beside an IPv6 group (bound `IPV6_V6ONLY`), is fine.
/// - An `ingress = "packet"` or `"xdp"` input binds no port: beside a
///   group it clashes with nothing (a wildcard listener receives the
///   group's datagrams too, which libsrt discards as no connection's), but
///   on a unicast address its filter matches the datagrams the SRT
///   callers send to that address and port: the packet socket would relay
///   them as the flow's stream, the XDP program would take them from the
///   listener.
///
/// Without this check each of these would only show when the daemon opens
/// the second socket.
#[derive(Default)]
pub(super) struct ListenerBinds(HashMap<u16, Vec<Bind>>);

/// A port held by flow `flow` on `address`.
struct Bind {
    address: IpAddr,
    flow: String,
    holder: Holder,
}

enum Holder {
    /// An SRT listener, input or output.
    Srt(SrtSide),
    /// A UDP input's port: the input's interface, address, port and
    /// source as written (for messages), how it receives, and which of
    /// its ports this is.
    Udp {
        interface: String,
        port: u16,
        source: Option<IpAddr>,
        ingress: IngressKind,
        role: UdpRole,
    },
}

/// Which port of a UDP input.
#[derive(Clone, Copy)]
enum UdpRole {
    Stream,
    RistRtcp,
    FecColumn,
    FecRow,
}

impl Holder {
    /// The holder of `address:port` as an error names it: `SRT listener
    /// 0.0.0.0:9000 (an output)`, `input eth0 239.1.1.1:5000 from
    /// 10.1.1.1`, `input eth0 239.1.1.1:5000 (its RIST RTCP port 5001)`.
    fn describe(&self, address: IpAddr, port: u16) -> String {
        match self {
            Holder::Srt(side) => format!(
                "SRT listener {} ({})",
                SocketAddr::new(address, port),
                match side {
                    SrtSide::Input => "an input",
                    SrtSide::Output => "an output",
                }
            ),
            Holder::Udp {
                interface,
                port: base,
                source,
                role,
                ..
            } => {
                let mut s = format!("input {interface} {}", SocketAddr::new(address, *base));
                if let Some(source) = source {
                    s.push_str(&format!(" from {source}"));
                }
                let extra = match role {
                    UdpRole::Stream => None,
                    UdpRole::RistRtcp => Some("RIST RTCP port"),
                    UdpRole::FecColumn => Some("2022-1 column FEC port"),
                    UdpRole::FecRow => Some("2022-1 row FEC port"),
                };
                if let Some(what) = extra {
                    s.push_str(&format!(" (its {what} {port})"));
                }
                s
            }
        }
    }
}

impl ListenerBinds {
    /// Records flow `name`'s SRT listener `(address, port)` on `side`;
    /// the error, when it clashes with a listener or a UDP input's port
    /// recorded before.
    pub(super) fn add(
        &mut self,
        name: &str,
        address: IpAddr,
        port: u16,
        side: SrtSide,
    ) -> Option<String> {
        let binds = self.0.entry(port).or_default();
        let clash = binds.iter().find_map(|b| {
            let why = match &b.holder {
                // One address written alike is one listener.
                Holder::Srt(_) => (b.address != address)
                    .then(|| overlap(b.address, address))
                    .flatten(),
                Holder::Udp { ingress, .. } => udp_clash(address, b.address, *ingress),
            };
            why.map(|why| (b, why))
        });
        let msg = clash.map(|(b, why)| {
            let here = Holder::Srt(side).describe(address, port);
            let there = b.holder.describe(b.address, port);
            let whose = whose(&b.flow, name);
            let hint = match b.holder {
                Holder::Srt(_) => "write one address for both (one listener serves several flows, told apart by stream_id) or use another port".to_owned(),
                Holder::Udp { .. } => fix(address, b.address),
            };
            format!("flow {name:?}: {here} can't be opened beside {whose} {there}: {why}; {hint}")
        });
        binds.push(Bind {
            address,
            flow: name.to_owned(),
            holder: Holder::Srt(side),
        });
        msg
    }

    /// Records the ports UDP input `input` of flow `name` holds (none
    /// for an SRT input); an error for each that clashes with an SRT
    /// listener recorded before.
    pub(super) fn add_input(&mut self, name: &str, input: &Input) -> Vec<String> {
        if input.srt.is_some() {
            return Vec::new();
        }
        let fec = input.fec == Some(InputFec::Smpte2022_1);
        let roles = [
            (0, UdpRole::Stream, true),
            (1, UdpRole::RistRtcp, input.rist.is_some()),
            (2, UdpRole::FecColumn, fec),
            (4, UdpRole::FecRow, fec),
        ];
        let mut errors = Vec::new();
        for (offset, role, _) in roles.into_iter().filter(|r| r.2) {
            let port = input.port.saturating_add(offset);
            let holder = Holder::Udp {
                interface: input.interface.clone(),
                port: input.port,
                source: input.source,
                ingress: input.ingress,
                role,
            };
            let binds = self.0.entry(port).or_default();
            let clash = binds.iter().find_map(|b| match b.holder {
                Holder::Srt(_) => {
                    udp_clash(b.address, input.address, input.ingress).map(|why| (b, why))
                }
                // Two inputs on one port: the flows' own rules.
                Holder::Udp { .. } => None,
            });
            if let Some((b, why)) = clash {
                let here = holder.describe(input.address, port);
                let there = b.holder.describe(b.address, port);
                let whose = whose(&b.flow, name);
                errors.push(format!(
                    "flow {name:?}: {here} can't be opened beside {whose} {there}: {why}; {}",
                    fix(b.address, input.address)
                ));
            }
            binds.push(Bind {
                address: input.address,
                flow: name.to_owned(),
                holder,
            });
        }
        errors
    }
}

/// `this flow's` or `flow "a"'s`, for the owner `other` of what flow
/// `name` clashes with.
fn whose(other: &str, name: &str) -> String {
    if other == name {
        "this flow's".to_owned()
    } else {
        format!("flow {other:?}'s")
    }
}

/// How to part an SRT listener on `srt` and a UDP input on `input` that
/// share a port.
fn fix(srt: IpAddr, input: IpAddr) -> String {
    if srt.to_canonical().is_unspecified() && srt.to_canonical() != input.to_canonical() {
        format!(
            "bind the SRT listener to a unicast address of this host (not {input}) or use another port for one of them"
        )
    } else {
        "use another port for one of them".to_owned()
    }
}

/// Why an SRT listener on `srt` and a UDP input on `input` (received as
/// `ingress`) can't share a port, or `None` when they can (see
/// [`ListenerBinds`]). The listener's `::` is dual-stack (the daemon sets
/// `IPV6_V6ONLY` off, see `mcrelay_srt`); an input's IPv6 socket is
/// `IPV6_V6ONLY`, and an input's address is never a wildcard.
fn udp_clash(srt: IpAddr, input: IpAddr, ingress: IngressKind) -> Option<String> {
    let (s, i) = (srt.to_canonical(), input.to_canonical());
    let covered = if s == i {
        Some(if srt == input {
            format!("both are on {srt}")
        } else {
            format!("{srt} and {input} are one address written two ways")
        })
    } else if matches!(srt, IpAddr::V6(v6) if v6.is_unspecified()) {
        Some(format!(
            "{srt} holds the port on every address, IPv4 included"
        ))
    } else if s == IpAddr::V4(Ipv4Addr::UNSPECIFIED) && i.is_ipv4() {
        Some(format!("{srt} holds the port on every IPv4 address"))
    } else {
        None
    }?;
    match ingress {
        IngressKind::Socket => Some(format!(
            "{covered}, and the kernel binds no other socket over an SRT listener's (libsrt sets no SO_REUSEADDR)"
        )),
        // No port bound: a group's datagrams reach the listener too, and
        // libsrt discards them; nothing clashes.
        _ if i.is_multicast() => None,
        IngressKind::Packet => Some(format!(
            "{covered}, and the input's packet filter (ingress = \"packet\") would relay the SRT callers' datagrams to that port as the flow's stream"
        )),
        IngressKind::Xdp => Some(format!(
            "{covered}, and the input's XDP program (ingress = \"xdp\") would take the SRT callers' datagrams to that port from the listener"
        )),
    }
}

/// Why UDP sockets bound to `a` and to `b` (distinct as written) on one
/// port clash, or `None` when they don't (two distinct unicast addresses).
/// `::` is taken as dual-stack (the daemon sets `IPV6_V6ONLY` off on an
/// SRT listener on `::`): it holds the port on every address.
fn overlap(a: IpAddr, b: IpAddr) -> Option<String> {
    let (ca, cb) = (a.to_canonical(), b.to_canonical());
    if ca == cb {
        return Some(format!("{a} and {b} are one address written two ways"));
    }
    for (w, other) in [(a, cb), (b, ca)] {
        match w {
            IpAddr::V6(v6) if v6.is_unspecified() => {
                return Some(format!(
                    "{w} holds the port on every address, IPv4 included"
                ));
            }
            _ if w.to_canonical() == IpAddr::V4(Ipv4Addr::UNSPECIFIED) && other.is_ipv4() => {
                return Some(format!("{w} holds the port on every IPv4 address"));
            }
            _ => {}
        }
    }
    None
}

/// The settings an SRT output and an SRT input share.
pub(super) struct SrtLink {
    pub mode: SrtMode,
    pub address: std::net::IpAddr,
    pub port: u16,
    pub latency_ms: u32,
    pub passphrase: Option<String>,
    pub key_length: u8,
    pub stream_id: Option<String>,
}

#[cfg(test)]
mod tests {
    use crate::model::*;
    use crate::parse::parse;
    use crate::parse::tests::error;

    fn flow(outputs: &str) -> String {
        format!(
            "[[flow]]\nname = \"x\"\ninput = {{ interface = \"eth0\", address = \"239.1.1.1\", port = 5000 }}\noutputs = [{outputs}]\n"
        )
    }

    #[test]
    fn listener_defaults_and_every_key() {
        let c = parse(
            &flow(r#"{ protocol = "srt", address = "0.0.0.0", port = 9000 }"#),
            "t.toml",
        )
        .expect("valid");
        let o = &c.flows.by_name("x").expect("x").outputs[0];
        assert_eq!(o.interface, "");
        assert_eq!(
            o.srt,
            Some(SrtOutput {
                mode: SrtMode::Listener,
                latency_ms: 120,
                passphrase: None,
                key_length: 16,
                max_callers: 16,
                stream_id: None,
            })
        );
        let c = parse(
            &flow(
                r#"{ protocol = "srt", mode = "listener", address = "10.0.0.1", port = 9000, latency_ms = 200, passphrase = "0123456789abc", key_length = 32, max_callers = 40, stream_id = "cam-1" }"#,
            ),
            "t.toml",
        )
        .expect("valid");
        let s = c.flows.by_name("x").expect("x").outputs[0]
            .srt
            .clone()
            .expect("srt");
        assert_eq!(
            (
                s.latency_ms,
                s.key_length,
                s.max_callers,
                s.stream_id.as_deref()
            ),
            (200, 32, 40, Some("cam-1"))
        );
        assert_eq!(s.passphrase.as_deref(), Some("0123456789abc"));
        // The passphrase never shows in Debug.
        assert!(!format!("{s:?}").contains("0123456789abc"));
        let c = parse(
            &flow(r#"{ protocol = "srt", mode = "caller", address = "192.0.2.1", port = 80 }"#),
            "t.toml",
        )
        .expect("a caller may call a low port");
        assert_eq!(
            c.flows.by_name("x").expect("x").outputs[0]
                .srt
                .as_ref()
                .map(|s| s.mode),
            Some(SrtMode::Caller)
        );
    }

    #[test]
    fn srt_errors_name_the_field_and_the_fix() {
        let cases = [
            (
                r#"{ protocol = "zixi", address = "0.0.0.0", port = 9000 }"#,
                "outputs[0].protocol \"zixi\" is not known; use \"udp\", \"rist\" or \"srt\"",
            ),
            (
                r#"{ protocol = "srt", address = "0.0.0.0", port = 900 }"#,
                "outputs[0].port 900 is a privileged port; the daemon opens SRT listeners without privileges, use 1024-65535",
            ),
            (
                r#"{ protocol = "srt", interface = "eth1", address = "0.0.0.0", port = 9000 }"#,
                "outputs[0].interface does not apply to an SRT output",
            ),
            (
                r#"{ protocol = "srt", address = "0.0.0.0", port = 9000, passphrase = "short" }"#,
                "outputs[0].passphrase must be 10 to 79 ASCII characters",
            ),
            (
                r#"{ protocol = "srt", address = "0.0.0.0", port = 9000, key_length = 32 }"#,
                "outputs[0].key_length needs a passphrase",
            ),
            (
                r#"{ protocol = "srt", address = "0.0.0.0", port = 9000, passphrase = "0123456789", key_length = 20 }"#,
                "outputs[0].key_length 20 is not an AES key length; use 16, 24 or 32 (bytes)",
            ),
            (
                r#"{ protocol = "srt", mode = "caller", address = "192.0.2.1", port = 9000, max_callers = 2 }"#,
                "outputs[0].max_callers is only for mode = \"listener\"",
            ),
            (
                r#"{ protocol = "srt", mode = "caller", address = "0.0.0.0", port = 9000 }"#,
                "outputs[0].address 0.0.0.0 is unspecified; a caller needs the listener's address",
            ),
            (
                r#"{ protocol = "srt", address = "239.2.2.2", port = 9000 }"#,
                "is a multicast group; an SRT output needs a unicast address",
            ),
            (
                r#"{ protocol = "srt", mode = "rendezvous", address = "0.0.0.0", port = 9000 }"#,
                "outputs[0].mode \"rendezvous\" is not known; use \"listener\" or \"caller\"",
            ),
            (
                r#"{ protocol = "srt", address = "0.0.0.0", port = 9000, max_callers = 0 }"#,
                "outputs[0].max_callers 0 is out of range; use 1-1024",
            ),
            (
                r#"{ interface = "eth1", address = "239.2.2.2", port = 9000, passphrase = "0123456789" }"#,
                "outputs[0].passphrase is only for an SRT output; add protocol = \"srt\" or remove it",
            ),
        ];
        for (output, want) in cases {
            let e = error(&flow(output));
            assert!(e.starts_with("t.toml:4:"), "{e}");
            assert!(e.contains(want), "{output}: {e}");
        }
        // The passphrase is never echoed in an error.
        let e = error(&flow(
            r#"{ protocol = "srt", address = "0.0.0.0", port = 9000, passphrase = "s3cret" }"#,
        ));
        assert!(!e.contains("s3cret"), "{e}");
    }

    #[test]
    fn one_port_many_flows_by_stream_id() {
        let two = |a: &str, b: &str| {
            format!(
                "[[flow]]\nname = \"a\"\ninput = {{ interface = \"eth0\", address = \"239.1.1.1\", port = 5000 }}\n\
                 outputs = [{{ protocol = \"srt\", address = \"0.0.0.0\", port = 9000{a} }}]\n\
                 [[flow]]\nname = \"b\"\ninput = {{ interface = \"eth0\", address = \"239.1.1.2\", port = 5000 }}\n\
                 outputs = [{{ protocol = \"srt\", address = \"0.0.0.0\", port = 9000{b} }}]\n"
            )
        };
        assert!(parse(&two(", stream_id = \"a\"", ", stream_id = \"b\""), "t.toml").is_ok());
        // One default route (no stream ID) beside named ones is fine.
        assert!(parse(&two("", ", stream_id = \"b\""), "t.toml").is_ok());
        one_error(
            &two(", stream_id = \"a\"", ", stream_id = \"a\""),
            "flow \"b\": SRT listener 0.0.0.0:9000 with stream_id \"a\" is also flow \"a\"'s; give each flow on one port its own stream_id",
        );
        // Within a flow, two outputs on one port need distinct stream IDs.
        let e = error(&flow(
            r#"{ protocol = "srt", address = "0.0.0.0", port = 9000 }, { protocol = "srt", address = "0.0.0.0", port = 9000 }"#,
        ));
        assert!(e.contains("outputs[1] is the same as outputs[0]"), "{e}");
    }

    #[test]
    fn spread_and_srt_dont_mix() {
        let text = format!(
            "{}spread = 2\n",
            flow(
                r#"{ protocol = "srt", address = "0.0.0.0", port = 9000 }, { interface = "eth1", address = "239.2.2.2", port = 6000 }"#
            )
        );
        assert!(error(&text).contains("spread can't be used with an SRT output"));
    }

    fn input_flow(input: &str) -> String {
        format!(
            "[[flow]]\nname = \"x\"\ninput = {input}\noutputs = [{{ interface = \"eth1\", address = \"239.2.2.2\", port = 6000 }}]\n"
        )
    }

    #[test]
    fn srt_input_listener_and_caller() {
        let c = parse(
            &input_flow(r#"{ protocol = "srt", address = "0.0.0.0", port = 9000 }"#),
            "t.toml",
        )
        .expect("valid");
        let f = c.flows.by_name("x").expect("x");
        let i = &f.inputs[0];
        assert_eq!(i.interface, "");
        assert_eq!(
            i.srt,
            Some(SrtInput {
                mode: SrtMode::Listener,
                latency_ms: 120,
                passphrase: None,
                key_length: 16,
                stream_id: None,
            })
        );
        // The helper opens no socket for it.
        assert!(f.receive_inputs().is_empty());
        assert_eq!(f.interfaces().collect::<Vec<_>>(), ["eth1"]);
        assert_eq!(i.to_string(), "srt listener 0.0.0.0:9000");
        let c = parse(
            &input_flow(
                r#"{ protocol = "srt", mode = "caller", address = "192.0.2.1", port = 9000, latency_ms = 200, passphrase = "0123456789abc", key_length = 24, stream_id = "cam-1" }"#,
            ),
            "t.toml",
        )
        .expect("valid");
        let i = &c.flows.by_name("x").expect("x").inputs[0];
        let s = i.srt.clone().expect("srt");
        assert_eq!(
            (s.mode, s.latency_ms, s.key_length, s.stream_id.as_deref()),
            (SrtMode::Caller, 200, 24, Some("cam-1"))
        );
        assert!(!format!("{s:?}").contains("0123456789abc"));
        assert_eq!(s.as_output().max_callers, 1);
    }

    #[test]
    fn srt_input_errors_name_the_field_and_the_fix() {
        let cases = [
            (
                r#"{ protocol = "srt", interface = "eth0", address = "0.0.0.0", port = 9000 }"#,
                "input.interface does not apply to an SRT input",
            ),
            (
                r#"{ protocol = "srt", address = "0.0.0.0", port = 9000, fec = "2022-1" }"#,
                "input.fec does not apply to an SRT input",
            ),
            (
                r#"{ protocol = "srt", address = "0.0.0.0", port = 900 }"#,
                "input.port 900 is a privileged port",
            ),
            (
                r#"{ protocol = "srt", address = "239.1.1.1", port = 9000 }"#,
                "an SRT input needs a unicast address",
            ),
            (
                r#"{ protocol = "srt", mode = "caller", address = "0.0.0.0", port = 9000 }"#,
                "input.address 0.0.0.0 is unspecified; a caller needs the listener's address",
            ),
            (
                r#"{ protocol = "srt", address = "0.0.0.0", port = 9000, max_callers = 2 }"#,
                "unknown key \"max_callers\" in input",
            ),
            (
                r#"{ interface = "eth0", address = "239.1.1.1", port = 5000, latency_ms = 200 }"#,
                "input.latency_ms is only for an SRT input; add protocol = \"srt\" or remove it",
            ),
            (
                r#"{ protocol = "rtp", address = "0.0.0.0", port = 9000 }"#,
                "input.protocol \"rtp\" is not known; use \"udp\", \"rist\" or \"srt\"",
            ),
        ];
        for (input, want) in cases {
            let e = error(&input_flow(input));
            assert!(e.starts_with("t.toml:3:"), "{e}");
            assert!(e.contains(want), "{input}: {e}");
        }
    }

    #[test]
    fn srt_leg_beside_a_multicast_leg() {
        let text = "[[flow]]\nname = \"x\"\nredundancy = \"failover\"\n\
             inputs = [{ protocol = \"srt\", address = \"0.0.0.0\", port = 9000 }, { interface = \"eth0\", address = \"239.1.1.1\", port = 5000 }]\n\
             outputs = [{ interface = \"eth1\", address = \"239.2.2.2\", port = 6000 }]\n";
        let c = parse(text, "t.toml").expect("valid");
        let f = c.flows.by_name("x").expect("x");
        assert!(f.inputs[0].srt.is_some() && f.inputs[1].srt.is_none());
        // The helper opens the multicast leg only.
        assert_eq!(f.receive_inputs(), vec![f.inputs[1].clone()]);
        // Two SRT legs on one port differ by stream ID.
        let two = |a: &str, b: &str| {
            format!(
                "[[flow]]\nname = \"x\"\nredundancy = \"failover\"\n\
                 inputs = [{{ protocol = \"srt\", address = \"0.0.0.0\", port = 9000{a} }}, {{ protocol = \"srt\", address = \"0.0.0.0\", port = 9000{b} }}]\n\
                 outputs = [{{ interface = \"eth1\", address = \"239.2.2.2\", port = 6000 }}]\n"
            )
        };
        assert!(parse(&two(", stream_id = \"a\"", ", stream_id = \"b\""), "t.toml").is_ok());
        assert!(error(&two("", "")).contains("inputs[1] is the same as inputs[0]"));
        // spread needs one input per worker: refused with an SRT input.
        let spread = "[[flow]]\nname = \"x\"\nspread = 2\n\
             input = { protocol = \"srt\", address = \"0.0.0.0\", port = 9000 }\n\
             outputs = [{ interface = \"eth1\", address = \"239.2.2.2\", port = 6000 }, { interface = \"eth1\", address = \"239.2.2.3\", port = 6000 }]\n";
        assert!(error(spread).contains("spread can't be used with an SRT input"));
        // Two flows can't listen for the same stream ID on one port.
        let flows = "[[flow]]\nname = \"a\"\ninput = { protocol = \"srt\", address = \"0.0.0.0\", port = 9000 }\n\
             outputs = [{ interface = \"eth1\", address = \"239.2.2.2\", port = 6000 }]\n\
             [[flow]]\nname = \"b\"\ninput = { protocol = \"srt\", address = \"0.0.0.0\", port = 9000 }\n\
             outputs = [{ interface = \"eth1\", address = \"239.2.2.3\", port = 6000 }]\n";
        assert!(
            error(flows)
                .contains("SRT listener 0.0.0.0:9000 with no stream_id is also flow \"a\"'s")
        );
    }

    /// An SRT input listener and an SRT output listener on one address,
    /// port and stream ID: the listener would route every caller to one
    /// of them. Refused within a flow and across flows; distinct stream
    /// IDs (or ports) are fine.
    #[test]
    fn srt_input_and_output_listener_on_one_port_and_stream_id_are_refused() {
        let one = |i: &str, o: &str| {
            format!(
                "[[flow]]\nname = \"x\"\n\
                 input = {{ protocol = \"srt\", address = \"0.0.0.0\", port = 9000{i} }}\n\
                 outputs = [{{ protocol = \"srt\", address = \"0.0.0.0\", port = 9000{o} }}]\n"
            )
        };
        one_error(
            &one("", ""),
            "flow \"x\": SRT listener 0.0.0.0:9000 with no stream_id is both an input and an output of this flow; a caller could not say which it wants: give them distinct stream_ids or ports",
        );
        one_error(
            &one(", stream_id = \"cam\"", ", stream_id = \"cam\""),
            "with stream_id \"cam\" is both an input and an output",
        );
        assert!(
            parse(
                &one(", stream_id = \"in\"", ", stream_id = \"out\""),
                "t.toml"
            )
            .is_ok()
        );
        assert!(parse(&one("", ", stream_id = \"out\""), "t.toml").is_ok());
        // A caller input calls someone else's listener: no conflict.
        let caller = "[[flow]]\nname = \"x\"\n\
             input = { protocol = \"srt\", mode = \"caller\", address = \"192.0.2.1\", port = 9000 }\n\
             outputs = [{ protocol = \"srt\", address = \"0.0.0.0\", port = 9000 }]\n";
        assert!(parse(caller, "t.toml").is_ok());
        // Across flows: flow b's output on flow a's input listener.
        let across = "[[flow]]\nname = \"a\"\n\
             input = { protocol = \"srt\", address = \"0.0.0.0\", port = 9000, stream_id = \"s\" }\n\
             outputs = [{ interface = \"eth1\", address = \"239.2.2.2\", port = 6000 }]\n\
             [[flow]]\nname = \"b\"\ninput = { interface = \"eth0\", address = \"239.1.1.1\", port = 5000 }\n\
             outputs = [{ protocol = \"srt\", address = \"0.0.0.0\", port = 9000, stream_id = \"s\" }]\n";
        one_error(
            across,
            "flow \"b\": SRT listener 0.0.0.0:9000 with stream_id \"s\" is also flow \"a\"'s (its input); give each flow on one port its own stream_id",
        );
    }

    /// Two SRT listeners on one port whose addresses overlap (a wildcard
    /// and an address it covers, or one address written two ways) would
    /// clash when the daemon binds the second: refused here, naming both
    /// flows. Two distinct unicast addresses on one port are fine.
    #[test]
    fn srt_listeners_on_overlapping_addresses_of_one_port_are_refused() {
        let two = |a: &str, b: &str| {
            format!(
                "[[flow]]\nname = \"a\"\n\
                 input = {{ protocol = \"srt\", address = \"{a}\", port = 9000, stream_id = \"in\" }}\n\
                 outputs = [{{ interface = \"eth1\", address = \"239.2.2.2\", port = 6000 }}]\n\
                 [[flow]]\nname = \"b\"\ninput = {{ interface = \"eth0\", address = \"239.1.1.1\", port = 5000 }}\n\
                 outputs = [{{ protocol = \"srt\", address = \"{b}\", port = 9000, stream_id = \"out\" }}]\n"
            )
        };
        one_error(
            &two("0.0.0.0", "10.0.0.1"),
            "flow \"b\": SRT listener 10.0.0.1:9000 (an output) can't be opened beside flow \"a\"'s SRT listener 0.0.0.0:9000 (an input): 0.0.0.0 holds the port on every IPv4 address; write one address for both (one listener serves several flows, told apart by stream_id) or use another port",
        );
        // Either order, and the error sits at the later one (flow b's output).
        let e = one_error(
            &two("10.0.0.1", "0.0.0.0"),
            "SRT listener 0.0.0.0:9000 (an output) can't be opened beside flow \"a\"'s SRT listener 10.0.0.1:9000 (an input): 0.0.0.0 holds",
        );
        assert!(e.starts_with("t.toml:8:"), "{e}");
        // :: (dual-stack) holds the port on every address, IPv4 included.
        for (a, b) in [
            ("::", "10.0.0.1"),
            ("0.0.0.0", "::"),
            ("::", "::1"),
            ("fe80::1", "::"),
        ] {
            one_error(
                &two(a, b),
                ":: holds the port on every address, IPv4 included",
            );
        }
        // One address written two ways is two listeners for the daemon.
        one_error(
            &two("::ffff:10.0.0.1", "10.0.0.1"),
            "::ffff:10.0.0.1 and 10.0.0.1 are one address written two ways",
        );
        // No overlap: two unicast addresses, IPv4 wildcard and an IPv6
        // address, one address written alike, or another port.
        for (a, b) in [
            ("10.0.0.1", "10.0.0.2"),
            ("0.0.0.0", "::1"),
            ("0.0.0.0", "0.0.0.0"),
            ("::", "::"),
        ] {
            assert!(parse(&two(a, b), "t.toml").is_ok(), "{a} {b}");
        }
        let other_port = two("0.0.0.0", "10.0.0.1").replace(
            "address = \"10.0.0.1\", port = 9000",
            "address = \"10.0.0.1\", port = 9001",
        );
        assert!(parse(&other_port, "t.toml").is_ok());
        // Within one flow too: two outputs, or an input and an output.
        let e = error(&flow(
            r#"{ protocol = "srt", address = "0.0.0.0", port = 9000 }, { protocol = "srt", address = "10.0.0.1", port = 9000, stream_id = "b" }"#,
        ));
        assert!(
            e.contains("flow \"x\": SRT listener 10.0.0.1:9000 (an output) can't be opened beside this flow's SRT listener 0.0.0.0:9000 (an output)"),
            "{e}"
        );
        let one = "[[flow]]\nname = \"x\"\n\
             input = { protocol = \"srt\", address = \"10.0.0.1\", port = 9000, stream_id = \"in\" }\n\
             outputs = [{ protocol = \"srt\", address = \"0.0.0.0\", port = 9000, stream_id = \"out\" }]\n";
        assert!(
            error(one).contains("SRT listener 0.0.0.0:9000 (an output) can't be opened beside this flow's SRT listener 10.0.0.1:9000 (an input)"),
            "{}",
            error(one)
        );
        // A caller binds no port of its own: no clash with a listener.
        let caller = "[[flow]]\nname = \"x\"\n\
             input = { protocol = \"srt\", mode = \"caller\", address = \"10.0.0.1\", port = 9000 }\n\
             outputs = [{ protocol = \"srt\", address = \"0.0.0.0\", port = 9000 }]\n";
        assert!(parse(caller, "t.toml").is_ok());
    }

    /// Flow "a" with input `input`, then flow "b" with a multicast input
    /// and output `output` (line 8).
    fn input_then_output(input: &str, output: &str) -> String {
        format!(
            "[[flow]]\nname = \"a\"\ninput = {input}\n\
             outputs = [{{ interface = \"eth1\", address = \"239.2.2.2\", port = 6000 }}]\n\
             [[flow]]\nname = \"b\"\ninput = {{ interface = \"eth0\", address = \"239.1.1.9\", port = 5000 }}\n\
             outputs = [{output}]\n"
        )
    }

    /// Flow "a" with the SRT listener input `listener`, then flow "b"
    /// with input `input` (line 7).
    fn listener_then_input(listener: &str, input: &str) -> String {
        format!(
            "[[flow]]\nname = \"a\"\ninput = {listener}\n\
             outputs = [{{ interface = \"eth1\", address = \"239.2.2.2\", port = 6000 }}]\n\
             [[flow]]\nname = \"b\"\ninput = {input}\n\
             outputs = [{{ interface = \"eth1\", address = \"239.2.2.3\", port = 6000 }}]\n"
        )
    }

    /// `text` parses.
    fn valid(text: &str) {
        if let Err(e) = parse(text, "t.toml") {
            panic!("{e:?}, for\n{text}");
        }
    }

    /// The one error of `text`, which contains `want`.
    fn one_error(text: &str, want: &str) -> String {
        let e = error(text);
        assert!(e.contains(want), "{want:?} is not in {e:?}, for\n{text}");
        e
    }

    fn srt_at(address: &str, port: u16) -> String {
        format!("{{ protocol = \"srt\", address = \"{address}\", port = {port} }}")
    }

    fn udp_at(address: &str, port: u16, extra: &str) -> String {
        format!("{{ interface = \"eth0\", address = \"{address}\", port = {port}{extra} }}")
    }

    /// An SRT listener and a UDP input (`ingress = "socket"`) on one
    /// port whose addresses overlap: libsrt binds without SO_REUSEADDR,
    /// so the kernel refuses whichever socket comes second (tried in a
    /// namespace, docs/configuration.md). Refused here in either order,
    /// at the later one, naming both flows and the fix.
    #[test]
    fn an_srt_listener_over_a_udp_inputs_port_is_refused_in_either_order() {
        let e = one_error(
            &input_then_output(&udp_at("239.1.1.1", 9000, ""), &srt_at("0.0.0.0", 9000)),
            "flow \"b\": SRT listener 0.0.0.0:9000 (an output) can't be opened beside flow \"a\"'s input eth0 239.1.1.1:9000: 0.0.0.0 holds the port on every IPv4 address, and the kernel binds no other socket over an SRT listener's (libsrt sets no SO_REUSEADDR); bind the SRT listener to a unicast address of this host (not 239.1.1.1) or use another port for one of them",
        );
        assert!(e.starts_with("t.toml:8:"), "{e}");
        let e = one_error(
            &listener_then_input(&srt_at("0.0.0.0", 9000), &udp_at("239.1.1.1", 9000, "")),
            "flow \"b\": input eth0 239.1.1.1:9000 can't be opened beside flow \"a\"'s SRT listener 0.0.0.0:9000 (an input): 0.0.0.0 holds the port on every IPv4 address, and the kernel binds no other socket over an SRT listener's",
        );
        assert!(e.starts_with("t.toml:7:"), "{e}");
        // Which addresses overlap, as the kernel sees them: (listener,
        // input, why).
        let dual = ":: holds the port on every address, IPv4 included";
        let both = "both are on 10.0.0.1, and the kernel binds no other socket over an SRT listener's (libsrt sets no SO_REUSEADDR); use another port for one of them";
        let any4 = "0.0.0.0 holds the port on every IPv4 address";
        let mapped = "::ffff:10.0.0.1 and 10.0.0.1 are one address written two ways";
        let from = "input eth0 239.1.1.1:9000 from 10.1.1.1";
        let source = ", source = \"10.1.1.1\"";
        for (srt, udp, extra, why) in [
            ("::", "239.1.1.1", "", dual),
            ("::", "ff3e::1", "", dual),
            ("10.0.0.1", "10.0.0.1", "", both),
            ("0.0.0.0", "10.0.0.1", "", any4),
            ("::ffff:10.0.0.1", "10.0.0.1", "", mapped),
            ("0.0.0.0", "239.1.1.1", source, from),
        ] {
            let udp = udp_at(udp, 9000, extra);
            for text in [
                input_then_output(&udp, &srt_at(srt, 9000)),
                listener_then_input(&srt_at(srt, 9000), &udp),
            ] {
                one_error(&text, why);
            }
        }
        // No overlap: a unicast listener beside a group or another
        // address, IPv4's wildcard beside an IPv6 group (the input's
        // socket is IPV6_V6ONLY), another port; a caller binds no port.
        for (srt, udp) in [
            (srt_at("10.0.0.1", 9000), udp_at("239.1.1.1", 9000, "")),
            (srt_at("10.0.0.2", 9000), udp_at("10.0.0.1", 9000, "")),
            (srt_at("0.0.0.0", 9000), udp_at("ff3e::1", 9000, "")),
            (srt_at("fd00::1", 9000), udp_at("ff3e::1", 9000, "")),
            (srt_at("0.0.0.0", 9001), udp_at("239.1.1.1", 9000, "")),
            (
                r#"{ protocol = "srt", mode = "caller", address = "10.0.0.1", port = 9000 }"#
                    .to_owned(),
                udp_at("10.0.0.1", 9000, ""),
            ),
        ] {
            let text = input_then_output(&udp, &srt);
            valid(&text);
        }
    }

    /// The ports a UDP input holds besides its own: a RIST input's RTCP
    /// (+ 1), a 2022-1 FEC input's column and row FEC (+ 2, + 4).
    #[test]
    fn an_srt_listener_over_a_rist_or_fec_inputs_extra_port_is_refused() {
        for (udp, what) in [
            (
                r#"{ protocol = "rist", interface = "eth0", address = "239.1.1.1", port = 8998 }"#,
                "input eth0 239.1.1.1:8998 (its RIST RTCP port 8999)",
            ),
            (
                r#"{ interface = "eth0", address = "239.1.1.1", port = 8997, fec = "2022-1" }"#,
                "input eth0 239.1.1.1:8997 (its 2022-1 column FEC port 8999)",
            ),
            (
                r#"{ interface = "eth0", address = "239.1.1.1", port = 8995, fec = "2022-1" }"#,
                "input eth0 239.1.1.1:8995 (its 2022-1 row FEC port 8999)",
            ),
        ] {
            one_error(
                &input_then_output(udp, &srt_at("0.0.0.0", 8999)),
                &format!(
                    "SRT listener 0.0.0.0:8999 (an output) can't be opened beside flow \"a\"'s {what}: 0.0.0.0 holds"
                ),
            );
            one_error(
                &listener_then_input(&srt_at("0.0.0.0", 8999), udp),
                &format!(
                    "flow \"b\": {what} can't be opened beside flow \"a\"'s SRT listener 0.0.0.0:8999 (an input)"
                ),
            );
        }
        // A plain input holds its own port only.
        let text = input_then_output(&udp_at("239.1.1.1", 8998, ""), &srt_at("0.0.0.0", 8999));
        assert!(parse(&text, "t.toml").is_ok());
        // Within one flow: an SRT listener leg beside the FEC port of a
        // multicast leg, an SRT output beside the flow's input.
        let legs = "[[flow]]\nname = \"x\"\nredundancy = \"failover\"\n\
             inputs = [{ interface = \"eth0\", address = \"239.1.1.1\", port = 9000, fec = \"2022-1\" }, { protocol = \"srt\", address = \"0.0.0.0\", port = 9002 }]\n\
             outputs = [{ interface = \"eth1\", address = \"239.2.2.2\", port = 6000 }]\n";
        one_error(
            legs,
            "flow \"x\": SRT listener 0.0.0.0:9002 (an input) can't be opened beside this flow's input eth0 239.1.1.1:9000 (its 2022-1 column FEC port 9002)",
        );
        let e = error(&format!(
            "[[flow]]\nname = \"x\"\ninput = {}\noutputs = [{}]\n",
            udp_at("239.1.1.1", 9000, ""),
            srt_at("0.0.0.0", 9000)
        ));
        assert!(
            e.contains("flow \"x\": SRT listener 0.0.0.0:9000 (an output) can't be opened beside this flow's input eth0 239.1.1.1:9000"),
            "{e}"
        );
    }

    /// `ingress = "packet"` and `"xdp"` bind no port: beside a group
    /// nothing clashes (a wildcard listener receives the group's
    /// datagrams too, and libsrt discards them); on a unicast address
    /// their filter would take the SRT callers' datagrams.
    #[test]
    fn packet_and_xdp_inputs_clash_with_an_srt_listener_on_unicast_addresses_only() {
        for ingress in ["packet", "xdp"] {
            let extra = format!(", ingress = \"{ingress}\"");
            let udp = udp_at("239.1.1.1", 9000, &extra);
            let text = input_then_output(&udp, &srt_at("0.0.0.0", 9000));
            valid(&text);
            for srt in ["0.0.0.0", "10.0.0.1"] {
                let udp = udp_at("10.0.0.1", 9000, &extra);
                for text in [
                    input_then_output(&udp, &srt_at(srt, 9000)),
                    listener_then_input(&srt_at(srt, 9000), &udp),
                ] {
                    let why = if ingress == "packet" {
                        "and the input's packet filter (ingress = \"packet\") would relay the SRT callers' datagrams to that port as the flow's stream"
                    } else {
                        "and the input's XDP program (ingress = \"xdp\") would take the SRT callers' datagrams to that port from the listener"
                    };
                    one_error(&text, why);
                }
            }
        }
        let text = input_then_output(
            &udp_at("ff3e::1", 9000, ", ingress = \"packet\""),
            &srt_at("::", 9000),
        );
        valid(&text);
    }
}
