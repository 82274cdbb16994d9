//! The flows that need the loop's attention at the end of a turn — a
//! receive to re-arm, a pause to lift, frames left in a packet ring — so a
//! turn visits those and not every flow: with a thousand flows, walking
//! them all on each turn (at low rates, each datagram is a turn) made the
//! CPU per datagram grow with the number of flows.
//!
//! A flow is queued at most once (a flag per flow number), so the lists
//! never hold more entries than flow numbers; their room is reserved when
//! a flow is placed (on the control plane's schedule), never on the packet
//! path.

use mcrelay_relay::FlowId;

#[derive(Debug, Default)]
pub(super) struct Attention {
    /// Whether each flow number is queued in `queue`.
    queued: Vec<bool>,
    queue: Vec<FlowId>,
    /// The list being visited; kept to reuse its room.
    spare: Vec<FlowId>,
}

impl Attention {
    /// Room for flow numbers below `flows` (called when a flow is placed).
    pub(super) fn reserve(&mut self, flows: usize) {
        if self.queued.len() < flows {
            self.queued.resize(flows, false);
        }
        self.queue.reserve(flows.saturating_sub(self.queue.len()));
        self.spare.reserve(flows.saturating_sub(self.spare.len()));
    }

    /// Queue `f` for the end of this turn (once).
    pub(super) fn notice(&mut self, f: FlowId) {
        if let Some(q) = self.queued.get_mut(f.index())
            && !*q
        {
            *q = true;
            self.queue.push(f);
        }
    }

    /// The flows queued so far, to visit (flows noticed while visiting go
    /// to the next turn's list); hand the list back with [`Self::done`].
    pub(super) fn take(&mut self) -> Vec<FlowId> {
        let mut list = std::mem::take(&mut self.spare);
        std::mem::swap(&mut list, &mut self.queue);
        for f in &list {
            if let Some(q) = self.queued.get_mut(f.index()) {
                *q = false;
            }
        }
        list
    }

    pub(super) fn done(&mut self, mut list: Vec<FlowId>) {
        list.clear();
        self.spare = list;
    }

    /// Queued flows (for the turn's "anything left to do?" check).
    pub(super) fn queued(&self) -> &[FlowId] {
        &self.queue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: usize) -> FlowId {
        FlowId::new(n).expect("in range")
    }

    #[test]
    fn a_flow_is_queued_once_and_revisited_only_if_noticed_again() {
        let mut a = Attention::default();
        a.reserve(4);
        a.notice(id(2));
        a.notice(id(0));
        a.notice(id(2));
        assert_eq!(a.queued(), [id(2), id(0)]);
        let list = a.take();
        assert_eq!(list, [id(2), id(0)]);
        assert!(a.queued().is_empty());
        // Noticed while visiting: next turn.
        a.notice(id(2));
        a.done(list);
        assert_eq!(a.take(), [id(2)]);
        assert!(a.take().is_empty(), "nothing noticed: nothing to visit");
    }

    #[test]
    fn beyond_the_reserved_numbers_is_ignored_and_nothing_grows() {
        let mut a = Attention::default();
        a.reserve(2);
        let room = |a: &Attention| {
            let (x, y) = (a.queue.capacity(), a.spare.capacity());
            (x.min(y), x.max(y))
        };
        let before = room(&a);
        for _ in 0..3 {
            a.notice(id(0));
            a.notice(id(1));
            a.notice(id(7));
            let l = a.take();
            assert_eq!(l, [id(0), id(1)]);
            a.done(l);
        }
        assert!(before.0 >= 2);
        assert_eq!(room(&a), before, "the two lists swap, neither grows");
    }
}
