//! `mcrelayd check --config FILE`: validate a configuration file without
//! touching the network, and check that its flows fit in the file
//! descriptors this process could raise its limit to.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

/// Checks the file at `path`. Prints the summary on stdout and returns
/// success, or prints every error on stderr and returns failure (1).
pub fn run(path: &Path) -> ExitCode {
    match mcrelay_config::load(path) {
        Ok(config) => {
            // The limit the daemon would raise its soft limit to, started
            // like this process (under systemd: LimitNOFILE=).
            let limit = crate::fdbudget::limits().map_or(u64::MAX, |(_, hard)| hard);
            match crate::fdbudget::check(path, &config, limit) {
                Ok(_) => {
                    // A closed stdout is not the config's fault; ignore
                    // write errors.
                    let _ = writeln!(std::io::stdout(), "{}", config.summary());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    let _ = writeln!(std::io::stderr(), "{e}\nmcrelayd: nothing was changed");
                    ExitCode::FAILURE
                }
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
