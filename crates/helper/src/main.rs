//! `mcrelay-helper`: mcrelay's privileged zygote and the helpers it forks.
//!
//! Started by `mcrelayd` only, with its end of the connection on fd 3:
//!
//! ```text
//! mcrelay-helper --config FILE [--user USER]
//! ```
//!
//! `--config`: the configuration file the helper enforces (it reads it
//! itself; a request names a flow in it). `--user`: when started as root,
//! the service user the zygote becomes, keeping only the network
//! capabilities. Installed as `/usr/libexec/mcrelay/mcrelay-helper`: not a
//! command for people, so not on `PATH`.
#![deny(unsafe_code)]

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: mcrelay-helper --config FILE [--user USER]\n\
    (started by mcrelayd, its connection on fd 3; not a command to run by hand)";

/// The two options, each once; nothing else.
#[derive(Debug, PartialEq, Eq)]
struct Args {
    config: PathBuf,
    user: Option<String>,
}

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
enum Parsed {
    Run(Args),
    Version,
}

fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Parsed, String> {
    let mut args = args.into_iter();
    let (mut config, mut user) = (None, None);
    while let Some(arg) = args.next() {
        let arg = arg
            .into_string()
            .map_err(|a| format!("argument {a:?} is not UTF-8"))?;
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_owned(), Some(v.to_owned())),
            _ => (arg, None),
        };
        let mut value = || match inline.clone() {
            Some(v) => Ok(v),
            None => args
                .next()
                .and_then(|v| v.into_string().ok())
                .ok_or_else(|| format!("{name} needs a UTF-8 value")),
        };
        match name.as_str() {
            "--version" | "-V" => return Ok(Parsed::Version),
            "--config" if config.is_none() => config = Some(PathBuf::from(value()?)),
            "--user" if user.is_none() => user = Some(value()?),
            "--config" | "--user" => return Err(format!("{name} given twice")),
            other => return Err(format!("unexpected argument {other:?}")),
        }
    }
    let config = config.ok_or("--config FILE is required")?;
    Ok(Parsed::Run(Args { config, user }))
}

fn main() -> ExitCode {
    let args = match parse(std::env::args_os().skip(1)) {
        Ok(Parsed::Run(args)) => args,
        Ok(Parsed::Version) => {
            println!("mcrelay-helper {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("mcrelay-helper: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    // The daemon's log level (`daemon.log_level`) from the file the helper
    // serves; the helper re-reads it (and reports errors) when it starts.
    // Reading it here closes the file again before sanitize_process.
    let level = mcrelay_config::load(&args.config).map_or_else(
        |_| mcrelay_config::DEFAULT_LOG_LEVEL.to_owned(),
        |c| c.daemon.log_level,
    );
    mcrelay_helper::log::init(&level);
    // SAFETY: called first thing in a process that owns no fds but the
    // standard three and the connection the daemon put on fd 3 (the config
    // file read above is closed again; the log subscriber holds no fd).
    // Closing every other fd is exactly what is wanted.
    #[allow(unsafe_code)]
    let served = unsafe {
        mcrelay_helper::run_zygote(
            mcrelay_sockets::HELPER_FD,
            &args.config,
            args.user.as_deref(),
        )
    };
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let prefix = if mcrelay_sys::journal::stderr_is_journal() {
                "<3>"
            } else {
                ""
            };
            for line in e.to_string().lines() {
                eprintln!("{prefix}mcrelay-helper: {line}");
            }
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Parsed, String> {
        parse(args.iter().map(OsString::from))
    }

    #[test]
    fn takes_exactly_its_two_options() {
        assert_eq!(
            run(&["--config", "/etc/mcrelay/mcrelay.toml", "--user", "mcrelay"]),
            Ok(Parsed::Run(Args {
                config: "/etc/mcrelay/mcrelay.toml".into(),
                user: Some("mcrelay".into())
            }))
        );
        assert_eq!(
            run(&["--config=/c.toml"]),
            Ok(Parsed::Run(Args {
                config: "/c.toml".into(),
                user: None
            }))
        );
        assert_eq!(run(&["--version"]), Ok(Parsed::Version));
        for bad in [
            &[][..],
            &["--user", "x"],
            &["--config"],
            &["--config", "a", "--config", "b"],
            &["--config", "a", "helper"],
            &["-c", "a"],
        ] {
            assert!(run(bad).is_err(), "{bad:?}");
        }
    }
}
