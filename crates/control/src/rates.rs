//! Rates between two snapshots of the same daemon.
//!
//! Counters only grow while a flow lives; a reload that changes a flow
//! restarts its counters. A counter lower than before therefore means a
//! restart, and its rate is reported as 0 until the next pair of snapshots
//! rather than as a negative or huge number.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::snapshot::{FlowSnapshot, OutputSnapshot, Snapshot};
use crate::units::per_second;

/// Per-second rates over the interval between two snapshots.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    /// The interval; 0 when the clock did not move forward (all rates 0).
    pub elapsed_seconds: f64,
    /// One entry per flow present in both snapshots, in the order of the
    /// later one.
    pub flows: Vec<FlowRates>,
}

/// Rates of one flow's input.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FlowRates {
    pub name: String,
    pub packets_per_second: f64,
    /// Payload bits per second.
    pub bits_per_second: f64,
    /// Ingress drops per second, all reasons.
    pub drops_per_second: f64,
    /// One entry per output present in both snapshots.
    pub outputs: Vec<OutputRates>,
}

/// Rates of one output.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OutputRates {
    pub label: String,
    pub packets_per_second: f64,
    /// Payload bits per second.
    pub bits_per_second: f64,
    /// Drops per second, all reasons.
    pub drops_per_second: f64,
}

impl Rates {
    /// Rates from `prev` to `cur`, flows matched by name and outputs by
    /// label. Flows or outputs new in `cur` are left out.
    pub fn between(prev: &Snapshot, cur: &Snapshot) -> Rates {
        let elapsed_ms = cur.taken_at_unix_ms.saturating_sub(prev.taken_at_unix_ms);
        let elapsed_seconds = elapsed_ms as f64 / 1000.0;
        // By name through a map: a search of `prev` per flow was half a
        // million name comparisons at 1000 flows, on every `flows` and
        // every `top` refresh.
        let before: HashMap<&str, &FlowSnapshot> =
            prev.flows.iter().map(|p| (p.name.as_str(), p)).collect();
        let flows = cur
            .flows
            .iter()
            .filter_map(|c| {
                let p = before.get(c.name.as_str())?;
                Some(flow_rates(p, c, elapsed_seconds))
            })
            .collect();
        Rates {
            elapsed_seconds,
            flows,
        }
    }

    /// The rates of the flow named `name`.
    pub fn flow(&self, name: &str) -> Option<&FlowRates> {
        self.flows.iter().find(|f| f.name == name)
    }
}

impl FlowRates {
    /// The rates of the output labelled `label`.
    pub fn output(&self, label: &str) -> Option<&OutputRates> {
        self.outputs.iter().find(|o| o.label == label)
    }
}

fn flow_rates(p: &FlowSnapshot, c: &FlowSnapshot, seconds: f64) -> FlowRates {
    let outputs = c
        .outputs
        .iter()
        .filter_map(|co| {
            let po = p.outputs.iter().find(|po| po.label == co.label)?;
            Some(output_rates(po, co, seconds))
        })
        .collect();
    FlowRates {
        name: c.name.clone(),
        packets_per_second: per_second(p.packets_in, c.packets_in, seconds),
        bits_per_second: 8.0 * per_second(p.bytes_in, c.bytes_in, seconds),
        drops_per_second: per_second(p.drops.total(), c.drops.total(), seconds),
        outputs,
    }
}

fn output_rates(p: &OutputSnapshot, c: &OutputSnapshot, seconds: f64) -> OutputRates {
    OutputRates {
        label: c.label.clone(),
        packets_per_second: per_second(p.packets_out, c.packets_out, seconds),
        bits_per_second: 8.0 * per_second(p.bytes_out, c.bytes_out, seconds),
        drops_per_second: per_second(p.drops(), c.drops(), seconds),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::sample;

    /// `sample()` 2 s later with every counter of flow 0 grown.
    fn later() -> (Snapshot, Snapshot) {
        let prev = sample();
        let mut cur = prev.clone();
        cur.taken_at_unix_ms += 2000;
        let f = &mut cur.flows[0];
        f.packets_in += 2000;
        f.bytes_in += 250_000;
        f.drops.kernel += 10;
        f.outputs[0].packets_out += 1000;
        f.outputs[0].bytes_out += 1_000_000;
        f.outputs[0].drops_send_error += 4;
        (prev, cur)
    }

    #[test]
    fn rates_per_second() {
        let (prev, cur) = later();
        let r = Rates::between(&prev, &cur);
        assert_eq!(r.elapsed_seconds, 2.0);
        let f = r.flow("video-a").unwrap();
        assert_eq!(f.packets_per_second, 1000.0);
        assert_eq!(f.bits_per_second, 1_000_000.0);
        assert_eq!(f.drops_per_second, 5.0);
        let o = f.output("10.0.0.1:6000").unwrap();
        assert_eq!(o.packets_per_second, 500.0);
        assert_eq!(o.bits_per_second, 4_000_000.0);
        assert_eq!(o.drops_per_second, 2.0);
        assert_eq!(f.output("239.2.2.2:7000").unwrap().packets_per_second, 0.0);
    }

    #[test]
    fn counters_going_backwards_give_zero() {
        let (prev, cur) = later();
        // A restarted flow: swap the snapshots' counters but keep time going.
        let mut restarted = prev.clone();
        restarted.taken_at_unix_ms = cur.taken_at_unix_ms + 1000;
        restarted.flows[0].packets_in = 0;
        restarted.flows[0].bytes_in = 0;
        restarted.flows[0].outputs[0].packets_out = 0;
        let r = Rates::between(&cur, &restarted);
        let f = r.flow("video-a").unwrap();
        assert_eq!(f.packets_per_second, 0.0);
        assert_eq!(f.bits_per_second, 0.0);
        assert_eq!(f.drops_per_second, 0.0);
        assert_eq!(f.outputs[0].packets_per_second, 0.0);
        assert!(f.outputs.iter().all(|o| o.bits_per_second >= 0.0));
    }

    #[test]
    fn no_elapsed_time_gives_zeros() {
        let (prev, mut cur) = later();
        for t in [prev.taken_at_unix_ms, prev.taken_at_unix_ms - 5000, 0] {
            cur.taken_at_unix_ms = t;
            let r = Rates::between(&prev, &cur);
            assert_eq!(r.elapsed_seconds, 0.0);
            let f = &r.flows[0];
            assert_eq!(f.packets_per_second, 0.0);
            assert!(f.outputs.iter().all(|o| o.packets_per_second == 0.0));
        }
    }

    #[test]
    fn flows_are_matched_by_name() {
        let (mut prev, mut cur) = later();
        let mut other = cur.flows[0].clone();
        other.name = "new".into();
        cur.flows.insert(0, other);
        prev.flows[0].outputs.remove(0);
        let r = Rates::between(&prev, &cur);
        assert_eq!(r.flows.len(), 1);
        assert!(r.flow("new").is_none());
        let f = r.flow("video-a").unwrap();
        assert_eq!(f.packets_per_second, 1000.0);
        assert!(f.output("10.0.0.1:6000").is_none());
    }
}
