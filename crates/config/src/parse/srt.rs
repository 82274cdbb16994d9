//! An output with `protocol = "srt"`: an SRT listener that many callers
//! connect to, or an SRT caller that connects out (see
//! [`crate::model::SrtOutput`]). The daemon opens SRT sockets without
//! privileges, so a listener's port must be 1024 or above.

use std::ops::Range;

use toml::de::DeTable;

use super::{Dotted, Indexed, Walker};
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
/// Keys only a UDP output takes.
const UDP_ONLY_KEYS: &[&str] = &["interface", "ttl", "source_address", "queue_depth"];
/// libsrt's longest stream ID.
const MAX_STREAM_ID: usize = 512;

impl Walker<'_> {
    /// The output's `protocol`: `Some(true)` for `"srt"`, `Some(false)` for
    /// `"udp"` or absent, `None` (with an error) otherwise.
    pub(super) fn is_srt(&mut self, t: &DeTable<'_>, p: &str, i: usize) -> Option<bool> {
        let Some(v) = t.get("protocol") else {
            return Some(false);
        };
        match self.string(v, p, Dotted(Indexed("outputs", i), "protocol"))? {
            "udp" => Some(false),
            "srt" => Some(true),
            other => {
                self.err(
                    &v.span(),
                    format!(
                        "{p}outputs[{i}].protocol {other:?} is not known; use \"udp\" or \"srt\""
                    ),
                );
                None
            }
        }
    }

    /// Refuses the SRT keys on a UDP output.
    pub(super) fn no_srt_keys(&mut self, t: &DeTable<'_>, p: &str, i: usize) -> bool {
        let mut ok = true;
        for (k, _) in t.iter() {
            let k_str: &str = k.get_ref().as_ref();
            if SRT_ONLY_KEYS.contains(&k_str) {
                self.err(
                    &k.span(),
                    format!("{p}outputs[{i}].{k_str} is only for an SRT output; add protocol = \"srt\" or remove it"),
                );
                ok = false;
            }
        }
        ok
    }

    /// An SRT output (its table `t`, written at `span`).
    pub(super) fn srt_output(
        &mut self,
        t: &DeTable<'_>,
        span: &Range<usize>,
        p: &str,
        i: usize,
    ) -> Option<Output> {
        let path = |key: &'static str| Dotted(Indexed("outputs", i), key);
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
                        self.err(&v.span(), format!("{p}{} {a} is a multicast group; an SRT output needs a unicast address", path("address")));
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
        Some(Output {
            interface: String::new(),
            address,
            port,
            ttl: DEFAULT_UNICAST_TTL,
            source_address: None,
            queue_depth: DEFAULT_OUTPUT_QUEUE_DEPTH,
            srt: Some(SrtOutput {
                mode,
                latency_ms,
                passphrase,
                key_length,
                max_callers,
                stream_id,
            }),
        })
    }
}
