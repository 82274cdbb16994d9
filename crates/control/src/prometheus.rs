//! The daemon's counters for Prometheus, in the text exposition format
//! 0.0.4 and in OpenMetrics 1.0, chosen by the scraper's `Accept` header
//! ([`Format::negotiate`]).
//!
//! Names follow Prometheus conventions: an `mcrelay_` prefix, base units
//! (bytes, seconds), `_total` on counters, one `# HELP` and one `# TYPE`
//! line per family right before its samples. Label values are escaped
//! (`\\`, `\"`, `\n`), so flow names and output labels from the
//! configuration can't break a line. Both formats are written here, by
//! hand, from the same family functions. The Prometheus project's
//! `prometheus-client` encodes the same families into OpenMetrics only as
//! a reference: the tests hold the hand-written output to it, and the
//! benchmarks compare the two (behind the `prometheus-client` feature,
//! never in the daemon; `docs/benchmarks.md` has both measured at 1000
//! flows, and why the exposition stays hand-written).

use std::fmt::{Display, Write};

use crate::counters::{self, Counter, Metric};
use crate::snapshot::{
    DaemonState, FlowSnapshot, InputHealth, LegSnapshot, Snapshot, WorkerSnapshot, input_label,
};

/// The `Content-Type` of [`render_metrics`]' output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The `Content-Type` of OpenMetrics ([`Format::OpenMetrics`]).
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The exposition formats `/metrics` speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The Prometheus text format 0.0.4.
    Text,
    /// OpenMetrics 1.0 text (counters' `# TYPE` name without `_total`,
    /// `# EOF` last).
    OpenMetrics,
}

impl Format {
    /// The format for a request's `Accept` header: OpenMetrics when the
    /// client prefers it (a higher `q` than `text/plain` or a wildcard),
    /// as Prometheus does; text otherwise, and without the header.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let Some(accept) = accept else {
            return Format::Text;
        };
        let (mut openmetrics, mut text) = (0.0f32, 0.0f32);
        for range in accept.split(',') {
            let mut params = range.split(';');
            let media = params.next().unwrap_or_default().trim();
            let q = params
                .filter_map(|p| p.trim().strip_prefix("q="))
                .find_map(|q| q.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            if media.eq_ignore_ascii_case("application/openmetrics-text") {
                openmetrics = openmetrics.max(q);
            } else if ["text/plain", "text/*", "*/*"]
                .iter()
                .any(|m| media.eq_ignore_ascii_case(m))
            {
                text = text.max(q);
            }
        }
        if openmetrics > 0.0 && openmetrics > text {
            Format::OpenMetrics
        } else {
            Format::Text
        }
    }

    /// The `Content-Type` of this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => CONTENT_TYPE,
            Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
        }
    }
}

/// Every metric of `s` in the text format, ready to serve on `/metrics`.
pub fn render_metrics(s: &Snapshot) -> String {
    render(s, Format::Text)
}

/// Every metric of `s` in `format`.
pub fn render(s: &Snapshot, format: Format) -> String {
    emit_all(Exposition::for_snapshot(s, format), s).finish()
}

/// Every family of `s`, in order, into `m`.
fn emit_all(mut m: Exposition, s: &Snapshot) -> Exposition {
    m.family("mcrelay_up", Kind::Gauge, "1 while the daemon answers.");
    m.sample("mcrelay_up", &[], 1u8);
    m.family(
        "mcrelay_build_info",
        Kind::Gauge,
        "Always 1; the daemon's version as a label.",
    );
    m.sample("mcrelay_build_info", &[("version", &s.version)], 1u8);
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
        "mcrelay_standby",
        Kind::Gauge,
        "1 while the daemon is a warm standby (receiving, sending nothing), 0 while it relays.",
    );
    m.sample("mcrelay_standby", &[], u8::from(s.mode.is_standby()));
    if let Some(e) = &s.metrics_endpoint {
        endpoint(&mut m, e);
    }
    m.family(
        "mcrelay_uptime_seconds",
        Kind::Gauge,
        "Seconds since the daemon started.",
    );
    m.sample("mcrelay_uptime_seconds", &[], Float(s.uptime_seconds));

    flow_families(&mut m, s);
    input_families(&mut m, s);
    redundancy_families(&mut m, s);
    fec_families(&mut m, s);
    rist_families(&mut m, s);
    output_families(&mut m, s);
    srt_families(&mut m, s);
    srt_input_families(&mut m, s);
    worker_families(&mut m, s);
    m
}

/// The rows of `table` with a family of their own ([`Metric::Family`],
/// [`Metric::Seconds`]), in table order: each family, then a sample per
/// item of `items` (its labels and its section).
fn table_families<'a, T: 'a, const N: usize>(
    m: &mut Exposition,
    table: &[Counter<T>],
    items: impl Iterator<Item = ([(&'a str, &'a str); N], &'a T)> + Clone,
) {
    for c in table {
        let (name, help, per_second) = match c.metric {
            Metric::Family { name, help } => (name, help, None),
            Metric::Seconds {
                name,
                help,
                per_second,
            } => (name, help, Some(per_second)),
            Metric::None | Metric::Reason { .. } => continue,
        };
        let kind = match c.kind {
            counters::Kind::Total => Kind::Counter,
            counters::Kind::Max | counters::Kind::Gauge => Kind::Gauge,
        };
        m.family(name, kind, help);
        for (labels, x) in items.clone() {
            let v = (c.value)(x);
            match per_second {
                None => m.sample(name, &labels, v),
                Some(per) => m.sample(name, &labels, Float(v as f64 / per)),
            }
        }
    }
}

/// The families by reason of `table` ([`Metric::Reason`]), in the order
/// of their first row: each family, then per item of `items` a sample
/// per reason, labelled as the item and `reason`.
fn table_reasons<'a, T: 'a, const N: usize>(
    m: &mut Exposition,
    table: &[Counter<T>],
    items: impl Iterator<Item = ([(&'a str, &'a str); N], &'a T)> + Clone,
) {
    const { assert!(N < 4, "at most three labels besides the reason") };
    for (i, c) in table.iter().enumerate() {
        let Some((family, _)) = c.reason() else {
            continue;
        };
        let same = |d: &Counter<T>| d.reason().is_some_and(|(f, _)| f.name == family.name);
        if table[..i].iter().any(same) {
            continue;
        }
        m.family(family.name, Kind::Counter, family.help);
        for (labels, x) in items.clone() {
            let mut l = [("", ""); 4];
            l[..N].copy_from_slice(&labels);
            for d in table {
                if let Some((f, reason)) = d.reason()
                    && f.name == family.name
                {
                    l[N] = ("reason", reason);
                    m.sample(family.name, &l[..=N], (d.value)(x));
                }
            }
        }
    }
}

fn flow_families(m: &mut Exposition, s: &Snapshot) {
    let flows = s.flows.iter().map(|f| ([("flow", f.name.as_str())], f));
    table_families(m, counters::FLOW, flows);
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
    let drops = s
        .flows
        .iter()
        .map(|f| ([("flow", f.name.as_str())], &f.drops));
    table_reasons(m, counters::INGRESS_DROPS, drops);
}

/// The metrics endpoint's own connection counters.
fn endpoint(m: &mut Exposition, e: &crate::EndpointSnapshot) {
    let none: [(&str, &str); 0] = [];
    table_families(m, counters::ENDPOINT, std::iter::once((none, e)));
    table_reasons(m, counters::ENDPOINT, std::iter::once((none, e)));
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
    let inputs: Vec<(&str, &InputHealth, String)> = inputs_of(s)
        .into_iter()
        .filter(|(_, h, _)| !h.payload.is_empty())
        .collect();
    let health = inputs
        .iter()
        .map(|(flow, h, input)| ([("flow", *flow), ("input", input.as_str())], *h));
    table_families(m, counters::INPUT_HEALTH, health.clone());
    let rtp = health
        .clone()
        .filter_map(|(labels, h)| Some((labels, h.rtp.as_ref()?)));
    table_families(m, counters::RTP, rtp);
    let ts = health.filter_map(|(labels, h)| Some((labels, h.ts.as_ref()?)));
    table_families(m, counters::TS, ts);
}

/// Flows with an input with `fec = "2022-1"`: what FEC repaired and
/// what it could not, labelled `flow`; and each FEC leg of a flow with
/// several inputs, labelled `flow` and `input` (as its stream health):
/// what its own decoder did, beside the flow's view.
fn fec_families(m: &mut Exposition, s: &Snapshot) {
    flow_and_leg_families(
        m,
        s,
        counters::FEC,
        |f| f.fec.as_ref(),
        counters::LEG_FEC,
        |l| l.fec.as_ref(),
    );
}

/// Flows with a RIST input or output: NACKs, retransmissions, what was
/// lost after them and the RTT, labelled `flow`; and each RIST leg of a
/// flow with several inputs, labelled `flow` and `input`: what its own
/// receiver did, beside the flow's view.
fn rist_families(m: &mut Exposition, s: &Snapshot) {
    flow_and_leg_families(
        m,
        s,
        counters::RIST,
        |f| f.rist.as_ref(),
        counters::LEG_RIST,
        |l| l.rist.as_ref(),
    );
}

/// The families of a section a flow may have (its table, and where a
/// flow keeps it) and of the same section of its legs: the flows' first,
/// then the legs'.
fn flow_and_leg_families<F, L>(
    m: &mut Exposition,
    s: &Snapshot,
    flow_table: &[Counter<F>],
    flow_of: fn(&FlowSnapshot) -> Option<&F>,
    leg_table: &[Counter<L>],
    leg_of: fn(&LegSnapshot) -> Option<&L>,
) {
    let flows = s
        .flows
        .iter()
        .filter_map(|f| Some(([("flow", f.name.as_str())], flow_of(f)?)));
    table_families(m, flow_table, flows);
    let legs: Vec<(&str, String, &L)> = s
        .flows
        .iter()
        .filter_map(|f| Some((f, f.redundancy.as_ref()?)))
        .flat_map(|(f, r)| {
            r.legs
                .iter()
                .filter_map(move |l| Some((f.name.as_str(), input_label(&l.input), leg_of(l)?)))
        })
        .collect();
    let legs = legs
        .iter()
        .map(|(flow, input, l)| ([("flow", *flow), ("input", input.as_str())], *l));
    table_families(m, leg_table, legs);
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
    let items = flows.iter().map(|(f, r)| ([("flow", f.name.as_str())], *r));
    table_families(m, counters::REDUNDANCY, items.clone());
    table_reasons(m, counters::REDUNDANCY, items);
    let name = "mcrelay_input_detached";
    m.family(
        name,
        Kind::Gauge,
        "Merge: 1 while the input is not merged (its numbering is not the flow's, or it is further behind than merge_window_ms).",
    );
    for (f, r) in flows.iter().filter(|(_, r)| r.mode == "merge") {
        for leg in &r.legs {
            m.sample(
                name,
                &[("flow", &f.name), ("input", &input_label(&leg.input))],
                u8::from(leg.detached),
            );
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
    let legs: Vec<(&str, String, &crate::snapshot::LegSnapshot)> = flows
        .iter()
        .flat_map(|(f, r)| {
            r.legs
                .iter()
                .map(|l| (f.name.as_str(), input_label(&l.input), l))
        })
        .collect();
    let legs = legs
        .iter()
        .map(|(flow, input, l)| ([("flow", *flow), ("input", input.as_str())], *l));
    table_families(m, counters::LEG, legs);
}

fn output_families(m: &mut Exposition, s: &Snapshot) {
    let outputs = s.flows.iter().flat_map(|f| {
        f.outputs
            .iter()
            .map(move |o| ([("flow", f.name.as_str()), ("output", o.label.as_str())], o))
    });
    table_families(m, counters::OUTPUT, outputs.clone());
    let name = "mcrelay_output_connected";
    m.family(
        name,
        Kind::Gauge,
        "1 if the output is connected; 0 while it waits for a route or its source \
         address (its sends fail; retried every second).",
    );
    for (labels, o) in outputs.clone() {
        m.sample(name, &labels, u8::from(o.not_connected.is_none()));
    }
    table_reasons(m, counters::OUTPUT, outputs);
}

/// `listener` or `caller`.
fn srt_mode(listener: bool) -> &'static str {
    if listener { "listener" } else { "caller" }
}

/// SRT outputs: per output, its callers and refusals; per caller (at most
/// `max_callers` each, so the series stay bounded), what it was sent,
/// dropped, and libsrt's retransmissions, losses, RTT and rate.
fn srt_families(m: &mut Exposition, s: &Snapshot) {
    let srt_outputs = s.flows.iter().flat_map(|f| {
        f.outputs
            .iter()
            .filter_map(move |o| o.srt.as_ref().map(|srt| (f, o, srt)))
    });
    let routes = srt_outputs.clone().map(|(f, o, r)| {
        let labels = [
            ("flow", f.name.as_str()),
            ("output", o.label.as_str()),
            ("mode", srt_mode(r.listener)),
        ];
        (labels, r)
    });
    let name = "mcrelay_srt_callers";
    m.family(
        name,
        Kind::Gauge,
        "SRT callers connected to the output (a caller output: 1 while connected).",
    );
    for (labels, r) in routes.clone() {
        m.sample(name, &labels, r.callers.len() as u64);
    }
    table_families(m, counters::SRT_OUTPUT, routes);
    let callers = srt_outputs.flat_map(|(f, o, r)| {
        r.callers.iter().map(move |c| {
            let labels = [
                ("flow", f.name.as_str()),
                ("output", o.label.as_str()),
                ("peer", c.peer.as_str()),
            ];
            (labels, c)
        })
    });
    table_families(m, counters::SRT_CALLER, callers);
}

/// SRT inputs: per input (one series each, labelled by flow, input and
/// mode), whether its peer is connected, what it received and handed the
/// worker, what was dropped on the way (by reason), libsrt's receive
/// losses, refusals and reconnections, and the RTT.
fn srt_input_families(m: &mut Exposition, s: &Snapshot) {
    let inputs = s.flows.iter().flat_map(|f| {
        f.srt_inputs.iter().map(move |i| {
            let labels = [
                ("flow", f.name.as_str()),
                ("input", i.label.as_str()),
                ("mode", srt_mode(i.listener)),
            ];
            (labels, i)
        })
    });
    let name = "mcrelay_srt_input_connected";
    m.family(
        name,
        Kind::Gauge,
        "1 while the SRT input's peer is connected (a listener: its caller; a caller: its connection).",
    );
    for (labels, i) in inputs.clone() {
        m.sample(name, &labels, u8::from(i.peer.is_some()));
    }
    table_families(m, counters::SRT_INPUT, inputs.clone());
    // The peer's libsrt counters, over its current connection (0 without
    // one): see counters::SRT_PEER.
    type PeerValue = fn(&crate::snapshot::SrtPeerSnapshot) -> u64;
    let peer: [(&str, &str, PeerValue); 2] = [
        (
            "mcrelay_srt_input_lost_packets_total",
            "Packets libsrt found missing on the SRT input (before retransmission), over its current connection.",
            |p| p.lost,
        ),
        (
            "mcrelay_srt_input_too_late_packets_total",
            "Packets libsrt dropped on the SRT input as too late for its latency (residual loss), over its current connection.",
            |p| p.too_late,
        ),
    ];
    for (name, help, value) in peer {
        m.family(name, Kind::Counter, help);
        for (labels, i) in inputs.clone() {
            m.sample(name, &labels, i.peer.as_ref().map_or(0, value));
        }
    }
    let dropped = inputs
        .clone()
        .map(|([flow, input, _], i)| ([flow, input], i));
    table_reasons(m, counters::SRT_INPUT, dropped);
    let name = "mcrelay_srt_input_rtt_seconds";
    m.family(
        name,
        Kind::Gauge,
        "Smoothed round-trip time to the SRT input's peer.",
    );
    for (labels, i) in inputs {
        if let Some(p) = &i.peer {
            #[allow(clippy::cast_precision_loss)]
            let rtt = p.rtt_us as f64 / 1e6;
            m.sample(name, &labels, Float(rtt));
        }
    }
}

fn worker_families(m: &mut Exposition, s: &Snapshot) {
    let workers: Vec<(String, &WorkerSnapshot)> =
        s.workers.iter().map(|w| (w.index.to_string(), w)).collect();
    let pools = workers.iter().flat_map(|(index, w)| {
        w.pools
            .iter()
            .map(move |p| ([("worker", index.as_str()), ("class", p.class.as_str())], p))
    });
    table_families(m, counters::POOL, pools);
    let loops = workers
        .iter()
        .map(|(index, w)| ([("worker", index.as_str())], *w));
    table_families(m, counters::WORKER, loops);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
}

/// A sample value written as Prometheus expects floats (`+Inf`, `NaN`).
#[derive(Debug, Clone, Copy)]
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

/// One sample's value: a count, or a float ([`Float`]).
#[derive(Debug, Clone, Copy)]
enum Value {
    Int(u64),
    Float(f64),
}

impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Value::Int(v)
    }
}

impl From<u32> for Value {
    fn from(v: u32) -> Self {
        Value::Int(u64::from(v))
    }
}

impl From<u8> for Value {
    fn from(v: u8) -> Self {
        Value::Int(u64::from(v))
    }
}

impl From<Float> for Value {
    fn from(v: Float) -> Self {
        Value::Float(v.0)
    }
}

impl Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Value::Int(v) => write!(f, "{v}"),
            Value::Float(v) => Float(v).fmt(f),
        }
    }
}

/// The exposition being built: written as it goes, by hand, in the text
/// format or OpenMetrics (which differ in two places: a counter's `# HELP`
/// and `# TYPE` name the family without `_total`, and `# EOF` ends it);
/// or, for the tests and benchmarks that hold the hand-written OpenMetrics
/// against the Prometheus project's `prometheus-client`, families gathered
/// for that library to encode ([`library::encode`]). The family functions
/// above drive every kind the same way.
enum Exposition {
    Written {
        /// `fmt::Write` into a `String` cannot fail, so the results of
        /// `write!` are ignored.
        out: String,
        openmetrics: bool,
    },
    #[cfg(any(test, feature = "prometheus-client"))]
    Library(Vec<library::Family>),
}

impl Exposition {
    /// An empty exposition in `format` with room for every line of `s`.
    fn for_snapshot(s: &Snapshot, format: Format) -> Self {
        Exposition::Written {
            out: String::with_capacity(text_capacity(s)),
            openmetrics: format == Format::OpenMetrics,
        }
    }

    fn family(&mut self, name: &str, kind: Kind, help: &str) {
        match self {
            Exposition::Written { out, openmetrics } => {
                let (name, kind) = match kind {
                    Kind::Counter if *openmetrics => {
                        (name.strip_suffix("_total").unwrap_or(name), "counter")
                    }
                    Kind::Counter => (name, "counter"),
                    Kind::Gauge => (name, "gauge"),
                };
                let _ = writeln!(out, "# HELP {name} {}", escape_help(help));
                let _ = writeln!(out, "# TYPE {name} {kind}");
            }
            #[cfg(any(test, feature = "prometheus-client"))]
            Exposition::Library(families) => {
                families.push(library::Family::new(name, kind, &escape_help(help)));
            }
        }
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Into<Value>) {
        let value = value.into();
        match self {
            Exposition::Written { out, .. } => {
                out.push_str(name);
                if !labels.is_empty() {
                    out.push('{');
                    for (i, (label, value)) in labels.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        out.push_str(label);
                        out.push_str("=\"");
                        escape_label_value(out, value);
                        out.push('"');
                    }
                    out.push('}');
                }
                let _ = writeln!(out, " {value}");
            }
            #[cfg(any(test, feature = "prometheus-client"))]
            Exposition::Library(families) => {
                if let Some(family) = families.last_mut() {
                    family.push(labels, value);
                }
            }
        }
    }

    fn finish(self) -> String {
        match self {
            Exposition::Written {
                mut out,
                openmetrics,
            } => {
                if openmetrics {
                    out.push_str("# EOF\n");
                }
                out
            }
            #[cfg(any(test, feature = "prometheus-client"))]
            Exposition::Library(families) => library::encode(families),
        }
    }
}

/// Every metric of `s` in OpenMetrics, encoded by the Prometheus project's
/// `prometheus-client` rather than by hand: the reference the tests hold
/// [`Format::OpenMetrics`] to, and the contender in `benches/metrics*.rs`
/// (2.9 times the instructions for 1000 flows: docs/benchmarks.md).
#[cfg(any(test, feature = "prometheus-client"))]
#[doc(hidden)]
pub fn render_with_prometheus_client(s: &Snapshot) -> String {
    emit_all(Exposition::Library(Vec::with_capacity(64)), s).finish()
}

/// Bytes to reserve for the text exposition of `s`.
fn text_capacity(s: &Snapshot) -> usize {
    let outputs: usize = s.flows.iter().map(|f| f.outputs.len()).sum();
    let pools: usize = s.workers.iter().map(|w| w.pools.len()).sum();
    // Stream health adds up to 15 samples per input, with two labels;
    // a flow with several inputs 13 more per flow and 3 per input.
    // An SRT output: 10 samples, and 7 per caller.
    let srt: usize = s
        .flows
        .iter()
        .flat_map(|f| &f.outputs)
        .filter_map(|o| o.srt.as_ref())
        .map(|r| 10 + 7 * r.callers.len())
        .sum::<usize>()
        + 11 * s.flows.iter().map(|f| f.srt_inputs.len()).sum::<usize>();
    // A RIST flow: 8 samples, and 4 per RIST leg of a flow with several.
    let rist = 8 * s.flows.iter().filter(|f| f.rist.is_some()).count()
        + 4 * s
            .flows
            .iter()
            .filter_map(|f| f.redundancy.as_ref())
            .flat_map(|r| &r.legs)
            .filter(|l| l.rist.is_some())
            .count();
    // A FEC flow: 5 samples, and 5 per FEC leg of a flow with several.
    let fec = 5 * s.flows.iter().filter(|f| f.fec.is_some()).count()
        + 5 * s
            .flows
            .iter()
            .filter_map(|f| f.redundancy.as_ref())
            .flat_map(|r| &r.legs)
            .filter(|l| l.fec.is_some())
            .count();
    let samples =
        7 * s.flows.len() + 7 * outputs + 5 * pools + 3 * s.workers.len() + srt + rist + fec;
    let legs: usize = s
        .flows
        .iter()
        .filter_map(|f| f.redundancy.as_ref())
        .map(|r| 13 + 3 * r.legs.len())
        .sum();
    let health = 15
        * inputs_of(s)
            .iter()
            .filter(|(_, h, _)| !h.payload.is_empty())
            .count()
        + legs;
    // The SRT output families' HELP and TYPE lines: 4 KiB; the SRT input
    // families': 3 KiB; RIST's: 3 KiB; FEC's: 2 KiB.
    4096 + 128 * samples + 160 * health + 2048 + 4096 + 3072 + 3072 + 2048
}

/// OpenMetrics through the Prometheus project's client library.
#[cfg(any(test, feature = "prometheus-client"))]
mod library {
    use std::fmt::Write;

    use prometheus_client::collector::Collector;
    use prometheus_client::encoding::{
        DescriptorEncoder, EncodeLabelValue, LabelValueEncoder, MetricEncoder, NoLabelSet,
    };
    use prometheus_client::metrics::MetricType;
    use prometheus_client::registry::Registry;

    use super::{Kind, Value};

    /// A family and its samples, owned: the library encodes from a
    /// `'static` collector.
    #[derive(Debug)]
    pub(super) struct Family {
        /// The name without `_total` for a counter: the library adds it.
        name: String,
        kind: Kind,
        help: String,
        samples: Vec<(Vec<(String, Escaped)>, Value)>,
    }

    impl Family {
        pub(super) fn new(name: &str, kind: Kind, help: &str) -> Self {
            let name = match kind {
                Kind::Counter => name.strip_suffix("_total").unwrap_or(name),
                Kind::Gauge => name,
            };
            Family {
                name: name.to_owned(),
                kind,
                help: help.to_owned(),
                samples: Vec::new(),
            }
        }

        pub(super) fn push(&mut self, labels: &[(&str, &str)], value: Value) {
            let labels = labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Escaped((*v).to_owned())))
                .collect();
            self.samples.push((labels, value));
        }
    }

    /// A label value written escaped (`\\`, `\"`, `\n`): prometheus-client
    /// 0.24 writes label values as they are (prometheus/client_rust#151),
    /// and flow names may hold quotes and backslashes.
    #[derive(Debug)]
    struct Escaped(String);

    impl EncodeLabelValue for Escaped {
        fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
            let mut escaped = String::with_capacity(self.0.len());
            super::escape_label_value(&mut escaped, &self.0);
            encoder.write_str(&escaped)
        }
    }

    #[derive(Debug)]
    struct Families(Vec<Family>);

    impl Collector for Families {
        fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
            for f in &self.0 {
                let kind = match f.kind {
                    Kind::Counter => MetricType::Counter,
                    Kind::Gauge => MetricType::Gauge,
                };
                let mut metric = encoder.encode_descriptor(&f.name, &f.help, None, kind)?;
                for (labels, value) in &f.samples {
                    if labels.is_empty() {
                        encode_value(&mut metric, f.kind, *value)?;
                    } else {
                        encode_value(&mut metric.encode_family(labels)?, f.kind, *value)?;
                    }
                }
            }
            Ok(())
        }
    }

    fn encode_value(
        m: &mut MetricEncoder<'_>,
        kind: Kind,
        value: Value,
    ) -> Result<(), std::fmt::Error> {
        match (kind, value) {
            (Kind::Counter, Value::Int(v)) => m.encode_counter::<NoLabelSet, _, u64>(&v, None),
            (Kind::Counter, Value::Float(v)) => m.encode_counter::<NoLabelSet, _, f64>(&v, None),
            (Kind::Gauge, Value::Int(v)) => m.encode_gauge(&v),
            (Kind::Gauge, Value::Float(v)) => m.encode_gauge(&v),
        }
    }

    /// The families in the OpenMetrics text format, `# EOF` last.
    pub(super) fn encode(families: Vec<Family>) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Families(families)));
        let mut out = String::new();
        // Writing into a String cannot fail, and the collector's own
        // errors are only the writer's.
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
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

    /// Every sample of an exposition as `name{labels} value`, labels
    /// sorted, comments left out.
    fn series(text: &str) -> Vec<String> {
        let mut all: Vec<String> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| {
                let s = parse_sample(l).unwrap_or_else(|e| panic!("{e}"));
                let mut labels = s.labels.clone();
                labels.sort();
                format!("{}{labels:?} {}", s.name, s.value)
            })
            .collect();
        all.sort();
        all
    }

    /// A snapshot with everything that may be hard to encode: label values
    /// with quotes, backslashes and newlines, an infinite float, a
    /// degraded state, two workers.
    fn awkward() -> Snapshot {
        let mut s = sample();
        s.flows[0].name = "a\\b\"c\nd} x=\"1\" 2".into();
        s.flows[0].outputs[0].label = "\"\n\\".into();
        let mut second = s.flows[0].clone();
        second.name = "plain".into();
        second.health = Default::default();
        s.flows.push(second);
        let mut worker = s.workers[0].clone();
        worker.index = 1;
        s.workers.push(worker);
        s.state = DaemonState::Degraded("x".into());
        s.uptime_seconds = f64::INFINITY;
        s
    }

    #[test]
    fn openmetrics_carries_the_same_series_as_the_text_format() {
        for s in [sample(), awkward()] {
            let text = render(&s, Format::Text);
            let open = render(&s, Format::OpenMetrics);
            assert!(open.ends_with("\n# EOF\n"), "{open}");
            assert_eq!(series(&text), series(&open));
            // The same families, in the same order, with the same help;
            // only a counter's metadata names it without `_total`.
            let meta = |t: &str| -> Vec<String> {
                t.lines()
                    .filter(|l| l.starts_with("# HELP") || l.starts_with("# TYPE"))
                    .map(|l| {
                        let counter = l.ends_with(" counter");
                        let mut words: Vec<&str> = l.splitn(4, ' ').collect();
                        if counter || l.starts_with("# HELP") {
                            words[2] = words[2].strip_suffix("_total").unwrap_or(words[2]);
                        }
                        words.join(" ")
                    })
                    .collect()
            };
            assert_eq!(meta(&text), meta(&open));
            assert!(open.contains("# TYPE mcrelay_flow_received_packets counter\n"));
            assert!(text.contains("# TYPE mcrelay_flow_received_packets_total counter\n"));
        }
    }

    #[test]
    fn openmetrics_by_hand_is_what_prometheus_client_writes() {
        for s in [sample(), awkward(), bench_snapshot_of(3)] {
            let ours = render(&s, Format::OpenMetrics);
            let theirs = render_with_prometheus_client(&s);
            if ours != theirs {
                // Only float spelling may differ (the library writes
                // `inf`, `1.0`); the series must be the same.
                assert_eq!(series(&ours), series(&theirs.replace(" inf\n", " +Inf\n")));
                let strip = |t: &str| -> Vec<String> {
                    t.lines()
                        .map(|l| l.rsplit_once(' ').map_or(l, |(k, _)| k).to_owned())
                        .collect()
                };
                assert_eq!(strip(&ours), strip(&theirs), "{ours}\n---\n{theirs}");
            }
        }
        // On the sample, byte for byte.
        assert_eq!(
            render(&sample(), Format::OpenMetrics),
            render_with_prometheus_client(&sample())
        );
    }

    fn bench_snapshot_of(flows: usize) -> Snapshot {
        crate::snapshot::bench_snapshot(flows)
    }

    #[test]
    fn accept_headers_choose_the_format() {
        // Prometheus 2.x's scrape header.
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(prometheus)), Format::OpenMetrics);
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text; version=1.0.0")),
            Format::OpenMetrics
        );
        for text in [
            None,
            Some("*/*"),
            Some("text/plain"),
            Some("text/plain;version=0.0.4"),
            Some("application/openmetrics-text;q=0"),
            Some("application/openmetrics-text;q=0.5,text/plain"),
            Some("application/openmetrics-text;q=0.5,*/*;q=0.5"),
            Some("application/json"),
            Some(""),
        ] {
            assert_eq!(Format::negotiate(text), Format::Text, "{text:?}");
        }
        assert_eq!(Format::OpenMetrics.content_type(), OPENMETRICS_CONTENT_TYPE);
        assert_eq!(Format::Text.content_type(), CONTENT_TYPE);
    }

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
    fn the_endpoints_connection_counters_are_shown_when_it_listens() {
        let mut s = sample();
        assert!(!render_metrics(&s).contains("mcrelay_metrics_connections"));
        s.metrics_endpoint = Some(crate::EndpointSnapshot {
            served: 7,
            refused_not_allowed: 3,
            refused_address_cap: 2,
            refused_full: 1,
            displaced_address_cap: 40,
            displaced_full: 5,
        });
        {
            let (samples, types) = check(&render_metrics(&s));
            assert!(types.contains_key("mcrelay_metrics_connections_refused_total"));
            let v = |name, labels: &[(&str, &str)]| find(&samples, name, labels).value;
            assert_eq!(v("mcrelay_metrics_connections_served_total", &[]), 7.0);
            let refused = "mcrelay_metrics_connections_refused_total";
            assert_eq!(v(refused, &[("reason", "not_allowed")]), 3.0);
            assert_eq!(v(refused, &[("reason", "address_cap")]), 2.0);
            assert_eq!(v(refused, &[("reason", "full")]), 1.0);
            let displaced = "mcrelay_metrics_connections_displaced_total";
            assert_eq!(v(displaced, &[("reason", "address_cap")]), 40.0);
            assert_eq!(v(displaced, &[("reason", "full")]), 5.0);
        }
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
    fn rist_families() {
        let mut s = sample();
        let (samples, _) = check(&render_metrics(&s));
        assert!(!samples.iter().any(|x| x.name.contains("_rist_")));
        s.flows[0].rist = Some(crate::snapshot::RistSnapshot {
            nacks_sent: 9,
            recovered: 8,
            unrecovered: 1,
            dropped: 0,
            input_rtt_us: 20_500,
            nacks_received: 4,
            retransmitted: 3,
            unrecoverable: 1,
            output_rtt_us: 0,
        });
        let (samples, types) = check(&render_metrics(&s));
        let l = [("flow", "video-a")];
        for (name, want) in [
            ("mcrelay_flow_rist_nacks_sent_total", 9.0),
            ("mcrelay_flow_rist_recovered_packets_total", 8.0),
            ("mcrelay_flow_rist_unrecovered_packets_total", 1.0),
            ("mcrelay_flow_rist_nacks_received_total", 4.0),
            ("mcrelay_flow_rist_retransmitted_packets_total", 3.0),
            ("mcrelay_flow_rist_unrecoverable_nacks_total", 1.0),
            ("mcrelay_flow_rist_input_rtt_seconds", 0.0205),
            ("mcrelay_flow_rist_output_rtt_seconds", 0.0),
        ] {
            assert_eq!(find(&samples, name, &l).value, want, "{name}");
        }
        assert_eq!(types["mcrelay_flow_rist_input_rtt_seconds"], "gauge");
        assert_eq!(
            types["mcrelay_flow_rist_retransmitted_packets_total"],
            "counter"
        );
    }

    /// A merged flow's RIST legs each have their own figures, under
    /// `input`; the flow's `unrecovered` is what the flow lost, not their
    /// sum.
    #[test]
    fn rist_leg_families() {
        let mut s = crate::snapshot::sample_with_legs();
        s.flows[1].rist = Some(crate::snapshot::RistSnapshot {
            recovered: 30,
            unrecovered: 0,
            ..Default::default()
        });
        let r = s.flows[1].redundancy.as_mut().expect("legs");
        r.legs[0].rist = Some(crate::snapshot::LegRistSnapshot {
            nacks_sent: 40,
            recovered: 30,
            unrecovered: 1,
            rtt_us: 21_000,
        });
        r.legs[1].rist = Some(crate::snapshot::LegRistSnapshot {
            unrecovered: 2500,
            ..Default::default()
        });
        assert_leg_families(
            &s,
            "rist",
            &[
                ("mcrelay_flow_rist_unrecovered_packets_total", &FLOW_R, 0.0),
                ("mcrelay_input_rist_unrecovered_packets_total", &LEG_A, 1.0),
                (
                    "mcrelay_input_rist_unrecovered_packets_total",
                    &LEG_B,
                    2500.0,
                ),
                ("mcrelay_input_rist_nacks_sent_total", &LEG_A, 40.0),
                ("mcrelay_input_rist_recovered_packets_total", &LEG_A, 30.0),
                ("mcrelay_input_rist_rtt_seconds", &LEG_A, 0.021),
            ],
            &[
                ("mcrelay_input_rist_rtt_seconds", "gauge"),
                ("mcrelay_input_rist_unrecovered_packets_total", "counter"),
            ],
        );
    }

    const FLOW_R: [(&str, &str); 1] = [("flow", "video-r")];
    const LEG_A: [(&str, &str); 2] = [("flow", "video-r"), ("input", "239.1.1.1:5000@vRA")];
    const LEG_B: [(&str, &str); 2] = [("flow", "video-r"), ("input", "239.1.2.1:5000@vRB")];

    /// A sample's labels.
    type Labels<'a> = &'a [(&'a str, &'a str)];

    /// Renders `s` (a `sample_with_legs` whose merged flow `video-r` and
    /// its legs have a `section`) and checks each family's value under
    /// its labels, each family's type, and that the single-input flow
    /// `video-a` has no per-input series of the section.
    fn assert_leg_families(
        s: &Snapshot,
        section: &str,
        values: &[(&str, Labels<'_>, f64)],
        types_want: &[(&str, &str)],
    ) {
        let (samples, types) = check(&render_metrics(s));
        for (name, labels, want) in values {
            assert_eq!(
                find(&samples, name, labels).value,
                *want,
                "{name} {labels:?}"
            );
        }
        for (name, want) in types_want {
            assert_eq!(types[*name], *want, "{name}");
        }
        let prefix = format!("mcrelay_input_{section}_");
        assert!(
            !samples.iter().any(
                |x| x.name.starts_with(&prefix) && x.labels.iter().any(|(_, v)| v == "video-a")
            )
        );
    }

    /// A merged flow's FEC legs each have their own figures, under
    /// `input`; the flow's `unrecoverable` is what the flow lost, not
    /// their sum.
    #[test]
    fn fec_leg_families() {
        let mut s = crate::snapshot::sample_with_legs();
        s.flows[1].fec = Some(crate::snapshot::FecSnapshot {
            packets: 90,
            recovered: 12,
            unrecoverable: 0,
            ..Default::default()
        });
        let r = s.flows[1].redundancy.as_mut().expect("legs");
        r.legs[0].fec = Some(crate::snapshot::LegFecSnapshot {
            packets: 50,
            recovered: 12,
            unrecoverable: 3,
            duplicates: 1,
            rejected: 2,
        });
        r.legs[1].fec = Some(crate::snapshot::LegFecSnapshot {
            packets: 40,
            unrecoverable: 700,
            ..Default::default()
        });
        assert_leg_families(
            &s,
            "fec",
            &[
                ("mcrelay_flow_fec_unrecoverable_packets_total", &FLOW_R, 0.0),
                ("mcrelay_input_fec_unrecoverable_packets_total", &LEG_A, 3.0),
                (
                    "mcrelay_input_fec_unrecoverable_packets_total",
                    &LEG_B,
                    700.0,
                ),
                ("mcrelay_input_fec_packets_total", &LEG_A, 50.0),
                ("mcrelay_input_fec_recovered_packets_total", &LEG_A, 12.0),
                ("mcrelay_input_fec_duplicate_packets_total", &LEG_A, 1.0),
                ("mcrelay_input_fec_rejected_total", &LEG_A, 2.0),
            ],
            &[("mcrelay_input_fec_unrecoverable_packets_total", "counter")],
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
        let dropped = "mcrelay_flow_redundancy_dropped_packets_total";
        assert_eq!(types[dropped], "counter");
        for (reason, want) in [
            ("late", 3.0),
            ("stray", 4.0),
            ("replay", 5.0),
            ("mismatched", 6.0),
            ("not_rtp", 0.0),
        ] {
            assert_eq!(v(dropped, &[flow, ("reason", reason)]), want, "{reason}");
        }
        assert_eq!(v("mcrelay_flow_sequence_restarts_total", &[flow]), 1.0);
        let a = ("input", "239.1.1.1:5000@vRA");
        let b = ("input", "239.1.2.1:5000@vRB");
        assert_eq!(types["mcrelay_input_detached"], "gauge");
        assert_eq!(v("mcrelay_input_detached", &[flow, a]), 0.0);
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
        assert!(render_metrics(&s).len() <= text_capacity(&s));
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
    fn srt_input_families() {
        use crate::snapshot::{SrtInputSnapshot, SrtPeerSnapshot};
        let mut s = sample();
        s.flows[0].srt_inputs = vec![
            SrtInputSnapshot {
                leg: 0,
                label: "srt://0.0.0.0:9000".into(),
                listener: true,
                peer: Some(SrtPeerSnapshot {
                    peer: "10.0.0.9:40000".into(),
                    received: 900,
                    lost: 41,
                    too_late: 2,
                    rtt_us: 40_000,
                    ..SrtPeerSnapshot::default()
                }),
                datagrams: 900,
                delivered: 897,
                drop_queue_full: 3,
                refused: 5,
                ..SrtInputSnapshot::default()
            },
            SrtInputSnapshot {
                leg: 1,
                label: "srt://192.0.2.1:9000?mode=caller".into(),
                connect_failures: 4,
                ..SrtInputSnapshot::default()
            },
        ];
        let text = render_metrics(&s);
        assert!(text.len() <= text_capacity(&s));
        let (samples, _) = check(&text);
        let v = |name, labels: &[(&str, &str)]| find(&samples, name, labels).value;
        let name = s.flows[0].name.as_str();
        let listener = [
            ("flow", name),
            ("input", "srt://0.0.0.0:9000"),
            ("mode", "listener"),
        ];
        let caller = [
            ("flow", name),
            ("input", "srt://192.0.2.1:9000?mode=caller"),
            ("mode", "caller"),
        ];
        assert_eq!(v("mcrelay_srt_input_connected", &listener), 1.0);
        assert_eq!(v("mcrelay_srt_input_connected", &caller), 0.0);
        assert_eq!(
            v("mcrelay_srt_input_received_packets_total", &listener),
            900.0
        );
        assert_eq!(
            v("mcrelay_srt_input_delivered_packets_total", &listener),
            897.0
        );
        assert_eq!(v("mcrelay_srt_input_lost_packets_total", &listener), 41.0);
        assert_eq!(
            v("mcrelay_srt_input_too_late_packets_total", &listener),
            2.0
        );
        assert_eq!(v("mcrelay_srt_input_refused_total", &listener), 5.0);
        assert_eq!(v("mcrelay_srt_input_connect_failures_total", &caller), 4.0);
        assert_eq!(v("mcrelay_srt_input_rtt_seconds", &listener), 0.04);
        assert_eq!(
            v(
                "mcrelay_srt_input_dropped_packets_total",
                &[
                    ("flow", name),
                    ("input", "srt://0.0.0.0:9000"),
                    ("reason", "queue_full")
                ]
            ),
            3.0
        );
    }

    #[test]
    fn srt_families() {
        use crate::snapshot::{SrtCallerSnapshot, SrtSnapshot};
        let mut s = sample();
        s.flows[0].outputs[0].label = "srt://0.0.0.0:9000".into();
        s.flows[0].outputs[0].srt = Some(SrtSnapshot {
            listener: true,
            max_callers: 16,
            callers: vec![SrtCallerSnapshot {
                peer: "10.0.0.9:40000".into(),
                stream_id: "cam".into(),
                connected_since: 1,
                sent: 900,
                dropped: 3,
                retransmitted: 40,
                lost: 41,
                too_late: 2,
                rtt_us: 40_000,
                send_bps: 11_000_000,
            }],
            refused: 5,
            late_disconnects: 2,
            holding: true,
            ..SrtSnapshot::default()
        });
        let text = render_metrics(&s);
        assert!(text.len() <= text_capacity(&s));
        let (samples, _) = check(&text);
        let v = |name, labels: &[(&str, &str)]| find(&samples, name, labels).value;
        let out = [
            ("flow", s.flows[0].name.as_str()),
            ("output", "srt://0.0.0.0:9000"),
        ];
        let route = [out[0], out[1], ("mode", "listener")];
        assert_eq!(v("mcrelay_srt_callers", &route), 1.0);
        assert_eq!(v("mcrelay_srt_max_callers", &route), 16.0);
        assert_eq!(v("mcrelay_srt_refused_total", &route), 5.0);
        assert_eq!(v("mcrelay_srt_late_disconnects_total", &route), 2.0);
        assert_eq!(v("mcrelay_srt_refusing_callers", &route), 1.0);
        let caller = [out[0], out[1], ("peer", "10.0.0.9:40000")];
        assert_eq!(v("mcrelay_srt_caller_sent_packets_total", &caller), 900.0);
        assert_eq!(v("mcrelay_srt_caller_dropped_packets_total", &caller), 3.0);
        assert_eq!(v("mcrelay_srt_caller_lost_packets_total", &caller), 41.0);
        assert_eq!(
            v("mcrelay_srt_caller_retransmitted_packets_total", &caller),
            40.0
        );
        assert_eq!(v("mcrelay_srt_caller_too_late_packets_total", &caller), 2.0);
        assert_eq!(v("mcrelay_srt_caller_rtt_seconds", &caller), 0.04);
        // A UDP output has no SRT series.
        assert!(!text.contains("output=\"10.0.0.1"), "{text}");
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
        assert!(render_metrics(&s).len() <= text_capacity(&s));
    }

    #[test]
    fn standby_shows_as_a_gauge_and_a_counter_not_a_drop() {
        let mut s = sample();
        let (samples, types) = check(&render_metrics(&s));
        assert_eq!(types["mcrelay_standby"], "gauge");
        assert_eq!(find(&samples, "mcrelay_standby", &[]).value, 0.0);
        let flow = ("flow", "video-a");
        let discarded = "mcrelay_flow_standby_discarded_packets_total";
        assert_eq!(types[discarded], "counter");
        assert_eq!(find(&samples, discarded, &[flow]).value, 9.0);
        assert!(
            samples
                .iter()
                .filter(|x| x.name.contains("dropped"))
                .all(|x| x.labels.iter().all(|(_, v)| v != "standby")),
            "standby is not a drop reason"
        );
        s.mode = crate::Mode::Standby;
        let (samples, _) = check(&render_metrics(&s));
        assert_eq!(find(&samples, "mcrelay_standby", &[]).value, 1.0);
    }
}
