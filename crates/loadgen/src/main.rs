//! `loadgen`: the paced sender, validating receiver and baseline relay used
//! by mcrelay's namespace tests and end-to-end benchmark.
//!
//! ```text
//! loadgen send --dest 239.1.1.1:5000 --interface vA --rate 100000 --count 500000 --size 1316
//! loadgen recv --group 239.2.2.2:6000 --interface vB --expect 500000 --json
//! loadgen relay --input 239.1.1.1:5000 --input-interface vRA --output 239.2.2.2:6000 --output-interface vRB
//! ```

use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use mcrelay_loadgen::net::{self, MAX_BATCH, RECV_BUF, Received};
use mcrelay_loadgen::payload::{self, PayloadError};
use mcrelay_loadgen::tracker::Tracker;

#[derive(Debug, Parser)]
#[command(
    name = "loadgen",
    about = "mcrelay test traffic: paced sender, validating receiver, baseline relay"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Send numbered, patterned datagrams at a paced rate.
    Send {
        #[arg(long)]
        dest: SocketAddr,
        /// Outgoing interface for multicast.
        #[arg(long)]
        interface: Option<String>,
        /// Source address to send from.
        #[arg(long)]
        bind: Option<IpAddr>,
        /// Datagrams per second; 0 = as fast as possible.
        #[arg(long, default_value_t = 10_000)]
        rate: u64,
        #[arg(long, default_value_t = 10_000)]
        count: u64,
        /// Payload size, or a comma-separated list cycled through.
        #[arg(long, value_delimiter = ',', default_value = "1316")]
        size: Vec<usize>,
        #[arg(long, default_value_t = 16)]
        ttl: u32,
        #[arg(long, default_value_t = 1)]
        run_id: u32,
        #[arg(long, default_value_t = 0)]
        stream_id: u32,
        /// Datagrams per sendmmsg.
        #[arg(long, default_value_t = 32)]
        batch: usize,
        /// Loop multicast back to this host (for loopback tests).
        #[arg(long)]
        r#loop: bool,
        #[arg(long)]
        json: bool,
    },
    /// Receive, check every byte, count loss, duplicates and reordering.
    Recv {
        /// Group (joined) or unicast address (bound) and port.
        #[arg(long)]
        group: SocketAddr,
        #[arg(long, default_value = "lo")]
        interface: String,
        /// Source-specific join.
        #[arg(long)]
        source: Option<IpAddr>,
        #[arg(long, default_value_t = 1)]
        run_id: u32,
        /// Stop after this many datagrams.
        #[arg(long)]
        expect: Option<u64>,
        /// Stop after this long in total.
        #[arg(long, default_value_t = 30.0)]
        duration: f64,
        /// Stop after this long without a datagram (once one arrived).
        #[arg(long, default_value_t = 1.0)]
        idle_exit: f64,
        /// Created once the socket has joined, to tell a harness to start.
        #[arg(long)]
        ready_file: Option<std::path::PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// The baseline relay: blocking recvmmsg, then one sendmmsg per output.
    Relay {
        #[arg(long)]
        input: SocketAddr,
        #[arg(long)]
        input_interface: String,
        #[arg(long, required = true)]
        output: Vec<SocketAddr>,
        #[arg(long)]
        output_interface: String,
        #[arg(long, default_value_t = 16)]
        ttl: u32,
        #[arg(long, default_value_t = 64)]
        batch: usize,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Send {
            dest,
            interface,
            bind,
            rate,
            count,
            size,
            ttl,
            run_id,
            stream_id,
            batch,
            r#loop,
            json,
        } => {
            let ifindex = interface.as_deref().map(net::interface_index).transpose()?;
            let socket = net::sender(dest, ifindex, bind, ttl, r#loop)
                .with_context(|| format!("sender to {dest}"))?;
            send(&socket, rate, count, &size, run_id, stream_id, batch, json)
        }
        Command::Recv {
            group,
            interface,
            source,
            run_id,
            expect,
            duration,
            idle_exit,
            ready_file,
            json,
        } => {
            let socket = net::receiver(group, net::interface_index(&interface)?, source)
                .with_context(|| format!("joining {group} on {interface}"))?;
            if let Some(path) = ready_file {
                std::fs::write(&path, b"")
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            recv(&socket, run_id, expect, duration, idle_exit, json)
        }
        Command::Relay {
            input,
            input_interface,
            output,
            output_interface,
            ttl,
            batch,
        } => relay(
            input,
            &input_interface,
            &output,
            &output_interface,
            ttl,
            batch,
        ),
    }
}

#[allow(clippy::too_many_arguments)]
fn send(
    s: &UdpSocket,
    rate: u64,
    count: u64,
    sizes: &[usize],
    run: u32,
    stream: u32,
    batch: usize,
    json: bool,
) -> anyhow::Result<()> {
    if sizes.is_empty() || sizes.iter().any(|&n| n == 0 || n > 65_507) {
        bail!("--size must be 1..=65507 bytes");
    }
    let batch = batch.clamp(1, MAX_BATCH);
    let mut bufs: Vec<Vec<u8>> = vec![Vec::with_capacity(65_507); batch];
    let start = Instant::now();
    let (mut sent, mut errors) = (0u64, 0u64);
    while sent < count {
        let n = usize::try_from((count - sent).min(batch as u64)).unwrap_or(batch);
        for (i, b) in bufs.iter_mut().take(n).enumerate() {
            let seq = sent + i as u64;
            let len = sizes[usize::try_from(seq % sizes.len() as u64).unwrap_or(0)];
            b.resize(len, 0);
            payload::write(b, run, stream, seq);
        }
        if rate > 0 {
            // Token bucket on the monotonic clock: sleep when well ahead,
            // spin the last stretch.
            let due = Duration::from_secs_f64(sent as f64 / rate as f64);
            loop {
                let now = start.elapsed();
                if now >= due {
                    break;
                }
                if due - now > Duration::from_micros(200) {
                    std::thread::sleep(due - now - Duration::from_micros(100));
                } else {
                    std::hint::spin_loop();
                }
            }
        }
        let slices: Vec<&[u8]> = bufs.iter().take(n).map(Vec::as_slice).collect();
        match net::send_batch(s, &slices) {
            Ok(k) => sent += k as u64,
            Err(e)
                if matches!(e.kind(), ErrorKind::WouldBlock)
                    || e.raw_os_error() == Some(libc::ENOBUFS) =>
            {
                errors += 1;
                std::thread::sleep(Duration::from_micros(50));
            }
            // An ICMP error from an earlier datagram (unicast, nobody
            // listening): keep sending.
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => errors += 1,
            Err(e) => return Err(e).context("sendmmsg"),
        }
    }
    let secs = start.elapsed().as_secs_f64();
    if json {
        println!(
            "{{\"sent\":{sent},\"seconds\":{secs:.6},\"pps\":{:.1},\"send_errors\":{errors}}}",
            sent as f64 / secs
        );
    } else {
        println!(
            "sent {sent} datagrams in {secs:.3} s ({:.0} pps), {errors} send errors",
            sent as f64 / secs
        );
    }
    Ok(())
}

fn recv(
    s: &UdpSocket,
    run: u32,
    expect: Option<u64>,
    duration: f64,
    idle: f64,
    json: bool,
) -> anyhow::Result<()> {
    s.set_read_timeout(Some(Duration::from_millis(100)))?;
    let mut bufs = vec![[0u8; RECV_BUF]; MAX_BATCH];
    let mut got = [Received::default(); MAX_BATCH];
    let mut t = Tracker::new(expect.unwrap_or(50_000_000).min(200_000_000));
    let mut last_ttl = None;
    let start = Instant::now();
    let mut last = None::<Instant>;
    loop {
        if expect.is_some_and(|e| t.received >= e)
            || start.elapsed().as_secs_f64() >= duration
            || last.is_some_and(|l| l.elapsed().as_secs_f64() >= idle)
        {
            break;
        }
        let n = match net::recv_batch(s, &mut bufs, &mut got) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) =>
            {
                continue;
            }
            Err(e) => return Err(e).context("recvmmsg"),
        };
        last = Some(Instant::now());
        for (buf, r) in bufs.iter().zip(&got).take(n) {
            let data = &buf[..r.len.min(RECV_BUF)];
            last_ttl = r.ttl.or(last_ttl);
            match payload::check(data, run) {
                Ok(h) => t.on_valid(h.sequence, data.len()),
                Err(PayloadError::Short) => t.on_invalid(data.len(), true),
                Err(_) => t.on_invalid(data.len(), false),
            }
        }
    }
    let lost = expect.map_or(0, |e| e.saturating_sub(t.unique()));
    let ttl = last_ttl.map_or("null".to_owned(), |v| v.to_string());
    if json {
        println!(
            "{{\"received\":{},\"valid\":{},\"corrupt\":{},\"short\":{},\"duplicates\":{},\"reordered\":{},\"unique\":{},\"lost\":{lost},\"min_len\":{},\"max_len\":{},\"ttl\":{ttl},\"seconds\":{:.3}}}",
            t.received,
            t.valid,
            t.corrupt,
            t.short,
            t.duplicates,
            t.reordered,
            t.unique(),
            t.min_len.unwrap_or(0),
            t.max_len,
            start.elapsed().as_secs_f64()
        );
    } else {
        println!(
            "received {} (valid {}, corrupt {}, short {}), duplicates {}, reordered {}, lost {lost}, ttl {ttl}",
            t.received, t.valid, t.corrupt, t.short, t.duplicates, t.reordered
        );
    }
    Ok(())
}

fn relay(
    input: SocketAddr,
    in_if: &str,
    outputs: &[SocketAddr],
    out_if: &str,
    ttl: u32,
    batch: usize,
) -> anyhow::Result<()> {
    let rx = net::receiver(input, net::interface_index(in_if)?, None)?;
    rx.set_read_timeout(Some(Duration::from_millis(100)))?;
    let out_index = net::interface_index(out_if)?;
    let txs = outputs
        .iter()
        .map(|&o| net::sender(o, Some(out_index), None, ttl, false))
        .collect::<Result<Vec<_>, _>>()?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, Arc::clone(&stop))?;
    }
    let batch = batch.clamp(1, MAX_BATCH);
    let mut bufs = vec![[0u8; RECV_BUF]; batch];
    let mut got = [Received::default(); MAX_BATCH];
    let (mut packets_in, mut packets_out, mut drops) = (0u64, 0u64, 0u64);
    while !stop.load(Ordering::Relaxed) {
        let n = match net::recv_batch(&rx, &mut bufs, &mut got) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) =>
            {
                continue;
            }
            Err(e) => return Err(e).context("recvmmsg"),
        };
        packets_in += n as u64;
        let mut slices = [&[][..]; MAX_BATCH];
        for (i, (b, r)) in bufs.iter().zip(&got).take(n).enumerate() {
            slices[i] = &b[..r.len.min(RECV_BUF)];
        }
        for tx in &txs {
            match net::send_batch(tx, &slices[..n]) {
                Ok(k) => {
                    packets_out += k as u64;
                    drops += (n - k) as u64;
                }
                Err(_) => drops += n as u64,
            }
        }
    }
    eprintln!("baseline relay: in {packets_in} out {packets_out} dropped {drops}");
    Ok(())
}
