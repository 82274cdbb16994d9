//! Sealing the daemon once it has dropped its privileges: no other process
//! of the service user may reach into it ([`seal`]).

use std::io;

/// Why sealing the process failed.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("prctl(PR_SET_DUMPABLE, 0): {0}")]
    Set(#[source] io::Error),
    #[error("prctl(PR_GET_DUMPABLE): {0}")]
    Get(#[source] io::Error),
    #[error("the process is still dumpable after PR_SET_DUMPABLE 0 (PR_GET_DUMPABLE says so)")]
    StillDumpable,
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
    mcrelay_sys::prctl::set_dumpable(false).map_err(SealError::Set)?;
    if mcrelay_sys::prctl::dumpable().map_err(SealError::Get)? {
        return Err(SealError::StillDumpable);
    }
    Ok(())
}
