//! What a reload does, decided before anything is touched. Pure: the flows
//! configured now, the flows just loaded and which flows are relaying in,
//! a [`ReloadPlan`] out. [`FlowTable::diff`] classifies every flow; the
//! plan turns that into steps:
//!
//! - removed flows stop (a paused or failed one is just forgotten);
//! - changed flows stop and start again with their new settings (fresh
//!   counters; one whose interface is down stays waiting for it); one that
//!   relays now is replaced make before break by `Daemon::replace_flow`
//!   (its new sockets join before the old ones leave);
//! - added flows start (once their interfaces are up);
//! - unchanged flows are not touched, except one that is not relaying (its
//!   start failed, or it waits for an interface): its retry delay is
//!   cleared, so a failed one is retried at once.
//!
//! Before any of that, [`refuse_emptying`] stops a file with no flows from
//! replacing a configuration that has some, unless the operator asked for
//! it: an empty file is far more often one read while it was being
//! rewritten than an intent.

use std::path::{Path, PathBuf};

use mcrelay_config::{Flow, FlowTable};
use mcrelay_control::ReloadOutcome;

/// A reload refused because it would leave no flow configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{}: this configuration has no flows, so applying it would stop all {flows} configured \
     flows; refused, the running configuration stays. If the file was read while it was being \
     rewritten, replace it atomically instead (write a new file, then rename it over this one) \
     and reload again. To remove every flow on purpose, run `mcrelayctl reload --allow-empty` \
     (control protocol: {{\"v\":1,\"cmd\":\"reload\",\"allow_empty\":true}}); a SIGHUP \
     never removes every flow",
    path.display()
)]
pub struct WouldRemoveEveryFlow {
    /// The configuration file.
    pub path: PathBuf,
    /// How many flows are configured now.
    pub flows: usize,
}

/// Refuse going from `current` to `newer` when that leaves no flow while
/// some are configured, unless `allow_empty`.
pub fn refuse_emptying(
    current: &FlowTable,
    newer: &FlowTable,
    allow_empty: bool,
    path: &Path,
) -> Result<(), WouldRemoveEveryFlow> {
    if newer.is_empty() && !current.is_empty() && !allow_empty {
        return Err(WouldRemoveEveryFlow {
            path: path.to_owned(),
            flows: current.len(),
        });
    }
    Ok(())
}

/// The steps of one reload, and what it reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReloadPlan {
    /// Flows in the new table only, in name order.
    pub added: Vec<String>,
    /// Flows in the running table only, in name order.
    pub removed: Vec<String>,
    /// Flows in both with different settings, in name order.
    pub changed: Vec<String>,
    /// How many flows are in both with the same settings.
    pub unchanged: usize,
    /// Stop (if running) and forget these: the removed, then the changed.
    pub stop: Vec<String>,
    /// Configure these (the reconciler starts them): the changed, then the
    /// added, with their new settings.
    pub start: Vec<Flow>,
    /// Unchanged flows not relaying now: retry them at once.
    pub retry: Vec<String>,
}

impl ReloadPlan {
    /// The plan that takes the daemon from `current` (every configured
    /// flow, relaying or not) to `newer`; `running(name)` tells whether a
    /// flow relays now.
    pub fn new(current: &FlowTable, newer: &FlowTable, running: impl Fn(&str) -> bool) -> Self {
        let diff = current.diff(newer);
        let names = |table: &FlowTable, ids: &[mcrelay_config::FlowKey]| -> Vec<String> {
            ids.iter()
                .filter_map(|&id| table.get(id).map(|f| f.name.clone()))
                .collect()
        };
        let removed = names(current, &diff.removed);
        let changed = names(current, &diff.changed);
        let added = names(newer, &diff.added);
        let start = diff
            .changed
            .iter()
            .chain(&diff.added)
            .filter_map(|&id| newer.get(id).cloned())
            .collect();
        let retry = names(current, &diff.unchanged)
            .into_iter()
            .filter(|name| !running(name))
            .collect();
        Self {
            stop: removed.iter().chain(&changed).cloned().collect(),
            added,
            removed,
            changed,
            unchanged: diff.unchanged.len(),
            start,
            retry,
        }
    }

    /// The outcome this plan reports once applied, before the problems
    /// met applying it are added.
    pub fn outcome(&self) -> ReloadOutcome {
        ReloadOutcome {
            applied: true,
            added: self.added.clone(),
            removed: self.removed.clone(),
            changed: self.changed.clone(),
            unchanged: self.unchanged,
            errors: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::placement::tests::{flow, flow_on};

    fn table(flows: &[Flow]) -> FlowTable {
        FlowTable::new(flows.to_vec()).unwrap()
    }

    fn names(flows: &[Flow]) -> Vec<&str> {
        flows.iter().map(|f| f.name.as_str()).collect()
    }

    #[test]
    fn emptying_a_configuration_needs_allow_empty() {
        let some = table(&[flow("a", 1, None), flow("b", 1, None)]);
        let none = FlowTable::default();
        let path = Path::new("/etc/mcrelay/mcrelay.toml");
        let e = refuse_emptying(&some, &none, false, path).unwrap_err();
        assert_eq!(e.flows, 2);
        let text = e.to_string();
        for part in [
            "/etc/mcrelay/mcrelay.toml: ",
            "stop all 2 configured flows",
            "mcrelayctl reload --allow-empty",
            "\"allow_empty\":true",
            "a SIGHUP never removes every flow",
            "rename",
        ] {
            assert!(text.contains(part), "{part:?} missing from: {text}");
        }
        assert_eq!(refuse_emptying(&some, &none, true, path), Ok(()));
        // Nothing to lose, or something left: no question asked.
        assert_eq!(refuse_emptying(&none, &none, false, path), Ok(()));
        let other = table(&[flow("c", 1, None)]);
        assert_eq!(refuse_emptying(&some, &other, false, path), Ok(()));
    }

    #[test]
    fn each_flow_gets_the_step_its_diff_calls_for() {
        let current = table(&[
            flow("gone", 1, None),
            flow("moved", 1, None),
            flow("same", 2, None),
        ]);
        let newer = table(&[
            flow("fresh", 1, None),
            flow_on("moved", 5001, 1, None),
            flow("same", 2, None),
        ]);
        let plan = ReloadPlan::new(&current, &newer, |_| true);
        assert_eq!(plan.added, ["fresh"]);
        assert_eq!(plan.removed, ["gone"]);
        assert_eq!(plan.changed, ["moved"]);
        assert_eq!(plan.unchanged, 1);
        assert_eq!(plan.stop, ["gone", "moved"]);
        // The changed flow starts again with its new settings.
        assert_eq!(names(&plan.start), ["moved", "fresh"]);
        assert_eq!(plan.start[0].primary().port, 5001);
        assert!(plan.retry.is_empty());
        let outcome = plan.outcome();
        assert!(outcome.applied && outcome.errors.is_empty());
        assert_eq!(
            (
                outcome.added,
                outcome.removed,
                outcome.changed,
                outcome.unchanged
            ),
            (
                vec!["fresh".into()],
                vec!["gone".into()],
                vec!["moved".into()],
                1
            )
        );
    }

    #[test]
    fn the_same_file_again_touches_nothing_that_relays() {
        let current = table(&[flow("a", 1, None), flow("b", 3, Some(1))]);
        let plan = ReloadPlan::new(&current, &current.clone(), |_| true);
        assert_eq!(
            plan,
            ReloadPlan {
                unchanged: 2,
                ..ReloadPlan::default()
            }
        );
    }

    #[test]
    fn an_unchanged_flow_that_is_not_relaying_is_retried() {
        let current = table(&[flow("failed", 1, None), flow("ok", 1, None)]);
        let plan = ReloadPlan::new(&current, &current.clone(), |name| name == "ok");
        assert_eq!(plan.retry, ["failed"]);
        assert!(plan.stop.is_empty() && plan.start.is_empty());
        assert_eq!(plan.unchanged, 2);
    }

    #[test]
    fn a_changed_core_restarts_the_flow() {
        let current = table(&[flow("a", 1, None)]);
        let newer = table(&[flow("a", 1, Some(3))]);
        let plan = ReloadPlan::new(&current, &newer, |_| true);
        assert_eq!(plan.changed, ["a"]);
        assert_eq!(plan.stop, ["a"]);
        assert_eq!(plan.start[0].core, Some(3));
    }

    #[test]
    fn removed_and_changed_flows_are_stopped_whether_or_not_they_relay() {
        // A paused flow that is removed must be forgotten all the same.
        let current = table(&[flow("paused", 1, None), flow("x", 1, None)]);
        let newer = table(&[flow_on("x", 7000, 1, None)]);
        let plan = ReloadPlan::new(&current, &newer, |_| false);
        assert_eq!(plan.stop, ["paused", "x"]);
        assert!(plan.retry.is_empty());
    }

    #[test]
    fn from_nothing_everything_is_added_and_to_nothing_everything_removed() {
        let some = table(&[flow("a", 1, None), flow("b", 1, None)]);
        let none = FlowTable::default();
        let up = ReloadPlan::new(&none, &some, |_| false);
        assert_eq!((up.added.len(), up.start.len()), (2, 2));
        let down = ReloadPlan::new(&some, &none, |_| true);
        assert_eq!(down.removed, ["a", "b"]);
        assert_eq!(down.stop, ["a", "b"]);
        assert!(down.start.is_empty());
    }

    proptest::proptest! {
        /// Whatever the two tables and which flows relay: every flow of
        /// either table gets exactly one verdict, the steps follow from the
        /// verdicts, and applying them to the current names gives the new
        /// table's names.
        #[test]
        fn every_flow_gets_one_verdict_and_the_steps_reach_the_new_table(
            old in proptest::collection::btree_map(0u8..12, (5000u16..5003, proptest::bool::ANY), 0..8),
            new in proptest::collection::btree_map(0u8..12, 5000u16..5003, 0..8),
        ) {
            let name = |n: u8| format!("f{n}");
            let current = table(&old.iter().map(|(&n, &(port, _))| flow_on(&name(n), port, 1, None)).collect::<Vec<_>>());
            let newer = table(&new.iter().map(|(&n, &port)| flow_on(&name(n), port, 1, None)).collect::<Vec<_>>());
            let running = |f: &str| old.iter().any(|(&n, &(_, r))| r && name(n) == f);
            let plan = ReloadPlan::new(&current, &newer, running);
            let all: std::collections::BTreeSet<u8> = old.keys().chain(new.keys()).copied().collect();
            proptest::prop_assert_eq!(
                plan.added.len() + plan.removed.len() + plan.changed.len() + plan.unchanged,
                all.len()
            );
            let mut names: std::collections::BTreeSet<String> = current.iter().map(|f| f.name.clone()).collect();
            for n in &plan.stop {
                proptest::prop_assert!(names.remove(n), "stopped {} twice or unknown", n);
            }
            for f in &plan.start {
                proptest::prop_assert!(names.insert(f.name.clone()), "started {} twice", f.name);
                proptest::prop_assert_eq!(Some(f), newer.by_name(&f.name));
            }
            let wanted: std::collections::BTreeSet<String> = newer.iter().map(|f| f.name.clone()).collect();
            proptest::prop_assert_eq!(names, wanted);
            for n in &plan.retry {
                proptest::prop_assert!(!running(n));
                proptest::prop_assert_eq!(current.by_name(n), newer.by_name(n));
            }
        }
    }
}
