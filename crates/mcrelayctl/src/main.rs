//! `mcrelayctl`: the operator's client for a running `mcrelayd`, over its
//! control socket (never on the packet path). One JSON-lines request, one
//! reply; human tables by default, `--json` for scripts, and `top`, a live
//! view refreshed every second.
//!
//! ```text
//! mcrelayctl status
//! mcrelayctl flows
//! mcrelayctl stats --json
//! mcrelayctl reload        # exits 1 and prints the errors if the new config was rejected
//! mcrelayctl reload --allow-empty   # also apply a file with no flows (stops every flow)
//! mcrelayctl top
//! mcrelayctl flows --name 'cam-*' --state not-running
//! mcrelayctl stats --sort drops --limit 10
//! mcrelayctl standby       # warm standby: receive, send nothing
//! mcrelayctl active        # relay again (keepalived's notify script calls both)
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
mod mode;

use mcrelay_control::{
    Rates, ReloadOutcome, Request, Snapshot, decode_status, render_flows, render_stats,
    render_status,
};

mod select;
mod top;
use select::{SelectArgs, Selection};

/// Default `daemon.control_socket`.
const DEFAULT_SOCKET: &str = "/run/mcrelay/control.sock";

#[derive(Debug, Parser)]
#[command(
    name = "mcrelayctl",
    version,
    about = "Control and watch a running mcrelayd"
)]
struct Cli {
    /// The daemon's control socket.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_SOCKET, global = true)]
    socket: PathBuf,
    /// Seconds to wait for the daemon's answer.
    #[arg(long, default_value_t = 35.0, global = true)]
    timeout: f64,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Daemon state, uptime, workers, totals, and the flows that are not
    /// relaying, silent or counting stream errors (at most 20 named in
    /// each list; `flows --state not-running` lists them all).
    Status(StatusOutput),
    /// Per flow and output: packets, bytes, rates, drops by reason.
    Flows(Listing),
    /// Flows plus per-worker pool occupancy and loop counters.
    Stats(Listing),
    /// Re-read the configuration file and apply it; waits until done.
    /// Exits 1 (printing the errors) if the daemon rejected the file.
    ///
    /// A file with no flows is refused while flows are configured (it is
    /// most often one read half-written; replace config files atomically:
    /// write, then rename), unless --allow-empty is given.
    Reload {
        /// Print the daemon's reply (outcome and any errors) as JSON.
        #[arg(long)]
        json: bool,
        /// Apply the file even if it has no flows, stopping every flow.
        #[arg(long)]
        allow_empty: bool,
    },
    /// Warm standby: every flow keeps its sockets open and its groups
    /// joined and goes on receiving, but nothing is sent. Waits until every
    /// worker has the mode; idempotent.
    Standby {
        /// Print the daemon's reply as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Relay every flow (leave standby) from the next datagram on. Waits
    /// until every worker has the mode; idempotent.
    Active {
        /// Print the daemon's reply as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print this program's manual page, mcrelayctl(8), in roff
    /// (generated from the same definitions as --help).
    #[command(hide = true)]
    Man,
    /// Print the completion script for a shell (bash, zsh, fish, ...).
    #[command(hide = true)]
    Completions { shell: clap_complete::Shell },
    /// A live view of flows, rates, drops and pool occupancy per core.
    Top {
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
        /// Stop after this many refreshes (default: until Ctrl-C).
        #[arg(long)]
        iterations: Option<u64>,
        /// Print each refresh as text below the last instead of the
        /// interactive screen (the default when stdout is not a terminal).
        #[arg(long)]
        plain: bool,
    },
}

#[derive(Debug, clap::Args)]
struct Output {
    /// Print the daemon's snapshot as JSON (counters only; rates are the
    /// difference of two snapshots over their `taken_at_unix_ms`).
    #[arg(long)]
    json: bool,
    /// Seconds between the two samples the rates are computed from (0:
    /// no rates).
    #[arg(long, default_value_t = 0.5)]
    sample: f64,
}

/// `status`'s options.
#[derive(Debug, clap::Args)]
struct StatusOutput {
    /// Print the daemon's summary as JSON: state, totals, flows counted by
    /// state, the problem flows (at most 20 named per list, and how many
    /// more), workers and pools; `flows --json` has every flow.
    #[arg(long)]
    json: bool,
    /// Accepted for scripts written when `status` shared `flows`'
    /// options; `status` shows no rates.
    #[arg(long, hide = true)]
    sample: Option<f64>,
}

/// `flows` and `stats`: the output options and which flows to show.
#[derive(Debug, clap::Args)]
struct Listing {
    #[command(flatten)]
    output: Output,
    #[command(flatten)]
    select: SelectArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mcrelayctl: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: &Cli) -> anyhow::Result<ExitCode> {
    if let Cmd::Man = cli.command {
        use clap::CommandFactory;
        write_man_page(&Cli::command(), &mut std::io::stdout().lock())?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Cmd::Completions { shell } = cli.command {
        use clap::CommandFactory;
        mcrelay_control::completions::write(
            shell,
            "mcrelayctl",
            &Cli::command(),
            &mut std::io::stdout().lock(),
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    let timeout = Duration::try_from_secs_f64(cli.timeout).context("bad --timeout")?;
    let client = Client {
        socket: &cli.socket,
        timeout,
    };
    match &cli.command {
        Cmd::Status(o) => {
            let summary = decode_status(client.ask(Request::Status { summary: true })?)?;
            if o.json {
                println!("{}", serde_json::to_string_pretty(&summary)?);
            } else {
                print!("{}", render_status(&summary));
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Flows(l) => show(
            &client,
            Request::Flows,
            &l.output,
            &l.select.selection(),
            render_flows,
        ),
        Cmd::Stats(l) => show(
            &client,
            Request::Stats,
            &l.output,
            &l.select.selection(),
            render_stats,
        ),
        Cmd::Reload { json, allow_empty } => {
            let outcome: ReloadOutcome = client.ask(Request::Reload {
                allow_empty: *allow_empty,
            })?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&outcome)?);
            } else {
                print!("{}", render_reload(&outcome));
            }
            Ok(if outcome.applied && outcome.errors.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Cmd::Standby { json } => mode::set(&client, Request::Standby, *json),
        Cmd::Active { json } => mode::set(&client, Request::Active, *json),
        Cmd::Man | Cmd::Completions { .. } => Ok(ExitCode::SUCCESS),
        Cmd::Top {
            interval,
            iterations,
            plain,
        } => {
            let socket = cli.socket.clone();
            let options = top::Options {
                interval: Duration::try_from_secs_f64(interval.max(0.1))
                    .context("bad --interval")?,
                iterations: *iterations,
                plain: *plain,
            };
            top::run(options, move || {
                Client {
                    socket: &socket,
                    timeout,
                }
                .ask(Request::Stats)
            })?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn show(
    client: &Client<'_>,
    request: Request,
    o: &Output,
    select: &Selection,
    render: impl Fn(&Snapshot, Option<&Rates>) -> String,
) -> anyhow::Result<ExitCode> {
    let mut first: Snapshot = client.ask(request)?;
    if o.json && !select.needs_rates() {
        select.apply(&mut first, None);
        println!("{}", serde_json::to_string_pretty(&first)?);
        return Ok(ExitCode::SUCCESS);
    }
    if o.sample <= 0.0 {
        if select.needs_rates() {
            bail!("--sort rate needs rates: give --sample a positive number of seconds");
        }
        select.apply(&mut first, None);
        print!("{}", render(&first, None));
        return Ok(ExitCode::SUCCESS);
    }
    std::thread::sleep(Duration::try_from_secs_f64(o.sample).context("bad --sample")?);
    let mut second: Snapshot = client.ask(request)?;
    let rates = Rates::between(&first, &second);
    select.apply(&mut second, Some(&rates));
    if o.json {
        println!("{}", serde_json::to_string_pretty(&second)?);
    } else {
        print!("{}", render(&second, Some(&rates)));
    }
    Ok(ExitCode::SUCCESS)
}

fn render_reload(o: &ReloadOutcome) -> String {
    let mut s = String::new();
    if o.applied {
        s.push_str("reloaded\n");
    } else {
        s.push_str("reload rejected; the running configuration stays\n");
    }
    for (what, names) in [
        ("added", &o.added),
        ("removed", &o.removed),
        ("changed", &o.changed),
    ] {
        if !names.is_empty() {
            s.push_str(&format!("  {what}: {}\n", names.join(", ")));
        }
    }
    if o.applied {
        s.push_str(&format!("  unchanged: {}\n", o.unchanged));
    }
    for e in &o.errors {
        s.push_str(&format!("  error: {e}\n"));
    }
    s
}

struct Client<'a> {
    socket: &'a Path,
    timeout: Duration,
}

impl Client<'_> {
    /// Send one request and decode its reply.
    fn ask<T: serde::de::DeserializeOwned>(&self, request: Request) -> anyhow::Result<T> {
        Ok(mcrelay_control::client::ask(
            self.socket,
            &request,
            self.timeout,
        )?)
    }
}

/// mcrelayctl(8): clap_mangen's page, plus a section per subcommand with
/// its own options (clap_mangen lists subcommands but not their flags).
fn write_man_page(cmd: &clap::Command, out: &mut impl Write) -> std::io::Result<()> {
    clap_mangen::Man::new(cmd.clone())
        .section("8")
        .manual("mcrelay")
        .render(out)?;
    writeln!(out, ".SH \"SUBCOMMAND OPTIONS\"")?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let args: Vec<_> = sub
            .get_arguments()
            .filter(|a| !a.is_hide_set() && a.get_long().is_some_and(|l| l != "help"))
            .collect();
        if args.is_empty() {
            continue;
        }
        writeln!(out, ".SS \"mcrelayctl {}\"", sub.get_name())?;
        for arg in args {
            let long = arg.get_long().unwrap_or_default();
            writeln!(
                out,
                ".TP\n\\fB\\-\\-{}\\fR",
                mcrelay_control::roff::escape(long)
            )?;
            if let Some(help) = arg.get_help() {
                writeln!(out, "{}", mcrelay_control::roff::escape(&help.to_string()))?;
            }
        }
    }
    Ok(())
}
