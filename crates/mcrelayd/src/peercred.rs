//! `SO_PEERCRED` and `SO_PEERGROUPS`: who is on the other end of a control
//! connection (std's `UnixStream::peer_cred` is not stable yet, and has no
//! supplementary groups).
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

/// The peer's supplementary groups as the kernel recorded them at connect
/// (`SO_PEERGROUPS`, Linux 4.13).
pub fn peer_groups(conn: &UnixStream) -> io::Result<Vec<u32>> {
    // NGROUPS_MAX is 65536; start small and grow to what the kernel asks.
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let bytes = groups.len() * size_of::<libc::gid_t>();
        let mut len = libc::socklen_t::try_from(bytes)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: `groups` is a writable buffer of `len` bytes and `len` a
        // valid in/out length; the kernel writes at most `len` bytes, or
        // fails with ERANGE and sets `len` to the size it needs.
        let rc = unsafe {
            libc::getsockopt(
                conn.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &raw mut len,
            )
        };
        let len = usize::try_from(len).unwrap_or(0);
        if rc == 0 {
            groups.truncate(len / size_of::<libc::gid_t>());
            return Ok(groups);
        }
        let e = io::Error::last_os_error();
        let wanted = len.div_ceil(size_of::<libc::gid_t>());
        if e.raw_os_error() != Some(libc::ERANGE) || wanted <= groups.len() || wanted > 65536 {
            return Err(e);
        }
        groups.resize(wanted, 0);
    }
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
        let groups = peer_groups(&a).expect("groups");
        let status = mcrelay_helper::status_of(std::process::id()).expect("status");
        assert_eq!(groups, status.groups);
    }
}
