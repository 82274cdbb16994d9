//! Packet ingress receive methods, measured side by side (issue 6): the
//! worker's io_uring multishot `recvmsg` on a provided-buffer ring
//! ([`uring`]) against a mmapped `TPACKET_V3` ring ([`tpacket`]). Both read
//! the same kind of socket — opened by the product's helper
//! (`mcrelay_sockets::packet::open_packet_ingress`: the flow's BPF filter
//! from `mcrelay_wire::bpf::flow_filter`, locked (`uring` turns `PACKET_AUXDATA` on itself),
//! bound to the interface, group joined) — and parse every frame with
//! `mcrelay_wire::parse`, counting frames and payload bytes. Neither copies
//! the payload onwards: the worker's copy into a pool buffer would cost the
//! same after either.
//!
//! `packet-rx recv` receives until the traffic stops and prints one JSON
//! object (counts, the thread's CPU time, the busy time of its CPU from
//! `/proc/stat`). `packet-rx summarize` turns the runs `run.sh` collected
//! into medians and a Markdown table. See README.md.
#![deny(unsafe_code)]

mod auxdata;
mod os;
mod tpacket;
mod uring;

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand, ValueEnum};
use mcrelay_config::{IngressKind, Input};
use mcrelay_wire::{FlowMatch, Reject};
use serde::Serialize;
use serde_json::{Value, json};

#[derive(Debug, Parser)]
#[command(about = "AF_PACKET ingress: io_uring recvmsg vs TPACKET_V3")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Method {
    /// io_uring multishot recvmsg on a provided-buffer ring (the worker's way)
    Uring,
    /// PACKET_RX_RING with TPACKET_V3 blocks, poll when no block is ready
    TpacketV3,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Receive one flow's frames until the traffic stops; print a JSON object.
    Recv(RecvArgs),
    /// Read the runs (JSON lines) run.sh collected; print a Markdown table and
    /// write the results JSON.
    Summarize {
        /// JSON lines, one per run.
        runs: PathBuf,
        /// Where to write the results JSON.
        #[arg(long)]
        out: PathBuf,
        /// Extra facts about the run (JSON object) to record.
        #[arg(long, default_value = "{}")]
        meta: String,
    },
}

#[derive(Debug, clap::Args)]
struct RecvArgs {
    #[arg(long, value_enum)]
    method: Method,
    /// Interface to receive on.
    #[arg(long)]
    interface: String,
    /// The flow's group (or unicast address).
    #[arg(long, default_value = "239.1.1.1")]
    group: std::net::IpAddr,
    #[arg(long, default_value_t = 5000)]
    port: u16,
    /// The CPU this process is pinned to (taskset): whose busy time
    /// /proc/stat reports.
    #[arg(long)]
    cpu: usize,
    /// `SO_RCVBUF` of the packet socket (the product's default: 4 MiB).
    #[arg(long, default_value_t = 4 << 20)]
    receive_buffer_bytes: u32,
    /// uring: provided buffers of 9344 B (the worker's default with output
    /// queue depth 256: 128).
    #[arg(long, default_value_t = 128)]
    buffers: u16,
    /// uring: completions to wait for per loop turn (the worker: 1).
    #[arg(long, default_value_t = 1)]
    wait_nr: usize,
    /// uring: with --wait-nr > 1, wait at most this long (µs) for that
    /// many before returning with one (`min_wait_usec`, Linux 6.12+); 0:
    /// wait for --wait-nr until the 20 ms turn timeout.
    #[arg(long, default_value_t = 0)]
    min_wait_us: u32,
    /// uring: `IORING_SETUP_DEFER_TASKRUN` instead of the worker's
    /// `COOP_TASKRUN` (a sleeping waiter is woken per batch, not per frame).
    #[arg(long)]
    defer_taskrun: bool,
    /// Name of this configuration in the results (default: the method).
    #[arg(long)]
    label: Option<String>,
    /// tpacket-v3: bytes per block.
    #[arg(long, default_value_t = 1 << 17)]
    block_bytes: u32,
    /// tpacket-v3: blocks in the ring.
    #[arg(long, default_value_t = 32)]
    blocks: u32,
    /// tpacket-v3: block retire timeout in ms (`tp_retire_blk_tov`).
    #[arg(long, default_value_t = 1)]
    retire_ms: u32,
    /// Created once the socket is open and the receiver waits for frames.
    #[arg(long)]
    ready_file: Option<PathBuf>,
    /// Stop this long after the last frame.
    #[arg(long, default_value_t = 500)]
    idle_ms: u64,
    /// Give up after this long in all.
    #[arg(long, default_value_t = 120)]
    max_seconds: u64,
}

/// What the receiver saw.
#[derive(Debug, Default, Serialize)]
pub struct Counts {
    /// Frames that parsed as the flow's datagrams.
    frames: u64,
    /// Their UDP payload bytes.
    payload_bytes: u64,
    /// Frames whose UDP checksum was checked in software (the kernel
    /// said neither "not filled in yet" nor "verified").
    software_checksums: u64,
    /// Frames rejected, by reason.
    rejects: BTreeMap<&'static str, u64>,
    #[serde(skip)]
    rejected: u64,
}

impl Counts {
    /// Parse one frame for `flow` and count it.
    pub fn frame(&mut self, frame: &[u8], flow: &FlowMatch, verify: bool) {
        if verify {
            self.software_checksums += 1;
        }
        match mcrelay_wire::parse(frame, flow, verify) {
            Ok(d) => {
                self.frames += 1;
                self.payload_bytes += d.payload.len() as u64;
            }
            Err(r) => self.reject(r),
        }
    }

    pub fn reject(&mut self, reason: Reject) {
        self.rejected += 1;
        *self.rejects.entry(reason.as_str()).or_default() += 1;
    }

    /// Frames handled, parsed or not.
    pub fn seen(&self) -> u64 {
        self.frames + self.rejected
    }
}

/// CPU time at one instant: the thread's own and its CPU's (/proc/stat).
#[derive(Debug, Clone, Copy)]
struct Snapshot {
    thread_user_ns: u64,
    thread_sys_ns: u64,
    /// user, nice, system, idle, iowait, irq, softirq, steal (ticks).
    cpu: [u64; 8],
    at: Instant,
}

fn proc_stat_cpu(cpu: usize) -> anyhow::Result<[u64; 8]> {
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let name = format!("cpu{cpu}");
    let line = stat
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name.as_str()))
        .with_context(|| format!("/proc/stat has no {name}"))?;
    let mut out = [0u64; 8];
    for (slot, field) in out.iter_mut().zip(line.split_whitespace().skip(1)) {
        *slot = field.parse().context("a /proc/stat field")?;
    }
    Ok(out)
}

impl Snapshot {
    fn take(cpu: usize) -> anyhow::Result<Self> {
        let (thread_user_ns, thread_sys_ns) = os::thread_cpu_ns()?;
        Ok(Self {
            thread_user_ns,
            thread_sys_ns,
            cpu: proc_stat_cpu(cpu)?,
            at: Instant::now(),
        })
    }
}

/// Nanoseconds per /proc/stat tick (USER_HZ is 100 on Linux).
const TICK_NS: u64 = 10_000_000;

enum Receiver {
    Uring(Box<uring::UringReceiver>),
    Tpacket(tpacket::TpacketReceiver),
}

fn recv(args: &RecvArgs) -> anyhow::Result<()> {
    let pinned = std::fs::read_to_string("/proc/self/status")?
        .lines()
        .find_map(|l| {
            l.strip_prefix("Cpus_allowed_list:")
                .map(str::trim)
                .map(str::to_owned)
        })
        .unwrap_or_default();
    if pinned != args.cpu.to_string() {
        bail!(
            "pin the receiver to CPU {} (taskset -c {}); it may run on {pinned}",
            args.cpu,
            args.cpu
        );
    }
    let input = Input {
        interface: args.interface.clone(),
        address: args.group,
        port: args.port,
        source: None,
        ingress: IngressKind::Packet,
        receive_buffer_bytes: args.receive_buffer_bytes,
        fec: None,
        rist: None,
    };
    let flow = mcrelay_sockets::packet::flow_match(&input);
    let ifindex = mcrelay_sockets::interface_index(&args.interface)?;
    let ingress = mcrelay_sockets::packet::open_packet_ingress(&input, ifindex)
        .context("opening the packet socket (needs CAP_NET_RAW)")?;
    let socket = ingress.socket.as_fd();
    let mut receiver = match args.method {
        Method::Uring => Receiver::Uring(Box::new(
            uring::UringReceiver::new(
                socket,
                args.buffers,
                args.wait_nr,
                args.min_wait_us,
                args.defer_taskrun,
            )
            .context("io_uring setup")?,
        )),
        Method::TpacketV3 => Receiver::Tpacket(
            tpacket::TpacketReceiver::new(
                socket,
                tpacket::Geometry {
                    block_bytes: args.block_bytes,
                    blocks: args.blocks,
                    retire_ms: args.retire_ms,
                },
            )
            .context("TPACKET_V3 ring setup")?,
        ),
    };
    // Forget whatever the socket counted before the ring existed.
    os::packet_stats(socket)?;

    let mut counts = Counts::default();
    let started = Instant::now();
    let start = Snapshot::take(args.cpu)?;
    if let Some(path) = &args.ready_file {
        std::fs::write(path, b"ready\n").context("writing the ready file")?;
    }
    let idle = Duration::from_millis(args.idle_ms);
    let turn_timeout = Duration::from_millis(20);
    let mut first: Option<Instant> = None;
    let mut last: Option<Instant> = None;
    let mut end: Option<Snapshot> = None;
    loop {
        let n = match &mut receiver {
            Receiver::Uring(r) => r.turn(turn_timeout, &flow, &mut counts)?,
            Receiver::Tpacket(r) => r.turn(turn_timeout, &flow, &mut counts)?,
        };
        let now = Instant::now();
        if n > 0 {
            first.get_or_insert(now);
            last = Some(now);
            end = None;
        } else if let Some(at) = last {
            // The first quiet turn after traffic ends the measured span.
            if end.is_none() {
                end = Some(Snapshot::take(args.cpu)?);
            }
            if now - at >= idle {
                break;
            }
        }
        if now - started > Duration::from_secs(args.max_seconds) {
            break;
        }
    }
    let end = match end {
        Some(e) => e,
        None => Snapshot::take(args.cpu)?,
    };
    let stats = os::packet_stats(socket)?;
    let d = |i: usize| end.cpu[i].saturating_sub(start.cpu[i]) * TICK_NS;
    let method_detail = match &receiver {
        Receiver::Uring(r) => json!({
            "waits": r.waits,
            "completions": r.completions,
            "rearms_enobufs": r.rearms,
            "buffers": args.buffers,
            "wait_nr": args.wait_nr,
            "min_wait_us": args.min_wait_us,
            "defer_taskrun": args.defer_taskrun,
            "buffer_bytes": uring::BUFFER_BYTES,
        }),
        Receiver::Tpacket(r) => json!({
            "waits": r.waits,
            "blocks": r.blocks,
            "timed_out_blocks": r.timed_out_blocks,
            "geometry": r.geometry(),
        }),
    };
    let span = match (first, last) {
        (Some(f), Some(l)) => (l - f).as_secs_f64(),
        _ => 0.0,
    };
    let variant = match (&args.label, args.method) {
        (Some(l), _) => l.clone(),
        (None, Method::Uring) => "uring".to_owned(),
        (None, Method::TpacketV3) => "tpacket-v3".to_owned(),
    };
    let out = json!({
        "method": args.method,
        "variant": variant,
        "counts": counts,
        "first_to_last_s": span,
        "thread_user_ns": end.thread_user_ns - start.thread_user_ns,
        "thread_sys_ns": end.thread_sys_ns - start.thread_sys_ns,
        "cpu": args.cpu,
        // Wall time minus idle and iowait: with NO_HZ idle, /proc/stat's
        // idle and iowait come from the nohz idle clock (exact to the
        // tick unit), while user/system/softirq are tick samples, which
        // miss short bursts (a CPU woken per frame at 50 kpps can show
        // no busy ticks at all).
        "cpu_busy_ns": u64::try_from((end.at - start.at).as_nanos()).unwrap_or(u64::MAX)
            .saturating_sub(d(3) + d(4)),
        "span_ns": u64::try_from((end.at - start.at).as_nanos()).unwrap_or(u64::MAX),
        // Tick-sampled, for reference: user+system+irq+softirq (without
        // nice: other users' builds here run niced), nice alone.
        "cpu_ticks_busy_ns": d(0) + d(2) + d(5) + d(6),
        "cpu_nice_ns": d(1),
        "cpu_softirq_ns": d(6),
        "cpu_steal_ns": d(7),
        "packet_statistics": stats,
        "receive_buffer_bytes": ingress.receive_buffer_bytes,
        "detail": method_detail,
    });
    println!("{out}");
    drop(receiver);
    Ok(())
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn num(v: &Value, path: &[&str]) -> f64 {
    let mut at = v;
    for p in path {
        at = &at[*p];
    }
    at.as_f64().unwrap_or(f64::NAN)
}

/// Per run: the derived figures the table shows.
fn derive(run: &Value) -> Value {
    let sent = num(run, &["sender", "sent"]);
    let frames = num(run, &["receiver", "counts", "frames"]);
    let busy = num(run, &["receiver", "cpu_busy_ns"]);
    let thread =
        num(run, &["receiver", "thread_user_ns"]) + num(run, &["receiver", "thread_sys_ns"]);
    json!({
        "loss_pct": (sent - frames) / sent * 100.0,
        "cpu_busy_ns_per_frame": busy / frames,
        "thread_ns_per_frame": thread / frames,
        "softirq_ns_per_frame": num(run, &["receiver", "cpu_softirq_ns"]) / frames,
        "niced_ns_per_frame": num(run, &["receiver", "cpu_nice_ns"]) / frames,
        "sender_kpps": num(run, &["sender", "pps"]) / 1000.0,
        "received_kpps": frames / num(run, &["receiver", "first_to_last_s"]) / 1000.0,
    })
}

const FIGURES: [&str; 7] = [
    "loss_pct",
    "cpu_busy_ns_per_frame",
    "thread_ns_per_frame",
    "softirq_ns_per_frame",
    "niced_ns_per_frame",
    "sender_kpps",
    "received_kpps",
];

fn summarize(runs: &PathBuf, out: &PathBuf, meta: &str) -> anyhow::Result<()> {
    let file = std::fs::File::open(runs).with_context(|| format!("opening {}", runs.display()))?;
    let mut all = Vec::new();
    for line in std::io::BufReader::new(file).lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let mut run: Value = serde_json::from_str(&line).context("a run line")?;
        run["derived"] = derive(&run);
        all.push(run);
    }
    // (size, rate, method) -> runs, in first-seen order.
    let mut keys: Vec<(u64, u64, String)> = Vec::new();
    for run in &all {
        let key = (
            run["size"].as_u64().unwrap_or(0),
            run["rate"].as_u64().unwrap_or(0),
            run["receiver"]["variant"]
                .as_str()
                .unwrap_or("?")
                .to_owned(),
        );
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    let mut summary = Vec::new();
    let mut table = String::from(
        "| payload | sender rate | method | sent kpps | received kpps | loss % | CPU1-busy ns/frame | thread ns/frame | CPU1 softirq ns/frame | others' niced ns/frame | runs |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (size, rate, method) in &keys {
        let group: Vec<&Value> = all
            .iter()
            .filter(|r| {
                r["size"].as_u64() == Some(*size)
                    && r["rate"].as_u64() == Some(*rate)
                    && r["receiver"]["variant"].as_str() == Some(method)
            })
            .collect();
        let mut figures = serde_json::Map::new();
        let mut cell = BTreeMap::new();
        for f in FIGURES {
            let v: Vec<f64> = group.iter().map(|r| num(r, &["derived", f])).collect();
            let min = v.iter().copied().fold(f64::INFINITY, f64::min);
            let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let med = median(v).unwrap_or(f64::NAN);
            figures.insert(f.to_owned(), json!({"median": med, "min": min, "max": max}));
            cell.insert(f, (med, min, max));
        }
        let rate_text = if *rate == 0 {
            "unpaced".to_owned()
        } else {
            format!("{} kpps", rate / 1000)
        };
        let fmt0 = |f: &str| {
            let (m, lo, hi) = cell[f];
            format!("{m:.0} ({lo:.0}–{hi:.0})")
        };
        let (loss, loss_lo, loss_hi) = cell["loss_pct"];
        table.push_str(&format!(
            "| {size} B | {rate_text} | `{method}` | {:.0} | {:.0} | {loss:.2} ({loss_lo:.2}–{loss_hi:.2}) | {} | {} | {} | {} | {} |\n",
            cell["sender_kpps"].0,
            cell["received_kpps"].0,
            fmt0("cpu_busy_ns_per_frame"),
            fmt0("thread_ns_per_frame"),
            fmt0("softirq_ns_per_frame"),
            fmt0("niced_ns_per_frame"),
            group.len(),
        ));
        summary.push(json!({
            "size": size, "rate": rate, "method": method, "runs": group.len(), "figures": figures,
        }));
    }
    let meta: Value = serde_json::from_str(meta).context("--meta is not JSON")?;
    let doc = json!({ "meta": meta, "summary": summary, "runs": all });
    let mut f =
        std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    serde_json::to_writer_pretty(&mut f, &doc)?;
    f.write_all(b"\n")?;
    print!("{table}");
    Ok(())
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Recv(args) => recv(&args),
        Command::Summarize { runs, out, meta } => summarize(&runs, &out, &meta),
    }
}
