//! The control socket (`daemon.control_socket`): JSON lines from
//! `mcrelayctl`, answered from the shared snapshot, or a reload handed to
//! the supervisor. One short-lived thread per client, at most
//! [`MAX_CLIENTS`] at once and [`MAX_CLIENTS_PER_UID`] per peer uid; each
//! request must arrive whole within [`REQUEST_DEADLINE`] of the accept (or
//! of the previous reply), however slowly its bytes trickle in, and every
//! write has a timeout — so a client that sends garbage, sends a megabyte
//! without a newline, sends a byte a second or connects and never reads
//! costs one thread for a few seconds and nothing else, and one user's
//! clients can't lock out another's. The workers never see it.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::time::{Duration, Instant};

use mcrelay_control::{
    LineEvent, LineReader, Mode, ModeOutcome, ReloadOutcome, Request, Response, Summary,
    parse_request,
};

use crate::daemon::{SharedHandle, lock};

/// Clients served at once; more are told to retry and closed.
pub const MAX_CLIENTS: usize = crate::fdbudget::CONTROL_CLIENTS;
/// Clients of one peer uid served at once: one user (the service user, a
/// member of the socket's group) can't take every slot.
pub const MAX_CLIENTS_PER_UID: usize = 4;
/// A request must arrive whole within this long of the accept, or of the
/// reply to the previous request on the connection.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// A reply that can't be written within this long (the client doesn't
/// read) is abandoned and the client closed.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a client's reload may wait for the supervisor.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(30);

/// What the control socket asks of the supervisor.
#[derive(Debug)]
pub enum ToSupervisor {
    /// Reload; the outcome goes back on the sender. `allow_empty` lets it
    /// remove every flow ([`Request::Reload`]).
    Reload {
        allow_empty: bool,
        reply: mpsc::Sender<ReloadOutcome>,
    },
    /// `standby` or `active`: put every worker in `mode`; the outcome (or
    /// why not) goes back on the sender.
    SetMode {
        mode: Mode,
        reply: mpsc::Sender<Result<ModeOutcome, String>>,
    },
}

/// The bound control socket, not yet served.
#[derive(Debug)]
pub struct Bound {
    listener: UnixListener,
    path: std::path::PathBuf,
}

/// Bind the socket (replacing a stale one), mode 0660; when `owner` is
/// given (uid, gid: the service user, when started as root), hand it over
/// so the unprivileged daemon and its group keep access. Nothing follows a
/// link or changes a file by path (see [`crate::socketfile`]); a socket
/// directory someone else could write is refused.
pub fn bind(path: &Path, owner: Option<(u32, u32)>) -> Result<Bound, ControlError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        crate::socketfile::prepare_dir(dir, owner)?;
    }
    let listener = crate::socketfile::bind(path, owner, || {})?;
    Ok(Bound {
        listener,
        path: path.to_owned(),
    })
}

/// Serve the bound socket on a thread for the life of the process.
pub fn start(
    bound: Bound,
    shared: SharedHandle,
    supervisor: mpsc::Sender<ToSupervisor>,
) -> Result<(), ControlError> {
    let Bound { listener, path } = bound;
    let policy = Policy::for_socket(&path);
    tracing::info!(path = %path.display(), "control socket listening");
    std::thread::Builder::new()
        .name("mcrelay-control".into())
        .spawn(move || serve(&listener, &path, &policy, &shared, &supervisor))
        .map_err(ControlError::Thread)?;
    Ok(())
}

/// Why the control socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Its directory or the socket file itself.
    #[error(transparent)]
    SocketFile(#[from] crate::socketfile::SocketFileError),
    #[error("starting the control thread")]
    Thread(#[source] std::io::Error),
}

/// Who may talk to the daemon: root, the daemon's own user, and members of
/// the socket's group, as primary or supplementary group (its file mode
/// already keeps everyone else from connecting; this holds even if someone
/// loosens the mode).
#[derive(Debug, Clone, Copy)]
struct Policy {
    uid: u32,
    gid: u32,
}

impl Policy {
    fn for_socket(path: &Path) -> Self {
        // The effective uid from /proc/self/status: /proc/self itself is
        // root's once the process is no longer dumpable.
        let me = mcrelay_sys::privileges::status_of(std::process::id()).map_or(0, |s| s.uid[1]);
        let gid = std::fs::metadata(path).map(|m| m.gid()).unwrap_or(0);
        Self { uid: me, gid }
    }

    fn allows(&self, peer: &Peer) -> bool {
        peer.uid == 0
            || peer.uid == self.uid
            || peer.gid == self.gid
            || peer.groups.contains(&self.gid)
    }
}

fn serve(
    listener: &UnixListener,
    path: &Path,
    policy: &Policy,
    shared: &SharedHandle,
    supervisor: &mpsc::Sender<ToSupervisor>,
) {
    let slots = Arc::new(Slots::default());
    for conn in listener.incoming() {
        let mut conn = match conn {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(path = %path.display(), "control accept failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let accepted = Instant::now();
        let _ = conn.set_write_timeout(Some(WRITE_TIMEOUT));
        let who = match peer(&conn) {
            Some(p) if policy.allows(&p) => p,
            other => {
                tracing::warn!(peer = ?other, "control client refused: not root, the service user or its group");
                let _ = conn.write_all(
                    Response::error("permission denied: the control socket serves root, the mcrelay user and its group")
                        .encode()
                        .as_bytes(),
                );
                continue;
            }
        };
        if let Err(busy) = slots.take(who.uid) {
            let _ = conn.write_all(Response::error(busy).encode().as_bytes());
            continue;
        }
        let (shared, supervisor, held) =
            (Arc::clone(shared), supervisor.clone(), Arc::clone(&slots));
        let uid = who.uid;
        let spawned = std::thread::Builder::new()
            .name("mcrelay-ctl-client".into())
            .spawn(move || {
                client(conn, accepted, &shared, &supervisor);
                held.give(uid);
            });
        if spawned.is_err() {
            slots.give(uid);
            tracing::warn!("control client thread could not start");
        }
    }
}

/// The clients being served, in all and per peer uid.
#[derive(Debug, Default)]
struct Slots(Mutex<HashMap<u32, usize>>);

impl Slots {
    /// Count one more client of `uid`, or say why not.
    fn take(&self, uid: u32) -> Result<(), String> {
        let mut held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let total: usize = held.values().sum();
        let mine = held.get(&uid).copied().unwrap_or(0);
        if total >= MAX_CLIENTS {
            return Err(format!(
                "busy: {MAX_CLIENTS} clients already connected; retry"
            ));
        }
        if mine >= MAX_CLIENTS_PER_UID {
            return Err(format!(
                "busy: uid {uid} already has {MAX_CLIENTS_PER_UID} clients connected; retry"
            ));
        }
        *held.entry(uid).or_default() += 1;
        Ok(())
    }

    fn give(&self, uid: u32) {
        let mut held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = held.get_mut(&uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&uid);
            }
        }
    }
}

/// Who connected (`SO_PEERCRED`, `SO_PEERGROUPS`).
#[derive(Debug)]
struct Peer {
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
}

fn peer(conn: &UnixStream) -> Option<Peer> {
    let cred = crate::peercred::peer_cred(conn).ok()?;
    // A kernel without SO_PEERGROUPS (before 4.13): the primary group only.
    let groups = crate::peercred::peer_groups(conn).unwrap_or_default();
    Some(Peer {
        uid: cred.uid,
        gid: cred.gid,
        groups,
    })
}

/// Serve one client: answer each request line until it closes, misses its
/// request deadline, or stops reading.
fn client(
    mut conn: UnixStream,
    accepted: Instant,
    shared: &SharedHandle,
    supervisor: &mpsc::Sender<ToSupervisor>,
) {
    let mut reader = LineReader::new();
    let mut chunk = [0u8; 4096];
    let mut deadline = accepted + REQUEST_DEADLINE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || conn.set_read_timeout(Some(left)).is_err() {
            return;
        }
        let n = match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut replies: Vec<Response> = Vec::new();
        reader.feed(&chunk[..n], |event| {
            replies.push(match event {
                LineEvent::Line(line) => match parse_request(line) {
                    Ok(request) => answer(request, shared, supervisor),
                    Err(e) => Response::error(&e),
                },
                LineEvent::TooLong => Response::error(format!(
                    "request longer than {} bytes; closing",
                    mcrelay_control::MAX_REQUEST_BYTES
                )),
            });
        });
        let answered = !replies.is_empty();
        for reply in replies {
            if conn.write_all(reply.encode().as_bytes()).is_err() {
                // Doesn't read (or is gone): drop it.
                return;
            }
        }
        if reader.is_discarding() {
            return;
        }
        if answered {
            // The next request gets a deadline of its own.
            deadline = Instant::now() + REQUEST_DEADLINE;
        }
    }
}

fn answer(
    request: Request,
    shared: &SharedHandle,
    supervisor: &mpsc::Sender<ToSupervisor>,
) -> Response {
    match request {
        Request::Status { summary: true } => {
            // Locked to take the snapshot only, not to summarise it.
            let snapshot = lock(shared).read();
            Response::ok(&Summary::of(&snapshot))
        }
        Request::Status { summary: false } | Request::Flows | Request::Stats => {
            // Locked to take the snapshot only, not to serialize it.
            let snapshot = lock(shared).read();
            Response::ok(&snapshot)
        }
        Request::Reload { allow_empty } => {
            match ask(supervisor, "reload", |reply| ToSupervisor::Reload {
                allow_empty,
                reply,
            }) {
                Ok(outcome) => Response::ok(&outcome),
                Err(response) => response,
            }
        }
        // The same peers as reload may change the mode: the socket serves
        // only root, the service user and its group.
        Request::Standby => set_mode(Mode::Standby, supervisor),
        Request::Active => set_mode(Mode::Active, supervisor),
    }
}

/// Hand a request to the supervisor and wait for its answer, at most
/// [`RELOAD_TIMEOUT`]; the error response when it can't be had.
fn ask<T>(
    supervisor: &mpsc::Sender<ToSupervisor>,
    what: &str,
    request: impl FnOnce(mpsc::Sender<T>) -> ToSupervisor,
) -> Result<T, Response> {
    let (reply, rx) = mpsc::channel();
    if supervisor.send(request(reply)).is_err() {
        return Err(Response::error("the daemon is stopping"));
    }
    rx.recv_timeout(RELOAD_TIMEOUT).map_err(|_| {
        Response::error(format!(
            "the {what} did not finish within {RELOAD_TIMEOUT:?}; see the daemon's log"
        ))
    })
}

fn set_mode(mode: Mode, supervisor: &mpsc::Sender<ToSupervisor>) -> Response {
    match ask(supervisor, "mode change", |reply| ToSupervisor::SetMode {
        mode,
        reply,
    }) {
        Ok(Ok(outcome)) => Response::ok(&outcome),
        Ok(Err(why)) => Response::error(why),
        Err(response) => response,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_supplementary_member_of_the_socket_group_is_allowed() {
        let policy = Policy { uid: 900, gid: 901 };
        let peer = |uid, gid, groups: &[u32]| Peer {
            uid,
            gid,
            groups: groups.to_vec(),
        };
        assert!(policy.allows(&peer(0, 0, &[])));
        assert!(policy.allows(&peer(900, 5, &[])));
        assert!(policy.allows(&peer(1000, 901, &[])));
        assert!(policy.allows(&peer(1000, 1000, &[1000, 901])));
        assert!(!policy.allows(&peer(1000, 1000, &[1000, 27])));
    }

    #[test]
    fn one_uid_gets_a_few_slots_and_the_rest_stay_free() {
        let slots = Slots::default();
        for _ in 0..MAX_CLIENTS_PER_UID {
            slots.take(7).expect("within the per-uid cap");
        }
        let busy = slots.take(7).expect_err("over the per-uid cap");
        assert!(busy.contains("uid 7 already has 4"), "{busy}");
        slots.take(0).expect("another uid still gets in");
        slots.give(7);
        slots.take(7).expect("a slot came back");
        for uid in 100..103 {
            for _ in 0..MAX_CLIENTS_PER_UID {
                let _ = slots.take(uid);
            }
        }
        assert!(
            slots
                .take(200)
                .expect_err("all taken")
                .contains("16 clients")
        );
    }
}
