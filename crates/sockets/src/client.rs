//! The daemon's side of the helper connection: ask for a flow's sockets, a
//! reload, or a ping, and wait a bounded time for the answer — a dead or
//! stuck helper is an error, never a hang. After an error that may leave a
//! reply unread the client is [`HelperClient::broken`] for good, and the
//! daemon replaces the helper.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::fdpass::{MAX_FDS_PER_MESSAGE, recv_record, send_with_fds};
use crate::opened::OpenedFlow;
use crate::protocol::{MAX_REPLY_BYTES, ProtocolError, Reply, Request};

/// How long [`HelperClient::new`] waits for each reply.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection to the helper, used by one thread at a time (`&mut self`).
#[derive(Debug)]
pub struct HelperClient {
    conn: UnixStream,
    timeout: Duration,
    /// Set after an error that may have left a reply unread: the next
    /// reply could answer an earlier request, so the connection is unusable.
    broken: Option<String>,
    /// The last reply received came with fds this process had no room for.
    out_of_fds: bool,
}

/// Why a request to the helper failed.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    /// The helper refused: not in its configuration, not supported, or the
    /// kernel said no. The connection stays usable.
    #[error("the privileged helper refused: {0}")]
    Refused(String),
    /// The request cannot be expressed (e.g. a flow name with control
    /// characters); nothing was sent.
    #[error("invalid request to the privileged helper: {0}")]
    InvalidRequest(#[source] ProtocolError),
    /// No reply within the timeout: the helper is stuck or gone.
    #[error(
        "the privileged helper did not answer within {0:?}; it is stuck or dead (mcrelayd replaces it)"
    )]
    TimedOut(Duration),
    /// The helper closed its end: it exited or was killed.
    #[error(
        "the privileged helper closed the connection (it exited or was killed; mcrelayd replaces it)"
    )]
    Closed,
    /// A reply that does not follow the protocol.
    #[error("the privileged helper sent a malformed reply: {0}")]
    Malformed(String),
    /// Sending the request failed.
    #[error("cannot send to the privileged helper: {0}")]
    Send(#[source] io::Error),
    /// Receiving the reply failed.
    #[error("cannot receive from the privileged helper: {0}")]
    Receive(#[source] io::Error),
    /// This process had no room for the fds the helper passed (`EMFILE`
    /// or `ENFILE`): they were closed, the connection stays in step, and
    /// the request can be retried once fds are free.
    #[error(
        "out of file descriptors receiving sockets from the privileged helper (EMFILE/ENFILE); \
         will retry — raise LimitNOFILE= in mcrelay.service or run fewer flows"
    )]
    OutOfFds,
    /// An earlier error left the connection out of step.
    #[error("the privileged helper connection failed earlier ({0}); mcrelayd replaces the helper")]
    Broken(String),
}

impl HelperError {
    /// Whether the connection can no longer be trusted to pair replies with
    /// requests.
    fn breaks_connection(&self) -> bool {
        !matches!(
            self,
            HelperError::Refused(_) | HelperError::InvalidRequest(_) | HelperError::OutOfFds
        )
    }
}

impl HelperClient {
    /// A client on `conn` (the daemon's end of [`crate::fdpass::pair`]),
    /// waiting at most [`DEFAULT_TIMEOUT`] for each reply.
    pub fn new(conn: UnixStream) -> io::Result<Self> {
        Self::with_timeout(conn, DEFAULT_TIMEOUT)
    }

    /// A client waiting at most `timeout` (non-zero) for each reply, and as
    /// long to send each request.
    pub fn with_timeout(conn: UnixStream, timeout: Duration) -> io::Result<Self> {
        conn.set_read_timeout(Some(timeout))?;
        conn.set_write_timeout(Some(timeout))?;
        Ok(HelperClient {
            conn,
            timeout,
            broken: None,
            out_of_fds: false,
        })
    }

    /// Ask for the sockets of the flow called `name` in the helper's
    /// configuration: its ingress socket and each output's socket.
    pub fn open_flow(&mut self, name: &str) -> Result<OpenedFlow, HelperError> {
        let request = Request::OpenFlow {
            flow: name.to_owned(),
        };
        self.exchange(&request, |client, reply, fds| match reply {
            Reply::Sockets {
                legs,
                count,
                unconnected,
                xdp_outputs,
            } => {
                let sockets = client.collect_sockets(count, &legs, xdp_outputs, fds)?;
                OpenedFlow::from_reply(&legs, sockets, unconnected, xdp_outputs)
                    .map_err(HelperError::Malformed)
            }
            other => unexpected(other, &fds),
        })
    }

    /// Ask the helper to re-read its configuration file; returns its number
    /// of flows. An invalid file is `Refused`, with the file's errors, and
    /// the helper keeps its previous configuration.
    pub fn reload(&mut self) -> Result<usize, HelperError> {
        self.start_reload()?;
        self.finish_reload()
    }

    /// The first half of [`Self::reload`]: send the request and return at
    /// once, so the helper re-reads its file while the caller reads its
    /// own (a reload of a thousand flows parses the file twice, once per
    /// process). [`Self::finish_reload`] takes the answer; nothing else may
    /// be asked in between.
    pub fn start_reload(&mut self) -> Result<(), HelperError> {
        if let Some(why) = &self.broken {
            return Err(HelperError::Broken(why.clone()));
        }
        let sent = Request::Reload
            .encode()
            .map_err(HelperError::InvalidRequest)
            .and_then(|bytes| self.send(&bytes));
        self.note_broken(&sent);
        sent
    }

    /// The helper's answer to [`Self::start_reload`]: its number of flows.
    pub fn finish_reload(&mut self) -> Result<usize, HelperError> {
        if let Some(why) = &self.broken {
            return Err(HelperError::Broken(why.clone()));
        }
        let result = self.receive().and_then(|(reply, fds)| match reply {
            Reply::Reloaded { flows } if fds.is_empty() => Ok(flows),
            other => unexpected(other, &fds),
        });
        self.note_broken(&result);
        result
    }

    /// Why the connection can no longer be used, if an earlier error left
    /// it out of step (a timeout, a hang-up, a malformed reply): the helper
    /// must be replaced.
    pub fn broken(&self) -> Option<&str> {
        self.broken.as_deref()
    }

    fn note_broken<T>(&mut self, result: &Result<T, HelperError>) {
        if let Err(e) = result
            && e.breaks_connection()
        {
            self.broken = Some(e.to_string());
        }
    }

    /// Check that the helper answers.
    pub fn ping(&mut self) -> Result<(), HelperError> {
        self.exchange(&Request::Ping, |_, reply, fds| match reply {
            Reply::Pong if fds.is_empty() => Ok(()),
            other => unexpected(other, &fds),
        })
    }

    /// Send `request`, receive the first reply and hand it to `then`;
    /// any error that could leave the connection out of step breaks it.
    fn exchange<T>(
        &mut self,
        request: &Request,
        then: impl FnOnce(&mut Self, Reply, Vec<OwnedFd>) -> Result<T, HelperError>,
    ) -> Result<T, HelperError> {
        if let Some(why) = &self.broken {
            return Err(HelperError::Broken(why.clone()));
        }
        let result = request
            .encode()
            .map_err(HelperError::InvalidRequest)
            .and_then(|bytes| self.send(&bytes))
            .and_then(|()| self.receive())
            .and_then(|(reply, fds)| then(self, reply, fds));
        self.note_broken(&result);
        result
    }

    fn send(&self, bytes: &[u8]) -> Result<(), HelperError> {
        send_with_fds(&self.conn, bytes, &[]).map_err(|e| match e.kind() {
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => HelperError::Closed,
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                HelperError::TimedOut(self.timeout)
            }
            _ => HelperError::Send(e),
        })
    }

    /// The next reply and its fds; `self.out_of_fds` says whether fds it
    /// carried were lost to a full fd table.
    fn receive(&mut self) -> Result<(Reply, Vec<OwnedFd>), HelperError> {
        let mut buf = vec![0u8; MAX_REPLY_BYTES];
        let record =
            recv_record(&self.conn, &mut buf, MAX_FDS_PER_MESSAGE).map_err(|e| match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                    HelperError::TimedOut(self.timeout)
                }
                io::ErrorKind::ConnectionReset => HelperError::Closed,
                io::ErrorKind::InvalidData => HelperError::Malformed(e.to_string()),
                _ => HelperError::Receive(e),
            })?;
        let (n, fds) = (record.len, record.fds);
        self.out_of_fds = record.out_of_fds;
        if n == 0 {
            return Err(HelperError::Closed);
        }
        let reply = Reply::decode(&buf[..n]).map_err(|e| HelperError::Malformed(e.to_string()))?;
        Ok((reply, fds))
    }

    /// All `count` fds of a `Sockets` reply: `first` came with the header,
    /// the rest come in `MoreSockets` records. Each must be a datagram
    /// socket.
    fn collect_sockets(
        &mut self,
        count: usize,
        legs: &[crate::protocol::LegHeader],
        xdp_outputs: usize,
        first: Vec<OwnedFd>,
    ) -> Result<Vec<OwnedFd>, HelperError> {
        let malformed = |what: String| Err(HelperError::Malformed(what));
        // Records whose fds didn't fit in this process's fd table are
        // still read to the end of the reply (keeping the connection in
        // step), then the whole reply is given up as `OutOfFds`.
        let mut lost = self.out_of_fds;
        if !lost && first.len() != count.min(MAX_FDS_PER_MESSAGE) {
            return malformed(format!("SOCKETS {count} came with {} fds", first.len()));
        }
        let mut received = count.min(MAX_FDS_PER_MESSAGE);
        let mut all = first;
        while received < count {
            let remaining = count - received;
            match self.receive()? {
                (Reply::MoreSockets { count: n }, _)
                    if self.out_of_fds && n > 0 && n <= remaining =>
                {
                    lost = true;
                    received += n;
                }
                (Reply::MoreSockets { count: n }, more)
                    if n == more.len() && n > 0 && n <= remaining =>
                {
                    all.extend(more);
                    received += n;
                }
                (reply, more) => {
                    return malformed(format!(
                        "expected the next of {remaining} sockets, got {reply:?} with {} fds",
                        more.len()
                    ));
                }
            }
        }
        if lost {
            return Err(HelperError::OutOfFds);
        }
        // Where each leg's ingress fd is: the ingress of an `ingress =
        // "packet"` leg is a raw packet socket; every other fd is a UDP
        // socket.
        let ingress_at: Vec<usize> = legs
            .iter()
            .scan(0, |at, leg| {
                let here = *at;
                *at += leg.fds();
                Some(here)
            })
            .collect();
        // An `ingress = "xdp"` leg's UMEM (a memfd) and `bpf_link` follow
        // its ingress (an AF_XDP socket, SOCK_RAW) and membership: not
        // sockets at all.
        let not_sockets: Vec<usize> = legs
            .iter()
            .zip(&ingress_at)
            .filter(|(leg, _)| leg.xdp)
            .flat_map(|(leg, at)| {
                let after = at + 1 + usize::from(leg.membership);
                [after, after + 1]
            })
            .collect();
        // Last, each `egress = "xdp"` output's AF_XDP socket (SOCK_RAW)
        // and UMEM (a memfd, not a socket).
        let xdp_from = all.len().saturating_sub(2 * xdp_outputs);
        for (i, fd) in all.iter().enumerate() {
            let kind = socket2::SockRef::from(fd).r#type();
            if i >= xdp_from {
                let ok = if (i - xdp_from) % 2 == 0 {
                    matches!(kind, Ok(t) if t == socket2::Type::RAW)
                } else {
                    matches!(&kind, Err(e) if e.raw_os_error() == Some(libc::ENOTSOCK))
                };
                if !ok {
                    return malformed(format!(
                        "an xdp output's AF_XDP socket or UMEM fd is of the wrong kind ({kind:?})"
                    ));
                }
                continue;
            }
            if not_sockets.contains(&i) {
                if !matches!(&kind, Err(e) if e.raw_os_error() == Some(libc::ENOTSOCK)) {
                    return malformed(format!(
                        "an xdp leg's UMEM or link fd is a socket ({kind:?})"
                    ));
                }
                continue;
            }
            let raw_ingress =
                ingress_at.contains(&i) && matches!(kind, Ok(t) if t == socket2::Type::RAW);
            if !raw_ingress && !matches!(kind, Ok(t) if t == socket2::Type::DGRAM) {
                return malformed(format!("a passed fd is not a datagram socket ({kind:?})"));
            }
        }
        Ok(all)
    }
}

impl std::os::fd::AsFd for HelperClient {
    /// The connection, to watch for the helper hanging up
    /// ([`crate::spawn::hung_up`]); never read or write through it.
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.conn.as_fd()
    }
}

fn unexpected<T>(reply: Reply, fds: &[OwnedFd]) -> Result<T, HelperError> {
    match reply {
        Reply::Refused(reason) if fds.is_empty() => Err(HelperError::Refused(reason)),
        other => Err(HelperError::Malformed(format!(
            "unexpected reply {other:?} with {} fds",
            fds.len()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fdpass::{pair, recv_with_fds};
    use std::net::UdpSocket;
    use std::os::fd::AsFd;
    use std::time::Instant;

    #[test]
    fn a_silent_helper_times_out_and_breaks_the_connection() {
        let (daemon, helper) = pair().expect("pair");
        let mut client =
            HelperClient::with_timeout(daemon, Duration::from_millis(50)).expect("client");
        let start = Instant::now();
        let e = client.ping().expect_err("no answer");
        assert!(matches!(e, HelperError::TimedOut(_)), "{e}");
        assert!(start.elapsed() < Duration::from_secs(5));
        // A late answer must not be taken for the next request's.
        send_with_fds(&helper, b"PONG", &[]).expect("late pong");
        let e = client.ping().expect_err("broken");
        assert!(matches!(e, HelperError::Broken(_)), "{e}");
    }

    #[test]
    fn a_full_fd_table_is_retryable_and_keeps_the_connection() {
        // In a child process of its own, with a small fd limit: this
        // fills the fd table.
        const CHILD: &str = "MCRELAY_HELPER_EMFILE_CHILD";
        if std::env::var_os(CHILD).is_none() {
            let out = std::process::Command::new("prlimit")
                .arg("--nofile=256:256")
                .arg(std::env::current_exe().expect("exe"))
                .args([
                    "client::tests::a_full_fd_table_is_retryable_and_keeps_the_connection",
                    "--exact",
                    "--test-threads=1",
                    "--nocapture",
                ])
                .env(CHILD, "1")
                .output()
                .expect("child");
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{text}");
            assert!(text.contains("1 passed"), "{text}");
            return;
        }
        let (daemon, helper) = pair().expect("pair");
        // Two answers, each a flow of 3 sockets, one request at a time.
        // Opened before the fd table fills up.
        let sockets: Vec<UdpSocket> = (0..3).map(|_| udp()).collect();
        std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            for _ in 0..2 {
                if recv_with_fds(&helper, &mut buf, 0).is_err() {
                    return;
                }
                let fds: Vec<_> = sockets.iter().map(AsFd::as_fd).collect();
                let _ = send_with_fds(&helper, b"SOCKETS 100 3", &fds);
            }
            let _ = recv_with_fds(&helper, &mut buf, 0);
        });
        let mut client =
            HelperClient::with_timeout(daemon, Duration::from_secs(10)).expect("client");
        // Fill the fd table but one slot: 3 fds can't all arrive.
        let mut filler = Vec::new();
        loop {
            match std::fs::File::open("/dev/null") {
                Ok(f) => filler.push(f),
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(libc::EMFILE), "{e}");
                    break;
                }
            }
            assert!(filler.len() < 1 << 20, "no fd limit to hit");
        }
        filler.pop();
        let e = client.open_flow("f").expect_err("no room");
        assert!(matches!(e, HelperError::OutOfFds), "{e}");
        assert!(e.to_string().contains("raise LimitNOFILE="), "{e}");
        assert!(client.broken.is_none(), "the connection stays in step");
        drop(filler);
        let flow = client.open_flow("f").expect("retried with fds free");
        assert_eq!(flow.outputs.len(), 2);
    }

    #[test]
    fn a_dead_helper_is_closed() {
        let (daemon, helper) = pair().expect("pair");
        let mut client = HelperClient::new(daemon).expect("client");
        drop(helper);
        let e = client.reload().expect_err("closed");
        assert!(matches!(e, HelperError::Closed), "{e}");
    }

    /// Answers one request with `reply` and `fds` from another thread.
    fn scripted(replies: Vec<(Vec<u8>, Vec<UdpSocket>)>) -> HelperClient {
        let (daemon, helper) = pair().expect("pair");
        std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            let _ = recv_with_fds(&helper, &mut buf, 0);
            for (bytes, sockets) in replies {
                let fds: Vec<_> = sockets.iter().map(AsFd::as_fd).collect();
                let _ = send_with_fds(&helper, &bytes, &fds);
            }
            // Keep the connection open until the client is done.
            let _ = recv_with_fds(&helper, &mut buf, 0);
        });
        HelperClient::with_timeout(daemon, Duration::from_secs(60)).expect("client")
    }

    fn udp() -> UdpSocket {
        UdpSocket::bind("127.0.0.1:0").expect("bind")
    }

    /// An fd that is no socket, passed where a reply's memfd goes.
    fn not_a_socket() -> UdpSocket {
        UdpSocket::from(OwnedFd::from(
            std::fs::File::open("/dev/null").expect("/dev/null"),
        ))
    }

    #[test]
    fn an_xdp_outputs_fds_must_be_a_raw_socket_then_a_non_socket() {
        // A UDP socket where the AF_XDP socket goes: refused.
        let mut c = scripted(vec![(
            b"SOCKETS 4096 4+x1".to_vec(),
            vec![udp(), udp(), udp(), not_a_socket()],
        )]);
        let e = c.open_flow("x").expect_err("malformed");
        assert!(e.to_string().contains("xdp output"), "{e}");
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("SKIPPED the accepted case: an AF_XDP socket needs CAP_NET_RAW");
            return;
        }
        let xsk = UdpSocket::from(mcrelay_sys::xdp::xsk_socket().expect("AF_XDP socket"));
        let mut c = scripted(vec![(
            b"SOCKETS 4096 4+x1".to_vec(),
            vec![udp(), udp(), xsk, not_a_socket()],
        )]);
        let f = c.open_flow("x").expect("accepted");
        assert_eq!((f.outputs.len(), f.xdp_outputs.len()), (1, 1));
    }

    #[test]
    fn refusals_keep_the_connection_and_bad_replies_break_it() {
        let mut c = scripted(vec![(b"REFUSED no flow named \"x\"".to_vec(), vec![])]);
        let e = c.open_flow("x").expect_err("refused");
        assert!(
            matches!(e, HelperError::Refused(ref r) if r == "no flow named \"x\""),
            "{e}"
        );
        assert!(c.broken.is_none());

        let e = c.open_flow("bad\nname").expect_err("invalid");
        assert!(matches!(e, HelperError::InvalidRequest(_)), "{e}");
        assert!(c.broken.is_none());

        for (text, fds) in [
            ("SOCKETS 100 2", 1), // count and fds disagree
            ("SOCKETS 100 0", 0), // no ingress
            ("PONG", 0),          // wrong reply
            ("SOCKETS x", 0),     // not the protocol
            ("REFUSED no", 1),    // fds with a refusal
        ] {
            let bytes = text.as_bytes();
            let sockets = (0..fds).map(|_| udp()).collect();
            let mut c = scripted(vec![(bytes.to_vec(), sockets)]);
            let e = c.open_flow("f").expect_err("malformed");
            assert!(matches!(e, HelperError::Malformed(_)), "{bytes:?}: {e}");
            assert!(matches!(c.ping(), Err(HelperError::Broken(_))));
        }
    }

    #[test]
    fn sockets_split_over_several_messages_are_collected() {
        let total = MAX_FDS_PER_MESSAGE + 3;
        let first: Vec<UdpSocket> = (0..MAX_FDS_PER_MESSAGE).map(|_| udp()).collect();
        let rest: Vec<UdpSocket> = (0..3).map(|_| udp()).collect();
        let ingress_addr = first[0].local_addr().expect("addr");
        let last_addr = rest[2].local_addr().expect("addr");
        let mut c = scripted(vec![
            (format!("SOCKETS 4096 {total}").into_bytes(), first),
            (b"MORE 3".to_vec(), rest),
        ]);
        let f = c.open_flow("big").expect("open");
        assert_eq!(f.legs.len(), 1);
        assert_eq!(f.legs[0].receive_buffer_bytes, 4096);
        let ingress = UdpSocket::from(f.legs.into_iter().next().expect("leg").socket);
        assert_eq!(ingress.local_addr().expect("addr"), ingress_addr);
        assert_eq!(f.outputs.len(), total - 1);
        assert_eq!(f.outputs[total - 2].local_addr().expect("addr"), last_addr);
    }

    #[test]
    fn non_datagram_fds_are_rejected() {
        let (daemon, helper) = pair().expect("pair");
        let (x, _y) = pair().expect("pair");
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            let _ = recv_with_fds(&helper, &mut buf, 0);
            let _ = send_with_fds(&helper, b"SOCKETS 1 1", &[x.as_fd()]);
            let _ = recv_with_fds(&helper, &mut buf, 0);
        });
        let mut c = HelperClient::new(daemon).expect("client");
        let e = c.open_flow("f").expect_err("not udp");
        assert!(e.to_string().contains("not a datagram socket"), "{e}");
    }
}
