//! What `status` answers: the daemon's state, counts and totals, and the
//! problem flows by name, in a reply whose size does not grow with the
//! number of flows.
//!
//! A [`Snapshot`] of a thousand flows is 1.4 MB of JSON; `mcrelayctl
//! status` prints about ten lines of it. The daemon builds a [`Summary`]
//! instead ([`Summary::of`]): every flow is counted, by state, into the
//! totals, but at most [`MAX_NAMED`] flows are named in each list (not
//! relaying, silent, stream errors), with a count of the rest, and every
//! text field is cut at [`MAX_TEXT`] characters. The workers (one per core,
//! with their pools) are sent whole.
//!
//! On the wire the client asks for it with an optional field,
//! `{"v":1,"cmd":"status","summary":true}`. A daemon that predates it
//! ignores the field and answers with the whole snapshot, which
//! [`decode_status`] summarises on the client with the same builder; an old
//! client sends no field and still gets the snapshot.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::mode::Mode;
use crate::protocol::ProtocolError;
use crate::snapshot::{DaemonState, FlowState, InputHealth, Snapshot, Totals, WorkerSnapshot};

/// Most flows named in each list of a [`Summary`]; the others are counted
/// in the list's `more`.
pub const MAX_NAMED: usize = 20;

/// Longest text (a flow name, a state's reason, the daemon's degraded
/// reason) carried in a [`Summary`], in characters; longer ones end in
/// `...`.
pub const MAX_TEXT: usize = 256;

/// `status`'s reply: the daemon at one moment, in a bounded size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The daemon's version (`CARGO_PKG_VERSION`).
    pub version: String,
    pub pid: u32,
    /// Seconds since the daemon started.
    pub uptime_seconds: f64,
    /// Wall-clock time the counters were read, in ms since the Unix epoch.
    pub taken_at_unix_ms: u64,
    /// Its reason cut at `4 * MAX_TEXT` characters.
    pub state: DaemonState,
    pub mode: Mode,
    pub config_path: String,
    pub workers: Vec<WorkerSnapshot>,
    /// Sums over every flow and output.
    pub totals: Totals,
    /// Every flow, counted by state.
    pub flow_states: FlowStateCounts,
    /// Flows not relaying, with why, in configuration order.
    pub not_running: Named<NotRunning>,
    /// Relaying flows whose input has been silent for its `silence_ms`.
    pub silent: Named<String>,
    /// Flows whose input counted stream errors, with the nonzero counters.
    pub stream_errors: Named<StreamErrors>,
    /// Times flows stopped because an interface went down or away, in all.
    pub interface_pauses: u64,
    /// Datagrams discarded in standby, in all.
    pub standby_discarded: u64,
}

/// The flows in each [`FlowState`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowStateCounts {
    pub running: usize,
    pub interface_down: usize,
    pub waiting_for_interface: usize,
    pub open_failed: usize,
}

/// The first [`MAX_NAMED`] of a list, in configuration order, and how many
/// more there are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Named<T> {
    pub first: Vec<T>,
    pub more: usize,
}

impl<T> Default for Named<T> {
    fn default() -> Self {
        Self {
            first: Vec::new(),
            more: 0,
        }
    }
}

impl<T> Named<T> {
    fn push(&mut self, item: impl FnOnce() -> T) {
        if self.first.len() < MAX_NAMED {
            self.first.push(item());
        } else {
            self.more += 1;
        }
    }

    /// How many there are in all.
    pub fn len(&self) -> usize {
        self.first.len() + self.more
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A flow that does not relay, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotRunning {
    pub name: String,
    pub state: FlowState,
}

/// A flow whose input counted stream errors: each nonzero counter, e.g.
/// `lost 3`, `cc 6`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamErrors {
    pub name: String,
    pub errors: Vec<String>,
}

impl Summary {
    /// The summary of `s`: one pass over its flows.
    pub fn of(s: &Snapshot) -> Summary {
        let mut flow_states = FlowStateCounts::default();
        let mut not_running = Named::default();
        let mut silent = Named::default();
        let mut stream_errors = Named::default();
        let (mut interface_pauses, mut standby_discarded) = (0u64, 0u64);
        for f in &s.flows {
            match &f.state {
                FlowState::Running => flow_states.running += 1,
                FlowState::InterfaceDown { .. } => flow_states.interface_down += 1,
                FlowState::WaitingForInterface { .. } => flow_states.waiting_for_interface += 1,
                FlowState::OpenFailed { .. } => flow_states.open_failed += 1,
            }
            if !f.state.is_running() {
                not_running.push(|| NotRunning {
                    name: clip(&f.name, MAX_TEXT),
                    state: clip_state(&f.state),
                });
            } else if f.health.silent {
                silent.push(|| clip(&f.name, MAX_TEXT));
            }
            if f.health.errors() > 0 {
                stream_errors.push(|| StreamErrors {
                    name: clip(&f.name, MAX_TEXT),
                    errors: stream_error_counts(&f.health),
                });
            }
            interface_pauses = interface_pauses.saturating_add(f.interface_pauses);
            standby_discarded = standby_discarded.saturating_add(f.standby_discarded);
        }
        Summary {
            version: clip(&s.version, MAX_TEXT),
            pid: s.pid,
            uptime_seconds: s.uptime_seconds,
            taken_at_unix_ms: s.taken_at_unix_ms,
            state: match &s.state {
                DaemonState::Degraded(why) => DaemonState::Degraded(clip(why, 4 * MAX_TEXT)),
                other => other.clone(),
            },
            mode: s.mode,
            config_path: clip(&s.config_path, 4 * MAX_TEXT),
            workers: s.workers.clone(),
            totals: s.totals(),
            flow_states,
            not_running,
            silent,
            stream_errors,
            interface_pauses,
            standby_discarded,
        }
    }
}

/// `status`'s result as either daemon sends it: a [`Summary`], or (a daemon
/// that predates it, which ignores `"summary":true`) a whole [`Snapshot`],
/// summarised here.
pub fn decode_status(result: Value) -> Result<Summary, ProtocolError> {
    if result.get("flows").is_some() {
        let snapshot: Snapshot =
            serde_json::from_value(result).map_err(ProtocolError::UnexpectedResult)?;
        Ok(Summary::of(&snapshot))
    } else {
        serde_json::from_value(result).map_err(ProtocolError::UnexpectedResult)
    }
}

/// The nonzero stream error counters of an input, each as `what count`.
pub(crate) fn stream_error_counts(h: &InputHealth) -> Vec<String> {
    let mut parts = Vec::new();
    if let Some(r) = &h.rtp {
        for (what, n) in [
            ("lost", r.lost),
            ("dup", r.duplicates),
            ("reordered", r.reordered),
            ("ssrc changes", r.ssrc_changes),
            ("not rtp", r.malformed),
        ] {
            if n > 0 {
                parts.push(format!("{what} {}", crate::units::human_count(n)));
            }
        }
    }
    if let Some(t) = &h.ts {
        for (what, n) in [
            ("cc", t.continuity_errors),
            ("sync", t.sync_errors),
            ("tei", t.transport_errors),
        ] {
            if n > 0 {
                parts.push(format!("{what} {}", crate::units::human_count(n)));
            }
        }
    }
    parts
}

/// `state` with its interface or error text cut at [`MAX_TEXT`].
fn clip_state(state: &FlowState) -> FlowState {
    match state {
        FlowState::Running => FlowState::Running,
        FlowState::InterfaceDown { interface } => FlowState::InterfaceDown {
            interface: clip(interface, MAX_TEXT),
        },
        FlowState::WaitingForInterface { interface } => FlowState::WaitingForInterface {
            interface: clip(interface, MAX_TEXT),
        },
        FlowState::OpenFailed { error } => FlowState::OpenFailed {
            error: clip(error, MAX_TEXT),
        },
    }
}

/// `text`, or its first `max` characters and `...`.
fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{bench_snapshot, sample};

    /// `flows` flows, every one of them a problem in every list: not
    /// relaying (with a long error), silent, counting stream errors, with a
    /// long name; and a long degraded reason.
    fn troubled(flows: usize) -> Snapshot {
        let mut s = bench_snapshot(flows);
        for (i, f) in s.flows.iter_mut().enumerate() {
            f.name = format!("{}-{i:06}", "n".repeat(300));
            f.health.silent = true;
            f.interface_pauses = 1;
            f.state = if i % 2 == 0 {
                FlowState::OpenFailed {
                    error: "e".repeat(2000),
                }
            } else {
                FlowState::Running
            };
        }
        s.state = DaemonState::Degraded("why; ".repeat(10_000));
        s
    }

    fn encoded_len(s: &Summary) -> usize {
        crate::Response::ok(s).encode().len()
    }

    #[test]
    fn a_thousand_troubled_flows_make_a_reply_of_bounded_size() {
        let snapshot = troubled(1000);
        let whole = crate::Response::ok(&snapshot).encode().len();
        let summary = Summary::of(&snapshot);
        let bytes = encoded_len(&summary);
        assert!(bytes < 40_000, "{bytes} bytes");
        assert!(whole > 50 * bytes, "snapshot {whole} B, summary {bytes} B");
        // Ten times the flows: the same size but for the digits of the
        // counts.
        let ten_thousand = encoded_len(&Summary::of(&troubled(10_000)));
        assert!(
            ten_thousand.abs_diff(bytes) < 64,
            "{ten_thousand} vs {bytes}"
        );
        // Every flow is counted, MAX_NAMED are named.
        assert_eq!(summary.totals.flows, 1000);
        assert_eq!(
            (summary.flow_states.open_failed, summary.flow_states.running),
            (500, 500)
        );
        assert_eq!(summary.not_running.first.len(), MAX_NAMED);
        assert_eq!(summary.not_running.len(), 500);
        assert_eq!(summary.silent.len(), 500, "silent and relaying");
        assert_eq!(summary.stream_errors.more, 1000 - MAX_NAMED);
        assert_eq!(summary.interface_pauses, 1000);
        assert!(summary.not_running.first[0].name.ends_with("..."));
    }

    #[test]
    fn a_healthy_daemon_names_nothing() {
        let mut s = bench_snapshot(1000);
        for f in &mut s.flows {
            f.health = InputHealth::default();
        }
        let summary = Summary::of(&s);
        assert_eq!(summary.flow_states.running, 1000);
        assert!(summary.not_running.is_empty());
        assert!(summary.silent.is_empty());
        assert!(summary.stream_errors.is_empty());
        assert_eq!(summary.totals, s.totals());
        assert_eq!(summary.workers, s.workers);
    }

    #[test]
    fn decodes_a_summary_and_summarises_an_old_daemons_snapshot() {
        let s = sample();
        let summary = Summary::of(&s);
        let from_new = decode_status(serde_json::to_value(&summary).unwrap()).unwrap();
        assert_eq!(from_new, summary);
        let from_old = decode_status(serde_json::to_value(&s).unwrap()).unwrap();
        assert_eq!(from_old, summary);
        assert!(matches!(
            decode_status(serde_json::json!({"flows": 3})),
            Err(ProtocolError::UnexpectedResult(_))
        ));
        assert!(matches!(
            decode_status(serde_json::json!(7)),
            Err(ProtocolError::UnexpectedResult(_))
        ));
    }

    #[test]
    fn clips_at_a_character_boundary() {
        assert_eq!(clip("abc", 3), "abc");
        assert_eq!(clip("abcd", 3), "abc...");
        assert_eq!(clip("ééééé", 2), "éé...");
    }
}
