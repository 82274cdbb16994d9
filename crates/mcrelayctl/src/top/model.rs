//! The live view's state, without a terminal: the latest snapshot and the
//! rates since the one before, a bounded rate history per flow, and what
//! the operator chose (sort, filters, folds, selection, scroll position).
//! Keys arrive as [`Key`]s and change only this state; the view reads it.
//!
//! The table is a list of [`Row`]s: each flow that passes the filters,
//! then, unless it is folded, its input legs and its outputs as child rows.
//! Which flows pass and in which order is [`crate::select`]'s, the same
//! selection `mcrelayctl flows` and `stats` use.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use mcrelay_control::{FlowRates, FlowSnapshot, Rates, Snapshot, per_second};

use super::history::{History, sample};

/// A key the view reacts to (the event loop translates the terminal's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    Char(char),
    Up,
    Down,
    PageUp,
    PageDown,
    Home,
    End,
    Enter,
    Esc,
    Backspace,
    /// Ctrl-C (raw mode delivers it as a key, not as SIGINT).
    Interrupt,
}

use crate::select::{NamePattern, Selection};
pub use crate::select::{Sort as SortKey, StateFilter, drops_total};

/// Whether `name` matches the operator's filter: a glob (`*` any run of
/// characters, `?` one) matched against the whole name if it has a
/// wildcard, else a substring. An empty filter matches every name.
#[cfg(test)]
pub fn name_matches(pattern: &str, name: &str) -> bool {
    NamePattern::search(pattern).matches(name)
}

/// What a row of the flow table shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RowKind {
    /// The flow itself: its input, rates, drops and health.
    Flow,
    /// One of the flow's input legs (redundancy), by index.
    Leg(usize),
    /// One of the flow's outputs, by index in `FlowSnapshot::outputs`.
    Output(usize),
    /// One of the flow's SRT inputs, by index in `FlowSnapshot::srt_inputs`.
    SrtInput(usize),
    /// A caller of an SRT output: (output, caller) by index.
    SrtCaller(usize, usize),
}

/// One line of the flow table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    /// Index into the snapshot's `flows`.
    pub flow: usize,
    pub kind: RowKind,
    /// The last child row of its flow (drawn `└` rather than `├`).
    pub last_child: bool,
}

/// The input legs of a flow with several (redundancy), as child rows
/// above its outputs; none for a flow with one input.
pub fn leg_count(flow: &FlowSnapshot) -> usize {
    flow.redundancy.as_ref().map_or(0, |r| r.legs.len())
}

/// What the keys are doing now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    Normal,
    /// Typing the name filter (applied as typed); `before` comes back on Esc.
    Filter {
        before: String,
    },
    /// The key reference over the view; any key closes it.
    Help,
}

/// Rates summed over every flow (input) and output.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TotalRates {
    pub packets_in: f64,
    pub bits_in: f64,
    pub packets_out: f64,
    pub bits_out: f64,
    pub drops: f64,
}

/// Everything the view shows and the keys change.
#[derive(Debug)]
pub struct Model {
    /// Time between snapshots (for the sparkline's span).
    pub interval: Duration,
    snapshot: Option<Snapshot>,
    /// Between the previous snapshot and this one; `None` for the first.
    rates: Option<Rates>,
    /// Flow name → index in `rates.flows`.
    rate_index: HashMap<String, usize>,
    /// Flow name → datagrams forwarded per second from each of its legs.
    leg_rates: HashMap<String, Vec<f64>>,
    totals: TotalRates,
    history: HashMap<String, History>,
    sort: SortKey,
    /// Reverse of the key's natural order (name ascending, rate and
    /// drops descending).
    reversed: bool,
    name_filter: String,
    /// `None`: every state.
    state_filter: Option<StateFilter>,
    /// Whether flows are folded unless listed in `fold_toggled`.
    fold_default: bool,
    fold_toggled: HashSet<String>,
    rows: Vec<Row>,
    /// Flows that pass the filters.
    shown_flows: usize,
    selected: usize,
    /// The selected row by flow name and kind, kept across re-sorting.
    selected_key: Option<(String, RowKind)>,
    /// First row in view.
    offset: usize,
    /// Rows the table has room for (set by the view from the terminal's size).
    viewport: usize,
    mode: Mode,
    error: Option<String>,
    quit: bool,
}

impl Model {
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            snapshot: None,
            rates: None,
            rate_index: HashMap::new(),
            leg_rates: HashMap::new(),
            totals: TotalRates::default(),
            history: HashMap::new(),
            sort: SortKey::Name,
            reversed: false,
            name_filter: String::new(),
            state_filter: None,
            fold_default: false,
            fold_toggled: HashSet::new(),
            rows: Vec::new(),
            shown_flows: 0,
            selected: 0,
            selected_key: None,
            offset: 0,
            viewport: 1,
            mode: Mode::Normal,
            error: None,
            quit: false,
        }
    }

    /// A new snapshot: rates since the previous one, a sample in each
    /// flow's history, and the rows again (the selection stays on its flow).
    pub fn update(&mut self, next: Snapshot) {
        let rates = self.snapshot.as_ref().map(|p| Rates::between(p, &next));
        self.rate_index.clear();
        self.totals = TotalRates::default();
        if let Some(r) = &rates {
            for (i, f) in r.flows.iter().enumerate() {
                self.rate_index.insert(f.name.clone(), i);
                self.totals.packets_in += f.packets_per_second;
                self.totals.bits_in += f.bits_per_second;
                self.totals.drops += f.drops_per_second;
                for o in &f.outputs {
                    self.totals.packets_out += o.packets_per_second;
                    self.totals.bits_out += o.bits_per_second;
                    self.totals.drops += o.drops_per_second;
                }
            }
        }
        let names: HashSet<&str> = next.flows.iter().map(|f| f.name.as_str()).collect();
        self.history.retain(|name, _| names.contains(name.as_str()));
        for flow in &next.flows {
            let h = self.history.entry(flow.name.clone()).or_default();
            if let Some(fr) = rates.as_ref().and_then(|r| {
                self.rate_index
                    .get(&flow.name)
                    .and_then(|&i| r.flows.get(i))
            }) {
                h.push(sample(fr.packets_per_second));
            }
        }
        self.fold_toggled
            .retain(|name| names.contains(name.as_str()));
        self.leg_rates.clear();
        if let (Some(prev), Some(r)) = (&self.snapshot, &rates) {
            let before: HashMap<&str, &FlowSnapshot> =
                prev.flows.iter().map(|f| (f.name.as_str(), f)).collect();
            for flow in &next.flows {
                let (Some(now), Some(then)) = (
                    flow.redundancy.as_ref(),
                    before
                        .get(flow.name.as_str())
                        .and_then(|p| p.redundancy.as_ref()),
                ) else {
                    continue;
                };
                let per_leg = now
                    .legs
                    .iter()
                    .map(|leg| {
                        then.legs
                            .iter()
                            .find(|l| l.input == leg.input)
                            .map_or(0.0, |l| {
                                per_second(l.forwarded, leg.forwarded, r.elapsed_seconds)
                            })
                    })
                    .collect();
                self.leg_rates.insert(flow.name.clone(), per_leg);
            }
        }
        self.rates = rates;
        self.snapshot = Some(next);
        self.error = None;
        self.rebuild();
    }

    /// The daemon could not be asked: shown until the next snapshot
    /// arrives; the last snapshot stays in view.
    pub fn set_error(&mut self, error: String) {
        self.error = Some(error);
    }

    /// Rows of the table the terminal has room for now.
    pub fn set_viewport(&mut self, rows: usize) {
        self.viewport = rows.max(1);
        self.scroll_to_selection();
    }

    pub fn key(&mut self, key: Key) {
        if key == Key::Interrupt {
            self.quit = true;
            return;
        }
        match &self.mode {
            Mode::Help => {
                self.mode = Mode::Normal;
                if key == Key::Char('q') {
                    self.quit = true;
                }
            }
            Mode::Filter { before } => match key {
                Key::Enter => self.mode = Mode::Normal,
                Key::Esc => {
                    self.name_filter = before.clone();
                    self.mode = Mode::Normal;
                    self.rebuild();
                }
                Key::Backspace => {
                    self.name_filter.pop();
                    self.rebuild();
                }
                Key::Char(c) if !c.is_control() => {
                    self.name_filter.push(c);
                    self.rebuild();
                }
                _ => {}
            },
            Mode::Normal => self.normal_key(key),
        }
    }

    fn normal_key(&mut self, key: Key) {
        let page = isize::try_from(self.viewport.saturating_sub(1).max(1)).unwrap_or(1);
        match key {
            Key::Char('q') => self.quit = true,
            Key::Up | Key::Char('k') => self.move_by(-1),
            Key::Down | Key::Char('j') => self.move_by(1),
            Key::PageUp => self.move_by(-page),
            Key::PageDown => self.move_by(page),
            Key::Home | Key::Char('g') => self.select(0),
            Key::End | Key::Char('G') => self.select(self.rows.len().saturating_sub(1)),
            Key::Enter | Key::Char(' ') => self.toggle_fold(),
            Key::Char('+') => self.fold_all(false),
            Key::Char('-') => self.fold_all(true),
            Key::Char('r') => self.sort_by(SortKey::Rate),
            Key::Char('d') => self.sort_by(SortKey::Drops),
            Key::Char('n') => self.sort_by(SortKey::Name),
            Key::Char('s') => self.sort_by(match self.sort {
                SortKey::Name => SortKey::Rate,
                SortKey::Rate => SortKey::Drops,
                SortKey::Drops => SortKey::Name,
            }),
            Key::Char('/') => {
                self.mode = Mode::Filter {
                    before: self.name_filter.clone(),
                }
            }
            Key::Char('f') => {
                self.state_filter = StateFilter::cycle(self.state_filter);
                self.rebuild();
            }
            Key::Char('c') => {
                self.name_filter.clear();
                self.state_filter = None;
                self.rebuild();
            }
            Key::Char('?') | Key::Char('h') => self.mode = Mode::Help,
            _ => {}
        }
    }

    /// Sort by `key`; the key already in force reverses the order. The
    /// selection goes to the first row: what a new order is asked for.
    fn sort_by(&mut self, key: SortKey) {
        if self.sort == key {
            self.reversed = !self.reversed;
        } else {
            self.sort = key;
            self.reversed = false;
        }
        self.rebuild();
        self.select(0);
    }

    fn toggle_fold(&mut self) {
        let Some((name, _)) = self.selected_key.clone() else {
            return;
        };
        if !self.fold_toggled.remove(&name) {
            self.fold_toggled.insert(name.clone());
        }
        self.selected_key = Some((name, RowKind::Flow));
        self.rebuild();
    }

    fn fold_all(&mut self, folded: bool) {
        self.fold_default = folded;
        self.fold_toggled.clear();
        if let Some((_, kind)) = &mut self.selected_key {
            *kind = RowKind::Flow;
        }
        self.rebuild();
    }

    pub fn is_folded(&self, flow: &str) -> bool {
        self.fold_default != self.fold_toggled.contains(flow)
    }

    fn move_by(&mut self, delta: isize) {
        self.select(self.selected.saturating_add_signed(delta));
    }

    fn select(&mut self, row: usize) {
        if self.rows.is_empty() {
            self.selected = 0;
            self.selected_key = None;
            self.offset = 0;
            return;
        }
        self.selected = row.min(self.rows.len() - 1);
        let r = self.rows[self.selected];
        self.selected_key = self
            .snapshot
            .as_ref()
            .and_then(|s| s.flows.get(r.flow))
            .map(|f| (f.name.clone(), r.kind));
        self.scroll_to_selection();
    }

    fn scroll_to_selection(&mut self) {
        if self.selected < self.offset {
            self.offset = self.selected;
        } else if self.selected >= self.offset + self.viewport {
            self.offset = self.selected + 1 - self.viewport;
        }
        // No empty space below the last row while rows are hidden above.
        self.offset = self
            .offset
            .min(self.rows.len().saturating_sub(self.viewport));
    }

    /// The rows again, after a new snapshot, sort, filter or fold.
    fn rebuild(&mut self) {
        self.rows.clear();
        self.shown_flows = 0;
        let Some(s) = &self.snapshot else {
            return;
        };
        let order = Selection {
            name: Some(NamePattern::search(&self.name_filter)),
            state: self.state_filter,
            sort: Some(self.sort),
            reversed: self.reversed,
            limit: None,
        }
        .order(s, self.rates.as_ref());
        self.shown_flows = order.len();
        for i in order {
            let flow = &s.flows[i];
            self.rows.push(Row {
                flow: i,
                kind: RowKind::Flow,
                last_child: false,
            });
            if self.is_folded(&flow.name) {
                continue;
            }
            // Legs, SRT inputs, then each output with its SRT callers.
            let children = (0..leg_count(flow))
                .map(RowKind::Leg)
                .chain((0..flow.srt_inputs.len()).map(RowKind::SrtInput))
                .chain(flow.outputs.iter().enumerate().flat_map(|(o, out)| {
                    let callers = out.srt.as_ref().map_or(0, |r| r.callers.len());
                    std::iter::once(RowKind::Output(o))
                        .chain((0..callers).map(move |c| RowKind::SrtCaller(o, c)))
                }));
            let first = self.rows.len();
            self.rows.extend(children.map(|kind| Row {
                flow: i,
                kind,
                last_child: false,
            }));
            if self.rows.len() > first {
                if let Some(last) = self.rows.last_mut() {
                    last.last_child = true;
                }
            }
        }
        // Back to the selected row, or its flow, or the same position.
        let found = self.selected_key.as_ref().and_then(|(name, kind)| {
            let at = |k: RowKind| {
                self.rows
                    .iter()
                    .position(|r| r.kind == k && s.flows[r.flow].name == *name)
            };
            at(*kind).or_else(|| at(RowKind::Flow))
        });
        self.select(found.unwrap_or(self.selected));
    }

    pub fn snapshot(&self) -> Option<&Snapshot> {
        self.snapshot.as_ref()
    }

    /// Whether rates are known (from the second snapshot on).
    pub fn has_rates(&self) -> bool {
        self.rates.is_some()
    }

    pub fn flow_rates(&self, name: &str) -> Option<&FlowRates> {
        let i = *self.rate_index.get(name)?;
        self.rates.as_ref()?.flows.get(i)
    }

    /// Datagrams per second forwarded from leg `leg` of flow `name`.
    pub fn leg_rate(&self, name: &str, leg: usize) -> Option<f64> {
        self.leg_rates.get(name)?.get(leg).copied()
    }

    pub fn history(&self, name: &str) -> Option<&History> {
        self.history.get(name)
    }

    pub fn totals(&self) -> TotalRates {
        self.totals
    }

    pub fn rows(&self) -> &[Row] {
        &self.rows
    }

    /// The rows in view, with their indices.
    pub fn visible_rows(&self) -> impl Iterator<Item = (usize, &Row)> {
        self.rows
            .iter()
            .enumerate()
            .skip(self.offset)
            .take(self.viewport)
    }

    pub fn selected(&self) -> usize {
        self.selected
    }

    /// The flow of the selected row.
    pub fn selected_flow(&self) -> Option<&FlowSnapshot> {
        let r = self.rows.get(self.selected)?;
        self.snapshot.as_ref()?.flows.get(r.flow)
    }

    pub fn offset(&self) -> usize {
        self.offset
    }

    pub fn shown_flows(&self) -> usize {
        self.shown_flows
    }

    pub fn sort(&self) -> (SortKey, bool) {
        (self.sort, self.reversed)
    }

    pub fn name_filter(&self) -> &str {
        &self.name_filter
    }

    pub fn state_filter(&self) -> Option<StateFilter> {
        self.state_filter
    }

    pub fn mode(&self) -> &Mode {
        &self.mode
    }

    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    pub fn quit(&self) -> bool {
        self.quit
    }
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! Snapshots for the model's and the view's tests, built from JSON as
    //! the daemon sends them (fields added later with defaults need no
    //! change here).
    use mcrelay_control::{FlowSnapshot, Snapshot};
    use serde_json::json;

    pub fn flow(name: &str, packets: u64, outputs: usize) -> FlowSnapshot {
        let outputs: Vec<_> = (0..outputs)
            .map(|i| {
                json!({
                    "label": format!("239.2.2.{i}:6000"),
                    "packets_out": packets, "bytes_out": packets * 1000,
                    "drops_backlog": 0, "drops_send_error": 0, "last_error": null,
                    "in_flight_high_water": 1,
                })
            })
            .collect();
        serde_json::from_value(json!({
            "name": name, "worker": 0, "input": format!("239.1.1.1:5000 on in-{name}"),
            "packets_in": packets, "bytes_in": packets * 1000,
            "drops": { "oversize": 0, "pool_exhausted": 0, "kernel": 0 },
            "receive_errors": 0, "outputs": outputs,
        }))
        .expect("a flow snapshot")
    }

    /// `flow` with a leg per `(input, forwarded)`, in `mode` ("merge" or
    /// "failover", the second leg active).
    pub fn with_legs(mut flow: FlowSnapshot, mode: &str, legs: &[(&str, u64)]) -> FlowSnapshot {
        let legs: Vec<_> = legs
            .iter()
            .map(|(input, forwarded)| {
                json!({ "input": input, "forwarded": forwarded, "standby": 0,
                        "kernel_drops": 0, "health": { "payload": "rtp", "silent": false,
                        "silence_ms": 1000, "max_gap_ns": 0, "rtp": null, "ts": null } })
            })
            .collect();
        flow.redundancy = serde_json::from_value(json!({
            "mode": mode, "recovered": 25, "duplicates": 475, "lost": 2, "resets": 0,
            "switches": 3, "active_input": 1, "late": 0, "not_rtp": 0, "legs": legs,
        }))
        .expect("a redundancy snapshot");
        flow
    }

    /// A daemon with `flows`, read at `at_ms`.
    pub fn snapshot(at_ms: u64, flows: Vec<FlowSnapshot>) -> Snapshot {
        let pools: Vec<_> = [("small", 1500), ("standard", 4096), ("jumbo", 9000)]
            .iter()
            .map(|(class, bytes)| {
                json!({
                    "class": class, "buffer_bytes": bytes, "capacity": 1024, "in_use": 3,
                    "high_water": 17, "taken": 5000,
                    "exhausted": if *class == "jumbo" { 9 } else { 0 },
                })
            })
            .collect();
        let mut s: Snapshot = serde_json::from_value(json!({
            "version": "0.1.0", "pid": 4242, "uptime_seconds": 3723.0,
            "taken_at_unix_ms": at_ms, "state": { "state": "running" },
            "config_path": "/etc/mcrelay/mcrelay.toml",
            "workers": [{
                "index": 0, "cpu": 2, "receive_mode": "io_uring multishot",
                "loop_turns": 1000, "completions": 2500, "sends_submitted": 1800,
                "pools": pools,
            }],
            "flows": [],
        }))
        .expect("a snapshot");
        s.flows = flows;
        s
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{flow, snapshot};
    use super::*;
    use mcrelay_control::FlowState;

    /// A model that has seen two snapshots a second apart: flow `f<i>`
    /// received `rates[i]` packets per second.
    fn model_with(rates: &[(&str, u64)], outputs: usize) -> Model {
        let mut m = Model::new(Duration::from_secs(1));
        let flows = |k: u64| {
            rates
                .iter()
                .map(|(name, r)| flow(name, k * r, outputs))
                .collect()
        };
        m.update(snapshot(1000, flows(1)));
        m.update(snapshot(2000, flows(2)));
        m.set_viewport(100);
        m
    }

    fn flow_order(m: &Model) -> Vec<String> {
        let s = m.snapshot().unwrap();
        m.rows()
            .iter()
            .filter(|r| r.kind == RowKind::Flow)
            .map(|r| s.flows[r.flow].name.clone())
            .collect()
    }

    /// Each row's flow, kind and whether it is its flow's last child.
    fn row_kinds(m: &Model) -> Vec<(usize, RowKind, bool)> {
        m.rows()
            .iter()
            .map(|r| (r.flow, r.kind, r.last_child))
            .collect()
    }

    fn keys(m: &mut Model, keys: &[Key]) {
        for k in keys {
            m.key(*k);
        }
    }

    fn typed(m: &mut Model, text: &str) {
        for c in text.chars() {
            m.key(Key::Char(c));
        }
    }

    #[test]
    fn globs_and_substrings() {
        assert!(name_matches("", "anything"));
        assert!(
            name_matches("cam", "studio-cam-12"),
            "no wildcard: substring"
        );
        assert!(!name_matches("cam", "studio"));
        assert!(name_matches("cam-*", "cam-12"));
        assert!(
            !name_matches("cam-*", "studio-cam-12"),
            "a glob is anchored"
        );
        assert!(name_matches("*cam-1?", "studio-cam-12"));
        assert!(!name_matches("*cam-1?", "studio-cam-123"));
        assert!(name_matches("a*b*c", "aXXbYYbZc"));
        assert!(!name_matches("a*b*c", "aXXbYYbZ"));
        assert!(name_matches("*", ""));
        assert!(name_matches("ü?*", "üx"));
    }

    #[test]
    fn sorts_by_name_rate_and_drops_and_reverses() {
        let mut m = model_with(&[("b", 10), ("a", 5), ("c", 20)], 0);
        assert_eq!(flow_order(&m), ["a", "b", "c"], "name, the default");
        m.key(Key::Char('r'));
        assert_eq!(flow_order(&m), ["c", "b", "a"], "highest rate first");
        m.key(Key::Char('r'));
        assert_eq!(flow_order(&m), ["a", "b", "c"], "the same key reverses");
        m.key(Key::Char('n'));
        m.key(Key::Char('n'));
        assert_eq!(flow_order(&m), ["c", "b", "a"]);

        // Drops: by rate, then total; ties by name.
        let mut m = Model::new(Duration::from_secs(1));
        let mut flows = vec![flow("quiet", 0, 1), flow("old", 0, 1), flow("now", 0, 1)];
        flows[1].drops.kernel = 50;
        m.update(snapshot(1000, flows.clone()));
        flows[2].outputs[0].drops_backlog = 7;
        m.update(snapshot(2000, flows));
        m.key(Key::Char('d'));
        assert_eq!(flow_order(&m), ["now", "old", "quiet"]);
        assert_eq!(m.sort(), (SortKey::Drops, false));
    }

    #[test]
    fn filters_by_name_as_typed_and_by_state() {
        let mut m = model_with(&[("cam-1", 1), ("cam-2", 1), ("feed", 1)], 1);
        m.key(Key::Char('/'));
        typed(&mut m, "cam");
        assert_eq!(flow_order(&m), ["cam-1", "cam-2"], "applied while typing");
        m.key(Key::Backspace);
        typed(&mut m, "m-2");
        m.key(Key::Enter);
        assert_eq!(flow_order(&m), ["cam-2"]);
        assert_eq!(m.shown_flows(), 1);
        assert_eq!(*m.mode(), Mode::Normal);
        // Esc while typing restores the filter in force before.
        m.key(Key::Char('/'));
        typed(&mut m, "zzz");
        assert!(flow_order(&m).is_empty());
        m.key(Key::Esc);
        assert_eq!(m.name_filter(), "cam-2");
        assert_eq!(flow_order(&m), ["cam-2"]);
        m.key(Key::Char('c'));
        assert_eq!(flow_order(&m).len(), 3, "c clears the filters");

        let mut flows = vec![flow("up", 1, 0), flow("down", 1, 0), flow("gone", 1, 0)];
        flows[1].state = FlowState::InterfaceDown {
            interface: "vRA".into(),
        };
        flows[2].state = FlowState::WaitingForInterface {
            interface: "vX".into(),
        };
        m.update(snapshot(3000, flows));
        let mut seen = Vec::new();
        for _ in 0..6 {
            m.key(Key::Char('f'));
            seen.push((StateFilter::label_of(m.state_filter()), flow_order(&m)));
        }
        assert_eq!(
            seen,
            [
                ("running", vec!["up".to_string()]),
                ("not_running", vec!["down".into(), "gone".into()]),
                ("interface_down", vec!["down".into()]),
                ("waiting_for_interface", vec!["gone".into()]),
                ("open_failed", vec![]),
                ("all", vec!["down".into(), "gone".into(), "up".into()]),
            ]
        );
    }

    #[test]
    fn outputs_fold_under_their_flow() {
        let mut m = model_with(&[("a", 1), ("b", 1)], 2);
        assert_eq!(
            row_kinds(&m),
            [
                (0, RowKind::Flow, false),
                (0, RowKind::Output(0), false),
                (0, RowKind::Output(1), true),
                (1, RowKind::Flow, false),
                (1, RowKind::Output(0), false),
                (1, RowKind::Output(1), true),
            ]
        );
        // Enter on an output folds its flow and selects the flow's row.
        keys(&mut m, &[Key::Down, Key::Down, Key::Enter]);
        assert_eq!(m.rows().len(), 4);
        assert_eq!(m.selected(), 0);
        assert!(m.is_folded("a") && !m.is_folded("b"));
        m.key(Key::Char(' '));
        assert_eq!(m.rows().len(), 6, "space unfolds again");
        m.key(Key::Char('-'));
        assert_eq!(m.rows().len(), 2, "- folds every flow");
        m.key(Key::Down);
        m.key(Key::Enter);
        assert_eq!(m.rows().len(), 4, "b unfolded alone");
        assert!(m.is_folded("a"));
        m.key(Key::Char('+'));
        assert_eq!(m.rows().len(), 6);
    }

    #[test]
    fn legs_fold_under_their_flow_above_its_outputs_with_their_rates() {
        use super::fixtures::with_legs;
        let mut m = Model::new(Duration::from_secs(1));
        let flows = |k: u64| {
            vec![
                with_legs(flow("r", 10 * k, 1), "merge", &[("A", 9 * k), ("B", k)]),
                flow("s", k, 1),
            ]
        };
        m.update(snapshot(1000, flows(1)));
        assert_eq!(m.leg_rate("r", 0), None, "no rates from one snapshot");
        m.update(snapshot(2000, flows(2)));
        m.set_viewport(10);
        assert_eq!(
            row_kinds(&m),
            [
                (0, RowKind::Flow, false),
                (0, RowKind::Leg(0), false),
                (0, RowKind::Leg(1), false),
                (0, RowKind::Output(0), true),
                (1, RowKind::Flow, false),
                (1, RowKind::Output(0), true),
            ]
        );
        assert_eq!(m.leg_rate("r", 0), Some(9.0));
        assert_eq!(m.leg_rate("r", 1), Some(1.0));
        assert_eq!(m.leg_rate("s", 0), None);
        // Selected on a leg, a refresh keeps it there; folding hides legs too.
        keys(&mut m, &[Key::Down, Key::Down]);
        assert_eq!(m.rows()[m.selected()].kind, RowKind::Leg(1));
        m.update(snapshot(3000, flows(3)));
        assert_eq!(m.rows()[m.selected()].kind, RowKind::Leg(1));
        m.key(Key::Enter);
        assert_eq!(m.rows().len(), 3);
    }

    #[test]
    fn selection_follows_its_flow_when_rates_reorder_the_rows() {
        let mut m = model_with(&[("a", 1), ("b", 5), ("c", 3)], 1);
        // Sorting selects the first row; then select c's output.
        keys(&mut m, &[Key::End, Key::Char('r')]);
        assert_eq!(m.selected(), 0);
        keys(&mut m, &[Key::Down, Key::Down, Key::Down]);
        assert_eq!(m.selected_flow().unwrap().name, "c");
        assert_eq!(m.rows()[m.selected()].kind, RowKind::Output(0));
        // c becomes the fastest: its output is now the second row.
        m.update(snapshot(
            3000,
            vec![flow("a", 3, 1), flow("b", 15, 1), flow("c", 106, 1)],
        ));
        assert_eq!(flow_order(&m), ["c", "b", "a"]);
        assert_eq!(m.selected(), 1);
        assert_eq!(m.selected_flow().unwrap().name, "c");
        // Filtered out: the selection stays in range.
        m.key(Key::Char('/'));
        typed(&mut m, "a");
        assert_eq!(m.rows().len(), 2);
        assert_eq!(m.selected(), 1, "the same position, clamped");
        assert_eq!(m.selected_flow().unwrap().name, "a");
        typed(&mut m, "nothing");
        assert!(m.selected_flow().is_none());
        assert_eq!(m.visible_rows().count(), 0);
    }

    #[test]
    fn scrolls_a_thousand_flows() {
        let names: Vec<String> = (0..1000).map(|i| format!("flow-{i:04}")).collect();
        let rates: Vec<(&str, u64)> = names.iter().map(|n| (n.as_str(), 1)).collect();
        let mut m = model_with(&rates, 2);
        m.set_viewport(20);
        assert_eq!(m.rows().len(), 3000);
        assert_eq!(m.offset(), 0);
        m.key(Key::End);
        assert_eq!(m.selected(), 2999);
        assert_eq!(m.offset(), 2980, "the last row at the bottom of the view");
        assert_eq!(m.selected_flow().unwrap().name, "flow-0999");
        m.key(Key::PageUp);
        assert_eq!(m.selected(), 2980);
        assert_eq!(m.offset(), 2980);
        m.key(Key::Up);
        assert_eq!(m.offset(), 2979, "scrolls one row at the top edge");
        m.key(Key::Home);
        assert_eq!((m.selected(), m.offset()), (0, 0));
        m.key(Key::PageDown);
        assert_eq!(m.selected(), 19);
        assert_eq!(m.offset(), 0);
        m.key(Key::PageDown);
        assert_eq!(m.selected(), 38);
        assert_eq!(m.offset(), 19);
        let shown: Vec<usize> = m.visible_rows().map(|(i, _)| i).collect();
        assert_eq!(shown, (19..39).collect::<Vec<_>>());
        // A taller terminal never leaves blank rows under the last one.
        m.key(Key::End);
        m.set_viewport(50);
        assert_eq!(m.offset(), 2950);
        // Folding every flow: 1000 rows, the selection on its flow.
        m.key(Key::Char('-'));
        assert_eq!(m.rows().len(), 1000);
        assert_eq!(m.selected(), 999);
        assert_eq!(m.offset(), 950);
    }

    #[test]
    fn history_is_per_flow_bounded_and_forgets_removed_flows() {
        let mut m = Model::new(Duration::from_secs(1));
        for k in 0..200u64 {
            m.update(snapshot(
                1000 * k,
                vec![flow("a", 10 * k, 0), flow("b", k * k, 0)],
            ));
        }
        let a: Vec<u64> = m.history("a").unwrap().latest(usize::MAX).collect();
        assert_eq!(a.len(), super::super::history::HISTORY);
        assert!(a.iter().all(|&v| v == 10));
        let b: Vec<u64> = m.history("b").unwrap().latest(3).collect();
        assert_eq!(b, [2 * 196 + 1, 2 * 197 + 1, 2 * 198 + 1]);
        assert!(m.has_rates());
        assert_eq!(m.totals().packets_in, 10.0 + 397.0);
        m.update(snapshot(200_000, vec![flow("a", 2000, 0)]));
        assert!(m.history("b").is_none());
    }

    #[test]
    fn keys_for_help_errors_and_quitting() {
        let mut m = model_with(&[("a", 1)], 0);
        m.key(Key::Char('?'));
        assert_eq!(*m.mode(), Mode::Help);
        m.key(Key::Char('x'));
        assert_eq!(*m.mode(), Mode::Normal, "any key closes the help");
        assert!(!m.quit());
        m.key(Key::Esc);
        assert!(!m.quit(), "Esc alone does not quit");
        m.set_error("connecting: refused".into());
        assert_eq!(m.error(), Some("connecting: refused"));
        m.update(snapshot(5000, vec![flow("a", 9, 0)]));
        assert_eq!(m.error(), None, "a snapshot clears the error");
        m.key(Key::Char('/'));
        m.key(Key::Char('q'));
        assert!(!m.quit(), "q is a letter while typing the filter");
        m.key(Key::Interrupt);
        assert!(m.quit(), "Ctrl-C quits from any mode");
        let mut m = model_with(&[("a", 1)], 0);
        m.key(Key::Char('q'));
        assert!(m.quit());
    }
}
