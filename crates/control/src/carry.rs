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
//!   (`address:port`); a new output starts at 0, a removed one is gone
//!   from what readers see but kept in what a successor goes on from
//!   ([`FlowSnapshot::carry_keeping`]), so one a later reload brings back
//!   goes on from where it stood (as do a leg, and the redundancy, FEC
//!   and RIST sections of a flow that lost them and gets them back);
//! - an input's stream health and a leg's counters: to the input with
//!   the same label ("239.1.1.1:5000 on eth0"), whether it was the flow's
//!   one input or one of its legs before and after. A flow with several
//!   legs has its output's health at the top: it goes on from the
//!   top-level health before (its output's, or its one input's, which
//!   was its output); a flow going back to one input shows that input's;
//! - an SRT output's route totals, and an SRT input's (by its label):
//!   when the SRT thread's route is another one than before (the route
//!   ended with the old flow and was opened anew); a route the new flow
//!   took over, or one the SRT thread rebuilt in place (it then goes on
//!   from the old route's totals itself), is the same series and already
//!   counts everything. A caller's or a peer's own counters are its
//!   connection's and are not carried.
//!
//! Which numbers are totals (added), high-water marks (the larger kept)
//! or gauges (the latest SSRC, jitter, the active leg, a gap maximum,
//! whether a leg is detached: the new flow's, describing now) is the
//! counter table's to say ([`crate::counters`]); this module only says
//! which section goes on from which.

use crate::counters::{self, carry};
use crate::snapshot::{FlowSnapshot, InputHealth, OutputSnapshot};

impl FlowSnapshot {
    /// Add what `earlier` (the flow this one replaced, as readers last
    /// saw it, itself carried) counted to every counter of this one,
    /// matched as the module says.
    pub fn carry(&mut self, earlier: &FlowSnapshot) {
        carry(counters::FLOW, self, earlier);
        carry(counters::INGRESS_DROPS, &mut self.drops, &earlier.drops);
        for out in &mut self.outputs {
            if let Some(e) = earlier.outputs.iter().find(|e| e.label == out.label) {
                out.carry(e);
            }
        }
        for input in &mut self.srt_inputs {
            if let Some(e) = earlier.srt_inputs.iter().find(|e| e.label == input.label)
                && e.series != input.series
            {
                carry(counters::SRT_INPUT, input, e);
            }
        }
        // Each input's health, by its label, wherever it was before: the
        // one input's (newer than a leg `earlier` only keeps, see
        // [`Self::carry_keeping`]), or a leg's.
        let before = |input: &str| -> Option<&InputHealth> {
            if earlier.input == input {
                return Some(&earlier.health);
            }
            let legs = &earlier.redundancy.as_ref()?.legs;
            legs.iter().find(|l| l.input == input).map(|l| &l.health)
        };
        match &mut self.redundancy {
            None => {
                if let Some(h) = before(&self.input) {
                    self.health.carry(h);
                }
            }
            Some(r) => {
                if let Some(e) = &earlier.redundancy {
                    carry(counters::REDUNDANCY, r, e);
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
                        carry(counters::LEG, leg, e);
                        if let (Some(r), Some(e)) = (&mut leg.rist, &e.rist) {
                            carry(counters::LEG_RIST, r, e);
                        }
                        if let (Some(x), Some(e)) = (&mut leg.fec, &e.fec) {
                            carry(counters::LEG_FEC, x, e);
                        }
                    }
                }
            }
        }
        if let (Some(f), Some(e)) = (&mut self.fec, &earlier.fec) {
            carry(counters::FEC, f, e);
        }
        if let (Some(r), Some(e)) = (&mut self.rist, &earlier.rist) {
            carry(counters::RIST, r, e);
        }
    }
}

impl FlowSnapshot {
    /// [`Self::carry`], and what `earlier` counted in a section this flow
    /// does not have now kept as it is: an output or a leg removed, the
    /// redundancy, FEC or RIST section of a flow that no longer has one.
    /// For the snapshot a successor goes on from (never shown: readers see
    /// a flow's own sections only), so a section that comes back in a
    /// later reload goes on from where it stood instead of from 0
    /// (merge, then one input, then merge again: the merge's totals are
    /// one series throughout, absent in between, never lower).
    pub fn carry_keeping(&mut self, earlier: &FlowSnapshot) {
        self.carry(earlier);
        for o in &earlier.outputs {
            if !self.outputs.iter().any(|x| x.label == o.label) {
                self.outputs.push(o.clone());
            }
        }
        match (&mut self.redundancy, &earlier.redundancy) {
            (None, Some(e)) => self.redundancy = Some(e.clone()),
            (Some(r), Some(e)) => {
                for leg in &e.legs {
                    if !r.legs.iter().any(|l| l.input == leg.input) {
                        r.legs.push(leg.clone());
                    }
                }
            }
            _ => {}
        }
        if self.fec.is_none() {
            self.fec.clone_from(&earlier.fec);
        }
        if self.rist.is_none() {
            self.rist.clone_from(&earlier.rist);
        }
    }
}

impl OutputSnapshot {
    fn carry(&mut self, e: &Self) {
        carry(counters::OUTPUT, self, e);
        if self.last_error.is_none() {
            self.last_error.clone_from(&e.last_error);
        }
        if let (Some(s), Some(e)) = (&mut self.srt, &e.srt)
            && s.series != e.series
        {
            carry(counters::SRT_OUTPUT, s, e);
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
        carry(counters::INPUT_HEALTH, self, e);
        if let (Some(r), Some(e)) = (&mut self.rtp, &e.rtp) {
            carry(counters::RTP, r, e);
        }
        if let (Some(t), Some(e)) = (&mut self.ts, &e.ts) {
            carry(counters::TS, t, e);
        }
    }
}

#[cfg(test)]
mod tests {
    use mcrelay_testkit::metrics::{fell, totals};

    use crate::snapshot::{
        FecSnapshot, RistSnapshot, Snapshot, SrtInputSnapshot, SrtSnapshot, sample_with_legs,
    };

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
                leg.fec = Some(crate::snapshot::LegFecSnapshot {
                    packets: 50 + u64::try_from(k).unwrap_or(0),
                    recovered: 51,
                    unrecoverable: 52,
                    duplicates: 53,
                    rejected: 54,
                });
            }
            for o in &mut f.outputs {
                o.connect_failures = 2;
            }
            // The SRT thread's routes: their callers and peers are their
            // connections' (not carried), so a rebuilt route has none.
            f.outputs[1].srt = Some(srt_output(7));
            f.srt_inputs = vec![srt_input(0, "srt://0.0.0.0:9000", 7)];
        }
        s
    }

    /// An SRT output's route `series`, every total of it counted.
    fn srt_output(series: u64) -> SrtSnapshot {
        SrtSnapshot {
            listener: true,
            max_callers: 4,
            datagrams: 100,
            no_caller: 1,
            oversize: 2,
            sent: 90,
            dropped: 3,
            connects: 4,
            refused: 5,
            disconnects: 6,
            connect_failures: 7,
            series,
            ..SrtSnapshot::default()
        }
    }

    /// SRT input `label` (leg `leg`) of route `series`, every total of it
    /// counted.
    fn srt_input(leg: usize, label: &str, series: u64) -> SrtInputSnapshot {
        SrtInputSnapshot {
            leg,
            label: label.into(),
            listener: true,
            datagrams: 100,
            delivered: 95,
            drop_queue_full: 4,
            drop_flow_gone: 1,
            connects: 2,
            refused: 3,
            disconnects: 1,
            connect_failures: 9,
            series,
            ..SrtInputSnapshot::default()
        }
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

    /// Merge, then one input and one output (the first leg, the first
    /// output), then merge with both again, each flow rebuilt with every
    /// counter 0: what readers see after is what they saw before, the
    /// merge's, the second leg's, the second output's and the FEC and
    /// RIST totals included, although the middle flow has none of them
    /// (they were lost when the snapshot a successor goes on from was the
    /// one readers see).
    #[test]
    fn a_section_removed_then_brought_back_goes_on_from_where_it_stood() {
        let first = populated();
        let merged = first
            .flows
            .iter()
            .find(|f| f.redundancy.is_some())
            .expect("a merged flow")
            .clone();
        // SRT routes go by their series (`srt_routes_carry_...`), which
        // zeroing makes alike: not what this is about.
        let mut merged = merged;
        merged.srt_inputs.clear();
        for o in &mut merged.outputs {
            o.srt = None;
        }
        let fresh = |f: &crate::snapshot::FlowSnapshot| {
            let mut json = serde_json::to_value(f).expect("json");
            zeroed(&mut json);
            serde_json::from_value::<crate::snapshot::FlowSnapshot>(json).expect("flow")
        };
        let legs = &merged.redundancy.as_ref().expect("legs").legs;
        let mut single = fresh(&merged);
        single.input.clone_from(&legs[0].input);
        single.redundancy = None;
        single.fec = None;
        single.rist = None;
        single.outputs.truncate(1);
        single.health = merged.redundancy.as_ref().expect("legs").legs[0]
            .health
            .clone();
        zeroed_health(&mut single.health);
        single.carry_keeping(&merged);
        let mut again = fresh(&merged);
        again.carry(&single);
        let snapshot = |f: &crate::snapshot::FlowSnapshot| Snapshot {
            flows: vec![f.clone()],
            ..first.clone()
        };
        let (was, now) = (
            totals(&crate::render_metrics(&snapshot(&merged))),
            totals(&crate::render_metrics(&snapshot(&again))),
        );
        let fell = fell(&was, &now);
        assert!(fell.is_empty(), "went down: {fell:#?}");
        let vanished: Vec<_> = was.keys().filter(|k| !now.contains_key(*k)).collect();
        assert!(vanished.is_empty(), "vanished: {vanished:#?}");
    }

    /// Every number of `h` set to 0, its payload kept.
    fn zeroed_health(h: &mut crate::snapshot::InputHealth) {
        let payload = h.payload.clone();
        let mut json = serde_json::to_value(&*h).expect("json");
        zeroed(&mut json);
        *h = serde_json::from_value(json).expect("health");
        h.payload = payload;
    }

    /// An SRT route the new flow took over (the same series) already
    /// counts what the old flow's did: nothing is added. One opened anew
    /// (another series) starts at 0: the old one's totals are.
    #[test]
    fn srt_routes_carry_when_opened_anew_and_only_then() {
        let before = populated().flows.remove(0);
        let mut taken_over = before.clone();
        taken_over.carry(&before);
        assert_eq!(taken_over.outputs[1].srt, before.outputs[1].srt);
        assert_eq!(taken_over.srt_inputs, before.srt_inputs);

        let mut anew = before.clone();
        let mut fresh = srt_output(8);
        fresh.sent = 10;
        anew.outputs[1].srt = Some(fresh);
        anew.srt_inputs = vec![
            srt_input(0, "srt://0.0.0.0:9000", 8),
            srt_input(1, "srt://0.0.0.0:9001", 8),
        ];
        anew.carry(&before);
        let out = anew.outputs[1].srt.as_ref().expect("srt");
        assert_eq!((out.sent, out.datagrams, out.max_callers), (100, 200, 4));
        assert_eq!(anew.srt_inputs[0].delivered, 190, "the same label");
        assert_eq!(anew.srt_inputs[1].delivered, 95, "a new input");
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
