//! Log output, for a terminal or for systemd's journal.
//!
//! Under systemd, stderr is a stream socket into journald and
//! `JOURNAL_STREAM=dev:ino` names it. journald gives every line the
//! priority its `<N>` prefix says (`SyslogLevelPrefix=`, on by default;
//! sd-daemon(3)) and `PRIORITY=6` (info) to a line without one, so without
//! prefixes `journalctl -p warning` would show none of our warnings. When
//! stderr *is* that stream (the variable can be inherited by a process whose
//! stderr was redirected elsewhere, so it is compared with stderr's device
//! and inode, as sd_journal_stream_fd(3) recommends), every line gets the
//! prefix of its level, no timestamp (the journal keeps its own) and no ANSI
//! colour. Otherwise lines are tracing's usual format, coloured only on a
//! terminal.
//!
//! Prefixes rather than the native journal protocol (tracing-journald):
//! the stream is already open in both the daemon and the privileged helper,
//! which closes every inherited fd but 0-2 and its connection, and it needs
//! no dependency, no extra socket and nothing from the sandbox. Structured
//! fields stay in the message text, as on a terminal.

use std::fmt;

use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::{FmtContext, format};
use tracing_subscriber::registry::LookupSpan;

/// Install the process's log subscriber: `RUST_LOG` if set, else `level`
/// (`daemon.log_level`), written to stderr for the journal or a terminal.
/// A second call does nothing.
pub fn init(level: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if stderr_is_journal() {
        builder
            .with_ansi(false)
            .event_format(Prefixed(format().without_time()))
            .try_init()
    } else {
        builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init()
    };
}

/// The prefix for an error line written to stderr without tracing
/// (`mcrelayd check`): `<3>` when stderr is the journal, else nothing.
pub fn error_prefix() -> &'static str {
    if stderr_is_journal() { "<3>" } else { "" }
}

/// Write `message` to stderr as an error without tracing (before the
/// subscriber exists, or in a process that has none): each line with the
/// journal's `<3>` prefix when stderr is the journal, plain otherwise.
pub fn eprint_error(message: &dyn fmt::Display) {
    use std::io::Write;
    let prefix = error_prefix();
    let text = message.to_string();
    let mut err = std::io::stderr().lock();
    for line in text.lines() {
        let _ = writeln!(err, "{prefix}{line}");
    }
}

use mcrelay_sys::journal::{priority, stderr_is_journal};

/// An event format that puts the level's `<N>` on each line the inner
/// format writes (a message with newlines becomes several journal entries,
/// each at the event's priority).
struct Prefixed<F>(F);

impl<S, N, F> FormatEvent<S, N> for Prefixed<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        // Writer::new has no ANSI: the inner format writes plain text.
        let mut text = String::new();
        self.0.format_event(ctx, Writer::new(&mut text), event)?;
        let n = priority(*event.metadata().level());
        for line in text.lines() {
            writeln!(writer, "<{n}>{line}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What the journal format writes for the events `emit` logs, with
    /// ANSI asked for (it must not appear).
    fn journal_output(emit: impl FnOnce()) -> String {
        let captured = Captured::default();
        let sink = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(EnvFilter::new("debug"))
            .with_writer(move || sink.clone())
            .with_ansi(true)
            .event_format(Prefixed(format().without_time()))
            .finish();
        tracing::subscriber::with_default(subscriber, emit);
        String::from_utf8(captured.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn each_level_gets_its_syslog_prefix_without_colour() {
        let out = journal_output(|| {
            tracing::error!("the helper exited");
            tracing::warn!(flow = "a", "interface down");
            tracing::info!("relaying");
            tracing::debug!("detail");
        });
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 4, "{out}");
        assert!(lines[0].starts_with("<3>") && lines[0].contains("the helper exited"));
        assert!(lines[1].starts_with("<4>") && lines[1].contains("flow=\"a\""));
        assert!(lines[2].starts_with("<6>") && lines[2].contains("relaying"));
        assert!(lines[3].starts_with("<7>") && lines[3].contains("detail"));
        assert!(
            !out.contains('\x1b'),
            "ANSI escape in journal output: {out:?}"
        );
    }

    #[test]
    fn every_line_of_a_multi_line_message_keeps_the_priority() {
        let out = journal_output(|| tracing::warn!("first\nsecond\nthird"));
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert!(lines.iter().all(|l| l.starts_with("<4>")), "{out}");
    }
}
