//! `rtp_rewrite`: one RTP stream out of a failover flow, whichever leg
//! it comes from. Two encoders feeding the legs of a failover flow (the
//! usual main and backup) each have their own SSRC, sequence numbers and
//! timestamps; forwarded as they are, a switch glues two streams
//! together and an RFC 3550 receiver sees numbers jump (often backwards:
//! "too late", dropped) and a new source. With the rewrite, every
//! datagram leaves with one SSRC (the first stream's), sequence numbers
//! that continue by one across a switch, and timestamps that continue by
//! the time between the last datagram of the old leg and the first of
//! the new one, in the flow's RTP clock.
//!
//! A *mapping* ties the stream being forwarded (its leg and SSRC) to the
//! output: a sequence offset and a timestamp offset. It is set (anchored)
//! by the first datagram of a new stream: after a switch, an SSRC change
//! on the same leg (an encoder restart), or a sequence jump of more than
//! [`MAX_DROPOUT`] ahead or [`MAX_MISORDER`] back on the same stream
//! (a restart keeping its SSRC). A datagram of the mapped stream from
//! before its anchor would take a number already sent: it is `late`.
//!
//! The header fields are rewritten in the pool buffer, after the payload
//! was copied in and before any send is queued (12 bytes at fixed
//! offsets, no allocation); the receive buffer is never written.

use mcrelay_wire::rtp::{MAX_DROPOUT, MAX_MISORDER, RtpHeader};

use super::LegId;

/// Where the output stands and how the forwarded stream maps onto it.
#[derive(Debug, Clone)]
pub(crate) struct Rewrite {
    /// The RTP clock rate.
    clock_hz: u32,
    /// The output's SSRC: the first forwarded stream's.
    ssrc: Option<u32>,
    /// The mapped stream (leg, SSRC); `None` before the first datagram.
    source: Option<(LegId, u32)>,
    /// The mapped stream's first (anchor) and highest sequence numbers.
    anchor_seq: u16,
    top_seq: u16,
    seq_offset: u16,
    ts_offset: u32,
    /// The highest output sequence number sent, its timestamp and when.
    out_seq: u16,
    out_ts: u32,
    out_ns: u64,
}

/// The output header of a datagram, or why it doesn't go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mapped {
    Out {
        seq: u16,
        timestamp: u32,
        ssrc: u32,
    },
    /// From before its stream's anchor: its number was taken.
    Late,
}

fn distance(a: u16, b: u16) -> i64 {
    i64::from(i16::from_ne_bytes(a.wrapping_sub(b).to_ne_bytes()))
}

impl Rewrite {
    /// A rewrite for a stream with an RTP clock of `clock_hz`.
    pub(crate) fn new(clock_hz: u32) -> Self {
        Self {
            clock_hz,
            ssrc: None,
            source: None,
            anchor_seq: 0,
            top_seq: 0,
            seq_offset: 0,
            ts_offset: 0,
            out_seq: 0,
            out_ts: 0,
            out_ns: 0,
        }
    }

    /// Map `h`, a datagram of `leg` the failover rule forwards at `now`;
    /// moves the output on. No allocation, no panic.
    pub(crate) fn map(&mut self, leg: LegId, h: &RtpHeader, now: u64) -> Mapped {
        let same = self.source == Some((leg, h.ssrc));
        let step = distance(h.sequence, self.top_seq);
        if !same || !(-MAX_MISORDER..=MAX_DROPOUT).contains(&step) {
            self.anchor(leg, h, now);
        } else if distance(h.sequence, self.anchor_seq) < 0 {
            return Mapped::Late;
        }
        let seq = h.sequence.wrapping_add(self.seq_offset);
        let timestamp = h.timestamp.wrapping_add(self.ts_offset);
        if distance(h.sequence, self.top_seq) > 0 {
            self.top_seq = h.sequence;
        }
        if distance(seq, self.out_seq) > 0 || self.ssrc.is_none() {
            self.out_seq = seq;
            self.out_ts = timestamp;
            self.out_ns = now;
        }
        let ssrc = *self.ssrc.get_or_insert(h.ssrc);
        Mapped::Out {
            seq,
            timestamp,
            ssrc,
        }
    }

    /// Start mapping `h`'s stream: its number follows the highest sent,
    /// its timestamp the last one sent plus the time since, in clock
    /// units. The first stream maps onto itself.
    fn anchor(&mut self, leg: LegId, h: &RtpHeader, now: u64) {
        self.source = Some((leg, h.ssrc));
        self.anchor_seq = h.sequence;
        self.top_seq = h.sequence;
        if self.ssrc.is_none() {
            self.seq_offset = 0;
            self.ts_offset = 0;
            return;
        }
        let next = self.out_seq.wrapping_add(1);
        self.seq_offset = next.wrapping_sub(h.sequence);
        let elapsed = now.saturating_sub(self.out_ns);
        // Elapsed time in clock units, modulo 2^32 as RTP timestamps
        // wrap; at least one, so the new stream's first timestamp is after
        // the last one sent. Exact: 2^64 ns times 2^32 Hz fits in u128.
        let units = u128::from(elapsed) * u128::from(self.clock_hz) / 1_000_000_000;
        let units = u32::try_from(units & 0xffff_ffff).unwrap_or(0).max(1);
        self.ts_offset = self.out_ts.wrapping_add(units).wrapping_sub(h.timestamp);
    }
}

/// Write the mapped fields into the RTP header at the start of `d` (at
/// least 12 bytes, as [`mcrelay_wire::rtp::parse`] checked); a shorter
/// buffer is left alone.
pub(crate) fn write(d: &mut [u8], seq: u16, timestamp: u32, ssrc: u32) {
    if let Some(h) = d.get_mut(2..12) {
        h[0..2].copy_from_slice(&seq.to_be_bytes());
        h[2..6].copy_from_slice(&timestamp.to_be_bytes());
        h[6..10].copy_from_slice(&ssrc.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcrelay_wire::rtp;

    const MS: u64 = 1_000_000;

    fn hdr(seq: u16, ts: u32, ssrc: u32) -> RtpHeader {
        let mut b = [0u8; 16];
        let _ = rtp::build(&mut b, 96, seq, ts, ssrc);
        rtp::parse(&b).expect("rtp")
    }

    fn out(m: Mapped) -> (u16, u32, u32) {
        match m {
            Mapped::Out {
                seq,
                timestamp,
                ssrc,
            } => (seq, timestamp, ssrc),
            Mapped::Late => panic!("late"),
        }
    }

    /// 90 kHz, a datagram per ms (90 units).
    fn feed(
        r: &mut Rewrite,
        leg: u8,
        ssrc: u32,
        seqs: std::ops::Range<u16>,
        t0: u64,
    ) -> Vec<(u16, u32, u32)> {
        seqs.enumerate()
            .map(|(i, s)| {
                let now = t0 + i as u64 * MS;
                out(r.map(
                    LegId(leg),
                    &hdr(s, u32::from(s).wrapping_mul(90).wrapping_add(ssrc), ssrc),
                    now,
                ))
            })
            .collect()
    }

    fn continuous(o: &[(u16, u32, u32)]) {
        for w in o.windows(2) {
            assert_eq!(w[1].0, w[0].0.wrapping_add(1), "{w:?}");
            assert_eq!(w[1].2, w[0].2, "one SSRC: {w:?}");
            let dt = w[1].1.wrapping_sub(w[0].1);
            assert!((1..=20_000).contains(&dt), "timestamps continue: {w:?}");
        }
    }

    #[test]
    fn the_first_stream_passes_unchanged() {
        let mut r = Rewrite::new(90_000);
        let o = feed(&mut r, 0, 7, 100..110, 0);
        assert_eq!(o[0], (100, 100 * 90 + 7, 7));
        assert_eq!(o[9], (109, 109 * 90 + 7, 7));
    }

    /// Main and backup from independent encoders: the backup's numbers
    /// are far below (a switch to lower numbers made receivers drop
    /// everything as "too late"), its SSRC and timestamps its own. The
    /// output continues by one number, one SSRC, and timestamps by the
    /// time between the two legs' datagrams; the revert likewise.
    #[test]
    fn a_switch_and_a_revert_continue_one_stream() {
        let mut r = Rewrite::new(90_000);
        let mut o = feed(&mut r, 0, 0xaaaa, 50_000..50_100, 0);
        // 100 ms of silence on leg 0, then leg 1 from 1200.
        o.extend(feed(&mut r, 1, 0xbbbb, 1200..1300, 200 * MS));
        // Back to leg 0, whose encoder went on numbering meanwhile.
        o.extend(feed(&mut r, 0, 0xaaaa, 50_400..50_500, 300 * MS));
        continuous(&o);
        assert_eq!(o[100].0, 50_100);
        // 101 ms from the last leg-0 datagram: 9090 units on.
        assert_eq!(o[100].1.wrapping_sub(o[99].1), 101 * 90);
        assert_eq!(o.len(), 300);
    }

    #[test]
    fn a_restart_on_the_same_leg_is_anchored_too() {
        let mut r = Rewrite::new(90_000);
        let mut o = feed(&mut r, 0, 1, 1000..1100, 0);
        // The encoder restarts: same SSRC, numbers 1000 back.
        o.extend(feed(&mut r, 0, 1, 0..100, 100 * MS));
        // A new SSRC on the same leg.
        o.extend(feed(&mut r, 0, 2, 7..107, 200 * MS));
        continuous(&o);
    }

    #[test]
    fn numbers_from_before_the_anchor_are_late_and_reordering_passes() {
        let mut r = Rewrite::new(90_000);
        feed(&mut r, 0, 1, 0..10, 0);
        let first = out(r.map(LegId(1), &hdr(500, 0, 2), 20 * MS));
        assert_eq!(first.0, 10);
        assert_eq!(r.map(LegId(1), &hdr(499, 0, 2), 21 * MS), Mapped::Late);
        // Reordered within the new stream: mapped by its offset.
        assert_eq!(out(r.map(LegId(1), &hdr(502, 0, 2), 22 * MS)).0, 12);
        assert_eq!(out(r.map(LegId(1), &hdr(501, 0, 2), 23 * MS)).0, 11);
        assert_eq!(out(r.map(LegId(1), &hdr(503, 0, 2), 24 * MS)).0, 13);
    }

    #[test]
    fn sequence_and_timestamp_wrap() {
        let mut r = Rewrite::new(90_000);
        let o = feed(&mut r, 0, 1, 65_530..65_535, 0);
        let mut all = o;
        all.extend(feed(&mut r, 1, 2, 10..20, 10 * MS));
        continuous(&all);
        assert_eq!(all[5].0, 65_535);
        assert_eq!(all[6].0, 0);
        let mut b = [0u8; 20];
        let _ = rtp::build(&mut b, 96, 1, 2, 3);
        write(&mut b, 0xfffe, 0xffff_fff0, 0x0102_0304);
        let h = rtp::parse(&b).expect("rtp");
        assert_eq!(
            (h.sequence, h.timestamp, h.ssrc, h.payload_type),
            (0xfffe, 0xffff_fff0, 0x0102_0304, 96)
        );
        let mut short = [0u8; 5];
        write(&mut short, 1, 2, 3);
        assert_eq!(short, [0u8; 5]);
    }
}

/// Through the core: a failover flow's output read back from the pool
/// buffers its sends carry.
#[cfg(test)]
mod through_the_core {
    use std::sync::Arc;

    use mcrelay_pool::{PoolConfig, PoolSet};

    use crate::counters::{FlowCounters, OutputCounters};
    use crate::{Core, LegId, OutputSpec, Redundancy, SendKind, SendToken};

    const MS: u64 = 1_000_000;

    /// Two independent encoders: leg 0 (SSRC 0xa, numbers from 50 000,
    /// timestamps from 7) and leg 1 (SSRC 0xb, from 1200, timestamps from
    /// 3 000 000 000), a datagram per ms each. Leg 0 is silent from 100
    /// to 400 ms; the flow fails over after 50 ms of silence and reverts
    /// 100 ms after leg 0 is back. The (seq, timestamp, ssrc) that left.
    fn run(rtp_rewrite: Option<u32>) -> (Vec<(u16, u32, u32)>, Arc<FlowCounters>) {
        let mut core = Core::new(
            PoolSet::new(PoolConfig {
                small: 64,
                standard: 64,
                jumbo: 8,
            })
            .expect("pool"),
        );
        let counters = Arc::<FlowCounters>::default();
        let spec = OutputSpec {
            depth: 64,
            gso: false,
            counters: Arc::<OutputCounters>::default(),
            resume_after: None,
        };
        let redundancy = Redundancy::Failover {
            after_ns: 50 * MS,
            revert_after_ns: Some(100 * MS),
            rtp: true,
            rtp_rewrite,
            gap_factor: 0,
        };
        let flow = core
            .add_flow([spec], Arc::clone(&counters), 2, redundancy, 8)
            .expect("room");
        let mut sent = Vec::new();
        for i in 0..800u16 {
            let now = u64::from(i) * MS;
            let legs = [
                (0u8, 50_000u16.wrapping_add(i), 7 + u32::from(i) * 90, 0xa),
                (1, 1200 + i, 3_000_000_000 + u32::from(i) * 90, 0xb),
            ];
            for (leg, seq, ts, ssrc) in legs {
                if leg == 0 && (100..400).contains(&i) {
                    continue;
                }
                let mut d = [0u8; 100];
                let _ = mcrelay_wire::rtp::build(&mut d, 33, seq, ts, ssrc);
                core.receive_on(flow, LegId(leg), &d, now);
            }
            core.tick(now);
            let mut tokens = Vec::new();
            core.flush(&mut |req, in_flight| {
                let SendKind::Plain { slot } = req.kind else {
                    panic!("no GSO asked");
                };
                let len = in_flight.buffer(slot).expect("in flight").len();
                tokens.push((req.token(), len));
                true
            });
            for (token, len) in tokens {
                let SendToken::Plain { slot, .. } = token else {
                    unreachable!()
                };
                let buf = core.in_flight().buffer(slot).expect("in flight");
                let h = mcrelay_wire::rtp::parse(core.pool().bytes(buf)).expect("rtp");
                sent.push((h.sequence, h.timestamp, h.ssrc));
                core.complete(token, i32::try_from(len).expect("small"), &mut |_, _| true);
            }
        }
        (sent, counters)
    }

    #[test]
    fn the_output_is_one_stream_across_a_failover_and_a_revert() {
        let (sent, counters) = run(Some(90_000));
        let red = &counters.redundancy;
        assert_eq!(red.switches.get(), 2, "a failover and a revert");
        // Leg 0 until its silence is noticed, leg 1 until the revert,
        // leg 0 again: about 750 datagrams, every forwarded one sent.
        assert_eq!(sent.len() as u64, red.forwarded_total());
        assert!(sent.len() > 700, "{}", sent.len());
        for w in sent.windows(2) {
            assert_eq!(w[1].0, w[0].0.wrapping_add(1), "{w:?}");
            assert_eq!(w[1].2, 0xa, "one SSRC: {w:?}");
            let dt = w[1].1.wrapping_sub(w[0].1);
            assert!((1..=60 * 90).contains(&dt), "timestamps go on: {w:?}");
        }
        assert_eq!(red.duplicates.get() + red.late.get(), 0);
    }

    /// The same without `rtp_rewrite`: two streams glued together, the
    /// numbers going back at the switch (what made receivers drop the
    /// backup's packets as too late).
    #[test]
    fn without_it_the_output_is_two_streams() {
        let (sent, _) = run(None);
        let ssrcs: Vec<u32> = sent.iter().map(|s| s.2).collect();
        assert!(ssrcs.contains(&0xa) && ssrcs.contains(&0xb));
        assert!(
            sent.windows(2).any(|w| w[1].0 != w[0].0.wrapping_add(1)),
            "a jump at the switch"
        );
    }
}
