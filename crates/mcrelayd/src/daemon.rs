//! The supervisor: starts one worker per CPU, keeps the table of
//! configured flows, applies reloads as flow diffs (unchanged flows are
//! never touched), pauses a flow while one of its interfaces is down or
//! missing and resumes it when the interface is back (see [`crate::links`]),
//! and publishes what readers (control socket, metrics, final report) see.
//! It runs on the main thread; workers only ever see commands on their
//! queues, and readers only ever lock [`Shared`], never a worker.
//!
//! A paused flow is removed from its worker (its sockets closed, its groups
//! left, its buffers back in the pool) and re-added with freshly opened
//! sockets, on the same worker and with the same counters, when every
//! interface it names is up again.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use mcrelay_config::{Config, Flow};
use mcrelay_control::{
    DaemonState, FlowSnapshot, FlowState, IngressDropsSnapshot, OutputSnapshot, PoolClassSnapshot,
    ReloadOutcome, Snapshot, WorkerSnapshot,
};
use mcrelay_dataplane::counters::FlowStats;
use mcrelay_dataplane::{
    Command, Event, FlowSockets, ReceiveMode, WorkerConfig, WorkerHandle, WorkerStats,
};
use mcrelay_pool::PoolConfig;

use crate::links::{self, Blocked, LinkTable};
use crate::outputs::{OutputState, Unconnected};
use crate::sockets::{Opener, output_label};

/// How long a reload waits for a worker to answer a command.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// A flow whose interfaces are up but whose sockets could not be opened is
/// retried after this, then after twice as long each time, up to
/// [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Options of the run mode beyond the config file.
#[derive(Debug, Clone, Copy)]
pub struct RunOptions {
    pub receive: ReceiveMode,
    /// UDP GSO for runs of same-size datagrams.
    pub gso: bool,
}

/// One configured flow as readers see it, relaying or not.
#[derive(Debug)]
struct FlowEntry {
    worker: usize,
    input: String,
    /// Kept across pauses: the counters go on where they stopped.
    stats: FlowStats,
    /// While it runs, a second handle on the ingress socket, to read the
    /// kernel's drop count; dropped when the flow stops (so its group is
    /// left).
    ingress: Option<mcrelay_dataplane::sockets::KernelDrops>,
    /// Kernel drops counted by earlier ingress sockets (before pauses).
    kernel_drops_before: u64,
    state: FlowState,
    interface_pauses: u64,
    /// Each output's connection, in config order.
    outputs_state: Vec<OutputState>,
}

impl FlowEntry {
    fn kernel_drops(&self) -> u64 {
        let now = self
            .ingress
            .as_ref()
            .map_or(0, mcrelay_dataplane::sockets::KernelDrops::get);
        self.kernel_drops_before.saturating_add(now)
    }

    /// Close the second ingress handle, keeping its drop count.
    fn close_ingress(&mut self) {
        self.kernel_drops_before = self.kernel_drops();
        self.ingress = None;
    }
}

/// What the control socket, the metrics endpoint and the final report
/// read. Locked only by readers and by the supervisor on a reload.
#[derive(Debug)]
pub struct Shared {
    flows: Vec<FlowEntry>,
    workers: Vec<Arc<WorkerStats>>,
    pub state: DaemonState,
    config_path: String,
    started: Instant,
}

/// Readers' handle.
pub type SharedHandle = Arc<Mutex<Shared>>;

/// Lock `shared`, also after a reader panicked while holding it (the data
/// is counters and a list; it stays consistent).
pub fn lock(shared: &SharedHandle) -> std::sync::MutexGuard<'_, Shared> {
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    /// Every counter, read without stopping a worker.
    pub fn snapshot(&self) -> Snapshot {
        self.snapshot_with(false)
    }

    /// [`Self::snapshot`] for an operator's read (control socket, metrics):
    /// each input's max gap starts a new period.
    pub fn read(&self) -> Snapshot {
        self.snapshot_with(true)
    }

    fn snapshot_with(&self, take_gaps: bool) -> Snapshot {
        let taken_at_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        Snapshot {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            pid: std::process::id(),
            uptime_seconds: self.started.elapsed().as_secs_f64(),
            taken_at_unix_ms,
            state: self.state.clone(),
            config_path: self.config_path.clone(),
            workers: self.workers.iter().map(|w| worker_snapshot(w)).collect(),
            flows: self
                .flows
                .iter()
                .map(|f| flow_snapshot(f, take_gaps))
                .collect(),
        }
    }
}

fn worker_snapshot(w: &WorkerStats) -> WorkerSnapshot {
    let pool = w.pool.snapshot();
    let l = &w.loop_counters;
    let u32_of = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    WorkerSnapshot {
        index: w.index,
        cpu: w.cpu,
        receive_mode: if w.multishot { "multishot" } else { "single" }.to_owned(),
        loop_turns: l.turns.get(),
        completions: l.completions.get(),
        sends_submitted: l.sends_submitted.get(),
        pools: mcrelay_pool::Class::ALL
            .iter()
            .map(|&class| {
                let c = pool.class(class);
                PoolClassSnapshot {
                    class: class.name().to_owned(),
                    buffer_bytes: u32_of(class.size() as u64),
                    capacity: u32_of(c.capacity),
                    in_use: u32_of(c.in_use),
                    high_water: u32_of(c.high_water),
                    taken: c.taken,
                    exhausted: c.exhausted,
                }
            })
            .collect(),
    }
}

fn flow_snapshot(f: &FlowEntry, take_gaps: bool) -> FlowSnapshot {
    let c = &f.stats.input;
    FlowSnapshot {
        name: f.stats.name.clone(),
        worker: f.worker,
        input: f.input.clone(),
        packets_in: c.packets_in.get(),
        bytes_in: c.bytes_in.get(),
        drops: IngressDropsSnapshot {
            oversize: c.drops.oversize.get(),
            pool_exhausted: c.drops.pool_exhausted.get(),
            kernel: f.kernel_drops(),
            truncated: c.frames.truncated.get(),
            malformed: c.frames.malformed.get(),
            fragment: c.frames.fragment.get(),
            bad_checksum: c.frames.bad_checksum.get(),
            not_this_flow: c.frames.not_this_flow.get(),
        },
        receive_errors: c.receive_errors.get(),
        receive_rearms: c.receive_rearms.get(),
        pool_fallbacks: c.pool_fallbacks.get(),
        outputs: f
            .stats
            .outputs
            .iter()
            .zip(f.outputs_state.iter())
            .map(|((label, o), state)| OutputSnapshot {
                label: label.clone(),
                packets_out: o.packets_out.get(),
                bytes_out: o.bytes_out.get(),
                drops_backlog: o.drop_backlog.get(),
                drops_send_error: o.drop_send_error.get(),
                last_error: match o.last_error.get() {
                    0 => None,
                    errno => Some(
                        std::io::Error::from_raw_os_error(i32::try_from(errno).unwrap_or(0))
                            .to_string(),
                    ),
                },
                in_flight_high_water: o.in_flight_high_water.get(),
                gso_sends: o.gso_sends.get(),
                gso_fallbacks: o.gso_fallbacks.get(),
                not_connected: state.not_connected.clone(),
                connect_failures: state.connect_failures,
            })
            .collect(),
        state: f.state.clone(),
        interface_pauses: f.interface_pauses,
        health: crate::health::snapshot(&c.health, take_gaps),
    }
}

/// A configured flow, as the supervisor tracks it.
#[derive(Debug)]
struct Managed {
    flow: Flow,
    /// Its worker, chosen once: a paused flow resumes on the same one.
    worker: usize,
    /// On its worker now.
    running: bool,
    /// After a failed start: not before this instant, and the delay after
    /// the next failure.
    retry: Option<(Instant, Duration)>,
    /// Its outputs not connected yet, while it runs.
    unconnected: Vec<Unconnected>,
}

/// The interfaces `flow` names: its input's, then its outputs'.
fn interfaces(flow: &Flow) -> impl Iterator<Item = &str> {
    std::iter::once(flow.input.interface.as_str())
        .chain(flow.outputs.iter().map(|o| o.interface.as_str()))
}

/// Why `flow` can't run with the interfaces in `links`; `None` if it can,
/// or if interfaces are not watched.
fn blocked(links: Option<&LinkTable>, flow: &Flow) -> Option<FlowState> {
    Some(match links::blocked(links?, interfaces(flow))? {
        Blocked::Down(interface) => FlowState::InterfaceDown { interface },
        Blocked::Missing(interface) => FlowState::WaitingForInterface { interface },
    })
}

/// Fresh counters for `flow`.
fn new_stats(flow: &Flow) -> FlowStats {
    FlowStats {
        name: flow.name.clone(),
        input: Arc::default(),
        outputs: flow
            .outputs
            .iter()
            .map(|o| (output_label(o), Arc::default()))
            .collect(),
    }
}

/// Another handle on the same counters.
fn share(stats: &FlowStats) -> FlowStats {
    FlowStats {
        name: stats.name.clone(),
        input: Arc::clone(&stats.input),
        outputs: stats
            .outputs
            .iter()
            .map(|(label, c)| (label.clone(), Arc::clone(c)))
            .collect(),
    }
}

/// `opened` writing into `stats` (the flow's counters since it was
/// configured) instead of the fresh ones it came with.
fn with_counters(mut opened: FlowSockets, stats: &FlowStats) -> FlowSockets {
    opened.counters = Arc::clone(&stats.input);
    for (o, (_, c)) in opened.outputs.iter_mut().zip(&stats.outputs) {
        o.counters = Arc::clone(c);
    }
    opened
}

fn entry_mut<'a>(shared: &'a mut Shared, name: &str) -> Option<&'a mut FlowEntry> {
    shared.flows.iter_mut().find(|e| e.stats.name == name)
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
    /// Every configured flow, relaying or not, in start order.
    flows: Vec<Managed>,
    shared: SharedHandle,
    opener: Opener,
    /// The interfaces as netlink last reported them; `None` when they are
    /// not watched (every interface then counts as up).
    links: Option<LinkTable>,
    /// Why the helper is not what it was at start, if it isn't.
    helper_problem: Option<String>,
    /// What went wrong in the last reload beyond single flows.
    reload_problem: Option<String>,
    /// A worker stopped turning its loop.
    stalled: bool,
    /// A reload is being applied: the published state stays `Reloading`.
    reloading: bool,
}

impl Daemon {
    /// Open the sockets of every flow whose interfaces are up in `links`
    /// (all of them when `links` is `None`: interfaces not watched), run
    /// `before_workers` (the privilege drop: the process is still
    /// single-threaded), then start one worker per CPU. A flow with an
    /// interface missing or down waits for it; a flow that can't open
    /// otherwise fails the start, before any worker runs.
    pub fn start(
        path: &Path,
        config: Config,
        options: RunOptions,
        mut opener: Opener,
        links: Option<LinkTable>,
        before_workers: impl FnOnce() -> anyhow::Result<()>,
    ) -> anyhow::Result<Self> {
        let cpus = worker_cpus(&config)?;
        let pools = PoolConfig {
            small: config.pools.small,
            standard: config.pools.standard,
            jumbo: config.pools.jumbo,
        };
        let mut per_worker: Vec<Vec<FlowSockets>> = (0..cpus.len()).map(|_| Vec::new()).collect();
        let mut entries = Vec::with_capacity(config.flows.len());
        let mut managed = Vec::with_capacity(config.flows.len());
        let mut load = vec![0usize; cpus.len()];
        let (pinned, free): (Vec<&Flow>, Vec<&Flow>) =
            config.flows.iter().partition(|f| f.core.is_some());
        for flow in pinned.into_iter().chain(free) {
            let w = pick_worker(flow, &cpus, &load)?;
            load[w] += flow.outputs.len() + 1;
            let mut entry = new_entry(flow, w);
            let mut unconnected = Vec::new();
            let running = match blocked(links.as_ref(), flow) {
                None => {
                    let (opened, pending) = opener.open(flow)?;
                    let opened = with_counters(opened, &entry.stats);
                    entry.ingress = Some(clone_ingress(&opened)?);
                    unconnected = note_outputs(&mut entry, pending);
                    per_worker[w].push(opened);
                    true
                }
                Some(state) => {
                    tracing::warn!(flow = %flow.name, "not started: {state}; it starts when the interface is up");
                    entry.state = state;
                    false
                }
            };
            entries.push(entry);
            managed.push(Managed {
                flow: flow.clone(),
                worker: w,
                running,
                retry: None,
                unconnected,
            });
        }
        before_workers()?;
        let stop = Arc::new(AtomicBool::new(false));
        let (events_tx, events) = mpsc::channel();
        let mut workers: Vec<WorkerHandle> = Vec::with_capacity(cpus.len());
        for (index, (flows, &cpu)) in per_worker.into_iter().zip(&cpus).enumerate() {
            let spawned = mcrelay_dataplane::spawn(
                WorkerConfig {
                    index,
                    cpu: Some(cpu),
                    pools,
                    flows,
                    receive: options.receive,
                    gso: options.gso,
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
        }));
        let daemon = Self {
            path: path.to_owned(),
            config,
            cpus,
            workers,
            events,
            stop,
            flows: managed,
            shared,
            opener,
            links,
            helper_problem: None,
            reload_problem: None,
            stalled: false,
            reloading: false,
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

    /// Notice a dead helper: running flows go on (their sockets are open),
    /// and the zygote forks a new one with the same privileges; flows that
    /// failed or are waiting are retried at once. If that fails (the zygote
    /// is gone too), sockets are opened in this process, without
    /// privileges, and the daemon reports itself degraded until restarted.
    pub fn check_helper(&mut self) {
        let Some(why) = self.opener.helper_exited() else {
            return;
        };
        self.helper_problem = crate::sockets::restart_helper(&mut self.opener, &why);
        for m in &mut self.flows {
            m.retry = None;
        }
        self.reconcile();
    }

    /// Call `waker` (from another thread) whenever the helper dies.
    pub fn on_helper_exit(&mut self, waker: crate::sockets::HelperWaker) -> anyhow::Result<()> {
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
        why.extend(self.reload_problem.iter().cloned());
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

    /// Netlink reported a change of the interfaces: pause the flows that
    /// lost one, resume those whose interfaces are all back.
    pub fn links_changed(&mut self, table: LinkTable) {
        self.links = Some(table);
        self.reconcile();
    }

    /// Bring every flow in line with its interfaces: a running flow with
    /// an interface down or missing is paused (counted, logged once); a
    /// stopped flow whose interfaces are all up is started (a failed start
    /// is retried with a growing delay). Other flows are not touched.
    pub fn reconcile(&mut self) {
        self.retry_outputs();
        for i in 0..self.flows.len() {
            let m = &self.flows[i];
            match (m.running, blocked(self.links.as_ref(), &m.flow)) {
                (true, None) => {}
                (true, Some(state)) => self.pause(i, state),
                (false, Some(state)) => {
                    self.flows[i].retry = None;
                    let name = self.flows[i].flow.name.clone();
                    if self.set_flow_state(&name, state.clone()) {
                        tracing::warn!(flow = %name, "{state}");
                    }
                }
                (false, None) => {
                    if m.retry.is_some_and(|(at, _)| Instant::now() < at) {
                        continue;
                    }
                    self.resume(i);
                }
            }
        }
        self.refresh_state();
    }

    /// Try again to connect the outputs of running flows that aren't.
    fn retry_outputs(&mut self) {
        for m in self.flows.iter_mut().filter(|m| !m.unconnected.is_empty()) {
            let results = crate::outputs::retry(&mut m.unconnected);
            let mut shared = lock(&self.shared);
            if let Some(e) = entry_mut(&mut shared, &m.flow.name) {
                for (index, result) in results {
                    log_output(e, index, result);
                }
            }
        }
    }

    /// Set flow `name`'s published state; whether it changed.
    fn set_flow_state(&self, name: &str, state: FlowState) -> bool {
        let mut shared = lock(&self.shared);
        match entry_mut(&mut shared, name) {
            Some(e) if e.state != state => {
                e.state = state;
                true
            }
            _ => false,
        }
    }

    /// Take running flow `i` off its worker because of `state`.
    fn pause(&mut self, i: usize, state: FlowState) {
        let (name, worker) = (self.flows[i].flow.name.clone(), self.flows[i].worker);
        if let Err(e) = self.remove_from_worker(&name, worker) {
            tracing::error!(flow = %name, "pausing: {e:#}");
        }
        self.flows[i].running = false;
        self.flows[i].retry = None;
        self.flows[i].unconnected.clear();
        let mut shared = lock(&self.shared);
        if let Some(e) = entry_mut(&mut shared, &name) {
            e.close_ingress();
            e.interface_pauses += 1;
            e.state = state.clone();
        }
        tracing::warn!(flow = %name, "{state}; the flow resumes when the interface is up");
    }

    /// Start stopped flow `i`; on failure, publish why (logged when the
    /// reason changes) and schedule a retry.
    fn resume(&mut self, i: usize) {
        let name = self.flows[i].flow.name.clone();
        match self.start_on_worker(i) {
            Ok(before) => {
                self.flows[i].retry = None;
                if before.is_running() {
                    tracing::info!(flow = %name, "started");
                } else {
                    tracing::info!(flow = %name, "relaying again (was {before})");
                }
            }
            Err(e) => {
                let delay = self.flows[i]
                    .retry
                    .map_or(RETRY_FIRST, |(_, d)| (d * 2).min(RETRY_MAX));
                self.flows[i].retry = Some((Instant::now() + delay, delay));
                let state = FlowState::OpenFailed {
                    error: format!("{e:#}"),
                };
                if self.set_flow_state(&name, state) {
                    tracing::error!(flow = %name, "not started: {e:#}; retrying in {delay:?}, then less often");
                }
            }
        }
    }

    /// Open flow `i`'s sockets and hand them to its worker, with the
    /// flow's counters. The state it had before.
    fn start_on_worker(&mut self, i: usize) -> anyhow::Result<FlowState> {
        let (flow, w) = (&self.flows[i].flow, self.flows[i].worker);
        let stats = {
            let mut shared = lock(&self.shared);
            let e = entry_mut(&mut shared, &flow.name).context("flow not published")?;
            share(&e.stats)
        };
        let (opened, pending) = self.opener.open(flow)?;
        let opened = with_counters(opened, &stats);
        let ingress = clone_ingress(&opened)?;
        let handle = self.workers.get(w).context("no such worker")?;
        if handle.command(Command::AddFlow(opened)).is_err() {
            bail!("worker {w} is not taking commands");
        }
        let name = flow.name.clone();
        match self.await_event(&name)? {
            Event::FlowAdded { .. } => {
                self.flows[i].running = true;
                let mut shared = lock(&self.shared);
                let e = entry_mut(&mut shared, &name).context("flow not published")?;
                e.ingress = Some(ingress);
                self.flows[i].unconnected = note_outputs(e, pending);
                Ok(std::mem::replace(&mut e.state, FlowState::Running))
            }
            other => bail!("worker {w} refused it: {other:?}"),
        }
    }

    /// Remove flow `name` from `worker` and wait until its sockets are
    /// closed.
    fn remove_from_worker(&self, name: &str, worker: usize) -> anyhow::Result<()> {
        let handle = self.workers.get(worker).context("no such worker")?;
        if handle
            .command(Command::RemoveFlow(name.to_owned()))
            .is_err()
        {
            bail!("worker {worker} is not taking commands");
        }
        match self.await_event(name)? {
            Event::FlowRemoved { .. } | Event::FlowUnknown { .. } => Ok(()),
            other => bail!("unexpected answer {other:?}"),
        }
    }

    /// Re-read the config file and apply the difference: removed flows
    /// stop (or, if paused, are forgotten), added ones start, changed ones
    /// restart — added and changed ones only once their interfaces are up
    /// — and unchanged ones are not touched (one that failed to start is
    /// retried at once). A file that doesn't validate changes nothing.
    pub fn reload(&mut self) -> ReloadOutcome {
        let before = std::mem::replace(&mut lock(&self.shared).state, DaemonState::Reloading);
        self.reloading = true;
        let outcome = self.apply_reload();
        self.reloading = false;
        if outcome.applied {
            self.refresh_state();
        } else {
            // Rejected: the running config stays, and so does its state.
            self.set_state(before);
        }
        outcome
    }

    fn apply_reload(&mut self) -> ReloadOutcome {
        let mut outcome = ReloadOutcome::default();
        let new = match mcrelay_config::load(&self.path) {
            Ok(c) => c,
            Err(errors) => {
                outcome.errors = errors.to_string().lines().map(str::to_owned).collect();
                tracing::error!("reload rejected; the running configuration stays:\n{errors}");
                return outcome;
            }
        };
        if let Err(e) = crate::fdbudget::at_reload(&self.path, &new) {
            tracing::error!("reload rejected; the running configuration stays:\n{e}");
            outcome.errors = vec![e];
            return outcome;
        }
        if new.daemon != self.config.daemon || new.pools != self.config.pools {
            tracing::warn!(
                "reload: [daemon] and [pools] changes take effect at the next restart; flows are applied now"
            );
        }
        // The diff against the flows configured now, running or not. A flow
        // that is paused, waiting or failed to start stays as it is when
        // unchanged (and is retried at once); a changed one restarts, or
        // stays paused if its interface is still down.
        let mut stopping = Vec::new();
        let mut starting = Vec::new();
        for m in &self.flows {
            match new.flows.by_name(&m.flow.name) {
                None => {
                    outcome.removed.push(m.flow.name.clone());
                    stopping.push(m.flow.name.clone());
                }
                Some(n) if *n == m.flow => outcome.unchanged += 1,
                Some(n) => {
                    outcome.changed.push(m.flow.name.clone());
                    stopping.push(m.flow.name.clone());
                    starting.push(n.clone());
                }
            }
        }
        for n in new.flows.iter() {
            if !self.flows.iter().any(|m| m.flow.name == n.name) {
                outcome.added.push(n.name.clone());
                starting.push(n.clone());
            }
        }
        let mut problems = Vec::new();
        for name in stopping {
            if let Err(e) = self.forget_flow(&name) {
                problems.push(format!("flow {name:?}: {e:#}"));
            }
        }
        if !starting.is_empty()
            && let Err(e) = self.opener.reload()
        {
            problems.push(format!("{e:#}"));
        }
        for flow in &starting {
            if let Err(e) = self.add_flow(flow) {
                problems.push(format!("flow {:?}: {e:#}", flow.name));
            }
        }
        for m in &mut self.flows {
            m.retry = None;
        }
        self.reconcile();
        outcome.errors.clone_from(&problems);
        {
            let shared = lock(&self.shared);
            for flow in &starting {
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
        outcome.applied = true;
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

    /// Stop flow `name` if it runs, and forget it.
    fn forget_flow(&mut self, name: &str) -> anyhow::Result<()> {
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
    fn add_flow(&mut self, flow: &Flow) -> anyhow::Result<()> {
        let mut load = vec![0usize; self.cpus.len()];
        for m in &self.flows {
            load[m.worker] += m.flow.outputs.len() + 1;
        }
        let w = pick_worker(flow, &self.cpus, &load)?;
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

    /// The worker's answer about flow `name`.
    fn await_event(&self, name: &str) -> anyhow::Result<Event> {
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let event = self
                .events
                .recv_timeout(left)
                .with_context(|| format!("no answer from the worker within {COMMAND_TIMEOUT:?}"))?;
            let about = match &event {
                Event::FlowAdded { flow, .. }
                | Event::FlowRefused { flow, .. }
                | Event::FlowRemoved { flow, .. }
                | Event::FlowUnknown { flow, .. } => flow,
            };
            if about == name {
                return Ok(event);
            }
            tracing::warn!("late worker answer: {event:?}");
        }
    }

    /// Stop every worker (each lets its in-flight sends finish, at most a
    /// second), then print the final counters.
    pub fn stop(self) -> anyhow::Result<()> {
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
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }
}

/// `flow` as readers see it, with fresh counters, running.
fn new_entry(flow: &Flow, worker: usize) -> FlowEntry {
    let input = &flow.input;
    FlowEntry {
        worker,
        input: format!(
            "{} on {}",
            std::net::SocketAddr::new(input.address, input.port),
            input.interface
        ),
        stats: new_stats(flow),
        ingress: None,
        kernel_drops_before: 0,
        state: FlowState::Running,
        interface_pauses: 0,
        outputs_state: vec![OutputState::default(); flow.outputs.len()],
    }
}

/// After `entry`'s flow opened: outputs not in `pending` are connected,
/// those in it are not (each logged when that is news). The ones to retry.
fn note_outputs(
    entry: &mut FlowEntry,
    pending: Vec<(Unconnected, std::io::Error)>,
) -> Vec<Unconnected> {
    let name = entry.stats.name.clone();
    for (index, state) in entry.outputs_state.iter_mut().enumerate() {
        if !pending.iter().any(|(u, _)| u.index == index) && state.connected() {
            let output = entry.stats.outputs.get(index).map(|(l, _)| l.as_str());
            tracing::info!(flow = %name, output, "output connected; relaying to it");
        }
    }
    pending
        .into_iter()
        .map(|(u, e)| {
            log_output(entry, u.index, Err(e));
            u
        })
        .collect()
}

/// Publish one attempt to connect output `index` of `entry`'s flow,
/// logging it when it changes the output's state.
fn log_output(entry: &mut FlowEntry, index: usize, result: std::io::Result<()>) {
    let output = entry.stats.outputs.get(index).map(|(l, _)| l.clone());
    let Some(state) = entry.outputs_state.get_mut(index) else {
        return;
    };
    let name = &entry.stats.name;
    match result {
        Ok(()) => {
            if state.connected() {
                tracing::info!(flow = %name, output, "output connected; relaying to it");
            }
        }
        Err(e) => {
            if state.failed(&e) {
                tracing::warn!(
                    flow = %name,
                    output,
                    "output not connected ({e}); the flow relays to its other outputs, \
                     this one is retried every second and on interface changes"
                );
            }
        }
    }
}

fn clone_ingress(opened: &FlowSockets) -> anyhow::Result<mcrelay_dataplane::sockets::KernelDrops> {
    let fd = opened
        .ingress
        .try_clone_fd()
        .context("duplicating the ingress socket for its drop counter")?;
    Ok(mcrelay_dataplane::sockets::KernelDrops::new(fd))
}

/// A flow's `core` picks its worker; otherwise the worker with the least
/// load (outputs + 1 per flow).
fn pick_worker(flow: &Flow, cpus: &[usize], load: &[usize]) -> anyhow::Result<usize> {
    match flow.core {
        Some(core) => cpus.iter().position(|&c| c == core).with_context(|| {
            format!(
                "flow {:?}: core {core} is not one of the worker CPUs {cpus:?}",
                flow.name
            )
        }),
        None => (0..cpus.len())
            .min_by_key(|&w| load[w])
            .context("no worker CPUs"),
    }
}

/// The worker CPUs: `daemon.cores`, each checked against the affinity
/// mask, or every CPU in the mask.
fn worker_cpus(config: &Config) -> anyhow::Result<Vec<usize>> {
    let allowed =
        mcrelay_dataplane::affinity::allowed_cpus().context("reading the CPU affinity mask")?;
    let Some(cores) = &config.daemon.cores else {
        return Ok(allowed);
    };
    for &cpu in cores {
        if !allowed.contains(&cpu) {
            bail!(
                "daemon.cores: CPU {cpu} does not exist or is not in this process's affinity mask \
                 (allowed: {allowed:?}); list only allowed CPUs"
            );
        }
    }
    Ok(cores.clone())
}

/// One `key=value` line per flow, output, worker and pool class on stderr,
/// for operators and for tests.
fn print_final(shared: &Shared) {
    let snapshot = shared.snapshot();
    for flow in &snapshot.flows {
        eprintln!(
            "final flow={} worker={} packets_in={} bytes_in={} drop_oversize={} drop_pool_exhausted={} drop_kernel={} drop_truncated={} drop_malformed={} drop_fragment={} drop_bad_checksum={} drop_not_this_flow={} receive_errors={} state={} interface_pauses={}",
            flow.name,
            flow.worker,
            flow.packets_in,
            flow.bytes_in,
            flow.drops.oversize,
            flow.drops.pool_exhausted,
            flow.drops.kernel,
            flow.drops.truncated,
            flow.drops.malformed,
            flow.drops.fragment,
            flow.drops.bad_checksum,
            flow.drops.not_this_flow,
            flow.receive_errors,
            flow.state.tag(),
            flow.interface_pauses,
        );
        for o in &flow.outputs {
            eprintln!(
                "final output flow={} output={} packets_out={} bytes_out={} drop_backlog={} drop_send_error={} last_error={:?} in_flight_high_water={} gso_sends={} gso_fallbacks={}",
                flow.name,
                o.label,
                o.packets_out,
                o.bytes_out,
                o.drops_backlog,
                o.drops_send_error,
                o.last_error.as_deref().unwrap_or(""),
                o.in_flight_high_water,
                o.gso_sends,
                o.gso_fallbacks,
            );
        }
    }
    for w in &snapshot.workers {
        eprintln!(
            "final worker={} turns={} completions={} sends_submitted={}",
            w.index, w.loop_turns, w.completions, w.sends_submitted
        );
        for p in &w.pools {
            eprintln!(
                "final pool worker={} class={} capacity={} taken={} exhausted={} high_water={} in_use={}",
                w.index, p.class, p.capacity, p.taken, p.exhausted, p.high_water, p.in_use
            );
        }
    }
}
