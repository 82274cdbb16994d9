//! Finding one flow among a thousand, for every view of `mcrelayctl`:
//! which flows are shown (a name pattern, a state) and in which order
//! (configuration order, by name, by rate, by drops), at most how many.
//! `flows` and `stats` apply a [`Selection`] to the snapshot before it is
//! rendered ([`Selection::apply`]); `top` asks it for the order of its rows
//! ([`Selection::order`]) every time a snapshot, a key or a filter changes
//! it. One definition of each filter and key serves all three.

use std::cmp::Ordering;
use std::collections::HashMap;

use mcrelay_control::{FlowRates, FlowSnapshot, FlowState, OutputSnapshot, Rates, Snapshot};

/// What the flows are ordered by; ties go by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Sort {
    /// By name.
    Name,
    /// Input packets per second, highest first (needs a rate sample).
    Rate,
    /// Drops, most first: per second when a rate sample was taken (ingress
    /// and every output), then since start (ingress drops of every reason,
    /// receive errors and every output's drops).
    Drops,
}

impl Sort {
    /// Its name, as `--sort` spells it.
    pub fn label(self) -> &'static str {
        match self {
            Sort::Name => "name",
            Sort::Rate => "rate",
            Sort::Drops => "drops",
        }
    }
}

/// A flow state to show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StateFilter {
    /// Relaying.
    Running,
    /// Not relaying, for any reason.
    NotRunning,
    /// Paused: an interface is down.
    InterfaceDown,
    /// Waiting for an interface to appear.
    Waiting,
    /// Its sockets could not be opened; retried.
    OpenFailed,
}

impl StateFilter {
    /// Whether a flow in `state` is shown.
    pub fn matches(self, state: &FlowState) -> bool {
        match self {
            StateFilter::Running => state.is_running(),
            StateFilter::NotRunning => !state.is_running(),
            StateFilter::InterfaceDown => matches!(state, FlowState::InterfaceDown { .. }),
            StateFilter::Waiting => matches!(state, FlowState::WaitingForInterface { .. }),
            StateFilter::OpenFailed => matches!(state, FlowState::OpenFailed { .. }),
        }
    }

    /// The state's tag as `FlowState::tag` spells it (`not_running` for
    /// the one that isn't a single state).
    pub fn label(self) -> &'static str {
        match self {
            StateFilter::Running => "running",
            StateFilter::NotRunning => "not_running",
            StateFilter::InterfaceDown => "interface_down",
            StateFilter::Waiting => "waiting_for_interface",
            StateFilter::OpenFailed => "open_failed",
        }
    }

    /// [`Self::label`], `all` for no filter.
    pub fn label_of(filter: Option<Self>) -> &'static str {
        filter.map_or("all", Self::label)
    }

    /// The filter after `filter` in the cycle every state, running, not
    /// running, interface down, waiting, open failed, every state again
    /// (`top`'s `f`).
    pub fn cycle(filter: Option<Self>) -> Option<Self> {
        match filter {
            None => Some(StateFilter::Running),
            Some(StateFilter::Running) => Some(StateFilter::NotRunning),
            Some(StateFilter::NotRunning) => Some(StateFilter::InterfaceDown),
            Some(StateFilter::InterfaceDown) => Some(StateFilter::Waiting),
            Some(StateFilter::Waiting) => Some(StateFilter::OpenFailed),
            Some(StateFilter::OpenFailed) => None,
        }
    }
}

/// A pattern flow names are matched against: a glob (`*` any run of
/// characters, `?` exactly one) over the whole name, or, as typed into
/// `top`, a search that matches a substring unless it has a wildcard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamePattern {
    pattern: String,
    /// A pattern without wildcards matches any name containing it.
    substring: bool,
}

impl NamePattern {
    /// Matches the whole name (`--name`).
    pub fn glob(pattern: &str) -> Self {
        Self {
            pattern: pattern.to_owned(),
            substring: false,
        }
    }

    /// A glob if `pattern` has a wildcard, else a substring; the empty
    /// pattern matches every name (`top`'s `/`).
    pub fn search(pattern: &str) -> Self {
        Self {
            pattern: pattern.to_owned(),
            substring: !pattern.contains(['*', '?']),
        }
    }

    pub fn matches(&self, name: &str) -> bool {
        if self.substring {
            name.contains(self.pattern.as_str())
        } else {
            glob(&self.pattern, name)
        }
    }
}

/// Which flows to show, in which order, at most how many.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    pub name: Option<NamePattern>,
    pub state: Option<StateFilter>,
    /// `None`: configuration order.
    pub sort: Option<Sort>,
    /// The opposite of the key's natural order (name ascending, rate and
    /// drops descending; configuration order backwards).
    pub reversed: bool,
    /// At most this many flows, counted after sorting (`--sort drops
    /// --limit 10` shows the ten worst).
    pub limit: Option<usize>,
}

impl Selection {
    /// Whether this selection needs rates (two samples).
    pub fn needs_rates(&self) -> bool {
        self.sort == Some(Sort::Rate)
    }

    /// Whether the flow passes the name and state filters.
    pub fn admits(&self, f: &FlowSnapshot) -> bool {
        self.name.as_ref().is_none_or(|p| p.matches(&f.name))
            && self.state.is_none_or(|st| st.matches(&f.state))
    }

    /// The indices into `s.flows` of the selected flows, in the selected
    /// order. Each flow's sort key is computed once (its rates found
    /// through one map), so a thousand flows sort in well under a
    /// millisecond.
    pub fn order(&self, s: &Snapshot, rates: Option<&Rates>) -> Vec<usize> {
        let by_name: HashMap<&str, &FlowRates> = rates
            .map(|r| r.flows.iter().map(|f| (f.name.as_str(), f)).collect())
            .unwrap_or_default();
        let key = |f: &FlowSnapshot| -> (f64, u64) {
            let r = by_name.get(f.name.as_str());
            match self.sort {
                None | Some(Sort::Name) => (0.0, 0),
                Some(Sort::Rate) => (r.map_or(0.0, |r| r.packets_per_second), 0),
                Some(Sort::Drops) => (r.map_or(0.0, |r| drop_rate(r)), drops_total(f)),
            }
        };
        let mut keyed: Vec<(usize, f64, u64)> = s
            .flows
            .iter()
            .enumerate()
            .filter(|(_, f)| self.admits(f))
            .map(|(i, f)| {
                let (k, total) = key(f);
                (i, k, total)
            })
            .collect();
        if let Some(sort) = self.sort {
            let name = |i: usize| s.flows.get(i).map_or("", |f| f.name.as_str());
            keyed.sort_by(|a, b| {
                let by_key = match sort {
                    Sort::Name => Ordering::Equal,
                    Sort::Rate => b.1.total_cmp(&a.1),
                    Sort::Drops => b.1.total_cmp(&a.1).then_with(|| b.2.cmp(&a.2)),
                };
                by_key.then_with(|| name(a.0).cmp(name(b.0)))
            });
        }
        if self.reversed {
            keyed.reverse();
        }
        if let Some(n) = self.limit {
            keyed.truncate(n);
        }
        keyed.into_iter().map(|(i, _, _)| i).collect()
    }

    /// Keep the selected flows of `s`, in the selected order.
    pub fn apply(&self, s: &mut Snapshot, rates: Option<&Rates>) {
        let order = self.order(s, rates);
        let mut flows: Vec<Option<FlowSnapshot>> =
            std::mem::take(&mut s.flows).into_iter().map(Some).collect();
        s.flows = order
            .into_iter()
            .filter_map(|i| flows.get_mut(i).and_then(Option::take))
            .collect();
    }
}

/// `mcrelayctl flows|stats`' options for a [`Selection`].
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SelectArgs {
    /// Only flows whose name matches this glob (`*` any run of
    /// characters, `?` one character; e.g. 'cam-*').
    #[arg(long, value_name = "GLOB")]
    pub name: Option<String>,
    /// Only flows in this state.
    #[arg(long, value_enum)]
    pub state: Option<StateFilter>,
    /// Order of the flows (default: configuration order).
    #[arg(long, value_enum)]
    pub sort: Option<Sort>,
    /// At most this many flows (after sorting: `--sort drops --limit 10`
    /// shows the ten worst).
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
}

impl SelectArgs {
    pub fn selection(&self) -> Selection {
        Selection {
            name: self.name.as_deref().map(NamePattern::glob),
            state: self.state,
            sort: self.sort,
            reversed: false,
            limit: self.limit,
        }
    }
}

/// Drops per second of a flow: ingress (every reason) and every output's.
fn drop_rate(r: &FlowRates) -> f64 {
    r.drops_per_second + r.outputs.iter().map(|o| o.drops_per_second).sum::<f64>()
}

/// Drops of a flow in total: ingress (every reason), receive errors and
/// every output's.
pub fn drops_total(flow: &FlowSnapshot) -> u64 {
    flow.outputs.iter().map(OutputSnapshot::drops).fold(
        flow.drops.total().saturating_add(flow.receive_errors),
        u64::saturating_add,
    )
}

/// Shell-style glob: `*` matches any run of characters (also none), `?`
/// exactly one; everything else itself. Greedy with one backtrack point
/// (the latest `*`): linear in practice, O(pattern × name) at worst.
pub fn glob(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ni));
                pi += 1;
            }
            Some(&c) if c == '?' || Some(&c) == n.get(ni) => {
                pi += 1;
                ni += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    pi = sp + 1;
                    ni = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    p.get(pi..).unwrap_or_default().iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcrelay_control::{DaemonState, FlowRates, IngressDropsSnapshot, InputHealth};

    #[test]
    fn globs() {
        for (p, n, want) in [
            ("cam-*", "cam-1", true),
            ("cam-*", "cam-", true),
            ("cam-*", "xcam-1", false),
            ("*-hd", "news-hd", true),
            ("*-hd", "news-sd", false),
            ("f0?", "f01", true),
            ("f0?", "f0", false),
            ("f0?", "f012", false),
            ("*a*b*c", "xxaybzzc", true),
            ("*a*b*c", "xxaybzz", false),
            ("", "", true),
            ("", "x", false),
            ("*", "", true),
            ("exact", "exact", true),
            ("ümlaut?", "ümlautß", true),
        ] {
            assert_eq!(glob(p, n), want, "{p:?} vs {n:?}");
        }
    }

    fn flow(name: &str, state: FlowState, drops_out: u64) -> FlowSnapshot {
        let output = OutputSnapshot {
            label: "o".into(),
            packets_out: 0,
            bytes_out: 0,
            drops_backlog: drops_out,
            drops_send_error: 0,
            last_error: None,
            in_flight_high_water: 0,
            gso_sends: 0,
            gso_fallbacks: 0,
            not_connected: None,
            connect_failures: 0,
            srt: None,
        };
        FlowSnapshot {
            name: name.into(),
            worker: 0,
            workers: Vec::new(),
            input: "239.1.1.1:5000 on eth0".into(),
            packets_in: 0,
            bytes_in: 0,
            drops: IngressDropsSnapshot::default(),
            receive_errors: 0,
            receive_rearms: 0,
            pool_fallbacks: 0,
            outputs: vec![output],
            state,
            interface_pauses: 0,
            health: InputHealth::default(),
            redundancy: None,
            standby_discarded: 0,
            fec: None,
            rist: None,
        }
    }

    fn snapshot() -> Snapshot {
        let down = || FlowState::InterfaceDown {
            interface: "eth1".into(),
        };
        Snapshot {
            version: "0".into(),
            mode: mcrelay_control::Mode::default(),
            metrics_endpoint: None,
            pid: 1,
            uptime_seconds: 1.0,
            taken_at_unix_ms: 0,
            state: DaemonState::Running,
            config_path: "t.toml".into(),
            workers: Vec::new(),
            flows: vec![
                flow("cam-1", FlowState::Running, 5),
                flow("cam-2", down(), 0),
                flow("news-1", FlowState::Running, 40),
                flow("cam-3", FlowState::Running, 7),
            ],
        }
    }

    fn names(s: &Snapshot) -> Vec<&str> {
        s.flows.iter().map(|f| f.name.as_str()).collect()
    }

    #[test]
    fn filters_by_glob_and_state_keeping_config_order() {
        let mut s = snapshot();
        Selection {
            name: Some(NamePattern::glob("cam-*")),
            state: Some(StateFilter::Running),
            ..Selection::default()
        }
        .apply(&mut s, None);
        assert_eq!(names(&s), ["cam-1", "cam-3"]);

        let mut s = snapshot();
        Selection {
            state: Some(StateFilter::NotRunning),
            ..Selection::default()
        }
        .apply(&mut s, None);
        assert_eq!(names(&s), ["cam-2"]);
    }

    #[test]
    fn sorts_by_drops_and_by_rate_and_limits() {
        let mut s = snapshot();
        Selection {
            sort: Some(Sort::Drops),
            limit: Some(2),
            ..Selection::default()
        }
        .apply(&mut s, None);
        assert_eq!(names(&s), ["news-1", "cam-3"], "the two worst since start");

        let rate = |name: &str, pps: f64, dps: f64| FlowRates {
            name: name.into(),
            packets_per_second: pps,
            drops_per_second: dps,
            ..FlowRates::default()
        };
        let rates = Rates {
            elapsed_seconds: 1.0,
            flows: vec![
                rate("cam-1", 10.0, 3.0),
                rate("cam-2", 0.0, 0.0),
                rate("news-1", 500.0, 0.0),
                rate("cam-3", 90.0, 0.0),
            ],
        };
        let mut s = snapshot();
        Selection {
            sort: Some(Sort::Rate),
            ..Selection::default()
        }
        .apply(&mut s, Some(&rates));
        assert_eq!(names(&s), ["news-1", "cam-3", "cam-1", "cam-2"]);

        let mut s = snapshot();
        Selection {
            sort: Some(Sort::Drops),
            ..Selection::default()
        }
        .apply(&mut s, Some(&rates));
        assert_eq!(
            names(&s),
            ["cam-1", "news-1", "cam-3", "cam-2"],
            "dropping now first, then by drops since start"
        );
        assert!(
            Selection {
                sort: Some(Sort::Rate),
                ..Selection::default()
            }
            .needs_rates()
        );
    }

    #[test]
    fn a_search_is_a_substring_unless_it_has_a_wildcard_and_a_glob_is_anchored() {
        assert!(NamePattern::search("").matches("anything"));
        assert!(NamePattern::search("cam").matches("studio-cam-12"));
        assert!(!NamePattern::glob("cam").matches("studio-cam-12"));
        assert!(NamePattern::glob("cam").matches("cam"));
        assert!(!NamePattern::search("cam-*").matches("studio-cam-12"));
        assert!(NamePattern::search("*cam-1?").matches("studio-cam-12"));
        assert!(!NamePattern::glob("").matches("x"));
    }

    #[test]
    fn name_order_is_alphabetical_reversible_and_the_default_is_configuration_order() {
        let s = snapshot();
        let names_of = |sel: &Selection| -> Vec<&str> {
            sel.order(&s, None)
                .into_iter()
                .map(|i| s.flows[i].name.as_str())
                .collect()
        };
        assert_eq!(
            names_of(&Selection::default()),
            ["cam-1", "cam-2", "news-1", "cam-3"]
        );
        let mut by_name = Selection {
            sort: Some(Sort::Name),
            ..Selection::default()
        };
        assert_eq!(names_of(&by_name), ["cam-1", "cam-2", "cam-3", "news-1"]);
        by_name.reversed = true;
        by_name.limit = Some(3);
        assert_eq!(names_of(&by_name), ["news-1", "cam-3", "cam-2"]);
        // Drops since start count receive errors too; ties go by name.
        let mut s = snapshot();
        s.flows[1].receive_errors = 6;
        let drops = Selection {
            sort: Some(Sort::Drops),
            ..Selection::default()
        };
        let order: Vec<&str> = drops
            .order(&s, None)
            .into_iter()
            .map(|i| s.flows[i].name.as_str())
            .collect();
        assert_eq!(order, ["news-1", "cam-3", "cam-2", "cam-1"]);
    }

    #[test]
    fn cycles_through_every_state_filter() {
        let mut f = None;
        let mut seen = Vec::new();
        for _ in 0..6 {
            f = StateFilter::cycle(f);
            seen.push(StateFilter::label_of(f));
        }
        assert_eq!(
            seen,
            [
                "running",
                "not_running",
                "interface_down",
                "waiting_for_interface",
                "open_failed",
                "all"
            ]
        );
    }

    #[test]
    fn the_command_line_makes_an_anchored_selection() {
        let args = SelectArgs {
            name: Some("cam-?".into()),
            state: Some(StateFilter::Running),
            sort: Some(Sort::Drops),
            limit: Some(1),
        };
        let mut s = snapshot();
        args.selection().apply(&mut s, None);
        assert_eq!(names(&s), ["cam-3"]);
    }
}
