//! Starting the privileged side and watching it, from the daemon: the
//! zygote ([`Zygote::spawn`], the `mcrelay-helper` program with its end of
//! a `SOCK_SEQPACKET` pair on fd [`HELPER_FD`]), each helper it forks
//! ([`Zygote::helper`]), and a helper's hang-up ([`hung_up`],
//! [`watch_hangup`]). [`spawn_helper`] starts a lone helper without a
//! zygote (tests).
//!
//! The zygote answers one request, `FORK`, with `FORKED <pid>` and the
//! daemon's end of a new helper's connection attached; the other side of
//! this exchange is the zygote loop in the `mcrelay-helper` crate.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use mcrelay_sys::prctl;
use tracing::warn;

use crate::client::{DEFAULT_TIMEOUT, HelperClient};
use crate::fdpass::{pair, recv_with_fds, send_with_fds};

/// The fd the helper and the zygote find their connection on.
pub const HELPER_FD: RawFd = 3;

/// The zygote's one request.
pub const FORK: &[u8] = b"FORK";
/// The zygote's answer's prefix, followed by the new helper's pid; one fd
/// attached.
pub const FORKED: &str = "FORKED ";

/// Start the helper: `exe args...` with its end of a new `SOCK_SEQPACKET`
/// pair as fd 3 ([`HELPER_FD`]) and stdin on `/dev/null` (stdout and
/// stderr inherited, for its logs); returns the child and a
/// [`HelperClient`] on the daemon's end.
///
/// The child gets `PR_SET_PDEATHSIG SIGTERM` before `exec` (the helper sets
/// it again in the helper's `sanitize_process`, as exec of a binary with file
/// capabilities clears it). That signal follows the *thread* that called
/// this function, so call it from the daemon's main thread, before other
/// threads start (they could also close and reuse fds meanwhile).
pub fn spawn_helper(exe: &Path, args: &[&str]) -> io::Result<(Child, HelperClient)> {
    let (child, daemon_end) = spawn_connected(exe, args)?;
    match HelperClient::new(daemon_end) {
        Ok(client) => Ok((child, client)),
        Err(e) => {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
            Err(e)
        }
    }
}

/// `exe args...` with its end of a new `SOCK_SEQPACKET` pair as fd 3
/// ([`HELPER_FD`]), stdin on `/dev/null` and `PR_SET_PDEATHSIG SIGTERM`;
/// the child and this process's end. The same contract as
/// [`spawn_helper`], which it serves (and [`Zygote::spawn`]).
pub fn spawn_connected(
    exe: &Path,
    args: &[&str],
) -> io::Result<(Child, std::os::unix::net::UnixStream)> {
    let (daemon_end, helper_end) = pair()?;
    let mut helper_end = OwnedFd::from(helper_end);
    if helper_end.as_raw_fd() < 3 {
        // Stdio set-up in the child would overwrite fds 0-2; `try_clone`
        // duplicates to the lowest free fd >= 3, close-on-exec.
        helper_end = helper_end.try_clone()?;
    }
    let fd = helper_end.as_raw_fd();
    let in_child = move || -> io::Result<()> {
        if fd == HELPER_FD {
            // dup2 onto itself would keep close-on-exec: clear it instead.
            // SAFETY: fcntl is async-signal-safe; `fd` is open (the parent
            // keeps `helper_end` until after spawn returns).
            if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } < 0 {
                return Err(io::Error::last_os_error());
            }
        } else {
            // SAFETY: dup2 is async-signal-safe; `fd` is open (as above);
            // the copy at HELPER_FD has close-on-exec clear.
            if unsafe { libc::dup2(fd, HELPER_FD) } < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        // A plain prctl syscall through nix: async-signal-safe.
        prctl::terminate_with_parent()
    };
    let mut command = Command::new(exe);
    command.args(args).stdin(Stdio::null());
    // SAFETY: the closure runs in the forked child before exec, where only
    // async-signal-safe calls are allowed: it makes only fcntl, dup2 and
    // prctl syscalls, allocates nothing (a raw `io::Error` does not), takes
    // no locks and touches only the `Copy` fd number it captured.
    unsafe { command.pre_exec(in_child) };
    let child = command.spawn()?;
    drop(helper_end);
    Ok((child, daemon_end))
}

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
