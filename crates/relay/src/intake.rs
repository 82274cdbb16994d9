//! Intake: the one way a datagram enters the core, whatever brought it
//! (a UDP socket's receive, a packet ring's frame, a removed flow's
//! drain; next AF_XDP, SRT or RIST). The ingress hands over what it
//! read, as its parser judged it, with the receiver it came in on and
//! the batch's clock reading ([`Core::ingest`]); everything decided per
//! datagram from there is here:
//!
//! - a frame the parser rejected is counted by its reason
//!   ([`crate::counters::FrameDrops`]) and goes no further;
//! - a datagram on a 2022-1 FEC receiver goes to that media leg's
//!   decoder ([`Core::receive_fec`]);
//! - a media datagram is shown to its leg's stream health, then
//!   admitted ([`Core::receive_on`]); on a flow with several legs what
//!   the redundancy rule let through is shown to the output's health.
//!
//! A flow's receivers are numbered as the driver numbers its sockets:
//! the media legs first (`0..legs`), then its FEC receivers in the order
//! given to [`Core::set_intake`]. Health is published once per batch
//! ([`Core::publish_health`]), not per datagram.

use std::sync::Arc;

use crate::counters::FlowCounters;
use crate::health::{HealthSettings, InputHealth};
use crate::{Core, FlowId, LegId, Received};

/// What one receiver of a flow feeds.
#[derive(Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "read per datagram: inline, as the media legs are most receivers"
)]
enum Receiver {
    /// A media leg, with its stream health.
    Media(InputHealth),
    /// A 2022-1 FEC receiver protecting this media leg.
    Fec(LegId),
}

/// A flow's receivers and the health of what it lets through
/// ([`Core::set_intake`]). Empty until set: then every datagram goes to
/// [`Core::receive_on`] as it came.
#[derive(Debug, Default)]
pub(crate) struct Intake {
    receivers: Box<[Receiver]>,
    /// A flow with several legs: the health of its output.
    output: Option<Box<InputHealth>>,
}

impl Intake {
    fn new(
        settings: HealthSettings,
        counters: &Arc<FlowCounters>,
        legs: u8,
        fec: &[LegId],
    ) -> Self {
        let media = (0..usize::from(legs))
            .map(|i| Receiver::Media(InputHealth::for_leg(settings, Arc::clone(counters), i)));
        let fec = fec.iter().map(|&leg| Receiver::Fec(leg));
        Self {
            receivers: media.chain(fec).collect(),
            output: (legs > 1)
                .then(|| Box::new(InputHealth::for_output(settings, Arc::clone(counters)))),
        }
    }

    fn health(&self, receiver: LegId) -> Option<&InputHealth> {
        match self.receivers.get(receiver.index())? {
            Receiver::Media(h) => Some(h),
            Receiver::Fec(_) => None,
        }
    }
}

impl Core {
    /// Give `flow` its receivers: a stream health per media leg (and one
    /// for the output of a flow with several), and after the media legs
    /// one receiver per entry of `fec`, each carrying 2022-1 FEC for
    /// that media leg (whose decoder this enables,
    /// [`Core::enable_fec`]). Not on the packet path: allocates. `false`
    /// (nothing changed) for an unknown flow, an FEC receiver naming no
    /// media leg, or more than [`LegId::MAX_RECEIVERS`] receivers.
    pub fn set_intake(&mut self, flow: FlowId, health: HealthSettings, fec: &[LegId]) -> bool {
        let Some(f) = self.flow(flow) else {
            return false;
        };
        let legs = f.legs;
        if fec.iter().any(|l| l.0 >= legs)
            || usize::from(legs) + fec.len() > usize::from(LegId::MAX_RECEIVERS)
        {
            return false;
        }
        let intake = Intake::new(health, &f.counters, legs, fec);
        for &leg in fec {
            if self.fec_stats(flow, leg).is_none() {
                self.enable_fec(flow, leg);
            }
        }
        if let Some(f) = self.flow_mut(flow) {
            f.intake = intake;
        }
        // Each receiver is listed at most once between publishes, and a
        // flow's output once more (`Core::observe_output`): no allocation
        // on the packet path.
        let receivers: usize = self
            .flows
            .iter()
            .flatten()
            .map(|f| f.intake.receivers.len() + usize::from(f.intake.output.is_some()))
            .sum();
        self.health_unpublished.reserve(receivers);
        true
    }

    /// A datagram in, from any ingress: `datagram` is its payload, or why
    /// the ingress's parser rejected the frame; `receiver` is the
    /// flow's receiver it came in on (see the module), `now_ns` the
    /// batch's clock reading. What happened to it (`Full { newly: true }`:
    /// stop receiving on this flow until it resumes).
    #[inline]
    pub fn ingest(
        &mut self,
        flow: FlowId,
        receiver: LegId,
        datagram: Result<&[u8], mcrelay_wire::Reject>,
        now_ns: u64,
    ) -> Received {
        let Some(f) = self.flows.get_mut(flow.index()).and_then(Option::as_mut) else {
            return Received::Dropped;
        };
        let payload = match datagram {
            Ok(payload) => payload,
            Err(reason) => {
                f.counters.frames.count(reason);
                return Received::Dropped;
            }
        };
        let several = match f.intake.receivers.get_mut(receiver.index()) {
            Some(Receiver::Fec(media)) => {
                let media = *media;
                return self.receive_fec(flow, media, payload, now_ns);
            }
            Some(Receiver::Media(h)) => {
                // A RIST leg's retransmission repairs the stream its
                // receiver hands on (counted there: `rist.recovered`); the
                // leg's health is of the wire's original transmission, one
                // SSRC, its `lost` the path's loss before repair.
                let repair = !f.rist.is_empty()
                    && f.rist
                        .get(receiver.index())
                        .and_then(Option::as_deref)
                        .is_some_and(|r| r.is_retransmitted(payload));
                if !repair && h.observe_at(payload, now_ns) {
                    // Room reserved by `set_intake`.
                    self.health_unpublished.push((flow, receiver));
                }
                f.intake.output.is_some()
            }
            None => false,
        };
        let received = self.receive_on(flow, receiver, payload, now_ns);
        // One compare for a flow with one leg.
        if several
            && received == Received::Queued
            && let Some(out) = self
                .flows
                .get_mut(flow.index())
                .and_then(Option::as_mut)
                .and_then(|f| f.intake.output.as_deref_mut())
        {
            out.observe_at(payload, now_ns);
        }
        received
    }

    /// A datagram leg `leg`'s RIST receiver of `flow` released (held
    /// behind a gap, or a repair) went on through the redundancy rule:
    /// shown to the output's health, as [`Core::ingest`] shows those that
    /// go on at once (the output's health would otherwise count what a
    /// leg repaired or reordered as lost).
    pub(crate) fn observe_output(&mut self, flow: FlowId, leg: LegId, d: &[u8], now_ns: u64) {
        let Some(f) = self.flows.get_mut(flow.index()).and_then(Option::as_mut) else {
            return;
        };
        if let Some(out) = f.intake.output.as_deref_mut()
            && out.observe_at(d, now_ns)
        {
            // Room reserved by `set_intake`.
            self.health_unpublished.push((flow, leg));
        }
    }

    /// Publish the stream health of every receiver that took a datagram
    /// since the last call (and of its flow's output): once per
    /// completion batch, not per datagram.
    pub fn publish_health(&mut self) {
        for (flow, leg) in self.health_unpublished.drain(..) {
            let Some(f) = self.flows.get_mut(flow.index()).and_then(Option::as_mut) else {
                continue;
            };
            if let Some(Receiver::Media(h)) = f.intake.receivers.get_mut(leg.index()) {
                h.publish();
            }
            // A no-op when nothing went out, or published for another leg.
            if let Some(out) = f.intake.output.as_deref_mut() {
                out.publish();
            }
        }
    }

    /// Off the packet path, at most once per tick: every quiet input's
    /// missing RTP numbers counted lost ([`InputHealth::settle`]).
    pub fn settle_health(&mut self, now_ns: u64) {
        for f in self.flows.iter_mut().flatten() {
            for r in f.intake.receivers.iter_mut() {
                if let Receiver::Media(h) = r {
                    h.settle(now_ns);
                }
            }
            if let Some(out) = f.intake.output.as_deref_mut() {
                out.settle(now_ns);
            }
        }
    }

    /// The highest RTP number (and SSRC) leg `leg` of `flow` received, as
    /// its stream health saw it.
    pub fn leg_rtp_highest(&self, flow: FlowId, leg: LegId) -> Option<(u16, u32)> {
        self.flow(flow)?.intake.health(leg)?.rtp_highest()
    }
}

#[cfg(test)]
mod tests {
    use mcrelay_pool::{PoolConfig, PoolSet};
    use mcrelay_wire::health::Payload;
    use mcrelay_wire::{Reject, rtp};

    use super::*;
    use crate::counters::OutputCounters;
    use crate::{OutputSpec, Redundancy};

    const RTP: HealthSettings = HealthSettings {
        payload: Payload::Rtp,
        rtp_clock_hz: 90_000,
        silence_ms: 1000,
    };

    const MERGE: Redundancy = Redundancy::Merge {
        delay_ns: 0,
        window_ns: 1_000_000_000,
    };

    fn flow(legs: u8, redundancy: Redundancy) -> (Core, FlowId, Arc<FlowCounters>) {
        let mut core = Core::new(PoolSet::new(PoolConfig::default()).expect("pool"));
        let counters = Arc::<FlowCounters>::default();
        let out = OutputSpec {
            depth: 64,
            gso: false,
            counters: Arc::<OutputCounters>::default(),
            resume_after: None,
        };
        let id = core
            .add_flow([out], Arc::clone(&counters), legs, redundancy, 4)
            .expect("room");
        (core, id, counters)
    }

    fn pkt(seq: u16) -> Vec<u8> {
        let mut b = vec![0u8; 200];
        let _ = rtp::build(&mut b, 96, seq, u32::from(seq) * 10, 7);
        b
    }

    #[test]
    fn a_rejected_frame_is_counted_by_reason_and_goes_no_further() {
        let (mut core, f, c) = flow(1, Redundancy::Single);
        assert!(core.set_intake(f, RTP, &[]));
        let r = core.ingest(f, LegId(0), Err(Reject::BadChecksum), 5);
        assert_eq!(r, Received::Dropped);
        assert_eq!(c.frames.bad_checksum.get(), 1);
        assert_eq!(c.packets_in.get(), 0);
        core.publish_health();
        assert_eq!(c.health.last_arrival(), None, "not shown to health");
    }

    #[test]
    fn a_media_datagram_is_seen_by_its_legs_health_published_per_batch() {
        let (mut core, f, c) = flow(1, Redundancy::Single);
        assert!(core.set_intake(f, RTP, &[]));
        for seq in [1, 2, 4] {
            assert_eq!(
                core.ingest(f, LegId(0), Ok(&pkt(seq)), 100),
                Received::Queued
            );
        }
        assert_eq!(c.packets_in.get(), 3);
        assert_eq!(c.health.rtp_packets.get(), 0, "not yet published");
        core.publish_health();
        assert_eq!(c.health.rtp_packets.get(), 3);
        assert_eq!(c.health.last_arrival(), Some(100));
        assert_eq!(core.leg_rtp_highest(f, LegId(0)), Some((4, 7)));
    }

    #[test]
    fn without_an_intake_a_datagram_is_admitted_as_it_came() {
        let (mut core, f, c) = flow(1, Redundancy::Single);
        assert_eq!(core.ingest(f, LegId(0), Ok(&pkt(1)), 0), Received::Queued);
        core.publish_health();
        assert_eq!((c.packets_in.get(), c.health.rtp_packets.get()), (1, 0));
        let unknown = FlowId::new(3).expect("a number");
        assert_eq!(
            core.ingest(unknown, LegId(0), Ok(&pkt(1)), 0),
            Received::Dropped
        );
    }

    #[test]
    fn an_fec_receiver_feeds_its_media_legs_decoder_not_health() {
        let (mut core, f, c) = flow(1, Redundancy::Single);
        assert!(core.set_intake(f, RTP, &[LegId(0)]));
        assert!(core.fec_stats(f, LegId(0)).is_some(), "decoder enabled");
        // Not FEC: rejected by the decoder, counted as an FEC packet.
        core.ingest(f, LegId(1), Ok(&pkt(9)), 0);
        assert_eq!(c.fec.packets.get(), 1);
        assert_eq!(c.packets_in.get(), 0);
        core.publish_health();
        assert_eq!(c.health.rtp_packets.get(), 0);
    }

    #[test]
    fn receivers_must_name_media_legs_and_fit() {
        let (mut core, f, _) = flow(2, MERGE);
        assert!(!core.set_intake(f, RTP, &[LegId(2)]));
        assert!(!core.set_intake(f, RTP, &[LegId(0); 15]));
        assert!(core.set_intake(f, RTP, &[LegId(0); 14]));
        let unknown = FlowId::new(3).expect("a number");
        assert!(!core.set_intake(unknown, RTP, &[]));
    }

    #[test]
    fn a_merged_flows_output_health_sees_each_number_once() {
        let (mut core, f, c) = flow(2, MERGE);
        assert!(core.set_intake(f, RTP, &[]));
        for seq in 1..=5 {
            core.ingest(f, LegId(0), Ok(&pkt(seq)), 10);
            core.ingest(f, LegId(1), Ok(&pkt(seq)), 10);
        }
        core.publish_health();
        let legs = |i| c.leg_health(i).map(|h| h.rtp_packets.get());
        assert_eq!((legs(0), legs(1)), (Some(5), Some(5)));
        assert_eq!(c.output_health.rtp_packets.get(), 5, "duplicates not shown");
        assert_eq!(c.output_health.rtp_duplicates.get(), 0);
    }
}
