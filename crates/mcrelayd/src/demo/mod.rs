//! `mcrelayd demo`: mcrelay doing its main job on one machine, with no
//! set-up beyond root and iproute2.
//!
//! It builds three throwaway network namespaces (sender, relay, receivers;
//! see [`netns`]), starts the real daemon — this very executable — in the
//! relay namespace with an embedded configuration (a 1→1 flow and a 1→3
//! fan-out with group rewrite), sends a paced, numbered stream into both
//! flows and checks every relayed datagram byte by byte at the receivers
//! ([`traffic`]). Meanwhile it shows the daemon's live view, the frame
//! `mcrelayctl top --plain` prints, from the daemon's control socket once a second.
//! At the end it prints what was sent, relayed and received per output and
//! the daemon's CPU time per packet ([`summary`]), stops the daemon and
//! removes everything it created — also when interrupted by SIGINT,
//! SIGTERM or SIGHUP.
//!
//! Exit status: 0 when every output received everything, 1 when not (or
//! on an error), 2 when the demo cannot run here (not root, no network
//! namespaces), 130 when interrupted.

mod error;
mod netns;
mod relay;
mod summary;
mod sys;
mod traffic;

use std::io::{IsTerminal, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use error::{DemoError, IoContext};
use mcrelay_control::{Rates, Request, Snapshot, render_top};

use netns::Topology;
use relay::{Daemon, ask, cpu_ticks};
use summary::{Cpu, OutputResult, Summary};
use traffic::{Receiver, Sender, Stream};

/// `mcrelayd demo` options.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Seconds to send for.
    #[arg(long, value_name = "SECS", default_value_t = 15.0)]
    duration: f64,
    /// Print each view below the last instead of redrawing the screen (for
    /// logs and scripts; the default when stdout is not a terminal).
    #[arg(long)]
    plain: bool,
    /// Datagrams per second sent into each flow.
    #[arg(long, value_name = "PPS", default_value_t = 5000)]
    rate: u64,
}

/// One flow of the embedded configuration, and the stream sent into it.
struct FlowSpec {
    name: &'static str,
    input: SocketAddrV4,
    outputs: &'static [SocketAddrV4],
    /// Datagram sizes the sender cycles through.
    sizes: &'static [usize],
}

const fn addr(a: u8, b: u8, c: u8, d: u8, port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::new(a, b, c, d), port)
}

/// The two flows: 1→1, and 1→3 with the group rewritten per output.
/// One-to-one carries MPEG-TS-sized datagrams (7 × 188 B); the fan-out
/// cycles through sizes that use all three buffer pool classes.
const FLOWS: [FlowSpec; 2] = [
    FlowSpec {
        name: "one-to-one",
        input: addr(239, 1, 1, 1, 5000),
        outputs: &[addr(239, 2, 2, 1, 5000)],
        sizes: &[1316],
    },
    FlowSpec {
        name: "fan-out",
        input: addr(239, 1, 1, 2, 5001),
        outputs: &[
            addr(239, 3, 3, 1, 5001),
            addr(239, 3, 3, 2, 5001),
            addr(239, 3, 3, 3, 5001),
        ],
        sizes: &[200, 1316, 4000, 8000],
    },
];

/// The configuration the demo's daemon runs: two workers at most (one
/// per flow; a big machine need not start one per CPU for a demo), on the
/// first CPUs this process may use.
fn config_text(control_socket: &Path, cpus: &[usize]) -> String {
    let mut s = format!(
        "# Written by `mcrelayd demo`; the daemon runs in namespace *-relay.\n\
         [daemon]\n\
         user = \"nobody\"          # started as root, it drops to this user\n\
         control_socket = \"{}\"\n",
        control_socket.display()
    );
    if !cpus.is_empty() {
        let list: Vec<String> = cpus.iter().take(2).map(usize::to_string).collect();
        s.push_str(&format!("cores = [{}]\n", list.join(", ")));
    }
    for f in &FLOWS {
        s.push_str(&format!(
            "\n[[flow]]\nname = \"{}\"\ninput = {{ interface = \"{}\", address = \"{}\", port = {} }}\noutputs = [\n",
            f.name,
            netns::RELAY_IN_IF,
            f.input.ip(),
            f.input.port()
        ));
        for o in f.outputs {
            s.push_str(&format!(
                "  {{ interface = \"{}\", address = \"{}\", port = {} }},\n",
                netns::RELAY_OUT_IF,
                o.ip(),
                o.port()
            ));
        }
        s.push_str("]\n");
    }
    s
}

/// The first (at most 8) CPUs this process may run on, from its affinity
/// mask (empty if unreadable: the daemon then uses all).
fn allowed_cpus() -> Vec<usize> {
    mcrelay_sys::cpu::allowed_cpus()
        .map(|cpus| cpus.into_iter().take(8).collect())
        .unwrap_or_default()
}

/// How long the demo waits for the daemon to answer on its control socket
/// after starting it.
const START_TIMEOUT: Duration = Duration::from_secs(15);
/// How long, after the sender stopped, receivers may take to get the rest.
/// The wait ends as soon as every receiver has all it was sent, so this
/// only bounds a run that lost something; generous, since on a loaded
/// machine the receiver threads may not run for a while.
const DRAIN: Duration = Duration::from_secs(10);
/// How often the main loop looks at the signal flag and the threads.
const POLL: Duration = Duration::from_millis(50);
/// Live view refresh.
const FRAME: Duration = Duration::from_secs(1);

pub fn run(args: &DemoArgs) -> ExitCode {
    match demo(args) {
        Ok(code) => code,
        Err(Refusal(message)) => {
            eprintln!("mcrelayd demo: {message}");
            ExitCode::from(2)
        }
    }
}

/// Why the demo cannot run here (exit status 2).
struct Refusal(String);

fn demo(args: &DemoArgs) -> Result<ExitCode, Refusal> {
    if !(args.duration > 0.0 && args.duration <= 86_400.0) {
        return Err(Refusal(
            "--duration must be above 0 and at most 86400 seconds".into(),
        ));
    }
    if !(1..=1_000_000).contains(&args.rate) {
        return Err(Refusal(
            "--rate must be 1..=1000000 packets per second".into(),
        ));
    }
    let pid = std::process::id();
    let euid = mcrelay_sys::privileges::status_of(pid).map_or(u32::MAX, |s| s.uid[1]);
    if euid != 0 {
        let exe =
            std::env::current_exe().map_or_else(|_| "mcrelayd".into(), |p| p.display().to_string());
        return Err(Refusal(format!(
            "needs root: it creates network namespaces and veth links and starts mcrelayd as root \
             (which drops to user nobody once its sockets are open). Run it with sudo:\n    sudo {exe} demo"
        )));
    }
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        if let Err(e) = signal_hook::flag::register(signal, Arc::clone(&stop)) {
            eprintln!("mcrelayd demo: installing a signal handler: {e}");
            return Ok(ExitCode::from(1));
        }
    }
    for name in netns::remove_leftovers() {
        println!("removed namespace {name}, left by an earlier demo that was killed");
    }
    for path in remove_stale_workdirs() {
        println!(
            "removed {}, left by an earlier demo that was killed",
            path.display()
        );
    }
    let topology = match Topology::build(pid) {
        Ok(t) => t,
        Err(e @ (netns::TopologyError::NoIp(_) | netns::TopologyError::Unavailable { .. })) => {
            return Err(Refusal(e.to_string()));
        }
        Err(e) => {
            eprintln!("mcrelayd demo: building the namespaces: {e}");
            return Ok(ExitCode::from(1));
        }
    };
    let redraw = !args.plain && std::io::stdout().is_terminal();
    let outcome = with_topology(args, &topology, &stop, redraw);
    drop(topology);
    match outcome {
        Ok(summary) => {
            print!("{}", summary.render());
            Ok(if summary.interrupted {
                println!("interrupted; the namespaces, the daemon and its files are gone");
                ExitCode::from(130)
            } else if summary.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Err(e) if stop.load(Ordering::Relaxed) => {
            eprintln!("mcrelayd demo: interrupted ({e:#}); everything it created is removed");
            Ok(ExitCode::from(130))
        }
        Err(e) => {
            eprintln!("mcrelayd demo: {e:#}");
            Ok(ExitCode::from(1))
        }
    }
}

/// A directory of the demo's files, removed on drop.
struct WorkDir(PathBuf);

impl WorkDir {
    fn create(pid: u32) -> Result<Self, DemoError> {
        use std::os::unix::fs::DirBuilderExt;
        let path = std::env::temp_dir().join(format!("mcrelay-demo-{pid}"));
        if path.exists() {
            std::fs::remove_dir_all(&path)
                .ctx(|| format!("removing the stale {}", path.display()))?;
        }
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(&path)
            .ctx(|| format!("creating {}", path.display()))?;
        Ok(WorkDir(path))
    }
}

/// Directories `mcrelay-demo-PID` of demo processes that are gone (killed
/// with SIGKILL), removed; returns their paths.
fn remove_stale_workdirs() -> Vec<PathBuf> {
    let tmp = std::env::temp_dir();
    let Ok(entries) = std::fs::read_dir(&tmp) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("mcrelay-demo-"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists()
            && std::fs::remove_dir_all(entry.path()).is_ok()
        {
            removed.push(entry.path());
        }
    }
    removed
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Everything between building and removing the namespaces.
fn with_topology(
    args: &DemoArgs,
    topology: &Topology,
    stop: &AtomicBool,
    redraw: bool,
) -> Result<Summary, DemoError> {
    let pid = std::process::id();
    let dir = WorkDir::create(pid)?;
    let socket_path = dir.0.join("control.sock");
    let config = config_text(&socket_path, &allowed_cpus());
    println!(
        "mcrelay demo: three throwaway network namespaces, removed at the end (also on Ctrl-C):\n  \
         {:<28} sender     {} {}\n  \
         {:<28} mcrelayd   {} {}  |  {} {}\n  \
         {:<28} receivers  {} {}\n\
         mcrelayd runs this configuration ({}):\n",
        topology.sender,
        netns::SENDER_IF,
        netns::SENDER_ADDR,
        topology.relay,
        netns::RELAY_IN_IF,
        netns::RELAY_IN_ADDR,
        netns::RELAY_OUT_IF,
        netns::RELAY_OUT_ADDR,
        topology.receivers,
        netns::RECEIVER_IF,
        netns::RECEIVER_ADDR,
        dir.0.join("mcrelay.toml").display(),
    );
    for line in config.lines() {
        println!("{}", format!("    {line}").trim_end());
    }
    println!();
    let _ = std::io::stdout().flush();

    let mut daemon = Daemon::start(topology, &dir.0, &config, stop)?;
    // Distinct per run, so nothing stale could pass the receivers' checks.
    let run_id = pid ^ 0x6d63_0000;
    let mut receivers: Vec<(usize, Receiver)> = Vec::new();
    for (i, flow) in FLOWS.iter().enumerate() {
        for &group in flow.outputs {
            receivers.push((
                i,
                Receiver::start(&topology.receivers, SocketAddr::V4(group), run_id)?,
            ));
        }
    }
    // Let the joins settle on the veth before the first datagram.
    std::thread::sleep(Duration::from_millis(100));
    let streams = FLOWS
        .iter()
        .zip(0u32..)
        .map(|(f, id)| Stream {
            dest: SocketAddr::V4(f.input),
            stream_id: id,
            sizes: f.sizes,
        })
        .collect();
    let duration = Duration::try_from_secs_f64(args.duration).map_err(DemoError::Duration)?;
    let cpu_start = cpu_ticks(daemon.pid());
    let started = Instant::now();
    let sender = Sender::start(&topology.sender, streams, run_id, args.rate, duration)?;
    println!(
        "sending {} packets/s into each flow for {} s; the daemon's live view follows \
         (`mcrelayctl --socket {} top` shows it live)\n",
        args.rate,
        args.duration,
        socket_path.display()
    );

    let mut previous: Snapshot = ask(&daemon.socket, Request::Stats)?;
    let mut next_frame = Instant::now() + FRAME;
    let mut sending_ended: Option<Instant> = None;
    let mut interrupted = false;
    loop {
        std::thread::sleep(POLL);
        if stop.load(Ordering::Relaxed) {
            interrupted = true;
            break;
        }
        if let Some(status) = daemon.exited() {
            return Err(DemoError::DaemonExited {
                status,
                when: "relaying",
                log: daemon.log_tail(),
            });
        }
        let now = Instant::now();
        if now >= next_frame {
            let current: Snapshot = ask(&daemon.socket, Request::Stats)?;
            let rates = Rates::between(&previous, &current);
            show_frame(&current, &rates, started.elapsed(), args, redraw);
            previous = current;
            next_frame += FRAME;
        }
        match sending_ended {
            None if sender.done() => sending_ended = Some(now),
            Some(at) => {
                let sent = sender.sent();
                let all_in = receivers.iter().all(|(f, r)| r.valid() >= sent[*f]);
                if all_in || now - at >= DRAIN {
                    break;
                }
            }
            None => {}
        }
    }
    let seconds = started.elapsed().min(duration).as_secs_f64();
    let sent = sender.finish()?;
    // Stopped early, the last datagrams may still be on their way.
    let deadline = Instant::now() + Duration::from_millis(300);
    while Instant::now() < deadline && receivers.iter().any(|(f, r)| r.valid() < sent[*f]) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let last: Option<Snapshot> = ask(&daemon.socket, Request::Stats).ok();
    let cpu_end = cpu_ticks(daemon.pid());
    let mut outputs = Vec::new();
    for (f, receiver) in receivers {
        let group = receiver.group;
        let got = receiver.finish()?;
        let flow = &FLOWS[f];
        let snap = last.as_ref().and_then(|s| s.flow(flow.name));
        // Labelled "group:port", then "@interface" when there is one.
        let label = group.to_string();
        let output = snap.and_then(|s| {
            s.outputs.iter().find(|o| {
                o.label
                    .strip_prefix(&label)
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('@'))
            })
        });
        let stream_id = u32::try_from(f).unwrap_or(u32::MAX);
        let tracker = got.streams.streams.get(&stream_id);
        let other_streams: u64 = got
            .streams
            .streams
            .iter()
            .filter(|(id, _)| **id != stream_id)
            .map(|(_, t)| t.received)
            .sum();
        let s = &got.streams;
        outputs.push(OutputResult {
            flow: flow.name.to_owned(),
            output: label,
            sent: sent[f],
            relay_in: snap.map(|s| s.packets_in),
            relayed: output.map(|o| o.packets_out),
            received: tracker.map_or(0, |t| t.unique()),
            duplicates: tracker.map_or(0, |t| t.duplicates),
            reordered: tracker.map_or(0, |t| t.reordered),
            bad: s.corrupt + s.short + s.wrong_run + s.untracked + other_streams,
        });
    }
    let cpu = cpu_start
        .zip(cpu_end)
        .zip(last.as_ref())
        .map(|((a, b), snap)| Cpu {
            seconds: b.saturating_sub(a) as f64 / sys::clock_ticks_per_second() as f64,
            packets: snap.totals().packets_out,
            daemon_pid: daemon.pid(),
        });
    let status = daemon.stop();
    if !interrupted && status.is_some_and(|s| !s.success()) {
        eprintln!(
            "mcrelayd exited with {} on SIGTERM\n{}",
            status.map_or_else(String::new, |s| s.to_string()),
            daemon.log_tail()
        );
    }
    drop(daemon);
    drop(dir);
    println!();
    Ok(Summary {
        seconds,
        rate: args.rate,
        outputs,
        cpu,
        interrupted,
    })
}

/// One live-view frame: a line about the demo, then exactly what
/// `mcrelayctl top --plain` prints.
fn show_frame(current: &Snapshot, rates: &Rates, elapsed: Duration, args: &DemoArgs, redraw: bool) {
    let mut out = std::io::stdout().lock();
    if redraw {
        // Home the cursor and clear the screen.
        let _ = write!(out, "\x1b[H\x1b[2J");
    }
    let _ = write!(
        out,
        "--- mcrelay demo, {:.0} s of {} s; Ctrl-C stops and cleans up ---\n{}\n",
        elapsed.as_secs_f64(),
        args.duration,
        render_top(current, rates)
    );
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_config_is_valid_and_matches_the_flows() {
        let socket = Path::new("/tmp/mcrelay-demo-1/control.sock");
        let text = config_text(socket, &[4, 5, 6]);
        let config = mcrelay_config::parse(&text, "demo").unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(config.daemon.user, "nobody");
        assert!(text.contains("cores = [4, 5]\n"), "{text}");
        let all = config_text(socket, &[]);
        assert!(!all.contains("cores"), "{all}");
        assert!(mcrelay_config::parse(&all, "demo").is_ok());
        assert_eq!(config.flows.len(), FLOWS.len());
        for f in &FLOWS {
            let c = config.flows.by_name(f.name).expect("flow in the config");
            assert_eq!(c.outputs.len(), f.outputs.len());
        }
        // 1→1 and 1→3, every output group differs from its input.
        assert_eq!(FLOWS.map(|f| f.outputs.len()), [1, 3]);
        for f in &FLOWS {
            assert!(f.outputs.iter().all(|o| o.ip() != f.input.ip()));
        }
    }

    #[test]
    fn cpu_lists() {
        assert!(!allowed_cpus().is_empty());
        assert!(allowed_cpus().len() <= 8);
    }
}
