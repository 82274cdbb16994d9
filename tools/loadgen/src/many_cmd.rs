//! `loadgen many-send` and `loadgen many-recv`: round-robin traffic over N
//! groups at one aggregate rate, and the receiver that joins all N on one
//! socket and checks every datagram per group (see
//! [`mcrelay_loadgen::many`]).
//!
//! ```text
//! loadgen many-send --first 239.10.0.1:5000 --groups 1000 --source 10.18.0.1 \
//!                   --rate 20000 --per-group 100
//! loadgen many-recv --first 239.11.0.1:6000 --groups 1000 --interface vr \
//!                   --per-group 100 --json
//! ```

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use mcrelay_loadgen::many;
use mcrelay_loadgen::pacer::Pacer;
use mcrelay_loadgen::payload;
use mcrelay_loadgen::sock::{self, Iface, RecvBatch};
use mcrelay_loadgen::tracker::Streams;

#[derive(Debug, Args)]
pub struct ManySendArgs {
    /// The first group and the port; group i is this address plus i.
    #[arg(long)]
    first: SocketAddrV4,
    /// How many groups.
    #[arg(long)]
    groups: u32,
    /// This namespace's address to send from; multicast leaves by the
    /// interface that has it.
    #[arg(long)]
    source: Ipv4Addr,
    /// Datagrams per second over all groups together; 0 = unpaced.
    #[arg(long, default_value_t = 10_000)]
    rate: u64,
    /// Datagrams per group (the run sends groups x this).
    #[arg(long)]
    per_group: u64,
    /// Datagram size in bytes (at least the 24-byte header).
    #[arg(long, default_value_t = 1316)]
    size: usize,
    #[arg(long, default_value_t = 16)]
    ttl: u32,
    #[arg(long, default_value_t = 1)]
    run_id: u32,
    /// Loop multicast back to this host (loopback tests); off by default.
    #[arg(long = "loop")]
    multicast_loop: bool,
    /// Print the summary as a JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct ManyRecvArgs {
    /// The first group and the port; group i is this address plus i.
    #[arg(long)]
    first: SocketAddrV4,
    /// How many groups (all joined on one socket: raise
    /// net.ipv4.igmp_max_memberships to at least this).
    #[arg(long)]
    groups: u32,
    /// Interface to join on, by name.
    #[arg(long)]
    interface: Option<String>,
    /// Datagrams each group should deliver; the receiver stops once every
    /// group has (or on --idle-exit / --duration).
    #[arg(long)]
    per_group: u64,
    /// Groups set apart in the summary (e.g. a flow a reload changed),
    /// comma-separated indexes.
    #[arg(long, value_delimiter = ',')]
    exclude: Vec<u32>,
    #[arg(long, default_value_t = 1)]
    run_id: u32,
    /// Stop after this many seconds in total.
    #[arg(long, default_value_t = 120.0)]
    duration: f64,
    /// Stop this many seconds after the last datagram (once one arrived).
    #[arg(long, default_value_t = 3.0)]
    idle_exit: f64,
    /// Created (empty) once every group is joined.
    #[arg(long)]
    ready_file: Option<PathBuf>,
    /// Print the summary as a JSON object.
    #[arg(long)]
    json: bool,
}

pub fn send(a: &ManySendArgs) -> anyhow::Result<()> {
    if a.groups == 0 || many::group(*a.first.ip(), a.groups - 1).is_none() {
        bail!("--groups must be 1.. and the range must fit after --first");
    }
    if a.size < payload::HEADER_LEN || a.size > 65_507 {
        bail!("--size must be {}..=65507 bytes", payload::HEADER_LEN);
    }
    let s = many::sender(a.source, a.ttl, a.multicast_loop)
        .with_context(|| format!("sender bound to {}", a.source))?;
    let stop = crate::stop_flag()?;
    sock::tight_timer_slack();
    let total = a.per_group.saturating_mul(u64::from(a.groups));
    let mut buf = vec![0u8; a.size];
    let (mut sent, mut retries) = (0u64, 0u64);
    let start = Instant::now();
    let mut pacer = Pacer::starting_at(a.rate, start);
    while sent < total && !stop.load(Ordering::Relaxed) {
        let want = usize::try_from((total - sent).min(64)).unwrap_or(64);
        let n = pacer.wait(want);
        let mut done = 0;
        while done < n {
            let (g, seq) = many::slot(sent, a.groups);
            let dest = many::destination(a.first, g).context("group range")?;
            payload::write(&mut buf, a.run_id, g, seq);
            match s.send_to(&buf, dest) {
                Ok(_) => {
                    sent += 1;
                    done += 1;
                }
                Err(e) if crate::transient(&e) => {
                    // Full queue: the same datagram again, a little later.
                    retries += 1;
                    std::thread::sleep(Duration::from_micros(50));
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                }
                Err(e) => return Err(e).with_context(|| format!("sending to {dest}")),
            }
        }
        pacer.sent(done);
    }
    let secs = start.elapsed().as_secs_f64();
    let pps = crate::per_second(sent, secs);
    if a.json {
        println!(
            "{{\"sent\":{sent},\"groups\":{},\"per_group\":{},\"seconds\":{secs:.6},\"pps\":{pps:.1},\"rate\":{},\"retries\":{retries}}}",
            a.groups, a.per_group, a.rate
        );
    } else {
        println!(
            "sent {sent} datagrams round-robin over {} groups in {secs:.3} s: {pps:.0} pps, {retries} retried",
            a.groups
        );
    }
    Ok(())
}

pub fn recv(a: &ManyRecvArgs) -> anyhow::Result<()> {
    let iface = Iface::from_options(a.interface.as_deref(), None)?;
    let receiver = many::receiver(*a.first.ip(), a.groups, a.first.port(), iface)
        .with_context(|| format!("joining {} groups from {}", a.groups, a.first))?;
    let s = &receiver.socket;
    let rcvbuf = sock::request_receive_buffer(s, 32 << 20);
    s.set_read_timeout(Some(Duration::from_millis(50)))?;
    let stop = crate::stop_flag()?;
    if let Some(path) = &a.ready_file {
        std::fs::write(path, b"").with_context(|| format!("writing {}", path.display()))?;
    }
    let mut rx = RecvBatch::new(64, sock::MAX_DATAGRAM + 1, false);
    let mut t = Streams::new(a.per_group.clamp(1 << 16, 1 << 28));
    // Every group not excluded complete ends the run (excluded groups, e.g.
    // a flow a reload changed, may never be).
    let counted = (0..a.groups).filter(|g| !a.exclude.contains(g)).count();
    let expected = a
        .per_group
        .saturating_mul(u64::try_from(counted).unwrap_or(u64::MAX));
    let complete = |t: &Streams| {
        t.valid >= expected && {
            let sum = many::summarize(t, a.groups, a.per_group, &a.exclude);
            sum.lost == 0
        }
    };
    let start = Instant::now();
    let end = crate::deadline(start, Some(a.duration))?;
    let idle = Duration::try_from_secs_f64(a.idle_exit).context("bad --idle-exit")?;
    let mut last = None::<Instant>;
    loop {
        let now = Instant::now();
        if stop.load(Ordering::Relaxed)
            || complete(&t)
            || end.is_some_and(|e| now >= e)
            || last.is_some_and(|l| now - l >= idle)
        {
            break;
        }
        let n = match rx.recv(s) {
            Ok(n) => n,
            Err(e) if crate::is_timeout(&e) => continue,
            Err(e) => return Err(e).context("recvmmsg"),
        };
        last = Some(Instant::now());
        for i in 0..n {
            // Failures are counted by kind inside.
            let _ = t.on_datagram(rx.get(i).0, a.run_id);
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let sum = many::summarize(&t, a.groups, a.per_group, &a.exclude);
    let drops = crate::json_opt(sock::socket_drops(s));
    let lossy: Vec<String> = sum.lossy.iter().map(|(g, n)| format!("{g}:{n}")).collect();
    if a.json {
        println!(
            concat!(
                "{{\"received\":{},\"valid\":{},\"corrupt\":{},\"short\":{},\"wrong_run\":{},",
                "\"groups\":{},\"groups_seen\":{},\"per_group\":{},\"lost\":{},\"lossy_groups\":{},",
                "\"lossy\":\"{}\",\"excluded_lost\":{},\"duplicates\":{},\"reordered\":{},",
                "\"kernel_drops\":{},\"rcvbuf\":{},\"seconds\":{:.3}}}"
            ),
            t.received,
            t.valid,
            t.corrupt,
            t.short,
            t.wrong_run,
            a.groups,
            sum.groups_seen,
            a.per_group,
            sum.lost,
            sum.lossy_groups,
            lossy.join(" "),
            sum.excluded_lost,
            sum.duplicates,
            sum.reordered,
            drops,
            rcvbuf,
            secs
        );
    } else {
        println!(
            "received {} (valid {}, corrupt {}), {} of {} groups seen, lost {} in {} groups [{}], excluded lost {}, duplicates {}, reordered {}, kernel drops {drops}",
            t.received,
            t.valid,
            t.corrupt,
            sum.groups_seen,
            a.groups,
            sum.lost,
            sum.lossy_groups,
            lossy.join(" "),
            sum.excluded_lost,
            sum.duplicates,
            sum.reordered,
        );
    }
    Ok(())
}
