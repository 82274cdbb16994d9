//! Applying a reload: read and check the file, build the
//! [`ReloadPlan`], stop what it removes or changes, configure what it adds
//! or changes, and let [`Daemon::reconcile`] start them.

use std::collections::{HashMap, HashSet};

use mcrelay_config::{Flow, FlowKey};
use mcrelay_control::{DaemonState, FlowState, ReloadOutcome};

use mcrelay_uring::{Command, Event, FlowSockets};

use super::error::FlowCommandError;
use super::placement::{Placement, PlacementError};
use super::plan::{self, ReloadPlan};
use super::report::{Before, FlowEntry, new_entry};
use super::{Daemon, Managed, ReloadProblem, lock};

/// A changed flow's replacement, ready to hand to its workers: its new
/// sockets per shard (opened and joined), outputs not connected yet, its
/// new readers' entry and its workers.
struct Prepared {
    shards: Vec<FlowSockets>,
    pending: Vec<(crate::outputs::Unconnected, std::io::Error)>,
    entry: super::report::FlowEntry,
    workers: Vec<usize>,
}

/// Why a changed flow could not be replaced (or, not relaying before,
/// configured again).
#[derive(Debug, thiserror::Error)]
enum ReplaceError {
    #[error(transparent)]
    Placement(PlacementError),
    #[error(transparent)]
    Command(#[from] FlowCommandError),
}

impl Daemon {
    /// Re-read the config file and apply the difference (a
    /// [`ReloadPlan`]): removed flows stop (or, if paused, are forgotten),
    /// added ones start, changed ones restart — added and changed ones only
    /// once their interfaces are up — and unchanged ones are not touched
    /// (one that failed to start is retried at once). A file that doesn't
    /// validate changes nothing; nor does one with no flows while some are
    /// configured, unless `allow_empty` ([`plan::refuse_emptying`]).
    pub fn reload(&mut self, allow_empty: bool) -> ReloadOutcome {
        let before = std::mem::replace(&mut lock(&self.shared).state, DaemonState::Reloading);
        self.reloading = true;
        // The helper re-reads its copy of the file while this process reads
        // its own: the two parses overlap instead of adding up.
        let mut helper = Some(self.opener.start_reload());
        let outcome = self.apply_reload(allow_empty, &mut helper);
        // Not taken (no flow to start): read the answer, keeping the
        // connection in step. Its errors matter only to starting flows
        // (a rejected file is rejected by both); a dead helper is noticed
        // and replaced by `check_helper`.
        if let Some(Ok(true)) = helper
            && let Err(e) = self.opener.finish_reload()
            && outcome.applied
        {
            tracing::warn!("the helper's reload: {}", crate::chain::Chain(&e));
        }
        self.reloading = false;
        if outcome.applied {
            self.refresh_state();
        } else {
            // Rejected: the running config stays, and so does its state.
            self.set_state(before);
        }
        outcome
    }

    /// `helper`: the helper's reload, started by the caller; taken (and
    /// its answer read) here when flows are to be started.
    fn apply_reload(
        &mut self,
        allow_empty: bool,
        helper: &mut Option<Result<bool, crate::sockets::HelperReloadError>>,
    ) -> ReloadOutcome {
        let new = match mcrelay_config::load(&self.path) {
            Ok(c) => c,
            Err(errors) => {
                tracing::error!("reload rejected; the running configuration stays:\n{errors}");
                return ReloadOutcome {
                    errors: errors.to_string().lines().map(str::to_owned).collect(),
                    ..ReloadOutcome::default()
                };
            }
        };
        if let Err(e) = crate::fdbudget::at_reload(&self.path, &new) {
            tracing::error!("reload rejected; the running configuration stays:\n{e}");
            return ReloadOutcome {
                errors: vec![e],
                ..ReloadOutcome::default()
            };
        }
        if let Err(e) = crate::kernel_limits::at_load(&self.path, &new) {
            tracing::error!("reload rejected; the running configuration stays:\n{e}");
            return ReloadOutcome {
                errors: vec![e.to_string()],
                ..ReloadOutcome::default()
            };
        }
        if let Err(e) = super::placement::spread_fits(&new, self.workers.len()) {
            tracing::error!("reload rejected; the running configuration stays: {e}");
            return ReloadOutcome {
                errors: vec![e.to_string()],
                ..ReloadOutcome::default()
            };
        }
        if let Err(e) =
            plan::refuse_emptying(&self.config.flows, &new.flows, allow_empty, &self.path)
        {
            tracing::error!("reload rejected: {e}");
            return ReloadOutcome {
                errors: vec![e.to_string()],
                ..ReloadOutcome::default()
            };
        }
        if new.daemon != self.config.daemon || new.pools != self.config.pools {
            tracing::warn!(
                "reload: [daemon] and [pools] changes take effect at the next restart; flows are applied now"
            );
        }
        // The diff against the flows configured now, running or not (they
        // are exactly `self.config.flows`).
        // Each flow looked up by its key, not searched for by name: at
        // 1000 flows that search was half a million name comparisons per
        // reload.
        let plan = ReloadPlan::new(&self.config.flows, &new.flows, |name| {
            self.flows
                .get(FlowKey::from_name(name))
                .is_some_and(|m| m.running)
        });
        let mut outcome = plan.outcome();
        let mut problems = Vec::new();
        let mut reload_problems = Vec::new();
        // Changed flows relaying now whose interfaces are up are replaced
        // make-before-break (see `replace_flow`); the others stop here and
        // start again below. So do those whose old and new versions need
        // one interface's XDP program or queue-0 AF_XDP socket, which the
        // old flow holds until it stops (`xdp_reload`).
        // The plan names flows; the table's key is the hash of the name.
        let changed: HashSet<FlowKey> =
            plan.changed.iter().map(|n| FlowKey::from_name(n)).collect();
        let starting: HashMap<FlowKey, &Flow> = plan.start.iter().map(|f| (f.id, f)).collect();
        let replace: HashSet<FlowKey> =
            plan.start
                .iter()
                .filter(|f| changed.contains(&f.id))
                .filter(|f| {
                    self.flows.get(f.id).is_some_and(|m| {
                        m.running && !super::xdp_reload::must_stop_first(&m.flow, f)
                    }) && super::blocked(self.links.as_ref(), f, false).is_none()
                })
                .map(|f| f.id)
                .collect();
        // A changed flow stopped here and configured anew below: what it
        // counted, carried to its successor (counters never go down).
        let mut carried = HashMap::new();
        for name in &plan.stop {
            let key = FlowKey::from_name(name);
            if replace.contains(&key) {
                continue;
            }
            if let Some(new) = starting.get(&key)
                && self
                    .flows
                    .get(key)
                    .is_some_and(|m| m.running && super::xdp_reload::must_stop_first(&m.flow, new))
            {
                tracing::info!(
                    flow = %name,
                    "changed: stopped before its successor starts (its XDP program or AF_XDP socket holds an interface the new one needs; what arrives meanwhile is lost)"
                );
            }
            // Its entry is kept even if its shards could not all be
            // removed: its successor still goes on from what it counted.
            let (old, forgotten) = self.forget_flow(key);
            if let Some(old) = old
                && changed.contains(&key)
            {
                carried.insert(key, old);
            }
            if let Err(e) = forgotten {
                let text = format!("flow {name:?}: {}", crate::chain::Chain(&e));
                problems.push(text.clone());
                reload_problems.push(ReloadProblem::Other(text));
            }
        }
        if !plan.start.is_empty() {
            let answer = match helper.take() {
                Some(Ok(true)) => self.opener.finish_reload(),
                Some(Ok(false)) => Ok(()),
                Some(Err(e)) => Err(e),
                None => self.opener.reload(),
            };
            if let Err(e) = answer {
                let text = crate::chain::Chain(&e).to_string();
                problems.push(text.clone());
                reload_problems.push(ReloadProblem::Helper(text));
            }
        }
        for flow in &plan.start {
            let result = if replace.contains(&flow.id) {
                self.replace_flow(flow)
            } else {
                // What the old flow counted (its shards gone: final) is
                // in the entry readers first see, not added after it.
                let before = carried.remove(&flow.id).map(|old| old.freeze());
                self.add_flow(flow, before).map_err(ReplaceError::Placement)
            };
            if let Err(e) = result {
                let text = format!("flow {:?}: {}", flow.name, crate::chain::Chain(&e));
                problems.push(text.clone());
                reload_problems.push(ReloadProblem::Flow { key: flow.id, text });
            }
        }
        for name in &plan.retry {
            if let Some(m) = self.flows.get_mut(FlowKey::from_name(name)) {
                m.retry = None;
            }
        }
        self.reconcile();
        outcome.errors.clone_from(&problems);
        {
            let shared = lock(&self.shared);
            for flow in &plan.start {
                if let Some(FlowState::OpenFailed { error }) =
                    self.flows.entry(&shared.flows, flow.id).map(|e| &e.state)
                {
                    outcome
                        .errors
                        .push(format!("flow {:?}: {error}", flow.name));
                }
            }
        }
        self.reload_problems = reload_problems;
        self.config = new;
        tracing::info!(
            added = ?outcome.added,
            removed = ?outcome.removed,
            changed = ?outcome.changed,
            unchanged = outcome.unchanged,
            errors = outcome.errors.len(),
            "reloaded"
        );
        outcome
    }

    /// Replace running flow `new.name` by `new`, make before break: the new
    /// sockets are opened (and joined) while the old ones still receive,
    /// so every datagram is in one socket or the other: a reload that adds
    /// or removes a leg loses nothing on the legs that stay.
    ///
    /// A shard that stays on its worker with the same outputs is swapped
    /// by one [`Command::Replace`], the new flow taking the old one's
    /// redundancy state over, so what arrives in both sockets between the
    /// join and the swap leaves once (merge, failover with `rtp`, a one-leg
    /// RTP flow, or an RTP flow becoming one of them). Every other shard
    /// moves (its flow's `core` or `spread` changed, or its outputs did):
    /// the old shards are removed first and each reports the last RTP
    /// number it relayed ([`Event::FlowRemoved`]); then the new shards are
    /// added, each output resuming after the number of the old shard that
    /// sent to it ([`mcrelay_dataplane::OutputSocket::resume_after`]), so
    /// an RTP flow loses nothing and repeats nothing across workers
    /// either. The new sockets hold what arrives meanwhile. A flow whose
    /// datagrams aren't RTP has no number to resume after: what arrived
    /// in the overlap may leave twice (measured: docs/benchmarks.md).
    ///
    /// The flow starts with fresh counters, as a changed flow does, and
    /// readers see them added to the old flow's (read live while the old
    /// shards may still count, frozen once they are gone: [`Before`]), so
    /// no counter goes down; all its new shards are added before it
    /// counts as replaced. If the new
    /// sockets can't be opened, the flow is stopped and configured anew
    /// like any changed flow (the reconciler retries it) and the error is
    /// returned for the reload to report; if a worker refuses the new
    /// one, the flow waits for a retry like any failed start.
    fn replace_flow(&mut self, new: &Flow) -> Result<(), ReplaceError> {
        let key = new.id;
        let Prepared {
            shards,
            pending,
            entry,
            workers,
        } = match self.prepare_replacement(new) {
            Ok(prepared) => prepared,
            Err(e) => {
                // The new settings can't be opened (or placed) now: as for
                // any changed flow, stop the old one and configure the new
                // one, which the reconciler retries. The error is the
                // reload's to report.
                let (old, forgotten) = self.forget_flow(key);
                let before = old.map(|old| old.freeze());
                self.add_flow(new, before)
                    .map_err(ReplaceError::Placement)?;
                forgotten?;
                return Err(e);
            }
        };
        let mut entry = entry;
        let (old, old_workers) = {
            let m = self.flows.get(key).ok_or(FlowCommandError::NotPublished)?;
            (m.flow.clone(), m.workers.clone())
        };
        let name = new.name.clone();
        // A shard that keeps its worker and its outputs is replaced there
        // by one command (nothing leaves twice); the others are removed
        // here and added once they have said where they stopped.
        let kept = kept_legs(&old, new);
        let mut shards: Vec<Option<FlowSockets>> = shards.into_iter().map(Some).collect();
        let mut sent = 0_usize;
        // (old shard, its worker) of each shard removed.
        let mut moving = Vec::new();
        for (k, &w) in old_workers.iter().enumerate() {
            let in_place = workers.get(k) == Some(&w) && same_outputs(&old, new, k);
            let command = match shards
                .get_mut(k)
                .filter(|_| in_place)
                .and_then(Option::take)
            {
                Some(flow) => {
                    sent += 1;
                    Command::Replace {
                        flow: Box::new(flow),
                        kept,
                    }
                }
                None => {
                    moving.push((k, w));
                    Command::RemoveFlow(name.clone())
                }
            };
            let handle = self.workers.get(w).ok_or(FlowCommandError::NoSuchWorker)?;
            if handle.command(command).is_err() {
                return Err(FlowCommandError::NotTakingCommands { worker: w }.into());
            }
        }
        // The old flow is going: from here the flow is the new one.
        {
            let mut shared = lock(&self.shared);
            if let Some((m, e)) = self.flows.both_mut(&mut shared.flows, key) {
                *m = Managed::stopped(new.clone(), workers.clone());
                e.close_ingress();
                let mut old = std::mem::replace(e, new_entry(new, &workers));
                // Its own predecessor stopped counting at the last reload.
                old.before = old.before.take().map(Before::frozen);
                e.before = Some(Before::Live(Box::new(old)));
                e.state = FlowState::OpenFailed {
                    error: "being replaced by a reload".to_owned(),
                };
            }
        }
        // Every answer, so none is left for a later command to misread.
        let mut answers = Answers::default();
        // Where each removed shard stopped, before its successors start.
        let mut last_rtp = vec![None; old_workers.len()];
        let mut stopped = 0;
        while stopped < moving.len() {
            let event = self.await_event(&name)?;
            if let Event::FlowRemoved { worker, .. } | Event::FlowUnknown { worker, .. } = &event
                && let Some(&(k, _)) = moving.iter().find(|(_, w)| w == worker)
            {
                stopped += 1;
                if let Event::FlowRemoved {
                    last_rtp: Some(at), ..
                } = &event
                    && let Some(slot) = last_rtp.get_mut(k)
                {
                    *slot = Some(*at);
                }
            }
            answers.note(event);
        }
        let mut unsent = None;
        for (k, (shard, &w)) in shards.into_iter().zip(&workers).enumerate() {
            let Some(mut shard) = shard else { continue };
            resume_outputs(&old, new, k, &last_rtp, &mut shard);
            let handle = self.workers.get(w).ok_or(FlowCommandError::NoSuchWorker)?;
            if handle.command(Command::AddFlow(Box::new(shard))).is_err() {
                unsent = Some(w);
                break;
            }
            sent += 1;
        }
        while answers.answered < sent || answers.removed < old_workers.len() {
            answers.note(self.await_event(&name)?);
        }
        let Answers { added, refused, .. } = answers;
        if added.len() < workers.len() {
            // No shard without the others: take back those added; the flow
            // waits for a retry like any failed start.
            if let Err(undo) = self.remove_shards(&name, &added) {
                tracing::error!(flow = %name, "taking back its other shards: {}", crate::chain::Chain(&undo));
            }
            return Err(refused
                .unwrap_or(FlowCommandError::NotTakingCommands {
                    worker: unsent.unwrap_or(0),
                })
                .into());
        }
        let mut shared = lock(&self.shared);
        if let Some((m, e)) = self.flows.both_mut(&mut shared.flows, key) {
            m.running = true;
            entry.state = FlowState::Running;
            // Every old shard is gone (`answers.removed`): its counts are
            // final.
            entry.before = e.before.take().map(Before::frozen);
            *e = entry;
            m.unconnected = super::report::note_outputs(e, pending);
        }
        tracing::info!(flow = %name, ?workers, "replaced by the reload, without a gap");
        Ok(())
    }

    /// What `replace_flow` needs before touching the running flow.
    fn prepare_replacement(&mut self, new: &Flow) -> Result<Prepared, ReplaceError> {
        let old = self
            .flows
            .get(new.id)
            .ok_or(FlowCommandError::NotPublished)?;
        let workers = if old.flow.core == new.core && old.flow.spread == new.spread {
            old.workers.clone()
        } else {
            Placement::with(
                &self.cpus,
                self.flows
                    .iter()
                    .filter(|m| m.key() != new.id)
                    .map(|m| (&m.workers[..], &m.flow)),
            )
            .place(new)
            .map_err(ReplaceError::Placement)?
        };
        let mut entry = new_entry(new, &workers);
        let opened = super::shards::open(&mut self.opener, new, &entry.stats, &entry.shard_inputs)
            .map_err(FlowCommandError::from)?;
        entry.ingress = Some(opened.ingress);
        entry.own = opened.own;
        Ok(Prepared {
            shards: opened.shards,
            pending: opened.pending,
            entry,
            workers,
        })
    }

    /// Stop flow `key` if it runs, and forget it. Its readers' entry, if
    /// it had one (its counters final once its shards are removed), also
    /// when removing its shards failed: what it counted is not lost with
    /// the error.
    fn forget_flow(&mut self, key: FlowKey) -> (Option<FlowEntry>, Result<(), FlowCommandError>) {
        let removed = self.flows.remove(&mut lock(&self.shared).flows, key);
        let Some((m, entry)) = removed else {
            return (None, Ok(()));
        };
        let result = if m.running {
            self.remove_shards(&m.flow.name, &m.workers)
        } else {
            Ok(())
        };
        (Some(entry), result)
    }

    /// Configure `flow` (not started yet: [`Self::reconcile`] does that),
    /// on the least loaded worker or its `core`. `before`: what the flow
    /// it replaces counted (a changed flow configured anew), in its entry
    /// from the moment readers can see it, so no read ever shows the new
    /// flow's fresh counters without it (issue 26: such a read is a
    /// counter going down, to 0).
    fn add_flow(&mut self, flow: &Flow, before: Option<Before>) -> Result<(), PlacementError> {
        let workers = Placement::with(
            &self.cpus,
            self.flows.iter().map(|m| (&m.workers[..], &m.flow)),
        )
        .place(flow)?;
        // Published as running: reconcile, right after, starts it or says
        // why not, before the reload's outcome is published.
        let mut entry = new_entry(flow, &workers);
        entry.before = before;
        let managed = Managed::stopped(flow.clone(), workers);
        let displaced = self
            .flows
            .insert(&mut lock(&self.shared).flows, managed, entry);
        if let Some((old, _)) = displaced {
            // Not reached: a flow is forgotten before it is configured
            // anew. Its sockets are not left on a worker all the same.
            tracing::error!(flow = %flow.name, "configured twice; the older one is stopped");
            if old.running
                && let Err(e) = self.remove_shards(&old.flow.name, &old.workers)
            {
                tracing::error!(flow = %flow.name, "{}", crate::chain::Chain(&e));
            }
        }
        Ok(())
    }
}

/// The legs of `new` that are `old`'s leg of the same index (same
/// interface, group, port, source and ingress), a bit per leg: a failover
/// keeps their health across the replace.
pub(super) fn kept_legs(old: &Flow, new: &Flow) -> u8 {
    old.inputs
        .iter()
        .zip(&new.inputs)
        // A bit each in a u8 (`check` allows at most 4 legs).
        .take(8)
        .enumerate()
        .filter(|(_, (a, b))| a == b)
        .fold(0, |kept, (i, _)| kept | (1 << i))
}

/// Shard `k` of `old` and of `new` send to the same outputs, in the same
/// order: the new one can take the old one's place on its worker.
fn same_outputs(old: &Flow, new: &Flow, k: usize) -> bool {
    let of = |f: &Flow| {
        f.outputs
            .iter()
            .enumerate()
            .filter(|&(i, _)| f.shard_of(i) == k)
            .map(|(_, o)| o.clone())
            .collect::<Vec<_>>()
    };
    of(old) == of(new)
}

/// Each output of `new`'s shard `k` (`shard`, its outputs in config
/// order) that an old shard sent to resumes after the last RTP number
/// that shard relayed (`last_rtp`, by old shard; `None`: no number, not
/// RTP, or not removed).
fn resume_outputs(
    old: &Flow,
    new: &Flow,
    k: usize,
    last_rtp: &[Option<(u16, u32)>],
    shard: &mut FlowSockets,
) {
    let indices = (0..new.outputs.len()).filter(|&i| new.shard_of(i) == k);
    for (socket, i) in shard.outputs.iter_mut().zip(indices) {
        socket.resume_after = new
            .outputs
            .get(i)
            .and_then(|o| old.outputs.iter().position(|p| p == o))
            .and_then(|j| last_rtp.get(old.shard_of(j)).copied().flatten());
    }
}

/// The workers' answers about one flow during its replacement.
#[derive(Default)]
struct Answers {
    /// Workers that added a new shard.
    added: Vec<usize>,
    refused: Option<FlowCommandError>,
    /// Adds answered (added or refused).
    answered: usize,
    /// Old shards gone (removed, or unknown to their worker).
    removed: usize,
}

impl Answers {
    fn note(&mut self, event: Event) {
        match event {
            Event::FlowAdded { worker, .. } => {
                self.added.push(worker);
                self.answered += 1;
            }
            Event::FlowRefused { worker, reason, .. } => {
                self.refused = Some(FlowCommandError::Refused {
                    worker,
                    answer: reason,
                });
                self.answered += 1;
            }
            Event::FlowRemoved { .. } | Event::FlowUnknown { .. } => self.removed += 1,
            // `await_event` answers about flows only.
            Event::ModeSet { .. } => {}
        }
    }
}
