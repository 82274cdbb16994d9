//! `SO_PEERCRED` and `SO_PEERGROUPS`: who is on the other end of a control
//! connection (std's `UnixStream::peer_cred` is not stable yet, and has no
//! supplementary groups). The first through nix; the second, which nix has
//! no option for, through `mcrelay_sys::sockopt::get_u32s`.

use std::io;
use std::mem::size_of;
use std::os::unix::net::UnixStream;

use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};

/// The peer's process credentials as the kernel recorded them at connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

pub fn peer_cred(conn: &UnixStream) -> io::Result<PeerCred> {
    let cred = getsockopt(conn, PeerCredentials)?;
    Ok(PeerCred {
        pid: cred.pid(),
        uid: cred.uid(),
        gid: cred.gid(),
    })
}

/// The peer's supplementary groups as the kernel recorded them at connect
/// (`SO_PEERGROUPS`, Linux 4.13).
pub fn peer_groups(conn: &UnixStream) -> io::Result<Vec<u32>> {
    // gid_t is u32 on Linux.
    const _: () = assert!(size_of::<libc::gid_t>() == size_of::<u32>());
    // NGROUPS_MAX is 65536; start small and grow to what the kernel asks.
    let mut groups: Vec<u32> = vec![0; 64];
    loop {
        let (result, len) = mcrelay_sys::sockopt::get_u32s(
            conn,
            libc::SOL_SOCKET,
            libc::SO_PEERGROUPS,
            &mut groups,
        );
        let e = match result {
            Ok(()) => {
                groups.truncate(len / size_of::<u32>());
                return Ok(groups);
            }
            Err(e) => e,
        };
        let wanted = len.div_ceil(size_of::<u32>());
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
        let status = mcrelay_sys::privileges::status_of(std::process::id()).expect("status");
        assert_eq!(groups, status.groups);
    }
}
