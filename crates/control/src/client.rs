//! The one client of the control socket, shared by `mcrelayctl` and the
//! demo (`mcrelayd demo`): connect, send one request line, read one reply
//! line (at most [`MAX_REPLY_BYTES`]) and decode it. The only I/O in this
//! crate; control plane only.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::{ProtocolError, Request, encode_request, parse_response};

/// Replies larger than this are refused (a snapshot of thousands of flows
/// is a few MB).
pub const MAX_REPLY_BYTES: u64 = 64 << 20;

/// Why a request got no decoded reply.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    /// The socket isn't there, or refused us.
    #[error(
        "connecting to {} (is mcrelayd running, and are you root or in the mcrelay group?)",
        path.display()
    )]
    Connect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Setting the connection's timeouts failed.
    #[error("setting the control connection's timeouts")]
    Timeout(#[source] io::Error),
    /// Writing the request failed, and no reply came.
    #[error("sending the request")]
    Send(#[source] io::Error),
    /// Reading the reply failed (or timed out) before any byte came.
    #[error("reading the reply")]
    Read(#[source] io::Error),
    /// The daemon closed the connection without a byte of reply.
    #[error("the daemon closed the connection without answering")]
    Closed,
    /// The reply is not a valid response, or an error response.
    #[error(transparent)]
    Reply(#[from] ProtocolError),
}

/// Send `request` on the control socket at `socket` and decode its reply as
/// `T`, each read and write waiting at most `timeout`.
///
/// A daemon that refuses us answers before we finish writing, then closes:
/// its answer matters more than our write error, so a reply is decoded
/// whenever one came.
pub fn ask<T: DeserializeOwned>(
    socket: &Path,
    request: &Request,
    timeout: Duration,
) -> Result<T, AskError> {
    let mut conn = UnixStream::connect(socket).map_err(|source| AskError::Connect {
        path: socket.to_owned(),
        source,
    })?;
    conn.set_read_timeout(Some(timeout))
        .and_then(|()| conn.set_write_timeout(Some(timeout)))
        .map_err(AskError::Timeout)?;
    let sent = conn.write_all(encode_request(request).as_bytes());
    let mut line = Vec::new();
    let read = BufReader::new(conn)
        .take(MAX_REPLY_BYTES)
        .read_until(b'\n', &mut line);
    if line.is_empty() {
        sent.map_err(AskError::Send)?;
        read.map_err(AskError::Read)?;
        return Err(AskError::Closed);
    }
    Ok(parse_response(&line)?.into_result()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    fn socket_path(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!(
            "mcrelay-control-{name}-{}.sock",
            std::process::id()
        ))
    }

    /// A one-shot server that reads one line and answers `reply`.
    fn serve_once(path: &Path, reply: &'static [u8]) -> std::thread::JoinHandle<()> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path).expect("bind");
        std::thread::spawn(move || {
            let (conn, _) = listener.accept().expect("accept");
            let mut line = Vec::new();
            BufReader::new(&conn)
                .read_until(b'\n', &mut line)
                .expect("read");
            (&conn).write_all(reply).expect("write");
        })
    }

    #[test]
    fn a_reply_is_decoded_and_an_error_reply_is_remote() {
        let path = socket_path("ok");
        let server = serve_once(&path, b"{\"v\":1,\"ok\":true,\"result\":42}\n");
        let n: u32 = ask(
            &path,
            &Request::Status { summary: false },
            Duration::from_secs(60),
        )
        .expect("ask");
        assert_eq!(n, 42);
        server.join().expect("server");

        let server = serve_once(&path, b"{\"v\":1,\"ok\":false,\"error\":\"nope\"}\n");
        let e = ask::<u32>(
            &path,
            &Request::Status { summary: false },
            Duration::from_secs(60),
        )
        .expect_err("remote");
        assert!(
            matches!(e, AskError::Reply(ProtocolError::Remote(ref m)) if m == "nope"),
            "{e:?}"
        );
        server.join().expect("server");

        let server = serve_once(&path, b"");
        let e = ask::<u32>(
            &path,
            &Request::Status { summary: false },
            Duration::from_secs(60),
        )
        .expect_err("closed");
        assert!(matches!(e, AskError::Closed), "{e:?}");
        server.join().expect("server");
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_missing_socket_says_what_to_check() {
        let path = socket_path("missing");
        let e = ask::<u32>(
            &path,
            &Request::Status { summary: false },
            Duration::from_secs(1),
        )
        .expect_err("none");
        assert!(e.to_string().contains("is mcrelayd running"), "{e}");
        assert!(matches!(e, AskError::Connect { .. }));
    }
}
