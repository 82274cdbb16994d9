//! Counters that never go down across a reload. A reload that changes a
//! flow builds it anew: new sockets, new counters starting at 0. What
//! readers see of it is the new flow's counters plus what the flow it
//! replaced had counted ([`FlowSnapshot::carry`]), so every `_total` of
//! `/metrics` and every counter of `stats --json` goes on from where it
//! stood, as a Prometheus counter must.
//!
//! What carries over, by what it is, not by its place in a list:
//! - the flow's own counters (input, drops, redundancy, FEC, RIST):
//!   always (the flow is the same series, `flow="name"`);
//! - an output's counters: to the output with the same label
//!   (`address:port`); a new output starts at 0, a removed one is gone;
//! - an input's stream health and a leg's counters: to the input with
//!   the same label ("239.1.1.1:5000 on eth0"), whether it was the flow's
//!   one input or one of its legs before and after. A flow with several
//!   legs has its output's health at the top: it goes on from the
//!   top-level health before (its output's, or its one input's, which
//!   was its output); a flow going back to one input shows that input's.
//!
//! Gauges (the latest SSRC, jitter, the active leg, a gap maximum, a
//! high-water mark, whether a leg is detached) are the new flow's: they
//! describe now, not a sum.

use crate::snapshot::{
    FecSnapshot, FlowSnapshot, IngressDropsSnapshot, InputHealth, LegSnapshot, OutputSnapshot,
    RedundancySnapshot, RistSnapshot, RtpHealth, TsHealth,
};

fn add(to: &mut u64, from: u64) {
    *to = to.saturating_add(from);
}

impl FlowSnapshot {
    /// Add what `earlier` (the flow this one replaced, as readers last
    /// saw it, itself carried) counted to every counter of this one,
    /// matched as the module says.
    pub fn carry(&mut self, earlier: &FlowSnapshot) {
        add(&mut self.packets_in, earlier.packets_in);
        add(&mut self.bytes_in, earlier.bytes_in);
        self.drops.carry(&earlier.drops);
        add(&mut self.receive_errors, earlier.receive_errors);
        add(&mut self.receive_rearms, earlier.receive_rearms);
        add(&mut self.pool_fallbacks, earlier.pool_fallbacks);
        add(&mut self.interface_pauses, earlier.interface_pauses);
        add(&mut self.standby_discarded, earlier.standby_discarded);
        for out in &mut self.outputs {
            if let Some(e) = earlier.outputs.iter().find(|e| e.label == out.label) {
                out.carry(e);
            }
        }
        // Each input's health, by its label, wherever it was before.
        let before = |input: &str| -> Option<&InputHealth> {
            match &earlier.redundancy {
                None => (earlier.input == input).then_some(&earlier.health),
                Some(r) => r.legs.iter().find(|l| l.input == input).map(|l| &l.health),
            }
        };
        match &mut self.redundancy {
            None => {
                if let Some(h) = before(&self.input) {
                    self.health.carry(h);
                }
            }
            Some(r) => {
                if let Some(e) = &earlier.redundancy {
                    r.carry(e);
                }
                // The output's health goes on from the output's before:
                // the merge's or active leg's, or the one input's stream.
                self.health.carry(&earlier.health);
                for leg in &mut r.legs {
                    if let Some(h) = before(&leg.input) {
                        leg.health.carry(h);
                    }
                    if let Some(e) = earlier
                        .redundancy
                        .as_ref()
                        .and_then(|e| e.legs.iter().find(|l| l.input == leg.input))
                    {
                        leg.carry(e);
                    }
                }
            }
        }
        if let (Some(f), Some(e)) = (&mut self.fec, &earlier.fec) {
            f.carry(e);
        }
        if let (Some(r), Some(e)) = (&mut self.rist, &earlier.rist) {
            r.carry(e);
        }
    }
}

impl IngressDropsSnapshot {
    fn carry(&mut self, e: &Self) {
        add(&mut self.oversize, e.oversize);
        add(&mut self.pool_exhausted, e.pool_exhausted);
        add(&mut self.kernel, e.kernel);
        add(&mut self.truncated, e.truncated);
        add(&mut self.malformed, e.malformed);
        add(&mut self.fragment, e.fragment);
        add(&mut self.bad_checksum, e.bad_checksum);
        add(&mut self.not_this_flow, e.not_this_flow);
        add(&mut self.looped, e.looped);
    }
}

impl OutputSnapshot {
    fn carry(&mut self, e: &Self) {
        add(&mut self.packets_out, e.packets_out);
        add(&mut self.bytes_out, e.bytes_out);
        add(&mut self.drops_backlog, e.drops_backlog);
        add(&mut self.drops_send_error, e.drops_send_error);
        add(&mut self.gso_sends, e.gso_sends);
        add(&mut self.gso_fallbacks, e.gso_fallbacks);
        add(&mut self.connect_failures, e.connect_failures);
        // A high-water mark: the most ever, not a sum.
        self.in_flight_high_water = self.in_flight_high_water.max(e.in_flight_high_water);
        if self.last_error.is_none() {
            self.last_error.clone_from(&e.last_error);
        }
    }
}

impl RedundancySnapshot {
    fn carry(&mut self, e: &Self) {
        add(&mut self.recovered, e.recovered);
        add(&mut self.duplicates, e.duplicates);
        add(&mut self.lost, e.lost);
        add(&mut self.resets, e.resets);
        add(&mut self.switches, e.switches);
        add(&mut self.late, e.late);
        add(&mut self.not_rtp, e.not_rtp);
        add(&mut self.strays, e.strays);
        add(&mut self.replays, e.replays);
        add(&mut self.mismatched, e.mismatched);
    }
}

impl LegSnapshot {
    fn carry(&mut self, e: &Self) {
        add(&mut self.forwarded, e.forwarded);
        add(&mut self.standby, e.standby);
        add(&mut self.kernel_drops, e.kernel_drops);
        if let (Some(r), Some(e)) = (&mut self.rist, &e.rist) {
            add(&mut r.nacks_sent, e.nacks_sent);
            add(&mut r.recovered, e.recovered);
            add(&mut r.unrecovered, e.unrecovered);
        }
    }
}

impl InputHealth {
    /// The counters of `e` added to this input's. Before the new flow's
    /// first run (no payload known yet) it shows `e`'s, so a series is
    /// not missing for a moment.
    fn carry(&mut self, e: &Self) {
        if self.payload.is_empty() {
            self.payload.clone_from(&e.payload);
            self.silence_ms = e.silence_ms;
            self.silent = e.silent;
            self.rtp.clone_from(&e.rtp);
            self.ts.clone_from(&e.ts);
            return;
        }
        if let (Some(r), Some(e)) = (&mut self.rtp, &e.rtp) {
            r.carry(e);
        }
        if let (Some(t), Some(e)) = (&mut self.ts, &e.ts) {
            t.carry(e);
        }
    }
}

impl RtpHealth {
    fn carry(&mut self, e: &Self) {
        add(&mut self.packets, e.packets);
        add(&mut self.lost, e.lost);
        add(&mut self.duplicates, e.duplicates);
        add(&mut self.reordered, e.reordered);
        add(&mut self.ssrc_changes, e.ssrc_changes);
        add(&mut self.resyncs, e.resyncs);
        add(&mut self.malformed, e.malformed);
    }
}

impl TsHealth {
    fn carry(&mut self, e: &Self) {
        add(&mut self.packets, e.packets);
        add(&mut self.sync_errors, e.sync_errors);
        add(&mut self.continuity_errors, e.continuity_errors);
        add(&mut self.transport_errors, e.transport_errors);
    }
}

impl FecSnapshot {
    fn carry(&mut self, e: &Self) {
        add(&mut self.packets, e.packets);
        add(&mut self.recovered, e.recovered);
        add(&mut self.unrecoverable, e.unrecoverable);
        add(&mut self.duplicates, e.duplicates);
        add(&mut self.rejected, e.rejected);
    }
}

impl RistSnapshot {
    fn carry(&mut self, e: &Self) {
        add(&mut self.nacks_sent, e.nacks_sent);
        add(&mut self.recovered, e.recovered);
        add(&mut self.unrecovered, e.unrecovered);
        add(&mut self.dropped, e.dropped);
        add(&mut self.nacks_received, e.nacks_received);
        add(&mut self.retransmitted, e.retransmitted);
        add(&mut self.unrecoverable, e.unrecoverable);
    }
}

#[cfg(test)]
mod tests {
    use mcrelay_testkit::metrics::{fell, totals};

    use crate::snapshot::{FecSnapshot, RistSnapshot, Snapshot, sample_with_legs};

    /// Every number in `v` set to 0 (strings and shapes kept): a flow
    /// just built, with the same inputs and outputs.
    fn zeroed(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Number(n) => *n = 0.into(),
            serde_json::Value::Array(a) => a.iter_mut().for_each(zeroed),
            serde_json::Value::Object(o) => o.values_mut().for_each(zeroed),
            _ => {}
        }
    }

    /// Every flow fully populated, FEC and RIST included.
    fn populated() -> Snapshot {
        let mut s = sample_with_legs();
        for f in &mut s.flows {
            f.fec = Some(FecSnapshot {
                packets: 1,
                recovered: 2,
                unrecoverable: 3,
                duplicates: 4,
                rejected: 5,
            });
            f.rist = Some(RistSnapshot {
                nacks_sent: 1,
                recovered: 2,
                unrecovered: 3,
                dropped: 4,
                input_rtt_us: 5,
                nacks_received: 6,
                retransmitted: 7,
                unrecoverable: 8,
                output_rtt_us: 9,
            });
            f.interface_pauses = 3;
            for (k, leg) in f
                .redundancy
                .iter_mut()
                .flat_map(|r| &mut r.legs)
                .enumerate()
            {
                leg.rist = Some(crate::snapshot::LegRistSnapshot {
                    nacks_sent: 10 + u64::try_from(k).unwrap_or(0),
                    recovered: 20,
                    unrecovered: 30,
                    rtt_us: 40,
                });
            }
            for o in &mut f.outputs {
                o.connect_failures = 2;
            }
        }
        s
    }

    /// A flow rebuilt by a reload (every counter 0) carrying its
    /// predecessor's: no `_total` series of /metrics is lower than
    /// before, whichever series it is (a counter the carry forgets shows
    /// here as a series that fell to 0).
    #[test]
    fn no_total_goes_down_when_a_rebuilt_flow_carries_its_predecessor() {
        let before = populated();
        let mut json = serde_json::to_value(&before).expect("json");
        zeroed(&mut json);
        let mut after: Snapshot = serde_json::from_value(json).expect("snapshot");
        after.workers.clone_from(&before.workers);
        for (a, b) in after.flows.iter_mut().zip(&before.flows) {
            a.carry(b);
        }
        let (was, now) = (
            totals(&crate::render_metrics(&before)),
            totals(&crate::render_metrics(&after)),
        );
        let vanished: Vec<_> = was.keys().filter(|k| !now.contains_key(*k)).collect();
        assert!(vanished.is_empty(), "vanished: {vanished:#?}");
        assert!(was.len() > 50, "{} series", was.len());
        let fell = fell(&was, &now);
        assert!(fell.is_empty(), "went down: {fell:#?}");
        // And carried exactly: nothing was counted since.
        assert_eq!(was, now);
    }

    /// Outputs match by label and inputs by their address, wherever they
    /// are: an output added starts at 0, a single input that becomes a
    /// leg keeps its health, and a gauge is the new flow's.
    #[test]
    fn outputs_and_inputs_carry_by_what_they_are() {
        let s = sample_with_legs();
        let (single, merged) = (&s.flows[0], &s.flows[1]);
        let mut rebuilt = merged.clone();
        for o in &mut rebuilt.outputs {
            o.packets_out = 1;
        }
        rebuilt.outputs[1].label = "239.9.9.9:7000".into();
        let r = rebuilt.redundancy.as_mut().expect("legs");
        r.active_input = 1;
        for leg in &mut r.legs {
            leg.forwarded = 1;
            if let Some(rtp) = leg.health.rtp.as_mut() {
                rtp.packets = 1;
                rtp.ssrc = 7;
            }
        }
        rebuilt.carry(single);
        assert_eq!(rebuilt.outputs[0].packets_out, 801, "same label");
        assert_eq!(rebuilt.outputs[1].packets_out, 1, "a new output");
        let r = rebuilt.redundancy.as_ref().expect("legs");
        let leg0 = r.legs[0].health.rtp.as_ref().expect("rtp");
        // Leg 0 is the single flow's input: its health goes on.
        assert_eq!((leg0.packets, leg0.ssrc), (801, 7));
        assert_eq!(r.legs[1].health.rtp.as_ref().map(|h| h.packets), Some(1));
        // The single flow had no legs: their counters start here.
        assert_eq!((r.legs[0].forwarded, r.active_input), (1, 1));
    }
}
