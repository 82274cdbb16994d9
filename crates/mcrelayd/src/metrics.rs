//! The Prometheus endpoint (`daemon.metrics_listen`): `GET /metrics`
//! answered with the text exposition of the shared snapshot. Reading the
//! counters takes relaxed loads only, so a scrape never slows a worker.
//! One short-lived thread per connection, a few at most, with timeouts: a
//! slow or hostile scraper can't hold the endpoint.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context;

use crate::daemon::{SharedHandle, lock};

const MAX_CONNECTIONS: usize = 8;
const TIMEOUT: Duration = Duration::from_secs(5);
/// Request line and headers together; a scraper sends a few hundred bytes.
const MAX_REQUEST: usize = 8192;

/// Bind the endpoint (before privileges are dropped: the port may be
/// below 1024).
pub fn bind(listen: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(listen).with_context(|| format!("binding the metrics endpoint {listen}"))
}

/// Serve the bound endpoint on a thread for the life of the process.
pub fn start(listener: TcpListener, shared: SharedHandle) -> anyhow::Result<SocketAddr> {
    let bound = listener.local_addr().context("metrics endpoint address")?;
    tracing::info!(%bound, "metrics endpoint listening on /metrics");
    std::thread::Builder::new()
        .name("mcrelay-metrics".into())
        .spawn(move || serve(&listener, &shared))
        .context("starting the metrics thread")?;
    Ok(bound)
}

fn serve(listener: &TcpListener, shared: &SharedHandle) {
    let active = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        let Ok(conn) = conn else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        if active.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::AcqRel);
            continue;
        }
        let (shared, active) = (Arc::clone(shared), Arc::clone(&active));
        let _ = std::thread::Builder::new()
            .name("mcrelay-scrape".into())
            .spawn(move || {
                let _ = answer(conn, &shared);
                active.fetch_sub(1, Ordering::AcqRel);
            });
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

fn answer(mut conn: TcpStream, shared: &SharedHandle) -> std::io::Result<()> {
    conn.set_read_timeout(Some(TIMEOUT))?;
    conn.set_write_timeout(Some(TIMEOUT))?;
    let mut request = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut chunk)?;
        if n == 0 || request.len() + n > MAX_REQUEST {
            return respond(&mut conn, "400 Bad Request", "text/plain", "bad request\n");
        }
        request.extend_from_slice(&chunk[..n]);
    }
    match request_path(&request) {
        Some("/metrics") => {
            let body = mcrelay_control::render_metrics(&lock(shared).read());
            respond(
                &mut conn,
                "200 OK",
                mcrelay_control::METRICS_CONTENT_TYPE,
                &body,
            )
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
