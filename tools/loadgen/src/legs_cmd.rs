//! `loadgen legs` and `loadgen legs-recv`: one RTP stream played onto
//! several legs (SMPTE 2022-7 merge and failover tests), and the receiver
//! that says what of it came out of the relay.
//!
//! ```text
//! loadgen legs --leg 239.1.1.1:5000@vA1 --leg 239.1.3.1:5000@vA2 \
//!              --rate 1000 --count 5000 --loss 5,5 --delay-ms 0,20 --seed 1 --json
//! loadgen legs --leg ... --leg ... --gap 0:2000-4000      # leg 0 stops, then restarts
//! loadgen legs --leg ... --leg ... --replay stream.rec    # a recorded stream instead
//! loadgen legs-recv --group 239.2.2.2:5000 --interface vB --expect 5000 --json
//! loadgen legs-recv --group 127.0.0.1:5004 --payload any --record stream.rec
//! ```

use std::fs;
use std::io::{BufWriter, ErrorKind, Write};
use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use mcrelay_loadgen::legs::{self, LegSpec, Output, Plan, SeqExtender};
use mcrelay_loadgen::payload;
use mcrelay_loadgen::sock::{self, Iface, RecvBatch};

use super::{is_timeout, stop_flag};

/// Run id of the end marker [`legs`] sends after the stream (the same as
/// the namespace tests' `END_RUN`).
const DEFAULT_END_RUN: u32 = 999;

#[derive(Debug, Args)]
pub struct LegsArgs {
    /// A leg: destination group (or unicast address) and port, `@` the
    /// multicast output interface's name. Give 1 to 8, in leg order.
    #[arg(long = "leg", required = true, value_parser = parse_leg)]
    legs: Vec<(SocketAddr, String)>,
    /// Datagrams per second (above 0: the plan is a schedule).
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// Datagrams of the stream (with --replay: the recording's).
    #[arg(long, default_value_t = 5000)]
    count: u64,
    /// Datagram size in bytes, RTP header included (at least 36).
    #[arg(long, default_value_t = 1328)]
    size: usize,
    /// Planted loss per leg in percent, comma-separated in leg order
    /// (missing legs lose nothing). Disjoint: no number is lost twice.
    #[arg(long, value_delimiter = ',')]
    loss: Vec<f64>,
    /// Delay per leg in milliseconds, comma-separated in leg order.
    #[arg(long = "delay-ms", value_delimiter = ',')]
    delay_ms: Vec<u64>,
    /// `LEG:FROM-TO`: leg LEG (0-based) sends nothing for sequence
    /// numbers FROM..TO, then starts again (TO past the end: stays off).
    /// Repeatable.
    #[arg(long = "gap", value_parser = parse_gap)]
    gaps: Vec<(usize, u64, u64)>,
    /// Seed of the planted losses.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, default_value_t = 0x4d43_0001)]
    ssrc: u32,
    /// RTP payload type.
    #[arg(long, default_value_t = 96)]
    payload_type: u8,
    #[arg(long, default_value_t = 1)]
    run_id: u32,
    /// Play the datagrams of this recording (`legs-recv --record`) as
    /// they are instead of generating them; --count is its length.
    #[arg(long)]
    replay: Option<PathBuf>,
    /// Run id of the end marker sent on every running leg after the
    /// stream: an RTP datagram (same SSRC, next sequence number) whose
    /// payload is a loadgen datagram of this run.
    #[arg(long, default_value_t = DEFAULT_END_RUN)]
    end_run_id: u32,
    /// Send no end marker.
    #[arg(long)]
    no_end_marker: bool,
    /// TTL / hop limit.
    #[arg(long, default_value_t = 16)]
    ttl: u32,
    /// Print the summary as JSON: each leg's unsent sequence numbers, and
    /// `max_behind_ms`, the most any send ran behind its schedule, and
    /// `max_skew_ms`, the most any number was sent after the next one
    /// (the planned delay, stretched by any stall of the sender).
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PayloadKind {
    /// Loadgen datagrams behind the RTP header (`loadgen legs`), checked
    /// byte by byte; the sequence number is the payload's.
    Loadgen,
    /// Anything behind RTP (a recorded encoder's stream): the sequence
    /// number is the RTP one, counted from --first-seq.
    Any,
}

#[derive(Debug, Args)]
pub struct LegsRecvArgs {
    /// Group to join, or unicast address to bind, and port.
    #[arg(long)]
    group: SocketAddr,
    /// Interface to join on, by name.
    #[arg(long)]
    interface: Option<String>,
    /// Sequence numbers expected: 0..EXPECT.
    #[arg(long, default_value_t = 0)]
    expect: u64,
    #[arg(long, value_enum, default_value_t = PayloadKind::Loadgen)]
    payload: PayloadKind,
    /// With `--payload loadgen`: the run id of the stream.
    #[arg(long, default_value_t = 1)]
    run_id: u32,
    /// The stream's SSRC; other SSRCs count as `foreign`.
    #[arg(long)]
    ssrc: Option<u32>,
    /// With `--payload any`: the RTP sequence number of index 0 (default:
    /// the first to arrive).
    #[arg(long)]
    first_seq: Option<u16>,
    /// Stop when the end marker (`legs --end-run-id`) arrives.
    #[arg(long, default_value_t = DEFAULT_END_RUN)]
    end_run_id: u32,
    /// Stop after this many seconds in all.
    #[arg(long, default_value_t = 60.0)]
    duration: f64,
    /// Created (empty) once the socket is bound and joined.
    #[arg(long)]
    ready_file: Option<PathBuf>,
    /// Write every datagram of the stream, as received, to this record
    /// file (for `legs --replay`).
    #[arg(long)]
    record: Option<PathBuf>,
    /// Write the RTP payloads, in arrival order, to this file (an MPEG-TS
    /// stream's payloads make a `.ts` file).
    #[arg(long)]
    save_payload: Option<PathBuf>,
    /// Receive buffer to ask for, in bytes.
    #[arg(long, default_value_t = sock::RCVBUF)]
    rcvbuf: usize,
    #[arg(long)]
    json: bool,
}

fn parse_leg(s: &str) -> Result<(SocketAddr, String), String> {
    let (dest, iface) = s
        .split_once('@')
        .ok_or_else(|| format!("{s:?}: a leg is DEST:PORT@INTERFACE"))?;
    let dest = dest
        .parse()
        .map_err(|e| format!("{dest:?}: {e} (a leg is DEST:PORT@INTERFACE)"))?;
    Ok((dest, iface.to_owned()))
}

fn parse_gap(s: &str) -> Result<(usize, u64, u64), String> {
    let bad = || format!("{s:?}: a gap is LEG:FROM-TO, e.g. 0:2000-4000");
    let (leg, range) = s.split_once(':').ok_or_else(bad)?;
    let (from, to) = range.split_once('-').ok_or_else(bad)?;
    let (Ok(leg), Ok(from), Ok(to)) = (leg.parse(), from.parse(), to.parse()) else {
        return Err(bad());
    };
    if from > to {
        return Err(bad());
    }
    Ok((leg, from, to))
}

/// Per-leg totals of a `legs` run.
#[derive(Debug, Default, Clone)]
struct LegTotals {
    sent: u64,
    send_errors: u64,
    end_marker: bool,
}

/// Retry a send the kernel refused for a full queue, a moment later; any
/// other error (the leg's link down) is counted and the datagram skipped.
fn send_one(s: &UdpSocket, d: &[u8]) -> std::io::Result<()> {
    for _ in 0..200 {
        match s.send(d) {
            Ok(_) => return Ok(()),
            Err(e)
                if e.kind() == ErrorKind::WouldBlock
                    || e.kind() == ErrorKind::Interrupted
                    || e.raw_os_error() == Some(libc::ENOBUFS) =>
            {
                std::thread::sleep(Duration::from_micros(50));
            }
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::from_raw_os_error(libc::ENOBUFS))
}

/// Sleep until `at`, the last stretch spun.
fn sleep_until(at: Instant) {
    loop {
        let now = Instant::now();
        if now >= at {
            return;
        }
        let left = at - now;
        if left > Duration::from_micros(200) {
            std::thread::sleep(left - Duration::from_micros(100));
        } else {
            std::hint::spin_loop();
        }
    }
}

pub fn send(a: &LegsArgs) -> anyhow::Result<()> {
    let recorded = a
        .replay
        .as_ref()
        .map(|p| {
            fs::File::open(p)
                .and_then(legs::read_records)
                .with_context(|| format!("reading the recording {}", p.display()))
        })
        .transpose()?;
    let count = recorded.as_ref().map_or(a.count, |r| r.len() as u64);
    if recorded.is_none() && a.size < legs::RTP_HEADER + payload::HEADER_LEN {
        bail!(
            "--size {} is too small: at least {} bytes (RTP and loadgen headers)",
            a.size,
            legs::RTP_HEADER + payload::HEADER_LEN
        );
    }
    let mut specs: Vec<LegSpec> = (0..a.legs.len())
        .map(|i| LegSpec {
            loss_percent: a.loss.get(i).copied().unwrap_or(0.0),
            delay: Duration::from_millis(a.delay_ms.get(i).copied().unwrap_or(0)),
            gaps: Vec::new(),
        })
        .collect();
    for &(leg, from, to) in &a.gaps {
        let Some(spec) = specs.get_mut(leg) else {
            bail!("--gap {leg}:{from}-{to}: there is no leg {leg} (legs count from 0)");
        };
        spec.gaps.push(from..to);
    }
    let plan = Plan::new(count, a.rate, a.seed, specs)?;
    let socks = a
        .legs
        .iter()
        .map(|(dest, iface)| {
            let iface = Iface::from_options(Some(iface), None)
                .with_context(|| format!("leg {dest}@{iface}: no such interface"))?;
            sock::sender(&sock::SenderOptions {
                dest: *dest,
                iface,
                source: None,
                ttl: a.ttl,
                multicast_loop: false,
            })
            .with_context(|| format!("leg {dest}"))
        })
        .collect::<anyhow::Result<Vec<UdpSocket>>>()?;
    let stop = stop_flag()?;
    sock::tight_timer_slack();

    let mut totals = vec![LegTotals::default(); socks.len()];
    let mut buf = vec![0u8; a.size];
    // The datagram in `buf`, so a number sent on two legs in a row is
    // built once.
    let mut built: Option<u64> = None;
    let mut behind = Duration::ZERO;
    let mut skew = SkewMeter::default();
    let start = Instant::now();
    for e in plan.schedule() {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let due = start + e.at;
        sleep_until(due);
        // How far behind its schedule the sender ran: a stall stretches
        // the legs' skew by up to this much.
        let now = Instant::now();
        behind = behind.max(now.saturating_duration_since(due));
        skew.on_send(e.seq, now);
        let d: &[u8] = match &recorded {
            Some(r) => r
                .get(usize::try_from(e.seq).unwrap_or(usize::MAX))
                .map_or(&[][..], Vec::as_slice),
            None => {
                if built != Some(e.seq) {
                    legs::build(&mut buf, a.payload_type, a.ssrc, a.run_id, e.seq, a.rate);
                    built = Some(e.seq);
                }
                &buf
            }
        };
        let t = &mut totals[e.leg];
        match send_one(&socks[e.leg], d) {
            Ok(()) => t.sent += 1,
            Err(_) => t.send_errors += 1,
        }
    }
    if !a.no_end_marker && !stop.load(Ordering::Relaxed) {
        // After the last send of every leg (delays included): the marker
        // comes after the whole stream on every path.
        sleep_until(start + plan.end() + Duration::from_millis(1));
        let marker = end_marker(a, recorded.as_deref(), count);
        for (leg, s) in socks.iter().enumerate() {
            if !plan.stopped(leg, count.saturating_sub(1)) {
                totals[leg].end_marker = send_one(s, &marker).is_ok();
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    report_send(a, &plan, &totals, secs, behind, skew.max);
    Ok(())
}

/// The skew the legs really had: for each send of number `n`, how long
/// after `n + 1` was first sent (on any leg). What a merge must hold a
/// number's successor for until the number itself arrives: the planned
/// delay, stretched by any stall of the sender in between.
#[derive(Debug)]
struct SkewMeter {
    /// When each number was first sent, by number mod the ring's size.
    first: Vec<Option<(u64, Instant)>>,
    max: Duration,
}

impl Default for SkewMeter {
    fn default() -> Self {
        Self {
            first: vec![None; 1 << 16],
            max: Duration::ZERO,
        }
    }
}

impl SkewMeter {
    fn slot(&mut self, seq: u64) -> &mut Option<(u64, Instant)> {
        let n = self.first.len() as u64;
        &mut self.first[usize::try_from(seq % n).unwrap_or(0)]
    }

    fn on_send(&mut self, seq: u64, now: Instant) {
        if let Some((s, at)) = *self.slot(seq + 1) {
            if s == seq + 1 {
                self.max = self.max.max(now.saturating_duration_since(at));
            }
        }
        let slot = self.slot(seq);
        if !matches!(*slot, Some((s, _)) if s == seq) {
            *slot = Some((seq, now));
        }
    }
}

/// The end marker: the stream's next RTP sequence number, its SSRC (the
/// recording's for a replay), and a loadgen datagram of the end run.
fn end_marker(a: &LegsArgs, recorded: Option<&[Vec<u8>]>, count: u64) -> Vec<u8> {
    let mut m = vec![0u8; legs::RTP_HEADER + payload::HEADER_LEN];
    let last = recorded
        .and_then(|r| r.last())
        .and_then(|d| legs::parse_rtp(d));
    let (pt, seq, ts, ssrc) = match (last, recorded.and_then(|r| r.last())) {
        (Some(h), Some(d)) => (d[1] & 0x7f, h.sequence.wrapping_add(1), h.timestamp, h.ssrc),
        _ => (a.payload_type, legs::seq16(count), 0, a.ssrc),
    };
    legs::write_rtp_header(&mut m, pt, seq, ts, ssrc);
    payload::write(&mut m[legs::RTP_HEADER..], a.end_run_id, 0, count);
    m
}

fn list(v: &[u64]) -> String {
    let items: Vec<String> = v.iter().map(u64::to_string).collect();
    format!("[{}]", items.join(","))
}

fn report_send(
    a: &LegsArgs,
    plan: &Plan,
    totals: &[LegTotals],
    secs: f64,
    behind: Duration,
    skew: Duration,
) {
    let legs_json: Vec<String> = totals
        .iter()
        .enumerate()
        .map(|(leg, t)| {
            format!(
                "{{\"dest\":\"{}\",\"sent\":{},\"send_errors\":{},\"end_marker\":{},\"losses\":{},\"dropped\":{}}}",
                a.legs[leg].0,
                t.sent,
                t.send_errors,
                t.end_marker,
                list(&plan.losses(leg)),
                list(&plan.dropped(leg)),
            )
        })
        .collect();
    if a.json {
        println!(
            "{{\"count\":{},\"rate\":{},\"seconds\":{secs:.3},\"max_behind_ms\":{:.3},\"max_skew_ms\":{:.3},\"legs\":[{}]}}",
            plan.count(),
            a.rate,
            behind.as_secs_f64() * 1e3,
            skew.as_secs_f64() * 1e3,
            legs_json.join(",")
        );
    } else {
        for (leg, t) in totals.iter().enumerate() {
            println!(
                "leg {leg} ({}): sent {} of {}, {} planted losses, {} send errors",
                a.legs[leg].0,
                t.sent,
                plan.count(),
                plan.losses(leg).len(),
                t.send_errors
            );
        }
    }
}

/// What `legs-recv` counts besides the stream's [`Output`].
#[derive(Debug, Default)]
struct RecvTotals {
    datagrams: u64,
    not_rtp: u64,
    foreign: u64,
    corrupt: u64,
    truncated: u64,
    ended: bool,
    /// The longest time between two arrivals of the stream, and the
    /// sequence numbers on either side of it.
    max_silence: Duration,
    silence_between: (u64, u64),
}

pub fn recv(a: &LegsRecvArgs) -> anyhow::Result<()> {
    let iface = Iface::from_options(a.interface.as_deref(), None)?;
    let (s, _) = sock::receiver(&sock::ReceiverOptions {
        addr: a.group,
        iface,
        source: None,
        control: false,
    })
    .with_context(|| format!("receiving on {}", a.group))?;
    sock::request_receive_buffer(&s, a.rcvbuf);
    s.set_read_timeout(Some(Duration::from_millis(50)))?;
    let stop = stop_flag()?;
    let create = |p: &Option<PathBuf>| {
        p.as_ref()
            .map(|p| {
                fs::File::create(p)
                    .map(BufWriter::new)
                    .with_context(|| format!("creating {}", p.display()))
            })
            .transpose()
    };
    let mut record = create(&a.record)?;
    let mut save = create(&a.save_payload)?;
    if let Some(path) = &a.ready_file {
        fs::write(path, b"").with_context(|| format!("writing {}", path.display()))?;
    }
    let mut rx = RecvBatch::new(64, sock::MAX_DATAGRAM + 1, false);
    let mut out = Output::new(a.expect);
    let mut ext = a.first_seq.map(SeqExtender::new);
    let mut t = RecvTotals::default();
    let mut last: Option<(Instant, u64)> = None;
    let start = Instant::now();
    let end = start + Duration::try_from_secs_f64(a.duration).context("bad --duration")?;
    let mut draining = false;
    while !t.ended && Instant::now() < end {
        if stop.load(Ordering::Relaxed) && !draining {
            // Take what is already queued, then stop.
            draining = true;
            s.set_nonblocking(true)?;
        }
        let n = match rx.recv(&s) {
            Ok(n) => n,
            Err(_) if draining => break,
            Err(e) if is_timeout(&e) => continue,
            Err(e) => return Err(e).context("recvmmsg"),
        };
        let now = Instant::now();
        for i in 0..n {
            let (d, meta) = rx.get(i);
            t.datagrams += 1;
            if meta.truncated {
                t.truncated += 1;
                continue;
            }
            let Some(h) = legs::parse_rtp(d) else {
                t.not_rtp += 1;
                continue;
            };
            let body = &d[h.payload.clone()];
            if payload::check(body, a.end_run_id).is_ok() {
                t.ended = true;
                continue;
            }
            if a.ssrc.is_some_and(|x| x != h.ssrc) {
                t.foreign += 1;
                continue;
            }
            let seq = match a.payload {
                PayloadKind::Loadgen => match payload::check(body, a.run_id) {
                    Ok(p) if legs::seq16(p.sequence) == h.sequence => p.sequence,
                    _ => {
                        t.corrupt += 1;
                        continue;
                    }
                },
                PayloadKind::Any => ext
                    .get_or_insert_with(|| SeqExtender::new(h.sequence))
                    .extend(h.sequence),
            };
            out.on_seq(seq);
            if let Some((at, prev)) = last {
                if now - at > t.max_silence {
                    t.max_silence = now - at;
                    t.silence_between = (prev, seq);
                }
            }
            last = Some((now, seq));
            if let Some(w) = &mut record {
                legs::write_record(w, d).context("writing the record file")?;
            }
            if let Some(w) = &mut save {
                w.write_all(body).context("writing the payload file")?;
            }
        }
    }
    for w in [record, save].into_iter().flatten() {
        w.into_inner()
            .map_err(|e| e.into_error())
            .and_then(|f| f.sync_all())
            .context("flushing an output file")?;
    }
    report_recv(
        a,
        &out,
        &t,
        start.elapsed().as_secs_f64(),
        sock::socket_drops(&s),
    );
    Ok(())
}

fn report_recv(a: &LegsRecvArgs, o: &Output, t: &RecvTotals, secs: f64, drops: Option<u32>) {
    let missing = o.missing();
    let duplicated = o.duplicated();
    if a.json {
        println!(
            concat!(
                "{{\"datagrams\":{},\"received\":{},\"expect\":{},\"missing\":{},\"duplicates\":{},",
                "\"late\":{},\"max_lateness\":{},\"longest_gap\":{},\"beyond\":{},\"corrupt\":{},",
                "\"not_rtp\":{},\"foreign\":{},\"truncated\":{},\"ended\":{},",
                "\"max_silence_ms\":{:.3},\"silence_between\":[{},{}],\"seconds\":{:.3},",
                "\"kernel_drops\":{},\"missing_seqs\":{},\"duplicated_seqs\":{},\"late_seqs\":{}}}"
            ),
            t.datagrams,
            o.received,
            o.expect(),
            missing.len(),
            o.duplicates(),
            o.late.len(),
            o.max_lateness,
            o.longest_gap(),
            o.beyond,
            t.corrupt,
            t.not_rtp,
            t.foreign,
            t.truncated,
            t.ended,
            t.max_silence.as_secs_f64() * 1e3,
            t.silence_between.0,
            t.silence_between.1,
            secs,
            drops.map_or_else(|| "null".to_owned(), |d| d.to_string()),
            list(&missing),
            list(&duplicated),
            list(&o.late),
        );
    } else {
        println!(
            "received {} of {} (missing {}, duplicates {}, late {}, corrupt {}, not RTP {}, foreign {}), longest silence {:.1} ms, ended {}",
            o.received,
            o.expect(),
            missing.len(),
            o.duplicates(),
            o.late.len(),
            t.corrupt,
            t.not_rtp,
            t.foreign,
            t.max_silence.as_secs_f64() * 1e3,
            t.ended
        );
    }
}
