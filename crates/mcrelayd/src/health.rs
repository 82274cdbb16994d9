//! Stream health on the supervisor's side: the settings a flow's worker
//! tracks with ([`settings`]), what readers see of an input
//! ([`snapshot`]), and the [`Watcher`] that, once per supervisor tick,
//! logs each silence change once and names the inputs that are silent or
//! losing packets on the systemd `STATUS=` line. Nothing here runs on the
//! packet path.

use std::collections::HashMap;

use mcrelay_config::Flow;
use mcrelay_control::{InputHealth, RtpHealth, Snapshot, TsHealth};
use mcrelay_dataplane::health::{HealthCounters, HealthSettings, now_ns};

/// A flow's stream-health settings for its worker.
pub fn settings(flow: &Flow) -> HealthSettings {
    HealthSettings {
        payload: flow.health.payload,
        rtp_clock_hz: flow.health.rtp_clock_hz,
        silence_ms: flow.health.silence_ms,
    }
}

/// What readers see of an input's health now. `take_gap`: start the next
/// max-gap period (readers through the control socket and metrics do;
/// the supervisor's own status updates don't).
pub fn snapshot(c: &HealthCounters, take_gap: bool) -> InputHealth {
    let Some(s) = c.settings() else {
        return InputHealth::default();
    };
    let now = now_ns();
    let silence_ns = u64::from(s.silence_ms) * 1_000_000;
    let silent =
        mcrelay_dataplane::health::is_silent(c.last_arrival(), c.added_ns.get(), now, silence_ns);
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
        jitter_ns: mcrelay_dataplane::health::jitter_ns(c.rtp_jitter_x16.get(), s.rtp_clock_hz),
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
        max_gap_ns: if take_gap {
            c.take_max_gap(now)
        } else {
            c.max_gap(now)
        },
        rtp,
        ts,
    }
}

/// Silence and loss across supervisor ticks.
#[derive(Debug, Default)]
pub struct Watcher {
    /// Per flow: silent at the previous tick, and losses then.
    seen: HashMap<String, (bool, u64)>,
    /// Inputs silent now, and inputs whose losses grew in the last tick.
    silent: Vec<String>,
    losing: Vec<String>,
}

impl Watcher {
    /// Compare with the previous tick: log each silence change once.
    pub fn tick(&mut self, s: &Snapshot) {
        self.silent.clear();
        self.losing.clear();
        let mut seen = HashMap::with_capacity(s.flows.len());
        for f in s.flows.iter().filter(|f| f.state.is_running()) {
            let h = &f.health;
            if h.payload.is_empty() {
                continue;
            }
            let losses = h.losses();
            let (was_silent, before) = self.seen.get(&f.name).copied().unwrap_or((false, losses));
            match (was_silent, h.silent) {
                (false, true) => tracing::warn!(
                    flow = %f.name,
                    input = %f.input,
                    silence_ms = h.silence_ms,
                    "input silent: no datagram for {} ms",
                    h.silence_ms
                ),
                (true, false) => {
                    tracing::info!(flow = %f.name, input = %f.input, "input active again")
                }
                _ => {}
            }
            if h.silent {
                self.silent.push(f.name.clone());
            }
            if losses > before {
                self.losing.push(f.name.clone());
            }
            seen.insert(f.name.clone(), (h.silent, losses));
        }
        self.seen = seen;
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
