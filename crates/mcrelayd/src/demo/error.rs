//! What stops a demo run once its namespaces exist. Each message names the
//! step; an I/O error keeps its source.

use std::process::ExitStatus;
use std::time::Duration;

/// Why the demo failed (exit status 1).
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// A file, process or socket operation failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// An operation whose own error already names what it did.
    #[error(transparent)]
    Sys(#[from] std::io::Error),
    /// `--duration` is not a representable duration.
    #[error("bad --duration: {0}")]
    Duration(#[source] std::time::TryFromFloatSecsError),
    /// The control socket could not be asked, answered something
    /// unexpected, or an error.
    #[error(transparent)]
    Control(#[from] mcrelay_control::client::AskError),
    /// SIGINT, SIGTERM or SIGHUP while the daemon was starting.
    #[error("interrupted while mcrelayd was starting")]
    Interrupted,
    /// The daemon exited before the demo was over.
    #[error("mcrelayd exited ({status}) while {when}\n{log}")]
    DaemonExited {
        status: ExitStatus,
        when: &'static str,
        log: String,
    },
    /// The daemon never answered on its control socket.
    #[error("mcrelayd did not answer on its control socket within {timeout:?}\n{log}")]
    DaemonSilent { timeout: Duration, log: String },
    /// A sender or receiver thread failed or ended early (its own error,
    /// already rendered, crossed the thread boundary as text).
    #[error("{0}")]
    Thread(String),
}

/// `.ctx(|| "what was done")` on an I/O result.
pub trait IoContext<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T, DemoError>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T, DemoError> {
        self.map_err(|source| DemoError::Io {
            what: what(),
            source,
        })
    }
}
