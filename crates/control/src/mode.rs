//! Warm standby on the control plane: the daemon's [`Mode`] as snapshots,
//! tables and metrics show it, and what `standby` and `active` answer
//! ([`ModeOutcome`]).
//!
//! A daemon in standby has every flow's sockets open, its groups joined
//! and its datagrams received and counted (`standby_discarded`), but sends
//! nothing; `active` makes its workers relay from their next datagram.
//! keepalived's notify script calls `mcrelayctl active|standby` (see
//! deploy/keepalived/ and docs/operations.md, "More than one host").

use serde::{Deserialize, Serialize};

pub use mcrelay_config::Mode;

/// The answer to `standby` or `active`: sent once every worker has taken
/// the new mode (from its next datagram on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModeOutcome {
    /// The mode now in force.
    pub mode: Mode,
    /// The mode before the request (equal to `mode` when it changed
    /// nothing: both commands are idempotent).
    pub previous: Mode,
    /// Workers that confirmed the mode.
    pub workers: usize,
}

impl ModeOutcome {
    /// One line for `mcrelayctl`: `active (was standby; 2 workers)`.
    pub fn describe(&self) -> String {
        let workers = match self.workers {
            1 => "1 worker".to_owned(),
            n => format!("{n} workers"),
        };
        if self.mode == self.previous {
            format!("{} (already; {workers})", self.mode)
        } else {
            format!("{} (was {}; {workers})", self.mode, self.previous)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_lower_case_words_on_the_wire() {
        assert_eq!(
            serde_json::to_string(&Mode::Standby).unwrap(),
            "\"standby\""
        );
        assert_eq!(serde_json::to_string(&Mode::Active).unwrap(), "\"active\"");
        assert_eq!(
            serde_json::from_str::<Mode>("\"standby\"").unwrap(),
            Mode::Standby
        );
        assert!(serde_json::from_str::<Mode>("\"Standby\"").is_err());
        assert_eq!(Mode::default(), Mode::Active);
    }

    #[test]
    fn outcomes_describe_themselves() {
        let o = ModeOutcome {
            mode: Mode::Active,
            previous: Mode::Standby,
            workers: 2,
        };
        assert_eq!(o.describe(), "active (was standby; 2 workers)");
        let o = ModeOutcome {
            mode: Mode::Standby,
            previous: Mode::Standby,
            workers: 1,
        };
        assert_eq!(o.describe(), "standby (already; 1 worker)");
        let json = serde_json::to_string(&o).unwrap();
        assert_eq!(
            json,
            r#"{"mode":"standby","previous":"standby","workers":1}"#
        );
    }
}
