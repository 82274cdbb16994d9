//! `mcrelayd check --config FILE`: validate a configuration file without
//! touching the network and, unless `--offline`, against this host: every
//! limit the daemon enforces at start is enforced here too (issue 27), so a
//! file that checks starts.
//!
//! On this host: the file descriptors this process could raise its limit
//! to; `daemon.cores` (and every `spread`) within the CPUs this process may
//! run on; `daemon.user` existing; no output sending to one of this host's
//! own addresses at a port a flow receives on (a loop the file alone can't
//! show). Interfaces that don't exist yet are a warning: a flow waits for
//! its interface.

use std::io::Write;
use std::net::IpAddr;
use std::path::Path;
use std::process::ExitCode;

use mcrelay_config::Config;

/// What the host-side checks found: errors fail the check, warnings don't.
#[derive(Debug, Default)]
struct Findings {
    errors: Vec<String>,
    warnings: Vec<String>,
}

/// Checks the file at `path` (and, unless `offline`, this host). Prints the
/// summary on stdout (warnings on stderr) and returns success, or prints
/// every error on stderr and returns failure (1).
pub fn run(path: &Path, offline: bool) -> ExitCode {
    match mcrelay_config::load(path) {
        Ok(config) => {
            let mut found = Findings::default();
            if !offline {
                // The limit the daemon would raise its soft limit to, started
                // like this process (under systemd: LimitNOFILE=).
                let limit = crate::fdbudget::limits().map_or(u64::MAX, |(_, hard)| hard);
                if let Err(e) = crate::fdbudget::check(path, &config, limit) {
                    found.errors.push(e.to_string());
                }
                on_this_host(&config, &mut found, &is_local);
            }
            let prefix = crate::journal::error_prefix();
            let mut err = std::io::stderr().lock();
            for w in &found.warnings {
                let _ = writeln!(err, "{}: warning: {w}", path.display());
            }
            if found.errors.is_empty() {
                // A closed stdout is not the config's fault; ignore write
                // errors.
                let _ = writeln!(std::io::stdout(), "{}", config.summary());
                ExitCode::SUCCESS
            } else {
                for e in &found.errors {
                    let _ = writeln!(err, "{prefix}{}: {e}", path.display());
                }
                let _ = writeln!(
                    err,
                    "{prefix}mcrelayd: nothing was changed (`--offline` checks the file alone, for another host)"
                );
                ExitCode::FAILURE
            }
        }
        Err(errors) => {
            // `<3>` under systemd (ExecStartPre): error priority in the journal.
            let prefix = crate::journal::error_prefix();
            let mut err = std::io::stderr().lock();
            for e in &errors {
                for line in e.to_string().lines() {
                    let _ = writeln!(err, "{prefix}{line}");
                }
            }
            let n = errors.len();
            let _ = writeln!(
                err,
                "{prefix}mcrelayd: {} has {n} error{}; nothing was changed",
                path.display(),
                if n == 1 { "" } else { "s" }
            );
            ExitCode::FAILURE
        }
    }
}

/// Whether `address` is one of this host's own (assigned to an interface,
/// or loopback).
fn is_local(address: IpAddr) -> bool {
    let address = address.to_canonical();
    address.is_loopback() || mcrelay_sys::net::index_of_address(address).is_ok()
}

/// The checks that need this host: CPUs, the user, interfaces, outputs to
/// this host's own addresses (`local` tells which are).
fn on_this_host(config: &Config, found: &mut Findings, local: &dyn Fn(IpAddr) -> bool) {
    match crate::daemon::worker_cpus(config) {
        Ok(cpus) => {
            if let Err(e) = crate::daemon::spread_fits(config, cpus.len()) {
                found.errors.push(e.to_string());
            }
            for f in config.flows.iter() {
                if let Some(core) = f.core.filter(|c| !cpus.contains(c)) {
                    found.errors.push(format!(
                        "flow {:?}: core {core} is not one of the worker CPUs {cpus:?} on this host",
                        f.name
                    ));
                }
            }
        }
        Err(e) => found.errors.push(format!("daemon.cores: {e}")),
    }
    let user = &config.daemon.user;
    match mcrelay_sys::privileges::lookup_user(user) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => found.errors.push(format!(
            "daemon.user {user:?} does not exist on this host; create it \
             (systemd-sysusers deploy/mcrelay.sysusers, or the Debian package does) or name another"
        )),
        Err(e) => found
            .errors
            .push(format!("daemon.user {user:?}: looking it up failed: {e}")),
    }
    let mut missing: Vec<&str> = Vec::new();
    for f in config.flows.iter() {
        // SRT inputs and outputs name no interface.
        for name in f.interfaces() {
            if !missing.contains(&name) && mcrelay_sys::net::interface_index(name).is_err() {
                missing.push(name);
                found.warnings.push(format!(
                    "interface {name:?} (flow {:?}) does not exist on this host; its flows wait for it",
                    f.name
                ));
            }
        }
    }
    // An output to this host itself at a port some flow receives on: the
    // datagram may come straight back in (a unicast input on another of
    // the host's addresses, or bound where this host's routing delivers).
    let ports: Vec<(u16, &str)> = config
        .flows
        .iter()
        .flat_map(|f| f.inputs.iter().map(|i| (i.port, f.name.as_str())))
        .collect();
    for f in config.flows.iter() {
        for (i, o) in f.outputs.iter().enumerate() {
            if o.address.to_canonical().is_multicast() || !local(o.address) {
                continue;
            }
            if let Some((_, into)) = ports.iter().find(|(p, _)| *p == o.port) {
                found.errors.push(format!(
                    "flow {:?}: outputs[{i}] ({o}) sends to this host's own address at port {}, \
                     where flow {into:?} receives, which would loop; change the address or port",
                    f.name, o.port
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        mcrelay_config::parse(text, "t.toml").unwrap_or_else(|e| panic!("{e}"))
    }

    const DAEMON: &str = "[daemon]\nuser = \"root\"\n";

    #[test]
    fn cpus_that_do_not_exist_here_are_errors() {
        let c = config(&format!("{DAEMON}cores = [0, 8191]\n"));
        let mut found = Findings::default();
        on_this_host(&c, &mut found, &|_| false);
        assert_eq!(found.errors.len(), 1, "{found:?}");
        assert!(found.errors[0].starts_with("daemon.cores: "), "{found:?}");
        assert!(found.errors[0].contains("8191"), "{found:?}");
    }

    #[test]
    fn a_missing_user_is_an_error_a_missing_interface_a_warning() {
        let c = config(
            "[daemon]\nuser = \"mcrelay-no-such-user-27\"\n[[flow]]\nname = \"f\"\n\
             input = { interface = \"lo\", address = \"239.1.1.1\", port = 5000 }\n\
             outputs = [{ interface = \"nosuchif27\", address = \"239.2.2.2\", port = 5000 }]\n",
        );
        let mut found = Findings::default();
        on_this_host(&c, &mut found, &|_| false);
        assert_eq!(found.errors.len(), 1, "{found:?}");
        assert!(
            found.errors[0].contains("mcrelay-no-such-user-27"),
            "{found:?}"
        );
        assert_eq!(found.warnings.len(), 1, "{found:?}");
        assert!(found.warnings[0].contains("nosuchif27"), "{found:?}");
    }

    #[test]
    fn an_output_to_this_host_at_an_input_port_is_a_loop() {
        let text = format!(
            "{DAEMON}[[flow]]\nname = \"f\"\n\
             input = {{ interface = \"lo\", address = \"10.9.9.1\", port = 5000 }}\n\
             outputs = [{{ interface = \"lo\", address = \"10.9.9.2\", port = 5000 }}, \
             {{ interface = \"lo\", address = \"10.9.9.2\", port = 6000 }}, \
             {{ interface = \"lo\", address = \"10.9.9.3\", port = 5000 }}]\n"
        );
        let c = config(&text);
        let mut found = Findings::default();
        let local = |a: IpAddr| a == IpAddr::from([10, 9, 9, 2]);
        on_this_host(&c, &mut found, &local);
        assert_eq!(
            found.errors,
            [
                "flow \"f\": outputs[0] (lo 10.9.9.2:5000) sends to this host's own address at port 5000, \
              where flow \"f\" receives, which would loop; change the address or port"
            ]
        );
        // Loopback is this host's whatever is assigned.
        assert!(is_local(IpAddr::from([127, 0, 0, 9])));
        assert!(is_local("::ffff:127.0.0.1".parse().expect("addr")));
    }
}
