//! The control socket's directory and file, handled so that whoever can
//! write the directory (the service user, when it owns `/run/mcrelay`)
//! can't turn the daemon's start-up, run as root, against another file:
//! nothing here follows a symlink or changes a file by path. The socket is
//! created with its final mode (a umask around `bind`, no `chmod`), and
//! its owner is changed through a descriptor of the very inode that was
//! checked to be a socket (`O_PATH|O_NOFOLLOW`, `fstat`,
//! `fchownat(AT_EMPTY_PATH)`). A directory that a user other than root, the
//! daemon or the service user could write is refused.

use std::fs::File;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use nix::fcntl::AtFlags;
use nix::sys::stat::{Mode, umask};
use nix::unistd::{Gid, Uid, fchownat};

/// What went wrong preparing or binding the control socket.
#[derive(Debug, thiserror::Error)]
pub enum SocketFileError {
    #[error(
        "control socket {path}: the path exists and is not a socket; remove it or set daemon.control_socket"
    )]
    NotASocket { path: PathBuf },
    #[error(
        "control socket directory {dir}: {why}; the directory must be a real directory (not a symlink) \
         owned by root, the daemon's user or the service user and writable by its owner only \
         (chmod go-w, chown, or set daemon.control_socket elsewhere)"
    )]
    UnsafeDirectory { dir: PathBuf, why: String },
    #[error("control socket {path}: {step}: {source}")]
    Io {
        path: PathBuf,
        step: &'static str,
        source: io::Error,
    },
}

fn io_err(path: &Path, step: &'static str) -> impl FnOnce(io::Error) -> SocketFileError {
    let path = path.to_owned();
    move |source| SocketFileError::Io { path, step, source }
}

/// An `O_PATH` descriptor of `path` itself, never of what a symlink there
/// points to (`O_NOFOLLOW`).
fn open_path(path: &Path, directory: bool) -> io::Result<File> {
    let extra = if directory { libc::O_DIRECTORY } else { 0 };
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC | extra)
        .open(path)
}

/// Change the owner of exactly the inode `file` refers to.
fn chown_fd(file: &File, uid: u32, gid: u32) -> io::Result<()> {
    // With AT_EMPTY_PATH and an empty path the kernel acts on the fd's
    // inode.
    Ok(fchownat(
        file,
        "",
        Some(Uid::from_raw(uid)),
        Some(Gid::from_raw(gid)),
        AtFlags::AT_EMPTY_PATH,
    )?)
}

/// Who may own the socket's directory: root, this process's effective
/// user, and the service user it is about to become.
fn trusted_owner(uid: u32, owner: Option<(u32, u32)>) -> bool {
    uid == 0 || Some(uid) == effective_uid() || owner.is_some_and(|(o, _)| o == uid)
}

fn effective_uid() -> Option<u32> {
    mcrelay_sys::privileges::status_of(std::process::id())
        .ok()
        .map(|s| s.uid[1])
}

/// Create the socket's directory if it is missing (mode 0750, handed to
/// `owner`), and check the one that is there: a real directory, owned by a
/// trusted user, writable by its owner only.
pub fn prepare_dir(dir: &Path, owner: Option<(u32, u32)>) -> Result<(), SocketFileError> {
    let created = match std::fs::DirBuilder::new().mode(0o750).create(dir) {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o750)
                .create(dir)
                .map_err(io_err(dir, "creating the directory"))?;
            true
        }
        Err(e) => return Err(io_err(dir, "creating the directory")(e)),
    };
    let fd = open_path(dir, true).map_err(|e| SocketFileError::UnsafeDirectory {
        dir: dir.to_owned(),
        why: format!("cannot open it without following links ({e})"),
    })?;
    if created && let Some((uid, gid)) = owner {
        chown_fd(&fd, uid, gid)
            .map_err(io_err(dir, "handing the directory to the service user"))?;
    }
    let meta = fd.metadata().map_err(io_err(dir, "fstat"))?;
    let unsafe_dir = |why: String| SocketFileError::UnsafeDirectory {
        dir: dir.to_owned(),
        why,
    };
    if !trusted_owner(meta.uid(), owner) {
        return Err(unsafe_dir(format!("it is owned by uid {}", meta.uid())));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(unsafe_dir(format!(
            "its mode {:04o} lets group or others write it",
            meta.mode() & 0o7777
        )));
    }
    Ok(())
}

/// Remove a stale socket at `path` (never anything else), bind a new one
/// with mode 0660 from the start, and hand it to `owner`.
pub fn bind(
    path: &Path,
    owner: Option<(u32, u32)>,
    after_bind: impl FnOnce(),
) -> Result<UnixListener, SocketFileError> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(SocketFileError::NotASocket {
                path: path.to_owned(),
            });
        }
        // unlink removes the name, never what a link there points to.
        std::fs::remove_file(path).map_err(io_err(path, "removing the stale socket"))?;
    }
    let listener = {
        let _mask = Umask::set(0o117);
        UnixListener::bind(path).map_err(io_err(path, "bind"))?
    };
    after_bind();
    if let Some((uid, gid)) = owner {
        let fd = open_path(path, false).map_err(io_err(path, "opening the new socket"))?;
        let meta = fd.metadata().map_err(io_err(path, "fstat"))?;
        if !meta.file_type().is_socket() {
            return Err(SocketFileError::NotASocket {
                path: path.to_owned(),
            });
        }
        chown_fd(&fd, uid, gid).map_err(io_err(path, "handing the socket to the service user"))?;
    }
    Ok(listener)
}

/// The process umask, set for as long as this lives (start-up runs this
/// while single-threaded, so no other thread creates files meanwhile).
struct Umask(Mode);

impl Umask {
    fn set(mask: libc::mode_t) -> Self {
        Self(umask(Mode::from_bits_truncate(mask)))
    }
}

impl Drop for Umask {
    fn drop(&mut self) {
        // Restores the previous mask.
        umask(self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn is_root() -> bool {
        effective_uid() == Some(0)
    }

    fn temp(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("mcrelay-socketfile-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    const SERVICE: (u32, u32) = (65534, 65534);

    #[test]
    fn a_symlink_swapped_in_after_bind_does_not_hand_over_its_target() {
        if !is_root() {
            eprintln!("SKIPPED: handing files to another user needs root (CI runs as root)");
            return;
        }
        let base = temp("swap");
        let run = base.join("run");
        std::fs::create_dir(&run).expect("run");
        std::os::unix::fs::chown(&run, Some(SERVICE.0), Some(SERVICE.1)).expect("chown run");
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o750)).expect("chmod");
        // A root-owned secret elsewhere.
        let secret = base.join("secret");
        std::fs::write(&secret, "root only").expect("secret");
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let socket = run.join("control.sock");
        prepare_dir(&run, Some(SERVICE)).expect("the service user's directory is fine");
        // The attacker (who owns `run`) replaces the new socket with a
        // link to the secret between bind and the hand-over.
        let result = bind(&socket, Some(SERVICE), || {
            std::fs::remove_file(&socket).expect("unlink socket");
            std::os::unix::fs::symlink(&secret, &socket).expect("symlink");
        });
        let meta = std::fs::metadata(&secret).expect("secret");
        assert_eq!(
            (meta.uid(), meta.gid(), meta.mode() & 0o7777),
            (0, 0, 0o600),
            "the secret stays root's, mode 0600 (bind said {result:?})"
        );
        assert!(
            matches!(
                result,
                Err(SocketFileError::Io { .. } | SocketFileError::NotASocket { .. })
            ),
            "{result:?}"
        );
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn the_socket_is_created_0660_and_handed_over() {
        let dir = temp("mode");
        let socket = dir.join("control.sock");
        let owner = is_root().then_some(SERVICE);
        let _listener = bind(&socket, owner, || {}).expect("bind");
        let meta = std::fs::symlink_metadata(&socket).expect("socket");
        assert_eq!(meta.mode() & 0o777, 0o660);
        if owner.is_some() {
            assert_eq!((meta.uid(), meta.gid()), SERVICE);
        }
        // A second start replaces the stale socket.
        drop(_listener);
        let _again = bind(&socket, owner, || {}).expect("rebind");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_directory_others_can_write_is_refused() {
        let dir = temp("open");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let e = prepare_dir(&dir, None).expect_err("world-writable");
        assert!(
            e.to_string().contains("lets group or others write it"),
            "{e}"
        );
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).expect("chmod");
        prepare_dir(&dir, None).expect("owner-only is fine");
        let link = dir.with_extension("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&dir, &link).expect("symlink");
        let e = prepare_dir(&link, None).expect_err("a symlinked directory");
        assert!(e.to_string().contains("without following links"), "{e}");
        if is_root() {
            std::os::unix::fs::chown(&dir, Some(61_013), None).expect("chown");
            let e = prepare_dir(&dir, Some(SERVICE)).expect_err("a stranger's directory");
            assert!(e.to_string().contains("owned by uid 61013"), "{e}");
        }
        let _ = std::fs::remove_file(&link);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
