//! The daemon's counters in the Prometheus text exposition format 0.0.4.
//!
//! Names follow Prometheus conventions: an `mcrelay_` prefix, base units
//! (bytes, seconds), `_total` on counters, one `# HELP` and one `# TYPE`
//! line per family right before its samples. Label values are escaped
//! (`\\`, `\"`, `\n`), so flow names and output labels from the
//! configuration can't break a line. Served as
//! `text/plain; version=0.0.4; charset=utf-8`.

use std::fmt::{Display, Write};

use crate::snapshot::{
    DaemonState, FlowSnapshot, InputHealth, OutputSnapshot, PoolClassSnapshot, RtpHealth, Snapshot,
    TsHealth, WorkerSnapshot, input_label,
};

/// The `Content-Type` of [`render_metrics`]' output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Every metric of `s`, ready to serve on `/metrics`.
pub fn render_metrics(s: &Snapshot) -> String {
    let mut m = Exposition::for_snapshot(s);

    m.family("mcrelay_up", Kind::Gauge, "1 while the daemon answers.");
    m.sample("mcrelay_up", &[], 1);
    m.family(
        "mcrelay_build_info",
        Kind::Gauge,
        "Always 1; the daemon's version as a label.",
    );
    m.sample("mcrelay_build_info", &[("version", &s.version)], 1);
    m.family(
        "mcrelay_degraded",
        Kind::Gauge,
        "1 if part of the configuration is not relaying, else 0.",
    );
    let degraded = u8::from(matches!(s.state, DaemonState::Degraded(_)));
    m.sample("mcrelay_degraded", &[], degraded);
    m.family(
        "mcrelay_reloading",
        Kind::Gauge,
        "1 while a configuration reload is being applied, else 0.",
    );
    let reloading = u8::from(s.state == DaemonState::Reloading);
    m.sample("mcrelay_reloading", &[], reloading);
    m.family(
        "mcrelay_uptime_seconds",
        Kind::Gauge,
        "Seconds since the daemon started.",
    );
    m.sample("mcrelay_uptime_seconds", &[], Float(s.uptime_seconds));

    flow_families(&mut m, s);
    input_families(&mut m, s);
    redundancy_families(&mut m, s);
    output_families(&mut m, s);
    worker_families(&mut m, s);
    m.out
}

fn flow_families(m: &mut Exposition, s: &Snapshot) {
    type Value = fn(&FlowSnapshot) -> u64;
    let simple: [(&str, &str, Value); 5] = [
        (
            "mcrelay_flow_received_packets_total",
            "Datagrams received on the flow's input.",
            |f| f.packets_in,
        ),
        (
            "mcrelay_flow_received_bytes_total",
            "UDP payload bytes received on the flow's input.",
            |f| f.bytes_in,
        ),
        (
            "mcrelay_flow_receive_errors_total",
            "Receive completions that failed with an error.",
            |f| f.receive_errors,
        ),
        (
            "mcrelay_flow_receive_rearms_total",
            "Times the provided receive buffers ran out and the receive was re-armed.",
            |f| f.receive_rearms,
        ),
        (
            "mcrelay_flow_pool_fallbacks_total",
            "Datagrams copied into a larger pool class because the fitting one had no buffer for the flow.",
            |f| f.pool_fallbacks,
        ),
    ];
    for (name, help, value) in simple {
        m.family(name, Kind::Counter, help);
        for f in &s.flows {
            m.sample(name, &[("flow", &f.name)], value(f));
        }
    }

    m.family(
        "mcrelay_flow_up",
        Kind::Gauge,
        "1 while the flow relays; 0 while it is paused (an interface down or missing, \
         or its sockets could not be opened).",
    );
    for f in &s.flows {
        let up = u8::from(f.state.is_running());
        m.sample("mcrelay_flow_up", &[("flow", &f.name)], up);
    }
    m.family(
        "mcrelay_flow_interface_pauses_total",
        Kind::Counter,
        "Times the flow stopped relaying because an interface of it went down or away.",
    );
    for f in &s.flows {
        m.sample(
            "mcrelay_flow_interface_pauses_total",
            &[("flow", &f.name)],
            f.interface_pauses,
        );
    }

    let name = "mcrelay_flow_dropped_packets_total";
    m.family(
        name,
        Kind::Counter,
        "Datagrams of the flow not relayed, by reason: oversize (above the largest \
         buffer), pool_exhausted (no free buffer), kernel (socket buffer overflow); \
         packet ingress only: truncated, malformed, fragment, bad_checksum, \
         not_this_flow (frames that carried no datagram for the flow).",
    );
    for f in &s.flows {
        for (reason, n) in f.drops.by_reason() {
            m.sample(name, &[("flow", &f.name), ("reason", reason)], n);
        }
    }
}

/// Every input of every flow with its health, labelled: a flow's one
/// input, or each leg of a flow with several, under its own `input`.
fn inputs_of(s: &Snapshot) -> Vec<(&str, &InputHealth, String)> {
    let mut inputs = Vec::with_capacity(s.flows.len());
    for f in &s.flows {
        match &f.redundancy {
            None => inputs.push((f.name.as_str(), &f.health, input_label(&f.input))),
            Some(r) => inputs.extend(
                r.legs
                    .iter()
                    .map(|l| (f.name.as_str(), &l.health, input_label(&l.input))),
            ),
        }
    }
    inputs
}

/// Stream health, labelled `flow` and `input` (`address:port@interface`;
/// a flow with several inputs has each leg's under its own `input`), for
/// every flow that has run: silence and gaps for every payload mode, RTP
/// families for "rtp" and "rtp-mpegts" flows, TS families for "mpegts"
/// and "rtp-mpegts" flows.
fn input_families(m: &mut Exposition, s: &Snapshot) {
    struct Input<'a> {
        name: &'a str,
        health: &'a InputHealth,
    }
    let inputs: Vec<(Input<'_>, String)> = inputs_of(s)
        .into_iter()
        .filter(|(_, h, _)| !h.payload.is_empty())
        .map(|(name, health, label)| (Input { name, health }, label))
        .collect();
    fn emit(m: &mut Exposition, name: &str, f: &Input<'_>, input: &str, v: impl Display) {
        m.sample(name, &[("flow", f.name), ("input", input)], v);
    }

    m.family(
        "mcrelay_input_silent",
        Kind::Gauge,
        "1 while no datagram has arrived on the input for the flow's silence_ms, else 0.",
    );
    for (f, input) in &inputs {
        emit(
            m,
            "mcrelay_input_silent",
            f,
            input,
            u8::from(f.health.silent),
        );
    }
    m.family(
        "mcrelay_input_max_gap_seconds",
        Kind::Gauge,
        "Longest gap between datagrams on the input since the previous read, counting the one still open.",
    );
    for (f, input) in &inputs {
        let gap = Float(f.health.max_gap_ns as f64 / 1e9);
        emit(m, "mcrelay_input_max_gap_seconds", f, input, gap);
    }

    type RtpValue = fn(&RtpHealth) -> u64;
    let rtp: [(&str, &str, RtpValue); 7] = [
        (
            "mcrelay_input_rtp_packets_total",
            "Datagrams with a valid RTP header.",
            |r| r.packets,
        ),
        (
            "mcrelay_input_rtp_lost_packets_total",
            "RTP sequence numbers skipped and never arrived.",
            |r| r.lost,
        ),
        (
            "mcrelay_input_rtp_duplicate_packets_total",
            "RTP packets whose sequence number had already arrived.",
            |r| r.duplicates,
        ),
        (
            "mcrelay_input_rtp_reordered_packets_total",
            "RTP packets that arrived after a higher sequence number.",
            |r| r.reordered,
        ),
        (
            "mcrelay_input_rtp_ssrc_changes_total",
            "Times the RTP SSRC changed (a new source).",
            |r| r.ssrc_changes,
        ),
        (
            "mcrelay_input_rtp_resyncs_total",
            "RTP sequence jumps too large to count as loss; counting restarted.",
            |r| r.resyncs,
        ),
        (
            "mcrelay_input_rtp_malformed_packets_total",
            "Datagrams that are not RTP version 2 (relayed unchanged).",
            |r| r.malformed,
        ),
    ];
    for (name, help, value) in rtp {
        m.family(name, Kind::Counter, help);
        for (f, input) in &inputs {
            if let Some(r) = &f.health.rtp {
                emit(m, name, f, input, value(r));
            }
        }
    }
    m.family(
        "mcrelay_input_rtp_jitter_seconds",
        Kind::Gauge,
        "RTP interarrival jitter (RFC 3550 6.4.1) of the input.",
    );
    for (f, input) in &inputs {
        if let Some(r) = &f.health.rtp {
            let j = Float(r.jitter_ns as f64 / 1e9);
            emit(m, "mcrelay_input_rtp_jitter_seconds", f, input, j);
        }
    }

    type TsValue = fn(&TsHealth) -> u64;
    let ts: [(&str, Kind, &str, TsValue); 5] = [
        (
            "mcrelay_input_ts_packets_total",
            Kind::Counter,
            "MPEG-TS packets read on the input.",
            |t| t.packets,
        ),
        (
            "mcrelay_input_ts_continuity_errors_total",
            Kind::Counter,
            "MPEG-TS continuity-counter errors (TR 101 290 1.4).",
            |t| t.continuity_errors,
        ),
        (
            "mcrelay_input_ts_sync_errors_total",
            Kind::Counter,
            "Datagrams not a multiple of 188 bytes, and TS packets without the 0x47 sync byte.",
            |t| t.sync_errors,
        ),
        (
            "mcrelay_input_ts_transport_errors_total",
            Kind::Counter,
            "MPEG-TS packets with the transport-error indicator set (TR 101 290 2.1).",
            |t| t.transport_errors,
        ),
        (
            "mcrelay_input_ts_pids",
            Kind::Gauge,
            "Distinct MPEG-TS PIDs seen on the input.",
            |t| t.pids,
        ),
    ];
    for (name, kind, help, value) in ts {
        m.family(name, kind, help);
        for (f, input) in &inputs {
            if let Some(t) = &f.health.ts {
                emit(m, name, f, input, value(t));
            }
        }
    }
}

/// Flows with several inputs (legs): what `redundancy` did, labelled
/// `flow`, and per leg (labelled `flow` and `input`, as stream health)
/// what each forwarded and whether it is the active one.
fn redundancy_families(m: &mut Exposition, s: &Snapshot) {
    let flows: Vec<(&FlowSnapshot, &crate::snapshot::RedundancySnapshot)> = s
        .flows
        .iter()
        .filter_map(|f| Some((f, f.redundancy.as_ref()?)))
        .collect();
    type Value = fn(&crate::snapshot::RedundancySnapshot) -> u64;
    let per_flow: [(&str, &str, Value); 4] = [
        (
            "mcrelay_flow_merge_recovered_packets_total",
            "Merge: packets forwarded from one input while another missed them.",
            |r| r.recovered,
        ),
        (
            "mcrelay_flow_merge_duplicate_packets_total",
            "Later copies of packets already forwarded (merge), or repeats after a \
             failover switch: dropped.",
            |r| r.duplicates,
        ),
        (
            "mcrelay_flow_merge_lost_packets_total",
            "Merge: sequence numbers no input delivered within merge_window_ms.",
            |r| r.lost,
        ),
        (
            "mcrelay_flow_input_switches_total",
            "Failover: changes of the input the flow forwards from.",
            |r| r.switches,
        ),
    ];
    for (name, help, value) in per_flow {
        m.family(name, Kind::Counter, help);
        for (f, r) in &flows {
            m.sample(name, &[("flow", &f.name)], value(r));
        }
    }
    let name = "mcrelay_flow_active_input";
    m.family(
        name,
        Kind::Gauge,
        "Failover: 1 for the input the flow forwards from now, 0 for the others.",
    );
    for (f, r) in flows.iter().filter(|(_, r)| r.mode == "failover") {
        for (i, leg) in r.legs.iter().enumerate() {
            let active = u8::from(r.active_input == i as u64);
            m.sample(
                name,
                &[("flow", &f.name), ("input", &input_label(&leg.input))],
                active,
            );
        }
    }
    let name = "mcrelay_input_forwarded_packets_total";
    m.family(
        name,
        Kind::Counter,
        "Datagrams of the input forwarded to the flow's outputs (flows with several inputs).",
    );
    for (f, r) in &flows {
        for leg in &r.legs {
            m.sample(
                name,
                &[("flow", &f.name), ("input", &input_label(&leg.input))],
                leg.forwarded,
            );
        }
    }
}

fn output_families(m: &mut Exposition, s: &Snapshot) {
    type Value = fn(&OutputSnapshot) -> u64;
    let simple: [(&str, Kind, &str, Value); 7] = [
        (
            "mcrelay_output_sent_packets_total",
            Kind::Counter,
            "Datagrams sent to the output.",
            |o| o.packets_out,
        ),
        (
            "mcrelay_output_sent_bytes_total",
            Kind::Counter,
            "UDP payload bytes sent to the output.",
            |o| o.bytes_out,
        ),
        (
            "mcrelay_output_in_flight_high_water",
            Kind::Gauge,
            "Most sends the output ever had in flight at once.",
            |o| o.in_flight_high_water,
        ),
        (
            "mcrelay_output_gso_sends_total",
            Kind::Counter,
            "UDP GSO sends completed (each carried several datagrams).",
            |o| o.gso_sends,
        ),
        (
            "mcrelay_output_gso_fallbacks_total",
            Kind::Counter,
            "GSO sends the kernel refused; their datagrams were sent one by one.",
            |o| o.gso_fallbacks,
        ),
        (
            "mcrelay_output_connected",
            Kind::Gauge,
            "1 if the output is connected; 0 while it waits for a route or its source \
             address (its sends fail; retried every second).",
            |o| u64::from(o.not_connected.is_none()),
        ),
        (
            "mcrelay_output_connect_failures_total",
            Kind::Counter,
            "Attempts to connect the output that failed (no route, source address missing).",
            |o| o.connect_failures,
        ),
    ];
    for (name, kind, help, value) in simple {
        m.family(name, kind, help);
        for f in &s.flows {
            for o in &f.outputs {
                m.sample(name, &[("flow", &f.name), ("output", &o.label)], value(o));
            }
        }
    }

    let name = "mcrelay_output_dropped_packets_total";
    m.family(
        name,
        Kind::Counter,
        "Datagrams not sent to the output, by reason: backlog (too many sends in \
         flight), send_error (the send failed).",
    );
    for f in &s.flows {
        for o in &f.outputs {
            for (reason, n) in [
                ("backlog", o.drops_backlog),
                ("send_error", o.drops_send_error),
            ] {
                let labels = [
                    ("flow", f.name.as_str()),
                    ("output", &o.label),
                    ("reason", reason),
                ];
                m.sample(name, &labels, n);
            }
        }
    }
}

fn worker_families(m: &mut Exposition, s: &Snapshot) {
    type PoolValue = fn(&PoolClassSnapshot) -> u64;
    let pools: [(&str, Kind, &str, PoolValue); 5] = [
        (
            "mcrelay_pool_buffers",
            Kind::Gauge,
            "Buffers in the worker's pool class.",
            |p| u64::from(p.capacity),
        ),
        (
            "mcrelay_pool_buffers_in_use",
            Kind::Gauge,
            "Buffers of the class out of the pool now.",
            |p| u64::from(p.in_use),
        ),
        (
            "mcrelay_pool_buffers_high_water",
            Kind::Gauge,
            "Most buffers of the class ever out at once.",
            |p| u64::from(p.high_water),
        ),
        (
            "mcrelay_pool_taken_total",
            Kind::Counter,
            "Buffers of the class taken from the pool.",
            |p| p.taken,
        ),
        (
            "mcrelay_pool_exhausted_total",
            Kind::Counter,
            "Takes that failed because the class had no free buffer.",
            |p| p.exhausted,
        ),
    ];
    for (name, kind, help, value) in pools {
        m.family(name, kind, help);
        for w in &s.workers {
            let worker = w.index.to_string();
            for p in &w.pools {
                m.sample(name, &[("worker", &worker), ("class", &p.class)], value(p));
            }
        }
    }

    type LoopValue = fn(&WorkerSnapshot) -> u64;
    let loops: [(&str, &str, LoopValue); 3] = [
        (
            "mcrelay_worker_loop_turns_total",
            "Turns of the worker's event loop.",
            |w| w.loop_turns,
        ),
        (
            "mcrelay_worker_completions_total",
            "Completions the worker handled.",
            |w| w.completions,
        ),
        (
            "mcrelay_worker_sends_submitted_total",
            "Send operations the worker submitted (a GSO send counts once).",
            |w| w.sends_submitted,
        ),
    ];
    for (name, help, value) in loops {
        m.family(name, Kind::Counter, help);
        for w in &s.workers {
            m.sample(name, &[("worker", &w.index.to_string())], value(w));
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
}

/// A sample value written as Prometheus expects floats (`+Inf`, `NaN`).
struct Float(f64);

impl Display for Float {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            x if x.is_nan() => f.write_str("NaN"),
            x if x == f64::INFINITY => f.write_str("+Inf"),
            x if x == f64::NEG_INFINITY => f.write_str("-Inf"),
            x => write!(f, "{x}"),
        }
    }
}

/// The text being built. `fmt::Write` into a `String` cannot fail, so the
/// results of `write!` are ignored.
struct Exposition {
    out: String,
}

impl Exposition {
    /// An empty exposition with room for every line of `s`.
    fn for_snapshot(s: &Snapshot) -> Self {
        let outputs: usize = s.flows.iter().map(|f| f.outputs.len()).sum();
        let pools: usize = s.workers.iter().map(|w| w.pools.len()).sum();
        // Stream health adds up to 15 samples per input, with two labels;
        // a flow with several inputs 7 more per flow and 2 per input.
        let samples = 7 * s.flows.len() + 7 * outputs + 5 * pools + 3 * s.workers.len();
        let legs: usize = s
            .flows
            .iter()
            .filter_map(|f| f.redundancy.as_ref())
            .map(|r| 7 + 2 * r.legs.len())
            .sum();
        let health = 15
            * inputs_of(s)
                .iter()
                .filter(|(_, h, _)| !h.payload.is_empty())
                .count()
            + legs;
        Self {
            out: String::with_capacity(4096 + 128 * samples + 160 * health + 2048),
        }
    }

    fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let kind = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        };
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Display) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (label, value)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                self.out.push_str(label);
                self.out.push_str("=\"");
                escape_label_value(&mut self.out, value);
                self.out.push('"');
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }
}

/// Appends `value` escaped for a label value: `\`, `"` and newline.
fn escape_label_value(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// `help` escaped for a `# HELP` line: `\` and newline.
fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use super::*;
    use crate::snapshot::sample;

    /// One parsed sample line.
    #[derive(Debug)]
    struct Sample {
        name: String,
        labels: Vec<(String, String)>,
        value: f64,
    }

    fn valid_metric_name(name: &str) -> bool {
        let mut chars = name.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }

    fn valid_label_name(name: &str) -> bool {
        let mut chars = name.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !name.starts_with("__")
    }

    /// Parses `name{a="x",b="y"} value` strictly, unescaping label values.
    fn parse_sample(line: &str) -> Result<Sample, String> {
        let name_end = line
            .find(['{', ' '])
            .ok_or_else(|| format!("no value: {line}"))?;
        let name = &line[..name_end];
        if !valid_metric_name(name) {
            return Err(format!("bad metric name {name:?}"));
        }
        let mut rest = &line[name_end..];
        let mut labels = Vec::new();
        if let Some(after) = rest.strip_prefix('{') {
            rest = after;
            loop {
                if let Some(after) = rest.strip_prefix('}') {
                    rest = after;
                    break;
                }
                let eq = rest
                    .find("=\"")
                    .ok_or_else(|| format!("bad label in {line}"))?;
                let label = &rest[..eq];
                if !valid_label_name(label) {
                    return Err(format!("bad label name {label:?}"));
                }
                let mut value = String::new();
                let mut chars = rest[eq + 2..].char_indices();
                let close = loop {
                    match chars.next() {
                        None => return Err(format!("unterminated label value in {line}")),
                        Some((i, '"')) => break i,
                        Some((_, '\\')) => match chars.next() {
                            Some((_, '\\')) => value.push('\\'),
                            Some((_, '"')) => value.push('"'),
                            Some((_, 'n')) => value.push('\n'),
                            other => return Err(format!("bad escape {other:?} in {line}")),
                        },
                        Some((_, '\n')) => return Err("raw newline".into()),
                        Some((_, c)) => value.push(c),
                    }
                };
                labels.push((label.to_string(), value));
                rest = &rest[eq + 2 + close + 1..];
                rest = rest.strip_prefix(',').unwrap_or(rest);
            }
        }
        let value = rest
            .strip_prefix(' ')
            .ok_or_else(|| format!("no space before value: {line}"))?;
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().map_err(|_| format!("bad value {v:?}"))?,
        };
        Ok(Sample {
            name: name.into(),
            labels,
            value,
        })
    }

    /// Checks the structure of an exposition and returns its samples and
    /// each family's type.
    fn check(text: &str) -> (Vec<Sample>, HashMap<String, String>) {
        let mut helped = HashSet::new();
        let mut types = HashMap::new();
        let mut finished = HashSet::new();
        let mut current: Option<String> = None;
        let mut samples = Vec::new();
        assert!(text.ends_with('\n'));
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap().to_string();
                assert!(valid_metric_name(&name), "{line}");
                assert!(helped.insert(name.clone()), "second HELP for {name}");
                assert!(!types.contains_key(&name), "HELP after TYPE for {name}");
                if let Some(prev) = current.replace(name) {
                    finished.insert(prev);
                }
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert_eq!(current.as_deref(), Some(name), "TYPE without HELP: {line}");
                assert!(["counter", "gauge"].contains(&kind), "{line}");
                assert!(types.insert(name.to_string(), kind.to_string()).is_none());
                if kind == "counter" {
                    assert!(name.ends_with("_total"), "counter {name} without _total");
                } else {
                    assert!(!name.ends_with("_total"), "gauge {name} ends in _total");
                }
            } else {
                assert!(!line.starts_with('#'), "stray comment {line}");
                let sample = parse_sample(line).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(current.as_deref(), Some(sample.name.as_str()), "{line}");
                assert!(
                    types.contains_key(&sample.name),
                    "sample before TYPE: {line}"
                );
                assert!(!finished.contains(&sample.name));
                assert!(sample.name.starts_with("mcrelay_"));
                samples.push(sample);
            }
        }
        assert_eq!(helped.len(), types.len());
        (samples, types)
    }

    fn find<'a>(samples: &'a [Sample], name: &str, labels: &[(&str, &str)]) -> &'a Sample {
        samples
            .iter()
            .find(|s| {
                s.name == name
                    && s.labels.len() == labels.len()
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.iter().any(|(sk, sv)| sk == k && sv == v))
            })
            .unwrap_or_else(|| panic!("no sample {name}{labels:?}"))
    }

    #[test]
    fn exposition_is_well_formed_and_complete() {
        let text = render_metrics(&sample());
        let (samples, types) = check(&text);
        for family in [
            "mcrelay_up",
            "mcrelay_degraded",
            "mcrelay_uptime_seconds",
            "mcrelay_flow_received_packets_total",
            "mcrelay_flow_received_bytes_total",
            "mcrelay_flow_dropped_packets_total",
            "mcrelay_flow_receive_errors_total",
            "mcrelay_output_sent_packets_total",
            "mcrelay_output_sent_bytes_total",
            "mcrelay_output_dropped_packets_total",
            "mcrelay_pool_buffers",
            "mcrelay_pool_buffers_in_use",
            "mcrelay_pool_buffers_high_water",
            "mcrelay_pool_exhausted_total",
            "mcrelay_worker_loop_turns_total",
            "mcrelay_worker_completions_total",
        ] {
            assert!(types.contains_key(family), "{family} missing");
        }
        let v = |name, labels: &[(&str, &str)]| find(&samples, name, labels).value;
        assert_eq!(v("mcrelay_up", &[]), 1.0);
        assert_eq!(v("mcrelay_degraded", &[]), 0.0);
        assert_eq!(v("mcrelay_uptime_seconds", &[]), 3723.5);
        let flow = ("flow", "video-a");
        assert_eq!(v("mcrelay_flow_received_packets_total", &[flow]), 812.0);
        assert_eq!(v("mcrelay_flow_received_bytes_total", &[flow]), 1_048_576.0);
        assert_eq!(v("mcrelay_flow_receive_errors_total", &[flow]), 4.0);
        let dropped = "mcrelay_flow_dropped_packets_total";
        assert_eq!(v(dropped, &[flow, ("reason", "oversize")]), 1.0);
        assert_eq!(v(dropped, &[flow, ("reason", "pool_exhausted")]), 2.0);
        assert_eq!(v(dropped, &[flow, ("reason", "kernel")]), 3.0);
        let out = ("output", "10.0.0.1:6000");
        assert_eq!(v("mcrelay_output_sent_packets_total", &[flow, out]), 800.0);
        assert_eq!(v("mcrelay_output_sent_bytes_total", &[flow, out]), 1e6);
        let dropped = "mcrelay_output_dropped_packets_total";
        assert_eq!(v(dropped, &[flow, out, ("reason", "backlog")]), 6.0);
        assert_eq!(v(dropped, &[flow, out, ("reason", "send_error")]), 7.0);
        let jumbo = [("worker", "0"), ("class", "jumbo")];
        assert_eq!(v("mcrelay_pool_buffers", &jumbo), 256.0);
        assert_eq!(v("mcrelay_pool_exhausted_total", &jumbo), 9.0);
        let small = [("worker", "0"), ("class", "small")];
        assert_eq!(v("mcrelay_pool_buffers_in_use", &small), 17.0);
        assert_eq!(v("mcrelay_pool_buffers_high_water", &small), 20.0);
        assert_eq!(
            v("mcrelay_worker_loop_turns_total", &[("worker", "0")]),
            5000.0
        );
        assert_eq!(
            v("mcrelay_worker_completions_total", &[("worker", "0")]),
            20000.0
        );
    }

    #[test]
    fn input_health_families() {
        let mut s = sample();
        let (samples, types) = check(&render_metrics(&s));
        let v = |name, labels: &[(&str, &str)]| find(&samples, name, labels).value;
        let l = [("flow", "video-a"), ("input", "239.1.1.1:5000@vRA")];
        for (name, want) in [
            ("mcrelay_input_rtp_lost_packets_total", 3.0),
            ("mcrelay_input_rtp_duplicate_packets_total", 2.0),
            ("mcrelay_input_rtp_reordered_packets_total", 1.0),
            ("mcrelay_input_rtp_ssrc_changes_total", 1.0),
            ("mcrelay_input_rtp_malformed_packets_total", 4.0),
            ("mcrelay_input_rtp_jitter_seconds", 0.0015),
            ("mcrelay_input_ts_sync_errors_total", 5.0),
            ("mcrelay_input_ts_continuity_errors_total", 6.0),
            ("mcrelay_input_ts_transport_errors_total", 7.0),
            ("mcrelay_input_ts_pids", 4.0),
            ("mcrelay_input_silent", 0.0),
            ("mcrelay_input_max_gap_seconds", 0.025),
        ] {
            assert_eq!(v(name, &l), want, "{name}");
        }
        assert_eq!(types["mcrelay_input_rtp_jitter_seconds"], "gauge");
        assert_eq!(types["mcrelay_input_rtp_lost_packets_total"], "counter");
        // A udp flow: silence and gaps only; an older daemon: nothing.
        s.flows[0].health.rtp = None;
        s.flows[0].health.ts = None;
        s.flows[0].health.silent = true;
        let (samples, _) = check(&render_metrics(&s));
        assert_eq!(find(&samples, "mcrelay_input_silent", &l).value, 1.0);
        assert!(
            !samples
                .iter()
                .any(|x| x.name.starts_with("mcrelay_input_rtp"))
        );
        s.flows[0].health = Default::default();
        let (samples, _) = check(&render_metrics(&s));
        assert!(!samples.iter().any(|x| x.name.starts_with("mcrelay_input_")));
    }

    #[test]
    fn redundancy_families() {
        let mut s = crate::snapshot::sample_with_legs();
        let (samples, types) = check(&render_metrics(&s));
        let v = |name, labels: &[(&str, &str)]| find(&samples, name, labels).value;
        let flow = ("flow", "video-r");
        for (name, want, kind) in [
            (
                "mcrelay_flow_merge_recovered_packets_total",
                25.0,
                "counter",
            ),
            (
                "mcrelay_flow_merge_duplicate_packets_total",
                475.0,
                "counter",
            ),
            ("mcrelay_flow_merge_lost_packets_total", 2.0, "counter"),
            ("mcrelay_flow_input_switches_total", 0.0, "counter"),
        ] {
            assert_eq!(v(name, &[flow]), want, "{name}");
            assert_eq!(types[name], kind);
        }
        let a = ("input", "239.1.1.1:5000@vRA");
        let b = ("input", "239.1.2.1:5000@vRB");
        let forwarded = "mcrelay_input_forwarded_packets_total";
        assert_eq!(v(forwarded, &[flow, a]), 490.0);
        assert_eq!(v(forwarded, &[flow, b]), 10.0);
        // Each leg's health under its own input label.
        let lost = "mcrelay_input_rtp_lost_packets_total";
        assert_eq!(v(lost, &[flow, a]), 10.0);
        assert_eq!(v(lost, &[flow, b]), 15.0);
        // A flow with one input has none of these.
        let one = ("flow", "video-a");
        assert!(
            !samples
                .iter()
                .any(|x| x.name.contains("merge") && x.labels.iter().any(|(_, v)| v == one.1))
        );
        // Merge has no active input; failover says which.
        assert!(
            !samples
                .iter()
                .any(|x| x.name == "mcrelay_flow_active_input")
        );
        let r = s.flows[1].redundancy.as_mut().expect("legs");
        r.mode = "failover".into();
        r.active_input = 1;
        r.switches = 3;
        let (samples, types) = check(&render_metrics(&s));
        let v = |name, labels: &[(&str, &str)]| find(&samples, name, labels).value;
        assert_eq!(types["mcrelay_flow_active_input"], "gauge");
        assert_eq!(v("mcrelay_flow_active_input", &[flow, a]), 0.0);
        assert_eq!(v("mcrelay_flow_active_input", &[flow, b]), 1.0);
        assert_eq!(v("mcrelay_flow_input_switches_total", &[flow]), 3.0);
        let m = Exposition::for_snapshot(&s);
        assert!(render_metrics(&s).len() <= m.out.capacity());
    }

    #[test]
    fn flow_up_and_interface_pauses() {
        let mut s = sample();
        let flow = ("flow", "video-a");
        let (samples, types) = check(&render_metrics(&s));
        assert_eq!(types["mcrelay_flow_up"], "gauge");
        assert_eq!(types["mcrelay_flow_interface_pauses_total"], "counter");
        assert_eq!(find(&samples, "mcrelay_flow_up", &[flow]).value, 1.0);
        s.flows[0].state = crate::FlowState::WaitingForInterface {
            interface: "eth9".into(),
        };
        s.flows[0].interface_pauses = 3;
        let (samples, _) = check(&render_metrics(&s));
        assert_eq!(find(&samples, "mcrelay_flow_up", &[flow]).value, 0.0);
        assert_eq!(
            find(&samples, "mcrelay_flow_interface_pauses_total", &[flow]).value,
            3.0
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let mut s = sample();
        let hostile = "a\\b\"c\nd} x=\"1\" 2";
        s.flows[0].name = hostile.into();
        s.flows[0].outputs[0].label = "\"\n\\".into();
        let text = render_metrics(&s);
        assert!(text.contains(r#"{flow="a\\b\"c\nd} x=\"1\" 2"}"#), "{text}");
        let (samples, _) = check(&text);
        let flow = ("flow", hostile);
        assert_eq!(
            find(&samples, "mcrelay_flow_received_packets_total", &[flow]).value,
            812.0
        );
        let out = ("output", "\"\n\\");
        assert_eq!(
            find(&samples, "mcrelay_output_sent_packets_total", &[flow, out]).value,
            800.0
        );
    }

    #[test]
    fn states_and_odd_values() {
        let mut s = sample();
        s.state = DaemonState::Degraded("x".into());
        s.uptime_seconds = f64::INFINITY;
        s.flows.clear();
        s.workers.clear();
        let text = render_metrics(&s);
        let (samples, types) = check(&text);
        assert_eq!(find(&samples, "mcrelay_degraded", &[]).value, 1.0);
        assert_eq!(
            find(&samples, "mcrelay_uptime_seconds", &[]).value,
            f64::INFINITY
        );
        // Families keep their metadata even with no samples.
        assert!(types.contains_key("mcrelay_flow_received_packets_total"));
        s.state = DaemonState::Reloading;
        let (samples, _) = check(&render_metrics(&s));
        assert_eq!(find(&samples, "mcrelay_reloading", &[]).value, 1.0);
        assert_eq!(find(&samples, "mcrelay_degraded", &[]).value, 0.0);
    }

    #[test]
    fn the_checker_rejects_bad_lines() {
        assert!(parse_sample("9bad 1").is_err());
        assert!(parse_sample("ok{a=\"x} 1").is_err());
        assert!(parse_sample("ok{a=\"\\q\"} 1").is_err());
        assert!(parse_sample("ok{__a=\"x\"} 1").is_err());
        assert!(parse_sample("ok 1x").is_err());
        assert!(parse_sample("ok{a=\"x\",b=\"y\"} 2").is_ok());
    }

    #[test]
    fn output_fits_its_preallocation() {
        let mut s = sample();
        let flow = s.flows[0].clone();
        for i in 0..50 {
            let mut f = flow.clone();
            f.name = format!("flow-{i}");
            s.flows.push(f);
        }
        let m = Exposition::for_snapshot(&s);
        let capacity = m.out.capacity();
        assert!(render_metrics(&s).len() <= capacity);
    }
}
