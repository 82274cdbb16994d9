//! Applying a reload: read and check the file, build the
//! [`ReloadPlan`], stop what it removes or changes, configure what it adds
//! or changes, and let [`Daemon::reconcile`] start them.

use mcrelay_config::Flow;
use mcrelay_control::{DaemonState, FlowState, ReloadOutcome};

use mcrelay_dataplane::{Command, Event};

use super::error::FlowCommandError;
use super::placement::{Placement, PlacementError};
use super::plan::{self, ReloadPlan};
use super::report::new_entry;
use super::{Daemon, Managed, lock};

/// A changed flow's replacement, ready to hand to its worker: its new
/// sockets (opened and joined), outputs not connected yet, its new
/// readers' entry, its worker and its index in `Daemon::flows`.
struct Prepared {
    opened: mcrelay_dataplane::FlowSockets,
    pending: Vec<(crate::outputs::Unconnected, std::io::Error)>,
    entry: super::report::FlowEntry,
    worker: usize,
    index: usize,
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
        // A set, not a search of every flow per flow: at 1000 flows that
        // search was half a million name comparisons per reload.
        let running: std::collections::HashSet<&str> = self
            .flows
            .iter()
            .filter(|m| m.running)
            .map(|m| m.flow.name.as_str())
            .collect();
        let plan = ReloadPlan::new(&self.config.flows, &new.flows, |name| {
            running.contains(name)
        });
        drop(running);
        let mut outcome = plan.outcome();
        let mut problems = Vec::new();
        // Changed flows relaying now whose interfaces are up are replaced
        // make-before-break (see `replace_flow`); the others stop here and
        // start again below.
        let replace: Vec<&Flow> = plan
            .start
            .iter()
            .filter(|f| plan.changed.contains(&f.name))
            .filter(|f| {
                self.flows
                    .iter()
                    .any(|m| m.running && m.flow.name == f.name)
                    && super::blocked(self.links.as_ref(), f, false).is_none()
            })
            .collect();
        for name in &plan.stop {
            if replace.iter().any(|f| &f.name == name) {
                continue;
            }
            if let Err(e) = self.forget_flow(name) {
                problems.push(format!("flow {name:?}: {}", crate::chain::Chain(&e)));
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
                problems.push(crate::chain::Chain(&e).to_string());
            }
        }
        for flow in &plan.start {
            let result = if replace.iter().any(|f| f.name == flow.name) {
                self.replace_flow(flow)
            } else {
                self.add_flow(flow).map_err(ReplaceError::Placement)
            };
            if let Err(e) = result {
                problems.push(format!("flow {:?}: {}", flow.name, crate::chain::Chain(&e)));
            }
        }
        for m in &mut self.flows {
            if plan.retry.contains(&m.flow.name) {
                m.retry = None;
            }
        }
        self.reconcile();
        outcome.errors.clone_from(&problems);
        {
            let shared = lock(&self.shared);
            for flow in &plan.start {
                if let Some(FlowState::OpenFailed { error }) = shared
                    .flows
                    .iter()
                    .find(|e| e.stats.name == flow.name)
                    .map(|e| &e.state)
                {
                    outcome
                        .errors
                        .push(format!("flow {:?}: {error}", flow.name));
                }
            }
        }
        self.reload_problem =
            (!problems.is_empty()).then(|| format!("reload: {}", problems.join("; ")));
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
    /// then one worker command removes the old flow and the next adds the
    /// new one, so every datagram is in one socket or the other: a reload
    /// that adds or removes a leg loses nothing on the legs that stay.
    /// What arrives between the new sockets' join and the old flow's
    /// removal (about one loop turn) is in both and may leave twice.
    /// The flow keeps its worker unless its `core` changed; it starts
    /// with fresh counters, as a changed flow does. If the new sockets
    /// can't be opened, the flow is stopped and configured anew like any
    /// changed flow (the reconciler retries it) and the error is returned
    /// for the reload to report; if the worker refuses the new one, the
    /// flow waits for a retry like any failed start.
    fn replace_flow(&mut self, new: &Flow) -> Result<(), ReplaceError> {
        let Prepared {
            opened,
            pending,
            entry,
            worker,
            index: i,
        } = match self.prepare_replacement(new) {
            Ok(prepared) => prepared,
            Err(e) => {
                // The new settings can't be opened (or placed) now: as for
                // any changed flow, stop the old one and configure the new
                // one, which the reconciler retries. The error is the
                // reload's to report.
                self.forget_flow(&new.name)?;
                self.add_flow(new).map_err(ReplaceError::Placement)?;
                return Err(e);
            }
        };
        let mut entry = entry;
        let old_worker = self.flows[i].worker;
        let name = new.name.clone();
        let old = self
            .workers
            .get(old_worker)
            .ok_or(FlowCommandError::NoSuchWorker)?;
        if old.command(Command::RemoveFlow(name.clone())).is_err() {
            return Err(FlowCommandError::NotTakingCommands { worker: old_worker }.into());
        }
        // The old flow is going: from here the flow is the new one.
        self.flows[i] = Managed {
            flow: new.clone(),
            worker,
            running: false,
            retry: None,
            unconnected: Vec::new(),
        };
        {
            let mut shared = lock(&self.shared);
            if let Some(e) = shared.flows.iter_mut().find(|e| e.stats.name == name) {
                e.close_ingress();
                *e = new_entry(new, worker);
                e.state = FlowState::OpenFailed {
                    error: "being replaced by a reload".to_owned(),
                };
            }
        }
        let handle = self
            .workers
            .get(worker)
            .ok_or(FlowCommandError::NoSuchWorker)?;
        if handle.command(Command::AddFlow(Box::new(opened))).is_err() {
            return Err(FlowCommandError::NotTakingCommands { worker }.into());
        }
        let (mut added, mut removed) = (None, false);
        while added.is_none() || !removed {
            match self.await_event(&name)? {
                Event::FlowAdded { .. } => added = Some(Ok(())),
                Event::FlowRefused { worker, reason, .. } => {
                    added = Some(Err(FlowCommandError::Refused {
                        worker,
                        answer: reason,
                    }));
                }
                Event::FlowRemoved { .. } | Event::FlowUnknown { .. } => removed = true,
                // `await_event` answers about flows only.
                Event::ModeSet { .. } => {}
            }
        }
        added.unwrap_or(Ok(()))?;
        self.flows[i].running = true;
        let mut shared = lock(&self.shared);
        if let Some(e) = shared.flows.iter_mut().find(|e| e.stats.name == name) {
            entry.state = FlowState::Running;
            *e = entry;
            self.flows[i].unconnected = super::report::note_outputs(e, pending);
        }
        tracing::info!(flow = %name, worker, "replaced by the reload, without a gap");
        Ok(())
    }

    /// What `replace_flow` needs before touching the running flow.
    fn prepare_replacement(&mut self, new: &Flow) -> Result<Prepared, ReplaceError> {
        let i = self
            .flows
            .iter()
            .position(|m| m.flow.name == new.name)
            .ok_or(FlowCommandError::NotPublished)?;
        let worker = if self.flows[i].flow.core == new.core {
            self.flows[i].worker
        } else {
            Placement::with(
                &self.cpus,
                self.flows
                    .iter()
                    .filter(|m| m.flow.name != new.name)
                    .map(|m| (m.worker, &m.flow)),
            )
            .place(new)
            .map_err(ReplaceError::Placement)?
        };
        let mut entry = new_entry(new, worker);
        let (opened, pending) = self.opener.open(new).map_err(FlowCommandError::Open)?;
        let opened = super::with_counters(opened, &entry.stats);
        entry.ingress = Some(super::clone_ingress(&opened).map_err(FlowCommandError::Ingress)?);
        Ok(Prepared {
            opened,
            pending,
            entry,
            worker,
            index: i,
        })
    }

    /// Stop flow `name` if it runs, and forget it.
    fn forget_flow(&mut self, name: &str) -> Result<(), FlowCommandError> {
        let Some(i) = self.flows.iter().position(|m| m.flow.name == name) else {
            return Ok(());
        };
        let m = self.flows.remove(i);
        lock(&self.shared).flows.retain(|e| e.stats.name != name);
        if m.running {
            self.remove_from_worker(name, m.worker)?;
        }
        Ok(())
    }

    /// Configure `flow` (not started yet: [`Self::reconcile`] does that),
    /// on the least loaded worker or its `core`.
    fn add_flow(&mut self, flow: &Flow) -> Result<(), PlacementError> {
        let w = Placement::with(&self.cpus, self.flows.iter().map(|m| (m.worker, &m.flow)))
            .place(flow)?;
        // Published as running: reconcile, right after, starts it or says
        // why not, before the reload's outcome is published.
        lock(&self.shared).flows.push(new_entry(flow, w));
        self.flows.push(Managed {
            flow: flow.clone(),
            worker: w,
            running: false,
            retry: None,
            unconnected: Vec::new(),
        });
        Ok(())
    }
}
