//! When each redundancy flow next needs the core's attention: a timer
//! wheel of [`SLOTS`] slots of 2^[`SHIFT`] ns (about 1.05 ms), each a
//! doubly linked list of flows threaded through a per-flow link, so
//! arming, re-arming and disarming are O(1) and a loop turn looks only
//! at the slots its clock passed and the flows in them — never at every
//! flow. A flow is in at most one slot. A timer fires in the first turn
//! at or after its deadline rounded up to a slot (at most a slot late);
//! one further off than the wheel spans fires early, and the flow simply
//! arms again for what is left.

use crate::FlowId;

/// log2 of a slot's length in ns.
pub const SHIFT: u32 = 20;
/// Slots in the wheel (it spans about 537 ms).
pub const SLOTS: usize = 512;

const NONE: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Link {
    prev: u32,
    next: u32,
    /// The slot tick it fires at; `None` when not armed.
    at: Option<u64>,
}

const UNLINKED: Link = Link {
    prev: NONE,
    next: NONE,
    at: None,
};

#[derive(Debug)]
pub(crate) struct Timers {
    /// First flow of each slot.
    heads: Box<[u32]>,
    /// Indexed by flow number.
    links: Vec<Link>,
    /// The last slot tick expired.
    last: u64,
    /// Flows armed.
    armed: usize,
}

fn slot_of(tick: u64) -> usize {
    // SLOTS is a power of two below 2^16: the remainder fits.
    usize::try_from(tick % SLOTS as u64).unwrap_or(0)
}

impl Timers {
    pub(crate) fn new() -> Self {
        Self {
            heads: vec![NONE; SLOTS].into_boxed_slice(),
            links: Vec::new(),
            last: 0,
            armed: 0,
        }
    }

    /// Room for flow numbers below `flows` (control plane: a flow added).
    pub(crate) fn reserve(&mut self, flows: usize) {
        if self.links.len() < flows {
            self.links.resize(flows, UNLINKED);
        }
    }

    /// Fire for `flow` at `deadline_ns` or earlier than it would: an
    /// earlier timer already armed stays (the flow re-arms when it
    /// fires).
    pub(crate) fn arm(&mut self, flow: FlowId, deadline_ns: u64) {
        let Ok(i) = u32::try_from(flow.index()) else {
            return;
        };
        let tick = deadline_ns
            .div_ceil(1 << SHIFT)
            .clamp(self.last + 1, self.last + SLOTS as u64 - 1);
        let Some(link) = self.links.get(flow.index()) else {
            return;
        };
        if link.at.is_some_and(|at| at <= tick) {
            return;
        }
        self.disarm(flow);
        let slot = slot_of(tick);
        let head = self.heads[slot];
        if let Some(h) = self.links.get_mut(head as usize) {
            h.prev = i;
        }
        self.links[flow.index()] = Link {
            prev: NONE,
            next: head,
            at: Some(tick),
        };
        self.heads[slot] = i;
        self.armed += 1;
    }

    pub(crate) fn disarm(&mut self, flow: FlowId) {
        let Some(&link) = self.links.get(flow.index()) else {
            return;
        };
        let Some(at) = link.at else {
            return;
        };
        match self.links.get_mut(link.prev as usize) {
            Some(p) => p.next = link.next,
            None => self.heads[slot_of(at)] = link.next,
        }
        if let Some(n) = self.links.get_mut(link.next as usize) {
            n.prev = link.prev;
        }
        self.links[flow.index()] = UNLINKED;
        self.armed -= 1;
    }

    /// The start of the next slot when a timer is armed: no timer fires
    /// before it.
    pub(crate) fn next_ns(&self) -> Option<u64> {
        (self.armed > 0).then(|| (self.last + 1) << SHIFT)
    }

    /// Every flow whose timer fired by `now_ns`, into `due` (disarmed).
    pub(crate) fn expire(&mut self, now_ns: u64, due: &mut Vec<FlowId>) {
        let target = now_ns >> SHIFT;
        if target <= self.last {
            return;
        }
        let steps = (target - self.last).min(SLOTS as u64);
        for tick in self.last + 1..=self.last + steps {
            let slot = slot_of(tick);
            let mut i = std::mem::replace(&mut self.heads[slot], NONE);
            while let Some(link) = self.links.get_mut(i as usize) {
                let next = link.next;
                *link = UNLINKED;
                self.armed -= 1;
                if let Some(flow) = FlowId::new(i as usize) {
                    due.push(flow);
                }
                i = next;
            }
        }
        self.last = target;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(i: usize) -> FlowId {
        FlowId::new(i).expect("small")
    }

    const MS: u64 = 1 << SHIFT;

    #[test]
    fn fires_at_the_deadline_rounded_up_to_a_slot_and_only_once() {
        let mut t = Timers::new();
        t.reserve(4);
        let mut due = Vec::new();
        t.arm(flow(1), 10 * MS + 5);
        t.arm(flow(2), 3 * MS);
        t.expire(3 * MS - 1, &mut due);
        assert!(due.is_empty());
        assert_eq!(t.next_ns(), Some(3 * MS), "armed: from the next slot");
        t.expire(3 * MS, &mut due);
        assert_eq!(due, [flow(2)]);
        due.clear();
        t.expire(11 * MS - 1, &mut due);
        assert!(due.is_empty(), "not before its deadline");
        t.expire(11 * MS, &mut due);
        assert_eq!(due, [flow(1)]);
        due.clear();
        t.expire(100 * MS, &mut due);
        assert!(due.is_empty());
        assert_eq!(t.next_ns(), None, "nothing armed");
    }

    #[test]
    fn an_earlier_deadline_re_arms_a_later_one_stays_and_disarm_unlinks() {
        let mut t = Timers::new();
        t.reserve(4);
        let mut due = Vec::new();
        t.arm(flow(0), 50 * MS);
        t.arm(flow(1), 50 * MS);
        t.arm(flow(2), 50 * MS);
        t.arm(flow(1), 5 * MS);
        t.arm(flow(0), 80 * MS);
        t.disarm(flow(2));
        t.expire(5 * MS, &mut due);
        assert_eq!(due, [flow(1)]);
        due.clear();
        t.expire(60 * MS, &mut due);
        assert_eq!(due, [flow(0)]);
    }

    #[test]
    fn a_deadline_past_the_wheel_fires_early_and_a_long_gap_fires_everything() {
        let mut t = Timers::new();
        t.reserve(2);
        let mut due = Vec::new();
        t.arm(flow(0), 10_000 * MS);
        t.expire(600 * MS, &mut due);
        assert_eq!(due, [flow(0)], "at most the wheel's span ahead");
        due.clear();
        t.arm(flow(1), 700 * MS);
        t.expire(1_000_000 * MS, &mut due);
        assert_eq!(due, [flow(1)]);
    }
}
