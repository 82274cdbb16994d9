//! The daemon's side of a request: from a received line to the response to
//! write back. The daemon supplies the two things only it can do — read its
//! counters and reload its configuration — through [`ControlHandler`].

use crate::framing::LineEvent;
use crate::protocol::{ProtocolError, Request, Response, parse_request};

/// What the daemon does for the control plane.
pub trait ControlHandler {
    /// Reads every counter now (lock-free loads of the workers' published
    /// counters) into a snapshot.
    fn snapshot(&mut self) -> crate::Snapshot;

    /// Re-reads and applies the configuration file; on failure keeps the
    /// running configuration and says why in the outcome's `errors`. A file
    /// with no flows replaces a non-empty configuration only if
    /// `allow_empty`.
    fn reload(&mut self, allow_empty: bool) -> crate::ReloadOutcome;

    /// Puts every worker in `mode` and answers once they all have it, or
    /// says why not.
    fn set_mode(&mut self, mode: crate::Mode) -> Result<crate::ModeOutcome, String>;
}

/// The response to one request line. Every failure becomes an error
/// response whose message tells the client what to send instead.
pub fn answer_line(line: &[u8], handler: &mut impl ControlHandler) -> Response {
    match parse_request(line) {
        Ok(Request::Status { summary: true }) => {
            Response::ok(&crate::Summary::of(&handler.snapshot()))
        }
        Ok(Request::Status { summary: false } | Request::Flows | Request::Stats) => {
            Response::ok(&handler.snapshot())
        }
        Ok(Request::Reload { allow_empty }) => Response::ok(&handler.reload(allow_empty)),
        Ok(Request::Standby) => mode_response(handler.set_mode(crate::Mode::Standby)),
        Ok(Request::Active) => mode_response(handler.set_mode(crate::Mode::Active)),
        Err(e) => Response::error(e),
    }
}

fn mode_response(outcome: Result<crate::ModeOutcome, String>) -> Response {
    match outcome {
        Ok(o) => Response::ok(&o),
        Err(e) => Response::error(e),
    }
}

/// The response to one event from a connection's
/// [`LineReader`](crate::LineReader).
pub fn answer_event(event: LineEvent<'_>, handler: &mut impl ControlHandler) -> Response {
    match event {
        LineEvent::Line(line) => answer_line(line, handler),
        LineEvent::TooLong => Response::error(ProtocolError::TooLong),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{ReloadOutcome, encode_request, parse_response};
    use crate::snapshot::{Snapshot, sample};
    use crate::{LineReader, MAX_REQUEST_BYTES};

    #[derive(Default)]
    struct Fake {
        reloads: usize,
        mode: crate::Mode,
    }

    impl ControlHandler for Fake {
        fn snapshot(&mut self) -> Snapshot {
            sample()
        }
        fn reload(&mut self, _allow_empty: bool) -> ReloadOutcome {
            self.reloads += 1;
            ReloadOutcome {
                applied: true,
                unchanged: 1,
                ..ReloadOutcome::default()
            }
        }
        fn set_mode(&mut self, mode: crate::Mode) -> Result<crate::ModeOutcome, String> {
            let previous = std::mem::replace(&mut self.mode, mode);
            Ok(crate::ModeOutcome {
                mode,
                previous,
                workers: 1,
            })
        }
    }

    #[test]
    fn a_session_through_the_line_reader() {
        let mut fake = Fake::default();
        let mut reader = LineReader::new();
        let mut input = String::new();
        for r in Request::ALL {
            input.push_str(&encode_request(&r));
        }
        input.push_str(&"x".repeat(MAX_REQUEST_BYTES + 1));
        input.push_str("\n{\"v\":9,\"cmd\":\"status\"}\n");

        let mut replies = Vec::new();
        for chunk in input.as_bytes().chunks(7) {
            reader.feed(chunk, |e| replies.push(answer_event(e, &mut fake).encode()));
        }
        assert_eq!(replies.len(), 8);
        assert_eq!(fake.reloads, 1);
        for reply in &replies[..3] {
            let s: Snapshot = parse_response(reply.as_bytes())
                .unwrap()
                .into_result()
                .unwrap();
            assert_eq!(s, sample());
        }
        let outcome: ReloadOutcome = parse_response(replies[3].as_bytes())
            .unwrap()
            .into_result()
            .unwrap();
        assert!(outcome.applied);
        let standby: crate::ModeOutcome = parse_response(replies[4].as_bytes())
            .unwrap()
            .into_result()
            .unwrap();
        assert_eq!(
            (standby.mode, standby.previous),
            (crate::Mode::Standby, crate::Mode::Active)
        );
        let active: crate::ModeOutcome = parse_response(replies[5].as_bytes())
            .unwrap()
            .into_result()
            .unwrap();
        assert_eq!(
            (active.mode, active.previous),
            (crate::Mode::Active, crate::Mode::Standby)
        );
        assert!(
            replies[6].contains("longer than 4096 bytes"),
            "{}",
            replies[6]
        );
        assert!(
            replies[7].contains("supported versions: 1"),
            "{}",
            replies[7]
        );
        assert!(replies.iter().all(|r| r.matches('\n').count() == 1));
    }

    #[test]
    fn status_with_summary_answers_the_summary() {
        let mut fake = Fake::default();
        let line = encode_request(&Request::Status { summary: true });
        let reply = answer_line(line.as_bytes(), &mut fake).encode();
        let summary: crate::Summary = parse_response(reply.as_bytes())
            .unwrap()
            .into_result()
            .unwrap();
        assert_eq!(summary, crate::Summary::of(&sample()));
    }
}
