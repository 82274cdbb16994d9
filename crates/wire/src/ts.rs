//! MPEG transport stream (ISO/IEC 13818-1) packet headers, checked the way
//! ETSI TR 101 290 checks them (priority-1 sync and continuity, priority-2
//! transport error): a per-input tracker that reads the 4-byte header (and
//! the adaptation field's discontinuity flag) of every 188-byte packet of a
//! datagram.
//!
//! Bounded: the continuity state of all 8192 PIDs is one byte each, in a
//! table allocated with the tracker (when the flow is added), so
//! [`TsTracker::observe`] touches at most one byte per packet (one per run
//! of packets continuing each other on a PID) and never allocates or
//! panics.

/// Bytes in a transport stream packet.
pub const PACKET: usize = 188;
/// The first byte of every packet.
pub const SYNC: u8 = 0x47;
/// Stuffing: never checked.
pub const NULL_PID: u16 = 0x1fff;
/// Distinct PIDs (13 bits).
pub const PIDS: usize = 8192;

/// What an input's TS packets said so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TsStats {
    /// Packets with a sync byte, in datagrams of a whole number of packets.
    pub packets: u64,
    /// Sync loss: one per datagram whose length isn't a non-zero multiple
    /// of 188 (its packets aren't read), one per packet whose first byte
    /// isn't 0x47 (its header isn't read).
    pub sync_errors: u64,
    /// Continuity-counter errors (TR 101 290 1.4): a packet with a payload
    /// whose counter isn't the previous one plus one on its PID, or the
    /// same counter a third time; not counted after a discontinuity
    /// indicator, for adaptation-field-only packets or for the null PID.
    pub continuity_errors: u64,
    /// Packets with the transport-error indicator set (TR 101 290 2.1);
    /// their continuity counter isn't checked.
    pub transport_errors: u64,
    /// Distinct PIDs seen (the null PID included).
    pub pids: u64,
}

/// Packets per datagram almost everywhere TS is carried over IP (1316
/// bytes: SMPTE 2022-2, RFC 2250 within an Ethernet MTU, ffmpeg's
/// default): the size [`TsTracker::observe`] checks in one piece.
pub const PER_DATAGRAM: usize = 7;

/// The header bits the fast paths require, and their value: sync byte
/// 0x47, transport-error bit clear, adaptation field control 01 (payload
/// only).
const FAST_MASK: u32 = 0xff80_0030;
const FAST_VALUE: u32 = 0x4700_0010;

/// A packet's 4-byte header, big-endian (0 for a packet too short to have
/// one, which the callers never pass: a 0 has no sync byte).
#[inline(always)]
fn header(p: &[u8]) -> u32 {
    p.first_chunk::<4>().map_or(0, |&h| u32::from_be_bytes(h))
}

/// Header `h`'s PID.
#[inline(always)]
fn pid(h: u32) -> usize {
    ((h >> 8) & 0x1fff) as usize
}

/// Header `h` with its continuity counter plus `k` (mod 16), the rest
/// unchanged.
#[inline(always)]
fn counter_plus(h: u32, k: u32) -> u32 {
    (h & !0x0f) | (h.wrapping_add(k) & 0x0f)
}

/// Per-PID state, one byte: bit 7 seen, bit 6 the one allowed duplicate
/// was used, bits 0..4 the last continuity counter.
const SEEN: u8 = 0x80;
const DUPLICATE: u8 = 0x40;

/// Per-input TS state, created with the flow (one 8 KiB table).
#[derive(Debug, Clone)]
pub struct TsTracker {
    stats: TsStats,
    pids: Box<[u8; PIDS]>,
}

impl Default for TsTracker {
    fn default() -> Self {
        Self::new()
    }
}

impl TsTracker {
    pub fn new() -> Self {
        Self {
            stats: TsStats::default(),
            pids: Box::new([0; PIDS]),
        }
    }

    pub fn stats(&self) -> &TsStats {
        &self.stats
    }

    /// Read the packets of one datagram's payload.
    ///
    /// Three ways through, each counting exactly what the full check
    /// ([`Self::packet`] on every packet) would (the proptests
    /// `fast_path_is_the_full_check` and `runs_are_the_full_check` hold
    /// them equal):
    /// - [`Self::one_run`]: a datagram of [`PER_DATAGRAM`] packets that are
    ///   one run on one PID (the usual case: the middle of a video PES),
    ///   checked with one XOR per packet and one table byte per datagram;
    /// - otherwise [`Self::walk`]: packet by packet, a packet continuing
    ///   the previous one's run costs one compare and no table access, the
    ///   first of a run [`Self::in_sequence`]'s table check;
    /// - anything else through the full check.
    #[inline]
    pub fn observe(&mut self, d: &[u8]) {
        if let Ok(d) = <&[u8; PER_DATAGRAM * PACKET]>::try_from(d) {
            if self.one_run(d) {
                self.stats.packets += PER_DATAGRAM as u64;
                return;
            }
        }
        self.observe_packets(d);
    }

    /// [`Self::observe`] when the datagram isn't one run: out of line, so
    /// the one-run check inlines into its caller without this one's
    /// register saves.
    #[inline(never)]
    fn observe_packets(&mut self, d: &[u8]) {
        if d.is_empty() || d.len() % PACKET != 0 {
            self.stats.sync_errors += 1;
            return;
        }
        self.walk(d);
    }

    /// Whether `d`'s packets are one run: all with the first one's header
    /// but for counters running on from its counter (one PID, sync, no
    /// transport error, payload only), and the first passes
    /// [`Self::in_sequence`]. Then each of the others is what
    /// [`Self::in_sequence`] would pass after the one before it, and
    /// `true` means all of them were counted (the PID's state now holds the
    /// last counter). `false`: nothing changed.
    #[inline(always)]
    fn one_run(&mut self, d: &[u8; PER_DATAGRAM * PACKET]) -> bool {
        let Some(&first) = d.first_chunk::<4>() else {
            return false;
        };
        let h0 = u32::from_be_bytes(first);
        let mut diff = 0;
        let mut last = h0;
        for (p, k) in d.chunks_exact(PACKET).zip(0u32..) {
            last = counter_plus(h0, k);
            diff |= header(p) ^ last;
        }
        if diff != 0 || !self.in_sequence(h0) {
            return false;
        }
        self.settle(last);
        true
    }

    /// Packet by packet. A packet whose header is the previous packet's
    /// with the counter plus one, when the previous one had sync, no
    /// transport error and a payload only, is in sequence whatever the
    /// previous one's outcome was: checking it leaves its PID's state at
    /// "seen, its counter" and counts nothing but the packet (the full
    /// check would find the counter equal to the last plus one). So a run
    /// only counts, and writes its PID's state once, when it ends (before
    /// any other packet reads the table).
    #[inline]
    fn walk(&mut self, d: &[u8]) {
        let mut counted = 0u64;
        // The header a packet must have to continue the run.
        let mut expect = None;
        // The latest header counted in a run, its state not yet written.
        let mut pending = None;
        for p in d.chunks_exact(PACKET) {
            let h = header(p);
            if expect == Some(h) {
                counted += 1;
                pending = Some(h);
                expect = Some(counter_plus(h, 1));
                continue;
            }
            if let Some(last) = pending.take() {
                self.settle(last);
            }
            if self.in_sequence(h) {
                counted += 1;
            } else {
                self.packet(p);
            }
            expect = (h & FAST_MASK == FAST_VALUE).then(|| counter_plus(h, 1));
        }
        if let Some(last) = pending {
            self.settle(last);
        }
        self.stats.packets += counted;
    }

    /// The common case, checked with one compare of the header and one
    /// table byte: a packet with sync, no transport error, a payload and
    /// no adaptation field, whose counter is its PID's previous one plus
    /// one (and no duplicate pending). Such a packet only moves its PID's
    /// counter; [`Self::packet`] would do exactly that and count nothing
    /// else, so `true` here means "counted as one more packet". Anything
    /// else (`false`) is left untouched for the full check.
    #[inline(always)]
    fn in_sequence(&mut self, h: u32) -> bool {
        if h & FAST_MASK != FAST_VALUE {
            return false;
        }
        let cc = (h & 0x0f) as u8;
        let Some(state) = self.pids.get_mut(pid(h)) else {
            return false;
        };
        // Seen, no duplicate used, last counter `cc - 1`. The null PID can
        // pass too: only its "seen" bit is ever read, so moving its counter
        // bits changes nothing.
        if *state != SEEN | (cc.wrapping_sub(1) & 0x0f) {
            return false;
        }
        *state = SEEN | cc;
        true
    }

    /// Record header `h`'s counter as its PID's last: what the full check
    /// leaves after an in-sequence packet.
    #[inline(always)]
    fn settle(&mut self, h: u32) {
        if let Some(state) = self.pids.get_mut(pid(h)) {
            *state = SEEN | (h & 0x0f) as u8;
        }
    }

    #[inline]
    fn packet(&mut self, p: &[u8]) {
        let [sync, b1, b2, b3, b4, b5, ..] = *p else {
            return;
        };
        let s = &mut self.stats;
        if sync != SYNC {
            s.sync_errors += 1;
            return;
        }
        s.packets += 1;
        let pid = u16::from_be_bytes([b1 & 0x1f, b2]);
        let state = &mut self.pids[usize::from(pid)];
        if *state & SEEN == 0 {
            s.pids += 1;
        }
        if b1 & 0x80 != 0 {
            s.transport_errors += 1;
            *state |= SEEN;
            return;
        }
        if pid == NULL_PID {
            *state |= SEEN;
            return;
        }
        let afc = (b3 >> 4) & 3;
        let cc = b3 & 0x0f;
        let discontinuity = afc & 2 != 0 && b4 > 0 && b5 & 0x80 != 0;
        if *state & SEEN == 0 || discontinuity {
            *state = SEEN | cc;
            return;
        }
        if afc & 1 == 0 {
            // No payload: the counter doesn't advance (TR 101 290 1.4).
            return;
        }
        let last = *state & 0x0f;
        if cc == last {
            if *state & DUPLICATE == 0 {
                *state |= DUPLICATE;
            } else {
                s.continuity_errors += 1;
            }
        } else {
            if cc != (last + 1) & 0x0f {
                s.continuity_errors += 1;
            }
            *state = SEEN | cc;
        }
    }
}

/// Write a TS packet header into `p` (188 bytes): PID, continuity counter,
/// and whether it has a payload and/or an adaptation field (of length 1,
/// flags `af_flags`). The rest is left as it is. For tests, benchmarks and
/// the load generator.
pub fn build(p: &mut [u8], pid: u16, cc: u8, payload: bool, adaptation: Option<u8>) {
    let Some(h) = p.get_mut(..6) else {
        return;
    };
    let afc = u8::from(payload) | if adaptation.is_some() { 2 } else { 0 };
    let [hi, lo] = (pid & 0x1fff).to_be_bytes();
    h[0] = SYNC;
    h[1] = hi;
    h[2] = lo;
    h[3] = (afc << 4) | (cc & 0x0f);
    if let Some(flags) = adaptation {
        h[4] = 1;
        h[5] = flags;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// [`TsTracker::observe`] without its fast path: every packet through
    /// the full check.
    fn observe_slowly(t: &mut TsTracker, d: &[u8]) {
        if d.is_empty() || d.len() % PACKET != 0 {
            t.stats.sync_errors += 1;
            return;
        }
        for p in d.chunks_exact(PACKET) {
            t.packet(p);
        }
    }

    /// A packet from a few PIDs (the null PID among them) with a header
    /// varied where the checks look: sync, transport error, adaptation
    /// field control and discontinuity flag, counter.
    fn packet() -> impl Strategy<Value = [u8; 6]> {
        (
            prop::sample::select(vec![0x100u16, 0x101, 0x1fff, 0]),
            0u8..16,
            prop::sample::select(vec![1u8, 1, 1, 1, 0, 2, 3]),
            any::<bool>(),
            any::<bool>(),
            prop::bool::weighted(0.05),
        )
            .prop_map(|(pid, cc, afc, tei, disc, bad_sync)| {
                let [hi, lo] = pid.to_be_bytes();
                [
                    if bad_sync { 0x48 } else { SYNC },
                    hi | if tei { 0x80 } else { 0 },
                    lo,
                    (afc << 4) | cc,
                    1,
                    if disc { 0x80 } else { 0 },
                ]
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        /// The fast path counts exactly what the full check counts, and
        /// leaves every PID's state as it would, on streams that are
        /// mostly in sequence (the counters follow on from the previous
        /// packet's unless `jump`) with every kind of exception mixed in.
        #[test]
        fn fast_path_is_the_full_check(
            datagrams in prop::collection::vec(
                prop::collection::vec((packet(), prop::bool::weighted(0.2)), 0..8),
                1..40,
            ),
        ) {
            let mut fast = TsTracker::new();
            let mut slow = TsTracker::new();
            let mut next = [0u8; PIDS];
            for datagram in &datagrams {
                let mut d = vec![0u8; PACKET * datagram.len()];
                for (p, (h, jump)) in d.chunks_exact_mut(PACKET).zip(datagram) {
                    p[..6].copy_from_slice(h);
                    let pid = usize::from(u16::from_be_bytes([h[1] & 0x1f, h[2]]));
                    if !jump {
                        p[3] = (p[3] & 0xf0) | next[pid];
                    }
                    next[pid] = (p[3] + 1) & 0x0f;
                }
                fast.observe(&d);
                observe_slowly(&mut slow, &d);
                prop_assert_eq!(fast.stats(), slow.stats());
                // The null PID's counter bits are never read: only
                // whether it was seen must agree.
                let null = usize::from(NULL_PID);
                prop_assert!(fast.pids[..null] == slow.pids[..null]);
                prop_assert_eq!(fast.pids[null] & SEEN, slow.pids[null] & SEEN);
            }
        }
    }

    /// A packet of [`run_stream`]: (stay on the previous PID, clean,
    /// counter jump, header).
    type RunPacket = (bool, bool, bool, [u8; 6]);

    /// Streams made of runs: each packet mostly on the previous packet's
    /// PID (`stay`) and mostly clean (sync, payload only, the PID's next
    /// counter), otherwise any header [`packet`] makes (counter jumps,
    /// adaptation fields, transport errors, sync loss, the null PID), cut
    /// into datagrams of mostly [`PER_DATAGRAM`] packets (some of other
    /// counts, some of 100 bytes, which aren't read): the fast paths
    /// (a whole datagram as one run, a run within a datagram) count
    /// exactly what the full check counts and leave the same state.
    fn run_stream() -> impl Strategy<Value = (Vec<RunPacket>, Vec<usize>)> {
        (
            prop::collection::vec(
                (
                    prop::bool::weighted(0.85),
                    prop::bool::weighted(0.8),
                    prop::bool::weighted(0.05),
                    packet(),
                ),
                0..300,
            ),
            prop::collection::vec(
                prop::sample::select(vec![7usize, 7, 7, 7, 7, 0, 1, 2, 6, 8]),
                1..20,
            ),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        #[test]
        fn runs_are_the_full_check((packets, sizes) in run_stream()) {
            let mut fast = TsTracker::new();
            let mut slow = TsTracker::new();
            let mut next = [0u8; PIDS];
            let mut stream = Vec::with_capacity(PACKET * packets.len());
            let mut pid = 0x100u16;
            for &(stay, clean, jump, h) in &packets {
                if !stay {
                    pid = u16::from_be_bytes([h[1] & 0x1f, h[2]]);
                }
                let [hi, lo] = pid.to_be_bytes();
                let mut p = [0u8; PACKET];
                p[..6].copy_from_slice(&h);
                p[1] = (p[1] & 0xe0) | hi;
                p[2] = lo;
                if clean {
                    p[0] = SYNC;
                    p[1] &= 0x1f;
                    p[3] = 0x10;
                }
                let i = usize::from(pid);
                if !jump {
                    p[3] = (p[3] & 0xf0) | next[i];
                }
                next[i] = (p[3] + 1) & 0x0f;
                stream.extend_from_slice(&p);
            }
            let mut rest = &stream[..];
            for &n in sizes.iter().cycle() {
                if rest.is_empty() {
                    break;
                }
                // 0: a datagram of 100 bytes, not a whole packet.
                let len = if n == 0 { 100 } else { n * PACKET };
                let (d, tail) = rest.split_at(len.min(rest.len()));
                rest = tail;
                fast.observe(d);
                observe_slowly(&mut slow, d);
                prop_assert_eq!(fast.stats(), slow.stats());
                let null = usize::from(NULL_PID);
                prop_assert!(fast.pids[..null] == slow.pids[..null]);
                prop_assert_eq!(fast.pids[null] & SEEN, slow.pids[null] & SEEN);
            }
        }
    }

    /// Packets as (pid, cc, payload, adaptation flags).
    fn run(packets: &[(u16, u8, bool, Option<u8>)]) -> TsStats {
        let mut t = TsTracker::new();
        for &(pid, cc, payload, af) in packets {
            let mut p = [0xffu8; PACKET];
            build(&mut p, pid, cc, payload, af);
            t.observe(&p);
        }
        *t.stats()
    }

    fn cc_run(pid: u16, ccs: &[u8]) -> TsStats {
        let v: Vec<_> = ccs.iter().map(|&c| (pid, c, true, None)).collect();
        run(&v)
    }

    #[test]
    fn counting_through_the_wrap_is_clean() {
        let s = cc_run(0x100, &[13, 14, 15, 0, 1, 2]);
        assert_eq!((s.packets, s.continuity_errors, s.pids), (6, 0, 1));
    }

    #[test]
    fn a_gap_is_one_error() {
        assert_eq!(cc_run(0x100, &[1, 2, 4, 5]).continuity_errors, 1);
        assert_eq!(cc_run(0x100, &[1, 2, 1, 2]).continuity_errors, 1);
        assert_eq!(cc_run(0x100, &[1, 2, 1, 3]).continuity_errors, 2);
    }

    #[test]
    fn one_duplicate_is_allowed_two_are_not() {
        assert_eq!(cc_run(0x100, &[1, 2, 2, 3]).continuity_errors, 0);
        assert_eq!(cc_run(0x100, &[1, 2, 2, 2, 3]).continuity_errors, 1);
        // The allowance resets once the counter moves on.
        assert_eq!(cc_run(0x100, &[1, 1, 2, 2, 3, 3]).continuity_errors, 0);
    }

    #[test]
    fn adaptation_only_packets_do_not_advance() {
        let s = run(&[
            (0x100, 1, true, None),
            (0x100, 1, false, Some(0x10)), // PCR only, same counter
            (0x100, 7, false, Some(0x10)), // whatever its counter
            (0x100, 2, true, Some(0x00)),  // adaptation and payload: advances
            (0x100, 3, true, None),
        ]);
        assert_eq!(s.continuity_errors, 0);
    }

    #[test]
    fn discontinuity_indicator_is_honoured() {
        let s = run(&[
            (0x100, 1, true, None),
            (0x100, 9, true, Some(0x80)),
            (0x100, 10, true, None),
        ]);
        assert_eq!(s.continuity_errors, 0);
        // Without the indicator the same jump is an error.
        let s = run(&[
            (0x100, 1, true, None),
            (0x100, 9, true, Some(0x00)),
            (0x100, 10, true, None),
        ]);
        assert_eq!(s.continuity_errors, 1);
    }

    #[test]
    fn null_pid_is_ignored() {
        let s = cc_run(NULL_PID, &[0, 0, 0, 5, 9]);
        assert_eq!((s.continuity_errors, s.pids), (0, 1));
    }

    #[test]
    fn pids_are_independent() {
        let s = run(&[
            (0x100, 1, true, None),
            (0x101, 8, true, None),
            (0x100, 2, true, None),
            (0x101, 9, true, None),
        ]);
        assert_eq!((s.continuity_errors, s.pids), (0, 2));
    }

    #[test]
    fn transport_error_indicator() {
        let mut t = TsTracker::new();
        let mut p = [0u8; PACKET];
        build(&mut p, 0x100, 1, true, None);
        t.observe(&p);
        build(&mut p, 0x100, 9, true, None);
        p[1] |= 0x80;
        t.observe(&p);
        build(&mut p, 0x100, 2, true, None);
        t.observe(&p);
        let s = t.stats();
        assert_eq!((s.transport_errors, s.continuity_errors), (1, 0));
    }

    #[test]
    fn sync_errors() {
        let mut t = TsTracker::new();
        t.observe(&[]);
        t.observe(&[SYNC; PACKET + 1]);
        let mut d = [0u8; 3 * PACKET];
        for (i, p) in d.chunks_exact_mut(PACKET).enumerate() {
            build(p, 0x100, u8::try_from(i).unwrap(), true, None);
        }
        d[PACKET] = 0x48;
        t.observe(&d);
        let s = t.stats();
        // Two datagrams of the wrong length, one packet without sync; the
        // unread packet leaves a gap in the counter.
        assert_eq!((s.sync_errors, s.packets, s.continuity_errors), (3, 2, 1));
    }
}
