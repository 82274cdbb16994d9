//! The Prometheus endpoint (`daemon.metrics_listen`): `GET /metrics`
//! answered with the shared snapshot in the text format, or in OpenMetrics
//! when the request's `Accept` header prefers it (Prometheus' does). Reading the
//! counters takes relaxed loads only, so a scrape never slows a worker.
//! One short-lived thread per connection, [`MAX_CONNECTIONS`] at most. Each
//! request has one deadline from its accept ([`DEADLINE`]) for reading the
//! request and writing the reply, however slowly its bytes trickle in; and
//! when every slot is taken, the connection accepted longest ago is shut
//! down to make room for the new one: slow or hostile clients can't hold
//! the endpoint, a scraper that sends its request and reads the reply at
//! once always gets through.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::daemon::{SharedHandle, lock};

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 8;
/// From accept to the reply written: the whole request, not each read.
pub const DEADLINE: Duration = Duration::from_secs(5);
/// Request line and headers together; a scraper sends a few hundred bytes.
const MAX_REQUEST: usize = 8192;

/// Bind the endpoint (before privileges are dropped: the port may be
/// below 1024).
pub fn bind(listen: SocketAddr) -> Result<TcpListener, MetricsError> {
    TcpListener::bind(listen).map_err(|source| MetricsError::Bind { listen, source })
}

/// Why the metrics endpoint did not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("binding the metrics endpoint {listen}")]
    Bind {
        listen: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("metrics endpoint address")]
    Address(#[source] std::io::Error),
    #[error("starting the metrics thread")]
    Thread(#[source] std::io::Error),
}

/// Serve the bound endpoint on a thread for the life of the process.
pub fn start(listener: TcpListener, shared: SharedHandle) -> Result<SocketAddr, MetricsError> {
    let bound = listener.local_addr().map_err(MetricsError::Address)?;
    tracing::info!(%bound, "metrics endpoint listening on /metrics");
    std::thread::Builder::new()
        .name("mcrelay-metrics".into())
        .spawn(move || serve(&listener, &shared))
        .map_err(MetricsError::Thread)?;
    Ok(bound)
}

fn serve(listener: &TcpListener, shared: &SharedHandle) {
    let slots = Arc::new(Slots::default());
    for (id, conn) in (0u64..).zip(listener.incoming()) {
        let Ok(conn) = conn else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let accepted = Instant::now();
        let Ok(handle) = conn.try_clone() else {
            continue;
        };
        slots.admit(id, handle);
        let (shared, slots) = (Arc::clone(shared), Arc::clone(&slots));
        let spawned = std::thread::Builder::new()
            .name("mcrelay-scrape".into())
            .spawn(move || {
                let _ = answer(conn, accepted, &shared);
                slots.leave(id);
            });
        if spawned.is_err() {
            tracing::warn!("metrics connection thread could not start");
        }
    }
}

/// The connections being served, oldest first, each with a handle to shut
/// it down.
#[derive(Debug, Default)]
struct Slots(Mutex<VecDeque<(u64, TcpStream)>>);

impl Slots {
    /// Admit connection `id`, shutting down the oldest when all are taken
    /// (its thread's read or write then fails at once and it leaves).
    fn admit(&self, id: u64, conn: TcpStream) {
        let mut held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        while held.len() >= MAX_CONNECTIONS {
            if let Some((_, oldest)) = held.pop_front() {
                let _ = oldest.shutdown(Shutdown::Both);
            }
        }
        held.push_back((id, conn));
    }

    fn leave(&self, id: u64) {
        let mut held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        held.retain(|(i, _)| *i != id);
    }
}

/// The request's path, once its headers have arrived; `None` for anything
/// that isn't a complete `GET` within [`MAX_REQUEST`] bytes.
fn request_path(request: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(request).ok()?;
    let mut words = text.lines().next()?.split_whitespace();
    match (words.next()?, words.next()?) {
        ("GET", path) => Some(path),
        _ => None,
    }
}

/// Whether the request's head has arrived: its headers ended by an empty
/// line, each line ended by CRLF or by a bare LF (RFC 9112 section 2.2 lets
/// a server take a bare LF as a line end; `printf 'GET /metrics
/// HTTP/1.1\n\n'` and some scrapers send that), or a request line with no
/// version (HTTP/0.9: no headers follow). Before this, a head of bare LFs
/// waited for the 5 s deadline (issue 27).
fn head_complete(request: &[u8]) -> bool {
    let Some(first) = request.iter().position(|&b| b == b'\n') else {
        return false;
    };
    let line = request[..first]
        .strip_suffix(b"\r")
        .unwrap_or(&request[..first]);
    if line
        .split(u8::is_ascii_whitespace)
        .filter(|w| !w.is_empty())
        .count()
        < 3
    {
        return true;
    }
    request[first..].windows(2).any(|w| w == b"\n\n")
        || request[first..].windows(3).any(|w| w == b"\n\r\n")
}

/// The value of the request's `Accept` header, if it has one.
fn accept_header(request: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(request).ok()?;
    let mut headers = text
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .skip(1)
        .take_while(|l| !l.is_empty());
    headers.find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("accept")
            .then_some(value.trim())
    })
}

/// Time left until `deadline`, or a timeout error once it has passed.
fn left(deadline: Instant) -> std::io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(std::io::ErrorKind::TimedOut.into())
    } else {
        Ok(left)
    }
}

fn answer(mut conn: TcpStream, accepted: Instant, shared: &SharedHandle) -> std::io::Result<()> {
    let deadline = accepted + DEADLINE;
    let mut request = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !head_complete(&request) {
        conn.set_read_timeout(Some(left(deadline)?))?;
        let n = conn.read(&mut chunk)?;
        if n == 0 || request.len() + n > MAX_REQUEST {
            return respond(&mut conn, "400 Bad Request", "text/plain", "bad request\n");
        }
        request.extend_from_slice(&chunk[..n]);
    }
    // The reply is small (kilobytes); a client that doesn't read it within
    // what is left of the deadline is dropped.
    conn.set_write_timeout(Some(left(deadline)?))?;
    match request_path(&request) {
        Some("/metrics") => {
            let format = mcrelay_control::MetricsFormat::negotiate(accept_header(&request));
            // The lock is held for the read only, not for the rendering
            // (tens of ms for a thousand flows).
            let snapshot = lock(shared).read();
            let body = mcrelay_control::render_metrics_as(&snapshot, format);
            respond(&mut conn, "200 OK", format.content_type(), &body)
        }
        Some(_) => respond(&mut conn, "404 Not Found", "text/plain", "try /metrics\n"),
        None => respond(&mut conn, "400 Bad Request", "text/plain", "bad request\n"),
    }
}

fn respond(
    conn: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &str,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes())?;
    conn.write_all(body.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_house_makes_room_by_closing_the_oldest() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let slots = Slots::default();
        let mut clients = Vec::new();
        for id in 0..=u64::try_from(MAX_CONNECTIONS).expect("small") {
            clients.push(TcpStream::connect(addr).expect("connect"));
            let (server, _) = listener.accept().expect("accept");
            slots.admit(id, server);
        }
        let held: Vec<u64> = slots
            .0
            .lock()
            .expect("lock")
            .iter()
            .map(|(i, _)| *i)
            .collect();
        assert_eq!(held, (1..=8).collect::<Vec<_>>());
        // The oldest was shut down: its client reads end of file.
        let mut byte = [0u8; 1];
        clients[0]
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        assert_eq!(clients[0].read(&mut byte).expect("read"), 0);
        slots.leave(5);
        assert_eq!(slots.0.lock().expect("lock").len(), MAX_CONNECTIONS - 1);
    }

    /// One request to a real endpoint on loopback (a daemon with no
    /// flows), with `deadline` for the whole reply.
    fn ask(request: &[u8]) -> (String, Duration) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = listener.local_addr().expect("addr");
        let shared = crate::daemon::Shared::empty();
        std::thread::spawn(move || serve(&listener, &shared));
        let started = Instant::now();
        let mut conn = TcpStream::connect(addr).expect("connect");
        conn.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        conn.write_all(request).expect("write");
        let mut reply = String::new();
        let _ = conn.read_to_string(&mut reply);
        (reply, started.elapsed())
    }

    #[test]
    fn a_request_of_bare_lf_lines_is_answered_at_once() {
        for request in [
            &b"GET /metrics HTTP/1.1\nHost: x\nAccept: text/plain\n\n"[..],
            b"GET /metrics HTTP/1.1\n\n",
            b"GET /metrics HTTP/1.0\r\nHost: x\n\r\n",
            b"GET /metrics\n",
            b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
        ] {
            let (reply, took) = ask(request);
            assert!(
                reply.starts_with("HTTP/1.1 200 OK\r\n"),
                "{:?}: {reply:?}",
                String::from_utf8_lossy(request)
            );
            // Well inside the 5 s deadline it used to wait for.
            assert!(
                took < DEADLINE / 2,
                "{:?} answered after {took:?}",
                String::from_utf8_lossy(request)
            );
        }
    }

    #[test]
    fn a_head_is_complete_at_its_empty_line_whatever_the_line_ends() {
        assert!(!head_complete(b""));
        assert!(!head_complete(b"GET /metrics HTTP/1.1"));
        assert!(!head_complete(b"GET /metrics HTTP/1.1\r\nHost: x\r\n"));
        assert!(!head_complete(b"GET /metrics HTTP/1.1\nHost: x\n"));
        assert!(head_complete(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"));
        assert!(head_complete(b"GET /metrics HTTP/1.1\nHost: x\n\n"));
        assert!(head_complete(b"GET /metrics HTTP/1.1\r\nHost: x\n\r\n"));
        assert!(head_complete(b"GET /metrics\r\n"));
        assert_eq!(
            accept_header(b"GET / HTTP/1.1\nAccept: application/openmetrics-text\n\n"),
            Some("application/openmetrics-text")
        );
    }

    #[test]
    fn the_accept_header_is_found_in_any_case() {
        let prometheus = b"GET /metrics HTTP/1.1\r\nHost: x\r\nACCEPT: application/openmetrics-text;version=1.0.0,text/plain;q=0.5\r\n\r\n";
        assert_eq!(
            accept_header(prometheus),
            Some("application/openmetrics-text;version=1.0.0,text/plain;q=0.5")
        );
        assert_eq!(
            accept_header(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n"),
            None
        );
        // Not a header: the request line, or the body.
        assert_eq!(accept_header(b"Accept: x\r\n\r\n"), None);
    }

    #[test]
    fn only_complete_gets_have_a_path() {
        assert_eq!(
            request_path(b"GET /metrics HTTP/1.1\r\n\r\n"),
            Some("/metrics")
        );
        assert_eq!(request_path(b"POST /metrics HTTP/1.1\r\n\r\n"), None);
        assert_eq!(request_path(b"\xff\xfe"), None);
        assert_eq!(request_path(b""), None);
        assert_eq!(request_path(b"GET"), None);
    }
}
