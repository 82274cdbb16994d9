//! Input failover: a flow forwards the datagrams of its active leg only.
//!
//! A leg is healthy while it has delivered a datagram within its
//! detection time, and unhealthy once silent that long (a leg that never
//! delivered counts as silent from the flow's first event, so the first
//! leg gets `after_ns` to start). The detection time adapts to the
//! source: `gap_factor` times the leg's recent longest gap between
//! datagrams ([`GapEstimate`]), never less than `after_ns` (with
//! `gap_factor` 0, `after_ns` exactly), so a VBR source whose gaps
//! reach 150 ms under load does not flap at a 100 ms floor. When the active leg is unhealthy the
//! flow goes to the first healthy leg in list order; when a leg before
//! the active one has been healthy for `revert_after_ns` it goes back
//! to it (`None`: never). Each change counts a switch and sets the
//! `active_leg` gauge; the driver logs it from there.
//!
//! The rule runs when a datagram arrives on a leg that is not the active
//! one (so a backup takes over with its first datagram after the
//! primary's silence) and at the flow's timer ([`Failover::deadline`]).
//! Other legs' datagrams are counted per leg (`standby`) and take no
//! buffer.
//!
//! With `rtp`, a sequence number already sent is never sent again
//! ([`SeqGuard`]): after a switch, the new leg's copies of numbers the
//! old one sent are duplicates. Each leg's datagrams also go through the
//! sequence engine ([`crate::sequence::LegSeq`]): a jump or a far
//! step back the leg has not confirmed is dropped (`strays`, `replays`)
//! and does not count as the leg being heard, so a leg sending a broken
//! stream goes unhealthy as a silent one does; a restart the leg
//! confirmed (an encoder restart, a new source) restarts the guard, and
//! so does a leg's first datagram after every leg was silent past its
//! detection time (nothing is left to protect then: a stream restarted
//! after a pause loses nothing).

use super::{LegId, SPAN};
use crate::counters::RedundancyCounters;
use crate::sequence::{LegSeq, MAX_MISORDER, Step};

/// What a datagram of a failover flow becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pass {
    /// Forward it; with `rtp`, its number to mark as sent (and whether
    /// its leg restarted its numbering with it).
    Forward(Option<(u16, u32, bool)>),
    /// Not the active leg.
    Standby,
    Duplicate,
    Late,
    NotRtp,
    /// A jump its leg has not confirmed (`mcrelay_relay::sequence`).
    Stray,
    /// A step far back its leg has not confirmed.
    Replay,
}

/// The sequence numbers a flow has sent: the highest, and a bit for each
/// of the 64 below it. A number 64 to [`SPAN`] below the highest can't
/// be told from a repeat (`late`); one further off, or a restart its leg
/// confirmed, restarts it. Legs carrying the same numbering under
/// different SSRCs repeat nothing across a switch; a number of another
/// SSRC more than [`MAX_MISORDER`] behind is another stream (an
/// independent encoder), which restarts it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SeqGuard {
    ssrc: Option<u32>,
    highest: u16,
    /// Bit `i`: `highest - i` was sent.
    sent: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// Not sent; `true` when it restarts the guard.
    Fresh(bool),
    Repeat,
    Late,
}

impl SeqGuard {
    fn distance(&self, seq: u16) -> i64 {
        i64::from(i16::from_ne_bytes(
            seq.wrapping_sub(self.highest).to_ne_bytes(),
        ))
    }

    fn check(&self, seq: u16, ssrc: u32, restart: bool) -> Seen {
        let span = i64::try_from(SPAN).unwrap_or(i64::MAX);
        let d = self.distance(seq);
        if restart || self.ssrc.is_none() || d >= span || d <= -span {
            return Seen::Fresh(true);
        }
        // Another SSRC numbered well behind: not a lagging copy of the
        // stream sent but another stream (an independent encoder on the
        // backup leg; ffmpeg, for one, starts its numbers below 4096, so
        // two encoders' numberings are always within SPAN).
        if self.ssrc != Some(ssrc) && d < -i64::try_from(MAX_MISORDER).unwrap_or(i64::MAX) {
            return Seen::Fresh(true);
        }
        if d > 0 {
            return Seen::Fresh(false);
        }
        match u32::try_from(-d) {
            Ok(back) if back < 64 => {
                if self.sent & (1 << back) != 0 {
                    Seen::Repeat
                } else {
                    Seen::Fresh(false)
                }
            }
            _ => Seen::Late,
        }
    }

    fn mark(&mut self, seq: u16, ssrc: u32, restart: bool, counters: &RedundancyCounters) {
        if let Seen::Fresh(true) = self.check(seq, ssrc, restart) {
            if self.ssrc.is_some() {
                counters.resets.inc();
            }
            *self = Self {
                ssrc: Some(ssrc),
                highest: seq,
                sent: 1,
            };
            return;
        }
        let d = self.distance(seq);
        if d > 0 {
            self.sent = u32::try_from(d)
                .ok()
                .and_then(|d| self.sent.checked_shl(d))
                .unwrap_or(0)
                | 1;
            self.highest = seq;
            // The stream sent is the one that moved it on.
            self.ssrc = Some(ssrc);
        } else if let Ok(back) = u32::try_from(-d)
            && back < 64
        {
            self.sent |= 1 << back;
        }
    }
}

/// A leg's recent longest gap between datagrams: the largest gap seen,
/// decaying by half in about [`GapEstimate::DECAY_SHIFT`] (2^35 ns, 34 s)
/// of time as newer, shorter gaps come. A gap longer than twice the
/// detection time it was measured against (an outage, not the source's
/// rhythm) is not learnt.
#[derive(Debug, Clone, Copy, Default)]
struct GapEstimate(u64);

impl GapEstimate {
    const DECAY_SHIFT: u32 = 35;

    fn learn(&mut self, gap: u64, limit: u64) {
        if gap >= limit.saturating_mul(2) {
            return;
        }
        let decay = (u128::from(self.0) * u128::from(gap)) >> Self::DECAY_SHIFT;
        let decayed = self
            .0
            .saturating_sub(u64::try_from(decay).unwrap_or(u64::MAX));
        self.0 = decayed.max(gap);
    }
}

/// One flow's failover state.
#[derive(Debug)]
pub(crate) struct Failover {
    after_ns: u64,
    revert_after_ns: Option<u64>,
    rtp: bool,
    gap_factor: u32,
    /// Each leg's recent longest gap (valid datagrams).
    gaps: [GapEstimate; LegId::MAX_LEGS as usize],
    legs: u8,
    active: u8,
    /// The flow's first event: legs that never delivered are silent
    /// since then.
    start_ns: Option<u64>,
    /// Each leg's latest datagram.
    last_ns: [Option<u64>; LegId::MAX_LEGS as usize],
    /// Since when each leg has been healthy (valid while it is).
    healthy_since_ns: [u64; LegId::MAX_LEGS as usize],
    /// With `rtp`: each leg's stream (`mcrelay_relay::sequence`). A datagram its
    /// leg's stream does not take (a jump not confirmed, a replay) is
    /// dropped and does not count as the leg being heard: a leg sending
    /// only such datagrams goes unhealthy as a silent one does.
    seqs: [LegSeq; LegId::MAX_LEGS as usize],
    guard: SeqGuard,
}

impl Failover {
    pub(crate) fn new(
        legs: u8,
        after_ns: u64,
        revert_after_ns: Option<u64>,
        rtp: bool,
        gap_factor: u32,
    ) -> Self {
        Self {
            after_ns: after_ns.max(1),
            revert_after_ns,
            rtp,
            gap_factor,
            gaps: [GapEstimate::default(); LegId::MAX_LEGS as usize],
            legs: legs.clamp(1, LegId::MAX_LEGS),
            active: 0,
            start_ns: None,
            last_ns: [None; LegId::MAX_LEGS as usize],
            healthy_since_ns: [0; LegId::MAX_LEGS as usize],
            seqs: [LegSeq::default(); LegId::MAX_LEGS as usize],
            guard: SeqGuard::default(),
        }
    }

    pub(crate) fn active(&self) -> LegId {
        LegId(self.active)
    }

    /// How long `leg` may be silent before it is unhealthy.
    pub(crate) fn limit(&self, leg: u8) -> u64 {
        let learnt = self
            .gaps
            .get(usize::from(leg))
            .map_or(0, |g| g.0.saturating_mul(u64::from(self.gap_factor)));
        self.after_ns.max(learnt)
    }

    fn healthy(&self, leg: u8, now: u64) -> bool {
        self.last_ns
            .get(usize::from(leg))
            .copied()
            .flatten()
            .is_some_and(|t| now.saturating_sub(t) < self.limit(leg))
    }

    /// Whether no leg is healthy at `now`.
    fn all_silent(&self, now: u64) -> bool {
        (0..self.legs).all(|leg| !self.healthy(leg, now))
    }

    /// When `leg` is (or was) last heard of, counting the flow's start.
    fn heard_ns(&self, leg: u8, now: u64) -> u64 {
        self.last_ns
            .get(usize::from(leg))
            .copied()
            .flatten()
            .or(self.start_ns)
            .unwrap_or(now)
    }

    /// The failover rule at `now`: `true` when the active leg changed
    /// (counted).
    pub(crate) fn evaluate(&mut self, now: u64, counters: &RedundancyCounters) -> bool {
        self.start_ns.get_or_insert(now);
        let active = self.active;
        let silent = now.saturating_sub(self.heard_ns(active, now)) >= self.limit(active);
        let to = if silent {
            (0..self.legs).find(|&l| l != active && self.healthy(l, now))
        } else if let Some(revert) = self.revert_after_ns {
            (0..active).find(|&l| {
                self.healthy(l, now)
                    && now.saturating_sub(self.healthy_since_ns[usize::from(l)]) >= revert
            })
        } else {
            None
        };
        let Some(to) = to else {
            return false;
        };
        self.active = to;
        counters.switches.inc();
        counters.active_leg.set(u64::from(to));
        true
    }

    /// A datagram from `leg` at `now`: whether it goes.
    pub(crate) fn admit(
        &mut self,
        leg: LegId,
        payload: &[u8],
        now: u64,
        counters: &RedundancyCounters,
    ) -> Pass {
        self.start_ns.get_or_insert(now);
        let l = leg.index();
        // With `rtp`, only a datagram its leg's stream takes is heard.
        let mut ticket = None;
        if self.rtp {
            let Some(h) = mcrelay_wire::rtp::parse(payload) else {
                return Pass::NotRtp;
            };
            let Some(s) = self.seqs.get_mut(l) else {
                return Pass::NotRtp;
            };
            let restart = match s.check(h.sequence, h.ssrc) {
                Step::Restart(_) => true,
                Step::Start(_) | Step::Ahead { .. } | Step::Behind(_) => false,
                // Every leg silent past its detection time: nothing to
                // protect, the leg starts afresh as at its first
                // datagram (an encoder restarted after a pause loses
                // nothing). While another leg is healthy a leg sending a
                // broken stream stays unhealthy.
                Step::Stray | Step::Replay if self.all_silent(now) => {
                    if let Some(s) = self.seqs.get_mut(l) {
                        s.restart(h.sequence, h.ssrc);
                    }
                    true
                }
                Step::Stray => return Pass::Stray,
                Step::Replay => return Pass::Replay,
            };
            ticket = Some((h.sequence, h.ssrc, restart));
        }
        if !self.healthy(leg.0, now)
            && let Some(since) = self.healthy_since_ns.get_mut(l)
        {
            *since = now;
        }
        if self.gap_factor > 0
            && let Some(Some(last)) = self.last_ns.get(l).copied()
        {
            let limit = self.limit(leg.0);
            if let Some(g) = self.gaps.get_mut(l) {
                g.learn(now.saturating_sub(last), limit);
            }
        }
        if let Some(last) = self.last_ns.get_mut(l) {
            *last = Some(now);
        }
        if leg.0 != self.active {
            // The rule may make this leg the active one now.
            self.evaluate(now, counters);
            if leg.0 != self.active {
                return Pass::Standby;
            }
        }
        let Some((seq, ssrc, restart)) = ticket else {
            return Pass::Forward(None);
        };
        match self.guard.check(seq, ssrc, restart) {
            Seen::Fresh(_) => Pass::Forward(Some((seq, ssrc, restart))),
            Seen::Repeat => Pass::Duplicate,
            Seen::Late => Pass::Late,
        }
    }

    /// The datagram [`Failover::admit`] let through took a buffer.
    pub(crate) fn sent(&mut self, seq: Option<(u16, u32, bool)>, counters: &RedundancyCounters) {
        if let Some((seq, ssrc, restart)) = seq {
            self.guard.mark(seq, ssrc, restart, counters);
        }
    }

    /// Take over the state of `old`, the failover of the flow this one
    /// replaces (a reload): its active leg (leg 0 if this flow has no such
    /// leg), its start and the sequence numbers it sent. A leg whose bit
    /// is set in `kept` (the same input at the same index) keeps its
    /// health; the others start silent, and if the active leg is one of
    /// them the first healthy kept leg takes over at once. This
    /// failover's own settings stay.
    pub(crate) fn take_over(&mut self, old: &Failover, kept: u8, now: u64) {
        self.start_ns = old.start_ns;
        for l in 0..usize::from(self.legs) {
            if kept & (1 << l) != 0 && l < usize::from(old.legs) {
                self.last_ns[l] = old.last_ns[l];
                self.healthy_since_ns[l] = old.healthy_since_ns[l];
                self.seqs[l] = old.seqs[l];
                self.gaps[l] = old.gaps[l];
            }
        }
        self.active = if old.active < self.legs {
            old.active
        } else {
            0
        };
        if kept & (1 << self.active) == 0
            && let Some(l) = (0..self.legs).find(|&l| kept & (1 << l) != 0 && self.healthy(l, now))
        {
            // The active input changed: the first healthy one kept
            // carries on (the new one gets `after_ns` to start, as at a
            // flow's start, before it is looked at again).
            self.active = l;
        }
        self.guard = old.guard;
    }

    /// Start as though every number up to `seq` of stream `ssrc` had been
    /// sent (a failover replacing a flow that kept no such guard).
    pub(crate) fn seed(&mut self, seq: u16, ssrc: u32) {
        self.guard = SeqGuard {
            ssrc: Some(ssrc),
            highest: seq,
            sent: u64::MAX,
        };
    }

    /// The highest number sent and its SSRC (`None` before any, or
    /// without `rtp`).
    pub(crate) fn highest(&self) -> Option<(u16, u32)> {
        self.guard.ssrc.map(|ssrc| (self.guard.highest, ssrc))
    }

    /// When the rule may next change something: the active leg turning
    /// silent, or a leg before it having been healthy long enough to go
    /// back to.
    pub(crate) fn deadline(&self, now: u64) -> Option<u64> {
        let silent = self
            .heard_ns(self.active, now)
            .saturating_add(self.limit(self.active));
        let silent = (silent > now).then_some(silent);
        let revert = self.revert_after_ns.and_then(|revert| {
            (0..self.active)
                .filter(|&l| self.healthy(l, now))
                .map(|l| self.healthy_since_ns[usize::from(l)].saturating_add(revert))
                .min()
        });
        match (silent, revert) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}
