//! `nfdelay`: hold every packet an iptables `NFQUEUE` rule hands it for a
//! fixed time, then let it go on: the delay half of a test link, since this
//! kernel has no netem (loss stays `iptables -m statistic ... -j DROP`).
//!
//! ```text
//! ip netns exec ROUTER iptables -A FORWARD -j NFQUEUE --queue-num 7
//! ip netns exec ROUTER nfdelay --queue 7 --delay-ms 20
//! ```
//!
//! It prints `nfdelay: ready` once bound (tests wait for that line), holds at
//! most `--max-held` packets (the next one is accepted at once and counted
//! as `overflow`), and prints what it did when stdin closes or it is
//! terminated. Run it in the namespace whose rule feeds it.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nfq::{Queue, Verdict};

const USAGE: &str = "usage: nfdelay --queue N --delay-ms MS [--max-held PACKETS]\n\
     Holds each packet the iptables NFQUEUE rule N hands over for MS ms, then accepts it.";

/// What the command line asks for.
#[derive(Debug)]
struct Args {
    queue: u16,
    delay: Duration,
    max_held: usize,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let (mut queue, mut delay, mut max_held) = (None, None, 65_536usize);
    while let Some(flag) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match flag.as_str() {
            "--queue" => {
                queue = Some(
                    value("--queue")?
                        .parse()
                        .map_err(|e| format!("--queue: {e}"))?,
                )
            }
            "--delay-ms" => {
                let ms: u64 = value("--delay-ms")?
                    .parse()
                    .map_err(|e| format!("--delay-ms: {e}"))?;
                delay = Some(Duration::from_millis(ms));
            }
            "--max-held" => {
                max_held = value("--max-held")?
                    .parse()
                    .map_err(|e| format!("--max-held: {e}"))?
            }
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    Ok(Args {
        queue: queue.ok_or(format!("--queue is required\n{USAGE}"))?,
        delay: delay.ok_or(format!("--delay-ms is required\n{USAGE}"))?,
        max_held: max_held.max(1),
    })
}

fn main() {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(msg) => {
            eprintln!("{msg}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&args) {
        eprintln!("nfdelay: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> std::io::Result<()> {
    let mut queue = Queue::open()?;
    queue.bind(args.queue)?;
    // Only the verdict travels back; 64 bytes of each packet are enough.
    queue.set_copy_range(args.queue, 64)?;
    queue.set_queue_max_len(args.queue, u32::try_from(args.max_held).unwrap_or(u32::MAX))?;
    queue.set_nonblocking(true);

    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&stop))?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&stop))?;
    // A parent that goes away (its end of our stdin closes) ends us too.
    let orphaned = Arc::clone(&stop);
    std::thread::spawn(move || {
        let mut sink = [0u8; 64];
        while let Ok(n) = std::io::stdin().read(&mut sink) {
            if n == 0 {
                break;
            }
        }
        orphaned.store(true, Ordering::Relaxed);
    });
    println!(
        "nfdelay: ready (queue {}, delay {} ms)",
        args.queue,
        args.delay.as_millis()
    );

    let mut held = VecDeque::with_capacity(args.max_held);
    let (mut delayed, mut overflow) = (0u64, 0u64);
    while !stop.load(Ordering::Relaxed) {
        loop {
            match queue.recv() {
                Ok(mut msg) => {
                    if held.len() >= args.max_held {
                        msg.set_verdict(Verdict::Accept);
                        queue.verdict(msg)?;
                        overflow += 1;
                    } else {
                        held.push_back((Instant::now() + args.delay, msg));
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => break,
                Err(e) => return Err(e),
            }
        }
        let now = Instant::now();
        while held.front().is_some_and(|(due, _)| *due <= now) {
            if let Some((_, mut msg)) = held.pop_front() {
                msg.set_verdict(Verdict::Accept);
                queue.verdict(msg)?;
                delayed += 1;
            }
        }
        // Sleep until the next packet is due, but look for arrivals every
        // 200 us: the delay is exact to about that.
        let next = held.front().map_or(Duration::from_micros(200), |(due, _)| {
            due.saturating_duration_since(now)
                .min(Duration::from_micros(200))
        });
        std::thread::sleep(next);
    }
    eprintln!(
        "nfdelay: delayed {delayed}, overflow {overflow}, still held {}",
        held.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Args, String> {
        parse_args(line.split_whitespace().map(str::to_owned))
    }

    #[test]
    fn the_queue_and_the_delay_are_required() {
        assert!(
            parse("--queue 3")
                .unwrap_err()
                .contains("--delay-ms is required")
        );
        assert!(
            parse("--delay-ms 20")
                .unwrap_err()
                .contains("--queue is required")
        );
        let args = parse("--queue 3 --delay-ms 20 --max-held 10").unwrap();
        assert_eq!(
            (args.queue, args.delay, args.max_held),
            (3, Duration::from_millis(20), 10)
        );
    }

    #[test]
    fn bad_values_are_refused_with_the_flag_named() {
        assert!(
            parse("--queue 70000 --delay-ms 1")
                .unwrap_err()
                .starts_with("--queue")
        );
        assert!(
            parse("--queue 1 --delay-ms soon")
                .unwrap_err()
                .starts_with("--delay-ms")
        );
        assert!(
            parse("--queue 1 --delay-ms 1 --bogus")
                .unwrap_err()
                .contains("unknown argument")
        );
    }
}
