//! Finding one flow among a thousand: which flows a view shows (a name
//! glob, a state) and in which order (configuration order, by rate, by
//! drops), applied to a [`Snapshot`] before it is rendered. Used by
//! `flows` and `stats`; meant for `top` too.

use std::cmp::Ordering;

use mcrelay_control::{FlowSnapshot, FlowState, OutputSnapshot, Rates, Snapshot};

/// The order of the flows shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Sort {
    /// Configuration order.
    #[default]
    Name,
    /// Input packets per second, highest first (needs a rate sample).
    Rate,
    /// Drops, most first: per second when a rate sample was taken, else
    /// since start (ingress drops of every reason plus every output's).
    Drops,
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
    fn matches(self, state: &FlowState) -> bool {
        match self {
            StateFilter::Running => state.is_running(),
            StateFilter::NotRunning => !state.is_running(),
            StateFilter::InterfaceDown => matches!(state, FlowState::InterfaceDown { .. }),
            StateFilter::Waiting => matches!(state, FlowState::WaitingForInterface { .. }),
            StateFilter::OpenFailed => matches!(state, FlowState::OpenFailed { .. }),
        }
    }
}

/// Which flows to show, and in which order (`mcrelayctl flows|stats`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Selection {
    /// Only flows whose name matches this glob (`*` any run of
    /// characters, `?` one character; e.g. 'cam-*').
    #[arg(long, value_name = "GLOB")]
    pub name: Option<String>,
    /// Only flows in this state.
    #[arg(long, value_enum)]
    pub state: Option<StateFilter>,
    /// Order of the flows.
    #[arg(long, value_enum, default_value_t = Sort::Name)]
    pub sort: Sort,
    /// At most this many flows (after sorting: `--sort drops --limit 10`
    /// shows the ten worst).
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
}

impl Selection {
    /// Whether this selection needs rates (two samples).
    pub fn needs_rates(&self) -> bool {
        self.sort == Sort::Rate
    }

    /// Keep the selected flows of `s`, in the selected order.
    pub fn apply(&self, s: &mut Snapshot, rates: Option<&Rates>) {
        s.flows.retain(|f| {
            self.name.as_deref().is_none_or(|g| glob(g, &f.name))
                && self.state.is_none_or(|st| st.matches(&f.state))
        });
        match self.sort {
            Sort::Name => {}
            Sort::Rate => {
                let key = |f: &FlowSnapshot| {
                    rates
                        .and_then(|r| r.flow(&f.name))
                        .map_or(0.0, |r| r.packets_per_second)
                };
                s.flows.sort_by(|a, b| descending(key(a), key(b)));
            }
            Sort::Drops => match rates {
                Some(r) => {
                    let key = |f: &FlowSnapshot| {
                        r.flow(&f.name).map_or(0.0, |fr| {
                            fr.drops_per_second
                                + fr.outputs.iter().map(|o| o.drops_per_second).sum::<f64>()
                        })
                    };
                    s.flows.sort_by(|a, b| {
                        descending(key(a), key(b)).then_with(|| total_drops(b).cmp(&total_drops(a)))
                    });
                }
                None => s.flows.sort_by_key(|f| std::cmp::Reverse(total_drops(f))),
            },
        }
        if let Some(n) = self.limit {
            s.flows.truncate(n);
        }
    }
}

/// Highest first; NaN (never produced by `Rates`) sorts as equal.
fn descending(a: f64, b: f64) -> Ordering {
    b.partial_cmp(&a).unwrap_or(Ordering::Equal)
}

/// Every drop a flow counted since start: ingress, all reasons, and each
/// output's.
pub fn total_drops(f: &FlowSnapshot) -> u64 {
    f.outputs
        .iter()
        .map(OutputSnapshot::drops)
        .fold(f.drops.total(), u64::saturating_add)
}

/// Shell-style glob: `*` matches any run of characters (also none), `?`
/// exactly one; everything else itself. Linear in practice: the classic
/// backtrack to the last `*` only.
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
            Some(&c) if c == '?' || c == n[ni] => {
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
    p[pi..].iter().all(|&c| c == '*')
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
        }
    }

    fn snapshot() -> Snapshot {
        let down = || FlowState::InterfaceDown {
            interface: "eth1".into(),
        };
        Snapshot {
            version: "0".into(),
            mode: mcrelay_control::Mode::default(),
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
            name: Some("cam-*".into()),
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
            sort: Sort::Drops,
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
            sort: Sort::Rate,
            ..Selection::default()
        }
        .apply(&mut s, Some(&rates));
        assert_eq!(names(&s), ["news-1", "cam-3", "cam-1", "cam-2"]);

        let mut s = snapshot();
        Selection {
            sort: Sort::Drops,
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
                sort: Sort::Rate,
                ..Selection::default()
            }
            .needs_rates()
        );
    }
}
