//! The seed buffer-pool experiment (`shared/seeds/relay-buffer-pool-poc.md`)
//! rerun against mcrelay's pool: one subcommand per scenario, each printing
//! the rows that go into `docs/benchmarks.md`. `run.sh` runs them all.
//! Not part of the relay; nothing here is on the packet path.

mod exhaustion;
mod latency;
mod packet_loop;
mod tsc;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(about = "mcrelay buffer-pool experiment (seed scenarios 1-6)")]
struct Cli {
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Debug, Subcommand)]
enum Scenario {
    /// 1: per-operation latency histogram (p50/p95/p99/p999) of take+give.
    Latency {
        #[arg(long, default_value_t = 10_000_000)]
        pairs: usize,
    },
    /// 2 and 5: sustained take+give pairs per second on one core.
    Throughput {
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
    },
    /// 3: latency against the pool's size.
    Scaling {
        #[arg(long, default_value_t = 2_000_000)]
        pairs: usize,
    },
    /// 4: bursts of 2x/5x/10x the drain rate, then recovery.
    Exhaustion,
    /// 6: a packet-like loop for cachegrind (take, copy 1316 B, read, give).
    PacketLoop {
        #[arg(long, value_enum)]
        with: Memory,
        #[arg(long, default_value_t = 200_000)]
        packets: usize,
    },
}

/// Where packet memory comes from in the packet loop.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum Memory {
    Pool,
    Alloc,
}

fn main() {
    match Cli::parse().scenario {
        Scenario::Latency { pairs } => latency::histograms(pairs),
        Scenario::Throughput { seconds } => latency::throughput(seconds),
        Scenario::Scaling { pairs } => latency::scaling(pairs),
        Scenario::Exhaustion => exhaustion::run(),
        Scenario::PacketLoop { with, packets } => packet_loop::run(with, packets),
    }
}
