//! Which callers of an SRT output to disconnect for falling behind: a
//! pure rule, judged once a second from counters the SRT thread already
//! reads (no socket, no clock), so it is unit-tested here.
//!
//! A caller is *late* in a second when, with its receiver still taking
//! data (flow window open), datagrams for it were dropped: the relay
//! found its libsrt send buffer full (`dropped`), or libsrt dropped
//! packets it had held past its sender threshold (`too_late`, about a
//! second). Either way its libsrt holds about a second of the stream or
//! more (its 8 192-packet buffer: 0.8 s at 10 000 datagrams/s; or the
//! 1 s threshold), so what it sends
//! arrives far past the receiver's TSBPD latency: contiguous late packets
//! are still played, but every network loss then turns into a gap the
//! receiver skips at once, and libsrt spends the caller's share of the
//! relay's sending on packets that may never play. Such a caller's
//! stream already has holes; disconnecting it loses nothing whole, and
//! a caller that connects again starts on an empty buffer, on time.
//!
//! Whose fault it is decides how many go:
//! - a few callers late among callers on time: their links or receivers
//!   can't take the stream; each is disconnected after [`LATE_TICKS`]
//!   late seconds in a row;
//! - more than half of two or more callers late at once: the relay's own
//!   sending (CPU) is short. Disconnecting them all would serve nobody
//!   (they call again and the overload repeats), so the newest late one
//!   goes, one a second, until the rest keep up, and the route refuses
//!   new callers for a while ([`Verdict::Overload`]): the callers served
//!   longest keep their streams.

/// Late seconds in a row after which a caller is disconnected.
pub const LATE_TICKS: u32 = 2;

/// What to do with a route's callers this second.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nobody has been late long enough.
    Keep,
    /// These callers (indices) fell behind on their own: disconnect each.
    Disconnect(Vec<usize>),
    /// Most callers are late at once, the relay's own limit: disconnect
    /// this one (the newest late long enough) and refuse new callers.
    Overload(usize),
}

/// Judges one route's callers, given for each (in the order they
/// connected) how many seconds in a row it has been late, this one
/// included (0: on time now).
pub fn judge(late_ticks: &[u32]) -> Verdict {
    let callers = late_ticks.len();
    let late_now = late_ticks.iter().filter(|&&n| n > 0).count();
    let due: Vec<usize> = late_ticks
        .iter()
        .enumerate()
        .filter(|&(_, &n)| n >= LATE_TICKS)
        .map(|(i, _)| i)
        .collect();
    match due.last().copied() {
        None => Verdict::Keep,
        Some(newest) if callers >= 2 && late_now * 2 > callers => Verdict::Overload(newest),
        Some(_) => Verdict::Disconnect(due),
    }
}

/// Whether a caller was late this second: datagrams for it were dropped
/// (`dropped`: its send buffer was full; `too_late`: libsrt dropped what
/// it held too long) since the last second, while its receiver's flow
/// window was open (closed: it stopped reading, the stall rule's case).
pub fn late(
    dropped: u64,
    dropped_before: u64,
    too_late: u64,
    too_late_before: u64,
    window_open: bool,
) -> bool {
    window_open && (dropped > dropped_before || too_late > too_late_before)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_late_second_is_forgiven() {
        assert_eq!(judge(&[]), Verdict::Keep);
        assert_eq!(judge(&[1]), Verdict::Keep);
        assert_eq!(judge(&[0, 1, 0, 0]), Verdict::Keep);
        // Even when all are late: a single second (a stall) passes.
        assert_eq!(judge(&[1, 1, 1]), Verdict::Keep);
    }

    #[test]
    fn a_caller_late_among_callers_on_time_goes_alone() {
        assert_eq!(judge(&[0, 2, 0, 0]), Verdict::Disconnect(vec![1]));
        assert_eq!(judge(&[5, 0, 0, 2, 0]), Verdict::Disconnect(vec![0, 3]));
        // Half late is not "most": still their own links.
        assert_eq!(judge(&[2, 0]), Verdict::Disconnect(vec![0]));
        assert_eq!(judge(&[3, 1, 0, 0]), Verdict::Disconnect(vec![0]));
        // The only caller: nothing says it is the relay; it goes.
        assert_eq!(judge(&[2]), Verdict::Disconnect(vec![0]));
    }

    #[test]
    fn most_late_at_once_sheds_the_newest_due_only() {
        assert_eq!(judge(&[2, 2]), Verdict::Overload(1));
        assert_eq!(judge(&[4, 4, 4, 4, 4]), Verdict::Overload(4));
        // The newest *due*: one late for a second only is not yet due.
        assert_eq!(judge(&[3, 3, 1]), Verdict::Overload(1));
        assert_eq!(judge(&[2, 1, 1, 0]), Verdict::Overload(0));
    }

    #[test]
    fn late_means_drops_with_the_window_open() {
        assert!(late(5, 4, 0, 0, true));
        assert!(late(4, 4, 7, 6, true));
        assert!(!late(4, 4, 6, 6, true));
        // Its receiver stopped reading: the stall rule's case, not this.
        assert!(!late(5, 4, 7, 6, false));
    }
}
