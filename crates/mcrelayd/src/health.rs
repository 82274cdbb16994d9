//! Stream health on the supervisor's side: the settings a flow's worker
//! tracks with ([`settings`]), what readers see of an input
//! ([`snapshot`]), and the [`Watcher`] that, once per supervisor tick,
//! logs each silence change once and names the inputs that are silent or
//! losing packets on the systemd `STATUS=` line. Nothing here runs on the
//! packet path.

use std::collections::{HashMap, HashSet};

use mcrelay_config::Flow;
use mcrelay_control::{InputHealth, RtpHealth, Snapshot, TsHealth};
#[cfg(test)]
use mcrelay_control::{LegSnapshot, RedundancySnapshot};
use mcrelay_relay::health::{HealthCounters, HealthSettings, now_ns};

/// A flow's stream-health settings for its worker.
pub fn settings(flow: &Flow) -> HealthSettings {
    flow.health
}

/// What readers see of an input's health now. Reading changes nothing
/// (the longest gap is kept per fixed window, not per reader).
pub fn snapshot(c: &HealthCounters) -> InputHealth {
    let Some(s) = c.settings() else {
        return InputHealth::default();
    };
    let now = now_ns();
    let silence_ns = u64::from(s.silence_ms) * 1_000_000;
    let silent =
        mcrelay_relay::health::is_silent(c.last_arrival(), c.added_ns.get(), now, silence_ns);
    let rtp = s.payload.has_rtp().then(|| RtpHealth {
        packets: c.rtp_packets.get(),
        lost: c.rtp_lost.get(),
        duplicates: c.rtp_duplicates.get(),
        reordered: c.rtp_reordered.get(),
        ssrc_changes: c.rtp_ssrc_changes.get(),
        resyncs: c.rtp_resyncs.get(),
        malformed: c.rtp_malformed.get(),
        payload_type: u8::try_from(c.rtp_payload_type.get()).unwrap_or(0),
        ssrc: u32::try_from(c.rtp_ssrc.get()).unwrap_or(0),
        jitter_ns: mcrelay_relay::health::jitter_ns(c.rtp_jitter_x16.get(), s.rtp_clock_hz),
    });
    let ts = s.payload.has_ts().then(|| TsHealth {
        packets: c.ts_packets.get(),
        sync_errors: c.ts_sync_errors.get(),
        continuity_errors: c.ts_continuity_errors.get(),
        transport_errors: c.ts_transport_errors.get(),
        pids: c.ts_pids.get(),
    });
    InputHealth {
        payload: s.payload.as_str().to_owned(),
        silent,
        silence_ms: u64::from(s.silence_ms),
        max_gap_ns: c.max_gap(now),
        rtp,
        ts,
    }
}

/// Silence and loss across supervisor ticks, and the redundancy events
/// of flows with several inputs.
#[derive(Debug, Default)]
pub struct Watcher {
    /// Per input (flow name, and the leg's input for a flow with several):
    /// silent at the previous tick, and losses then.
    seen: HashMap<(String, String), (bool, u64)>,
    /// Per flow with several inputs: switches and merge resets at the
    /// previous tick.
    redundancy: HashMap<String, (u64, u64)>,
    /// Merge legs (flow name, input) detached at the previous tick.
    detached: HashSet<(String, String)>,
    /// Inputs silent now, and inputs whose losses grew in the last tick.
    silent: Vec<String>,
    losing: Vec<String>,
}

impl Watcher {
    /// Compare with the previous tick: log each silence change once, and
    /// each failover switch and merge reset (from the counters: a tick
    /// that saw several logs them as one line with their number).
    pub fn tick(&mut self, s: &Snapshot) {
        self.silent.clear();
        self.losing.clear();
        let mut seen = HashMap::with_capacity(s.flows.len());
        let mut redundancy = HashMap::new();
        let mut detached = HashSet::new();
        for f in s.flows.iter().filter(|f| f.state.is_running()) {
            let inputs: Vec<(&str, &InputHealth, String)> = match &f.redundancy {
                None => vec![(f.input.as_str(), &f.health, f.name.clone())],
                Some(r) => r
                    .legs
                    .iter()
                    .map(|l| {
                        (
                            l.input.as_str(),
                            &l.health,
                            format!("{} ({})", f.name, l.input),
                        )
                    })
                    .collect(),
            };
            for (input, h, shown) in inputs {
                if h.payload.is_empty() {
                    continue;
                }
                let key = (f.name.clone(), input.to_owned());
                let losses = h.losses();
                let (was_silent, before) = self.seen.get(&key).copied().unwrap_or((false, losses));
                match (was_silent, h.silent) {
                    (false, true) => tracing::warn!(
                        flow = %f.name,
                        input = %input,
                        silence_ms = h.silence_ms,
                        "input silent: no datagram for {} ms",
                        h.silence_ms
                    ),
                    (true, false) => {
                        tracing::info!(flow = %f.name, input = %input, "input active again")
                    }
                    _ => {}
                }
                if h.silent {
                    self.silent.push(shown.clone());
                }
                if losses > before {
                    self.losing.push(shown);
                }
                seen.insert(key, (h.silent, losses));
            }
            if let Some(r) = &f.redundancy {
                // A flow's counters start at zero when it is configured
                // (a reload that changes it carries them on), so a flow
                // seen for the first time logs what it did before this
                // tick.
                let (switches, resets) = self.redundancy.get(&f.name).copied().unwrap_or((0, 0));
                if r.switches > switches {
                    let to = usize::try_from(r.active_input)
                        .ok()
                        .and_then(|i| r.legs.get(i))
                        .map_or("?", |l| l.input.as_str());
                    tracing::warn!(
                        flow = %f.name,
                        to = %to,
                        input = r.active_input,
                        switches = r.switches - switches,
                        "input switch: now forwarding from input {} ({to})",
                        r.active_input
                    );
                }
                if r.resets > resets {
                    tracing::warn!(
                        flow = %f.name,
                        resets = r.resets - resets,
                        "merge reset: a leg confirmed a new RTP numbering (an encoder restart or a new source) and no leg carried the old one within merge_window_ms; merging restarted"
                    );
                }
                redundancy.insert(f.name.clone(), (r.switches, r.resets));
                for l in r.legs.iter().filter(|l| l.detached) {
                    let key = (f.name.clone(), l.input.clone());
                    if !self.detached.contains(&key) {
                        tracing::warn!(
                            flow = %f.name,
                            input = %l.input,
                            "input not merged: its RTP numbering is not the flow's (an independent encoder, or a leg offset in numbering); its datagrams are dropped as mismatched"
                        );
                    }
                    detached.insert(key);
                }
            }
        }
        for (flow, input) in self.detached.difference(&detached) {
            if seen.keys().any(|(f, _)| f == flow) {
                tracing::info!(flow = %flow, input = %input, "input merged again");
            }
        }
        self.seen = seen;
        self.redundancy = redundancy;
        self.detached = detached;
    }

    /// For `STATUS=`: "; silent: a, b; losing packets: c", or nothing.
    pub fn status(&self) -> String {
        let mut out = String::new();
        for (what, names) in [("silent", &self.silent), ("losing packets", &self.losing)] {
            if !names.is_empty() {
                out.push_str(&format!("; {what}: {}", names.join(", ")));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(silent: bool, lost: u64) -> Snapshot {
        let mut s: Snapshot = serde_json::from_value(serde_json::json!({
            "version": "0", "pid": 1, "uptime_seconds": 0.0, "taken_at_unix_ms": 0,
            "state": {"state": "running"}, "config_path": "x", "workers": [],
            "flows": [{
                "name": "cam", "worker": 0, "input": "239.1.1.1:5000 on eth0",
                "packets_in": 0, "bytes_in": 0,
                "drops": {"oversize": 0, "pool_exhausted": 0, "kernel": 0},
                "receive_errors": 0, "outputs": []
            }]
        }))
        .unwrap();
        s.flows[0].health = InputHealth {
            payload: "rtp".into(),
            silent,
            silence_ms: 1000,
            rtp: Some(RtpHealth {
                lost,
                ..RtpHealth::default()
            }),
            ..InputHealth::default()
        };
        s
    }

    #[test]
    fn legs_are_watched_each_and_events_counted_once() {
        let mut s = snap(false, 0);
        let base = s.flows[0].health.clone();
        let leg = |input: &str, silent, lost| LegSnapshot {
            input: input.into(),
            health: InputHealth {
                silent,
                rtp: Some(RtpHealth {
                    lost,
                    ..RtpHealth::default()
                }),
                ..base.clone()
            },
            ..LegSnapshot::default()
        };
        let mut with = |a_silent, b_lost, switches, resets| {
            s.flows[0].redundancy = Some(RedundancySnapshot {
                mode: "failover".into(),
                switches,
                resets,
                active_input: 1,
                legs: vec![leg("a on x", a_silent, 0), leg("b on y", false, b_lost)],
                ..RedundancySnapshot::default()
            });
            s.clone()
        };
        let mut w = Watcher::default();
        w.tick(&with(false, 0, 0, 0));
        assert_eq!(w.redundancy["cam"], (0, 0));
        w.tick(&with(false, 0, 4, 1));
        assert_eq!(w.redundancy["cam"], (4, 1));
        assert_eq!(w.status(), "");
        w.tick(&with(true, 3, 5, 1));
        assert_eq!(
            w.status(),
            "; silent: cam (a on x); losing packets: cam (b on y)"
        );
        assert_eq!(w.redundancy["cam"], (5, 1));
        assert_eq!(w.seen.len(), 2, "one entry per leg");
        // A leg detached (numbered unlike the flow) is remembered, so it
        // is logged once, and forgotten once it is merged again.
        let mut detached = with(false, 3, 5, 1);
        if let Some(r) = detached.flows[0].redundancy.as_mut() {
            r.legs[1].detached = true;
        }
        w.tick(&detached);
        w.tick(&detached);
        let key = ("cam".to_owned(), "b on y".to_owned());
        assert!(w.detached.contains(&key) && w.detached.len() == 1);
        w.tick(&with(false, 3, 5, 1));
        assert!(w.detached.is_empty());
    }

    #[test]
    fn status_names_silent_and_losing_inputs() {
        let mut w = Watcher::default();
        w.tick(&snap(false, 5));
        assert_eq!(w.status(), "", "losses before the first tick are old news");
        w.tick(&snap(false, 7));
        assert_eq!(w.status(), "; losing packets: cam");
        w.tick(&snap(true, 7));
        assert_eq!(w.status(), "; silent: cam");
        w.tick(&snap(false, 7));
        assert_eq!(w.status(), "");
    }
}
