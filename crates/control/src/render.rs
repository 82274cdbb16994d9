//! What `mcrelayctl` prints: short status text and column-aligned tables.
//!
//! Numbers are shortened with SI prefixes (`1.23M`, `12.3 Mb/s`) to three
//! significant digits; exact counters are in the JSON and the Prometheus
//! output. Rates need two snapshots, so every rate column shows `-` when no
//! [`Rates`] are given or the flow is new.

use std::fmt::Write;

use crate::rates::{FlowRates, OutputRates, Rates};
use crate::snapshot::{DaemonState, FlowSnapshot, InputHealth, OutputSnapshot, Snapshot};
use crate::summary::Summary;
use crate::units::{human_bits_per_second, human_bytes, human_count, human_duration, human_rate};

/// The daemon's state, uptime, workers, flows and totals, one fact a line;
/// then the problem flows by name (at most [`crate::MAX_NAMED`] in each
/// list, and how many more).
pub fn render_status(s: &Summary) -> String {
    let t = &s.totals;
    let state = match &s.state {
        DaemonState::Running => "running".to_string(),
        DaemonState::Degraded(reason) => format!("degraded: {reason}"),
        DaemonState::Reloading => "reloading".to_string(),
    };
    let cpus: Vec<String> = s
        .workers
        .iter()
        .map(|w| w.cpu.map_or_else(|| "-".into(), |c| c.to_string()))
        .collect();
    let d = &t.ingress_drops;
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = write!(
        out,
        "mcrelayd {version}, pid {pid}: {state}\n\
         mode:     {mode}\n\
         uptime:   {uptime}\n\
         config:   {config}\n\
         workers:  {workers} (cpus {cpus})\n\
         flows:    {flows} with {outputs} outputs{not_running}\n\
         received: {pin} packets, {bin}\n\
         sent:     {pout} packets, {bout}\n\
         dropped:  ingress {din} (oversize {over}, pool exhausted {pool}, kernel {kern}, bad frames {frames}), \
         receive errors {rx}, output {dout} (backlog {backlog}, send error {senderr})\n",
        version = s.version,
        pid = s.pid,
        mode = mode_text(s),
        uptime = human_duration(s.uptime_seconds),
        config = s.config_path,
        workers = s.workers.len(),
        cpus = cpus.join(","),
        flows = t.flows,
        outputs = t.outputs,
        not_running = if t.flows_running == t.flows {
            String::new()
        } else {
            format!(
                " ({} relaying, {} not)",
                t.flows_running,
                t.flows - t.flows_running
            )
        },
        pin = human_count(t.packets_in),
        bin = human_bytes(t.bytes_in),
        pout = human_count(t.packets_out),
        bout = human_bytes(t.bytes_out),
        din = human_count(d.total()),
        over = human_count(d.oversize),
        pool = human_count(d.pool_exhausted),
        kern = human_count(d.kernel),
        frames = human_count(d.frames()),
        rx = human_count(t.receive_errors),
        dout = human_count(t.drops_backlog.saturating_add(t.drops_send_error)),
        backlog = human_count(t.drops_backlog),
        senderr = human_count(t.drops_send_error),
    );
    for flow in &s.not_running.first {
        let _ = writeln!(out, "  flow {:?}: {}", flow.name, flow.state);
    }
    if s.not_running.more > 0 {
        let _ = writeln!(
            out,
            "  and {} more flows not relaying (mcrelayctl flows --state not-running)",
            s.not_running.more
        );
    }
    if !s.silent.is_empty() {
        let _ = writeln!(
            out,
            "silent:   {}{} (no datagram for silence_ms)",
            s.silent.first.join(", "),
            and_more(s.silent.more)
        );
    }
    if !s.stream_errors.is_empty() {
        let named: Vec<String> = s
            .stream_errors
            .first
            .iter()
            .map(|f| format!("{} ({})", f.name, f.errors.join(", ")))
            .collect();
        let more = match s.stream_errors.more {
            0 => String::new(),
            n => format!("; and {n} more"),
        };
        let _ = writeln!(out, "stream:   {}{more}", named.join("; "));
    }
    if s.interface_pauses > 0 {
        let _ = writeln!(
            out,
            "pauses:   {} (flows stopped by an interface going down or away)",
            s.interface_pauses
        );
    }
    out
}

/// `, and N more` for a list cut short, else nothing.
fn and_more(more: usize) -> String {
    match more {
        0 => String::new(),
        n => format!(", and {n} more"),
    }
}

/// `active`, or what a standby does and how many datagrams it discarded.
fn mode_text(s: &Summary) -> String {
    if !s.mode.is_standby() {
        return s.mode.to_string();
    }
    format!(
        "standby: receiving, sending nothing ({} datagrams discarded); `mcrelayctl active` takes over",
        human_count(s.standby_discarded)
    )
}

/// A flow's STATE cell: a running flow of a standby daemon is `standby`.
fn flow_state_text(s: &Snapshot, flow: &FlowSnapshot) -> String {
    if s.mode.is_standby() && flow.state.is_running() {
        "standby".to_owned()
    } else {
        flow.state.to_string()
    }
}

/// One row per flow, one per input (leg) under a flow with several
/// (`<=`, with what it forwarded and its health), and one per output
/// (`->`): packets, bytes, packet and bit rates, and drops by reason.
pub fn render_flows(s: &Snapshot, rates: Option<&Rates>) -> String {
    if s.flows.is_empty() {
        return "no flows configured\n".into();
    }
    let mut table = Table::new(&[
        ("FLOW", Align::Left),
        ("STATE", Align::Left),
        ("INPUT / OUTPUT", Align::Left),
        ("WORKER", Align::Right),
        ("PACKETS", Align::Right),
        ("BYTES", Align::Right),
        ("PPS", Align::Right),
        ("RATE", Align::Right),
        ("DROPS", Align::Left),
        ("HEALTH", Align::Left),
    ]);
    // Each flow's rates through a map, not a search per flow.
    let by_name: std::collections::HashMap<&str, &FlowRates> = rates
        .map(|r| r.flows.iter().map(|f| (f.name.as_str(), f)).collect())
        .unwrap_or_default();
    for flow in &s.flows {
        let fr = by_name.get(flow.name.as_str()).copied();
        table.row(vec![
            flow.name.clone(),
            flow_state_text(s, flow),
            flow.input.clone(),
            flow.worker_text(),
            human_count(flow.packets_in),
            human_bytes(flow.bytes_in),
            fr.map_or_else(dash, |r| human_rate(r.packets_per_second)),
            fr.map_or_else(dash, |r| human_bits_per_second(r.bits_per_second)),
            ingress_drops(flow, fr),
            {
                let text = match &flow.redundancy {
                    None => health_text(&flow.health),
                    Some(r) => redundancy_text(r),
                };
                let text = match &flow.fec {
                    Some(x) => format!(
                        "{text}; fec: recovered {}, unrecoverable {}",
                        human_count(x.recovered),
                        human_count(x.unrecoverable)
                    ),
                    None => text,
                };
                match &flow.rist {
                    Some(x) => format!("{text}; {}", rist_text(x)),
                    None => text,
                }
            },
        ]);
        for (i, leg) in flow
            .redundancy
            .iter()
            .flat_map(|r| r.legs.iter().enumerate())
        {
            let active = flow
                .redundancy
                .as_ref()
                .is_some_and(|r| r.mode == "failover" && r.active_input == i as u64);
            let mut drops = Vec::new();
            if leg.standby > 0 {
                drops.push(format!("standby {}", human_count(leg.standby)));
            }
            if leg.kernel_drops > 0 {
                drops.push(format!("kernel {}", human_count(leg.kernel_drops)));
            }
            table.row(vec![
                String::new(),
                if active { "active" } else { "" }.to_owned(),
                format!("<= {}", leg.input),
                String::new(),
                human_count(leg.forwarded),
                String::new(),
                String::new(),
                String::new(),
                if drops.is_empty() {
                    "-".to_owned()
                } else {
                    drops.join(", ")
                },
                match leg_protection_text(leg) {
                    Some((p, _)) => format!("{}; {p}", health_text(&leg.health)),
                    None => health_text(&leg.health),
                },
            ]);
        }
        // An SRT input, one row each: its peer, what reached the worker.
        for si in &flow.srt_inputs {
            let dropped = si.drop_queue_full + si.drop_flow_gone;
            table.row(vec![
                String::new(),
                String::new(),
                match &si.peer {
                    Some(p) => format!("<= {} from {}", si.label, p.peer),
                    None => format!("<= {}", si.label),
                },
                String::new(),
                human_count(si.delivered),
                String::new(),
                String::new(),
                si.peer
                    .as_ref()
                    .map(|p| human_bits_per_second(p.receive_bps as f64))
                    .unwrap_or_default(),
                if dropped > 0 {
                    format!(
                        "queue_full={} flow_gone={}",
                        si.drop_queue_full, si.drop_flow_gone
                    )
                } else {
                    "none".to_owned()
                },
                srt_input_text(si),
            ]);
        }
        for output in &flow.outputs {
            let or = fr.and_then(|r| r.output(&output.label));
            table.row(vec![
                String::new(),
                String::new(),
                format!("-> {}", output.label),
                String::new(),
                human_count(output.packets_out),
                human_bytes(output.bytes_out),
                or.map_or_else(dash, |r| human_rate(r.packets_per_second)),
                or.map_or_else(dash, |r| human_bits_per_second(r.bits_per_second)),
                output_drops(output, or),
                output.srt.as_ref().map(srt_text).unwrap_or_default(),
            ]);
            // An SRT output's callers, one row each.
            for c in output.srt.iter().flat_map(|r| &r.callers) {
                table.row(vec![
                    String::new(),
                    String::new(),
                    format!("   => {}{}", c.peer, stream_id_text(&c.stream_id)),
                    String::new(),
                    human_count(c.sent),
                    String::new(),
                    String::new(),
                    human_bits_per_second(c.send_bps as f64),
                    if c.dropped + c.too_late > 0 {
                        format!("full={} too_late={}", c.dropped, c.too_late)
                    } else {
                        "none".to_owned()
                    },
                    format!(
                        "rtt {:.1} ms, lost {}, retransmitted {}",
                        c.rtt_us as f64 / 1000.0,
                        human_count(c.lost),
                        human_count(c.retransmitted)
                    ),
                ]);
            }
        }
    }
    let mut out = table.render();
    if let Some(r) = rates {
        let _ = writeln!(out, "(rates over {:.1} s)", r.elapsed_seconds);
    }
    if s.mode.is_standby() {
        out.push_str(
            "(standby: every flow receives and sends nothing; `mcrelayctl active` takes over)\n",
        );
    }
    out
}

/// The flows table, then each worker's loop counters and pool occupancy
/// per buffer class.
pub fn render_stats(s: &Snapshot, rates: Option<&Rates>) -> String {
    let mut out = render_flows(s, rates);
    out.push('\n');

    let mut workers = Table::new(&[
        ("WORKER", Align::Right),
        ("CPU", Align::Right),
        ("RECEIVE", Align::Left),
        ("LOOP TURNS", Align::Right),
        ("COMPLETIONS", Align::Right),
        ("PER TURN", Align::Right),
        ("SENDS", Align::Right),
    ]);
    for w in &s.workers {
        let per_turn = if w.loop_turns == 0 {
            dash()
        } else {
            format!("{:.2}", w.completions as f64 / w.loop_turns as f64)
        };
        workers.row(vec![
            w.index.to_string(),
            w.cpu.map_or_else(dash, |c| c.to_string()),
            w.receive_mode.clone(),
            human_count(w.loop_turns),
            human_count(w.completions),
            per_turn,
            human_count(w.sends_submitted),
        ]);
    }
    out.push_str(&workers.render());
    out.push('\n');

    let mut pools = Table::new(&[
        ("WORKER", Align::Right),
        ("CLASS", Align::Left),
        ("BUFFER", Align::Right),
        ("IN USE", Align::Right),
        ("HIGH WATER", Align::Right),
        ("TAKEN", Align::Right),
        ("EXHAUSTED", Align::Right),
    ]);
    for w in &s.workers {
        for p in &w.pools {
            pools.row(vec![
                w.index.to_string(),
                p.class.clone(),
                format!("{} B", p.buffer_bytes),
                format!("{}/{}", p.in_use, p.capacity),
                p.high_water.to_string(),
                human_count(p.taken),
                p.exhausted.to_string(),
            ]);
        }
    }
    out.push_str(&pools.render());
    out
}

/// One frame of the live view (`mcrelayctl top`, `mcrelayd demo`): the
/// status, then the flows, workers and pools with the rates since the
/// previous snapshot.
pub fn render_top(s: &Snapshot, rates: &Rates) -> String {
    format!(
        "{}\n{}",
        render_status(&Summary::of(s)),
        render_stats(s, Some(rates))
    )
}

/// The HEALTH column of an input: its payload mode, SILENT, the max gap,
/// the RTP jitter and every nonzero error counter ("ok" if none).
pub fn health_text(h: &InputHealth) -> String {
    if h.payload.is_empty() {
        return dash();
    }
    let mut parts = vec![h.payload.clone()];
    if h.silent {
        parts.push("SILENT".into());
    }
    parts.push(format!("gap {}", human_ms(h.max_gap_ns)));
    if let Some(r) = &h.rtp {
        parts.push(format!("jitter {}", human_ms(r.jitter_ns)));
    }
    let errors = crate::summary::stream_error_counts(h);
    if errors.is_empty() {
        parts.push("ok".into());
    }
    parts.extend(errors);
    parts.join(" ")
}

/// Nanoseconds as milliseconds: `0.35ms`, `25ms`, `1.2s`.
fn human_ms(ns: u64) -> String {
    let ms = ns as f64 / 1e6;
    if ms >= 1000.0 {
        format!("{:.1}s", ms / 1000.0)
    } else if ms >= 10.0 {
        format!("{ms:.0}ms")
    } else {
        format!("{ms:.2}ms")
    }
}

fn dash() -> String {
    "-".into()
}

/// A flow with several inputs, in its HEALTH column: what its
/// redundancy did ("merge: recovered 25, duplicates 475, lost 2").
fn redundancy_text(r: &crate::snapshot::RedundancySnapshot) -> String {
    match r.mode.as_str() {
        "failover" => format!(
            "failover: input {} active, {} switches",
            r.active_input,
            human_count(r.switches)
        ),
        mode => {
            let mut text = format!(
                "{mode}: recovered {}, duplicates {}, lost {}",
                human_count(r.recovered),
                human_count(r.duplicates),
                human_count(r.lost)
            );
            let detached = r.legs.iter().filter(|l| l.detached).count();
            if detached > 0 {
                text.push_str(&format!(", {detached} input(s) not merged"));
            }
            text
        }
    }
}

/// An SRT input's HEALTH cell: `srt input listener: connected, rtt 40.1
/// ms, lost 12, too late 0`.
pub fn srt_input_text(s: &crate::snapshot::SrtInputSnapshot) -> String {
    let mode = if s.listener { "listener" } else { "caller" };
    let mut t = match &s.peer {
        Some(p) => format!(
            "srt input {mode}: connected, rtt {:.1} ms, lost {}, too late {}",
            p.rtt_us as f64 / 1000.0,
            human_count(p.lost),
            human_count(p.too_late)
        ),
        None => format!("srt input {mode}: not connected"),
    };
    if s.refused > 0 {
        let _ = write!(t, ", {} refused", human_count(s.refused));
    }
    if s.connect_failures > 0 {
        let _ = write!(t, ", {} failed connects", human_count(s.connect_failures));
    }
    if let Some(e) = &s.error {
        let _ = write!(t, " ({e})");
    }
    t
}

/// An SRT output's HEALTH cell: `listener: 3/16 callers, 2 refused`.
pub fn srt_text(r: &crate::snapshot::SrtSnapshot) -> String {
    let mut t = if r.listener {
        format!(
            "srt listener: {}/{} callers",
            r.callers.len(),
            r.max_callers
        )
    } else if r.callers.is_empty() {
        "srt caller: not connected".to_owned()
    } else {
        "srt caller: connected".to_owned()
    };
    if r.refused > 0 {
        let _ = write!(t, ", {} refused", human_count(r.refused));
    }
    if r.late_disconnects > 0 {
        let _ = write!(
            t,
            ", {} disconnected for falling behind",
            human_count(r.late_disconnects)
        );
    }
    if r.holding {
        t.push_str(", refusing callers (sending behind)");
    }
    if r.connect_failures > 0 {
        let _ = write!(t, ", {} failed connects", human_count(r.connect_failures));
    }
    if let Some(e) = &r.error {
        let _ = write!(t, " ({e})");
    }
    t
}

fn stream_id_text(id: &str) -> String {
    if id.is_empty() {
        String::new()
    } else {
        format!(" ({id})")
    }
}

/// The DROPS cell of a flow: every nonzero ingress drop reason and the
/// receive errors, then the drop rate (`kernel=3 (1.50/s)`, or `none`).
pub fn ingress_drops(flow: &FlowSnapshot, rates: Option<&FlowRates>) -> String {
    let d = flow.drops.by_reason();
    let reasons = [
        d[0],
        d[1],
        d[2],
        d[3],
        d[4],
        d[5],
        d[6],
        d[7],
        d[8],
        ("receive_errors", flow.receive_errors),
    ];
    drops_text(&reasons, None, rates.map(|r| r.drops_per_second))
}

/// The DROPS cell of an output: its nonzero drop reasons, rate, last send
/// error and why it is not connected, if it isn't.
pub fn output_drops(output: &OutputSnapshot, rates: Option<&OutputRates>) -> String {
    let reasons = [
        ("backlog", output.drops_backlog),
        ("send_error", output.drops_send_error),
    ];
    let mut text = drops_text(
        &reasons,
        output.last_error.as_deref(),
        rates.map(|r| r.drops_per_second),
    );
    if let Some(why) = &output.not_connected {
        let _ = write!(text, " NOT CONNECTED: {why}");
    }
    text
}

/// `kernel=3 pool_exhausted=2 (1.50/s) last: ENOBUFS`, listing only
/// non-zero reasons; `none` if there are none.
fn drops_text(
    reasons: &[(&str, u64)],
    last_error: Option<&str>,
    per_second: Option<f64>,
) -> String {
    let mut text = String::new();
    for (reason, n) in reasons.iter().filter(|(_, n)| *n > 0) {
        if !text.is_empty() {
            text.push(' ');
        }
        let _ = write!(text, "{reason}={}", human_count(*n));
    }
    if text.is_empty() {
        text.push_str("none");
    }
    if let Some(rate) = per_second.filter(|r| *r > 0.0) {
        let _ = write!(text, " ({}/s)", human_rate(rate));
    }
    if let Some(error) = last_error {
        let _ = write!(text, " last: {error}");
    }
    text
}

#[derive(Debug, Clone, Copy)]
enum Align {
    Left,
    Right,
}

/// A text table: columns as wide as their widest cell, two spaces apart.
#[derive(Debug)]
struct Table {
    columns: Vec<(&'static str, Align)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(columns: &[(&'static str, Align)]) -> Self {
        Self {
            columns: columns.to_vec(),
            rows: Vec::new(),
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn render(&self) -> String {
        let header: Vec<String> = self.columns.iter().map(|(h, _)| (*h).to_string()).collect();
        let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::new();
            for ((cell, width), (_, align)) in row.iter().zip(&widths).zip(&self.columns) {
                if !line.is_empty() {
                    line.push_str("  ");
                }
                let _ = match align {
                    Align::Left => write!(line, "{cell:<width$}"),
                    Align::Right => write!(line, "{cell:>width$}"),
                };
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// What FEC and RIST did on a flow, in a few words, and whether
/// anything was lost after them; `None` for a flow with neither.
pub fn protection_text(flow: &crate::snapshot::FlowSnapshot) -> Option<(String, bool)> {
    let mut parts = Vec::new();
    let mut lost = false;
    if let Some(x) = &flow.fec {
        parts.push(format!(
            "fec: recovered {}, unrecoverable {}",
            human_count(x.recovered),
            human_count(x.unrecoverable)
        ));
        lost |= x.unrecoverable > 0;
    }
    if let Some(x) = &flow.rist {
        parts.push(rist_text(x));
        lost |= x.unrecovered > 0 || x.unrecoverable > 0;
    }
    (!parts.is_empty()).then(|| (parts.join("; "), lost))
}

/// What FEC and RIST did on one leg of a flow with several inputs (its
/// own decoder's and receiver's figures, not the flow's), in a few
/// words, and whether the leg lost anything after them; `None` for a leg
/// with neither.
pub fn leg_protection_text(leg: &crate::snapshot::LegSnapshot) -> Option<(String, bool)> {
    let mut parts = Vec::new();
    let mut lost = false;
    if let Some(x) = &leg.fec {
        parts.push(format!(
            "fec: recovered {}, unrecoverable {}",
            human_count(x.recovered),
            human_count(x.unrecoverable)
        ));
        lost |= x.unrecoverable > 0;
    }
    if let Some(x) = &leg.rist {
        parts.push(format!(
            "rist: nacked {}, recovered {}, unrecovered {}, rtt {:.1} ms",
            human_count(x.nacks_sent),
            human_count(x.recovered),
            human_count(x.unrecovered),
            x.rtt_us as f64 / 1000.0
        ));
        lost |= x.unrecovered > 0;
    }
    (!parts.is_empty()).then(|| (parts.join("; "), lost))
}

/// A flow's RIST counters in a few words: its input's NACKs, recoveries
/// and losses, its outputs' retransmissions, and the RTTs measured.
pub fn rist_text(x: &crate::snapshot::RistSnapshot) -> String {
    let mut parts = Vec::new();
    if x.nacks_sent > 0 || x.recovered > 0 || x.unrecovered > 0 || x.input_rtt_us > 0 {
        parts.push(format!(
            "rist in: nacked {}, recovered {}, unrecovered {}, rtt {:.1} ms",
            human_count(x.nacks_sent),
            human_count(x.recovered),
            human_count(x.unrecovered),
            x.input_rtt_us as f64 / 1000.0
        ));
    }
    if x.nacks_received > 0 || x.retransmitted > 0 || x.output_rtt_us > 0 {
        parts.push(format!(
            "rist out: retransmitted {}, unrecoverable {}, rtt {:.1} ms",
            human_count(x.retransmitted),
            human_count(x.unrecoverable),
            x.output_rtt_us as f64 / 1000.0
        ));
    }
    if parts.is_empty() {
        return "rist: no loss".to_owned();
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_of(s: &Snapshot) -> String {
        render_status(&Summary::of(s))
    }
    use crate::snapshot::sample;

    #[test]
    fn human_numbers() {
        assert_eq!(human_count(0), "0");
        assert_eq!(human_count(999), "999");
        assert_eq!(human_count(1000), "1.00k");
        assert_eq!(human_count(1234), "1.23k");
        assert_eq!(human_count(45_600_000), "45.6M");
        assert_eq!(human_count(999_999), "1.00M");
        assert_eq!(human_count(u64::MAX), "18.4E");
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1_048_576), "1.05 MB");
        assert_eq!(human_bits_per_second(12_300_000.0), "12.3 Mb/s");
        assert_eq!(human_bits_per_second(950.0), "950 b/s");
        assert_eq!(human_bits_per_second(0.0), "0 b/s");
        assert_eq!(human_bits_per_second(-5.0), "0 b/s");
        assert_eq!(human_bits_per_second(f64::NAN), "0 b/s");
        assert_eq!(human_bits_per_second(1e9), "1.00 Gb/s");
        assert_eq!(human_rate(12_345.0), "12.3k");
        assert_eq!(human_rate(0.0), "0");
    }

    #[test]
    fn durations() {
        assert_eq!(human_duration(12.9), "12s");
        assert_eq!(human_duration(303.0), "5m 03s");
        assert_eq!(human_duration(3723.5), "1h 02m 03s");
        assert_eq!(
            human_duration(2.0 * 86_400.0 + 3.0 * 3600.0 + 240.0),
            "2d 03h 04m"
        );
        assert_eq!(human_duration(-1.0), "0s");
        assert_eq!(human_duration(f64::NAN), "0s");
    }

    #[test]
    fn status_shows_the_numbers() {
        let text = status_of(&sample());
        for needle in [
            "pid 4242",
            "running",
            "1h 02m 03s",
            "/etc/mcrelay/mcrelay.toml",
            "workers:  1 (cpus 2)",
            "flows:    1 with 2 outputs",
            "812 packets",
            "1.05 MB",
            "1.60k packets",
            "ingress 6 (oversize 1, pool exhausted 2, kernel 3, bad frames 0)",
            "receive errors 4",
            "output 13 (backlog 6, send error 7)",
        ] {
            assert!(text.contains(needle), "{needle:?} missing from\n{text}");
        }
        let mut s = sample();
        s.state = DaemonState::Degraded("output eth9 missing".into());
        assert!(status_of(&s).contains("degraded: output eth9 missing"));
        assert!(!status_of(&s).contains("pauses:"));
    }

    #[test]
    fn status_and_flows_show_paused_flows() {
        let mut s = sample();
        s.flows.push(s.flows[0].clone());
        s.flows[1].name = "video-b".into();
        s.flows[1].state = crate::FlowState::InterfaceDown {
            interface: "vRA".into(),
        };
        s.flows[1].interface_pauses = 2;
        let text = status_of(&s);
        for needle in [
            "flows:    2 with 4 outputs (1 relaying, 1 not)",
            "  flow \"video-b\": paused: interface vRA down",
            "pauses:   2",
        ] {
            assert!(text.contains(needle), "{needle:?} missing from\n{text}");
        }
        let flows = render_flows(&s, None);
        let b = flows.lines().find(|l| l.starts_with("video-b")).unwrap();
        assert!(b.contains("paused: interface vRA down"), "{flows}");
        let a = flows.lines().find(|l| l.starts_with("video-a")).unwrap();
        assert!(a.contains("running"), "{flows}");
    }

    #[test]
    fn flows_table_is_aligned_and_complete() {
        let s = sample();
        let text = render_flows(&s, None);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[0].starts_with("FLOW"));
        for needle in [
            "video-a",
            "239.1.1.1:5000 on vRA",
            "812",
            "1.05 MB",
            "oversize=1 pool_exhausted=2 kernel=3 receive_errors=4",
            "-> 10.0.0.1:6000",
            "backlog=6 send_error=7 last: ENOBUFS",
            "-> 239.2.2.2:7000",
        ] {
            assert!(text.contains(needle), "{needle:?} missing from\n{text}");
        }
        // Right-aligned PACKETS column: every row's count ends where the
        // header does.
        let end = lines[0].find("PACKETS").unwrap() + "PACKETS".len();
        for (line, count) in lines[1..].iter().zip(["812", "800", "805"]) {
            assert_eq!(&line[end - count.len()..end], count, "{text}");
        }
        assert!(lines.iter().all(|l| !l.ends_with(' ')));
    }

    #[test]
    fn flows_table_shows_rates() {
        let prev = sample();
        let mut cur = prev.clone();
        cur.taken_at_unix_ms += 1000;
        cur.flows[0].packets_in += 12_300;
        cur.flows[0].bytes_in += 1_537_500;
        cur.flows[0].drops.kernel += 2;
        let rates = Rates::between(&prev, &cur);
        let text = render_flows(&cur, Some(&rates));
        for needle in ["12.3k", "12.3 Mb/s", "(2.00/s)", "(rates over 1.0 s)"] {
            assert!(text.contains(needle), "{needle:?} missing from\n{text}");
        }
        assert!(!render_flows(&cur, None).contains("Mb/s"));
    }

    #[test]
    fn rist_is_shown_in_the_health_column() {
        let mut s = crate::snapshot::sample_with_legs();
        s.flows[0].rist = Some(crate::snapshot::RistSnapshot {
            nacks_sent: 9,
            recovered: 8,
            unrecovered: 1,
            input_rtt_us: 20_500,
            ..Default::default()
        });
        let text = render_flows(&s, None);
        assert!(
            text.contains("rist in: nacked 9, recovered 8, unrecovered 1, rtt 20.5 ms"),
            "{text}"
        );
        s.flows[0].rist = Some(crate::snapshot::RistSnapshot {
            retransmitted: 3,
            output_rtt_us: 1_000,
            ..Default::default()
        });
        let text = render_flows(&s, None);
        assert!(
            text.contains("rist out: retransmitted 3, unrecoverable 0, rtt 1.0 ms"),
            "{text}"
        );
    }

    /// Each leg row of a merged flow shows its own FEC and RIST figures
    /// after its health, the flow row the flow's.
    #[test]
    fn legs_show_their_own_fec_and_rist() {
        let mut s = crate::snapshot::sample_with_legs();
        s.flows[1].fec = Some(crate::snapshot::FecSnapshot {
            recovered: 19,
            unrecoverable: 0,
            ..Default::default()
        });
        let r = s.flows[1].redundancy.as_mut().expect("legs");
        r.legs[0].fec = Some(crate::snapshot::LegFecSnapshot {
            recovered: 12,
            unrecoverable: 3,
            ..Default::default()
        });
        r.legs[1].rist = Some(crate::snapshot::LegRistSnapshot {
            nacks_sent: 40,
            recovered: 7,
            unrecovered: 2,
            rtt_us: 21_500,
        });
        let text = render_flows(&s, None);
        let line = |needle: &str| {
            text.lines()
                .find(|l| l.contains(needle))
                .unwrap_or_else(|| panic!("{needle:?} missing from\n{text}"))
                .to_owned()
        };
        let flow = line("video-r");
        assert!(
            flow.contains("fec: recovered 19, unrecoverable 0"),
            "{flow}"
        );
        let a = line("<= 239.1.1.1:5000 on vRA");
        assert!(a.contains("fec: recovered 12, unrecoverable 3"), "{a}");
        assert!(!a.contains("rist"), "{a}");
        let b = line("<= 239.1.2.1:5000 on vRB");
        assert!(
            b.contains("rist: nacked 40, recovered 7, unrecovered 2, rtt 21.5 ms"),
            "{b}"
        );
        assert!(!b.contains("fec"), "{b}");
    }

    #[test]
    fn fec_is_shown_in_the_health_column() {
        let mut s = crate::snapshot::sample_with_legs();
        s.flows[0].fec = Some(crate::snapshot::FecSnapshot {
            packets: 40,
            recovered: 12,
            unrecoverable: 3,
            duplicates: 0,
            rejected: 0,
        });
        let text = render_flows(&s, None);
        assert!(
            text.contains("fec: recovered 12, unrecoverable 3"),
            "{text}"
        );
    }

    #[test]
    fn legs_are_shown_under_their_flow() {
        let mut s = crate::snapshot::sample_with_legs();
        let text = render_flows(&s, None);
        let lines: Vec<&str> = text.lines().collect();
        let at = |needle: &str| {
            lines
                .iter()
                .position(|l| l.contains(needle))
                .unwrap_or_else(|| panic!("no {needle:?} in\n{text}"))
        };
        let flow = at("video-r");
        let a = at("<= 239.1.1.1:5000 on vRA");
        let b = at("<= 239.1.2.1:5000 on vRB");
        assert!(flow < a && a < b, "{text}");
        assert!(lines[b + 1].contains("-> 10.0.0.1:6000"), "{text}");
        assert!(
            lines[flow].contains("merge: recovered 25, duplicates 475, lost 2"),
            "{text}"
        );
        assert!(
            lines[a].contains(" 490 ") && lines[a].contains("kernel 1"),
            "{text}"
        );
        assert!(lines[b].contains("lost 15"), "{text}");
        // The one-input flow has no leg rows.
        assert_eq!(text.matches("<= ").count(), 2);
        let r = s.flows[1].redundancy.as_mut().expect("legs");
        r.mode = "failover".into();
        r.active_input = 1;
        r.switches = 2;
        r.legs[0].standby = 7;
        let text = render_flows(&s, None);
        assert!(
            text.contains("failover: input 1 active, 2 switches"),
            "{text}"
        );
        let b = text
            .lines()
            .find(|l| l.contains("<= 239.1.2.1"))
            .expect("leg b");
        assert!(b.contains("active"), "{text}");
        let a = text
            .lines()
            .find(|l| l.contains("<= 239.1.1.1"))
            .expect("leg a");
        assert!(a.contains("standby 7") && !a.contains("active"), "{text}");
        // top shows them too (it renders the same table).
        let top = render_top(&s, &crate::Rates::default());
        assert!(top.contains("<= 239.1.2.1:5000 on vRB"), "{top}");
    }

    #[test]
    fn empty_snapshot_renders() {
        let mut s = sample();
        s.flows.clear();
        s.workers.clear();
        assert_eq!(render_flows(&s, None), "no flows configured\n");
        assert!(status_of(&s).contains("flows:    0 with 0 outputs"));
        assert!(render_stats(&s, None).contains("WORKER"));
    }

    #[test]
    fn top_frame_is_status_then_stats() {
        let prev = sample();
        let mut cur = prev.clone();
        cur.taken_at_unix_ms += 1000;
        let rates = Rates::between(&prev, &cur);
        let frame = render_top(&cur, &rates);
        assert!(
            frame.starts_with("mcrelayd 0.1.0, pid 4242: running\n"),
            "{frame}"
        );
        assert!(frame.contains("\n\nFLOW"), "{frame}");
        assert!(frame.contains("(rates over 1.0 s)"), "{frame}");
        assert!(frame.ends_with(&render_stats(&cur, Some(&rates))));
    }

    #[test]
    fn stats_show_workers_and_pools() {
        let text = render_stats(&sample(), None);
        for needle in [
            "io_uring multishot",
            "5.00k",
            "20.0k",
            "4.00",
            "15.0k",
            "17/4096",
            "2/1024",
            "0/256",
            "jumbo",
            "9000 B",
            "video-a",
        ] {
            assert!(text.contains(needle), "{needle:?} missing from\n{text}");
        }
        let jumbo = text.lines().find(|l| l.contains("jumbo")).unwrap();
        assert!(jumbo.trim_end().ends_with(" 9"), "{jumbo}");
        let small = text.lines().find(|l| l.contains("small")).unwrap();
        assert!(small.contains(" 20 "), "high water in {small}");
    }

    #[test]
    fn health_column_and_status_lines() {
        let mut s = sample();
        let flows = render_flows(&s, None);
        assert!(flows.lines().next().unwrap().ends_with("HEALTH"), "{flows}");
        assert!(
            flows.contains(
                "rtp-mpegts gap 25ms jitter 1.50ms lost 3 dup 2 reordered 1 ssrc changes 1 not rtp 4 cc 6 sync 5 tei 7"
            ),
            "{flows}"
        );
        let status = status_of(&s);
        assert!(
            status.contains("stream:   video-a (lost 3, dup 2, reordered 1, ssrc changes 1, not rtp 4, cc 6, sync 5, tei 7)"),
            "{status}"
        );
        assert!(!status.contains("silent:"));
        s.flows[0].health.silent = true;
        s.flows[0].health.rtp = Some(Default::default());
        s.flows[0].health.ts = None;
        assert!(status_of(&s).contains("silent:   video-a"));
        assert!(!status_of(&s).contains("stream:"));
        assert!(render_flows(&s, None).contains("rtp-mpegts SILENT gap 25ms jitter 0.00ms ok"));
        s.flows[0].health = InputHealth::default();
        assert!(!render_flows(&s, None).contains("gap"));
    }

    #[test]
    fn standby_shows_in_status_and_flows() {
        let mut s = sample();
        assert!(status_of(&s).contains("\nmode:     active\n"));
        assert!(!render_flows(&s, None).contains("standby"));
        s.mode = crate::Mode::Standby;
        let status = status_of(&s);
        assert!(
            status
                .contains("mode:     standby: receiving, sending nothing (9 datagrams discarded)"),
            "{status}"
        );
        let flows = render_flows(&s, None);
        let row = flows.lines().nth(1).expect("a flow row");
        assert!(row.starts_with("video-a  standby "), "{flows}");
        assert!(
            flows.ends_with("`mcrelayctl active` takes over)\n"),
            "{flows}"
        );
        // A paused flow says why, standby or not.
        s.flows[0].state = crate::FlowState::InterfaceDown {
            interface: "vRA".into(),
        };
        assert!(render_flows(&s, None).contains("paused: interface vRA down"));
    }

    #[test]
    fn status_names_twenty_problem_flows_per_list_and_counts_the_rest() {
        let mut s = crate::snapshot::bench_snapshot(1000);
        for (i, f) in s.flows.iter_mut().enumerate() {
            f.health.silent = true;
            if i >= 100 {
                f.state = crate::FlowState::WaitingForInterface {
                    interface: "vX".into(),
                };
            }
        }
        let text = status_of(&s);
        assert!(text.contains("flows:    1000 with 2000 outputs (100 relaying, 900 not)"));
        assert_eq!(
            text.matches("waiting for interface vX").count(),
            20,
            "{text}"
        );
        assert!(text.contains("  flow \"channel-0100\": waiting for interface vX\n"));
        assert!(text.contains(
            "  and 880 more flows not relaying (mcrelayctl flows --state not-running)\n"
        ));
        assert!(text.contains("channel-0000, channel-0001"), "{text}");
        assert!(
            text.contains(", and 80 more (no datagram for silence_ms)\n"),
            "{text}"
        );
        assert!(text.contains("; and 980 more\n"), "{text}");
        assert!(text.len() < 8000, "{} bytes:\n{text}", text.len());
    }
}
