//! The live view drawn with ratatui: a header, the flow table (input legs
//! and outputs folded under their flow), the
//! selected flow's pane (every drop reason, its health and a rate
//! sparkline), the worker and pool panes, and a help line. Panes give way
//! to the flow table as the terminal shrinks, and columns as it narrows.
//!
//! It reads the [`Model`] and tells it one thing: how many table rows fit.

use mcrelay_control::{
    DaemonState, FlowSnapshot, FlowState, Snapshot, flow_drops_text, health_text,
    human_bits_per_second, human_bytes, human_count, human_duration, human_rate,
    leg_protection_text, output_drops_text, protection_text,
};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Clear, Paragraph, Row as TableRow, Sparkline, Table, Wrap};

use super::history::{HISTORY, History};
use super::model::{Mode, Model, Row, RowKind, SortKey, StateFilter, drops_total, leg_count};

const HEADER: u16 = 2;
const FOOTER: u16 = 1;
/// The selected flow's pane.
const DETAIL: u16 = 9;
/// Borders, the column titles and five rows.
const MIN_TABLE: u16 = 8;
/// Most lines the worker and pool panes take.
const MAX_SYSTEM: u16 = 12;
/// Samples in a flow row's TREND cell.
const TREND: u16 = 20;

/// Draw the whole view into `frame`.
pub fn draw(frame: &mut Frame<'_>, model: &mut Model) {
    let panes = Panes::plan(frame.area(), system_rows(model.snapshot()));
    // Borders and the column titles take three lines of the table's pane.
    model.set_viewport(usize::from(panes.table.height.saturating_sub(3)));
    header(frame, panes.header, model);
    flow_table(frame, panes.table, model);
    if let Some(area) = panes.detail {
        detail(frame, area, model);
    }
    if let Some(area) = panes.system {
        let [left, right] =
            Layout::horizontal([Constraint::Percentage(45), Constraint::Fill(1)]).areas(area);
        if let Some(s) = model.snapshot() {
            workers(frame, left, s);
            pools(frame, right, s);
        }
    }
    footer(frame, panes.footer, model);
    if *model.mode() == Mode::Help {
        help(frame, frame.area());
    }
}

/// Where each pane goes for a terminal of this size.
#[derive(Debug)]
struct Panes {
    header: Rect,
    table: Rect,
    detail: Option<Rect>,
    system: Option<Rect>,
    footer: Rect,
}

impl Panes {
    /// The flow table keeps at least [`MIN_TABLE`] lines: the selected
    /// flow's pane goes first, then the worker and pool panes.
    fn plan(area: Rect, system_rows: u16) -> Panes {
        let rest = area.height.saturating_sub(HEADER + FOOTER);
        let system = system_rows.saturating_add(3).min(MAX_SYSTEM);
        let (detail, system) = if rest >= MIN_TABLE + DETAIL + system {
            (DETAIL, system)
        } else if rest >= MIN_TABLE + system {
            (0, system)
        } else {
            (0, 0)
        };
        let [header, table, detail_area, system_area, footer] = Layout::vertical([
            Constraint::Length(HEADER),
            Constraint::Min(0),
            Constraint::Length(detail),
            Constraint::Length(system),
            Constraint::Length(FOOTER),
        ])
        .areas(area);
        Panes {
            header,
            table,
            detail: (detail > 0).then_some(detail_area),
            system: (system > 0).then_some(system_area),
            footer,
        }
    }
}

/// Lines the worker and pool panes want: one per worker, one per pool
/// class, whichever is more.
fn system_rows(s: Option<&Snapshot>) -> u16 {
    let Some(s) = s else { return 0 };
    let pools: usize = s.workers.iter().map(|w| w.pools.len()).sum();
    u16::try_from(pools.max(s.workers.len())).unwrap_or(u16::MAX)
}

fn header(frame: &mut Frame<'_>, area: Rect, model: &Model) {
    let Some(s) = model.snapshot() else {
        frame.render_widget(
            Paragraph::new("waiting for the daemon's first snapshot"),
            area,
        );
        return;
    };
    let t = s.totals();
    let state = match &s.state {
        DaemonState::Running => Span::styled("running", Style::new().fg(Color::Green)),
        DaemonState::Degraded(why) => Span::styled(
            format!("degraded: {why}"),
            Style::new().fg(Color::Red).bold(),
        ),
        DaemonState::Reloading => Span::styled("reloading", Style::new().fg(Color::Yellow)),
    };
    let not_running = t.flows - t.flows_running;
    let first = Line::from(vec![
        Span::raw(format!("mcrelayd {} pid {} ", s.version, s.pid)).bold(),
        state,
        Span::raw(format!(
            " · up {} · {} flows, {} outputs",
            human_duration(s.uptime_seconds),
            t.flows,
            t.outputs
        )),
        if not_running > 0 {
            Span::styled(
                format!(" · {not_running} not relaying"),
                Style::new().fg(Color::Red),
            )
        } else {
            Span::raw("")
        },
        Span::raw(format!(
            " · {} workers · {}",
            s.workers.len(),
            s.config_path
        )),
    ]);
    let second = if let Some(error) = model.error() {
        Line::styled(
            format!("daemon not answering: {error} (showing its last snapshot; retrying)"),
            Style::new().fg(Color::Red).bold(),
        )
    } else if model.has_rates() {
        let r = model.totals();
        let drops = Span::raw(format!(
            " · drops {}/s ({} in all)",
            human_rate(r.drops),
            human_count(s.flows.iter().map(drops_total).fold(0, u64::saturating_add))
        ));
        Line::from(vec![
            Span::raw(format!(
                "in {} pkt/s {} · out {} pkt/s {}",
                human_rate(r.packets_in),
                human_bits_per_second(r.bits_in),
                human_rate(r.packets_out),
                human_bits_per_second(r.bits_out)
            )),
            if r.drops > 0.0 {
                drops.fg(Color::Red)
            } else {
                drops
            },
        ])
    } else {
        Line::raw("rates from the next refresh")
    };
    frame.render_widget(Paragraph::new(vec![first, second]), area);
}

/// A column of the flow table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Col {
    Flow,
    State,
    Path,
    Worker,
    Pps,
    Rate,
    Trend,
    Drops,
    Health,
}

impl Col {
    fn title(self) -> &'static str {
        match self {
            Col::Flow => "FLOW",
            Col::State => "STATE",
            Col::Path => "INPUT / OUTPUT",
            Col::Worker => "W",
            Col::Pps => "PPS",
            Col::Rate => "RATE",
            Col::Trend => "TREND",
            Col::Drops => "DROPS",
            Col::Health => "HEALTH",
        }
    }

    fn width(self, flow: u16) -> Constraint {
        match self {
            Col::Flow => Constraint::Length(flow),
            Col::State => Constraint::Length(13),
            Col::Path => Constraint::Length(26),
            Col::Worker => Constraint::Length(1),
            Col::Pps => Constraint::Length(6),
            Col::Rate => Constraint::Length(10),
            Col::Trend => Constraint::Length(TREND),
            Col::Drops | Col::Health => Constraint::Fill(1),
        }
    }

    fn right_aligned(self) -> bool {
        matches!(self, Col::Worker | Col::Pps | Col::Rate)
    }
}

/// The columns that fit `width`: HEALTH goes first, then the sparkline,
/// the worker and the addresses.
fn columns(width: u16) -> &'static [Col] {
    use Col::*;
    if width >= 150 {
        &[Flow, State, Path, Worker, Pps, Rate, Trend, Drops, Health]
    } else if width >= 120 {
        &[Flow, State, Path, Worker, Pps, Rate, Trend, Drops]
    } else if width >= 90 {
        &[Flow, State, Path, Pps, Rate, Drops]
    } else {
        &[Flow, State, Pps, Drops]
    }
}

fn flow_table(frame: &mut Frame<'_>, area: Rect, model: &Model) {
    let (key, reversed) = model.sort();
    let descending = (key != SortKey::Name) != reversed;
    let filter = model.name_filter();
    let title = format!(
        " flows: {} of {} · sort {} {} · name {} · state {} ",
        model.shown_flows(),
        model.snapshot().map_or(0, |s| s.flows.len()),
        key.label(),
        if descending { "↓" } else { "↑" },
        if filter.is_empty() { "*" } else { filter },
        StateFilter::label_of(model.state_filter()),
    );
    let rows = model.rows();
    let in_view = model.visible_rows().count();
    let mut block = Block::bordered().title(title);
    if in_view > 0 && in_view < rows.len() {
        block = block.title_bottom(
            Line::from(format!(
                " rows {}-{} of {} ",
                model.offset() + 1,
                model.offset() + in_view,
                rows.len()
            ))
            .right_aligned(),
        );
    }
    let Some(s) = model.snapshot() else {
        frame.render_widget(block, area);
        return;
    };
    if rows.is_empty() {
        let why = if s.flows.is_empty() {
            "no flows configured"
        } else {
            "no flow matches the filters (c clears them)"
        };
        frame.render_widget(Paragraph::new(why).block(block), area);
        return;
    }
    let cols = columns(area.width);
    let longest = s.flows.iter().map(|f| f.name.chars().count()).max();
    // Two columns for the fold marker or the tree lines.
    let flow_width = u16::try_from(longest.unwrap_or(0) + 2)
        .unwrap_or(u16::MAX)
        .clamp(6, 32);
    let header = TableRow::new(cols.iter().map(|c| cell(*c, c.title().into()))).bold();
    let body = model.visible_rows().map(|(i, row)| {
        let r = TableRow::new(row_cells(model, s, row, cols));
        if i == model.selected() {
            r.add_modifier(Modifier::REVERSED)
        } else {
            r
        }
    });
    let table = Table::new(body, cols.iter().map(|c| c.width(flow_width)))
        .header(header)
        .column_spacing(1)
        .block(block);
    frame.render_widget(table, area);
}

/// A cell, right-aligned for numbers.
fn cell(col: Col, span: Span<'static>) -> Cell<'static> {
    let line = Line::from(span);
    Cell::from(if col.right_aligned() {
        line.right_aligned()
    } else {
        line
    })
}

fn row_cells(model: &Model, s: &Snapshot, row: &Row, cols: &[Col]) -> Vec<Cell<'static>> {
    let Some(flow) = s.flows.get(row.flow) else {
        return Vec::new();
    };
    let rates = model.flow_rates(&flow.name);
    let tree = if row.last_child { "└─" } else { "├─" };
    cols.iter()
        .map(|&col| {
            let span = match row.kind {
                RowKind::Flow => flow_cell(model, flow, col),
                RowKind::Leg(i) => leg_cell(model, flow, i, col, tree),
                RowKind::SrtInput(i) => srt_input_cell(flow, i, col, tree),
                RowKind::SrtCaller(o, c) => srt_caller_cell(flow, o, c, col),
                RowKind::Output(i) => {
                    let Some(o) = flow.outputs.get(i) else {
                        return Cell::default();
                    };
                    let or = rates.and_then(|r| r.output(&o.label));
                    match col {
                        Col::Flow => Span::raw(format!(" {tree}")),
                        Col::State => match &o.not_connected {
                            Some(_) => Span::styled("not connected", Color::Red),
                            None => Span::raw(""),
                        },
                        Col::Path => Span::raw(format!("→ {}", o.label)),
                        Col::Pps => Span::raw(
                            or.map_or_else(|| "-".into(), |r| human_rate(r.packets_per_second)),
                        ),
                        Col::Rate => Span::raw(or.map_or_else(
                            || "-".into(),
                            |r| human_bits_per_second(r.bits_per_second),
                        )),
                        Col::Drops => alarm(output_drops_text(o, or), o.drops() > 0),
                        Col::Worker | Col::Trend | Col::Health => Span::raw(""),
                    }
                }
            };
            cell(col, span)
        })
        .collect()
}

fn flow_cell(model: &Model, flow: &FlowSnapshot, col: Col) -> Span<'static> {
    let rates = model.flow_rates(&flow.name);
    match col {
        Col::Flow => {
            let marker = if flow.outputs.is_empty() && leg_count(flow) == 0 {
                " "
            } else if model.is_folded(&flow.name) {
                "▸"
            } else {
                "▾"
            };
            Span::raw(format!("{marker} {}", flow.name))
        }
        Col::State => {
            let (text, color) = match &flow.state {
                FlowState::Running => ("running".to_string(), Color::Green),
                FlowState::InterfaceDown { interface } => (format!("down {interface}"), Color::Red),
                FlowState::WaitingForInterface { interface } => {
                    (format!("waiting {interface}"), Color::Yellow)
                }
                FlowState::OpenFailed { .. } => ("open failed".to_string(), Color::Red),
            };
            Span::styled(text, color)
        }
        Col::Path => Span::raw(flow.input.clone()),
        Col::Worker => Span::raw(flow.worker_text()),
        Col::Pps => {
            Span::raw(rates.map_or_else(|| "-".into(), |r| human_rate(r.packets_per_second)))
        }
        Col::Rate => Span::raw(
            rates.map_or_else(|| "-".into(), |r| human_bits_per_second(r.bits_per_second)),
        ),
        Col::Trend => Span::styled(
            model
                .history(&flow.name)
                .map_or_else(String::new, |h| trend(h, usize::from(TREND))),
            Color::Cyan,
        ),
        Col::Drops => alarm(
            flow_drops_text(flow, rates),
            flow.drops.total().saturating_add(flow.receive_errors) > 0,
        ),
        Col::Health => {
            let (text, bad) = redundancy_summary(flow).unwrap_or_else(|| {
                (
                    health_text(&flow.health),
                    flow.health.silent || flow.health.errors() > 0,
                )
            });
            // FEC and RIST after it: what they repaired, what they lost.
            match protection_text(flow) {
                Some((p, lost)) => alarm(format!("{text} · {p}"), bad || lost),
                None => alarm(text, bad),
            }
        }
    }
}

/// The cells of an input leg's row: its input, whether it is the active
/// one (failover), the datagrams it forwards per second, its kernel drops
/// and standby discards, and its stream health.
fn leg_cell(model: &Model, flow: &FlowSnapshot, i: usize, col: Col, tree: &str) -> Span<'static> {
    let Some(r) = &flow.redundancy else {
        return Span::raw("");
    };
    let Some(leg) = r.legs.get(i) else {
        return Span::raw("");
    };
    match col {
        Col::Flow => Span::raw(format!(" {tree}")),
        Col::State => match r.mode.as_str() {
            "failover" if usize::try_from(r.active_input).is_ok_and(|a| a == i) => {
                Span::styled("active", Color::Green)
            }
            "failover" => Span::raw("standby"),
            mode => Span::raw(mode.to_owned()),
        },
        Col::Path => Span::raw(format!("← {}", leg.input)),
        Col::Pps => Span::raw(
            model
                .leg_rate(&flow.name, i)
                .map_or_else(|| "-".into(), human_rate),
        ),
        Col::Drops => {
            let mut parts = Vec::new();
            if leg.kernel_drops > 0 {
                parts.push(format!("kernel={}", human_count(leg.kernel_drops)));
            }
            if leg.standby > 0 {
                parts.push(format!("standby={}", human_count(leg.standby)));
            }
            let bad = leg.kernel_drops > 0;
            alarm(
                if parts.is_empty() {
                    "none".into()
                } else {
                    parts.join(" ")
                },
                bad,
            )
        }
        Col::Health => {
            let bad = leg.health.silent || leg.health.errors() > 0;
            // The leg's own FEC and RIST after it: what they repaired, what
            // this leg lost (another leg may have delivered it).
            match leg_protection_text(leg) {
                Some((p, lost)) => {
                    alarm(format!("{} · {p}", health_text(&leg.health)), bad || lost)
                }
                None => alarm(health_text(&leg.health), bad),
            }
        }
        Col::Worker | Col::Rate | Col::Trend => Span::raw(""),
    }
}

/// An SRT input: its peer (or that none is connected), what the SRT
/// thread dropped on the way to the worker, and libsrt's view of the link.
fn srt_input_cell(flow: &FlowSnapshot, i: usize, col: Col, tree: &str) -> Span<'static> {
    let Some(s) = flow.srt_inputs.get(i) else {
        return Span::raw("");
    };
    match col {
        Col::Flow => Span::raw(format!(" {tree}")),
        Col::State => match (&s.peer, s.listener) {
            (Some(_), _) => Span::styled("connected", Color::Green),
            (None, true) => Span::styled("no caller", Color::Yellow),
            (None, false) => Span::styled("calling", Color::Yellow),
        },
        Col::Path => Span::raw(match &s.peer {
            Some(p) => format!("⇐ {} from {}", s.label, p.peer),
            None => format!("⇐ {}", s.label),
        }),
        Col::Drops => {
            let dropped = s.drop_queue_full + s.drop_flow_gone;
            alarm(
                if dropped == 0 {
                    "none".into()
                } else {
                    format!(
                        "queue_full={} flow_gone={}",
                        human_count(s.drop_queue_full),
                        human_count(s.drop_flow_gone)
                    )
                },
                dropped > 0,
            )
        }
        Col::Rate => Span::raw(
            s.peer
                .as_ref()
                .map(|p| human_bits_per_second(p.receive_bps as f64))
                .unwrap_or_default(),
        ),
        Col::Health => {
            let mut text = match &s.peer {
                Some(p) => format!(
                    "rtt {:.1} ms · lost {} · too late {}",
                    p.rtt_us as f64 / 1000.0,
                    human_count(p.lost),
                    human_count(p.too_late)
                ),
                None => "not connected".to_owned(),
            };
            if s.refused > 0 {
                text.push_str(&format!(" · {} refused", human_count(s.refused)));
            }
            let bad = s.peer.as_ref().is_none_or(|p| p.too_late > 0);
            alarm(text, bad)
        }
        Col::Worker | Col::Pps | Col::Trend => Span::raw(""),
    }
}

/// A caller of an SRT output, under its output.
fn srt_caller_cell(flow: &FlowSnapshot, o: usize, c: usize, col: Col) -> Span<'static> {
    let Some(c) = flow
        .outputs
        .get(o)
        .and_then(|o| o.srt.as_ref())
        .and_then(|r| r.callers.get(c))
    else {
        return Span::raw("");
    };
    match col {
        Col::Flow => Span::raw(" │"),
        Col::State => Span::styled("caller", Color::Green),
        Col::Path => Span::raw(if c.stream_id.is_empty() {
            format!("  ⇒ {}", c.peer)
        } else {
            format!("  ⇒ {} ({})", c.peer, c.stream_id)
        }),
        Col::Rate => Span::raw(human_bits_per_second(c.send_bps as f64)),
        Col::Drops => alarm(
            if c.dropped + c.too_late == 0 {
                "none".into()
            } else {
                format!(
                    "full={} too_late={}",
                    human_count(c.dropped),
                    human_count(c.too_late)
                )
            },
            c.dropped + c.too_late > 0,
        ),
        Col::Health => Span::raw(format!(
            "rtt {:.1} ms · lost {} · retransmitted {}",
            c.rtt_us as f64 / 1000.0,
            human_count(c.lost),
            human_count(c.retransmitted)
        )),
        Col::Worker | Col::Pps | Col::Trend => Span::raw(""),
    }
}

/// What a flow's redundancy did, for its HEALTH cell and its pane.
fn redundancy_summary(flow: &FlowSnapshot) -> Option<(String, bool)> {
    let r = flow.redundancy.as_ref()?;
    Some(match r.mode.as_str() {
        "failover" => (
            format!(
                "failover: input {} active · {} switches · duplicates {}",
                r.active_input,
                human_count(r.switches),
                human_count(r.duplicates)
            ),
            false,
        ),
        mode => (
            format!(
                "{mode}: recovered {} · duplicates {} · lost {} · resets {} · late {} · not rtp {}",
                human_count(r.recovered),
                human_count(r.duplicates),
                human_count(r.lost),
                human_count(r.resets),
                human_count(r.late),
                human_count(r.not_rtp)
            ),
            r.lost > 0,
        ),
    })
}

/// `text`, in red if `bad`.
fn alarm(text: String, bad: bool) -> Span<'static> {
    if bad {
        Span::styled(text, Color::Red)
    } else {
        Span::raw(text)
    }
}

/// The newest `width` samples as block characters scaled to their peak
/// (a zero sample is blank).
fn trend(h: &History, width: usize) -> String {
    const BARS: [char; 9] = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let peak = u128::from(h.latest(width).max().unwrap_or(0));
    h.latest(width)
        .map(|v| {
            if peak == 0 {
                return BARS[0];
            }
            let level = (u128::from(v) * 8).div_ceil(peak);
            BARS[usize::try_from(level).unwrap_or(8).min(8)]
        })
        .collect()
}

/// The selected flow: its state and input, its health, every ingress drop
/// reason and each output's, and a sparkline of its packet rate.
fn detail(frame: &mut Frame<'_>, area: Rect, model: &Model) {
    let Some(flow) = model.selected_flow() else {
        frame.render_widget(Block::bordered().title(" no flow selected "), area);
        return;
    };
    let block = Block::bordered().title(format!(" flow {} ", flow.name));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let spark_width = (inner.width / 3).min(u16::try_from(HISTORY).unwrap_or(u16::MAX) + 2);
    let [text_area, spark_area] =
        Layout::horizontal([Constraint::Fill(1), Constraint::Length(spark_width)]).areas(inner);

    let rates = model.flow_rates(&flow.name);
    let mut lines = vec![
        Line::from(format!(
            "{} · worker {} · input {} · interface pauses {}",
            flow.state,
            flow.worker_text(),
            flow.input,
            flow.interface_pauses
        )),
        Line::from(format!(
            "received {} packets, {}{}",
            human_count(flow.packets_in),
            human_bytes(flow.bytes_in),
            rates.map_or_else(String::new, |r| format!(
                " · {} pkt/s {}",
                human_rate(r.packets_per_second),
                human_bits_per_second(r.bits_per_second)
            )),
        )),
    ];
    lines.push(alarm_line(
        format!("health: {}", health_text(&flow.health)),
        flow.health.silent || flow.health.errors() > 0,
    ));
    if let Some((text, bad)) = redundancy_summary(flow) {
        lines.push(alarm_line(text, bad));
    }
    if let Some((text, lost)) = protection_text(flow) {
        lines.push(alarm_line(text, lost));
    }
    let mut reasons: Vec<String> = flow
        .drops
        .by_reason()
        .iter()
        .map(|(reason, n)| format!("{reason} {}", human_count(*n)))
        .collect();
    reasons.push(format!(
        "receive_errors {}",
        human_count(flow.receive_errors)
    ));
    lines.push(alarm_line(
        format!("ingress drops: {}", reasons.join(" · ")),
        flow.drops.total().saturating_add(flow.receive_errors) > 0,
    ));
    for o in &flow.outputs {
        lines.push(alarm_line(
            format!(
                "→ {}: sent {} · drops backlog {} · send_error {}{}{}",
                o.label,
                human_count(o.packets_out),
                human_count(o.drops_backlog),
                human_count(o.drops_send_error),
                o.last_error
                    .as_ref()
                    .map_or_else(String::new, |e| format!(" · last: {e}")),
                o.not_connected
                    .as_ref()
                    .map_or_else(String::new, |e| format!(" · NOT CONNECTED: {e}")),
            ),
            o.drops() > 0 || o.not_connected.is_some(),
        ));
    }
    frame.render_widget(Paragraph::new(lines).wrap(Wrap { trim: false }), text_area);

    let Some(history) = model.history(&flow.name) else {
        return;
    };
    let samples: Vec<u64> = history
        .latest(usize::from(spark_width.saturating_sub(2)))
        .collect();
    let span = model.interval.as_secs_f64() * samples.len() as f64;
    let span = if span < 10.0 {
        format!("{span:.1}")
    } else {
        format!("{span:.0}")
    };
    let spark = Sparkline::default()
        .block(Block::bordered().title(format!(
            " pkt/s, last {span} s, peak {} ",
            human_rate(samples.iter().copied().max().unwrap_or(0) as f64)
        )))
        .data(&samples)
        .style(Color::Cyan);
    frame.render_widget(spark, spark_area);
}

fn alarm_line(text: String, bad: bool) -> Line<'static> {
    Line::from(alarm(text, bad))
}

fn workers(frame: &mut Frame<'_>, area: Rect, s: &Snapshot) {
    let right = |t: String| Cell::from(Line::from(t).right_aligned());
    let rows = s.workers.iter().map(|w| {
        let per_turn = if w.loop_turns == 0 {
            "-".to_string()
        } else {
            format!("{:.2}", w.completions as f64 / w.loop_turns as f64)
        };
        TableRow::new(vec![
            right(w.index.to_string()),
            right(w.cpu.map_or_else(|| "-".into(), |c| c.to_string())),
            Cell::from(w.receive_mode.clone()),
            right(human_count(w.loop_turns)),
            right(per_turn),
            right(human_count(w.sends_submitted)),
        ])
    });
    let table = Table::new(
        rows,
        [
            Constraint::Length(2),
            Constraint::Length(3),
            Constraint::Fill(1),
            Constraint::Length(6),
            Constraint::Length(8),
            Constraint::Length(6),
        ],
    )
    .header(TableRow::new(["W", "CPU", "RECEIVE", "TURNS", "PER TURN", "SENDS"]).bold())
    .block(Block::bordered().title(" workers "));
    frame.render_widget(table, area);
}

fn pools(frame: &mut Frame<'_>, area: Rect, s: &Snapshot) {
    let right = |t: String| Cell::from(Line::from(t).right_aligned());
    let rows = s.workers.iter().flat_map(|w| {
        w.pools.iter().map(move |p| {
            let exhausted = Line::from(p.exhausted.to_string()).right_aligned();
            TableRow::new(vec![
                right(w.index.to_string()),
                Cell::from(p.class.clone()),
                right(format!("{} B", p.buffer_bytes)),
                right(format!("{}/{}", p.in_use, p.capacity)),
                right(p.high_water.to_string()),
                right(human_count(p.taken)),
                Cell::from(if p.exhausted > 0 {
                    exhausted.red()
                } else {
                    exhausted
                }),
            ])
        })
    });
    let table = Table::new(
        rows,
        [
            Constraint::Length(2),
            Constraint::Length(8),
            Constraint::Length(7),
            Constraint::Length(11),
            Constraint::Length(10),
            Constraint::Length(6),
            Constraint::Length(9),
        ],
    )
    .header(
        TableRow::new([
            "W",
            "CLASS",
            "BUFFER",
            "IN USE",
            "HIGH WATER",
            "TAKEN",
            "EXHAUSTED",
        ])
        .bold(),
    )
    .block(Block::bordered().title(" pools "));
    frame.render_widget(table, area);
}

fn footer(frame: &mut Frame<'_>, area: Rect, model: &Model) {
    let line = match model.mode() {
        Mode::Filter { .. } => Line::from(vec![
            Span::raw("filter flows by name (a substring, or a glob with * and ?): ").bold(),
            Span::raw(format!("{}▏", model.name_filter())),
            Span::raw("   ⏎ keep  Esc cancel"),
        ]),
        _ => {
            let mut spans = Vec::new();
            for (keys, what) in HINTS {
                spans.push(Span::raw(*keys).bold());
                spans.push(Span::raw(format!(" {what}  ")));
            }
            Line::from(spans)
        }
    };
    frame.render_widget(Paragraph::new(line), area);
}

/// The help line: keys and what they do.
const HINTS: &[(&str, &str)] = &[
    ("q", "quit"),
    ("↑↓ PgUp PgDn Home End", "move"),
    ("⏎", "fold"),
    ("+/-", "all"),
    ("r d n", "sort rate/drops/name"),
    ("/", "filter"),
    ("f", "state"),
    ("c", "clear"),
    ("?", "help"),
];

/// Every key and pane, over the view until a key is pressed.
const HELP: &[&str] = &[
    "mcrelayctl top: keys",
    "",
    "  q, Ctrl-C         quit",
    "  ↑ ↓, j k          move the selection one row",
    "  PgUp PgDn         move a page;  Home End (g G): first, last row",
    "  Enter, Space      fold or unfold the selected flow's outputs and legs",
    "  + / -             unfold / fold every flow",
    "  r  d  n           sort by rate, drops, name (again: reverse); s cycles",
    "  /                 filter by name: a substring, or a glob (* ?);",
    "                    Enter keeps it, Esc restores the one before",
    "  f                 filter by state: running, not_running, interface_down,",
    "                    waiting_for_interface, open_failed, all",
    "  c                 clear both filters",
    "  ?, h              this help (any key closes it)",
    "",
    "Panes: the flow table (TREND: packets/s over the last refreshes),",
    "the selected flow (every drop reason, health, a rate sparkline),",
    "workers (loop turns, completions per turn) and pools (buffers in use).",
];

fn help(frame: &mut Frame<'_>, area: Rect) {
    let width = HELP
        .iter()
        .map(|l| u16::try_from(l.chars().count()).unwrap_or(u16::MAX))
        .max()
        .unwrap_or(0)
        .saturating_add(4)
        .min(area.width);
    let height = u16::try_from(HELP.len())
        .unwrap_or(u16::MAX)
        .saturating_add(2)
        .min(area.height);
    let popup = Rect {
        x: area.x + (area.width - width) / 2,
        y: area.y + (area.height - height) / 2,
        width,
        height,
    };
    frame.render_widget(Clear, popup);
    frame.render_widget(
        Paragraph::new(HELP.iter().map(|l| Line::raw(*l)).collect::<Vec<_>>())
            .block(Block::bordered().title(" help ")),
        popup,
    );
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use mcrelay_control::FlowState;
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;

    use super::super::model::fixtures::{flow, snapshot};
    use super::super::model::{Key, Model};
    use super::*;

    /// Three flows seen twice a second apart: `a` with a drop and an
    /// output that isn't connected, `b` silent, `c` down.
    fn model() -> Model {
        let mut m = Model::new(Duration::from_secs(1));
        let flows = |k: u64| {
            let mut a = flow("a", 100 * k, 2);
            a.drops.kernel = k - 1;
            a.health.payload = "rtp".into();
            a.outputs[1].not_connected = Some("no route to 10.9.9.9".into());
            let mut b = flow("b", 5, 1);
            b.health.payload = "udp".into();
            b.health.silent = true;
            let mut c = flow("c", 0, 0);
            c.state = FlowState::InterfaceDown {
                interface: "vRA".into(),
            };
            vec![a, b, c]
        };
        m.update(snapshot(1000, flows(1)));
        m.update(snapshot(2000, flows(2)));
        m
    }

    fn draw_on(terminal: &mut Terminal<TestBackend>, m: &mut Model) -> Vec<String> {
        terminal.draw(|f| draw(f, m)).unwrap();
        let buf = terminal.backend().buffer();
        (0..buf.area.height)
            .map(|y| {
                (0..buf.area.width)
                    .map(|x| buf[(x, y)].symbol())
                    .collect::<String>()
            })
            .collect()
    }

    fn screen(width: u16, height: u16, m: &mut Model) -> Vec<String> {
        draw_on(
            &mut Terminal::new(TestBackend::new(width, height)).unwrap(),
            m,
        )
    }

    fn line_with<'a>(screen: &'a [String], needle: &str) -> &'a str {
        screen
            .iter()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("{needle:?} not on screen:\n{}", screen.join("\n")))
    }

    fn assert_shows(screen: &[String], needles: &[&str]) {
        for n in needles {
            line_with(screen, n);
        }
    }

    #[test]
    fn a_large_terminal_shows_every_pane() {
        let mut m = model();
        let s = screen(160, 48, &mut m);
        assert_shows(
            &s,
            &[
                "mcrelayd 0.1.0 pid 4242 running · up 1h 02m 03s · 3 flows, 3 outputs · 1 not relaying",
                "in 100 pkt/s 800 kb/s · out 200 pkt/s 1.60 Mb/s · drops 1.00/s (1 in all)",
                "flows: 3 of 3 · sort name ↑ · name * · state all",
                "FLOW",
                "TREND",
                "HEALTH",
                "running",
                "down vRA",
                "→ 239.2.2.1:6000",
                "not connected",
                "NOT CONNECTED: no route to 10.9.9.9",
                "SILENT",
                " flow a ",
                "ingress drops: oversize 0 · pool_exhausted 0 · kernel 1 ·",
                "pkt/s, last 1.0 s, peak 100",
                " workers ",
                "io_uring multishot",
                " pools ",
                "q quit",
                "? help",
            ],
        );
        // Rows: each flow, its outputs under it with tree lines; the
        // first (selected) row drawn reversed.
        let a = s.iter().position(|l| l.contains("▾ a ")).unwrap();
        assert!(s[a].contains("239.1.1.1:5000 on in-a"), "{}", s[a]);
        assert!(s[a].contains("kernel=1 (1.00/s)"), "{}", s[a]);
        assert!(s[a + 1].contains("├─") && s[a + 1].contains("→ 239.2.2.0:6000"));
        assert!(s[a + 2].contains("└─") && s[a + 2].contains("→ 239.2.2.1:6000"));
        assert!(s[a + 3].contains("▾ b "));
        assert!(s[a + 5].contains("  c ") && s[a + 5].contains("down vRA"));
        let buf_row = u16::try_from(a).unwrap();
        let mut t = Terminal::new(TestBackend::new(160, 48)).unwrap();
        draw_on(&mut t, &mut m);
        let buf = t.backend().buffer();
        assert!(buf[(3, buf_row)].modifier.contains(Modifier::REVERSED));
        assert!(!buf[(3, buf_row + 3)].modifier.contains(Modifier::REVERSED));
        // The pool class that ran out is counted in red.
        let jumbo = line_with(&s, "jumbo");
        let pool = jumbo.rsplit('│').nth(1).unwrap_or_default();
        assert!(pool.trim_end().ends_with("5.00k         9"), "{jumbo}");
    }

    /// FEC's and RIST's counters show in the HEALTH cell and the flow's
    /// pane, in red once something was lost after them.
    #[test]
    fn fec_and_rist_are_shown() {
        let mut m = Model::new(Duration::from_secs(1));
        let flows = || {
            let mut a = flow("a", 100, 1);
            a.health.payload = "rtp".into();
            a.fec = Some(mcrelay_control::FecSnapshot {
                packets: 40,
                recovered: 12,
                unrecoverable: 3,
                duplicates: 0,
                rejected: 0,
            });
            a.rist = Some(mcrelay_control::RistSnapshot {
                nacks_sent: 9,
                recovered: 8,
                input_rtt_us: 20_500,
                ..Default::default()
            });
            vec![a]
        };
        m.update(snapshot(1000, flows()));
        m.update(snapshot(2000, flows()));
        let s = screen(200, 48, &mut m);
        let pane = line_with(&s, "fec: recovered 12, unrecoverable 3; rist in: nacked 9");
        assert!(
            pane.contains("recovered 8, unrecovered 0, rtt 20.5 ms"),
            "{pane}"
        );
        let row = s.iter().position(|l| l.contains("▾ a ")).unwrap();
        assert!(s[row].contains("fec: recovered 12"), "{}", s[row]);
        let mut t = Terminal::new(TestBackend::new(200, 48)).unwrap();
        draw_on(&mut t, &mut m);
        let buf = t.backend().buffer();
        let y = u16::try_from(row).unwrap();
        let x = u16::try_from(s[row].find("fec:").unwrap()).unwrap();
        assert_eq!(buf[(x, y)].fg, Color::Red, "a loss after FEC is an alarm");
    }

    #[test]
    fn panes_and_columns_give_way_as_the_terminal_shrinks() {
        let mut m = model();
        let mut t = Terminal::new(TestBackend::new(160, 48)).unwrap();
        let big = draw_on(&mut t, &mut m);
        assert!(big.iter().any(|l| l.contains(" pools ")));
        // A resize: the same terminal, redrawn.
        t.backend_mut().resize(100, 24);
        let mid = draw_on(&mut t, &mut m);
        assert_eq!(mid.len(), 24);
        assert!(
            !mid.iter().any(|l| l.contains(" flow a ")),
            "no detail pane"
        );
        assert_shows(&mid, &[" pools ", " workers ", "FLOW", "RATE", "DROPS"]);
        assert!(
            !mid.iter()
                .any(|l| l.contains("HEALTH") || l.contains("TREND"))
        );
        t.backend_mut().resize(60, 11);
        let small = draw_on(&mut t, &mut m);
        assert!(!small.iter().any(|l| l.contains(" pools ")));
        assert_shows(&small, &["FLOW", "PPS", "▾ a", "q quit"]);
        assert!(!small.iter().any(|l| l.contains("INPUT")));
        // 11 lines: 2 header, 1 help, 3 of table borders and titles: 5
        // of the 6 rows.
        assert_shows(&small, &["rows 1-5 of 6"]);
    }

    #[test]
    fn scrolls_to_the_last_of_a_thousand_flows() {
        let mut m = Model::new(Duration::from_secs(1));
        let flows: Vec<_> = (0..1000).map(|i| flow(&format!("f{i:04}"), 5, 1)).collect();
        m.update(snapshot(1000, flows));
        let s = screen(160, 48, &mut m);
        assert_shows(&s, &["▾ f0000", "rows 1-"]);
        m.key(Key::End);
        let s = screen(160, 48, &mut m);
        assert_shows(&s, &["▾ f0999", " flow f0999 ", "of 2000 "]);
        let last = line_with(&s, "rows ");
        assert!(last.contains("-2000 of 2000"), "{last}");
        assert!(!s.iter().any(|l| l.contains("f0000")));
        assert_shows(&s, &["rates from the next refresh"]);
    }

    #[test]
    fn help_filter_line_and_errors() {
        let mut m = model();
        m.key(Key::Char('?'));
        let s = screen(160, 48, &mut m);
        assert_shows(&s, &[" help ", "mcrelayctl top: keys", "filter by state"]);
        m.key(Key::Char('x'));
        m.key(Key::Char('/'));
        m.key(Key::Char('b'));
        let s = screen(160, 48, &mut m);
        assert_shows(
            &s,
            &[
                "filter flows by name",
                "b▏",
                "flows: 1 of 3 · sort name ↑ · name b",
            ],
        );
        m.key(Key::Char('x'));
        let s = screen(160, 48, &mut m);
        assert_shows(&s, &["no flow matches the filters (c clears them)"]);
        m.set_error("connecting to /run/mcrelay/control.sock: refused".into());
        let s = screen(160, 48, &mut m);
        assert_shows(
            &s,
            &["daemon not answering: connecting to /run/mcrelay/control.sock: refused"],
        );
    }

    #[test]
    fn legs_show_under_their_flow_above_its_outputs() {
        use super::super::model::fixtures::with_legs;
        let mut m = Model::new(Duration::from_secs(1));
        let flows = |k: u64| {
            let legs = [
                ("239.1.1.1:5000 on vRA", 9 * k),
                ("239.1.2.1:5000 on vRB", k),
            ];
            vec![with_legs(flow("r", 10 * k, 1), "failover", &legs)]
        };
        m.update(snapshot(1000, flows(1)));
        m.update(snapshot(2000, flows(2)));
        let s = screen(160, 48, &mut m);
        let at = s.iter().position(|l| l.contains("▾ r ")).unwrap();
        assert!(s[at].contains("failover: input 1 active"), "{}", s[at]);
        for (row, needles) in [
            (
                at + 1,
                ["├─", "standby", "← 239.1.1.1:5000 on vRA", " 9.00 "],
            ),
            (
                at + 2,
                ["├─", "active", "← 239.1.2.1:5000 on vRB", " 1.00 "],
            ),
            (at + 3, ["└─", "", "→ 239.2.2.0:6000", " 10.0 "]),
        ] {
            for n in needles {
                assert!(s[row].contains(n), "{n:?} not in {}", s[row]);
            }
        }
        assert!(s[at + 1].contains("rtp gap"), "{}", s[at + 1]);
        assert_shows(
            &s,
            &["failover: input 1 active · 3 switches · duplicates 475"],
        );
    }

    /// A merged flow's leg rows show each leg's own FEC and RIST figures
    /// after its health, in red when the leg lost something after them.
    #[test]
    fn legs_show_their_own_fec_and_rist() {
        use super::super::model::fixtures::with_legs;
        let mut m = Model::new(Duration::from_secs(1));
        let flows = |k: u64| {
            let legs = [
                ("239.1.1.1:5000 on vRA", 9 * k),
                ("239.1.2.1:5000 on vRB", k),
            ];
            let mut f = with_legs(flow("r", 10 * k, 1), "merge", &legs);
            let r = f.redundancy.as_mut().unwrap();
            r.legs[0].fec = Some(mcrelay_control::LegFecSnapshot {
                recovered: 12,
                unrecoverable: 3,
                ..Default::default()
            });
            r.legs[1].rist = Some(mcrelay_control::LegRistSnapshot {
                nacks_sent: 40,
                recovered: 7,
                unrecovered: 0,
                rtt_us: 21_500,
            });
            vec![f]
        };
        m.update(snapshot(1000, flows(1)));
        m.update(snapshot(2000, flows(2)));
        let s = screen(220, 48, &mut m);
        let at = s.iter().position(|l| l.contains("▾ r ")).unwrap();
        assert!(
            s[at + 1].contains("fec: recovered 12, unrecoverable 3"),
            "{}",
            s[at + 1]
        );
        assert!(
            // (The HEALTH column cuts the RTT off at this width.)
            s[at + 2].contains("rist: nacked 40, recovered 7, unrecovered 0"),
            "{}",
            s[at + 2]
        );
        let mut t = Terminal::new(TestBackend::new(220, 48)).unwrap();
        draw_on(&mut t, &mut m);
        let buf = t.backend().buffer();
        // The column the needle starts in (the screen has multi-byte
        // symbols before it).
        let cell = |row: usize, needle: &str| {
            let byte = s[row].find(needle).unwrap();
            let x = u16::try_from(s[row][..byte].chars().count()).unwrap();
            buf[(x, u16::try_from(row).unwrap())].fg
        };
        assert_eq!(cell(at + 1, "fec:"), Color::Red, "leg 0 lost 3 after FEC");
        assert_ne!(cell(at + 2, "rist:"), Color::Red, "leg 1 lost nothing");
    }

    #[test]
    fn trend_scales_to_its_peak() {
        let mut h = History::default();
        assert_eq!(trend(&h, 5), "");
        for v in [0, 1, 4, 8, 2] {
            h.push(v);
        }
        assert_eq!(trend(&h, 5), " ▁▄█▂");
        assert_eq!(trend(&h, 2), "█▂", "the newest, scaled to their own peak");
        let mut zeros = History::default();
        zeros.push(0);
        zeros.push(0);
        assert_eq!(trend(&zeros, 4), "  ");
    }
}
