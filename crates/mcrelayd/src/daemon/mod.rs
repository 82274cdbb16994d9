//! The supervisor: starts one worker per CPU, keeps the table of
//! configured flows, applies reloads as flow diffs (unchanged flows are
//! never touched), pauses a flow while one of its interfaces is down or
//! missing (for a flow with several inputs: an output's, or every leg's;
//! see [`blocked`]) and resumes it when the interface is back (see
//! [`crate::links`]),
//! and publishes what readers (control socket, metrics, final report) see.
//! It runs on the main thread; workers only ever see commands on their
//! queues, and readers only ever lock [`Shared`], never a worker.
//!
//! A paused flow is removed from its worker (its sockets closed, its groups
//! left, its buffers back in the pool) and re-added with freshly opened
//! sockets, on the same worker and with the same counters, when every
//! interface it names is up again.
//!
//! The pure decisions live in their own modules, tested without a worker:
//! [`placement`] (which worker runs a flow) and [`plan`] (what a reload
//! does, from `FlowTable::diff`). [`table`] is the one flow table, keyed
//! by the config's `FlowKey`, holding the supervisor's half of each flow
//! and indexing the readers' half; [`reload`] applies a plan, [`report`]
//! holds what readers see, [`error`] the typed errors.

mod error;
mod interfaces;
mod mode;
mod placement;
mod plan;
mod rejoin;
mod reload;
mod report;
mod shards;
mod table;
mod xdp_reload;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use mcrelay_config::{Config, Flow, FlowKey};
use mcrelay_control::{DaemonState, FlowState};
use mcrelay_pool::PoolConfig;
use mcrelay_uring::{
    Command, Event, FlowSockets, ReceiveMode, WorkerConfig, WorkerError, WorkerHandle,
};

use self::error::FlowCommandError;
pub use self::error::StartError;
use self::interfaces::blocked;
use self::placement::{Placement, start_order};
pub use self::placement::{spread_fits, worker_cpus};
pub use self::report::{Shared, SharedHandle, lock};
use self::report::{new_entry, note_outputs, print_final, share};
use self::table::{Entries, Flows, Managed};
use crate::links::LinkTable;
use crate::sockets::Opener;

// The 4-leg limit has one value: the config refuses what the relay core
// can't carry (the core's leg masks and per-leg arrays are sized by its
// own constant; the config can't depend on the core).
const _: () =
    assert!(mcrelay_config::MAX_LEGS == mcrelay_relay::redundancy::LegId::MAX_LEGS as usize);

/// How long a reload waits for a worker to answer a command.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// A flow whose interfaces are up but whose sockets could not be opened is
/// retried after this, then after twice as long each time, up to
/// [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// One thing that went wrong in the last reload, shown in the daemon's
/// state while it lasts.
#[derive(Debug, Clone)]
enum ReloadProblem {
    /// The helper did not re-read the file; over once a new helper (which
    /// reads it as it starts) replaced it.
    Helper(String),
    /// A flow the reload started or changed did not start; over once it
    /// runs (it is retried).
    Flow { key: FlowKey, text: String },
    /// Anything else; over at the next reload.
    Other(String),
}

/// Options of the run mode beyond the config file.
#[derive(Debug, Clone, Copy)]
pub struct RunOptions {
    pub receive: ReceiveMode,
    /// UDP GSO for runs of same-size datagrams.
    pub gso: bool,
}

/// The running daemon, owned by the main thread.
#[derive(Debug)]
pub struct Daemon {
    path: PathBuf,
    config: Config,
    cpus: Vec<usize>,
    workers: Vec<WorkerHandle>,
    events: mpsc::Receiver<Event>,
    stop: Arc<AtomicBool>,
    /// Every configured flow, relaying or not, in start order: the
    /// supervisor's half, and the index of the readers' half
    /// (`Shared::flows`).
    flows: Flows,
    shared: SharedHandle,
    opener: Opener,
    /// The interfaces as netlink last reported them; `None` when they are
    /// not watched (every interface then counts as up).
    links: Option<LinkTable>,
    /// Why the helper is not what it was at start, if it isn't.
    helper_problem: Option<String>,
    /// What went wrong in the last reload; each shown while it lasts.
    reload_problems: Vec<ReloadProblem>,
    /// A worker stopped turning its loop.
    stalled: bool,
    /// A reload is being applied: the published state stays `Reloading`.
    reloading: bool,
    /// Interfaces re-created under running flows' legs ([`rejoin`]).
    rejoin: rejoin::Rejoin,
}

impl Daemon {
    /// Open the sockets of every flow whose interfaces are up in `links`
    /// (all of them when `links` is `None`: interfaces not watched), run
    /// `before_workers` (the privilege drop: the process is still
    /// single-threaded), then start one worker per CPU. A flow with an
    /// interface missing or down waits for it; a flow that can't open
    /// otherwise is published as `open_failed` and retried, while the
    /// others start.
    pub fn start<E: Into<Box<dyn std::error::Error + Send + Sync>>>(
        path: &Path,
        config: Config,
        options: RunOptions,
        mut opener: Opener,
        links: Option<LinkTable>,
        before_workers: impl FnOnce() -> Result<(), E>,
    ) -> Result<Self, StartError> {
        let cpus = worker_cpus(&config)?;
        let pools = PoolConfig {
            small: config.pools.small,
            standard: config.pools.standard,
            jumbo: config.pools.jumbo,
        };
        let mut per_worker: Vec<Vec<FlowSockets>> = (0..cpus.len()).map(|_| Vec::new()).collect();
        let mut entries = Entries::default();
        let mut flows = Flows::default();
        let mut placement = Placement::new(&cpus);
        for flow in start_order(config.flows.as_slice()) {
            let ws = placement.place(flow)?;
            let mut entry = new_entry(flow, &ws);
            let mut unconnected = Vec::new();
            let mut retry = None;
            let running = match blocked(links.as_ref(), flow, false) {
                None => match shards::open(&mut opener, flow, &entry.stats, &entry.shard_inputs) {
                    Ok(opened) => {
                        entry.ingress = Some(opened.ingress);
                        entry.own = opened.own;
                        unconnected = note_outputs(&mut entry, opened.pending);
                        for (shard, &w) in opened.shards.into_iter().zip(&ws) {
                            per_worker[w].push(shard);
                        }
                        true
                    }
                    // One flow that can't open doesn't stop the others
                    // (issue 27): it is published as `open_failed` and
                    // retried like a flow whose start failed on a reload.
                    Err(e) => {
                        let e = StartError::from(e);
                        let error = crate::chain::Chain(&e).to_string();
                        tracing::error!(
                            flow = %flow.name,
                            "not started: {error}; retrying in {RETRY_FIRST:?}, then less often"
                        );
                        entry.state = FlowState::OpenFailed { error };
                        retry = Some((Instant::now() + RETRY_FIRST, RETRY_FIRST));
                        false
                    }
                },
                Some(state) => {
                    tracing::warn!(flow = %flow.name, "not started: {state}; it starts when the interface is up");
                    entry.state = state;
                    false
                }
            };
            let managed = Managed {
                running,
                retry,
                unconnected,
                ..Managed::stopped(flow.clone(), ws)
            };
            // The config's names are unique: nothing is displaced.
            let _ = flows.insert(&mut entries, managed, entry);
        }
        before_workers().map_err(|e| StartError::BeforeWorkers(e.into()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (events_tx, events) = mpsc::channel();
        let mut workers: Vec<WorkerHandle> = Vec::with_capacity(cpus.len());
        for (index, (flows, &cpu)) in per_worker.into_iter().zip(&cpus).enumerate() {
            let spawned = mcrelay_uring::spawn(
                WorkerConfig {
                    index,
                    cpu: Some(cpu),
                    pools,
                    flows,
                    receive: options.receive,
                    gso: options.gso,
                    standby: config.daemon.mode.is_standby(),
                },
                Arc::clone(&stop),
                events_tx.clone(),
            );
            match spawned {
                Ok(w) => workers.push(w),
                Err(e) => {
                    stop.store(true, Ordering::Relaxed);
                    for w in workers {
                        let _ = w.join();
                    }
                    return Err(e.into());
                }
            }
        }
        let shared = Arc::new(Mutex::new(Shared {
            flows: entries,
            workers: workers.iter().map(|w| Arc::clone(&w.stats)).collect(),
            state: DaemonState::Running,
            config_path: path.display().to_string(),
            started: Instant::now(),
            mode: config.daemon.mode,
            metrics_endpoint: None,
        }));
        let mut rejoin = rejoin::Rejoin::default();
        if let Some(links) = &links {
            rejoin.note(links);
        }
        let daemon = Self {
            path: path.to_owned(),
            config,
            cpus,
            workers,
            events,
            stop,
            flows,
            shared,
            opener,
            links,
            helper_problem: None,
            reload_problems: Vec::new(),
            stalled: false,
            reloading: false,
            rejoin,
        };
        daemon.refresh_state();
        Ok(daemon)
    }

    pub fn shared(&self) -> SharedHandle {
        Arc::clone(&self.shared)
    }

    /// Flows configured.
    pub fn flow_count(&self) -> usize {
        self.flows.len()
    }

    /// Flows relaying now.
    pub fn running_count(&self) -> usize {
        self.flows.iter().filter(|m| m.running).count()
    }

    pub fn worker_count(&self) -> usize {
        self.workers.len()
    }

    /// Notice a dead helper, or one that stopped answering (a request timed
    /// out: it is ended): running flows go on (their sockets are open),
    /// and the zygote forks a new one with the same privileges; flows that
    /// failed or are waiting are retried at once. If that fails (the zygote
    /// is gone too), sockets are opened in this process, without
    /// privileges, and the daemon reports itself degraded until restarted.
    pub fn check_helper(&mut self) {
        let Some(why) = self.opener.helper_exited() else {
            return;
        };
        self.helper_problem = crate::sockets::restart_helper(&mut self.opener, &why);
        if self.helper_problem.is_none() {
            // The new helper read the config file as it started: what the
            // old one failed to reload is no longer missing.
            self.reload_problems
                .retain(|p| !matches!(p, ReloadProblem::Helper(_)));
        }
        for m in self.flows.iter_mut() {
            m.retry = None;
        }
        self.reconcile();
    }

    /// Call `waker` (from another thread) whenever the helper dies.
    pub fn on_helper_exit(
        &mut self,
        waker: crate::sockets::HelperWaker,
    ) -> Result<(), crate::sockets::WatchError> {
        self.opener.on_helper_exit(waker)
    }

    /// A worker stopped turning its loop: the daemon is degraded from now
    /// on (systemd's watchdog, no longer fed, restarts it).
    pub fn mark_stalled(&mut self) {
        if !self.stalled {
            tracing::error!("a worker stopped turning; not feeding the watchdog");
            self.stalled = true;
            self.refresh_state();
        }
    }

    /// Whether every worker thread is still running.
    pub fn workers_alive(&self) -> bool {
        self.workers.iter().all(|w| !w.is_finished())
    }

    /// Loop turns of every worker, to tell whether each is still turning.
    pub fn turns(&self) -> Vec<u64> {
        self.workers
            .iter()
            .map(|w| w.stats.loop_counters.turns.get())
            .collect()
    }

    fn set_state(&self, state: DaemonState) {
        lock(&self.shared).state = state;
    }

    /// Publish the daemon's state: running, or degraded with every reason
    /// (a stalled worker, the helper, the last reload, flows not relaying).
    fn refresh_state(&self) {
        if self.reloading {
            return;
        }
        let mut shared = lock(&self.shared);
        let mut why = Vec::new();
        if self.stalled {
            why.push("a worker stopped turning".to_owned());
        }
        why.extend(self.helper_problem.iter().cloned());
        let reload: Vec<&str> = self
            .reload_problems
            .iter()
            .filter_map(|p| match p {
                ReloadProblem::Flow { key, text } => {
                    let running = self
                        .flows
                        .entry(&shared.flows, *key)
                        .is_some_and(|f| f.state.is_running());
                    (!running).then_some(text.as_str())
                }
                ReloadProblem::Helper(text) | ReloadProblem::Other(text) => Some(text.as_str()),
            })
            .collect();
        if !reload.is_empty() {
            why.push(format!("reload: {}", reload.join("; ")));
        }
        let stopped: Vec<String> = shared
            .flows
            .iter()
            .filter(|f| !f.state.is_running())
            .map(|f| format!("flow {:?} {}", f.stats.name, f.state))
            .chain(shared.flows.iter().flat_map(|f| {
                f.outputs_state
                    .iter()
                    .zip(&f.stats.outputs)
                    .filter_map(move |(s, (label, _))| {
                        let why = s.not_connected.as_ref()?;
                        Some(format!(
                            "flow {:?} output {label} not connected: {why}",
                            f.stats.name
                        ))
                    })
            }))
            .collect();
        const LISTED: usize = 3;
        match stopped.len() {
            0 => {}
            n if n <= LISTED => why.push(stopped.join(", ")),
            n => why.push(format!(
                "{}, and {} more flows not relaying",
                stopped[..LISTED].join(", "),
                n - LISTED
            )),
        }
        shared.state = if why.is_empty() {
            DaemonState::Running
        } else {
            DaemonState::Degraded(why.join("; "))
        };
    }

    /// Open flow `key`'s sockets, one set per shard, writing into the
    /// flow's counters.
    fn open_counted(&mut self, key: FlowKey) -> Result<shards::Opened, FlowCommandError> {
        let flow = &self
            .flows
            .get(key)
            .ok_or(FlowCommandError::NotPublished)?
            .flow;
        let (stats, more) = {
            let shared = lock(&self.shared);
            let e = self
                .flows
                .entry(&shared.flows, key)
                .ok_or(FlowCommandError::NotPublished)?;
            (share(&e.stats), e.shard_inputs.clone())
        };
        Ok(shards::open(&mut self.opener, flow, &stats, &more)?)
    }

    /// Open flow `key`'s sockets and hand each shard to its worker, with
    /// the flow's counters. The state it had before.
    fn start_on_worker(&mut self, key: FlowKey) -> Result<FlowState, FlowCommandError> {
        let opened = self.open_counted(key)?;
        let m = self.flows.get(key).ok_or(FlowCommandError::NotPublished)?;
        let name = m.flow.name.clone();
        for (k, (shard, &w)) in opened.shards.into_iter().zip(&m.workers).enumerate() {
            if let Err(e) = self.add_to_worker(&name, w, shard) {
                // No shard without the others: take back those added.
                if let Err(undo) = self.remove_shards(&name, &m.workers[..k]) {
                    tracing::error!(flow = %name, "taking back its other shards: {}", crate::chain::Chain(&undo));
                }
                return Err(e);
            }
        }
        let mut shared = lock(&self.shared);
        let (m, e) = self
            .flows
            .both_mut(&mut shared.flows, key)
            .ok_or(FlowCommandError::NotPublished)?;
        m.running = true;
        e.ingress = Some(opened.ingress);
        e.own = opened.own;
        m.unconnected = note_outputs(e, opened.pending);
        Ok(std::mem::replace(&mut e.state, FlowState::Running))
    }

    /// Hand `shard` of flow `name` to worker `w` and wait for its answer.
    fn add_to_worker(
        &self,
        name: &str,
        w: usize,
        shard: FlowSockets,
    ) -> Result<(), FlowCommandError> {
        let handle = self.workers.get(w).ok_or(FlowCommandError::NoSuchWorker)?;
        if handle.command(Command::AddFlow(Box::new(shard))).is_err() {
            return Err(FlowCommandError::NotTakingCommands { worker: w });
        }
        match self.await_event(name)? {
            Event::FlowAdded { .. } => Ok(()),
            other => Err(FlowCommandError::Refused {
                worker: w,
                answer: format!("{other:?}"),
            }),
        }
    }

    /// Remove flow `name` from each of `workers`; the first error, after
    /// trying every one.
    fn remove_shards(&self, name: &str, workers: &[usize]) -> Result<(), FlowCommandError> {
        let mut first = Ok(());
        for &w in workers {
            let result = self.remove_from_worker(name, w);
            if first.is_ok() {
                first = result;
            }
        }
        first
    }

    /// Remove flow `name` from `worker` and wait until its sockets are
    /// closed.
    fn remove_from_worker(&self, name: &str, worker: usize) -> Result<(), FlowCommandError> {
        let handle = self
            .workers
            .get(worker)
            .ok_or(FlowCommandError::NoSuchWorker)?;
        if handle
            .command(Command::RemoveFlow(name.to_owned()))
            .is_err()
        {
            return Err(FlowCommandError::NotTakingCommands { worker });
        }
        match self.await_event(name)? {
            Event::FlowRemoved { .. } | Event::FlowUnknown { .. } => Ok(()),
            other => Err(FlowCommandError::Unexpected {
                answer: format!("{other:?}"),
            }),
        }
    }

    /// The worker's answer about flow `name`.
    fn await_event(&self, name: &str) -> Result<Event, FlowCommandError> {
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let event =
                self.events
                    .recv_timeout(left)
                    .map_err(|source| FlowCommandError::NoAnswer {
                        timeout: COMMAND_TIMEOUT,
                        source,
                    })?;
            let about = match &event {
                Event::FlowAdded { flow, .. }
                | Event::FlowRefused { flow, .. }
                | Event::FlowRemoved { flow, .. }
                | Event::FlowUnknown { flow, .. } => flow,
                Event::ModeSet { .. } => {
                    tracing::warn!("late worker answer: {event:?}");
                    continue;
                }
            };
            if about == name {
                return Ok(event);
            }
            tracing::warn!("late worker answer: {event:?}");
        }
    }

    /// Stop every worker (each lets its in-flight sends finish, at most a
    /// second), then print the final counters.
    pub fn stop(self) -> Result<(), WorkerError> {
        self.stop.store(true, Ordering::Relaxed);
        let mut failed = None;
        for w in self.workers {
            if let Err(e) = w.join() {
                tracing::error!("{e}");
                failed = Some(e);
            }
        }
        print_final(&lock(&self.shared));
        match failed {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests;
