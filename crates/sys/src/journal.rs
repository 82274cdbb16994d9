//! Whether stderr is systemd's journal stream, and the syslog priority a
//! line's `<N>` prefix gives it there. Shared by the daemon's log format
//! and the helper program's, which write to the same inherited stream.
//!
//! Under systemd, stderr is a stream socket into journald and
//! `JOURNAL_STREAM=dev:ino` names it; the variable can be inherited by a
//! process whose stderr was redirected elsewhere, so it is compared with
//! stderr's device and inode, as sd_journal_stream_fd(3) recommends.

use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;

use tracing::Level;

/// Whether stderr is the journal stream `JOURNAL_STREAM` names.
pub fn stderr_is_journal() -> bool {
    let Some(value) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some(named) = value.to_str().and_then(parse_journal_stream) else {
        return false;
    };
    let stderr = std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .map(std::fs::File::from)
        .and_then(|f| f.metadata());
    stderr.is_ok_and(|m| (m.dev(), m.ino()) == named)
}

/// `JOURNAL_STREAM`'s `device:inode`, both decimal.
pub fn parse_journal_stream(value: &str) -> Option<(u64, u64)> {
    let (dev, ino) = value.split_once(':')?;
    Some((dev.parse().ok()?, ino.parse().ok()?))
}

/// The syslog priority journald reads from a line's `<N>` prefix.
pub fn priority(level: Level) -> u8 {
    match level {
        Level::ERROR => 3, // LOG_ERR
        Level::WARN => 4,  // LOG_WARNING
        Level::INFO => 6,  // LOG_INFO
        _ => 7,            // LOG_DEBUG: debug and trace
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_stream_is_device_colon_inode() {
        assert_eq!(parse_journal_stream("8:12345"), Some((8, 12345)));
        assert_eq!(parse_journal_stream("0:0"), Some((0, 0)));
        for bad in ["", "8", "8:", ":5", "a:b", "8:5:1", "-1:5"] {
            assert_eq!(parse_journal_stream(bad), None, "{bad:?}");
        }
    }
}
