//! One RTP stream played onto several legs (the SMPTE 2022-7 tests): the
//! pure half of `loadgen legs` and `loadgen legs-recv`.
//!
//! * [`Plan`]: which leg sends which sequence number when. Losses are
//!   planted from a seed and are **disjoint** (no number is lost on two
//!   legs), a leg may run behind by a fixed delay, and a leg may stop for
//!   a range of numbers (and start again). [`Plan::schedule`] lists every
//!   send in time order.
//! * [`build`]: datagram `seq` of the stream: a 12-byte RTP header
//!   (version 2, the stream's SSRC, the low 16 bits of `seq`) followed by
//!   a [`payload`] datagram the receiver checks byte by byte.
//! * [`Output`]: what a receiver saw of the stream: missing, duplicated
//!   and late (arrived after a higher number) sequence numbers.
//! * [`SeqExtender`]: 16-bit RTP sequence numbers to a 64-bit index, for
//!   streams this module did not build (a recorded encoder's).
//! * [`write_record`] / [`read_records`]: a file of datagrams (each a
//!   32-bit big-endian length, then its bytes) for recording a stream once
//!   and playing it again.

use std::io::{self, Read, Write};
use std::ops::Range;
use std::time::Duration;

use crate::payload;

/// Bytes of the RTP fixed header [`build`] writes.
pub const RTP_HEADER: usize = 12;
/// Planted loss is drawn in parts per million.
const PPM: u64 = 1_000_000;

/// What one leg does.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LegSpec {
    /// Share of the stream this leg loses, in percent (0..=100).
    pub loss_percent: f64,
    /// How far this leg runs behind the stream's schedule.
    pub delay: Duration,
    /// Sequence numbers this leg does not send (stopped, then restarted).
    pub gaps: Vec<Range<u64>>,
}

/// Why a [`Plan`] cannot be made.
#[derive(Debug, Clone, PartialEq)]
pub enum PlanError {
    Legs(usize),
    Rate,
    Loss { leg: usize, percent: f64 },
    LossTotal(f64),
}

impl std::fmt::Display for PlanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Legs(n) => write!(f, "a plan needs 1 to 8 legs (--leg), not {n}"),
            Self::Rate => write!(f, "--rate must be above 0: the plan schedules every send"),
            Self::Loss { leg, percent } => {
                write!(f, "leg {leg}: --loss {percent} % is not within 0..=100")
            }
            Self::LossTotal(t) => write!(
                f,
                "the legs' --loss add up to {t} %: disjoint losses need at most 100 % in total"
            ),
        }
    }
}

impl std::error::Error for PlanError {}

/// A seeded plan: for `count` datagrams at `rate` per second, which leg
/// sends which sequence number, when.
#[derive(Debug, Clone)]
pub struct Plan {
    count: u64,
    rate: u64,
    seed: u64,
    legs: Vec<LegSpec>,
    /// Leg `k` loses `seq` when `draw(seq)` falls in `bounds[k]..bounds[k + 1]`.
    bounds: Vec<u64>,
}

/// splitmix64: a well-mixed 64-bit value per (seed, index).
fn mix(seed: u64, index: u64) -> u64 {
    let mut z = seed
        .wrapping_add(index.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `percent` as parts per million (rounded).
fn ppm(percent: f64) -> u64 {
    let v = (percent * 10_000.0).round();
    if v <= 0.0 {
        0
    } else if v >= 1e6 {
        PPM
    } else {
        // In 0..1e6: exact in an f64 and an u64.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let n = v as u64;
        n
    }
}

/// One send of the schedule: sequence number `seq` on leg `leg`, `at`
/// after the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub at: Duration,
    pub seq: u64,
    pub leg: usize,
}

impl Plan {
    pub fn new(count: u64, rate: u64, seed: u64, legs: Vec<LegSpec>) -> Result<Self, PlanError> {
        if legs.is_empty() || legs.len() > 8 {
            return Err(PlanError::Legs(legs.len()));
        }
        if rate == 0 {
            return Err(PlanError::Rate);
        }
        let mut bounds = vec![0u64];
        let mut total = 0.0;
        for (leg, l) in legs.iter().enumerate() {
            if !(0.0..=100.0).contains(&l.loss_percent) {
                return Err(PlanError::Loss {
                    leg,
                    percent: l.loss_percent,
                });
            }
            total += l.loss_percent;
            let last = bounds.last().copied().unwrap_or(0);
            bounds.push(last + ppm(l.loss_percent));
        }
        if bounds.last().copied().unwrap_or(0) > PPM {
            return Err(PlanError::LossTotal(total));
        }
        Ok(Self {
            count,
            rate,
            seed,
            legs,
            bounds,
        })
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn legs(&self) -> usize {
        self.legs.len()
    }

    /// `seq` is one of the losses planted on `leg`.
    pub fn loses(&self, leg: usize, seq: u64) -> bool {
        let draw = mix(self.seed, seq) % PPM;
        match (self.bounds.get(leg), self.bounds.get(leg + 1)) {
            (Some(&lo), Some(&hi)) => (lo..hi).contains(&draw),
            _ => false,
        }
    }

    /// `leg` is stopped at `seq` (inside one of its gaps).
    pub fn stopped(&self, leg: usize, seq: u64) -> bool {
        self.legs
            .get(leg)
            .is_some_and(|l| l.gaps.iter().any(|g| g.contains(&seq)))
    }

    /// `leg` sends `seq`: not lost, not stopped.
    pub fn sends(&self, leg: usize, seq: u64) -> bool {
        leg < self.legs.len() && !self.loses(leg, seq) && !self.stopped(leg, seq)
    }

    /// The sequence numbers `leg` does not send (planted losses and gaps).
    pub fn dropped(&self, leg: usize) -> Vec<u64> {
        (0..self.count).filter(|&s| !self.sends(leg, s)).collect()
    }

    /// The planted losses of `leg` (gaps not included).
    pub fn losses(&self, leg: usize) -> Vec<u64> {
        (0..self.count).filter(|&s| self.loses(leg, s)).collect()
    }

    /// When `seq` is due on `leg`: `seq / rate` plus the leg's delay.
    pub fn at(&self, leg: usize, seq: u64) -> Duration {
        let nanos = u128::from(seq) * 1_000_000_000 / u128::from(self.rate);
        let base = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        base + self.legs.get(leg).map_or(Duration::ZERO, |l| l.delay)
    }

    /// When the last send is due (every leg's last number, delay included).
    pub fn end(&self) -> Duration {
        let last = self.count.saturating_sub(1);
        (0..self.legs.len())
            .map(|leg| self.at(leg, last))
            .max()
            .unwrap_or_default()
    }

    /// Every send, in time order (a tie goes to the lower leg).
    pub fn schedule(&self) -> Schedule<'_> {
        Schedule {
            plan: self,
            next: vec![0; self.legs.len()],
        }
    }
}

/// The sends of a [`Plan`] in time order: a merge of each leg's own
/// (already ordered) sends.
#[derive(Debug)]
pub struct Schedule<'a> {
    plan: &'a Plan,
    /// Next sequence number to consider on each leg.
    next: Vec<u64>,
}

impl Iterator for Schedule<'_> {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        let p = self.plan;
        for (leg, n) in self.next.iter_mut().enumerate() {
            while *n < p.count && !p.sends(leg, *n) {
                *n += 1;
            }
        }
        let (leg, at) = self
            .next
            .iter()
            .enumerate()
            .filter(|&(_, &n)| n < p.count)
            .map(|(leg, &n)| (leg, p.at(leg, n)))
            .min_by_key(|&(leg, at)| (at, leg))?;
        let seq = self.next[leg];
        self.next[leg] += 1;
        Some(Event { at, seq, leg })
    }
}

/// Fill `buf` (its whole length is the datagram, at least [`RTP_HEADER`]
/// plus [`payload::HEADER_LEN`] bytes) with datagram `seq` of the stream:
/// RTP header (payload type `pt`, `ssrc`, sequence `seq` mod 2^16,
/// timestamp on a 90 kHz clock at `rate` datagrams a second), then the
/// checkable payload of run `run`.
pub fn build(buf: &mut [u8], pt: u8, ssrc: u32, run: u32, seq: u64, rate: u64) {
    let ticks = u128::from(seq) * 90_000 / u128::from(rate.max(1));
    let timestamp = u32::try_from(ticks & 0xffff_ffff).unwrap_or(0);
    write_rtp_header(buf, pt, seq16(seq), timestamp, ssrc);
    if let Some(body) = buf.get_mut(RTP_HEADER..) {
        payload::write(body, run, 0, seq);
    }
}

/// The low 16 bits of `seq`: its RTP sequence number.
pub fn seq16(seq: u64) -> u16 {
    u16::try_from(seq & 0xffff).unwrap_or(0)
}

/// Write an RTP fixed header (version 2, no padding, extension or CSRC).
pub fn write_rtp_header(buf: &mut [u8], pt: u8, sequence: u16, timestamp: u32, ssrc: u32) {
    if let Some(h) = buf.get_mut(..RTP_HEADER) {
        h[0] = 0x80;
        h[1] = pt & 0x7f;
        h[2..4].copy_from_slice(&sequence.to_be_bytes());
        h[4..8].copy_from_slice(&timestamp.to_be_bytes());
        h[8..12].copy_from_slice(&ssrc.to_be_bytes());
    }
}

/// The fields of a received RTP header this module checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rtp {
    pub sequence: u16,
    pub timestamp: u32,
    pub ssrc: u32,
    /// The payload: after the CSRC list and extension, before padding.
    pub payload: Range<usize>,
}

/// Read the RTP header of `d`; `None` unless it is RTP version 2 whose
/// CSRC list, extension and padding fit in the datagram.
pub fn parse_rtp(d: &[u8]) -> Option<Rtp> {
    let h = d.get(..RTP_HEADER)?;
    if h[0] >> 6 != 2 {
        return None;
    }
    let mut start = RTP_HEADER + 4 * usize::from(h[0] & 0x0f);
    if h[0] & 0x10 != 0 {
        let len = d.get(start + 2..start + 4)?;
        start += 4 + 4 * usize::from(u16::from_be_bytes([len[0], len[1]]));
    }
    let mut end = d.len();
    if h[0] & 0x20 != 0 {
        end = end.checked_sub(usize::from(*d.last()?))?;
    }
    if start > end {
        return None;
    }
    Some(Rtp {
        sequence: u16::from_be_bytes([h[2], h[3]]),
        timestamp: u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
        ssrc: u32::from_be_bytes([h[8], h[9], h[10], h[11]]),
        payload: start..end,
    })
}

/// 16-bit RTP sequence numbers, counted from a first one, as a 64-bit
/// index that keeps counting across wraps: each number is placed nearest
/// the highest index so far.
#[derive(Debug, Clone)]
pub struct SeqExtender {
    first: u16,
    highest: u64,
}

impl SeqExtender {
    /// Index 0 is RTP sequence number `first`.
    pub fn new(first: u16) -> Self {
        Self { first, highest: 0 }
    }

    pub fn extend(&mut self, sequence: u16) -> u64 {
        let low = u64::from(sequence.wrapping_sub(self.first));
        let base = self.highest & !0xffff;
        let candidates = [
            base.checked_sub(0x1_0000),
            Some(base),
            base.checked_add(0x1_0000),
        ];
        let index = candidates
            .into_iter()
            .flatten()
            .map(|b| b | low)
            .min_by_key(|&i| i.abs_diff(self.highest))
            .unwrap_or(low);
        self.highest = self.highest.max(index);
        index
    }
}

/// What a receiver saw of a stream of `expect` sequence numbers
/// (`0..expect`).
#[derive(Debug, Clone)]
pub struct Output {
    expect: u64,
    /// Arrivals per sequence number below `expect` (saturating).
    arrivals: Vec<u8>,
    highest: Option<u64>,
    /// Arrivals in all, valid ones of the stream only.
    pub received: u64,
    /// Sequence numbers at or above `expect`.
    pub beyond: u64,
    /// Arrived after a higher number had, in arrival order.
    pub late: Vec<u64>,
    /// Most numbers a late arrival was behind the highest.
    pub max_lateness: u64,
}

impl Output {
    pub fn new(expect: u64) -> Self {
        Self {
            expect,
            arrivals: vec![0; usize::try_from(expect).unwrap_or(usize::MAX)],
            highest: None,
            received: 0,
            beyond: 0,
            late: Vec::new(),
            max_lateness: 0,
        }
    }

    /// Sequence number `seq` arrived.
    pub fn on_seq(&mut self, seq: u64) {
        self.received += 1;
        if let Some(h) = self.highest.filter(|&h| seq < h) {
            self.late.push(seq);
            self.max_lateness = self.max_lateness.max(h - seq);
        }
        self.highest = Some(self.highest.map_or(seq, |h| h.max(seq)));
        match usize::try_from(seq)
            .ok()
            .and_then(|i| self.arrivals.get_mut(i))
        {
            Some(a) => *a = a.saturating_add(1),
            None => self.beyond += 1,
        }
    }

    /// Numbers in `0..expect` that never arrived.
    pub fn missing(&self) -> Vec<u64> {
        self.numbers(|a| a == 0)
    }

    /// Numbers that arrived more than once (each listed once).
    pub fn duplicated(&self) -> Vec<u64> {
        self.numbers(|a| a > 1)
    }

    /// Extra copies in all (a number that came 3 times counts 2).
    pub fn duplicates(&self) -> u64 {
        self.arrivals
            .iter()
            .map(|&a| u64::from(a.saturating_sub(1)))
            .sum()
    }

    /// The longest run of consecutive missing numbers.
    pub fn longest_gap(&self) -> u64 {
        let (mut run, mut best) = (0u64, 0u64);
        for &a in &self.arrivals {
            run = if a == 0 { run + 1 } else { 0 };
            best = best.max(run);
        }
        best
    }

    pub fn expect(&self) -> u64 {
        self.expect
    }

    fn numbers(&self, keep: impl Fn(u8) -> bool) -> Vec<u64> {
        (0..self.expect)
            .zip(&self.arrivals)
            .filter(|&(_, &a)| keep(a))
            .map(|(s, _)| s)
            .collect()
    }
}

/// Append one datagram to a record file.
pub fn write_record(out: &mut impl Write, datagram: &[u8]) -> io::Result<()> {
    let len = u32::try_from(datagram.len()).map_err(|_| io::ErrorKind::InvalidInput)?;
    out.write_all(&len.to_be_bytes())?;
    out.write_all(datagram)
}

/// Every datagram of a record file.
pub fn read_records(mut input: impl Read) -> io::Result<Vec<Vec<u8>>> {
    let mut all = Vec::new();
    input.read_to_end(&mut all)?;
    let mut out = Vec::new();
    let mut rest = all.as_slice();
    while !rest.is_empty() {
        let (len, tail) = rest
            .split_first_chunk::<4>()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "cut-off record length"))?;
        let len = usize::try_from(u32::from_be_bytes(*len)).unwrap_or(usize::MAX);
        let d = tail
            .get(..len)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "cut-off record"))?;
        out.push(d.to_vec());
        rest = &tail[len..];
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn legs(losses: &[f64], delays_ms: &[u64]) -> Vec<LegSpec> {
        losses
            .iter()
            .zip(delays_ms)
            .map(|(&loss_percent, &d)| LegSpec {
                loss_percent,
                delay: Duration::from_millis(d),
                gaps: Vec::new(),
            })
            .collect()
    }

    proptest! {
        #[test]
        fn losses_are_disjoint_and_every_number_is_sent_somewhere(seed: u64, a in 0.0..50.0f64, b in 0.0..50.0f64) {
            let p = Plan::new(5000, 1000, seed, legs(&[a, b], &[0, 20])).expect("plan");
            for s in 0..5000 {
                prop_assert!(!(p.loses(0, s) && p.loses(1, s)), "{s} lost on both legs");
                prop_assert!(p.sends(0, s) || p.sends(1, s));
            }
        }

        #[test]
        fn the_schedule_is_in_time_order_and_complete(seed: u64, d in 0u64..100, gap_from in 0u64..500, gap_len in 0u64..500) {
            let mut l = legs(&[5.0, 5.0], &[0, d]);
            l[0].gaps.push(gap_from..gap_from + gap_len);
            let p = Plan::new(1000, 1000, seed, l).expect("plan");
            let events: Vec<Event> = p.schedule().collect();
            prop_assert!(events.windows(2).all(|w| w[0].at <= w[1].at));
            for leg in 0..2 {
                let sent: Vec<u64> = events.iter().filter(|e| e.leg == leg).map(|e| e.seq).collect();
                let want: Vec<u64> = (0..1000).filter(|&s| p.sends(leg, s)).collect();
                prop_assert_eq!(sent, want);
            }
            for e in &events {
                prop_assert_eq!(e.at, p.at(e.leg, e.seq));
            }
        }
    }

    #[test]
    fn losses_come_near_the_asked_share_and_depend_only_on_the_seed() {
        let p = Plan::new(100_000, 1000, 7, legs(&[5.0, 5.0], &[0, 20])).expect("plan");
        for leg in 0..2 {
            let n = p.losses(leg).len();
            assert!((4_500..=5_500).contains(&n), "leg {leg}: {n} of 100000");
        }
        let again = Plan::new(100_000, 1000, 7, legs(&[5.0, 5.0], &[0, 20])).expect("plan");
        assert_eq!(p.losses(0), again.losses(0));
        let other = Plan::new(100_000, 1000, 8, legs(&[5.0, 5.0], &[0, 20])).expect("plan");
        assert_ne!(p.losses(0), other.losses(0));
        let none = Plan::new(1000, 1000, 7, legs(&[0.0, 0.0], &[0, 0])).expect("plan");
        assert!(none.dropped(0).is_empty() && none.dropped(1).is_empty());
    }

    #[test]
    fn a_delayed_leg_sends_each_number_after_the_other_has_sent_later_ones() {
        // 1000/s and 20 ms: leg 1 sends n together with leg 0's n + 20
        // (the tie to leg 0), before leg 0's n + 21.
        let p = Plan::new(200, 1000, 1, legs(&[0.0, 0.0], &[0, 20])).expect("plan");
        let order: Vec<(usize, u64)> = p.schedule().map(|e| (e.leg, e.seq)).collect();
        let pos = |leg, seq| order.iter().position(|&x| x == (leg, seq)).expect("sent");
        for n in 0..150 {
            assert!(pos(1, n) > pos(0, n + 20), "{n}");
            assert!(pos(1, n) < pos(0, n + 21), "{n}");
        }
        assert_eq!(p.at(1, 0), Duration::from_millis(20));
        assert_eq!(p.end(), Duration::from_millis(199 + 20));
    }

    #[test]
    fn a_gap_stops_a_leg_and_it_starts_again() {
        let mut l = legs(&[0.0, 0.0], &[0, 0]);
        l[0].gaps.push(100..300);
        let p = Plan::new(1000, 1000, 1, l).expect("plan");
        assert_eq!(p.dropped(0), (100..300).collect::<Vec<u64>>());
        assert!(p.losses(0).is_empty());
        assert!(p.dropped(1).is_empty());
        assert!(p.sends(0, 99) && !p.sends(0, 100) && !p.sends(0, 299) && p.sends(0, 300));
    }

    #[test]
    fn bad_plans_are_refused() {
        assert_eq!(
            Plan::new(1, 1000, 1, legs(&[60.0, 50.0], &[0, 0])).err(),
            Some(PlanError::LossTotal(110.0))
        );
        assert!(Plan::new(1, 0, 1, legs(&[0.0], &[0])).is_err());
        assert!(Plan::new(1, 10, 1, Vec::new()).is_err());
        assert!(Plan::new(1, 10, 1, legs(&[-1.0], &[0])).is_err());
    }

    #[test]
    fn datagrams_carry_rtp_and_a_checkable_payload() {
        let mut d = vec![0u8; 1328];
        build(&mut d, 96, 0xabcd, 3, 70_000, 1000);
        let h = parse_rtp(&d).expect("rtp");
        assert_eq!(h.sequence, seq16(70_000));
        assert_eq!(h.ssrc, 0xabcd);
        assert_eq!(h.payload, RTP_HEADER..1328);
        let p = payload::check(&d[RTP_HEADER..], 3).expect("payload");
        assert_eq!(p.sequence, 70_000);
        assert!(parse_rtp(&d[..11]).is_none());
        d[0] = 0x40;
        assert!(parse_rtp(&d).is_none());
    }

    #[test]
    fn the_output_lists_missing_duplicated_and_late_numbers() {
        let mut o = Output::new(10);
        for s in [0, 1, 3, 4, 2, 4, 6, 9, 7, 12] {
            o.on_seq(s);
        }
        assert_eq!(o.missing(), vec![5, 8]);
        assert_eq!(o.duplicated(), vec![4]);
        assert_eq!(o.duplicates(), 1);
        assert_eq!(o.late, vec![2, 7]);
        assert_eq!(o.max_lateness, 2);
        assert_eq!(o.beyond, 1);
        assert_eq!(o.longest_gap(), 1);
        assert_eq!(o.received, 10);
    }

    #[test]
    fn sequence_numbers_extend_across_wraps() {
        let mut x = SeqExtender::new(65_530);
        let got: Vec<u64> = [65_530u16, 65_535, 0, 3, 1, 65_534, 10]
            .into_iter()
            .map(|s| x.extend(s))
            .collect();
        assert_eq!(got, vec![0, 5, 6, 9, 7, 4, 16]);
        let mut x = SeqExtender::new(0);
        let mut last = 0;
        for i in 0..200_000u64 {
            last = x.extend(seq16(i));
            assert_eq!(last, i);
        }
        assert_eq!(last, 199_999);
    }

    #[test]
    fn records_round_trip() {
        let mut f = Vec::new();
        for d in [&b"abc"[..], b"", &[7u8; 1500]] {
            write_record(&mut f, d).expect("write");
        }
        let back = read_records(f.as_slice()).expect("read");
        assert_eq!(back, vec![b"abc".to_vec(), Vec::new(), vec![7u8; 1500]]);
        assert!(read_records(&f[..f.len() - 1]).is_err());
    }
}
