//! The helper program's log output: one line per event on stderr (the
//! stream it shares with the daemon), with the journal's `<N>` priority
//! prefix and no timestamp when stderr is the journal, else
//! `LEVEL target: message field=value ...`.
//!
//! A [`tracing::Subscriber`] of its own rather than `tracing-subscriber`:
//! the helper logs a few events per request and none in spans, filters by
//! level only, and each crate it links is a crate in the one privileged
//! process (`tracing-subscriber` with an environment filter is six more).

use std::fmt::Write as _;
use std::io::Write as _;

use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Writes each enabled event as one line (more, if its message has
/// newlines: each gets the prefix) on stderr.
#[derive(Debug)]
pub struct StderrLog {
    max: Level,
    journal: bool,
}

/// The most verbose level `filter` names: a level (`info`), or
/// `tracing`-style directives (`warn,mcrelay_helper=debug`), of which
/// only the levels count. `None` if it names none.
pub fn most_verbose(filter: &str) -> Option<Level> {
    filter
        .split(',')
        .filter_map(|directive| {
            let level = directive.rsplit('=').next()?.trim();
            level.parse::<Level>().ok()
        })
        .max()
}

/// Install the log subscriber: `RUST_LOG`'s most verbose level if it names
/// one (as the daemon's filter would let through), else `level`
/// (`daemon.log_level`), else info. A second call does nothing.
pub fn init(level: &str) {
    let max = std::env::var("RUST_LOG")
        .ok()
        .and_then(|f| most_verbose(&f))
        .or_else(|| most_verbose(level))
        .unwrap_or(Level::INFO);
    let log = StderrLog {
        max,
        journal: mcrelay_sys::journal::stderr_is_journal(),
    };
    let _ = tracing::subscriber::set_global_default(log);
}

impl StderrLog {
    /// The text of `event`'s lines, without the trailing newline.
    fn format(&self, event: &Event<'_>) -> String {
        let meta = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        let mut line = String::with_capacity(128);
        if !self.journal {
            let _ = write!(line, "{:>5} ", meta.level());
        }
        let _ = write!(line, "{}: {}{}", meta.target(), fields.message, fields.rest);
        if !self.journal {
            return line;
        }
        let n = mcrelay_sys::journal::priority(*meta.level());
        line.lines()
            .map(|l| format!("<{n}>{l}"))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// An event's `message` and its other fields as ` name=value`.
#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.rest, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.rest, " {}={value:?}", field.name());
        }
    }
}

impl Subscriber for StderrLog {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= self.max
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::from_level(self.max))
    }

    // The helper opens no spans; they are accepted and not shown.
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut text = self.format(event);
        text.push('\n');
        // One write per event, so lines of the daemon and the helper
        // sharing the stream do not interleave within a line.
        let _ = std::io::stderr().lock().write_all(text.as_bytes());
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn filters_name_their_most_verbose_level() {
        assert_eq!(most_verbose("info"), Some(Level::INFO));
        assert_eq!(
            most_verbose("warn,mcrelay_helper=debug"),
            Some(Level::DEBUG)
        );
        assert_eq!(most_verbose("error"), Some(Level::ERROR));
        assert_eq!(most_verbose(""), None);
        assert_eq!(most_verbose("mcrelay=loud"), None);
    }

    /// A subscriber that keeps the lines `StderrLog` would write.
    struct Kept(StderrLog, Arc<Mutex<Vec<String>>>);

    impl Subscriber for Kept {
        fn enabled(&self, m: &Metadata<'_>) -> bool {
            self.0.enabled(m)
        }
        fn new_span(&self, a: &Attributes<'_>) -> Id {
            self.0.new_span(a)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, e: &Event<'_>) {
            if let Ok(mut lines) = self.1.lock() {
                lines.push(self.0.format(e));
            }
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    fn lines(journal: bool, emit: impl FnOnce()) -> Vec<String> {
        let kept = Arc::new(Mutex::new(Vec::new()));
        let log = StderrLog {
            max: Level::INFO,
            journal,
        };
        tracing::subscriber::with_default(Kept(log, Arc::clone(&kept)), emit);
        kept.lock().expect("lock").clone()
    }

    #[test]
    fn terminal_and_journal_lines() {
        let out = lines(false, || {
            tracing::info!(pid = 7, flow = %"f 1", "forked a privileged helper");
            tracing::debug!("not shown");
        });
        assert_eq!(out.len(), 1, "{out:?}");
        assert!(out[0].starts_with(" INFO "), "{out:?}");
        assert!(
            out[0].ends_with(": forked a privileged helper pid=7 flow=f 1"),
            "{out:?}"
        );
        let out = lines(true, || tracing::warn!("first\nsecond"));
        assert_eq!(out.len(), 1);
        let text: Vec<&str> = out[0].lines().collect();
        assert_eq!(text.len(), 2, "{out:?}");
        assert!(text.iter().all(|l| l.starts_with("<4>")), "{out:?}");
    }
}
