//! Multicast egress methods, measured side by side (issue 19's egress
//! lever): the product's connected UDP socket, one io_uring `Send` per
//! datagram, against an AF_PACKET socket bound to the interface, one
//! io_uring `SendMsg` per datagram with the iovec [prebuilt Ethernet, IPv4
//! and UDP headers; payload], with and without `PACKET_QDISC_BYPASS`; and,
//! for reference, the same sockets fed by `sendmmsg(2)` batches, and the
//! worker's other UDP send: a batch as one UDP GSO `SendMsg`, and its
//! AF_PACKET twin: a batch as one frame with a `virtio_net_hdr` asking
//! for UDP segmentation (`PACKET_VNET_HDR`).
//!
//! `packet-tx send` sends loadgen's numbered, patterned datagrams (so
//! `loadgen recv` checks every byte at the receiver) for a while, at a
//! paced rate or unpaced, and prints one JSON object: what the sends
//! returned, the thread's CPU time and the busy time of its CPU. `packet-tx
//! summarize` turns the runs `run.sh` collected into medians and a
//! Markdown table. See README.md.
#![deny(unsafe_code)]

mod frame;
mod os;
mod send;

use std::collections::BTreeMap;
use std::io::BufRead;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand, ValueEnum};
use serde_json::{Value, json};

use crate::frame::{Endpoints, Template};
use crate::send::{Egress, Outcome, Sender, Submit};

#[derive(Debug, Parser)]
#[command(about = "Multicast egress: UDP socket vs AF_PACKET with prebuilt headers")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Method {
    /// The product's output socket: connected UDP, multicast loop off.
    Udp,
    /// AF_PACKET SOCK_RAW bound to the interface, prebuilt headers.
    Packet,
    /// `packet` with PACKET_QDISC_BYPASS.
    PacketBypass,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum SubmitArg {
    /// One io_uring SQE per datagram, a batch per submit (the worker's way).
    Uring,
    /// One sendmmsg(2) per batch.
    Sendmmsg,
    /// The batch as one GSO SendMsg through io_uring: udp with
    /// UDP_SEGMENT; packet(-bypass) with PACKET_VNET_HDR, one frame with a
    /// virtio_net_hdr asking for UDP segmentation.
    Gso,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Send datagrams for a while; print a JSON object.
    Send(SendArgs),
    /// Read the runs (JSON lines) run.sh collected; print a Markdown table
    /// and write the results JSON.
    Summarize {
        runs: PathBuf,
        #[arg(long)]
        out: PathBuf,
        /// Extra facts about the run (JSON object) to record.
        #[arg(long, default_value = "{}")]
        meta: String,
    },
}

#[derive(Debug, clap::Args)]
struct SendArgs {
    #[arg(long, value_enum)]
    method: Method,
    #[arg(long, value_enum, default_value_t = SubmitArg::Uring)]
    submit: SubmitArg,
    /// Interface to send on.
    #[arg(long)]
    interface: String,
    /// Its IPv4 address: the datagrams' source.
    #[arg(long)]
    source: Ipv4Addr,
    /// UDP source port of the prebuilt header.
    #[arg(long, default_value_t = 40000)]
    source_port: u16,
    /// IPv4 multicast group and port.
    #[arg(long, default_value = "239.1.1.1:5000")]
    dest: SocketAddr,
    #[arg(long, default_value_t = 1)]
    ttl: u8,
    /// UDP payload bytes.
    #[arg(long, default_value_t = 1316)]
    size: usize,
    /// Datagrams per second; 0 = unpaced.
    #[arg(long, default_value_t = 50_000)]
    rate: u64,
    /// Seconds to send for.
    #[arg(long, default_value_t = 3.0)]
    duration: f64,
    /// Datagrams per submit (io_uring) or per sendmmsg.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// loadgen's run id in every payload.
    #[arg(long, default_value_t = 1)]
    run_id: u32,
    /// The CPU this process is pinned to (taskset): whose busy time
    /// /proc/stat reports.
    #[arg(long)]
    cpu: usize,
    /// `SO_SNDBUF` of either socket (the product's egress default).
    #[arg(long, default_value_t = i32::try_from(mcrelay_sockets::EGRESS_SEND_BUFFER_BYTES).unwrap_or(i32::MAX))]
    send_buffer: i32,
    /// Name of this configuration in the results.
    #[arg(long)]
    label: Option<String>,
}

/// Nanoseconds per /proc/stat tick (USER_HZ is 100 on Linux).
const TICK_NS: u64 = 10_000_000;

/// user, nice, system, idle, iowait, irq, softirq, steal (ticks) of `cpu`.
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

#[derive(Debug, Clone, Copy)]
struct Snapshot {
    thread_user_ns: u64,
    thread_sys_ns: u64,
    cpu: [u64; 8],
    at: Instant,
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

fn interface_mac(name: &str) -> anyhow::Result<[u8; 6]> {
    let path = format!("/sys/class/net/{name}/address");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let mut mac = [0u8; 6];
    let mut parts = text.trim().split(':');
    for byte in &mut mac {
        let part = parts.next().with_context(|| format!("{path}: short MAC"))?;
        *byte = u8::from_str_radix(part, 16).with_context(|| format!("{path}: {part}"))?;
    }
    Ok(mac)
}

fn open(args: &SendArgs) -> anyhow::Result<Egress> {
    let IpAddr::V4(group) = args.dest.ip() else {
        bail!("--dest must be an IPv4 group");
    };
    let ifindex = mcrelay_sockets::interface_index(&args.interface)
        .with_context(|| format!("interface {}", args.interface))?;
    Ok(match args.method {
        Method::Udp => {
            let output = mcrelay_config::Output {
                egress: Default::default(),
                interface: args.interface.clone(),
                address: args.dest.ip(),
                port: args.dest.port(),
                ttl: args.ttl,
                source_address: Some(IpAddr::V4(args.source)),
                queue_depth: 256,
                fec: None,
                rist: None,
                srt: None,
            };
            Egress::Udp(
                mcrelay_sockets::open_egress(&output, ifindex)
                    .context("opening the UDP output socket")?,
            )
        }
        Method::Packet | Method::PacketBypass => Egress::Packet {
            fd: os::open_packet_egress(
                ifindex,
                args.send_buffer,
                args.method == Method::PacketBypass,
                args.submit == SubmitArg::Gso,
            )
            .context("opening the AF_PACKET socket (needs CAP_NET_RAW)")?,
            template: Template::new(&Endpoints {
                source_mac: interface_mac(&args.interface)?,
                source: args.source,
                source_port: args.source_port,
                destination: group,
                destination_mac: mcrelay_wire::egress::multicast_mac(group),
                port: args.dest.port(),
                ttl: args.ttl,
            }),
        },
    })
}

fn send(args: &SendArgs) -> anyhow::Result<()> {
    let pinned = std::fs::read_to_string("/proc/self/status")?
        .lines()
        .find_map(|l| {
            l.strip_prefix("Cpus_allowed_list:")
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_default();
    if pinned != args.cpu.to_string() {
        bail!(
            "pin the sender to CPU {} (taskset -c {}); it may run on {pinned}",
            args.cpu,
            args.cpu
        );
    }
    let submit = match args.submit {
        SubmitArg::Uring => Submit::Uring,
        SubmitArg::Sendmmsg => Submit::Sendmmsg,
        SubmitArg::Gso => Submit::UringGso,
    };
    let mut sender = Sender::new(open(args)?, submit, args.size, args.batch, args.run_id)
        .context("setting up the sender")?;
    let batch = args.batch.max(1);
    let duration = Duration::from_secs_f64(args.duration);
    let mut out = Outcome::default();
    let start = Snapshot::take(args.cpu)?;
    let mut next: u64 = 0;
    loop {
        let now = Instant::now();
        let elapsed = now - start.at;
        if elapsed >= duration {
            break;
        }
        if args.rate > 0 {
            // Datagram k is due at k / rate; sleep (never spin: spinning
            // would be charged as sending) until this batch's first is.
            let due = Duration::from_secs_f64(next as f64 / args.rate as f64);
            if due > elapsed {
                std::thread::sleep(due - elapsed);
            }
        }
        sender.send_batch(next, batch, &mut out)?;
        next += batch as u64;
    }
    let end = Snapshot::take(args.cpu)?;
    let d = |i: usize| end.cpu[i].saturating_sub(start.cpu[i]) * TICK_NS;
    let span_ns = u64::try_from((end.at - start.at).as_nanos()).unwrap_or(u64::MAX);
    let method = match args.method {
        Method::Udp => "udp",
        Method::Packet => "packet",
        Method::PacketBypass => "packet-bypass",
    };
    let submit = match args.submit {
        SubmitArg::Uring => "",
        SubmitArg::Sendmmsg => "-sendmmsg",
        SubmitArg::Gso => "-gso",
    };
    let errors: BTreeMap<String, u64> = out
        .errors
        .iter()
        .map(|(errno, n)| (std::io::Error::from_raw_os_error(*errno).to_string(), *n))
        .collect();
    let o = json!({
        "variant": args.label.clone().unwrap_or_else(|| format!("{method}{submit}")),
        "attempted": next,
        "sent": out.sent,
        "short": out.short,
        "errors": errors,
        "batch": batch,
        "size": args.size,
        "rate": args.rate,
        "span_ns": span_ns,
        "pps": out.sent as f64 / (span_ns as f64 / 1e9),
        "thread_user_ns": end.thread_user_ns - start.thread_user_ns,
        "thread_sys_ns": end.thread_sys_ns - start.thread_sys_ns,
        "cpu": args.cpu,
        // Wall time minus idle and iowait (exact with NO_HZ idle; the
        // user/system/softirq columns are tick samples): everything the
        // CPU did, the sender's softirq work (veth transmit, the RPS
        // hand-off) included, and anything else that ran there.
        "cpu_busy_ns": span_ns.saturating_sub(d(3) + d(4)),
        "cpu_nice_ns": d(1),
        "cpu_softirq_ns": d(6),
        "cpu_steal_ns": d(7),
    });
    println!("{o}");
    Ok(())
}

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let m = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    (m, v[0], v[n - 1])
}

fn num(v: &Value, path: &[&str]) -> f64 {
    let mut at = v;
    for p in path {
        at = &at[*p];
    }
    at.as_f64().unwrap_or(f64::NAN)
}

/// The figures of one run.
fn derive(run: &Value) -> Value {
    let sent = num(run, &["sender", "sent"]);
    let unique = num(run, &["receiver", "unique"]);
    let thread = num(run, &["sender", "thread_user_ns"]) + num(run, &["sender", "thread_sys_ns"]);
    json!({
        "busy_ns_per_pkt": num(run, &["sender", "cpu_busy_ns"]) / sent,
        "thread_ns_per_pkt": thread / sent,
        "sys_share_pct": num(run, &["sender", "thread_sys_ns"]) / thread * 100.0,
        "niced_ns_per_pkt": num(run, &["sender", "cpu_nice_ns"]) / sent,
        "sent_kpps": num(run, &["sender", "pps"]) / 1000.0,
        "loss_pct": (sent - unique) / sent * 100.0,
        "corrupt": num(run, &["receiver", "corrupt"]) + num(run, &["receiver", "truncated"]),
    })
}

const FIGURES: [&str; 6] = [
    "busy_ns_per_pkt",
    "busy_vs_udp",
    "thread_ns_per_pkt",
    "thread_vs_udp",
    "sent_kpps",
    "loss_pct",
];

fn summarize(runs: &PathBuf, out: &PathBuf, meta: &str) -> anyhow::Result<()> {
    let file = std::fs::File::open(runs).with_context(|| format!("opening {}", runs.display()))?;
    let mut all = Vec::new();
    for line in std::io::BufReader::new(file).lines() {
        let line = line?;
        if !line.trim().is_empty() {
            let mut run: Value = serde_json::from_str(&line).context("a run line")?;
            run["derived"] = derive(&run);
            all.push(run);
        }
    }
    let key = |r: &Value| {
        (
            r["size"].as_u64().unwrap_or(0),
            r["rate"].as_u64().unwrap_or(0),
            r["sender"]["variant"].as_str().unwrap_or("?").to_owned(),
        )
    };
    // Ratios to the `udp` run of the same repetition, size and rate.
    let baseline: BTreeMap<(u64, u64, u64), (f64, f64)> = all
        .iter()
        .filter(|r| r["sender"]["variant"] == "udp")
        .map(|r| {
            (
                (
                    r["rep"].as_u64().unwrap_or(0),
                    r["size"].as_u64().unwrap_or(0),
                    r["rate"].as_u64().unwrap_or(0),
                ),
                (
                    num(r, &["derived", "busy_ns_per_pkt"]),
                    num(r, &["derived", "thread_ns_per_pkt"]),
                ),
            )
        })
        .collect();
    for r in &mut all {
        let k = (
            r["rep"].as_u64().unwrap_or(0),
            r["size"].as_u64().unwrap_or(0),
            r["rate"].as_u64().unwrap_or(0),
        );
        let (busy, thread) = baseline.get(&k).copied().unwrap_or((f64::NAN, f64::NAN));
        r["derived"]["busy_vs_udp"] = json!(num(r, &["derived", "busy_ns_per_pkt"]) / busy);
        r["derived"]["thread_vs_udp"] = json!(num(r, &["derived", "thread_ns_per_pkt"]) / thread);
    }
    let mut keys: Vec<(u64, u64, String)> = Vec::new();
    for r in &all {
        let k = key(r);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    println!(
        "| size B | rate | variant | CPU0-busy ns/pkt | ÷ udp | thread ns/pkt | ÷ udp | sent kpps | loss % | corrupt |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut medians = Vec::new();
    for k in &keys {
        let runs: Vec<&Value> = all.iter().filter(|r| key(r) == *k).collect();
        let mut m = serde_json::Map::new();
        let mut cells = Vec::new();
        for f in FIGURES {
            let (med, lo, hi) = median(runs.iter().map(|r| num(r, &["derived", f])).collect());
            m.insert(f.to_owned(), json!({"median": med, "min": lo, "max": hi}));
            cells.push(if f.ends_with("vs_udp") || f == "loss_pct" {
                format!("{med:.2} ({lo:.2}–{hi:.2})")
            } else {
                format!("{med:.0} ({lo:.0}–{hi:.0})")
            });
        }
        let corrupt: f64 = runs.iter().map(|r| num(r, &["derived", "corrupt"])).sum();
        let rate = if k.1 == 0 {
            "unpaced".to_owned()
        } else {
            format!("{} k", k.1 / 1000)
        };
        println!(
            "| {} | {rate} | {} | {} | {} | {} | {} | {} | {} | {corrupt} |",
            k.0, k.2, cells[0], cells[1], cells[2], cells[3], cells[4], cells[5]
        );
        medians.push(
            json!({"size": k.0, "rate": k.1, "variant": k.2, "runs": runs.len(), "figures": m}),
        );
    }
    let meta: Value = serde_json::from_str(meta).context("--meta")?;
    let doc = json!({"meta": meta, "medians": medians, "runs": all});
    std::fs::write(out, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Send(a) => send(&a),
        Command::Summarize { runs, out, meta } => summarize(&runs, &out, &meta),
    }
}
