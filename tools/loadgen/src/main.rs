//! `loadgen`: the paced sender, validating receiver and baseline relay used
//! by mcrelay's namespace tests and end-to-end benchmark.
//!
//! ```text
//! loadgen send --dest 239.1.1.1:5000 --interface vA --rate 100000 --count 500000 --size 1316
//! loadgen recv --group 239.2.2.2:6000 --interface vB --expect 500000 --json
//! loadgen relay --input 239.1.1.1:5000 --input-interface vRA \
//!               --output 239.2.2.2:6000 --output-interface vRB
//! loadgen many-send --first 239.10.0.1:5000 --groups 1000 --source 10.18.0.1 --per-group 100
//! loadgen many-recv --first 239.11.0.1:6000 --groups 1000 --interface vr --per-group 100
//! loadgen relay --input 239.1.1.1:5000 --input-interface vRA \
//!               --output 239.2.2.2:6000 --output-interface vRB1 \
//!               --output 239.2.2.2:6000 --output-interface vRB2
//! loadgen legs --leg 239.1.1.1:5000@vA1 --leg 239.1.3.1:5000@vA2 --loss 5,5 --delay-ms 0,20
//! loadgen legs-recv --group 239.2.2.2:5000 --interface vB --expect 5000 --json
//! ```
//!
//! The relay's `--output-interface` (or `--output-interface-addr`) is given
//! once for every output, or once per `--output`, in the same order.

use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use mcrelay_loadgen::framing::{self, Framer, Framing};
use mcrelay_loadgen::latency::{self, ClockOffset, Histogram};
use mcrelay_loadgen::pacer::Pacer;
use mcrelay_loadgen::payload;
use mcrelay_loadgen::sock::{self, Iface, RecvBatch, SendBatch};
use mcrelay_loadgen::tracker::{DEFAULT_LIMIT, Streams};

mod legs_cmd;
mod many_cmd;

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
    /// Send numbered, patterned datagrams at a paced rate (sendmmsg).
    Send(SendArgs),
    /// Receive, check every byte, count loss, duplicates and reordering.
    Recv(RecvArgs),
    /// The baseline relay: blocking recvmmsg, then one sendmmsg per output.
    Relay(RelayArgs),
    /// One RTP stream onto several legs: planted disjoint losses, delays,
    /// a leg stopped and restarted (SMPTE 2022-7 tests).
    Legs(legs_cmd::LegsArgs),
    /// Receive the stream of `legs` after the relay: missing, duplicated
    /// and late sequence numbers.
    LegsRecv(legs_cmd::LegsRecvArgs),
    /// Send round-robin over N groups at one aggregate rate.
    ManySend(many_cmd::ManySendArgs),
    /// Join N groups on one socket, check every datagram, count loss per group.
    ManyRecv(many_cmd::ManyRecvArgs),
}

#[derive(Debug, Args)]
struct SendArgs {
    /// Destination group (or unicast address) and port; IPv4 or IPv6.
    #[arg(long)]
    dest: SocketAddr,
    /// Multicast output interface, by name.
    #[arg(long, conflicts_with = "interface_addr")]
    interface: Option<String>,
    /// Multicast output interface, by address.
    #[arg(long)]
    interface_addr: Option<IpAddr>,
    /// Local address to send from.
    #[arg(long, visible_alias = "bind")]
    source: Option<IpAddr>,
    /// Datagrams per second; 0 = as fast as possible.
    #[arg(long, default_value_t = 10_000)]
    rate: u64,
    /// Datagrams to send (default 10000 unless --duration is given).
    #[arg(long)]
    count: Option<u64>,
    /// Seconds to send for.
    #[arg(long)]
    duration: Option<f64>,
    /// Datagram size in bytes (1..=65507), or a comma-separated list cycled
    /// through datagram by datagram.
    #[arg(
        long,
        visible_alias = "sizes",
        value_delimiter = ',',
        default_value = "1316"
    )]
    size: Vec<usize>,
    /// TTL / hop limit.
    #[arg(long, default_value_t = 16)]
    ttl: u32,
    #[arg(long, default_value_t = 1)]
    run_id: u32,
    #[arg(long, default_value_t = 0)]
    stream_id: u32,
    /// Datagrams per sendmmsg.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Loop multicast back to this host (loopback tests); off by default.
    #[arg(long = "loop")]
    multicast_loop: bool,
    /// Write the send time (CLOCK_MONOTONIC ns) into bytes 24..32 of every
    /// datagram, for `recv --latency` (sizes of at least 32 bytes).
    #[arg(long)]
    timestamp: bool,
    /// What carries the checkable payload: `rtp` puts an RTP header before
    /// it, `rtp-mpegts` spreads it over TS packets after an RTP header
    /// (then `--size` is the RTP payload, a multiple of 188). The receiver
    /// needs the same `--payload`.
    #[arg(long, value_enum, default_value_t = Framing::Loadgen)]
    payload: Framing,
    /// Send every datagram a second time, to this group and port (a second
    /// leg of the same stream: SMPTE 2022-7 merge benchmarks), in the same
    /// batch right after the first.
    #[arg(long)]
    copy_dest: Option<SocketAddr>,
    /// Multicast output interface of `--copy-dest`, by name.
    #[arg(long, requires = "copy_dest")]
    copy_interface: Option<String>,
    /// Print the summary as a JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct RecvArgs {
    /// Group to join, or unicast address to bind, and port.
    #[arg(long)]
    group: SocketAddr,
    /// Interface to join on, by name.
    #[arg(long, conflicts_with = "interface_addr")]
    interface: Option<String>,
    /// Interface to join on, by address.
    #[arg(long)]
    interface_addr: Option<IpAddr>,
    /// Source-specific join.
    #[arg(long)]
    source: Option<IpAddr>,
    /// Datagrams of other runs are counted as `wrong_run`, not checked.
    #[arg(long, default_value_t = 1)]
    run_id: u32,
    /// Stop after this many datagrams (any kind); `lost` is this minus the
    /// unique valid and the short ones (else the sequence gaps minus short).
    #[arg(long)]
    expect: Option<u64>,
    /// Stop after this many seconds in total.
    #[arg(long)]
    duration: Option<f64>,
    /// Stop this many seconds after the last datagram (once one arrived);
    /// 0 = never.
    #[arg(long, default_value_t = 1.0)]
    idle_exit: f64,
    /// Stop once a well-formed datagram of this run id arrives: an end
    /// marker sent after the traffic being counted (`send --run-id N
    /// --count 1`), so on an in-order path everything sent before it has
    /// arrived. Counted as `wrong_run`, not as valid.
    #[arg(long)]
    end_run_id: Option<u32>,
    /// Created (empty) once the socket is bound and joined.
    #[arg(long)]
    ready_file: Option<PathBuf>,
    /// Datagrams per recvmmsg.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Receive buffer to ask for, in bytes (`SO_RCVBUFFORCE`, else
    /// `SO_RCVBUF`); the granted size is reported as `rcvbuf`.
    #[arg(long, default_value_t = sock::RCVBUF)]
    rcvbuf: usize,
    /// One-way latency of datagrams sent with `send --timestamp`: the
    /// kernel's receive stamp (SO_TIMESTAMPNS) minus the sender's, into a
    /// histogram; reported as `latency` (p50, p99, p99.9, max, ...).
    #[arg(long)]
    latency: bool,
    /// What carries the checkable payload (as `send --payload`); a datagram
    /// whose RTP or TS framing is wrong counts as corrupt.
    #[arg(long, value_enum, default_value_t = Framing::Loadgen)]
    payload: Framing,
    /// Print the summary as a JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct RelayArgs {
    /// Group to join, or unicast address to bind, and port.
    #[arg(long)]
    input: SocketAddr,
    #[arg(long, conflicts_with = "input_interface_addr")]
    input_interface: Option<String>,
    #[arg(long)]
    input_interface_addr: Option<IpAddr>,
    /// Source-specific join of the input.
    #[arg(long)]
    source: Option<IpAddr>,
    /// Destination (repeatable): every input datagram goes to each.
    #[arg(long, required = true)]
    output: Vec<SocketAddr>,
    /// Multicast output interface, by name: once for every output, or once
    /// per `--output`, in the same order.
    #[arg(long, conflicts_with = "output_interface_addr")]
    output_interface: Vec<String>,
    /// Multicast output interface, by address: once for every output, or
    /// once per `--output`, in the same order.
    #[arg(long)]
    output_interface_addr: Vec<IpAddr>,
    /// TTL / hop limit of the outputs.
    #[arg(long, default_value_t = 16)]
    ttl: u32,
    /// Datagrams per recvmmsg (and per sendmmsg).
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Stop after this many seconds (else on SIGTERM / SIGINT).
    #[arg(long)]
    duration: Option<f64>,
    /// Loop output multicast back to this host (loopback tests).
    #[arg(long = "loop")]
    multicast_loop: bool,
    /// Print the totals as a JSON object.
    #[arg(long)]
    json: bool,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Send(a) => send(&a),
        Command::Recv(a) => recv(&a),
        Command::Relay(a) => relay(&a),
        Command::Legs(a) => legs_cmd::send(&a),
        Command::LegsRecv(a) => legs_cmd::recv(&a),
        Command::ManySend(a) => many_cmd::send(&a),
        Command::ManyRecv(a) => many_cmd::recv(&a),
    }
}

/// Set by SIGTERM / SIGINT.
fn stop_flag() -> anyhow::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).context("signal handler")?;
    }
    Ok(stop)
}

fn deadline(start: Instant, seconds: Option<f64>) -> anyhow::Result<Option<Instant>> {
    seconds
        .map(|s| {
            Duration::try_from_secs_f64(s)
                .map(|d| start + d)
                .context("bad --duration")
        })
        .transpose()
}

/// Errors worth retrying a send after: a full queue, or an ICMP error an
/// earlier datagram drew (unicast to a closed port).
fn transient(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted)
        || matches!(
            e.raw_os_error(),
            Some(libc::ENOBUFS | libc::ECONNREFUSED | libc::EHOSTUNREACH | libc::ENETUNREACH)
        )
}

fn per_second(n: u64, secs: f64) -> f64 {
    if secs > 0.0 { n as f64 / secs } else { 0.0 }
}

fn json_opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "null".to_owned(), |v| v.to_string())
}

/// A sender to `dest` out of `iface`, from any local address.
fn unbound_sender(
    dest: SocketAddr,
    iface: Iface,
    ttl: u32,
    multicast_loop: bool,
) -> std::io::Result<UdpSocket> {
    sock::sender(&sock::SenderOptions {
        dest,
        iface,
        source: None,
        ttl,
        multicast_loop,
    })
}

fn send(a: &SendArgs) -> anyhow::Result<()> {
    let max_size = 65_507;
    if a.size.is_empty() || a.size.iter().any(|&n| n == 0 || n > max_size) {
        bail!("--size must be 1..={max_size} bytes");
    }
    if a.timestamp && a.size.iter().any(|&n| n < latency::MIN_STAMPED_LEN) {
        bail!(
            "--timestamp needs datagrams of at least {} bytes (--size)",
            latency::MIN_STAMPED_LEN
        );
    }
    if a.timestamp && a.payload != Framing::Loadgen {
        bail!("--timestamp needs --payload loadgen (it writes into the datagram's bytes 24..32)");
    }
    for &n in &a.size {
        a.payload.check_size(n)?;
        if a.payload.wire_len(n) > max_size {
            bail!(
                "--size {n} with --payload {:?} is over {max_size} bytes on the wire",
                a.payload
            );
        }
    }
    let count = a.count.unwrap_or(if a.duration.is_some() {
        u64::MAX
    } else {
        10_000
    });
    let iface = Iface::from_options(a.interface.as_deref(), a.interface_addr)?;
    let s = sock::sender(&sock::SenderOptions {
        dest: a.dest,
        iface,
        source: a.source,
        ttl: a.ttl,
        multicast_loop: a.multicast_loop,
    })
    .with_context(|| format!("sender to {}", a.dest))?;
    let copy = a
        .copy_dest
        .map(|dest| {
            let iface = Iface::from_options(a.copy_interface.as_deref(), None)?;
            unbound_sender(dest, iface, a.ttl, a.multicast_loop)
                .with_context(|| format!("copy sender to {dest}"))
        })
        .transpose()?;
    let stop = stop_flag()?;
    sock::tight_timer_slack();
    let mut framer = Framer::new(a.payload);

    let batch = a.batch.clamp(1, sock::MAX_BATCH);
    // Datagram `seq` is built in buffer `seq % batch`, so datagrams a
    // partial send left over are not rebuilt.
    let mut bufs: Vec<Vec<u8>> = vec![Vec::new(); batch];
    let mut built: Vec<Option<u64>> = vec![None; batch];
    let mut sb = SendBatch::new(batch);
    let sizes = &a.size;
    let nsizes = sizes.len() as u64;
    let (mut sent, mut bytes, mut errors) = (0u64, 0u64, 0u64);
    let (mut copies, mut copy_errors) = (0u64, 0u64);
    let start = Instant::now();
    let end = deadline(start, a.duration)?;
    let mut pacer = Pacer::starting_at(a.rate, start);
    let slot = |seq: u64| usize::try_from(seq % batch as u64).unwrap_or(0);
    while sent < count && !stop.load(Ordering::Relaxed) && end.is_none_or(|e| Instant::now() < e) {
        let want = usize::try_from((count - sent).min(batch as u64)).unwrap_or(batch);
        let n = pacer.wait(want);
        for seq in sent..sent + n as u64 {
            let i = slot(seq);
            if built[i] != Some(seq) {
                let len = sizes[usize::try_from(seq % nsizes).unwrap_or(0)];
                framer.build(&mut bufs[i], len, a.run_id, a.stream_id, seq, a.rate);
                built[i] = Some(seq);
            }
        }
        if a.timestamp {
            let now = sock::monotonic_ns();
            for seq in sent..sent + n as u64 {
                latency::stamp(&mut bufs[slot(seq)], now);
            }
        }
        match sb.send(
            &s,
            (sent..sent + n as u64).map(|seq| bufs[slot(seq)].as_slice()),
        ) {
            Ok(k) => {
                bytes += (sent..sent + k as u64)
                    .map(|seq| bufs[slot(seq)].len() as u64)
                    .sum::<u64>();
                if let Some(c) = &copy {
                    // The same datagrams on the second leg, all of them
                    // (retrying what a full queue refused).
                    let mut done = 0u64;
                    while done < k as u64 && !stop.load(Ordering::Relaxed) {
                        let from = sent + done;
                        match sb.send(
                            c,
                            (from..sent + k as u64).map(|seq| bufs[slot(seq)].as_slice()),
                        ) {
                            Ok(j) => done += j as u64,
                            Err(e) if transient(&e) => {
                                copy_errors += 1;
                                std::thread::sleep(Duration::from_micros(50));
                            }
                            Err(e) => return Err(e).context("sendmmsg (--copy-dest)"),
                        }
                    }
                    copies += done;
                }
                sent += k as u64;
                pacer.sent(k);
            }
            Err(e) if transient(&e) => {
                errors += 1;
                if e.raw_os_error() == Some(libc::ENOBUFS) || e.kind() == ErrorKind::WouldBlock {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
            Err(e) => return Err(e).context("sendmmsg"),
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let pps = per_second(sent, secs);
    let mbps = per_second(bytes, secs) * 8.0 / 1e6;
    if a.json {
        let copy_json = if copy.is_some() {
            format!(",\"copies_sent\":{copies},\"copy_send_errors\":{copy_errors}")
        } else {
            String::new()
        };
        println!(
            "{{\"sent\":{sent},\"bytes\":{bytes},\"seconds\":{secs:.6},\"pps\":{pps:.1},\"mbps\":{mbps:.3},\"rate\":{},\"send_errors\":{errors}{copy_json}}}",
            a.rate
        );
    } else {
        println!(
            "sent {sent} datagrams ({bytes} bytes) in {secs:.3} s: {pps:.0} pps, {mbps:.1} Mbit/s, {errors} send errors"
        );
        if copy.is_some() {
            println!("copies sent {copies}, {copy_errors} copy send errors");
        }
    }
    Ok(())
}

fn recv(a: &RecvArgs) -> anyhow::Result<()> {
    let iface = Iface::from_options(a.interface.as_deref(), a.interface_addr)?;
    let (s, _) = sock::receiver(&sock::ReceiverOptions {
        addr: a.group,
        iface,
        source: a.source,
        control: true,
    })
    .with_context(|| format!("receiving on {}", a.group))?;
    let rcvbuf = sock::request_receive_buffer(&s, a.rcvbuf);
    s.set_read_timeout(Some(Duration::from_millis(50)))?;
    if a.latency && a.payload != Framing::Loadgen {
        bail!(
            "--latency needs --payload loadgen (the send stamp sits in the datagram's bytes 24..32)"
        );
    }
    let mut scratch = Vec::new();
    let mut delays = a.latency.then(Latency::default);
    if a.latency {
        sock::enable_rx_timestamps(&s).context("SO_TIMESTAMPNS for --latency")?;
    }
    let stop = stop_flag()?;
    if let Some(path) = &a.ready_file {
        std::fs::write(path, b"").with_context(|| format!("writing {}", path.display()))?;
    }
    let mut rx = RecvBatch::new(a.batch, sock::MAX_DATAGRAM + 1, true);
    let limit = a
        .expect
        .map_or(DEFAULT_LIMIT, |e| e.clamp(1 << 16, DEFAULT_LIMIT));
    let mut t = Streams::new(limit);
    let (mut last_ttl, mut truncated, mut bytes) = (None, 0u64, 0u64);
    let start = Instant::now();
    let end = deadline(start, a.duration)?;
    let idle = (a.idle_exit > 0.0)
        .then(|| Duration::try_from_secs_f64(a.idle_exit))
        .transpose()
        .context("bad --idle-exit")?;
    let (mut first, mut last) = (None::<Instant>, None::<Instant>);
    let mut ended = false;
    loop {
        let now = Instant::now();
        if ended
            || stop.load(Ordering::Relaxed)
            || a.expect.is_some_and(|e| t.received >= e)
            || end.is_some_and(|e| now >= e)
            || idle.zip(last).is_some_and(|(i, l)| now - l >= i)
        {
            break;
        }
        let n = match rx.recv(&s) {
            Ok(n) => n,
            Err(e) if is_timeout(&e) => continue,
            Err(e) => return Err(e).context("recvmmsg"),
        };
        let now = Instant::now();
        first.get_or_insert(now);
        last = Some(now);
        // One clock reading per batch: the fallback receive time and the
        // kernel stamps' conversion to CLOCK_MONOTONIC.
        let clocks = delays
            .as_ref()
            .map(|_| (sock::monotonic_ns(), ClockOffset::sample()));
        for i in 0..n {
            let (data, meta) = rx.get_mut(i);
            last_ttl = meta.ttl.or(last_ttl);
            truncated += u64::from(meta.truncated);
            bytes += data.len() as u64;
            let sent = clocks.and_then(|_| latency::take_stamp(data));
            let inner = match framing::unwrap(a.payload, data, &mut scratch, a.run_id) {
                Ok(inner) => inner,
                Err(framing::FrameError::Payload(payload::PayloadError::WrongRun(run))) => {
                    t.on_unchecked(data.len(), payload::PayloadError::WrongRun(run));
                    ended |= a.end_run_id == Some(run);
                    continue;
                }
                Err(framing::FrameError::Payload(e)) => {
                    t.on_unchecked(data.len(), e);
                    continue;
                }
                Err(_) => {
                    t.on_unchecked(data.len(), payload::PayloadError::BadMagic);
                    continue;
                }
            };
            // Failures are counted by kind inside.
            match t.on_datagram(inner, a.run_id) {
                Err(payload::PayloadError::WrongRun(run)) => ended |= a.end_run_id == Some(run),
                Err(_) => {}
                Ok(()) => {
                    if let (Some(d), Some((user_now, offset))) = (delays.as_mut(), clocks) {
                        d.record(sent, meta.kernel_time_ns, user_now, offset);
                    }
                }
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let active = first.zip(last).map_or(0.0, |(f, l)| (l - f).as_secs_f64());
    let pps = per_second(t.received.saturating_sub(1), active);
    // Short datagrams arrived but cannot be attributed to a sequence
    // number: they are not lost.
    let lost = a
        .expect
        .map_or_else(|| t.gaps(), |e| e.saturating_sub(t.unique()))
        .saturating_sub(t.short);
    let kernel_drops = sock::socket_drops(&s);
    let ttl = json_opt(last_ttl);
    let latency_json = delays
        .as_ref()
        .map_or_else(String::new, |d| format!(",\"latency\":{}", d.json()));
    if a.json {
        println!(
            concat!(
                "{{\"received\":{},\"valid\":{},\"corrupt\":{},\"short\":{},\"wrong_run\":{},",
                "\"truncated\":{},\"duplicates\":{},\"reordered\":{},\"unique\":{},\"lost\":{},",
                "\"gaps\":{},\"streams\":{},\"min_len\":{},\"max_len\":{},\"ttl\":{},",
                "\"received_ttl\":{},\"bytes\":{},\"pps\":{:.1},\"seconds\":{:.3},",
                "\"kernel_drops\":{},\"rcvbuf\":{}{}}}"
            ),
            t.received,
            t.valid,
            t.corrupt,
            t.short,
            t.wrong_run,
            truncated,
            t.duplicates(),
            t.reordered(),
            t.unique(),
            lost,
            t.gaps(),
            t.streams.len(),
            t.min_len.unwrap_or(0),
            t.max_len,
            ttl,
            ttl,
            bytes,
            pps,
            secs,
            json_opt(kernel_drops),
            rcvbuf,
            latency_json,
        );
    } else {
        println!(
            "received {} (valid {}, corrupt {}, short {}, wrong run {}), duplicates {}, reordered {}, lost {lost}, sizes {}..{}, ttl {ttl}, {pps:.0} pps, kernel drops {}",
            t.received,
            t.valid,
            t.corrupt,
            t.short,
            t.wrong_run,
            t.duplicates(),
            t.reordered(),
            t.min_len.unwrap_or(0),
            t.max_len,
            json_opt(kernel_drops),
        );
    }
    Ok(())
}

/// The receiver's `--latency` state: the histogram and how each delay was
/// timed.
#[derive(Debug, Default)]
struct Latency {
    histogram: Histogram,
    /// Timed by the kernel's receive stamp.
    kernel_stamped: u64,
    /// No kernel stamp: timed by the receiver's clock after `recvmmsg`.
    user_stamped: u64,
    /// Valid datagrams without a send stamp (sent without `--timestamp`).
    unstamped: u64,
}

impl Latency {
    fn record(&mut self, sent: Option<u64>, kernel: Option<u64>, user_now: u64, off: ClockOffset) {
        let Some(sent) = sent else {
            self.unstamped += 1;
            return;
        };
        let delay = match kernel {
            Some(k) => {
                self.kernel_stamped += 1;
                off.delay_ns(sent, k)
            }
            None => {
                self.user_stamped += 1;
                let d = i128::from(user_now) - i128::from(sent);
                i64::try_from(d).unwrap_or(i64::MAX)
            }
        };
        self.histogram.record(delay);
    }

    fn json(&self) -> String {
        let h = self.histogram.json();
        // The histogram's object, with the receive-time sources appended.
        format!(
            "{},\"kernel_stamped\":{},\"user_stamped\":{},\"unstamped\":{},\"clock\":\"CLOCK_MONOTONIC; receive time SO_TIMESTAMPNS\"}}",
            h.trim_end_matches('}'),
            self.kernel_stamped,
            self.user_stamped,
            self.unstamped
        )
    }
}

/// Receive buffer per datagram in the relay: a 9000-byte jumbo payload and
/// change; longer datagrams are dropped (counted as `truncated`).
const RELAY_STRIDE: usize = 9216;

fn relay(a: &RelayArgs) -> anyhow::Result<()> {
    let in_iface = Iface::from_options(a.input_interface.as_deref(), a.input_interface_addr)?;
    let out_ifaces = output_ifaces(a)?;
    let (rx_sock, _) = sock::receiver(&sock::ReceiverOptions {
        addr: a.input,
        iface: in_iface,
        source: a.source,
        control: false,
    })
    .with_context(|| format!("relay input {}", a.input))?;
    // Bounds how long a signal or the deadline waits for the loop.
    rx_sock.set_read_timeout(Some(Duration::from_millis(100)))?;
    let txs = a
        .output
        .iter()
        .zip(out_ifaces)
        .map(|(&dest, iface)| {
            unbound_sender(dest, iface, a.ttl, a.multicast_loop)
                .with_context(|| format!("relay output {dest}"))
        })
        .collect::<anyhow::Result<Vec<UdpSocket>>>()?;
    let stop = stop_flag()?;
    let start = Instant::now();
    let end = deadline(start, a.duration)?;
    let totals = relay_loop(&rx_sock, &txs, a.batch, &stop, end)?;
    let secs = start.elapsed().as_secs_f64();
    let kernel_drops = json_opt(sock::socket_drops(&rx_sock));
    let RelayTotals {
        packets_in,
        packets_out,
        send_errors,
        truncated,
    } = totals;
    if a.json {
        println!(
            "{{\"packets_in\":{packets_in},\"packets_out\":{packets_out},\"drops\":{},\"send_errors\":{send_errors},\"truncated\":{truncated},\"kernel_drops\":{kernel_drops},\"seconds\":{secs:.3}}}",
            send_errors + truncated
        );
    } else {
        println!(
            "baseline relay: in {packets_in} out {packets_out} dropped {} (send errors {send_errors}, truncated {truncated}), kernel drops {kernel_drops}, {secs:.3} s",
            send_errors + truncated
        );
    }
    Ok(())
}

/// The interface of each `--output`, in order: `--output-interface` (or
/// `--output-interface-addr`) given once applies to every output, given
/// once per output pairs up with them; none lets the kernel choose.
fn output_ifaces(a: &RelayArgs) -> anyhow::Result<Vec<Iface>> {
    let outputs = a.output.len();
    let given = a.output_interface.len().max(a.output_interface_addr.len());
    if given > 1 && given != outputs {
        bail!(
            "{given} output interfaces for {outputs} --output: give --output-interface \
             (or --output-interface-addr) once for every output, or once per --output, in order"
        );
    }
    let ifaces: Vec<Iface> = if a.output_interface.is_empty() {
        a.output_interface_addr
            .iter()
            .map(|&addr| Iface::from_options(None, Some(addr)))
            .collect::<std::io::Result<_>>()?
    } else {
        a.output_interface
            .iter()
            .map(|name| Iface::from_options(Some(name), None))
            .collect::<std::io::Result<_>>()?
    };
    Ok(match ifaces.as_slice() {
        [] => vec![Iface::Any; outputs],
        [one] => vec![*one; outputs],
        _ => ifaces,
    })
}

#[derive(Debug, Default)]
struct RelayTotals {
    packets_in: u64,
    packets_out: u64,
    send_errors: u64,
    truncated: u64,
}

/// The baseline: one blocking `recvmmsg` of up to `batch`, then for each
/// output one `sendmmsg` of the whole batch (repeated only after a partial
/// send). No copies beyond the kernel's.
fn relay_loop(
    rx_sock: &UdpSocket,
    txs: &[UdpSocket],
    batch: usize,
    stop: &AtomicBool,
    end: Option<Instant>,
) -> anyhow::Result<RelayTotals> {
    let mut rx = RecvBatch::new(batch, RELAY_STRIDE, false);
    let mut sb = SendBatch::new(batch);
    let mut forward: Vec<usize> = Vec::with_capacity(batch);
    let mut t = RelayTotals::default();
    while !stop.load(Ordering::Relaxed) && end.is_none_or(|e| Instant::now() < e) {
        let n = match rx.recv(rx_sock) {
            Ok(n) => n,
            Err(e) if is_timeout(&e) => continue,
            Err(e) => return Err(e).context("recvmmsg"),
        };
        t.packets_in += n as u64;
        forward.clear();
        forward.extend((0..n).filter(|&i| !rx.get(i).1.truncated));
        t.truncated += (n - forward.len()) as u64;
        for tx in txs {
            let mut off = 0;
            while off < forward.len() {
                match sb.send(tx, forward[off..].iter().map(|&i| rx.get(i).0)) {
                    Ok(k) if k > 0 => {
                        t.packets_out += k as u64;
                        off += k;
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    // The datagram at `off` failed (e.g. ICMP unreachable
                    // from an earlier one): drop it, send the rest.
                    Ok(_) | Err(_) => {
                        t.send_errors += 1;
                        off += 1;
                    }
                }
            }
        }
    }
    Ok(t)
}

/// A receive that timed out or was interrupted: try again.
fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
    )
}
