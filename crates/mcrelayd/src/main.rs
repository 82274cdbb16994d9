//! `mcrelayd`: the mcrelay daemon's command line.
//!
//! `mcrelayd --config FILE` runs the relay in the foreground until SIGTERM
//! or SIGINT. `mcrelayd check --config FILE` validates a configuration file
//! and exits. `mcrelayd demo` (as root) shows the relay at work in
//! throwaway network namespaces and removes them again.
#![deny(unsafe_code)]

mod chain;
mod check;
mod control;
mod daemon;
mod demo;
mod fdbudget;
mod hardening;
mod health;
mod journal;
mod kernel_limits;
mod loopguard;
mod manpage;
mod metrics;
mod neighbour;
mod netlink;
mod notify;
mod outputs;
mod peercred;
mod run;
mod socketfile;
mod sockets;
mod srt;

/// The rtnetlink link-message parser and link table, pure, in the wire
/// crate so a fuzzer can reach it.
use mcrelay_wire::rtnetlink as links;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Default configuration file.
const DEFAULT_CONFIG: &str = "/etc/mcrelay/mcrelay.toml";

#[derive(Debug, Parser)]
#[command(name = "mcrelayd", version, about = "Linux multicast relay daemon")]
struct Cli {
    /// Configuration file for running the relay.
    #[arg(long, value_name = "FILE", default_value = DEFAULT_CONFIG)]
    config: PathBuf,

    /// How workers receive: `auto` probes for multishot receive with
    /// provided buffers and falls back; `single` forces re-armed single
    /// receives (the fallback path, for tests and old kernels).
    #[arg(long, value_enum, default_value_t = Receive::Auto)]
    receive: Receive,

    /// Send runs of same-size datagrams as one UDP GSO send (`on`, where
    /// the kernel takes it) or every datagram on its own (`off`, for
    /// comparisons).
    #[arg(long, value_enum, default_value_t = Gso::On)]
    gso: Gso,

    /// The privileged helper program to start when mcrelayd has
    /// privileges to hand over [default: mcrelay-helper beside this
    /// executable if there is one, else
    /// /usr/libexec/mcrelay/mcrelay-helper].
    #[arg(long, value_name = "FILE")]
    helper: Option<PathBuf>,

    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Receive {
    Auto,
    Single,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Gso {
    On,
    Off,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate a configuration file: print a one-line summary and exit 0,
    /// or print every error (file:line:column: message) and exit 1.
    Check {
        /// The configuration file to check.
        #[arg(long, value_name = "FILE", default_value = DEFAULT_CONFIG)]
        config: PathBuf,
        /// Check the file alone, not this host (its CPUs, the service
        /// user, interfaces, file descriptor limit, own addresses): for a
        /// file meant for another host.
        #[arg(long)]
        offline: bool,
    },
    /// Show mcrelay at work, then clean up (needs root and iproute2):
    /// build three throwaway network namespaces (sender, relay, receivers),
    /// run this daemon between them with a built-in config (a 1-to-1 flow
    /// and a 1-to-3 fan-out with group rewrite), send a paced stream,
    /// show the live view `mcrelayctl top` shows, then print what was
    /// sent, relayed and received byte-exact per output. Exits 0 only if
    /// every output received everything; 2 if it cannot run here.
    Demo(demo::DemoArgs),
    /// Print a manual page in roff: mcrelayd(8) (generated from the same
    /// definitions as --help) or, with `--config-file`, mcrelay.toml(5)
    /// (from docs/configuration.md).
    #[command(hide = true)]
    Man {
        #[arg(long)]
        config_file: bool,
    },
    /// Print the completion script for a shell (bash, zsh, fish, ...),
    /// generated from the same definitions as --help.
    #[command(hide = true)]
    Completions { shell: clap_complete::Shell },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Check { config, offline }) => check::run(&config, offline),
        Some(Command::Man { config_file }) => man(config_file),
        Some(Command::Completions { shell }) => completions(shell),
        Some(Command::Demo(args)) => demo::run(&args),
        None => {
            let receive = match cli.receive {
                Receive::Auto => mcrelay_uring::ReceiveMode::Auto,
                Receive::Single => mcrelay_uring::ReceiveMode::Single,
            };
            let gso = cli.gso == Gso::On;
            run::run(
                &cli.config,
                cli.helper.as_deref(),
                daemon::RunOptions { receive, gso },
            )
        }
    }
}

/// mcrelayd(8), or mcrelay.toml(5), on stdout.
fn man(config_file: bool) -> ExitCode {
    use clap::CommandFactory;
    let out = &mut std::io::stdout().lock();
    let written = if config_file {
        manpage::config_page(out)
    } else {
        clap_mangen::Man::new(Cli::command())
            .section("8")
            .manual("mcrelay")
            .render(out)
    };
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mcrelayd man: {e}");
            ExitCode::from(1)
        }
    }
}

/// The completion script for `shell` on stdout.
fn completions(shell: clap_complete::Shell) -> ExitCode {
    use clap::CommandFactory;
    match mcrelay_control::completions::write(
        shell,
        "mcrelayd",
        &Cli::command(),
        &mut std::io::stdout().lock(),
    ) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mcrelayd completions: {e}");
            ExitCode::from(1)
        }
    }
}
