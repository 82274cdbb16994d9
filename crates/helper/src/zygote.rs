//! The zygote: a minimal privileged parent whose only job is to fork
//! helpers, so that a helper that dies comes back with its privileges.
//!
//! The daemon starts it once, while it still holds privileges
//! (`mcrelay_sockets::spawn::Zygote::spawn` runs this program), then drops
//! its own. The zygote sanitizes its process
//! like the helper ([`crate::sanitize_process`]), ignores `SIGHUP` and
//! `SIGINT` (a `systemctl kill -s HUP` reaches the whole cgroup; it and its
//! helpers follow the daemon, not the signal), keeps only
//! [`HELPER_CAPABILITIES`] — as the service user when started as root, the
//! bounding set trimmed to the same three — and holds them *permitted only*:
//! it never opens a socket. Then it answers one request, `FORK`: it makes a
//! new connection pair, forks, and passes the daemon's end back; the child
//! raises the kept capabilities and becomes a helper ([`crate::serve`]) on
//! the other end. Forking (not exec) keeps the helper the very code the
//! zygote was started with, even after a package upgrade replaced the
//! binary on disk.
//!
//! The daemon learns that a helper died when its connection hangs up, or
//! that it is stuck when it stops answering (`mcrelay_sockets::spawn`), and
//! asks the zygote for another.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use mcrelay_sockets::fdpass::{pair, recv_with_fds, send_with_fds};
use mcrelay_sockets::spawn::{FORK, FORKED};
use mcrelay_sys::prctl;
use mcrelay_sys::privileges::{
    HELPER_CAPABILITIES, keep_only_capabilities, raise_kept_capabilities,
};
use tracing::{info, warn};

use crate::server::{ServeError, sanitize_process, serve, take_connection};

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
