//! The Prometheus endpoint (`daemon.metrics_listen`): `GET /metrics`
//! answered with the shared snapshot in the text format, or in OpenMetrics
//! when the request's `Accept` header prefers it (Prometheus' does). Reading the
//! counters takes relaxed loads only, so a scrape never slows a worker.
//!
//! Who gets in, decided at accept, before any thread or read:
//! - a peer outside `daemon.metrics_allow` (when set) is closed at once
//!   with a reset: no thread, no read, no reply;
//! - one address holds at most [`PER_ADDRESS`] connections: a newer one
//!   from it shuts down its oldest that is still reading its request, or,
//!   when all of them are being answered, is itself closed;
//! - at most [`MAX_CONNECTIONS`] in all: when every slot is taken, the
//!   oldest connection still reading its request, from the address that
//!   holds the most, is shut down to make room; when every one is being
//!   answered, the new one is closed.
//!
//! So a flood from one address, however fast and however slowly it
//! writes, holds at most [`PER_ADDRESS`] slots and only ever displaces its
//! own connections: a scraper at another address always finds room, and
//! once its request is in, nothing displaces it. Each served connection
//! has one thread and one deadline from its accept ([`DEADLINE`]) for
//! reading the request and writing the reply, however slowly its bytes
//! trickle in. Every refusal and displacement is counted
//! ([`EndpointCounters`], `mcrelay_metrics_connections_*`).

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use mcrelay_config::Cidr;
use mcrelay_control::EndpointSnapshot;

use crate::daemon::{SharedHandle, lock};

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = crate::fdbudget::METRICS_CONNECTIONS;
/// Connections served at once from one address. A Prometheus server has
/// one scrape of a target in flight at a time; four leave room for a
/// second server or a person with curl behind the same address.
pub const PER_ADDRESS: usize = 4;
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

/// What the endpoint did with the connections it accepted; written by its
/// accept loop, read by snapshots.
#[derive(Debug, Default)]
pub struct EndpointCounters {
    served: AtomicU64,
    refused_not_allowed: AtomicU64,
    refused_address_cap: AtomicU64,
    refused_full: AtomicU64,
    displaced_address_cap: AtomicU64,
    displaced_full: AtomicU64,
}

impl EndpointCounters {
    pub fn snapshot(&self) -> EndpointSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        EndpointSnapshot {
            served: get(&self.served),
            refused_not_allowed: get(&self.refused_not_allowed),
            refused_address_cap: get(&self.refused_address_cap),
            refused_full: get(&self.refused_full),
            displaced_address_cap: get(&self.displaced_address_cap),
            displaced_full: get(&self.displaced_full),
        }
    }
}

fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Serve the bound endpoint on a thread for the life of the process,
/// to the peers in `allow` (`None`: every peer).
pub fn start(
    listener: TcpListener,
    shared: SharedHandle,
    allow: Option<Vec<Cidr>>,
) -> Result<SocketAddr, MetricsError> {
    let bound = listener.local_addr().map_err(MetricsError::Address)?;
    match &allow {
        Some(list) => {
            let list: Vec<String> = list.iter().map(ToString::to_string).collect();
            tracing::info!(%bound, allow = %list.join(", "), "metrics endpoint listening on /metrics");
        }
        None => {
            tracing::info!(%bound, "metrics endpoint listening on /metrics (every address allowed)")
        }
    }
    let counters = Arc::new(EndpointCounters::default());
    lock(&shared).metrics_endpoint = Some(Arc::clone(&counters));
    std::thread::Builder::new()
        .name("mcrelay-metrics".into())
        .spawn(move || serve(&listener, &shared, allow.as_deref(), &counters))
        .map_err(MetricsError::Thread)?;
    Ok(bound)
}

fn serve(
    listener: &TcpListener,
    shared: &SharedHandle,
    allow: Option<&[Cidr]>,
    counters: &Arc<EndpointCounters>,
) {
    let slots = Arc::new(Slots::default());
    let mut id = 0u64;
    loop {
        let Ok((conn, peer)) = listener.accept() else {
            // Out of fds (EMFILE) or memory: wait instead of spinning.
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let accepted = Instant::now();
        let peer = peer.ip().to_canonical();
        if allow.is_some_and(|list| !list.iter().any(|c| c.contains(peer))) {
            inc(&counters.refused_not_allowed);
            refuse(&conn);
            continue;
        }
        let Ok(handle) = conn.try_clone() else {
            continue;
        };
        id += 1;
        if let Err(refused) = slots.admit(id, peer, handle, counters) {
            inc(refused);
            refuse(&conn);
            continue;
        }
        inc(&counters.served);
        let (shared, mine) = (Arc::clone(shared), Arc::clone(&slots));
        let this = id;
        let spawned = std::thread::Builder::new()
            .name("mcrelay-scrape".into())
            .spawn(move || {
                let _ = answer(conn, accepted, &shared, &mine, this);
                mine.leave(this);
            });
        if spawned.is_err() {
            slots.leave(id);
            tracing::warn!("metrics connection thread could not start");
        }
    }
}

/// Close a connection refused at accept with a reset (`SO_LINGER` 0): no
/// reply, and no `TIME_WAIT` left behind on this side for a flood.
fn refuse(conn: &TcpStream) {
    let _ = socket2::SockRef::from(conn).set_linger(Some(Duration::ZERO));
}

/// A connection being served.
#[derive(Debug)]
struct Slot {
    id: u64,
    peer: IpAddr,
    /// Its request is in: it is being answered and is never displaced.
    answering: bool,
    /// To shut it down (its thread's read or write then fails at once).
    conn: TcpStream,
}

/// The connections being served, oldest first.
#[derive(Debug, Default)]
struct Slots(Mutex<VecDeque<Slot>>);

impl Slots {
    /// Admit connection `id` from `peer`, making room by the rules in the
    /// module's documentation (counted in `counters`); the counter of
    /// the reason when it is refused instead.
    fn admit<'c>(
        &self,
        id: u64,
        peer: IpAddr,
        conn: TcpStream,
        counters: &'c EndpointCounters,
    ) -> Result<(), &'c AtomicU64> {
        let mut held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let from =
            |held: &VecDeque<Slot>, peer: IpAddr| held.iter().filter(|s| s.peer == peer).count();
        if from(&held, peer) >= PER_ADDRESS {
            let Some(i) = held.iter().position(|s| s.peer == peer && !s.answering) else {
                return Err(&counters.refused_address_cap);
            };
            displace(&mut held, i);
            inc(&counters.displaced_address_cap);
        } else if held.len() >= MAX_CONNECTIONS {
            // The oldest still reading, of the address holding the most.
            let victim = held
                .iter()
                .enumerate()
                .filter(|(_, s)| !s.answering)
                .max_by_key(|&(i, s)| (from(&held, s.peer), std::cmp::Reverse(i)))
                .map(|(i, _)| i);
            let Some(i) = victim else {
                return Err(&counters.refused_full);
            };
            displace(&mut held, i);
            inc(&counters.displaced_full);
        }
        held.push_back(Slot {
            id,
            peer,
            answering: false,
            conn,
        });
        Ok(())
    }

    /// Connection `id`'s request is in; `false` when it was displaced.
    fn answering(&self, id: u64) -> bool {
        let mut held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        held.iter_mut()
            .find(|s| s.id == id)
            .map(|s| s.answering = true)
            .is_some()
    }

    fn leave(&self, id: u64) {
        let mut held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        held.retain(|s| s.id != id);
    }
}

fn displace(held: &mut VecDeque<Slot>, i: usize) {
    if let Some(s) = held.remove(i) {
        let _ = s.conn.shutdown(Shutdown::Both);
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

fn answer(
    mut conn: TcpStream,
    accepted: Instant,
    shared: &SharedHandle,
    slots: &Slots,
    id: u64,
) -> std::io::Result<()> {
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
    if !slots.answering(id) {
        // Displaced while its last bytes arrived.
        return Ok(());
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

    /// A connected pair on loopback: the client's end and the server's.
    fn pair(listener: &TcpListener) -> (TcpStream, TcpStream) {
        let client = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        (client, server)
    }

    fn ids(slots: &Slots) -> Vec<u64> {
        slots.0.lock().expect("lock").iter().map(|s| s.id).collect()
    }

    fn closed(client: &mut TcpStream) -> bool {
        let mut byte = [0u8; 1];
        matches!(client.read(&mut byte), Ok(0) | Err(_))
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("address")
    }

    #[test]
    fn one_address_holds_its_share_and_displaces_only_its_own() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let (slots, counters) = (Slots::default(), EndpointCounters::default());
        let (flood, scraper) = (ip("10.0.0.66"), ip("10.0.0.7"));
        let (_c, s) = pair(&listener);
        slots.admit(1, scraper, s, &counters).expect("admitted");
        let mut clients = Vec::new();
        for id in 2..=20 {
            let (c, s) = pair(&listener);
            slots.admit(id, flood, s, &counters).expect("admitted");
            clients.push(c);
        }
        // The flood keeps its newest four; the scraper was never touched.
        assert_eq!(ids(&slots), [1, 17, 18, 19, 20]);
        assert!(closed(&mut clients[0]), "the flood's oldest was shut down");
        let seen = counters.snapshot();
        assert_eq!(seen.displaced_address_cap, 15);
        assert_eq!(seen.displaced_full, 0);
        // Once all four are being answered, a fifth is refused.
        for id in 17..=20 {
            assert!(slots.answering(id));
        }
        let (_c, s) = pair(&listener);
        assert!(std::ptr::eq(
            slots.admit(21, flood, s, &counters).expect_err("refused"),
            &counters.refused_address_cap
        ));
        slots.leave(18);
        assert_eq!(ids(&slots), [1, 17, 19, 20]);
        assert!(!slots.answering(18), "gone");
    }

    #[test]
    fn a_full_house_makes_room_from_the_address_holding_most() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let (slots, counters) = (Slots::default(), EndpointCounters::default());
        let mut clients = Vec::new();
        let mut id = 0;
        // The scraper first (oldest), then 3 addresses with 4 each and one
        // with 3: 16, a full house.
        let mut add = |peer: &str, clients: &mut Vec<TcpStream>| {
            id += 1;
            let (c, s) = pair(&listener);
            slots.admit(id, ip(peer), s, &counters).expect("admitted");
            clients.push(c);
        };
        add("10.0.0.7", &mut clients);
        for peer in ["10.0.1.1", "10.0.1.2", "10.0.1.3"] {
            for _ in 0..4 {
                add(peer, &mut clients);
            }
        }
        for _ in 0..3 {
            add("10.0.1.4", &mut clients);
        }
        assert_eq!(ids(&slots).len(), MAX_CONNECTIONS);
        // A newcomer displaces the oldest of 10.0.1.1 (holding most, tied,
        // oldest), not the older scraper holding one.
        add("10.0.2.1", &mut clients);
        assert_eq!(ids(&slots)[..2], [1, 3]);
        assert!(closed(&mut clients[1]));
        assert_eq!(counters.snapshot().displaced_full, 1);
        // Every one being answered: the next is refused.
        for i in ids(&slots) {
            assert!(slots.answering(i));
        }
        let (_c, s) = pair(&listener);
        assert!(std::ptr::eq(
            slots
                .admit(99, ip("10.0.3.1"), s, &counters)
                .expect_err("refused"),
            &counters.refused_full
        ));
    }

    /// One request to a real endpoint on loopback (a daemon with no
    /// flows), with `deadline` for the whole reply.
    fn ask(request: &[u8]) -> (String, Duration) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = listener.local_addr().expect("addr");
        let shared = crate::daemon::Shared::empty();
        let counters = Arc::new(EndpointCounters::default());
        std::thread::spawn(move || serve(&listener, &shared, None, &counters));
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
