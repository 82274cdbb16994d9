//! `daemon.mode`: whether the daemon relays from the start (`"active"`,
//! the default) or starts as a warm standby (`"standby"`): every flow's
//! sockets open, groups joined and datagrams received, but nothing sent
//! until `mcrelayctl active`. It is the mode at start only: a reload keeps
//! the mode the daemon is in (`mcrelayctl active|standby` changes it at
//! run time; see docs/operations.md, "More than one host").

use std::fmt;

/// `daemon.mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum RelayMode {
    /// Relay every flow (the default).
    #[default]
    Active,
    /// Receive and count, send nothing.
    Standby,
}

impl RelayMode {
    /// Every mode, in the order error messages list them.
    pub const ALL: [RelayMode; 2] = [RelayMode::Active, RelayMode::Standby];

    /// The word in the config file and on the control socket.
    pub fn as_str(self) -> &'static str {
        match self {
            RelayMode::Active => "active",
            RelayMode::Standby => "standby",
        }
    }

    /// The mode named `word`, if any (exact, lower case).
    pub fn from_word(word: &str) -> Option<RelayMode> {
        RelayMode::ALL.into_iter().find(|m| m.as_str() == word)
    }

    pub fn is_standby(self) -> bool {
        self == RelayMode::Standby
    }
}

impl fmt::Display for RelayMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_active_is_the_default() {
        for m in RelayMode::ALL {
            assert_eq!(RelayMode::from_word(m.as_str()), Some(m));
        }
        assert_eq!(RelayMode::from_word("Standby"), None);
        assert_eq!(RelayMode::from_word("backup"), None);
        assert_eq!(RelayMode::default(), RelayMode::Active);
        assert!(RelayMode::Standby.is_standby());
        assert!(!RelayMode::Active.is_standby());
    }
}
