//! The helper process: clean up what it inherited ([`sanitize_process`]),
//! then answer the daemon's requests one at a time until the daemon closes
//! the connection ([`serve`]). Control plane only: one log line per request,
//! nothing per packet; no threads.
#![allow(unsafe_code)]

use std::ffi::OsString;
use std::io;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use mcrelay_config::ConfigErrors;
use mcrelay_sys::prctl;
use tracing::{info, warn};

use mcrelay_sockets::OpenedFlow;
use mcrelay_sockets::fdpass::{MAX_FDS_PER_MESSAGE, recv_with_fds, send_with_fds};
use mcrelay_sockets::protocol::{MAX_REQUEST_BYTES, Reply, Request};
use mcrelay_sys::privileges::status_of;

use crate::policy::Policy;

/// The fd the helper finds its connection on (`mcrelay_sockets::spawn`
/// puts it there).
pub use mcrelay_sockets::HELPER_FD;

/// Environment variables the helper keeps; every other one is removed.
///
/// - `RUST_LOG`, `RUST_LOG_STYLE`: the log filter and colouring, so the
///   helper logs like the daemon;
/// - `RUST_BACKTRACE`: only changes what a panic prints;
/// - `JOURNAL_STREAM`: tells a logger that stderr is the systemd journal.
///
/// Deliberately not kept: `NOTIFY_SOCKET` (readiness is the daemon's to
/// report, and the helper must not speak for it), `PATH` (the helper runs
/// nothing), `LD_*`, `HOME`, locale and anything else a library might read.
pub const KEPT_ENVIRONMENT: [&str; 4] = [
    "RUST_LOG",
    "RUST_LOG_STYLE",
    "RUST_BACKTRACE",
    "JOURNAL_STREAM",
];

/// Why the helper stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The configuration file could not be loaded at start.
    #[error("the helper cannot load its configuration:\n{0}")]
    LoadConfig(#[source] ConfigErrors),
    /// Receiving a request failed (not a malformed request: those are
    /// refused and the helper carries on).
    #[error("the helper cannot receive requests: {0}")]
    Receive(#[source] io::Error),
    /// Sending a reply failed other than by the daemon closing.
    #[error("the helper cannot send a reply: {0}")]
    Send(#[source] io::Error),
    /// [`sanitize_process`] failed.
    #[error("the helper cannot sanitize its process: {0}")]
    Sanitize(#[source] io::Error),
    /// The connection fd given to [`run_helper`] is not a Unix
    /// `SOCK_SEQPACKET` socket.
    #[error("fd {fd} is not the helper's connection: {reason}")]
    BadConnection {
        /// The fd.
        fd: RawFd,
        /// What is wrong with it.
        reason: String,
    },
}

/// What a request produced: a plain reply, or sockets to pass.
enum Answer {
    Reply(Reply),
    Sockets(OpenedFlow),
}

/// The helper's state: where its configuration lives and what it allows.
struct Helper<'a> {
    config_path: &'a Path,
    policy: Policy,
}

impl Helper<'_> {
    fn handle(&mut self, request: &Request) -> Answer {
        match request {
            Request::Ping => Answer::Reply(Reply::Pong),
            Request::Reload => match mcrelay_config::load(self.config_path) {
                Ok(config) => {
                    let flows = config.flows.len();
                    self.policy = Policy::new(config);
                    info!(flows, "configuration reloaded");
                    Answer::Reply(Reply::Reloaded { flows })
                }
                Err(errors) => Answer::Reply(refuse(format!(
                    "reload failed; the helper keeps the previous configuration:\n{errors}"
                ))),
            },
            Request::OpenFlow { flow } => match self.policy.open_flow(flow) {
                Ok(sockets) => {
                    for &(index, errno) in &sockets.unconnected {
                        warn!(
                            flow = %flow,
                            output = index,
                            "output opened but not connected ({}); the daemon retries it",
                            io::Error::from_raw_os_error(errno)
                        );
                    }
                    info!(
                        flow = %flow,
                        outputs = sockets.outputs.len(),
                        legs = sockets.legs.len(),
                        receive_buffer_bytes = ?sockets
                            .legs
                            .iter()
                            .map(|l| l.receive_buffer_bytes)
                            .collect::<Vec<_>>(),
                        "opened flow sockets"
                    );
                    Answer::Sockets(sockets)
                }
                Err(refusal) => Answer::Reply(refuse(refusal.to_string())),
            },
        }
    }
}

fn refuse(reason: String) -> Reply {
    warn!(%reason, "request refused");
    Reply::Refused(reason)
}

/// Send `sockets`: a `Sockets` header with the first batch of fds, then
/// `MoreSockets` records for the rest.
fn send_sockets(conn: &UnixStream, sockets: &OpenedFlow) -> io::Result<()> {
    let fds: Vec<BorrowedFd<'_>> = sockets.fds();
    let mut chunks = fds.chunks(MAX_FDS_PER_MESSAGE);
    let first = chunks.next().unwrap_or_default();
    let header = sockets.header();
    send_with_fds(conn, &header.encode(), first)?;
    for chunk in chunks {
        let more = Reply::MoreSockets { count: chunk.len() };
        send_with_fds(conn, &more.encode(), chunk)?;
    }
    Ok(())
}

fn peer_gone(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
    )
}

/// The helper's main loop: load the configuration at `config_path`, then
/// answer requests on `conn` until the daemon closes it (`Ok`).
///
/// Every request is checked against the configuration loaded here, from
/// the file the helper was started with; `Reload` re-reads that same file
/// and keeps the previous configuration if the new one is invalid. A
/// malformed or disallowed request is answered `Refused` and the loop goes
/// on. The sockets opened for a request are closed here once passed.
pub fn serve(conn: UnixStream, config_path: &Path) -> Result<(), ServeError> {
    let config = mcrelay_config::load(config_path).map_err(ServeError::LoadConfig)?;
    info!(
        config = %config_path.display(),
        flows = config.flows.len(),
        "helper ready"
    );
    let mut helper = Helper {
        config_path,
        policy: Policy::new(config),
    };
    let mut buf = vec![0u8; MAX_REQUEST_BYTES];
    loop {
        let reply = match recv_with_fds(&conn, &mut buf, 0) {
            Ok((0, _)) => {
                info!("the daemon closed the connection; helper exiting");
                return Ok(());
            }
            Ok((n, _)) => match Request::decode(&buf[..n]) {
                Ok(request) => {
                    info!(request = %request, "request");
                    helper.handle(&request)
                }
                Err(e) => Answer::Reply(refuse(format!("malformed request: {e}"))),
            },
            // Too long, or fds attached (now closed): refuse, carry on.
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                Answer::Reply(refuse(format!("malformed request: {e}")))
            }
            Err(e) if peer_gone(&e) => {
                info!("the daemon's connection is gone; helper exiting");
                return Ok(());
            }
            Err(e) => return Err(ServeError::Receive(e)),
        };
        let sent = match &reply {
            Answer::Reply(r) => send_with_fds(&conn, &r.encode(), &[]),
            Answer::Sockets(s) => send_sockets(&conn, s),
        };
        match sent {
            Ok(()) => {}
            Err(e) if peer_gone(&e) => {
                info!("the daemon closed the connection before the reply; helper exiting");
                return Ok(());
            }
            Err(e) => return Err(ServeError::Send(e)),
        }
    }
}

/// `close_range(first, last, 0)`.
fn close_range(first: u32, last: u32) -> io::Result<()> {
    if first > last {
        return Ok(());
    }
    // SAFETY: close_range takes three unsigned ints and only closes fds;
    // the caller (`sanitize_process`) owns the contract that no live Rust
    // object owns any fd in the range.
    let rc = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Close every fd except 0, 1, 2 and `keep`.
fn close_inherited_fds(keep: RawFd) -> io::Result<()> {
    let keep = u32::try_from(keep).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("fd {keep} is negative"),
        )
    })?;
    let ranges = if keep < 3 {
        [(3, u32::MAX), (1, 0)]
    } else {
        [(3, keep - 1), (keep.saturating_add(1), u32::MAX)]
    };
    let mut result = Ok(());
    for (first, last) in ranges {
        result = close_range(first, last);
        if result.is_err() {
            break;
        }
    }
    match result {
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
            // Before Linux 5.9: list /proc/self/fd, then close. The list is
            // collected first so the directory's own fd (closed when the
            // iterator drops) is not closed underneath it.
            let fds: Vec<u32> = std::fs::read_dir("/proc/self/fd")?
                .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
                .collect();
            for fd in fds.into_iter().filter(|&fd| fd > 2 && fd != keep) {
                if let Ok(raw) = RawFd::try_from(fd) {
                    // SAFETY: as above: the caller guarantees no live
                    // object owns this fd; EBADF is harmless.
                    unsafe { libc::close(raw) };
                }
            }
            Ok(())
        }
        other => other,
    }
}

/// The first thing the helper process does: drop what it inherited.
///
/// 1. checks that the process is single-threaded (an error otherwise);
/// 2. closes every fd except 0, 1, 2 and `connection_fd` (`close_range`, or
///    a walk of `/proc/self/fd` on kernels before 5.9);
/// 3. removes every environment variable but [`KEPT_ENVIRONMENT`];
/// 4. `PR_SET_DUMPABLE 0`: no core dumps, and processes of the same uid
///    cannot ptrace it or read its memory;
/// 5. `PR_SET_PDEATHSIG SIGTERM`: the helper dies with the daemon. The
///    signal follows the *thread* that spawned the helper, so spawn it from
///    the daemon's main thread; and if the daemon died before this call,
///    the helper finds its connection closed and [`serve`] returns.
///
/// # Safety
///
/// No fd other than 0, 1, 2 and `connection_fd` may be owned by anything in
/// the process (an `OwnedFd`, a `File`, a logger's file): they are closed
/// underneath their owners. Call it first in `main`, before opening
/// anything.
pub unsafe fn sanitize_process(connection_fd: RawFd) -> io::Result<()> {
    let threads = status_of(std::process::id())?.threads;
    if threads != 1 {
        return Err(io::Error::other(format!(
            "sanitize_process must run while the process is single-threaded; it has {threads} threads"
        )));
    }
    close_inherited_fds(connection_fd)?;
    let remove: Vec<OsString> = std::env::vars_os()
        .map(|(k, _)| k)
        .filter(|k| !KEPT_ENVIRONMENT.iter().any(|kept| k == kept))
        .collect();
    for key in remove {
        // SAFETY: the process is single-threaded (checked above; only this
        // thread could have started another since, and it did not), so
        // nothing reads or writes the environment concurrently.
        unsafe { std::env::remove_var(key) };
    }
    prctl::set_dumpable(false)?;
    prctl::terminate_with_parent()
}

/// The helper process's entry point, after argument parsing: sanitize the
/// process keeping `connection_fd` ([`HELPER_FD`] when started by
/// `mcrelay_sockets::spawn_helper`), check that fd is a Unix `SOCK_SEQPACKET`
/// socket, take ownership of it and [`serve`] on it.
///
/// # Safety
///
/// As for [`sanitize_process`]; and `connection_fd`, if open, is owned by
/// nothing else in the process (this function takes ownership of it).
pub unsafe fn run_helper(connection_fd: RawFd, config_path: &Path) -> Result<(), ServeError> {
    // SAFETY: forwarded from this function's contract.
    unsafe { sanitize_process(connection_fd) }.map_err(ServeError::Sanitize)?;
    // SAFETY: forwarded from this function's contract.
    let conn = unsafe { take_connection(connection_fd) }?;
    serve(conn, config_path)
}

/// Take ownership of `connection_fd`, checking that it is an open Unix
/// `SOCK_SEQPACKET` socket.
///
/// # Safety
///
/// `connection_fd`, if open, is owned by nothing else in the process.
pub(crate) unsafe fn take_connection(connection_fd: RawFd) -> Result<UnixStream, ServeError> {
    let bad = |reason: String| ServeError::BadConnection {
        fd: connection_fd,
        reason,
    };
    // SAFETY: F_GETFD only reads the fd's flags; an invalid fd gives EBADF.
    if unsafe { libc::fcntl(connection_fd, libc::F_GETFD) } < 0 {
        return Err(bad(io::Error::last_os_error().to_string()));
    }
    // SAFETY: the fd is open (checked above) and, by this function's
    // contract, owned by nothing else; from here `conn` owns it.
    let conn = UnixStream::from(unsafe { OwnedFd::from_raw_fd(connection_fd) });
    let sock = socket2::SockRef::from(&conn);
    let domain = sock.domain().map_err(|e| bad(e.to_string()))?;
    let kind = sock.r#type().map_err(|e| bad(e.to_string()))?;
    if domain != socket2::Domain::UNIX || kind != socket2::Type::SEQPACKET {
        return Err(bad(format!(
            "expected a Unix SOCK_SEQPACKET socket, found {domain:?} {kind:?}"
        )));
    }
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcrelay_sockets::fdpass::pair;
    use std::os::fd::AsFd;
    use std::path::PathBuf;

    fn write_config(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "mcrelay-helper-server-{}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let path = dir.join("mcrelay.toml");
        std::fs::write(&path, text).expect("write");
        path
    }

    fn ask(conn: &UnixStream, bytes: &[u8]) -> (Reply, usize) {
        send_with_fds(conn, bytes, &[]).expect("send");
        let mut buf = [0u8; 8192];
        let (n, fds) = recv_with_fds(conn, &mut buf, MAX_FDS_PER_MESSAGE).expect("recv");
        (Reply::decode(&buf[..n]).expect("reply"), fds.len())
    }

    #[test]
    fn malformed_requests_are_refused_and_the_helper_carries_on() {
        let path = write_config(
            "malformed",
            "[[flow]]\nname = \"f\"\ninput = { interface = \"lo\", address = \"127.0.0.1\", port = 1 }\noutputs = [{ interface = \"lo\", address = \"127.0.0.1\", port = 2 }]\n",
        );
        let (daemon, helper) = pair().expect("pair");
        let server = std::thread::spawn(move || serve(helper, &path).map(|()| path));
        for bad in [
            &b"HELLO"[..],
            b"PING now",
            b"OPEN ",
            b"\xff\xfe",
            &[b'x'; 2000],
        ] {
            let (reply, fds) = ask(&daemon, bad);
            assert!(
                matches!(reply, Reply::Refused(ref r) if r.starts_with("malformed request")),
                "{bad:?}: {reply:?}"
            );
            assert_eq!(fds, 0);
        }
        // A request with fds attached is refused, and they are closed.
        let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        send_with_fds(&daemon, b"PING", &[s.as_fd()]).expect("send");
        let mut buf = [0u8; 512];
        let (n, _) = recv_with_fds(&daemon, &mut buf, 0).expect("recv");
        assert!(matches!(Reply::decode(&buf[..n]), Ok(Reply::Refused(_))));
        assert_eq!(ask(&daemon, b"PING"), (Reply::Pong, 0));
        drop(daemon);
        let path = server.join().expect("no panic").expect("clean exit");
        let _ = std::fs::remove_dir_all(path.parent().expect("dir"));
    }

    #[test]
    fn a_missing_config_stops_the_helper_with_the_file_named() {
        let (_daemon, helper) = pair().expect("pair");
        let e = serve(helper, Path::new("/nonexistent/mcrelay.toml")).expect_err("no file");
        assert!(e.to_string().contains("/nonexistent/mcrelay.toml"), "{e}");
    }

    #[test]
    fn sanitize_refuses_a_multithreaded_process() {
        // The test harness runs this on a worker thread: more than one
        // thread, so nothing is closed or cleared.
        let threads = status_of(std::process::id()).expect("status").threads;
        if threads < 2 {
            // Never run the real thing inside the test process.
            eprintln!("SKIPPED: the harness runs tests on the main thread here");
            return;
        }
        let before = std::env::vars_os().count();
        // SAFETY: it refuses before closing anything (the check is first).
        let e = unsafe { sanitize_process(HELPER_FD) }.expect_err("threads");
        assert!(e.to_string().contains("single-threaded"), "{e}");
        assert_eq!(std::env::vars_os().count(), before);
    }
}
