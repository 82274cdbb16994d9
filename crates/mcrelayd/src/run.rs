//! `mcrelayd --config FILE`: load the config, open every socket, start one
//! pinned worker per core, relay until SIGTERM/SIGINT, then stop the
//! workers (each drains its in-flight sends) and print the final counters.

use std::collections::HashMap;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, bail};
use mcrelay_config::{Config, Flow};
use mcrelay_dataplane::sockets::{
    EGRESS_SEND_BUFFER_BYTES, interface_index, open_egress, open_ingress,
};
use mcrelay_dataplane::{
    FlowSockets, OutputSocket, ReceiveMode, WorkerConfig, WorkerHandle, WorkerStats,
};
use mcrelay_pool::PoolConfig;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// Options of the run mode beyond the config file.
#[derive(Debug, Clone, Copy)]
pub struct RunOptions {
    pub receive: ReceiveMode,
    /// UDP GSO for runs of same-size datagrams.
    pub gso: bool,
}

pub fn run(path: &Path, options: RunOptions) -> ExitCode {
    let config = match mcrelay_config::load(path) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("{errors}");
            return ExitCode::from(1);
        }
    };
    init_logging(&config.daemon.log_level);
    match relay(&config, options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("mcrelayd: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
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

/// Flows per worker: a flow's `core` picks its worker; the rest go to the
/// worker with the fewest outputs so far, in config order.
fn assign(config: &Config, cpus: &[usize]) -> anyhow::Result<Vec<Vec<Flow>>> {
    let mut per_worker: Vec<Vec<Flow>> = vec![Vec::new(); cpus.len()];
    let mut load = vec![0usize; cpus.len()];
    let (pinned, free): (Vec<&Flow>, Vec<&Flow>) =
        config.flows.iter().partition(|f| f.core.is_some());
    for flow in pinned.into_iter().chain(free) {
        let w = match flow.core {
            Some(core) => cpus.iter().position(|&c| c == core).with_context(|| {
                format!(
                    "flow {:?}: core {core} is not one of the worker CPUs {cpus:?}",
                    flow.name
                )
            })?,
            None => (0..cpus.len())
                .min_by_key(|&w| load[w])
                .context("no worker CPUs")?,
        };
        load[w] += flow.outputs.len() + 1;
        per_worker[w].push(flow.clone());
    }
    Ok(per_worker)
}

fn open_flow(flow: &Flow, ifindex: &mut HashMap<String, u32>) -> anyhow::Result<FlowSockets> {
    let mut index_of = |name: &str| -> anyhow::Result<u32> {
        if let Some(&i) = ifindex.get(name) {
            return Ok(i);
        }
        let i = interface_index(name).with_context(|| format!("flow {:?}", flow.name))?;
        ifindex.insert(name.to_owned(), i);
        Ok(i)
    };
    let input = &flow.input;
    if input.ingress == mcrelay_config::IngressKind::Packet {
        bail!(
            "flow {:?}: ingress = \"packet\" (AF_PACKET) is not supported by this build yet; \
             use ingress = \"socket\"",
            flow.name
        );
    }
    let ingress = open_ingress(input, index_of(&input.interface)?).with_context(|| {
        format!(
            "flow {:?}: opening input {}:{} on {}",
            flow.name, input.address, input.port, input.interface
        )
    })?;
    let requested = usize::try_from(input.receive_buffer_bytes).unwrap_or(usize::MAX);
    if ingress.receive_buffer_bytes < requested {
        tracing::warn!(
            flow = %flow.name,
            requested,
            granted = ingress.receive_buffer_bytes,
            "receive buffer clamped by net.core.rmem_max; raise it (sysctl -w net.core.rmem_max={requested}) to absorb bursts"
        );
    }
    let mut outputs = Vec::with_capacity(flow.outputs.len());
    for o in &flow.outputs {
        let label = format!("{}", std::net::SocketAddr::new(o.address, o.port));
        let socket = open_egress(o, index_of(&o.interface)?).with_context(|| {
            format!(
                "flow {:?}: opening output {label} on {}",
                flow.name, o.interface
            )
        })?;
        // Linux reports double the usable size it set.
        let granted = socket2::SockRef::from(&socket)
            .send_buffer_size()
            .unwrap_or(0)
            / 2;
        if granted < EGRESS_SEND_BUFFER_BYTES {
            tracing::warn!(
                flow = %flow.name,
                output = %label,
                granted,
                "send buffer clamped by net.core.wmem_max; raise it (sysctl -w net.core.wmem_max={EGRESS_SEND_BUFFER_BYTES}) so fan-out bursts queue instead of dropping"
            );
        }
        outputs.push(OutputSocket {
            label,
            socket,
            queue_depth: o.queue_depth,
        });
    }
    Ok(FlowSockets {
        name: flow.name.clone(),
        ingress: ingress.socket,
        outputs,
    })
}

fn relay(config: &Config, options: RunOptions) -> anyhow::Result<()> {
    let cpus = worker_cpus(config)?;
    let assignment = assign(config, &cpus)?;
    let mut ifindex = HashMap::new();
    let pools = PoolConfig {
        small: config.pools.small,
        standard: config.pools.standard,
        jumbo: config.pools.jumbo,
    };
    // Every socket first: a flow that can't open fails the start, before
    // any worker runs.
    let mut worker_flows = Vec::with_capacity(cpus.len());
    for flows in &assignment {
        let opened = flows
            .iter()
            .map(|f| open_flow(f, &mut ifindex))
            .collect::<anyhow::Result<Vec<_>>>()?;
        worker_flows.push(opened);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut signals =
        Signals::new([SIGTERM, SIGINT, SIGHUP]).context("installing signal handlers")?;
    let mut workers: Vec<WorkerHandle> = Vec::with_capacity(cpus.len());
    for (index, (flows, &cpu)) in worker_flows.into_iter().zip(&cpus).enumerate() {
        if flows.is_empty() {
            continue;
        }
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
    tracing::info!(
        flows = config.flows.len(),
        workers = workers.len(),
        "relaying; SIGTERM or SIGINT stops"
    );
    for signal in signals.forever() {
        match signal {
            SIGHUP => {
                tracing::warn!("SIGHUP: live reload is not built yet; the running config stays")
            }
            _ => break,
        }
    }
    tracing::info!("stopping");
    stop.store(true, Ordering::Relaxed);
    let stats: Vec<Arc<WorkerStats>> = workers.iter().map(|w| Arc::clone(&w.stats)).collect();
    let mut failed = None;
    for w in workers {
        if let Err(e) = w.join() {
            tracing::error!("{e}");
            failed = Some(e);
        }
    }
    for s in &stats {
        print_final(s);
    }
    match failed {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

/// One `key=value` line per flow and per output on stderr, for operators
/// and for tests.
fn print_final(worker: &WorkerStats) {
    for flow in &worker.flows {
        let c = &flow.input;
        eprintln!(
            "final flow={} worker={} packets_in={} bytes_in={} drop_oversize={} drop_pool_exhausted={} receive_errors={}",
            flow.name,
            worker.index,
            c.packets_in.get(),
            c.bytes_in.get(),
            c.drops.oversize.get(),
            c.drops.pool_exhausted.get(),
            c.receive_errors.get(),
        );
        for (label, o) in &flow.outputs {
            eprintln!(
                "final output flow={} output={} packets_out={} bytes_out={} drop_backlog={} drop_send_error={} last_errno={} in_flight_high_water={} gso_sends={} gso_fallbacks={}",
                flow.name,
                label,
                o.packets_out.get(),
                o.bytes_out.get(),
                o.drop_backlog.get(),
                o.drop_send_error.get(),
                o.last_error.get(),
                o.in_flight_high_water.get(),
                o.gso_sends.get(),
                o.gso_fallbacks.get(),
            );
        }
    }
    let l = &worker.loop_counters;
    eprintln!(
        "final worker={} turns={} completions={} sends_submitted={}",
        worker.index,
        l.turns.get(),
        l.completions.get(),
        l.sends_submitted.get()
    );
    let pool = worker.pool.snapshot();
    for class in mcrelay_pool::Class::ALL {
        let p = pool.class(class);
        eprintln!(
            "final pool worker={} class={} capacity={} taken={} exhausted={} high_water={}",
            worker.index,
            class.name(),
            p.capacity,
            p.taken,
            p.exhausted,
            p.high_water
        );
    }
}
