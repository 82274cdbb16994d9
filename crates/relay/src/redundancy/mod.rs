//! Redundant inputs: a flow fed by up to [`LegId::MAX_LEGS`] legs (copies
//! of one stream over independent networks) and the rule choosing what
//! each leg's datagrams become ([`Redundancy`]).
//!
//! - `Single`: every datagram of every leg is forwarded (one leg: the
//!   plain relay).
//! - `Merge` (SMPTE 2022-7, [`merge`]): each RTP sequence number is
//!   forwarded once, the first copy from any leg.
//! - `Failover` ([`failover`]): only the active leg's datagrams are
//!   forwarded; the active leg changes when it falls silent.
//!
//! Time comes in as `now_ns` arguments (the core has no clock).

/// A leg's position in its flow's input list (config order, which is
/// also the failover priority order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LegId(pub u8);

impl LegId {
    /// Legs a flow may have.
    pub const MAX_LEGS: u8 = 4;

    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// What a flow does with its legs' datagrams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Redundancy {
    /// Forward every datagram of every leg.
    #[default]
    Single,
    /// SMPTE 2022-7: forward each RTP sequence number once, the first copy
    /// from any leg. With `delay_ns > 0` packets wait up to that long so
    /// the output leaves in sequence order (a number still missing then
    /// is skipped). A number no leg delivered within `window_ns` is lost.
    Merge { delay_ns: u64, window_ns: u64 },
    /// Forward from the active leg only: the first healthy leg in list
    /// order, a leg being unhealthy once silent for `after_ns`; return to
    /// a higher-priority leg once it has been healthy for
    /// `revert_after_ns` (`None`: never). With `rtp`, a sequence number
    /// already sent is never sent again.
    Failover {
        after_ns: u64,
        revert_after_ns: Option<u64>,
        rtp: bool,
    },
}

pub(crate) mod failover;
pub(crate) mod merge;
pub(crate) mod timers;

/// Sequence numbers a merge (and a failover's repeat guard) keeps state
/// for: the hold and the window cover at most this many numbers (87 ms
/// of a 47 kpps stream); a number this far from the highest one restarts
/// the state. A power of two.
pub const SPAN: u64 = 4096;

/// A flow's redundancy state on its worker, built when it is added.
#[derive(Debug)]
pub(crate) enum Mode {
    Single,
    Merge(Box<merge::Merge>),
    /// Boxed, as the merge: the mode is then a plain tag and a pointer,
    /// so telling `Single` apart is one compare on the packet path.
    Failover(Box<failover::Failover>),
    /// A flow whose successor took its state over
    /// (`Core::take_over`): what it still receives is dropped, counted
    /// as `duplicates` (its successor's sockets, joined first, have
    /// those datagrams too).
    Replaced,
}

impl Mode {
    pub(crate) fn new(legs: u8, redundancy: Redundancy) -> Self {
        match redundancy {
            Redundancy::Single => Self::Single,
            Redundancy::Merge {
                delay_ns,
                window_ns,
            } => Self::Merge(Box::new(merge::Merge::new(legs, delay_ns, window_ns))),
            Redundancy::Failover {
                after_ns,
                revert_after_ns,
                rtp,
            } => Self::Failover(Box::new(failover::Failover::new(
                legs,
                after_ns,
                revert_after_ns,
                rtp,
            ))),
        }
    }
}

#[cfg(test)]
mod tests;
