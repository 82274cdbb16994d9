//! The supervisor's one flow table: every configured flow, relaying or
//! not, keyed by its config identity ([`FlowKey`], the hash of its name
//! that `FlowTable::diff` matches flows by).
//!
//! A flow has two halves. [`Managed`] is the supervisor's (its config,
//! workers, retry state, outputs to reconnect) and lives in [`Flows`],
//! outside the readers' lock, so a reload opening sockets never holds up
//! the control socket or the metrics endpoint. [`FlowEntry`] is what
//! readers see (counters, state) and lives in [`Entries`], inside
//! [`super::Shared`]. Both are kept in start order, at the same position,
//! and [`Flows`] holds the one index from key to that position: every
//! lookup of either half is by key through it, and only this module
//! inserts or removes, so the two halves never disagree about which flows
//! exist. A renamed flow is a new key: removed, then inserted.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use mcrelay_config::{Flow, FlowKey};

use super::report::FlowEntry;
use crate::outputs::Unconnected;

/// A configured flow, as the supervisor tracks it.
#[derive(Debug)]
pub(super) struct Managed {
    /// Its settings; `flow.id` is its key in [`Flows`] and never changes
    /// while it is there (a changed flow keeps its name).
    pub(super) flow: Flow,
    /// Its workers (shard `k` on the `k`th; one without `spread`), chosen
    /// once: a paused flow resumes on the same ones.
    pub(super) workers: Vec<usize>,
    /// On its worker now.
    pub(super) running: bool,
    /// After a failed start: not before this instant, and the delay after
    /// the next failure.
    pub(super) retry: Option<(Instant, Duration)>,
    /// Its outputs not connected yet, while it runs.
    pub(super) unconnected: Vec<Unconnected>,
}

impl Managed {
    /// `flow` on `workers`, not running yet.
    pub(super) fn stopped(flow: Flow, workers: Vec<usize>) -> Self {
        Self {
            flow,
            workers,
            running: false,
            retry: None,
            unconnected: Vec::new(),
        }
    }

    pub(super) fn key(&self) -> FlowKey {
        self.flow.id
    }
}

/// The readers' half of every configured flow, in start order (the
/// order snapshots list them in). Read by anyone holding the readers'
/// lock; changed in shape only through [`Flows`].
#[derive(Debug, Default)]
pub(super) struct Entries(Vec<FlowEntry>);

impl Entries {
    pub(super) fn iter(&self) -> std::slice::Iter<'_, FlowEntry> {
        self.0.iter()
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }
}

/// The supervisor's half of every configured flow, in start order, and
/// the index of both halves by key.
#[derive(Debug, Default)]
pub(super) struct Flows {
    managed: Vec<Managed>,
    /// Each flow's position in `managed` and in the [`Entries`] beside it.
    at: HashMap<FlowKey, usize>,
}

impl Flows {
    /// Add a flow's two halves at the end (the flow last in start order).
    /// A flow already there under the same key is replaced in place, and
    /// its halves handed back (an inconsistency: the caller meant it gone).
    pub(super) fn insert(
        &mut self,
        entries: &mut Entries,
        managed: Managed,
        entry: FlowEntry,
    ) -> Option<(Managed, FlowEntry)> {
        let key = managed.key();
        if let Some(&i) = self.at.get(&key)
            && let (Some(m), Some(e)) = (self.managed.get_mut(i), entries.0.get_mut(i))
        {
            return Some((std::mem::replace(m, managed), std::mem::replace(e, entry)));
        }
        self.at.insert(key, self.managed.len());
        self.managed.push(managed);
        entries.0.push(entry);
        None
    }

    /// Take flow `key`'s two halves out; the flows after it move up one
    /// place, keeping start order.
    pub(super) fn remove(
        &mut self,
        entries: &mut Entries,
        key: FlowKey,
    ) -> Option<(Managed, FlowEntry)> {
        let i = self.at.remove(&key)?;
        if i >= self.managed.len() || i >= entries.0.len() {
            return None;
        }
        let pair = (self.managed.remove(i), entries.0.remove(i));
        for at in self.at.values_mut() {
            if *at > i {
                *at -= 1;
            }
        }
        Some(pair)
    }

    pub(super) fn get(&self, key: FlowKey) -> Option<&Managed> {
        self.managed.get(*self.at.get(&key)?)
    }

    pub(super) fn get_mut(&mut self, key: FlowKey) -> Option<&mut Managed> {
        self.managed.get_mut(*self.at.get(&key)?)
    }

    /// Flow `key`'s readers' half.
    pub(super) fn entry<'e>(&self, entries: &'e Entries, key: FlowKey) -> Option<&'e FlowEntry> {
        entries.0.get(*self.at.get(&key)?)
    }

    pub(super) fn entry_mut<'e>(
        &self,
        entries: &'e mut Entries,
        key: FlowKey,
    ) -> Option<&'e mut FlowEntry> {
        entries.0.get_mut(*self.at.get(&key)?)
    }

    /// Both halves of flow `key`, to change together.
    pub(super) fn both_mut<'e>(
        &mut self,
        entries: &'e mut Entries,
        key: FlowKey,
    ) -> Option<(&mut Managed, &'e mut FlowEntry)> {
        let i = *self.at.get(&key)?;
        Some((self.managed.get_mut(i)?, entries.0.get_mut(i)?))
    }

    /// The flow at `position` in start order.
    pub(super) fn at(&self, position: usize) -> Option<&Managed> {
        self.managed.get(position)
    }

    /// In start order.
    pub(super) fn iter(&self) -> std::slice::Iter<'_, Managed> {
        self.managed.iter()
    }

    pub(super) fn iter_mut(&mut self) -> std::slice::IterMut<'_, Managed> {
        self.managed.iter_mut()
    }

    pub(super) fn len(&self) -> usize {
        self.managed.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::placement::tests::{flow, flow_on};
    use crate::daemon::report::new_entry;

    fn add(flows: &mut Flows, entries: &mut Entries, f: Flow) -> Option<(Managed, FlowEntry)> {
        let entry = new_entry(&f, &[0]);
        flows.insert(entries, Managed::stopped(f, vec![0]), entry)
    }

    /// Both halves hold the same flows at the same places, and every key
    /// finds its own.
    fn in_step(flows: &Flows, entries: &Entries) -> Vec<String> {
        assert_eq!(flows.len(), entries.len());
        assert_eq!(flows.at.len(), flows.len(), "one index entry per flow");
        let names: Vec<String> = flows.iter().map(|m| m.flow.name.clone()).collect();
        let published: Vec<String> = entries.iter().map(|e| e.stats.name.clone()).collect();
        assert_eq!(names, published);
        for m in flows.iter() {
            let key = FlowKey::from_name(&m.flow.name);
            assert_eq!(flows.get(key).map(|m| &m.flow.name), Some(&m.flow.name));
            assert_eq!(
                flows.entry(entries, key).map(|e| &e.stats.name),
                Some(&m.flow.name)
            );
        }
        names
    }

    #[test]
    fn both_halves_stay_in_step_through_inserts_and_removes() {
        let (mut flows, mut entries) = (Flows::default(), Entries::default());
        for name in ["c", "a", "b", "d"] {
            assert!(add(&mut flows, &mut entries, flow(name, 1, None)).is_none());
        }
        assert_eq!(
            in_step(&flows, &entries),
            ["c", "a", "b", "d"],
            "start order"
        );
        let (m, e) = flows
            .remove(&mut entries, FlowKey::from_name("a"))
            .expect("a is there");
        assert_eq!((m.flow.name.as_str(), e.stats.name.as_str()), ("a", "a"));
        assert_eq!(
            in_step(&flows, &entries),
            ["c", "b", "d"],
            "the rest moved up"
        );
        assert!(
            flows
                .remove(&mut entries, FlowKey::from_name("a"))
                .is_none()
        );
        assert!(flows.get(FlowKey::from_name("a")).is_none());
        assert!(flows.entry(&entries, FlowKey::from_name("a")).is_none());
        flows.remove(&mut entries, FlowKey::from_name("d"));
        flows.remove(&mut entries, FlowKey::from_name("c"));
        add(&mut flows, &mut entries, flow("e", 1, None));
        assert_eq!(in_step(&flows, &entries), ["b", "e"]);
        flows.remove(&mut entries, FlowKey::from_name("b"));
        flows.remove(&mut entries, FlowKey::from_name("e"));
        assert_eq!(in_step(&flows, &entries), Vec::<String>::new());
    }

    #[test]
    fn a_rename_is_a_remove_and_an_add_under_a_new_key() {
        let (mut flows, mut entries) = (Flows::default(), Entries::default());
        add(&mut flows, &mut entries, flow("old", 1, None));
        add(&mut flows, &mut entries, flow("other", 1, None));
        flows.remove(&mut entries, FlowKey::from_name("old"));
        add(&mut flows, &mut entries, flow("new", 1, None));
        assert_eq!(in_step(&flows, &entries), ["other", "new"]);
        assert!(flows.get(FlowKey::from_name("old")).is_none());
    }

    #[test]
    fn a_key_inserted_twice_replaces_both_halves_in_place() {
        let (mut flows, mut entries) = (Flows::default(), Entries::default());
        add(&mut flows, &mut entries, flow_on("x", 5000, 1, None));
        add(&mut flows, &mut entries, flow("y", 1, None));
        let (old, old_entry) =
            add(&mut flows, &mut entries, flow_on("x", 6000, 1, None)).expect("x was there");
        assert_eq!(old.flow.primary().port, 5000);
        assert_eq!(old_entry.stats.name, "x");
        assert_eq!(in_step(&flows, &entries), ["x", "y"], "same place");
        let x = flows.get(FlowKey::from_name("x")).expect("x");
        assert_eq!(x.flow.primary().port, 6000);
    }

    #[test]
    fn both_halves_change_together_and_lookups_are_by_key() {
        let (mut flows, mut entries) = (Flows::default(), Entries::default());
        for n in 0..100 {
            add(&mut flows, &mut entries, flow(&format!("f{n}"), 1, None));
        }
        let key = FlowKey::from_name("f43");
        let (m, e) = flows.both_mut(&mut entries, key).expect("f43");
        m.running = true;
        e.interface_pauses = 7;
        assert!(flows.get(key).is_some_and(|m| m.running));
        assert_eq!(
            flows.entry(&entries, key).map(|e| e.interface_pauses),
            Some(7)
        );
        if let Some(m) = flows.get_mut(key) {
            m.workers = vec![3];
        }
        if let Some(e) = flows.entry_mut(&mut entries, key) {
            e.interface_pauses += 1;
        }
        for n in (0..100).step_by(3) {
            flows.remove(&mut entries, FlowKey::from_name(&format!("f{n}")));
        }
        in_step(&flows, &entries);
        let (m, e) = (flows.get(key), flows.entry(&entries, key));
        assert_eq!(m.map(|m| &m.workers[..]), Some(&[3][..]));
        assert_eq!(e.map(|e| e.interface_pauses), Some(8));
        assert_eq!(flows.at(0).map(|m| m.flow.name.as_str()), Some("f1"));
    }
}
