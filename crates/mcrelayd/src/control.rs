//! The control socket (`daemon.control_socket`): JSON lines from
//! `mcrelayctl`, answered from the shared snapshot, or a reload handed to
//! the supervisor. One short-lived thread per client, at most
//! [`MAX_CLIENTS`] at once; every read and write has a timeout, so a client
//! that sends garbage, sends a megabyte without a newline, or connects and
//! never reads costs one thread for a few seconds and nothing else — the
//! workers never see it.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::Context;
use mcrelay_control::{LineEvent, LineReader, ReloadOutcome, Request, Response, parse_request};

use crate::daemon::{SharedHandle, lock};

/// Clients served at once; more are told to retry and closed.
pub const MAX_CLIENTS: usize = 16;
/// A client that sends nothing for this long is closed.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// A reply that can't be written within this long (the client doesn't
/// read) is abandoned and the client closed.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a client's reload may wait for the supervisor.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(30);

/// What the control socket asks of the supervisor.
#[derive(Debug)]
pub enum ToSupervisor {
    Reload(mpsc::Sender<ReloadOutcome>),
}

/// The bound control socket, not yet served.
#[derive(Debug)]
pub struct Bound {
    listener: UnixListener,
    path: std::path::PathBuf,
}

/// Bind the socket (replacing a stale one), mode 0660; when `owner` is
/// given (uid, gid: the service user, when started as root), hand it over
/// so the unprivileged daemon and its group keep access.
pub fn bind(path: &Path, owner: Option<(u32, u32)>) -> anyhow::Result<Bound> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        anyhow::ensure!(
            meta.file_type().is_socket(),
            "control socket {}: the path exists and is not a socket; remove it or set daemon.control_socket",
            path.display()
        );
        std::fs::remove_file(path)
            .with_context(|| format!("removing the stale control socket {}", path.display()))?;
    }
    if let Some(dir) = path.parent()
        && !dir.exists()
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(dir)
            .with_context(|| format!("creating {} for the control socket", dir.display()))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(dir, Some(uid), Some(gid))
                .with_context(|| format!("chown {}", dir.display()))?;
        }
    }
    let listener = UnixListener::bind(path)
        .with_context(|| format!("binding the control socket {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .with_context(|| format!("chmod 0660 {}", path.display()))?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))
            .with_context(|| format!("chown {}", path.display()))?;
    }
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
) -> anyhow::Result<()> {
    let Bound { listener, path } = bound;
    let policy = Policy::for_socket(&path);
    tracing::info!(path = %path.display(), "control socket listening");
    std::thread::Builder::new()
        .name("mcrelay-control".into())
        .spawn(move || serve(&listener, &path, &policy, &shared, &supervisor))
        .context("starting the control thread")?;
    Ok(())
}

/// Who may talk to the daemon: root, the daemon's own user, and members of
/// the socket's group (its file mode already keeps everyone else from
/// connecting; this holds even if someone loosens the mode).
#[derive(Debug, Clone, Copy)]
struct Policy {
    uid: u32,
    gid: u32,
}

impl Policy {
    fn for_socket(path: &Path) -> Self {
        let me = std::fs::metadata("/proc/self")
            .map(|m| m.uid())
            .unwrap_or(0);
        let gid = std::fs::metadata(path).map(|m| m.gid()).unwrap_or(0);
        Self { uid: me, gid }
    }

    fn allows(&self, uid: u32, gid: u32) -> bool {
        uid == 0 || uid == self.uid || gid == self.gid
    }
}

fn serve(
    listener: &UnixListener,
    path: &Path,
    policy: &Policy,
    shared: &SharedHandle,
    supervisor: &mpsc::Sender<ToSupervisor>,
) {
    let active = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        let mut conn = match conn {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(path = %path.display(), "control accept failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let _ = conn.set_write_timeout(Some(WRITE_TIMEOUT));
        let _ = conn.set_read_timeout(Some(READ_TIMEOUT));
        match peer(&conn) {
            Some((uid, gid)) if policy.allows(uid, gid) => {}
            other => {
                tracing::warn!(peer = ?other, "control client refused: not root, the service user or its group");
                let _ = conn.write_all(
                    Response::error("permission denied: the control socket serves root, the mcrelay user and its group")
                        .encode()
                        .as_bytes(),
                );
                continue;
            }
        }
        if active.fetch_add(1, Ordering::AcqRel) >= MAX_CLIENTS {
            active.fetch_sub(1, Ordering::AcqRel);
            let _ = conn.write_all(
                Response::error(format!(
                    "busy: {MAX_CLIENTS} clients already connected; retry"
                ))
                .encode()
                .as_bytes(),
            );
            continue;
        }
        let (shared, supervisor, active) =
            (Arc::clone(shared), supervisor.clone(), Arc::clone(&active));
        let spawned = std::thread::Builder::new()
            .name("mcrelay-ctl-client".into())
            .spawn(move || {
                client(conn, &shared, &supervisor);
                active.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            tracing::warn!("control client thread could not start");
        }
    }
}

/// The peer's uid and gid (`SO_PEERCRED`).
fn peer(conn: &UnixStream) -> Option<(u32, u32)> {
    let cred = crate::peercred::peer_cred(conn).ok()?;
    Some((cred.uid, cred.gid))
}

/// Serve one client: answer each request line until it closes, stalls, or
/// stops reading.
fn client(mut conn: UnixStream, shared: &SharedHandle, supervisor: &mpsc::Sender<ToSupervisor>) {
    let mut reader = LineReader::new();
    let mut chunk = [0u8; 4096];
    loop {
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
        for reply in replies {
            if conn.write_all(reply.encode().as_bytes()).is_err() {
                // Doesn't read (or is gone): drop it.
                return;
            }
        }
        if reader.is_discarding() {
            return;
        }
    }
}

fn answer(
    request: Request,
    shared: &SharedHandle,
    supervisor: &mpsc::Sender<ToSupervisor>,
) -> Response {
    match request {
        Request::Status | Request::Flows | Request::Stats => Response::ok(&lock(shared).read()),
        Request::Reload => {
            let (tx, rx) = mpsc::channel();
            if supervisor.send(ToSupervisor::Reload(tx)).is_err() {
                return Response::error("the daemon is stopping");
            }
            match rx.recv_timeout(RELOAD_TIMEOUT) {
                Ok(outcome) => Response::ok(&outcome),
                Err(_) => Response::error(format!(
                    "the reload did not finish within {RELOAD_TIMEOUT:?}; see the daemon's log"
                )),
            }
        }
    }
}
