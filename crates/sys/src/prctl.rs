//! Process controls (`prctl`): nix's typed calls for what it has, and the
//! two capability options it has not (`PR_CAP_AMBIENT`, `PR_CAPBSET_DROP`).
#![allow(unsafe_code)]

use std::io;

use nix::sys::signal::Signal;

/// `PR_SET_DUMPABLE`: whether the process may dump core and be reached by
/// `ptrace`, `process_vm_readv` or `/proc/PID/fd` of the same uid.
pub fn set_dumpable(dumpable: bool) -> io::Result<()> {
    Ok(nix::sys::prctl::set_dumpable(dumpable)?)
}

/// `PR_GET_DUMPABLE`.
pub fn dumpable() -> io::Result<bool> {
    Ok(nix::sys::prctl::get_dumpable()?)
}

/// `PR_SET_PDEATHSIG SIGTERM`: this thread's parent dying sends the
/// calling process `SIGTERM`. Only a raw syscall: safe to call between
/// fork and exec.
pub fn terminate_with_parent() -> io::Result<()> {
    Ok(nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?)
}

/// `PR_SET_NO_NEW_PRIVS`: no `execve` can gain privileges again.
pub fn set_no_new_privs() -> io::Result<()> {
    Ok(nix::sys::prctl::set_no_new_privs()?)
}

/// `PR_SET_KEEPCAPS`: whether the permitted capabilities survive a change
/// of uid away from 0.
pub fn set_keepcaps(keep: bool) -> io::Result<()> {
    Ok(nix::sys::prctl::set_keepcaps(keep)?)
}

/// `PR_CAP_AMBIENT PR_CAP_AMBIENT_CLEAR_ALL` (nix has no call for it).
/// `EINVAL` on a kernel before 4.3, which has no ambient set.
pub fn clear_ambient_capabilities() -> io::Result<()> {
    let clear_all = libc::c_ulong::try_from(libc::PR_CAP_AMBIENT_CLEAR_ALL).unwrap_or(4);
    integer_prctl(libc::PR_CAP_AMBIENT, clear_all)
}

/// `PR_CAPBSET_DROP cap` (nix has no call for it): `EINVAL` past the last
/// capability, `EPERM` without `CAP_SETPCAP`.
pub fn drop_from_bounding_set(cap: u32) -> io::Result<()> {
    integer_prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap))
}

/// A `prctl` whose arguments are integers only.
fn integer_prctl(option: libc::c_int, arg2: libc::c_ulong) -> io::Result<()> {
    // SAFETY: the two options passed here (PR_CAP_AMBIENT with
    // PR_CAP_AMBIENT_CLEAR_ALL, PR_CAPBSET_DROP) take integer arguments
    // only, the unused ones zero, and touch no memory of ours.
    let rc = unsafe {
        libc::prctl(
            option,
            arg2,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dumpable_round_trips() {
        // The flag is per process: flip it and restore it.
        let before = dumpable().expect("get");
        set_dumpable(!before).expect("set");
        assert_eq!(dumpable().expect("get"), !before);
        set_dumpable(before).expect("restore");
        assert_eq!(dumpable().expect("get"), before);
    }

    #[test]
    fn a_capability_past_the_last_is_einval() {
        let e = drop_from_bounding_set(1000).expect_err("no such capability");
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    }
}
