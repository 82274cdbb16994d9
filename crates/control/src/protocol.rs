//! The control protocol: JSON lines, one request and one response per line.
//!
//! A request is a JSON object carrying the protocol version and a command:
//!
//! ```text
//! {"v":1,"cmd":"status"}
//! ```
//!
//! Commands are `status`, `flows`, `stats` (each answered with a
//! [`Snapshot`](crate::Snapshot); the client picks what to print),
//! `reload` (answered with a [`ReloadOutcome`]), and `standby` and
//! `active` (answered with a [`ModeOutcome`](crate::ModeOutcome) once
//! every worker has the new mode). `reload` takes one optional
//! field, `"allow_empty":true`, which lets a reload remove every flow (see
//! [`Request::Reload`]); without it, such a reload is refused. `status`
//! takes one, `"summary":true`, which asks for a [`Summary`](crate::Summary)
//! (bounded in size however many flows there are) instead of the whole
//! snapshot. Unknown fields are ignored so that later clients can add
//! optional ones (a daemon that predates `allow_empty` or `summary` ignores
//! it: see [`decode_status`](crate::decode_status)). A response is
//!
//! ```text
//! {"v":1,"ok":true,"result":{...}}
//! {"v":1,"ok":false,"error":"unknown command \"stop\"; commands: status, flows, stats, reload, standby, active"}
//! ```
//!
//! A request line is at most [`MAX_REQUEST_BYTES`] bytes; responses have no
//! limit (they only travel from the daemon to a client that asked).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The protocol version this build speaks; the `v` of every line.
pub const PROTOCOL_VERSION: u32 = 1;

/// Longest request line accepted, not counting its newline.
pub const MAX_REQUEST_BYTES: usize = 4096;

/// Most characters of a client's input quoted back in an error message.
const MAX_QUOTED_CHARS: usize = 64;

/// The command names, in the order they are listed in error messages.
const COMMAND_LIST: &str = "status, flows, stats, reload, standby, active";

/// A command sent to the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Request {
    /// Daemon state, uptime, workers and totals. Answered with a
    /// `Snapshot`, or with `summary` a [`Summary`](crate::Summary).
    Status {
        /// Answer with the summary, whose size doesn't grow with the
        /// flows. On the wire, `"summary":true`; absent means false (old
        /// clients, which get the whole snapshot as before).
        summary: bool,
    },
    /// Per-flow and per-output counters. Answered with a `Snapshot`.
    Flows,
    /// Flows plus per-worker pool and loop counters. Answered with a
    /// `Snapshot`.
    Stats,
    /// Re-read the configuration file and apply it. Answered with a
    /// [`ReloadOutcome`].
    Reload {
        /// Apply a file that has no flows though some are configured now.
        /// Without it such a reload is refused: an empty file is far more
        /// often one read half-written than an operator's intent. On the
        /// wire, `"allow_empty":true`; absent means false (old clients).
        allow_empty: bool,
    },
    /// Warm standby: keep every flow's sockets open and receiving, send
    /// nothing. Answered with a [`ModeOutcome`](crate::ModeOutcome).
    Standby,
    /// Relay (leave standby). Answered with a
    /// [`ModeOutcome`](crate::ModeOutcome).
    Active,
}

impl Request {
    /// Every command, in protocol order.
    pub const ALL: [Request; 6] = [
        Request::Status { summary: false },
        Request::Flows,
        Request::Stats,
        Request::Reload { allow_empty: false },
        Request::Standby,
        Request::Active,
    ];

    /// The `cmd` string on the wire.
    pub fn command(self) -> &'static str {
        match self {
            Request::Status { .. } => "status",
            Request::Flows => "flows",
            Request::Stats => "stats",
            Request::Reload { .. } => "reload",
            Request::Standby => "standby",
            Request::Active => "active",
        }
    }

    /// The request whose `cmd` string is `command`, if any, with its
    /// optional fields absent.
    pub fn from_command(command: &str) -> Option<Request> {
        Request::ALL.into_iter().find(|r| r.command() == command)
    }
}

/// What went wrong reading a request or a response.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// The line exceeds [`MAX_REQUEST_BYTES`].
    #[error("request longer than {MAX_REQUEST_BYTES} bytes; send one short JSON object per line")]
    TooLong,
    /// The line is empty or only whitespace.
    #[error("empty request; send e.g. {{\"v\":{PROTOCOL_VERSION},\"cmd\":\"status\"}}")]
    Empty,
    /// The line is not UTF-8.
    #[error("request is not UTF-8 text")]
    NotUtf8,
    /// The line is not one JSON value.
    #[error("request is not valid JSON: {0}")]
    InvalidJson(#[source] serde_json::Error),
    /// The line is JSON but not an object.
    #[error("request must be a JSON object like {{\"v\":{PROTOCOL_VERSION},\"cmd\":\"status\"}}")]
    NotAnObject,
    /// The object has no `v`.
    #[error("request has no \"v\" (protocol version); supported versions: {PROTOCOL_VERSION}")]
    MissingVersion,
    /// The `v` is not a version this build speaks.
    #[error("unsupported protocol version {found}; supported versions: {PROTOCOL_VERSION}")]
    UnsupportedVersion {
        /// The `v` as sent (JSON text, shortened).
        found: String,
    },
    /// The object has no `cmd`.
    #[error("request has no \"cmd\"; commands: {COMMAND_LIST}")]
    MissingCommand,
    /// The `cmd` names no command.
    #[error("unknown command {found}; commands: {COMMAND_LIST}")]
    UnknownCommand {
        /// The `cmd` as sent (JSON text, shortened).
        found: String,
    },
    /// A response line that doesn't follow the protocol.
    #[error("malformed response from the daemon: {0}")]
    MalformedResponse(&'static str),
    /// An optional field of the command has the wrong type.
    #[error("\"{field}\" must be {expected}; found {found}")]
    BadField {
        /// The field's name.
        field: &'static str,
        /// What it must be.
        expected: &'static str,
        /// The value as sent (JSON text, shortened).
        found: String,
    },
    /// The daemon answered with an error.
    #[error("the daemon refused the request: {0}")]
    Remote(String),
    /// The result doesn't have the shape the client expected.
    #[error("unexpected result from the daemon: {0}")]
    UnexpectedResult(#[source] serde_json::Error),
}

/// Parses one request line (a trailing `\n` or `\r\n` is allowed).
///
/// Never panics, whatever the bytes; every failure is a [`ProtocolError`]
/// whose message can be sent back to the client as is.
pub fn parse_request(line: &[u8]) -> Result<Request, ProtocolError> {
    let line = strip_newline(line);
    if line.len() > MAX_REQUEST_BYTES {
        return Err(ProtocolError::TooLong);
    }
    let text = std::str::from_utf8(line).map_err(|_| ProtocolError::NotUtf8)?;
    if text.trim().is_empty() {
        return Err(ProtocolError::Empty);
    }
    let value: Value = serde_json::from_str(text).map_err(ProtocolError::InvalidJson)?;
    let object = value.as_object().ok_or(ProtocolError::NotAnObject)?;
    check_version(object.get("v"))?;
    let request = match object.get("cmd") {
        None => return Err(ProtocolError::MissingCommand),
        Some(cmd) => cmd
            .as_str()
            .and_then(Request::from_command)
            .ok_or_else(|| ProtocolError::UnknownCommand { found: quote(cmd) })?,
    };
    let flag = |field: &'static str| match object.get(field) {
        None => Ok(false),
        Some(v) => v.as_bool().ok_or_else(|| ProtocolError::BadField {
            field,
            expected: "true or false",
            found: quote(v),
        }),
    };
    match request {
        Request::Reload { .. } => Ok(Request::Reload {
            allow_empty: flag("allow_empty")?,
        }),
        Request::Status { .. } => Ok(Request::Status {
            summary: flag("summary")?,
        }),
        other => Ok(other),
    }
}

/// The wire form of `request`: one JSON object and a newline.
pub fn encode_request(request: &Request) -> String {
    let extra = match request {
        Request::Reload { allow_empty: true } => ",\"allow_empty\":true",
        Request::Status { summary: true } => ",\"summary\":true",
        _ => "",
    };
    format!(
        "{{\"v\":{PROTOCOL_VERSION},\"cmd\":\"{}\"{extra}}}\n",
        request.command()
    )
}

/// A reply to one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    /// The request succeeded; the command's result.
    Ok(Value),
    /// The request failed; a message for the operator.
    Error(String),
}

/// The wire shape of a response as written, in field order `v`, `ok`,
/// `result`/`error`.
#[derive(Serialize)]
struct WireResponseOut<'a> {
    v: u32,
    ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
}

/// The wire shape of a response as read; `v` is any JSON value so a wrong
/// version is reported as such.
#[derive(Deserialize)]
struct WireResponseIn {
    v: Value,
    ok: bool,
    #[serde(default)]
    result: Option<Value>,
    #[serde(default)]
    error: Option<String>,
}

impl Response {
    /// A success carrying `result`, or an error response if `result`
    /// cannot be represented as JSON.
    pub fn ok<T: Serialize>(result: &T) -> Response {
        match serde_json::to_value(result) {
            Ok(value) => Response::Ok(value),
            Err(e) => Response::Error(format!("internal error encoding the result: {e}")),
        }
    }

    /// An error response whose message is `error`'s `Display`.
    pub fn error(error: impl std::fmt::Display) -> Response {
        Response::Error(error.to_string())
    }

    /// The wire form: one JSON line ending in `\n`. Strings are escaped, so
    /// the line holds no other newline.
    pub fn encode(&self) -> String {
        let wire = match self {
            Response::Ok(value) => WireResponseOut {
                v: PROTOCOL_VERSION,
                ok: true,
                result: Some(value),
                error: None,
            },
            Response::Error(message) => WireResponseOut {
                v: PROTOCOL_VERSION,
                ok: false,
                result: None,
                error: Some(message),
            },
        };
        match serde_json::to_string(&wire) {
            Ok(mut line) => {
                line.push('\n');
                line
            }
            // A `Value` always serializes; this arm only keeps the control
            // socket free of panics.
            Err(_) => format!(
                "{{\"v\":{PROTOCOL_VERSION},\"ok\":false,\"error\":\"internal error encoding the response\"}}\n"
            ),
        }
    }

    /// The result decoded as `T`, or [`ProtocolError::Remote`] if the daemon
    /// answered with an error.
    pub fn into_result<T: DeserializeOwned>(self) -> Result<T, ProtocolError> {
        match self {
            Response::Ok(value) => {
                serde_json::from_value(value).map_err(ProtocolError::UnexpectedResult)
            }
            Response::Error(message) => Err(ProtocolError::Remote(message)),
        }
    }
}

/// Parses one response line (a trailing `\n` or `\r\n` is allowed).
pub fn parse_response(line: &[u8]) -> Result<Response, ProtocolError> {
    let text = std::str::from_utf8(strip_newline(line)).map_err(|_| ProtocolError::NotUtf8)?;
    let wire: WireResponseIn = serde_json::from_str(text).map_err(ProtocolError::InvalidJson)?;
    check_version(Some(&wire.v))?;
    match (wire.ok, wire.result, wire.error) {
        (true, Some(result), _) => Ok(Response::Ok(result)),
        (true, None, _) => Err(ProtocolError::MalformedResponse(
            "\"ok\":true without \"result\"",
        )),
        (false, _, Some(error)) => Ok(Response::Error(error)),
        (false, _, None) => Err(ProtocolError::MalformedResponse(
            "\"ok\":false without \"error\"",
        )),
    }
}

/// The result of a `reload`: what changed, or why nothing did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReloadOutcome {
    /// Whether the new configuration is now in force. When false, the old
    /// one still is and `errors` says why.
    pub applied: bool,
    /// Flows in the new configuration only.
    pub added: Vec<String>,
    /// Flows in the old configuration only.
    pub removed: Vec<String>,
    /// Flows in both whose settings differ (their counters restart).
    pub changed: Vec<String>,
    /// How many flows were left as they were.
    pub unchanged: usize,
    /// Every problem found, each naming the file, field and fix.
    pub errors: Vec<String>,
}

/// `line` without one trailing `\n` or `\r\n`.
fn strip_newline(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

fn check_version(v: Option<&Value>) -> Result<(), ProtocolError> {
    match v {
        None => Err(ProtocolError::MissingVersion),
        Some(v) if v.as_u64() == Some(u64::from(PROTOCOL_VERSION)) => Ok(()),
        Some(v) => Err(ProtocolError::UnsupportedVersion { found: quote(v) }),
    }
}

/// `value` as JSON text, cut to [`MAX_QUOTED_CHARS`] so an error never
/// echoes a whole hostile request.
fn quote(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(MAX_QUOTED_CHARS) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(line: &str) -> ProtocolError {
        match parse_request(line.as_bytes()) {
            Ok(r) => panic!("{line:?} parsed as {r:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn every_request_round_trips() {
        for request in Request::ALL {
            let line = encode_request(&request);
            assert!(line.ends_with('\n'));
            assert_eq!(line.matches('\n').count(), 1);
            assert_eq!(parse_request(line.as_bytes()).unwrap(), request);
        }
        assert_eq!(
            encode_request(&Request::Status { summary: false }),
            "{\"v\":1,\"cmd\":\"status\"}\n"
        );
    }

    #[test]
    fn reload_may_allow_emptying_and_old_clients_do_not() {
        let allow = Request::Reload { allow_empty: true };
        let line = encode_request(&allow);
        assert_eq!(line, "{\"v\":1,\"cmd\":\"reload\",\"allow_empty\":true}\n");
        assert_eq!(parse_request(line.as_bytes()).unwrap(), allow);
        // What every client before allow_empty sends.
        assert_eq!(
            parse_request(b"{\"v\":1,\"cmd\":\"reload\"}\n").unwrap(),
            Request::Reload { allow_empty: false }
        );
        assert_eq!(
            encode_request(&Request::Reload { allow_empty: false }),
            "{\"v\":1,\"cmd\":\"reload\"}\n"
        );
        assert_eq!(
            parse_request(b"{\"v\":1,\"cmd\":\"reload\",\"allow_empty\":false}").unwrap(),
            Request::Reload { allow_empty: false }
        );
        let e = err("{\"v\":1,\"cmd\":\"reload\",\"allow_empty\":\"yes\"}");
        assert!(matches!(e, ProtocolError::BadField { .. }), "{e}");
        assert!(e.to_string().contains("true or false"), "{e}");
        // Other commands ignore it, as any unknown field.
        assert_eq!(
            parse_request(b"{\"v\":1,\"cmd\":\"status\",\"allow_empty\":1}").unwrap(),
            Request::Status { summary: false }
        );
    }

    #[test]
    fn status_may_ask_for_the_summary_and_old_clients_do_not() {
        let summary = Request::Status { summary: true };
        let line = encode_request(&summary);
        assert_eq!(line, "{\"v\":1,\"cmd\":\"status\",\"summary\":true}\n");
        assert_eq!(parse_request(line.as_bytes()).unwrap(), summary);
        assert_eq!(
            parse_request(b"{\"v\":1,\"cmd\":\"status\"}").unwrap(),
            Request::Status { summary: false }
        );
        let e = err("{\"v\":1,\"cmd\":\"status\",\"summary\":1}");
        assert!(
            matches!(
                e,
                ProtocolError::BadField {
                    field: "summary",
                    ..
                }
            ),
            "{e}"
        );
        // Other commands ignore it.
        assert_eq!(
            parse_request(b"{\"v\":1,\"cmd\":\"flows\",\"summary\":true}").unwrap(),
            Request::Flows
        );
    }

    #[test]
    fn standby_and_active_are_plain_commands() {
        assert_eq!(
            encode_request(&Request::Standby),
            "{\"v\":1,\"cmd\":\"standby\"}\n"
        );
        assert_eq!(
            parse_request(b"{\"v\":1,\"cmd\":\"active\"}").unwrap(),
            Request::Active
        );
        let e = err("{\"v\":1,\"cmd\":\"master\"}");
        assert!(e.to_string().contains("standby, active"), "{e}");
    }

    #[test]
    fn accepts_crlf_whitespace_and_extra_fields() {
        assert_eq!(
            parse_request(b" { \"cmd\" : \"flows\", \"v\" : 1, \"x\": [1] }\r\n").unwrap(),
            Request::Flows
        );
    }

    #[test]
    fn garbage_is_invalid_json() {
        assert!(matches!(err("hello"), ProtocolError::InvalidJson(_)));
        assert!(matches!(err("{\"v\":1,"), ProtocolError::InvalidJson(_)));
        assert!(matches!(err("{} {}"), ProtocolError::InvalidJson(_)));
        assert!(matches!(
            parse_request(b"{\"v\":1,\"cmd\":\"st\xffus\"}"),
            Err(ProtocolError::NotUtf8)
        ));
        assert!(matches!(err("  "), ProtocolError::Empty));
        assert!(matches!(err(""), ProtocolError::Empty));
    }

    #[test]
    fn non_objects_are_rejected() {
        for line in ["[1,\"status\"]", "\"status\"", "1", "null", "true"] {
            assert!(matches!(err(line), ProtocolError::NotAnObject), "{line}");
        }
    }

    #[test]
    fn version_must_be_present_and_supported() {
        assert!(matches!(
            err("{\"cmd\":\"status\"}"),
            ProtocolError::MissingVersion
        ));
        for v in ["2", "0", "-1", "1.0", "\"1\"", "null", "[1]"] {
            let e = err(&format!("{{\"v\":{v},\"cmd\":\"status\"}}"));
            assert!(
                matches!(&e, ProtocolError::UnsupportedVersion { found } if found == v),
                "{v}: {e:?}"
            );
            assert!(e.to_string().contains("supported versions: 1"), "{e}");
        }
        assert!(
            ProtocolError::MissingVersion
                .to_string()
                .contains("supported versions: 1")
        );
    }

    #[test]
    fn version_is_checked_before_command() {
        assert!(matches!(
            err("{\"v\":2,\"cmd\":\"nope\"}"),
            ProtocolError::UnsupportedVersion { .. }
        ));
    }

    #[test]
    fn huge_numbers_are_errors_not_panics() {
        let e = err("{\"v\":340282366920938463463374607431768211457,\"cmd\":\"status\"}");
        assert!(
            matches!(e, ProtocolError::UnsupportedVersion { .. }),
            "{e:?}"
        );
        assert!(matches!(
            err("{\"v\":18446744073709551617,\"cmd\":\"status\"}"),
            ProtocolError::UnsupportedVersion { .. }
        ));
        assert!(matches!(
            err("{\"v\":1e999,\"cmd\":\"status\"}"),
            ProtocolError::InvalidJson(_)
        ));
        // 2^32 + 1 must not wrap to version 1.
        assert!(matches!(
            err("{\"v\":4294967297,\"cmd\":\"status\"}"),
            ProtocolError::UnsupportedVersion { .. }
        ));
    }

    #[test]
    fn command_must_be_known() {
        assert!(matches!(err("{\"v\":1}"), ProtocolError::MissingCommand));
        let e = err("{\"v\":1,\"cmd\":\"stop\"}");
        assert!(matches!(&e, ProtocolError::UnknownCommand { found } if found == "\"stop\""));
        assert!(e.to_string().contains("status, flows, stats, reload"));
        assert!(matches!(
            err("{\"v\":1,\"cmd\":\"STATUS\"}"),
            ProtocolError::UnknownCommand { .. }
        ));
        assert!(matches!(
            err("{\"v\":1,\"cmd\":7}"),
            ProtocolError::UnknownCommand { .. }
        ));
    }

    #[test]
    fn long_quotes_are_shortened() {
        let name = "x".repeat(1000);
        let e = err(&format!("{{\"v\":1,\"cmd\":\"{name}\"}}"));
        assert!(e.to_string().len() < 200, "{e}");
        let e = err(&format!("{{\"v\":1,\"cmd\":\"{}\"}}", "é".repeat(100)));
        assert!(e.to_string().contains("..."));
    }

    #[test]
    fn too_long_lines_are_rejected() {
        let pad = " ".repeat(MAX_REQUEST_BYTES);
        assert!(matches!(
            err(&format!("{{\"v\":1,\"cmd\":\"status\"}}{pad}")),
            ProtocolError::TooLong
        ));
        let exact = format!(
            "{:<width$}",
            "{\"v\":1,\"cmd\":\"status\"}",
            width = MAX_REQUEST_BYTES
        );
        assert_eq!(
            parse_request(format!("{exact}\n").as_bytes()).unwrap(),
            Request::Status { summary: false }
        );
    }

    #[test]
    fn deep_nesting_is_an_error() {
        let line = format!(
            "{{\"v\":1,\"cmd\":\"status\",\"x\":{}{}}}",
            "[".repeat(2000),
            "]".repeat(2000)
        );
        assert!(matches!(
            err(&line[..line.len().min(MAX_REQUEST_BYTES)]),
            ProtocolError::InvalidJson(_)
        ));
    }

    #[test]
    fn responses_round_trip() {
        let ok = Response::Ok(serde_json::json!({"a": [1, 2], "b": "x\ny"}));
        let line = ok.encode();
        assert!(
            line.starts_with("{\"v\":1,\"ok\":true,\"result\":"),
            "{line}"
        );
        assert_eq!(line.matches('\n').count(), 1);
        assert_eq!(parse_response(line.as_bytes()).unwrap(), ok);

        let error = Response::Error("bad \"thing\"\nhere".into());
        let line = error.encode();
        assert!(
            line.starts_with("{\"v\":1,\"ok\":false,\"error\":"),
            "{line}"
        );
        assert_eq!(line.matches('\n').count(), 1);
        assert_eq!(parse_response(line.as_bytes()).unwrap(), error);
    }

    #[test]
    fn malformed_responses_are_rejected() {
        assert!(matches!(
            parse_response(b"{\"v\":1,\"ok\":true}"),
            Err(ProtocolError::MalformedResponse(_))
        ));
        assert!(matches!(
            parse_response(b"{\"v\":1,\"ok\":false}"),
            Err(ProtocolError::MalformedResponse(_))
        ));
        assert!(matches!(
            parse_response(b"{\"v\":2,\"ok\":true,\"result\":1}"),
            Err(ProtocolError::UnsupportedVersion { .. })
        ));
        assert!(matches!(
            parse_response(b"nope"),
            Err(ProtocolError::InvalidJson(_))
        ));
    }

    #[test]
    fn reload_outcome_decodes_from_a_response() {
        let outcome = ReloadOutcome {
            applied: true,
            added: vec!["a".into()],
            removed: vec![],
            changed: vec!["b".into()],
            unchanged: 3,
            errors: vec![],
        };
        let line = Response::ok(&outcome).encode();
        let back: ReloadOutcome = parse_response(line.as_bytes())
            .unwrap()
            .into_result()
            .unwrap();
        assert_eq!(back, outcome);

        let refused = Response::Error("no".into()).encode();
        let e = parse_response(refused.as_bytes())
            .unwrap()
            .into_result::<ReloadOutcome>()
            .unwrap_err();
        assert!(matches!(e, ProtocolError::Remote(m) if m == "no"));
        let e = Response::Ok(serde_json::json!(5))
            .into_result::<ReloadOutcome>()
            .unwrap_err();
        assert!(matches!(e, ProtocolError::UnexpectedResult(_)));
    }
}
