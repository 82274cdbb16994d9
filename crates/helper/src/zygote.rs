//! The zygote: a minimal privileged parent whose only job is to fork
//! helpers, so that a helper that dies comes back with its privileges.
//!
//! The daemon starts it once, while it still holds privileges
//! ([`Zygote::spawn`]), then drops its own. The zygote sanitizes its process
//! like the helper ([`crate::sanitize_process`]), ignores `SIGHUP` and
//! `SIGINT` (a `systemctl kill -s HUP` reaches the whole cgroup; it and its
//! helpers follow the daemon, not the signal), keeps only
//! [`HELPER_CAPABILITIES`] — as the service user when started as root, the
//! bounding set trimmed to the same three — and holds them *permitted only*:
//! it never opens a socket. Then it answers one request, `FORK`: it makes a
//! new connection pair, forks, and passes the daemon's end back; the child
//! raises the kept capabilities and becomes a helper ([`crate::serve`]) on
//! the other end. Forking (not exec) keeps the helper the very code the
//! daemon was started with, even after a package upgrade replaced the
//! binary on disk.
//!
//! The daemon learns that a helper died when its connection hangs up
//! ([`hung_up`], [`watch_hangup`]) and asks the zygote for another.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Child;
use std::time::Duration;

use mcrelay_sys::prctl;
use tracing::{info, warn};

use crate::client::{DEFAULT_TIMEOUT, HelperClient};
use crate::fdpass::{pair, recv_with_fds, send_with_fds};
use crate::privileges::{
    HELPER_CAPABILITIES, keep_only_capabilities, raise_kept_capabilities, spawn_connected,
};
use crate::server::{ServeError, sanitize_process, serve, take_connection};

/// The one request.
const FORK: &[u8] = b"FORK";
/// The answer's prefix, followed by the new helper's pid; one fd attached.
const FORKED: &str = "FORKED ";

/// Why the zygote could not give the daemon a helper.
#[derive(Debug, thiserror::Error)]
pub enum ZygoteError {
    /// Starting the zygote process failed.
    #[error("cannot start the privileged zygote: {0}")]
    Spawn(#[source] io::Error),
    /// The request could not be sent: the zygote is gone or stuck.
    #[error("cannot ask the privileged zygote for a helper (it exited or is stuck): {0}")]
    Send(#[source] io::Error),
    /// No answer: the zygote is gone or stuck.
    #[error("the privileged zygote did not answer (it exited or is stuck): {0}")]
    Receive(#[source] io::Error),
    /// The zygote closed the connection.
    #[error("the privileged zygote closed its connection (it exited or was killed)")]
    Closed,
    /// An answer that is not `FORKED <pid>` with one fd.
    #[error("the privileged zygote sent a malformed answer: {0}")]
    Malformed(String),
    /// The new helper's connection could not be set up.
    #[error("cannot set up the new helper's connection: {0}")]
    Client(#[source] io::Error),
}

/// The daemon's handle on the zygote.
#[derive(Debug)]
pub struct Zygote {
    conn: UnixStream,
    child: Child,
}

impl Zygote {
    /// Start `exe args...` as the zygote (its connection on fd 3, as
    /// [`crate::spawn_helper`] does, with the same contract: call it from
    /// the main thread before other threads start).
    pub fn spawn(exe: &Path, args: &[&str]) -> Result<Self, ZygoteError> {
        let (child, conn) = spawn_connected(exe, args).map_err(ZygoteError::Spawn)?;
        let set = |conn: &UnixStream| {
            conn.set_read_timeout(Some(DEFAULT_TIMEOUT))?;
            conn.set_write_timeout(Some(DEFAULT_TIMEOUT))
        };
        let mut zygote = Zygote { conn, child };
        if let Err(e) = set(&zygote.conn) {
            let _ = zygote.child.kill();
            let _ = zygote.child.wait();
            return Err(ZygoteError::Spawn(e));
        }
        Ok(zygote)
    }

    /// The zygote's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Why the zygote is gone, if it is.
    pub fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(format!("the privileged zygote exited ({status})")),
            Ok(None) => None,
            Err(e) => Some(format!("the privileged zygote: {e}")),
        }
    }

    /// A new helper: its pid and a client on its connection.
    pub fn helper(&mut self) -> Result<(u32, HelperClient), ZygoteError> {
        send_with_fds(&self.conn, FORK, &[]).map_err(ZygoteError::Send)?;
        let mut buf = [0u8; 64];
        let (n, mut fds) = recv_with_fds(&self.conn, &mut buf, 1).map_err(|e| {
            if e.kind() == io::ErrorKind::ConnectionReset {
                ZygoteError::Closed
            } else {
                ZygoteError::Receive(e)
            }
        })?;
        if n == 0 {
            return Err(ZygoteError::Closed);
        }
        let text = String::from_utf8_lossy(&buf[..n]);
        let pid = text
            .strip_prefix(FORKED)
            .and_then(|p| p.parse::<u32>().ok())
            .ok_or_else(|| ZygoteError::Malformed(format!("{text:?}")))?;
        let fd = match (fds.pop(), fds.is_empty()) {
            (Some(fd), true) => fd,
            _ => return Err(ZygoteError::Malformed(format!("{text:?} without one fd"))),
        };
        let client = HelperClient::new(UnixStream::from(fd)).map_err(ZygoteError::Client)?;
        Ok((pid, client))
    }
}

/// Whether the peer of `conn` has closed it (the process at the other end
/// exited or was killed), waiting at most `timeout` (`None`: for ever).
/// Pending data does not count: only a hang-up does.
pub fn hung_up(conn: BorrowedFd<'_>, timeout: Option<Duration>) -> io::Result<bool> {
    let millis = timeout.map_or(-1, |t| i32::try_from(t.as_millis()).unwrap_or(i32::MAX));
    // A raw poll: nix's `PollFd::revents` drops every flag it has no name
    // for, and it names no POLLRDHUP, so a hang-up would read as nothing.
    let mut pfd = libc::pollfd {
        fd: conn.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    loop {
        // SAFETY: `pfd` is one live pollfd, the count passed; `conn` is
        // borrowed, so the fd stays open during the call.
        let rc = unsafe { libc::poll(&raw mut pfd, 1, millis) };
        if rc >= 0 {
            return Ok(pfd.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// A thread that calls `then` once the peer of `conn` (a duplicate of the
/// daemon's end of a helper connection) hangs up. The thread keeps `conn`
/// open; that is harmless since only a dead helper is ever replaced.
pub fn watch_hangup(
    conn: OwnedFd,
    then: impl FnOnce() + Send + 'static,
) -> io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("mcrelay-helper-watch".into())
        .spawn(move || match hung_up(conn.as_fd(), None) {
            Ok(true) => then(),
            Ok(false) => {}
            Err(e) => warn!("cannot watch the privileged helper: {e}"),
        })
}

/// What the process is, after [`zygote_loop`] returns.
enum Role {
    /// The daemon closed the connection: exit.
    Done,
    /// This is a freshly forked child of the zygote `parent`: be a helper
    /// on this connection.
    Helper(UnixStream, u32),
}

fn ignore(signal: libc::c_int) -> io::Result<()> {
    // SAFETY: setting a signal's disposition to SIG_IGN installs no handler
    // and touches no memory of ours.
    if unsafe { libc::signal(signal, libc::SIG_IGN) } == libc::SIG_ERR {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The zygote process's entry point, after argument parsing: sanitize the
/// process keeping `connection_fd`, ignore `SIGHUP`/`SIGINT` (and `SIGCHLD`,
/// so dead helpers are reaped by the kernel), keep only
/// [`HELPER_CAPABILITIES`] (as `user` when given: started as root), then
/// fork a helper for each `FORK` request until the daemon closes the
/// connection. In a forked child it returns only once that helper is done.
///
/// # Safety
///
/// As for [`crate::run_helper`].
pub unsafe fn run_zygote(
    connection_fd: RawFd,
    config_path: &Path,
    user: Option<&str>,
) -> Result<(), ServeError> {
    // SAFETY: forwarded from this function's contract.
    unsafe { sanitize_process(connection_fd) }.map_err(ServeError::Sanitize)?;
    for signal in [libc::SIGHUP, libc::SIGINT, libc::SIGCHLD] {
        ignore(signal).map_err(ServeError::Sanitize)?;
    }
    let kept = keep_only_capabilities(HELPER_CAPABILITIES, user).map_err(ServeError::Sanitize)?;
    // A change of uid resets dumpability: make sure again.
    prctl::set_dumpable(false).map_err(ServeError::Sanitize)?;
    // SAFETY: forwarded from this function's contract.
    let conn = unsafe { take_connection(connection_fd) }?;
    info!(
        uid = kept.uid[1],
        permitted = format_args!("{:#x}", kept.cap_prm),
        bounding = format_args!("{:#x}", kept.cap_bnd),
        "privileged zygote ready"
    );
    match zygote_loop(conn).map_err(ServeError::Receive)? {
        Role::Done => Ok(()),
        Role::Helper(conn, parent) => {
            become_helper(parent).map_err(ServeError::Sanitize)?;
            serve(conn, config_path)
        }
    }
}

/// Answer `FORK` requests until the daemon closes `conn`.
fn zygote_loop(conn: UnixStream) -> io::Result<Role> {
    let mut buf = [0u8; 64];
    loop {
        let n = match recv_with_fds(&conn, &mut buf, 0) {
            Ok((0, _)) => return Ok(Role::Done),
            Ok((n, _)) => n,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => 0,
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Ok(Role::Done),
            Err(e) => return Err(e),
        };
        if &buf[..n] != FORK {
            warn!("zygote: malformed request refused");
            send_with_fds(&conn, b"REFUSED malformed request", &[])?;
            continue;
        }
        let (daemon_end, helper_end) = pair()?;
        let zygote = std::process::id();
        // SAFETY: this process is single-threaded (sanitize_process checked
        // it and nothing since started a thread), so the child's copy of
        // every lock and of the allocator is consistent.
        match unsafe { libc::fork() } {
            -1 => {
                let e = io::Error::last_os_error();
                warn!("zygote: fork failed: {e}");
                send_with_fds(&conn, format!("REFUSED fork: {e}").as_bytes(), &[])?;
            }
            0 => {
                drop(conn);
                drop(daemon_end);
                return Ok(Role::Helper(helper_end, zygote));
            }
            pid => {
                drop(helper_end);
                info!(pid, "forked a privileged helper");
                send_with_fds(
                    &conn,
                    format!("{FORKED}{pid}").as_bytes(),
                    &[daemon_end.as_fd()],
                )?;
            }
        }
    }
}

/// In a freshly forked helper: die with the zygote (the parent-death signal
/// is not inherited across fork), and make the kept capabilities effective.
fn become_helper(zygote: u32) -> io::Result<()> {
    prctl::terminate_with_parent()?;
    // The signal only covers a zygote that dies from now on.
    if std::os::unix::process::parent_id() != zygote {
        return Err(io::Error::other(
            "the zygote exited while this helper started",
        ));
    }
    raise_kept_capabilities()?;
    prctl::set_dumpable(false)
}
