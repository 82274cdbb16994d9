//! A flow's legs and how they combine: `input` (one leg) or `inputs`
//! (2 to [`MAX_LEGS`] legs), and `redundancy` with its settings
//! (`merge_delay_ms`, `merge_window_ms`, `failover_after_ms`,
//! `failover_gap_factor`, `revert_after_s`, `rtp_rewrite`). Every rule that involves more than one leg lives
//! here; a single leg is checked by [`Walker::input`].

use std::ops::Range;

use toml::de::{DeTable, DeValue};

use super::Walker;
use crate::model::*;

/// The keys of `merge` and of `failover`, for "only valid with" errors.
const MERGE_KEYS: [&str; 2] = ["merge_delay_ms", "merge_window_ms"];
const FAILOVER_KEYS: [&str; 4] = [
    "failover_after_ms",
    "failover_gap_factor",
    "revert_after_s",
    "rtp_rewrite",
];

const ONE_LEG_EXAMPLE: &str = "{ interface = \"eth0\", address = \"239.1.1.1\", port = 5000 }";

impl Walker<'_> {
    /// The flow's legs, each with where it is written, in order; `None`
    /// (with errors) when any is invalid or the keys are wrong.
    pub(super) fn legs(
        &mut self,
        t: &DeTable<'_>,
        flow_span: &Range<usize>,
        p: &str,
    ) -> Option<Vec<(Input, usize)>> {
        match (t.get("input"), t.get("inputs")) {
            (None, None) => {
                self.missing(flow_span, p, "input", "input", ONE_LEG_EXAMPLE);
                None
            }
            (Some(_), Some(iv)) => {
                self.err(
                    &iv.span(),
                    format!(
                        "{p}input and inputs are both set; keep input for one leg, or move it into inputs for 2 to {MAX_LEGS} legs"
                    ),
                );
                None
            }
            (Some(iv), None) => {
                let leg = self.input(iv, p, "input")?;
                Some(vec![(leg, iv.span().start)])
            }
            (None, Some(iv)) => {
                let DeValue::Array(items) = iv.get_ref() else {
                    self.type_err(iv, p, "inputs", "an array of tables");
                    return None;
                };
                match items.len() {
                    0 => {
                        self.err(
                            &iv.span(),
                            format!("{p}inputs is empty; list 2 to {MAX_LEGS} legs, or use input = {ONE_LEG_EXAMPLE} for one"),
                        );
                        return None;
                    }
                    1 => {
                        self.err(
                            &iv.span(),
                            format!("{p}inputs has one leg; add a second leg, or write it as input = {{ ... }}"),
                        );
                        return None;
                    }
                    n if n > MAX_LEGS => {
                        self.err(
                            &iv.span(),
                            format!("{p}inputs has {n} legs; use at most {MAX_LEGS}"),
                        );
                        return None;
                    }
                    _ => {}
                }
                let mut legs: Vec<(Input, usize)> = Vec::with_capacity(items.len());
                let mut ok = true;
                for (i, item) in items.iter().enumerate() {
                    let Some(leg) = self.input(item, p, &format!("inputs[{i}]")) else {
                        ok = false;
                        continue;
                    };
                    if let Some(j) = legs.iter().position(|(l, _)| same_input(l, &leg)) {
                        self.err(
                            &item.span(),
                            format!(
                                "{p}inputs[{i}] is the same as inputs[{j}] ({leg}); give each leg its own interface, group, port or source"
                            ),
                        );
                        ok = false;
                    }
                    legs.push((leg, item.span().start));
                }
                ok.then_some(legs)
            }
        }
    }

    /// `redundancy` and its settings, given how many legs the flow has
    /// (`None` when they are invalid: then only the keys' own values are
    /// checked) and its payload (`None` when invalid).
    pub(super) fn redundancy(
        &mut self,
        t: &DeTable<'_>,
        flow_span: &Range<usize>,
        p: &str,
        legs: Option<usize>,
        payload: Option<Payload>,
    ) -> Option<Redundancy> {
        let mut ok = true;
        let mode = match t.get("redundancy") {
            None => None,
            Some(v) => match self.string(v, p, "redundancy") {
                Some(s @ ("merge" | "failover")) => Some((s, v.span())),
                Some(s) => {
                    self.err(
                        &v.span(),
                        format!("{p}redundancy {s:?} is not valid; use \"merge\" or \"failover\""),
                    );
                    return None;
                }
                None => return None,
            },
        };
        let mut setting = |w: &mut Self, key: &str, lo: u32, hi: u32, default: u32| match t.get(key)
        {
            None => default,
            Some(v) => match w.ranged(v, p, key, i128::from(lo), i128::from(hi)) {
                Some(n) => u32::try_from(n).unwrap_or(default),
                None => {
                    ok = false;
                    default
                }
            },
        };
        let delay_ms = setting(
            self,
            "merge_delay_ms",
            0,
            MAX_MERGE_WINDOW_MS,
            DEFAULT_MERGE_DELAY_MS,
        );
        let window_ms = setting(
            self,
            "merge_window_ms",
            1,
            MAX_MERGE_WINDOW_MS,
            DEFAULT_MERGE_WINDOW_MS,
        );
        let after_ms = setting(
            self,
            "failover_after_ms",
            1,
            MAX_FAILOVER_AFTER_MS,
            DEFAULT_FAILOVER_AFTER_MS,
        );
        let gap_factor = setting(
            self,
            "failover_gap_factor",
            0,
            MAX_FAILOVER_GAP_FACTOR,
            DEFAULT_FAILOVER_GAP_FACTOR,
        );
        let revert_after_s = setting(
            self,
            "revert_after_s",
            0,
            MAX_REVERT_AFTER_S,
            DEFAULT_REVERT_AFTER_S,
        );
        let rtp_rewrite = match t.get("rtp_rewrite") {
            None => false,
            Some(v) => match v.get_ref() {
                DeValue::Boolean(b) => *b,
                _ => {
                    self.type_err(v, p, "rtp_rewrite", "true or false");
                    ok = false;
                    false
                }
            },
        };
        // Settings of the other mode (or of none) are mistakes, not noise.
        let foreign: &[&str] = match mode.as_ref().map(|(s, _)| *s) {
            Some("merge") => &FAILOVER_KEYS,
            Some(_) => &MERGE_KEYS,
            None => &[],
        };
        for key in foreign {
            if let Some(v) = t.get(*key) {
                let wanted = if MERGE_KEYS.contains(key) {
                    "merge"
                } else {
                    "failover"
                };
                self.err(
                    &v.span(),
                    format!("{p}{key} is only valid with redundancy = \"{wanted}\"; remove it or change redundancy"),
                );
                ok = false;
            }
        }
        let legs = legs?;
        match (mode, legs) {
            (None, 1) => {
                for key in MERGE_KEYS.iter().chain(&FAILOVER_KEYS) {
                    if let Some(v) = t.get(*key) {
                        self.err(
                            &v.span(),
                            format!("{p}{key} needs 2 to {MAX_LEGS} legs and a redundancy; remove it, or list the legs in inputs and set redundancy"),
                        );
                        ok = false;
                    }
                }
                ok.then_some(Redundancy::Single)
            }
            (None, n) => {
                self.err(
                    flow_span,
                    format!(
                        "{p}redundancy is missing for {n} legs; add redundancy = \"merge\" (RTP payloads: each packet once, from any leg) or \"failover\" (the first healthy leg)"
                    ),
                );
                None
            }
            (Some((_, span)), 1) => {
                self.err(
                    &span,
                    format!("{p}redundancy needs 2 to {MAX_LEGS} legs but the flow has one input; list the legs in inputs = [...] or remove redundancy"),
                );
                None
            }
            (Some(("merge", span)), _) => {
                if let Some(payload) = payload
                    && !matches!(payload, Payload::Rtp | Payload::RtpMpegts)
                {
                    self.err(
                        &span,
                        format!("{p}redundancy = \"merge\" needs RTP sequence numbers but payload is \"{payload}\"; set payload = \"rtp\" or \"rtp-mpegts\", or use redundancy = \"failover\""),
                    );
                    ok = false;
                }
                if delay_ms > window_ms {
                    let at = t.get("merge_delay_ms").map_or(span, |v| v.span());
                    self.err(
                        &at,
                        format!("{p}merge_delay_ms {delay_ms} is longer than merge_window_ms {window_ms}; lower merge_delay_ms or raise merge_window_ms (at most {MAX_MERGE_WINDOW_MS})"),
                    );
                    ok = false;
                }
                ok.then_some(Redundancy::Merge {
                    delay_ms,
                    window_ms,
                })
            }
            (Some((_, span)), _) => {
                if rtp_rewrite
                    && let Some(payload) = payload
                    && !payload.has_rtp()
                {
                    let at = t.get("rtp_rewrite").map_or(span, |v| v.span());
                    self.err(
                        &at,
                        format!("{p}rtp_rewrite needs RTP headers to rewrite but payload is \"{payload}\"; set payload = \"rtp\" or \"rtp-mpegts\", or remove rtp_rewrite"),
                    );
                    ok = false;
                }
                ok.then_some(Redundancy::Failover {
                    after_ms,
                    revert_after_s,
                    rtp_rewrite,
                    gap_factor,
                })
            }
        }
    }
}

/// Whether two legs would receive the same datagrams.
fn same_input(a: &Input, b: &Input) -> bool {
    a.interface == b.interface && a.address == b.address && a.port == b.port && a.source == b.source
}

#[cfg(test)]
mod tests {
    use super::super::tests::{error, errors};
    use crate::model::*;
    use crate::parse;

    const A: &str = r#"{ interface = "eth0", address = "239.1.1.1", port = 5000 }"#;
    const B: &str = r#"{ interface = "eth2", address = "239.1.2.1", port = 5002, source = "10.2.2.2", ingress = "packet" }"#;
    const OUT: &str = r#"[{ interface = "eth1", address = "239.2.2.2", port = 6000 }]"#;

    /// A flow with `inputs = [legs]` (line 3) and `extra` lines from line 5.
    fn flow(legs: &[&str], extra: &str) -> String {
        format!(
            "[[flow]]\nname = \"x\"\ninputs = [{}]\noutputs = {OUT}\n{extra}",
            legs.join(", ")
        )
    }

    fn parsed(text: &str) -> Flow {
        parse(text, "t.toml")
            .unwrap_or_else(|e| panic!("{e}"))
            .flows
            .by_name("x")
            .expect("flow x")
            .clone()
    }

    #[test]
    fn two_legs_merge_with_defaults() {
        let f = parsed(&flow(
            &[A, B],
            "redundancy = \"merge\"\npayload = \"rtp\"\n",
        ));
        assert_eq!(f.inputs.len(), 2);
        assert_eq!(f.inputs[0].interface, "eth0");
        assert_eq!(f.inputs[1].interface, "eth2");
        assert_eq!(f.inputs[1].source, Some("10.2.2.2".parse().unwrap()));
        assert_eq!(f.inputs[1].ingress, IngressKind::Packet);
        assert_eq!(f.primary().port, 5000);
        assert_eq!(
            f.redundancy,
            Redundancy::Merge {
                delay_ms: 0,
                window_ms: 50
            }
        );
        assert_eq!(f.interfaces().collect::<Vec<_>>(), ["eth0", "eth2", "eth1"]);
    }

    #[test]
    fn every_setting_is_read() {
        let f = parsed(&flow(
            &[A, B, &A.replace("eth0", "eth3"), &A.replace("5000", "5004")],
            "redundancy = \"merge\"\npayload = \"rtp-mpegts\"\nmerge_delay_ms = 40\nmerge_window_ms = 1000\n",
        ));
        assert_eq!(f.inputs.len(), 4);
        assert_eq!(
            f.redundancy,
            Redundancy::Merge {
                delay_ms: 40,
                window_ms: 1000
            }
        );
        let f = parsed(&flow(
            &[A, B],
            "redundancy = \"failover\"\nfailover_after_ms = 250\nrevert_after_s = 0\nfailover_gap_factor = 0\n",
        ));
        assert_eq!(
            f.redundancy,
            Redundancy::Failover {
                after_ms: 250,
                revert_after_s: 0,
                rtp_rewrite: false,
                gap_factor: 0,
            }
        );
        let f = parsed(&flow(
            &[A, B],
            "redundancy = \"failover\"\npayload = \"rtp\"\nrtp_rewrite = true\n",
        ));
        assert_eq!(
            f.redundancy,
            Redundancy::Failover {
                after_ms: 100,
                revert_after_s: 10,
                rtp_rewrite: true,
                gap_factor: 4,
            }
        );
        // Failover takes any payload, and has its defaults.
        let f = parsed(&flow(&[A, B], "redundancy = \"failover\"\n"));
        assert_eq!(
            f.redundancy,
            Redundancy::Failover {
                after_ms: 100,
                revert_after_s: 10,
                rtp_rewrite: false,
                gap_factor: 4,
            }
        );
        assert_eq!(f.health.payload, Payload::Udp);
        // One leg in `input` is a single flow.
        let one = format!("[[flow]]\nname = \"x\"\ninput = {A}\noutputs = {OUT}\n");
        assert_eq!(parsed(&one).redundancy, Redundancy::Single);
    }

    #[test]
    fn legs_may_differ_in_family() {
        let v6 = r#"{ interface = "eth2", address = "ff3e::1", port = 5000 }"#;
        let f = parsed(&flow(&[A, v6], "redundancy = \"failover\"\n"));
        assert!(f.inputs[1].address.is_ipv6());
        // The same group and port on two interfaces are two legs.
        let f = parsed(&flow(
            &[A, &A.replace("eth0", "eth9")],
            "redundancy = \"failover\"\n",
        ));
        assert_eq!(f.inputs[1].interface, "eth9");
    }

    #[test]
    fn leg_count_rules() {
        assert_eq!(
            error(&flow(&[], "")),
            "t.toml:3:10: flow \"x\": inputs is empty; list 2 to 4 legs, or use input = { interface = \"eth0\", address = \"239.1.1.1\", port = 5000 } for one"
        );
        assert_eq!(
            error(&flow(&[A], "redundancy = \"merge\"\npayload = \"rtp\"\n")),
            "t.toml:3:10: flow \"x\": inputs has one leg; add a second leg, or write it as input = { ... }"
        );
        let five: Vec<String> = (0..5)
            .map(|i| A.replace("5000", &format!("500{i}")))
            .collect();
        let five: Vec<&str> = five.iter().map(String::as_str).collect();
        assert_eq!(
            error(&flow(&five, "redundancy = \"failover\"\n")),
            "t.toml:3:10: flow \"x\": inputs has 5 legs; use at most 4"
        );
        assert_eq!(
            error(&format!(
                "[[flow]]\nname = \"x\"\ninput = {A}\ninputs = [{A}, {B}]\noutputs = {OUT}\n"
            )),
            "t.toml:4:10: flow \"x\": input and inputs are both set; keep input for one leg, or move it into inputs for 2 to 4 legs"
        );
        assert_eq!(
            errors("[[flow]]\nname = \"x\"\ninputs = { a = 1 }\n")[0],
            "t.toml:1:1: flow \"x\": outputs is missing; add outputs = [{ interface = \"eth1\", address = \"239.2.2.2\", port = 6000 }]"
        );
        assert_eq!(
            errors(&format!(
                "[[flow]]\nname = \"x\"\ninputs = {{ a = 1 }}\noutputs = {OUT}\n"
            )),
            ["t.toml:3:10: flow \"x\": inputs must be an array of tables, found table"]
        );
    }

    #[test]
    fn each_leg_is_checked_under_its_own_name() {
        let bad = r#"{ interface = "eth2", address = "239.1.1.300", port = 0, colour = 1 }"#;
        assert_eq!(
            errors(&flow(&[A, bad], "redundancy = \"failover\"\n")),
            [
                "t.toml:3:103: flow \"x\": inputs[1].address 239.1.1.300 is not an IP address",
                "t.toml:3:125: flow \"x\": inputs[1].port 0 is not allowed; use 1-65535",
                "t.toml:3:128: flow \"x\": unknown key \"colour\" in inputs[1] (expected one of: interface, address, port, source, ingress, receive_buffer_bytes, fec, protocol, buffer_ms)",
            ]
        );
        let ssm =
            r#"{ interface = "eth2", address = "10.0.0.1", port = 5000, source = "10.0.0.2" }"#;
        assert_eq!(
            error(&flow(&[A, ssm], "redundancy = \"failover\"\n")),
            "t.toml:3:137: flow \"x\": inputs[1].source is only valid with a multicast inputs[1].address (10.0.0.1 is unicast); remove source"
        );
    }

    #[test]
    fn duplicate_legs() {
        assert_eq!(
            error(&flow(&[A, B, A], "redundancy = \"failover\"\n")),
            format!(
                "t.toml:3:{}: flow \"x\": inputs[2] is the same as inputs[0] (eth0 239.1.1.1:5000); give each leg its own interface, group, port or source",
                11 + A.len() + 2 + B.len() + 2
            )
        );
        // Another source is another leg.
        let ssm = A.replace("5000", "5000, source = \"10.9.9.9\"");
        assert!(parse(&flow(&[A, &ssm], "redundancy = \"failover\"\n"), "t.toml").is_ok());
    }

    #[test]
    fn legs_are_inputs_for_the_cross_flow_rules() {
        // A leg of one flow can't be another flow's input.
        let text = format!(
            "{}[[flow]]\nname = \"y\"\ninput = {B}\noutputs = {OUT}\n",
            flow(&[A, B], "redundancy = \"failover\"\n")
        );
        assert_eq!(
            error(&text),
            "t.toml:8:9: flow \"y\": same input as flow \"x\" (eth2 239.1.2.1:5002 from 10.2.2.2); two flows can't share an input"
        );
        // An output can't be any of the legs.
        let out = r#"[{ interface = "eth2", address = "239.1.2.1", port = 5002 }]"#;
        let text = format!(
            "[[flow]]\nname = \"x\"\ninputs = [{A}, {B}]\noutputs = {out}\nredundancy = \"failover\"\n"
        );
        assert_eq!(
            error(&text),
            "t.toml:4:12: flow \"x\": outputs[0] (eth2 239.1.2.1:5002) sends to the flow's own input (eth2 239.1.2.1:5002), which would loop; change the address or port"
        );
    }

    #[test]
    fn redundancy_rules() {
        assert_eq!(
            error(&flow(&[A, B], "")),
            "t.toml:1:1: flow \"x\": redundancy is missing for 2 legs; add redundancy = \"merge\" (RTP payloads: each packet once, from any leg) or \"failover\" (the first healthy leg)"
        );
        assert_eq!(
            error(&flow(&[A, B], "redundancy = \"both\"\n")),
            "t.toml:5:14: flow \"x\": redundancy \"both\" is not valid; use \"merge\" or \"failover\""
        );
        assert_eq!(
            error(&flow(&[A, B], "redundancy = 2\n")),
            "t.toml:5:14: flow \"x\": redundancy must be a string, found integer"
        );
        let one = format!(
            "[[flow]]\nname = \"x\"\ninput = {A}\noutputs = {OUT}\nredundancy = \"failover\"\n"
        );
        assert_eq!(
            error(&one),
            "t.toml:5:14: flow \"x\": redundancy needs 2 to 4 legs but the flow has one input; list the legs in inputs = [...] or remove redundancy"
        );
        let one =
            format!("[[flow]]\nname = \"x\"\ninput = {A}\noutputs = {OUT}\nmerge_window_ms = 20\n");
        assert_eq!(
            error(&one),
            "t.toml:5:19: flow \"x\": merge_window_ms needs 2 to 4 legs and a redundancy; remove it, or list the legs in inputs and set redundancy"
        );
    }

    #[test]
    fn merge_needs_rtp() {
        for payload in ["", "payload = \"udp\"\n", "payload = \"mpegts\"\n"] {
            let shown = if payload.contains("mpegts") {
                "mpegts"
            } else {
                "udp"
            };
            assert_eq!(
                error(&flow(
                    &[A, B],
                    &format!("redundancy = \"merge\"\n{payload}")
                )),
                format!(
                    "t.toml:5:14: flow \"x\": redundancy = \"merge\" needs RTP sequence numbers but payload is \"{shown}\"; set payload = \"rtp\" or \"rtp-mpegts\", or use redundancy = \"failover\""
                )
            );
        }
    }

    #[test]
    fn setting_ranges() {
        let merge = "redundancy = \"merge\"\npayload = \"rtp\"\n";
        assert_eq!(
            error(&flow(&[A, B], &format!("{merge}merge_window_ms = 1001\n"))),
            "t.toml:7:19: flow \"x\": merge_window_ms 1001 is out of range; use 1-1000"
        );
        assert_eq!(
            error(&flow(&[A, B], &format!("{merge}merge_window_ms = 0\n"))),
            "t.toml:7:19: flow \"x\": merge_window_ms 0 is out of range; use 1-1000"
        );
        assert_eq!(
            error(&flow(&[A, B], &format!("{merge}merge_delay_ms = -1\n"))),
            "t.toml:7:18: flow \"x\": merge_delay_ms -1 is out of range; use 0-1000"
        );
        assert_eq!(
            error(&flow(&[A, B], &format!("{merge}merge_delay_ms = 60\n"))),
            "t.toml:7:18: flow \"x\": merge_delay_ms 60 is longer than merge_window_ms 50; lower merge_delay_ms or raise merge_window_ms (at most 1000)"
        );
        assert!(
            parse(
                &flow(
                    &[A, B],
                    &format!("{merge}merge_delay_ms = 60\nmerge_window_ms = 60\n")
                ),
                "t.toml"
            )
            .is_ok()
        );
        let failover = "redundancy = \"failover\"\n";
        assert_eq!(
            error(&flow(
                &[A, B],
                &format!("{failover}failover_after_ms = 0\n")
            )),
            "t.toml:6:21: flow \"x\": failover_after_ms 0 is out of range; use 1-3600000"
        );
        assert_eq!(
            error(&flow(
                &[A, B],
                &format!("{failover}failover_gap_factor = 101\n")
            )),
            "t.toml:6:23: flow \"x\": failover_gap_factor 101 is out of range; use 0-100"
        );
        assert_eq!(
            error(&flow(
                &[A, B],
                &format!("{failover}revert_after_s = 86401\n")
            )),
            "t.toml:6:18: flow \"x\": revert_after_s 86401 is out of range; use 0-86400"
        );
    }

    #[test]
    fn settings_of_the_other_mode_are_errors() {
        assert_eq!(
            errors(&flow(
                &[A, B],
                "redundancy = \"failover\"\nmerge_delay_ms = 5\nrevert_after_s = 3\n"
            )),
            [
                "t.toml:6:18: flow \"x\": merge_delay_ms is only valid with redundancy = \"merge\"; remove it or change redundancy"
            ]
        );
        assert_eq!(
            errors(&flow(
                &[A, B],
                "redundancy = \"merge\"\npayload = \"rtp\"\nfailover_after_ms = 5\n"
            )),
            [
                "t.toml:7:21: flow \"x\": failover_after_ms is only valid with redundancy = \"failover\"; remove it or change redundancy"
            ]
        );
    }

    #[test]
    fn only_on_an_rtp_failover_and_only_true_or_false() {
        assert_eq!(
            errors(&flow(
                &[A, B],
                "redundancy = \"failover\"\nrtp_rewrite = true\n"
            )),
            [
                "t.toml:6:15: flow \"x\": rtp_rewrite needs RTP headers to rewrite but payload is \"udp\"; set payload = \"rtp\" or \"rtp-mpegts\", or remove rtp_rewrite"
            ]
        );
        assert_eq!(
            errors(&flow(
                &[A, B],
                "redundancy = \"merge\"\npayload = \"rtp\"\nrtp_rewrite = true\n"
            )),
            [
                "t.toml:7:15: flow \"x\": rtp_rewrite is only valid with redundancy = \"failover\"; remove it or change redundancy"
            ]
        );
        assert_eq!(
            errors(&flow(
                &[A, B],
                "redundancy = \"failover\"\npayload = \"rtp\"\nrtp_rewrite = 1\n"
            )),
            ["t.toml:7:15: flow \"x\": rtp_rewrite must be true or false, found integer"]
        );
        let one = format!(
            "[[flow]]\nname = \"x\"\ninput = {A}\noutputs = {OUT}\npayload = \"rtp\"\nrtp_rewrite = true\n"
        );
        assert_eq!(
            errors(&one),
            [
                "t.toml:6:15: flow \"x\": rtp_rewrite needs 2 to 4 legs and a redundancy; remove it, or list the legs in inputs and set redundancy"
            ]
        );
    }
}
