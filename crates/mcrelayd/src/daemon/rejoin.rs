//! A leg whose interface is deleted and created again: the kernel drops
//! the group memberships of a deleted interface, while the leg's socket
//! stays open and its flow keeps relaying from its other legs. Once
//! netlink reports the interface back under a new index and up, the flow
//! is replaced by itself on its worker, make before break
//! ([`Command::Replace`]: new sockets joined first, the new flow taking
//! the old one's redundancy state over), so the other legs lose nothing
//! and the leg receives again. Its counters go on (as after a pause).

use std::collections::{HashMap, HashSet};

use mcrelay_config::FlowKey;
use mcrelay_uring::{Command, Event};

use super::error::FlowCommandError;
use super::report::note_outputs;
use super::{Daemon, blocked, lock};
use crate::links::{InterfaceState, LinkTable};

/// Interface indexes as last seen, and the flows waiting to rejoin.
#[derive(Debug, Default)]
pub(super) struct Rejoin {
    /// Each interface's index when last seen (kept while it is missing,
    /// so a delete and a create reported apart are still told).
    seen: HashMap<String, u32>,
    /// Running flows with a leg on a re-created interface: the flow's
    /// key and the interface, until the flow is replaced.
    pending: Vec<(FlowKey, String)>,
}

impl Rejoin {
    /// Remember `table`'s indexes; the interfaces whose index changed
    /// since they were last seen (deleted and created again).
    pub(super) fn note(&mut self, table: &LinkTable) -> Vec<String> {
        let mut recreated = Vec::new();
        for (name, index) in table.indexes() {
            match self.seen.insert(name.to_owned(), index) {
                Some(before) if before != index => recreated.push(name.to_owned()),
                _ => {}
            }
        }
        recreated
    }
}

impl Daemon {
    /// Replace the running flows with a leg on an interface in
    /// `recreated` (and those still waiting from before) once that
    /// interface is up and the flow could start (every leg's interface
    /// exists); a flow paused meanwhile rejoins when it starts again.
    pub(super) fn rejoin_legs(&mut self, recreated: &[String]) {
        for m in self.flows.iter().filter(|m| m.running) {
            for input in &m.flow.inputs {
                let pair = (m.key(), input.interface.clone());
                if recreated.contains(&input.interface) && !self.rejoin.pending.contains(&pair) {
                    self.rejoin.pending.push(pair);
                }
            }
        }
        let pending = std::mem::take(&mut self.rejoin.pending);
        let mut done: HashSet<FlowKey> = HashSet::new();
        for (key, interface) in pending {
            let Some(m) = self.flows.get(key) else {
                continue;
            };
            if !m.running || done.contains(&key) {
                continue;
            }
            let name = m.flow.name.clone();
            let links = self.links.as_ref();
            let up = links.is_none_or(|l| l.state(&interface) == InterfaceState::Up);
            if !up || blocked(links, &m.flow, false).is_some() {
                self.rejoin.pending.push((key, interface));
                continue;
            }
            match self.rejoin_flow(key) {
                Ok(()) => {
                    tracing::info!(
                        flow = %name,
                        interface = %interface,
                        "interface re-created: the flow is replaced without a gap and its leg joins again"
                    );
                    done.insert(key);
                }
                Err(e) => {
                    tracing::warn!(
                        flow = %name,
                        interface = %interface,
                        "interface re-created, the leg could not join again: {}; retried at the next interface change",
                        crate::chain::Chain(&e)
                    );
                    self.rejoin.pending.push((key, interface));
                }
            }
        }
    }

    /// Replace running flow `key` by itself on its workers (new sockets,
    /// same counters), one [`Command::Replace`] per shard.
    fn rejoin_flow(&mut self, key: FlowKey) -> Result<(), FlowCommandError> {
        let opened = self.open_counted(key)?;
        let m = self.flows.get(key).ok_or(FlowCommandError::NotPublished)?;
        let kept = super::reload::kept_legs(&m.flow, &m.flow);
        let name = m.flow.name.clone();
        let workers = m.workers.clone();
        for (shard, &w) in opened.shards.into_iter().zip(&workers) {
            let handle = self.workers.get(w).ok_or(FlowCommandError::NoSuchWorker)?;
            let replace = Command::Replace {
                flow: Box::new(shard),
                kept,
            };
            if handle.command(replace).is_err() {
                return Err(FlowCommandError::NotTakingCommands { worker: w });
            }
        }
        if let Err(e) = self.await_replaced(&name, workers.len()) {
            // The old flow is gone either way: the reconciler starts the
            // flow again.
            if let Some((m, entry)) = self.flows.both_mut(&mut lock(&self.shared).flows, key) {
                m.running = false;
                m.unconnected.clear();
                entry.close_ingress();
            }
            return Err(e);
        }
        let mut shared = lock(&self.shared);
        if let Some((m, e)) = self.flows.both_mut(&mut shared.flows, key) {
            e.close_ingress();
            e.ingress = Some(opened.ingress);
            e.own = opened.own;
            m.unconnected = note_outputs(e, opened.pending);
        }
        Ok(())
    }

    /// Wait for the two answers to each of `shards` [`Command::Replace`]s
    /// about flow `name`: the new flow added (or refused: the error) and
    /// the old one gone.
    pub(super) fn await_replaced(&self, name: &str, shards: usize) -> Result<(), FlowCommandError> {
        let (mut added, mut removed, mut refused) = (0, 0, None);
        while added < shards || removed < shards {
            match self.await_event(name)? {
                Event::FlowAdded { .. } => added += 1,
                Event::FlowRefused { worker, reason, .. } => {
                    added += 1;
                    refused = Some(FlowCommandError::Refused {
                        worker,
                        answer: reason,
                    });
                }
                Event::FlowRemoved { .. } | Event::FlowUnknown { .. } => removed += 1,
                // `await_event` answers about flows only.
                Event::ModeSet { .. } => {}
            }
        }
        refused.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::links::LinkMessage;

    fn link(table: &mut LinkTable, name: &str, index: u32, deleted: bool) {
        table.apply(&LinkMessage {
            deleted,
            family: 0,
            index,
            flags: 0,
            name: Some(name.into()),
            operstate: None,
        });
    }

    #[test]
    fn an_interface_deleted_and_created_again_is_told_even_across_two_changes() {
        let mut r = Rejoin::default();
        let mut t = LinkTable::default();
        link(&mut t, "leg0", 5, false);
        link(&mut t, "leg1", 6, false);
        assert!(r.note(&t).is_empty(), "first sight");
        link(&mut t, "leg1", 6, true);
        assert!(r.note(&t).is_empty(), "deleted: nothing to rejoin yet");
        link(&mut t, "leg1", 9, false);
        assert_eq!(r.note(&t), ["leg1"], "back under a new index");
        assert!(r.note(&t).is_empty(), "told once");
        link(&mut t, "leg1", 9, false);
        assert!(r.note(&t).is_empty(), "same index: only down and up");
    }

    #[test]
    fn kept_legs_are_the_same_input_at_the_same_position() {
        use crate::daemon::placement::tests::flow_with_legs;
        use crate::daemon::reload::kept_legs;
        let three = flow_with_legs("f", 3); // eth0, eth1, eth2
        assert_eq!(kept_legs(&three, &three), 0b111, "a rejoin keeps every leg");
        assert_eq!(
            kept_legs(&flow_with_legs("f", 2), &three),
            0b011,
            "a leg added"
        );
        let mut moved = three.clone();
        moved.inputs.swap(0, 2);
        assert_eq!(
            kept_legs(&three, &moved),
            0b010,
            "reordered legs start anew"
        );
    }
}
