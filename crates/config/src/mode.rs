//! `daemon.mode`: whether the daemon relays from the start (`"active"`,
//! the default) or starts as a warm standby (`"standby"`): every flow's
//! sockets open, groups joined and datagrams received, but nothing sent
//! until `mcrelayctl active`. It is the mode at start only: a reload keeps
//! the mode the daemon is in (`mcrelayctl active|standby` changes it at
//! run time; see docs/operations.md, "More than one host").

//!
//! One type for the mode wherever it appears: the config's `daemon.mode`,
//! the mode a running daemon is in (its snapshot, `mcrelayctl
//! standby|active`, the metrics), on the control socket as the same
//! lower-case word.

use std::fmt;

/// `daemon.mode`, and the mode the daemon is in.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Relay every flow (the default; older daemons, which have no
    /// standby, are always this).
    #[default]
    Active,
    /// Receive and count, send nothing.
    Standby,
}

impl Mode {
    /// Every mode, in the order error messages list them.
    pub const ALL: [Mode; 2] = [Mode::Active, Mode::Standby];

    /// The word in the config file and on the control socket.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Active => "active",
            Mode::Standby => "standby",
        }
    }

    /// The mode named `word`, if any (exact, lower case).
    pub fn from_word(word: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.as_str() == word)
    }

    pub fn is_standby(self) -> bool {
        self == Mode::Standby
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_active_is_the_default() {
        for m in Mode::ALL {
            assert_eq!(Mode::from_word(m.as_str()), Some(m));
        }
        assert_eq!(Mode::from_word("Standby"), None);
        assert_eq!(Mode::from_word("backup"), None);
        assert_eq!(Mode::default(), Mode::Active);
        assert!(Mode::Standby.is_standby());
        assert!(!Mode::Active.is_standby());
    }
}
