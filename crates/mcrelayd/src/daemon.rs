//! The supervisor: starts one worker per CPU, keeps the table of running
//! flows, applies reloads as flow diffs (unchanged flows are never
//! touched), and publishes what readers (control socket, metrics, final
//! report) see. It runs on the main thread; workers only ever see commands
//! on their queues, and readers only ever lock [`Shared`], never a worker.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use mcrelay_config::{Config, Flow};
use mcrelay_control::{
    DaemonState, FlowSnapshot, IngressDropsSnapshot, OutputSnapshot, PoolClassSnapshot,
    ReloadOutcome, Snapshot, WorkerSnapshot,
};
use mcrelay_dataplane::counters::FlowStats;
use mcrelay_dataplane::{
    Command, Event, FlowSockets, ReceiveMode, WorkerConfig, WorkerHandle, WorkerStats,
};
use mcrelay_pool::PoolConfig;

use crate::sockets::Opener;

/// How long a reload waits for a worker to answer a command.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// Options of the run mode beyond the config file.
#[derive(Debug, Clone, Copy)]
pub struct RunOptions {
    pub receive: ReceiveMode,
    /// UDP GSO for runs of same-size datagrams.
    pub gso: bool,
}

/// One running flow as readers see it.
#[derive(Debug)]
struct FlowEntry {
    worker: usize,
    input: String,
    stats: FlowStats,
    /// A second handle on the ingress socket, to read the kernel's drop
    /// count; dropped with the flow (so its group is left).
    ingress: std::os::fd::OwnedFd,
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
            flows: self.flows.iter().map(flow_snapshot).collect(),
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

fn flow_snapshot(f: &FlowEntry) -> FlowSnapshot {
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
            kernel: mcrelay_dataplane::sockets::receive_drops(&f.ingress).unwrap_or(0),
            truncated: c.frames.truncated.get(),
            malformed: c.frames.malformed.get(),
            fragment: c.frames.fragment.get(),
            bad_checksum: c.frames.bad_checksum.get(),
            not_this_flow: c.frames.not_this_flow.get(),
        },
        receive_errors: c.receive_errors.get(),
        receive_rearms: c.receive_rearms.get(),
        outputs: f
            .stats
            .outputs
            .iter()
            .map(|(label, o)| OutputSnapshot {
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
            })
            .collect(),
    }
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
    /// The flows running now, as configured, and their worker.
    running: Vec<(Flow, usize)>,
    shared: SharedHandle,
    opener: Opener,
    /// Why the helper is not what it was at start, if it isn't.
    helper_problem: Option<String>,
}

impl Daemon {
    /// Open every flow's sockets, run `before_workers` (the privilege
    /// drop: the process is still single-threaded), then start one worker
    /// per CPU. A flow that can't open fails the start, before any worker
    /// runs.
    pub fn start(
        path: &Path,
        config: Config,
        options: RunOptions,
        mut opener: Opener,
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
        let mut running = Vec::with_capacity(config.flows.len());
        let mut load = vec![0usize; cpus.len()];
        let (pinned, free): (Vec<&Flow>, Vec<&Flow>) =
            config.flows.iter().partition(|f| f.core.is_some());
        for flow in pinned.into_iter().chain(free) {
            let w = pick_worker(flow, &cpus, &load)?;
            load[w] += flow.outputs.len() + 1;
            let opened = opener.open(flow)?;
            entries.push(entry(flow, w, &opened)?);
            per_worker[w].push(opened);
            running.push((flow.clone(), w));
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
        Ok(Self {
            path: path.to_owned(),
            config,
            cpus,
            workers,
            events,
            stop,
            running,
            shared,
            opener,
            helper_problem: None,
        })
    }

    pub fn shared(&self) -> SharedHandle {
        Arc::clone(&self.shared)
    }

    pub fn flow_count(&self) -> usize {
        self.running.len()
    }

    pub fn worker_count(&self) -> usize {
        self.workers.len()
    }

    /// Notice a dead helper: running flows go on (their sockets are open),
    /// but new ones can't get sockets with the helper's privileges. It is
    /// started again — without privileges, as the daemon has none left —
    /// and the daemon reports itself degraded until it restarts.
    pub fn check_helper(&mut self) {
        let Some(why) = self.opener.helper_exited() else {
            return;
        };
        tracing::error!("{why}; running flows continue; restarting it");
        let state = match Opener::spawn_helper(&self.path) {
            Ok(opener) => {
                self.opener = opener;
                format!("{why}; restarted without privileges (restart the service to restore them)")
            }
            Err(e) => {
                self.opener = Opener::direct();
                format!("{why}; could not restart it ({e:#}); opening sockets directly")
            }
        };
        tracing::warn!("{state}");
        self.set_state(DaemonState::Degraded(state.clone()));
        self.helper_problem = Some(state);
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

    /// Re-read the config file and apply the difference: removed flows
    /// stop, added ones start, changed ones restart, unchanged ones are not
    /// touched. A file that doesn't validate changes nothing.
    pub fn reload(&mut self) -> ReloadOutcome {
        let before = std::mem::replace(&mut lock(&self.shared).state, DaemonState::Reloading);
        let outcome = self.apply_reload();
        let state = if !outcome.applied {
            // Rejected: the running config stays, and so does its state.
            before
        } else if let Some(why) = &self.helper_problem {
            DaemonState::Degraded(why.clone())
        } else if outcome.errors.is_empty() {
            DaemonState::Running
        } else {
            DaemonState::Degraded(format!("reload: {}", outcome.errors.join("; ")))
        };
        self.set_state(state);
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
        if new.daemon != self.config.daemon || new.pools != self.config.pools {
            tracing::warn!(
                "reload: [daemon] and [pools] changes take effect at the next restart; flows are applied now"
            );
        }
        // The diff against what runs (not against the last file), so a flow
        // that failed to start is retried by the next reload.
        let mut stopping = Vec::new();
        let mut starting = Vec::new();
        for (flow, worker) in &self.running {
            match new.flows.by_name(&flow.name) {
                None => {
                    outcome.removed.push(flow.name.clone());
                    stopping.push((flow.name.clone(), *worker));
                }
                Some(n) if n == flow => outcome.unchanged += 1,
                Some(n) => {
                    outcome.changed.push(flow.name.clone());
                    stopping.push((flow.name.clone(), *worker));
                    starting.push(n.clone());
                }
            }
        }
        for n in new.flows.iter() {
            if !self.running.iter().any(|(f, _)| f.name == n.name) {
                outcome.added.push(n.name.clone());
                starting.push(n.clone());
            }
        }
        for (name, worker) in stopping {
            if let Err(e) = self.stop_flow(&name, worker) {
                outcome.errors.push(format!("flow {name:?}: {e:#}"));
            }
        }
        if !starting.is_empty()
            && let Err(e) = self.opener.reload()
        {
            outcome.errors.push(format!("{e:#}"));
        }
        for flow in starting {
            if let Err(e) = self.start_flow(&flow) {
                tracing::error!(flow = %flow.name, "not started: {e:#}");
                outcome.errors.push(format!("flow {:?}: {e:#}", flow.name));
            }
        }
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

    fn stop_flow(&mut self, name: &str, worker: usize) -> anyhow::Result<()> {
        let handle = self.workers.get(worker).context("no such worker")?;
        if handle
            .command(Command::RemoveFlow(name.to_owned()))
            .is_err()
        {
            bail!("worker {worker} is not taking commands");
        }
        let answer = self.await_event(name)?;
        self.running.retain(|(f, _)| f.name != name);
        lock(&self.shared).flows.retain(|e| e.stats.name != name);
        match answer {
            Event::FlowRemoved { .. } | Event::FlowUnknown { .. } => Ok(()),
            other => bail!("unexpected answer {other:?}"),
        }
    }

    fn start_flow(&mut self, flow: &Flow) -> anyhow::Result<()> {
        let mut load = vec![0usize; self.cpus.len()];
        for (f, w) in &self.running {
            load[*w] += f.outputs.len() + 1;
        }
        let w = pick_worker(flow, &self.cpus, &load)?;
        let opened = self.opener.open(flow)?;
        let entry = entry(flow, w, &opened)?;
        let handle = self.workers.get(w).context("no such worker")?;
        if handle.command(Command::AddFlow(opened)).is_err() {
            bail!("worker {w} is not taking commands");
        }
        lock(&self.shared).flows.push(entry);
        match self.await_event(&flow.name)? {
            Event::FlowAdded { .. } => {
                self.running.push((flow.clone(), w));
                Ok(())
            }
            other => {
                lock(&self.shared)
                    .flows
                    .retain(|e| e.stats.name != flow.name);
                bail!("worker refused it: {other:?}")
            }
        }
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

fn entry(flow: &Flow, worker: usize, opened: &FlowSockets) -> anyhow::Result<FlowEntry> {
    let input = &flow.input;
    Ok(FlowEntry {
        worker,
        input: format!(
            "{} on {}",
            std::net::SocketAddr::new(input.address, input.port),
            input.interface
        ),
        stats: opened.stats(),
        ingress: opened
            .ingress
            .try_clone_fd()
            .context("duplicating the ingress socket for its drop counter")?,
    })
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
            "final flow={} worker={} packets_in={} bytes_in={} drop_oversize={} drop_pool_exhausted={} drop_kernel={} drop_truncated={} drop_malformed={} drop_fragment={} drop_bad_checksum={} drop_not_this_flow={} receive_errors={}",
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
