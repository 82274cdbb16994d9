//! One-way latency: the sender's clock stamp in each payload, and the
//! receiver's preallocated histogram of delays with its percentiles.
//!
//! **The stamp.** With `loadgen send --timestamp`, bytes 24..32 of every
//! datagram (the first word of the [`payload`] pattern) carry the sender's
//! `CLOCK_MONOTONIC` in ns, read just before the datagram's `sendmmsg`,
//! XORed into the pattern word (big-endian), so an unstamped datagram reads
//! as stamp 0: none. `CLOCK_MONOTONIC` is one clock for every network namespace
//! of a host, so a receiver in another namespace subtracts it directly.
//! The receiver takes the stamp out and puts the pattern word back
//! ([`take_stamp`]) before it checks the datagram, so stamped datagrams are
//! still checked byte by byte (all but the 8 stamp bytes themselves).
//! Datagrams shorter than [`MIN_STAMPED_LEN`] carry no stamp.
//!
//! **The receive time.** `loadgen recv --latency` turns on `SO_TIMESTAMPNS`:
//! the kernel stamps each packet (`CLOCK_REALTIME`) when it enters the
//! receiving namespace's stack, before any queueing towards the receiver
//! process, so the receiver's own scheduling delay is not counted. The
//! receiver converts it to `CLOCK_MONOTONIC` with an offset sampled once per
//! receive batch ([`ClockOffset`]: both clocks are slewed alike by NTP, so
//! only a step of the wall clock moves the offset, and the next batch picks
//! it up). A datagram without a kernel stamp is timed by the receiver's own
//! `CLOCK_MONOTONIC` reading after its `recvmmsg` returned, and counted
//! apart (`user_stamped`).
//!
//! **The histogram** ([`Histogram`]) is log-linear: exact below 128 ns,
//! then 128 buckets per power of two (relative resolution better than
//! 0.8 %), 7424 counters allocated once, so recording is a few instructions
//! and never allocates.
//!
//! [`payload`]: crate::payload

use crate::payload::{self, HEADER_LEN, MAGIC};

/// Where the stamp sits: the first pattern word after the header.
pub const STAMP_AT: usize = HEADER_LEN;
/// Datagrams shorter than this carry no stamp.
pub const MIN_STAMPED_LEN: usize = STAMP_AT + 8;

/// The 8 pattern bytes a datagram of `sequence` has at [`STAMP_AT`]: they
/// depend only on the sequence number and the offset, so build the first
/// 32 bytes of that datagram.
fn pattern_word(sequence: u64) -> u64 {
    let mut start = [0u8; MIN_STAMPED_LEN];
    payload::write(&mut start, 0, 0, sequence);
    let mut word = [0u8; 8];
    word.copy_from_slice(&start[STAMP_AT..]);
    u64::from_be_bytes(word)
}

/// The sequence number in the header of `buf`, if it is a loadgen
/// datagram long enough to carry a stamp.
fn stampable(buf: &[u8]) -> Option<u64> {
    let magic = u32::from_be_bytes(buf.get(0..4)?.try_into().ok()?);
    if magic != MAGIC || buf.len() < MIN_STAMPED_LEN {
        return None;
    }
    Some(u64::from_be_bytes(buf.get(8..16)?.try_into().ok()?))
}

/// Write the send time `mono_ns` (non-zero) into datagram `buf`, already
/// built with [`payload::write`]: XORed into the pattern word at
/// [`STAMP_AT`], so a datagram sent without a stamp reads as stamp 0, i.e.
/// none. False (and nothing written) if it is too short.
pub fn stamp(buf: &mut [u8], mono_ns: u64) -> bool {
    let Some(sequence) = stampable(buf) else {
        return false;
    };
    let word = pattern_word(sequence) ^ mono_ns;
    match buf.get_mut(STAMP_AT..MIN_STAMPED_LEN) {
        Some(slot) => {
            slot.copy_from_slice(&word.to_be_bytes());
            true
        }
        None => false,
    }
}

/// Take the send time out of a received datagram and restore the pattern
/// word it was XORed into, so [`payload::check`] sees the datagram as
/// built. `None` (and `buf` untouched) for a datagram sent without a stamp,
/// too short to carry one, or without the loadgen magic.
pub fn take_stamp(buf: &mut [u8]) -> Option<u64> {
    let sequence = stampable(buf)?;
    let slot = buf.get_mut(STAMP_AT..MIN_STAMPED_LEN)?;
    let expected = pattern_word(sequence);
    let sent = u64::from_be_bytes((&*slot).try_into().ok()?) ^ expected;
    if sent == 0 {
        return None;
    }
    slot.copy_from_slice(&expected.to_be_bytes());
    Some(sent)
}

/// Tries of [`ClockOffset::sample`] at most.
const SAMPLE_TRIES: usize = 8;
/// A gap between the two monotonic readings this short means the thread
/// was not descheduled in between: no further try.
const TIGHT_GAP_NS: u64 = 2_000;

/// `CLOCK_REALTIME − CLOCK_MONOTONIC`, to convert kernel receive stamps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockOffset {
    realtime_minus_monotonic: i128,
}

impl ClockOffset {
    /// From a `CLOCK_REALTIME` reading taken between two `CLOCK_MONOTONIC`
    /// readings (the offset's error is at most half their gap, tens of ns).
    pub fn from_readings(mono_before: u64, realtime: u64, mono_after: u64) -> Self {
        let mono = (i128::from(mono_before) + i128::from(mono_after)) / 2;
        Self {
            realtime_minus_monotonic: i128::from(realtime) - mono,
        }
    }

    /// Read the clocks now: the tightest of a few tries, since a thread
    /// descheduled between two readings (a loaded machine) would put the
    /// offset off by up to half the time it was away.
    pub fn sample() -> Self {
        let read = || {
            let before = crate::sock::monotonic_ns();
            let realtime = crate::sock::realtime_ns();
            let after = crate::sock::monotonic_ns();
            (
                after.saturating_sub(before),
                Self::from_readings(before, realtime, after),
            )
        };
        let mut best = read();
        for _ in 1..SAMPLE_TRIES {
            if best.0 < TIGHT_GAP_NS {
                break;
            }
            let next = read();
            if next.0 < best.0 {
                best = next;
            }
        }
        best.1
    }

    /// The delay from `sent_mono` (`CLOCK_MONOTONIC` ns) to the kernel
    /// receive stamp `received_realtime` (`CLOCK_REALTIME` ns); negative if
    /// the stamp is earlier (then the clocks disagree).
    pub fn delay_ns(self, sent_mono: u64, received_realtime: u64) -> i64 {
        let received_mono = i128::from(received_realtime) - self.realtime_minus_monotonic;
        let d = received_mono - i128::from(sent_mono);
        i64::try_from(d).unwrap_or(if d < 0 { i64::MIN } else { i64::MAX })
    }
}

/// Buckets per power of two: 2^SUB_BITS.
const SUB_BITS: u32 = 7;
const SUB: u64 = 1 << SUB_BITS;
/// Enough buckets for every u64: values < 2 * SUB get one bucket each, each
/// further power of two SUB more: (63 − SUB_BITS + 2) × SUB.
const BUCKETS: usize = (63 - SUB_BITS as usize + 2) << SUB_BITS;

/// The bucket of value `v`.
fn index(v: u64) -> usize {
    let i = if v < SUB {
        v
    } else {
        let msb = 63 - v.leading_zeros();
        let shift = msb - SUB_BITS;
        (u64::from(shift) << SUB_BITS) + (v >> shift)
    };
    // At most BUCKETS - 1 (7423), which fits any usize.
    usize::try_from(i).unwrap_or(BUCKETS - 1)
}

/// The smallest and largest value of bucket `i`.
fn bounds(i: usize) -> (u64, u64) {
    let i = i as u64;
    let shift = (i >> SUB_BITS).max(1) - 1;
    let mantissa = i - (shift << SUB_BITS);
    let lower = mantissa << shift;
    (lower, lower + ((1u64 << shift) - 1))
}

/// A histogram of delays in ns, allocated once.
#[derive(Clone)]
pub struct Histogram {
    counts: Box<[u64]>,
    count: u64,
    sum: u128,
    min: u64,
    max: u64,
    negative: u64,
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.count)
            .field("min", &self.min)
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl Histogram {
    pub fn new() -> Self {
        Self {
            counts: vec![0; BUCKETS].into_boxed_slice(),
            count: 0,
            sum: 0,
            min: u64::MAX,
            max: 0,
            negative: 0,
        }
    }

    /// Record one delay; a negative one (the clocks disagreed) is counted
    /// in [`negative`](Self::negative) and recorded as 0.
    pub fn record(&mut self, delay_ns: i64) {
        let v = u64::try_from(delay_ns).unwrap_or_else(|_| {
            self.negative += 1;
            0
        });
        if let Some(c) = self.counts.get_mut(index(v)) {
            *c += 1;
        }
        self.count += 1;
        self.sum += u128::from(v);
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// Delays that came out negative (recorded as 0).
    pub fn negative(&self) -> u64 {
        self.negative
    }

    pub fn min(&self) -> Option<u64> {
        (self.count > 0).then_some(self.min)
    }

    pub fn max(&self) -> Option<u64> {
        (self.count > 0).then_some(self.max)
    }

    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum as f64 / self.count as f64)
    }

    /// The `q`-quantile (0 ≤ q ≤ 1) by nearest rank: the smallest recorded
    /// value with at least ⌈q·count⌉ values at or below it, given as the
    /// upper end of its bucket (exact below 256 ns, within 0.8 % above),
    /// never beyond the largest value recorded. `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        if self.count == 0 {
            return None;
        }
        let q = q.clamp(0.0, 1.0);
        // The product is at most `count`, so the conversion is exact
        // enough (ranks beyond 2^53 are not a concern here).
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(bounds(i).1.clamp(self.min, self.max));
            }
        }
        Some(self.max)
    }

    /// The summary as a JSON object (ns; `null`s when empty).
    pub fn json(&self) -> String {
        let opt = |v: Option<u64>| v.map_or_else(|| "null".to_owned(), |v| v.to_string());
        format!(
            "{{\"count\":{},\"min_ns\":{},\"p50_ns\":{},\"p90_ns\":{},\"p99_ns\":{},\"p999_ns\":{},\"max_ns\":{},\"mean_ns\":{},\"negative\":{}}}",
            self.count,
            opt(self.min()),
            opt(self.quantile(0.50)),
            opt(self.quantile(0.90)),
            opt(self.quantile(0.99)),
            opt(self.quantile(0.999)),
            opt(self.max()),
            self.mean()
                .map_or_else(|| "null".to_owned(), |m| format!("{m:.0}")),
            self.negative,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn buckets_tile_the_whole_range_in_order() {
        assert_eq!(bounds(0), (0, 0));
        assert_eq!(index(u64::MAX), BUCKETS - 1);
        assert_eq!(bounds(BUCKETS - 1).1, u64::MAX);
        for i in 1..BUCKETS {
            let (lo, hi) = bounds(i);
            assert!(lo <= hi, "bucket {i}: {lo} > {hi}");
            assert_eq!(lo, bounds(i - 1).1 + 1, "gap or overlap before bucket {i}");
            assert_eq!((index(lo), index(hi)), (i, i), "bucket {i} = {lo}..={hi}");
        }
        // Exact below 2 * SUB.
        for v in 0..2 * SUB {
            assert_eq!(bounds(index(v)), (v, v));
        }
    }

    proptest! {
        #[test]
        fn every_value_lands_in_a_bucket_that_holds_it(v: u64) {
            let (lo, hi) = bounds(index(v));
            prop_assert!(lo <= v && v <= hi);
            // Relative width below 1/128.
            prop_assert!((hi - lo) as f64 <= v as f64 / SUB as f64);
        }
    }

    #[test]
    fn nearest_rank_quantiles_on_exact_buckets() {
        let mut h = Histogram::new();
        for v in 1..=100 {
            h.record(v);
        }
        assert_eq!(h.count(), 100);
        assert_eq!(h.quantile(0.5), Some(50));
        assert_eq!(h.quantile(0.99), Some(99));
        assert_eq!(h.quantile(0.999), Some(100));
        assert_eq!(h.quantile(0.0), Some(1));
        assert_eq!(h.quantile(1.0), Some(100));
        assert_eq!((h.min(), h.max()), (Some(1), Some(100)));
        assert_eq!(h.mean(), Some(50.5));
    }

    #[test]
    fn quantiles_of_large_values_are_within_the_resolution() {
        let mut h = Histogram::new();
        // 1 µs .. 10 ms in 1 µs steps, shuffled by a stride.
        let n = 10_000i64;
        for k in 0..n {
            h.record(((k * 7919) % n + 1) * 1000);
        }
        for (q, exact) in [(0.5, 5_000_000u64), (0.99, 9_900_000), (0.999, 9_990_000)] {
            let got = h.quantile(q).expect("non-empty");
            assert!(got >= exact, "p{q}: {got} below the exact {exact}");
            assert!(
                (got - exact) as f64 <= exact as f64 / 128.0,
                "p{q}: {got} too far above {exact}"
            );
        }
        assert_eq!(h.quantile(1.0), Some(10_000_000));
        assert_eq!(h.max(), Some(10_000_000));
        assert_eq!(h.min(), Some(1000));
    }

    #[test]
    fn a_few_outliers_move_the_tail_not_the_median() {
        let mut h = Histogram::new();
        for _ in 0..990 {
            h.record(20_000);
        }
        for _ in 0..10 {
            h.record(900_000);
        }
        let p50 = h.quantile(0.5).expect("non-empty");
        assert!((20_000..=20_000 + 20_000 / 128).contains(&p50), "{p50}");
        assert_eq!(
            h.quantile(0.99),
            Some(p50),
            "the 990th of 1000 is still fast"
        );
        let p999 = h.quantile(0.999).expect("non-empty");
        assert!(
            (900_000 - 900_000 / 128..=900_000).contains(&p999),
            "{p999}"
        );
        assert_eq!(h.max(), Some(900_000));
    }

    #[test]
    fn empty_and_negative() {
        let mut h = Histogram::new();
        assert_eq!((h.quantile(0.5), h.max(), h.mean()), (None, None, None));
        assert!(h.json().contains("\"p99_ns\":null"));
        h.record(-5);
        h.record(7);
        assert_eq!(h.negative(), 1);
        assert_eq!((h.min(), h.max()), (Some(0), Some(7)));
        assert_eq!(h.quantile(0.5), Some(0));
        let j = h.json();
        assert!(
            j.contains("\"count\":2") && j.contains("\"negative\":1") && j.contains("\"p99_ns\":7"),
            "{j}"
        );
    }

    #[test]
    fn a_stamped_datagram_checks_clean_once_the_stamp_is_taken_out() {
        for len in [MIN_STAMPED_LEN, 33, 64, 1316, 9000] {
            let mut buf = vec![0u8; len];
            payload::write(&mut buf, 9, 2, 123_456);
            assert!(stamp(&mut buf, 0x0123_4567_89ab_cdef));
            // The stamp replaced pattern bytes: unchecked, it reads as corrupt.
            assert!(matches!(
                payload::check(&buf, 9),
                Err(payload::PayloadError::CorruptByte { offset }) if (STAMP_AT..MIN_STAMPED_LEN).contains(&offset)
            ));
            assert_eq!(take_stamp(&mut buf), Some(0x0123_4567_89ab_cdef));
            let h = payload::check(&buf, 9).expect("restored");
            assert_eq!((h.sequence, h.stream_id), (123_456, 2));
        }
    }

    #[test]
    fn short_or_foreign_datagrams_carry_no_stamp() {
        let mut short = vec![0u8; MIN_STAMPED_LEN - 1];
        payload::write(&mut short, 1, 0, 1);
        let before = short.clone();
        assert!(!stamp(&mut short, 5));
        assert_eq!(take_stamp(&mut short), None);
        assert_eq!(short, before);
        let mut foreign = vec![0xaa; 100];
        assert!(!stamp(&mut foreign, 5));
        assert_eq!(take_stamp(&mut foreign), None);
        assert_eq!(foreign, vec![0xaa; 100]);
        // Built but never stamped: no stamp, and still checks clean.
        let mut plain = vec![0u8; 200];
        payload::write(&mut plain, 1, 0, 77);
        assert_eq!(take_stamp(&mut plain), None);
        assert!(payload::check(&plain, 1).is_ok());
    }

    #[test]
    fn kernel_stamps_convert_to_the_monotonic_clock() {
        // Realtime is 1_000_000 ahead of monotonic; the readings bracket
        // the realtime one by 100 ns.
        let off = ClockOffset::from_readings(5_000, 1_005_050, 5_100);
        assert_eq!(off.delay_ns(4_000, 1_006_000), 2_000);
        assert_eq!(off.delay_ns(7_000, 1_006_000), -1_000);
        assert_eq!(off.delay_ns(0, u64::MAX), i64::MAX);
        // The live clocks: a stamp taken now is (almost) zero delay.
        let now = crate::sock::monotonic_ns();
        let d = ClockOffset::sample().delay_ns(now, crate::sock::realtime_ns());
        assert!((0..1_000_000_000).contains(&d), "{d}");
    }
}
