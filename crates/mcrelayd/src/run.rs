//! `mcrelayd --config FILE`: load the config, start the daemon (sockets,
//! then one pinned worker per core), serve the control socket and the
//! metrics endpoint, tell systemd how it is going, follow interfaces going
//! down and up (netlink), reload on SIGHUP or `mcrelayctl reload`, and on
//! SIGTERM/SIGINT stop the workers (each drains its in-flight sends) and
//! print the final counters.

use std::path::Path;
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mcrelay_control::{DaemonState, ReloadOutcome};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::control::{self, ToSupervisor};
use crate::daemon::{Daemon, RunOptions, lock};
use crate::links::LinkTable;
use crate::netlink::LinkWatch;
use crate::notify::Notifier;
use crate::sockets::Opener;

/// Run the relay with the config at `path`; `helper`: the privileged
/// helper program, if `--helper` named one.
pub fn run(path: &Path, helper: Option<&Path>, options: RunOptions) -> ExitCode {
    let config = match mcrelay_config::load(path) {
        Ok(c) => c,
        Err(errors) => {
            crate::journal::eprint_error(&errors);
            return ExitCode::from(1);
        }
    };
    crate::journal::init(&config.daemon.log_level);
    match supervise(path, helper, config, options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let e = crate::chain::Chain(&e);
            tracing::error!("{e}");
            // The journal has it from tracing, at error priority; a
            // terminal also gets the plain one-line summary.
            if crate::journal::error_prefix().is_empty() {
                eprintln!("mcrelayd: {e}");
            }
            ExitCode::from(1)
        }
    }
}

/// Why the daemon stopped with an error, by the step that failed.
#[derive(Debug, thiserror::Error)]
enum SuperviseError {
    #[error(transparent)]
    Privileges(#[from] PrivilegeError),
    #[error(transparent)]
    FdBudget(#[from] crate::fdbudget::AtStartError),
    #[error(transparent)]
    KernelLimits(#[from] crate::kernel_limits::LimitError),
    #[error(transparent)]
    SpawnHelper(#[from] crate::sockets::SpawnHelperError),
    #[error(transparent)]
    Control(#[from] control::ControlError),
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
    #[error(transparent)]
    Start(#[from] crate::daemon::StartError),
    #[error(transparent)]
    WatchHelper(#[from] crate::sockets::WatchError),
    /// Stopping the workers at the end.
    #[error(transparent)]
    Stop(#[from] mcrelay_uring::WorkerError),
    #[error("installing signal handlers")]
    Signals(#[source] std::io::Error),
    /// A thread of the daemon's (named) did not start.
    #[error("starting the {0}")]
    Thread(&'static str, #[source] std::io::Error),
}

/// Why this process's privileges could not be read or given up.
#[derive(Debug, thiserror::Error)]
enum PrivilegeError {
    #[error("reading /proc/self/status")]
    Status(#[source] std::io::Error),
    #[error(
        "daemon.user {user:?}: started as root, mcrelayd switches to this user; \
         create it (systemd-sysusers deploy/mcrelay.sysusers) or name another"
    )]
    NoUser {
        user: String,
        #[source]
        source: std::io::Error,
    },
    #[error("switching to user {user:?}")]
    SwitchUser {
        user: String,
        #[source]
        source: std::io::Error,
    },
    #[error("dropping capabilities")]
    Capabilities(#[source] std::io::Error),
    #[error("making the daemon non-dumpable")]
    Seal(#[source] crate::hardening::SealError),
}

/// What the main thread waits for.
enum Wake {
    Signal(i32),
    Control(ToSupervisor),
    /// The interfaces changed; all of them as they are now.
    Links(LinkTable),
    /// The privileged helper's connection hung up.
    HelperExited,
}

/// How often the supervisor checks its workers, updates `STATUS=` and, when
/// systemd asks for it, pets the watchdog.
const TICK: Duration = Duration::from_secs(1);

fn supervise(
    path: &Path,
    helper: Option<&Path>,
    config: mcrelay_config::Config,
    options: RunOptions,
) -> Result<(), SuperviseError> {
    let notifier = Notifier::from_env();
    let control_path = config.daemon.control_socket.clone();
    let metrics_listen = config.daemon.metrics_listen;
    let metrics_allow = config.daemon.metrics_allow.clone();
    // Everything that needs privileges happens now, while this is the only
    // thread: start the helper (it keeps them), bind the control socket and
    // the metrics port, open every flow's sockets, then drop to the
    // service user with no capabilities before the first worker starts.
    let privileges = Privileges::of_this_process(&config.daemon.user)?;
    // Before the helper starts: it inherits the raised limit.
    crate::fdbudget::at_start(path, &config)?;
    crate::kernel_limits::at_load(path, &config)?;
    let opener = if privileges.any() {
        let program = crate::sockets::helper_program(helper)?;
        Opener::spawn_helper(
            &program,
            path,
            privileges.user.as_ref().map(|u| u.name.as_str()),
        )?
    } else {
        tracing::info!("started without privileges: opening sockets in this process, no helper");
        Opener::direct()
    };
    let control_bound = control::bind(&control_path, privileges.socket_owner())?;
    let metrics_bound = metrics_listen.map(crate::metrics::bind).transpose()?;
    // Subscribed before the first dump, so no change after it is missed.
    let links = match LinkWatch::open().and_then(|mut w| w.dump().map(|t| (w, t))) {
        Ok((watch, table)) => {
            tracing::info!(interfaces = table.len(), "watching interfaces over netlink");
            Some((watch, table))
        }
        Err(e) => {
            tracing::warn!(
                "cannot watch interfaces over netlink ({e}): flows start as if every interface \
                 were up, and are not paused when one goes down"
            );
            None
        }
    };
    let mut daemon = Daemon::start(
        path,
        config,
        options,
        opener,
        links.as_ref().map(|(_, t)| t.clone()),
        || {
            privileges.drop()?;
            // Only now: the SRT thread and libsrt's must not keep privileges.
            crate::srt::privileges_dropped();
            // And the neighbour watcher of unicast xdp outputs.
            crate::neighbour::privileges_dropped();
            Ok::<(), PrivilegeError>(())
        },
    )?;
    let (wake_tx, wake) = mpsc::channel();
    let helper_tx = wake_tx.clone();
    daemon.on_helper_exit(std::sync::Arc::new(move || {
        let _ = helper_tx.send(Wake::HelperExited);
    }))?;
    let mut signals = Signals::new([SIGTERM, SIGINT, SIGHUP]).map_err(SuperviseError::Signals)?;
    let signal_tx = wake_tx.clone();
    std::thread::Builder::new()
        .name("mcrelay-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                if signal_tx.send(Wake::Signal(signal)).is_err() {
                    return;
                }
            }
        })
        .map_err(|e| SuperviseError::Thread("signal thread", e))?;
    if let Some((watch, table)) = links {
        let links_tx = wake_tx.clone();
        std::thread::Builder::new()
            .name("mcrelay-links".into())
            .spawn(move || watch.run(table, |t| links_tx.send(Wake::Links(t.clone())).is_ok()))
            .map_err(|e| SuperviseError::Thread("interface watcher", e))?;
    }
    let (control_tx, control_rx) = mpsc::channel();
    control::start(control_bound, daemon.shared(), control_tx)?;
    let forward = wake_tx.clone();
    std::thread::Builder::new()
        .name("mcrelay-ctl-fwd".into())
        .spawn(move || {
            for request in control_rx {
                if forward.send(Wake::Control(request)).is_err() {
                    return;
                }
            }
        })
        .map_err(|e| SuperviseError::Thread("control forwarder", e))?;
    if let Some(listener) = metrics_bound {
        crate::metrics::start(listener, daemon.shared(), metrics_allow)?;
    }
    tracing::info!(
        flows = daemon.flow_count(),
        relaying = daemon.running_count(),
        workers = daemon.worker_count(),
        mode = %daemon.mode(),
        control = %control_path.display(),
        "relaying; SIGTERM or SIGINT stops, SIGHUP reloads"
    );
    let tell = |what: &str, r: std::io::Result<()>| {
        if let Err(e) = r {
            tracing::warn!("systemd notify ({what}) failed: {e}");
        }
    };
    if let Some(n) = &notifier {
        tell("ready", n.ready_with_status(&status_line(&daemon)));
    }
    let watchdog = notifier.as_ref().and_then(Notifier::watchdog_interval);
    let mut turns = daemon.turns();
    let mut last_check = Instant::now();
    let mut health = crate::health::Watcher::default();
    loop {
        match wake.recv_timeout(TICK) {
            Ok(Wake::Signal(SIGHUP)) => {
                // A SIGHUP never removes every flow: the file may be
                // half-written (see Daemon::reload).
                reload(&mut daemon, notifier.as_ref(), false);
            }
            Ok(Wake::Signal(_)) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Ok(Wake::Control(ToSupervisor::Reload { allow_empty, reply })) => {
                let outcome = reload(&mut daemon, notifier.as_ref(), allow_empty);
                let _ = reply.send(outcome);
            }
            Ok(Wake::Control(ToSupervisor::SetMode { mode, reply })) => {
                let _ = reply.send(daemon.set_mode(mode));
            }
            Ok(Wake::Links(table)) => daemon.links_changed(table),
            Ok(Wake::HelperExited) => daemon.check_helper(),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if last_check.elapsed() < TICK {
            continue;
        }
        last_check = Instant::now();
        daemon.check_helper();
        // Flows whose start failed are retried here (with a growing delay).
        daemon.reconcile();
        // A worker whose loop turns is alive: each turns at least every
        // 100 ms tick. Only then is the watchdog fed.
        let now = daemon.turns();
        let turning = daemon.workers_alive() && now.iter().zip(&turns).all(|(n, t)| n > t);
        turns = now;
        if !turning {
            daemon.mark_stalled();
        }
        health.tick(&lock(&daemon.shared()).snapshot());
        if let Some(n) = &notifier {
            tell(
                "status",
                n.status(&(status_line(&daemon) + &health.status())),
            );
            if watchdog.is_some() && turning {
                tell("watchdog", n.watchdog());
            }
        }
    }
    tracing::info!("stopping");
    if let Some(n) = &notifier {
        tell("stopping", n.stopping());
    }
    let stopped = daemon.stop();
    // Before exit: libsrt's global teardown must not run under a thread
    // still inside libsrt (it aborts).
    crate::srt::shutdown();
    stopped.map_err(Into::into)
}

fn reload(daemon: &mut Daemon, notifier: Option<&Notifier>, allow_empty: bool) -> ReloadOutcome {
    tracing::info!("reloading the configuration");
    if let Some(n) = notifier {
        let _ = n.reloading();
    }
    let outcome = daemon.reload(allow_empty);
    if let Some(n) = notifier {
        let status = if outcome.applied {
            status_line(daemon)
        } else {
            format!(
                "reload rejected ({} errors); running the previous configuration",
                outcome.errors.len()
            )
        };
        let _ = n.ready_with_status(&status);
    }
    outcome
}

/// `STATUS=` for systemd: state, flows, and packet totals.
fn status_line(daemon: &Daemon) -> String {
    let snapshot = lock(&daemon.shared()).snapshot();
    let t = snapshot.totals();
    let state = match &snapshot.state {
        DaemonState::Running => "running".to_owned(),
        DaemonState::Reloading => "reloading".to_owned(),
        DaemonState::Degraded(why) => format!("degraded: {why}"),
    };
    let standby = if snapshot.mode.is_standby() {
        "standby (sending nothing); "
    } else {
        ""
    };
    format!(
        "{standby}{state}; {} flows ({} relaying), {} outputs; {} packets in, {} out, {} dropped",
        t.flows,
        t.flows_running,
        t.outputs,
        t.packets_in,
        t.packets_out,
        t.ingress_drops.total() + t.drops_backlog + t.drops_send_error
    )
}

/// What this process may do, as started, and how it gives it up.
struct Privileges {
    root: bool,
    capabilities: bool,
    /// The service user, looked up when started as root.
    user: Option<mcrelay_sys::privileges::User>,
}

impl Privileges {
    fn of_this_process(user: &str) -> Result<Self, PrivilegeError> {
        let me = mcrelay_sys::privileges::status_of(std::process::id())
            .map_err(PrivilegeError::Status)?;
        let root = me.uid[1] == 0;
        let capabilities = me.cap_prm != 0 || me.cap_eff != 0 || me.cap_amb != 0;
        let user = if root {
            Some(
                mcrelay_sys::privileges::lookup_user(user).map_err(|source| {
                    PrivilegeError::NoUser {
                        user: user.to_owned(),
                        source,
                    }
                })?,
            )
        } else {
            None
        };
        Ok(Self {
            root,
            capabilities,
            user,
        })
    }

    fn any(&self) -> bool {
        self.root || self.capabilities
    }

    /// Who should own the control socket: the service user, when we are
    /// about to become it.
    fn socket_owner(&self) -> Option<(u32, u32)> {
        self.user.as_ref().map(|u| (u.uid, u.gid))
    }

    /// Switch to the service user (when root) and drop every capability.
    /// Only while single-threaded: both act on the calling thread.
    fn drop(&self) -> Result<(), PrivilegeError> {
        if let Some(user) = &self.user {
            mcrelay_sys::privileges::drop_to_user(&user.name).map_err(|source| {
                PrivilegeError::SwitchUser {
                    user: user.name.clone(),
                    source,
                }
            })?;
        }
        if self.any() {
            mcrelay_sys::privileges::drop_all_capabilities()
                .map_err(PrivilegeError::Capabilities)?;
            crate::hardening::seal().map_err(PrivilegeError::Seal)?;
            let me = mcrelay_sys::privileges::status_of(std::process::id())
                .map_err(PrivilegeError::Status)?;
            tracing::info!(
                uid = me.uid[1],
                gid = me.gid[1],
                cap_eff = me.cap_eff,
                cap_prm = me.cap_prm,
                cap_amb = me.cap_amb,
                "privileges dropped; only the helper keeps any"
            );
        }
        Ok(())
    }
}
