//! Sealing the daemon once it has dropped its privileges: no other process
//! of the service user may reach into it ([`seal`]).
#![allow(unsafe_code)]

use std::io;

/// Why sealing the process failed.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("prctl(PR_SET_DUMPABLE, 0): {0}")]
    Set(#[source] io::Error),
    #[error("the process is still dumpable after PR_SET_DUMPABLE 0 (PR_GET_DUMPABLE says {0})")]
    StillDumpable(libc::c_int),
}

/// Make the process non-dumpable: no core dump, and — the point — no
/// `ptrace`, `pidfd_getfd`, `process_vm_readv` or `/proc/<pid>/fd` access by
/// other processes of the same uid without `CAP_SYS_PTRACE`. A switch from
/// root to the service user makes the kernel do this already (unless
/// `fs.suid_dumpable` says otherwise), but dropping ambient capabilities
/// while keeping the uid (the shipped unit's mode) does not: without this
/// call, any process of the service user could take the daemon's packet
/// socket and its link to the privileged helper. Call after every drop of
/// privileges.
pub fn seal() -> Result<(), SealError> {
    // SAFETY: PR_SET_DUMPABLE takes one integer argument and touches no
    // memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong) };
    if rc != 0 {
        return Err(SealError::Set(io::Error::last_os_error()));
    }
    // SAFETY: PR_GET_DUMPABLE takes no argument and returns the flag.
    let now = unsafe { libc::prctl(libc::PR_GET_DUMPABLE) };
    if now != 0 {
        return Err(SealError::StillDumpable(now));
    }
    Ok(())
}
