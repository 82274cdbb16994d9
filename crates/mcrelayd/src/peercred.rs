//! `SO_PEERCRED`: who is on the other end of a control connection (std's
//! `UnixStream::peer_cred` is not stable yet).
#![allow(unsafe_code)]

use std::io;
use std::mem::size_of;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

/// The peer's process credentials as the kernel recorded them at connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

pub fn peer_cred(conn: &UnixStream) -> io::Result<PeerCred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = libc::socklen_t::try_from(size_of::<libc::ucred>())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `cred` is a writable `ucred` of `len` bytes and `len` a valid
    // in/out length; the kernel writes at most `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &raw mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCred {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socketpair_peer_is_this_process() {
        let (a, _b) = UnixStream::pair().expect("pair");
        let cred = peer_cred(&a).expect("cred");
        assert_eq!(cred.pid, i32::try_from(std::process::id()).expect("pid"));
        let me = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m));
        assert_eq!(Some(cred.uid), me.ok());
    }
}
