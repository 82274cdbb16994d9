//! The demo's three system calls: entering a network namespace
//! (`mcrelay-sys`), the clock tick of `/proc` CPU times and sending SIGTERM
//! to the daemon it started (both through nix).

use std::io;

use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, SysconfVar, sysconf};

pub use mcrelay_sys::ns::enter_netns;

/// Clock ticks per second, the unit of `/proc/PID/stat` CPU times.
pub fn clock_ticks_per_second() -> u64 {
    let hz = sysconf(SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100);
    u64::try_from(hz).ok().filter(|&hz| hz > 0).unwrap_or(100)
}

/// SIGTERM to `pid`, a child this process started and has not yet reaped
/// (so the PID cannot have been reused).
pub fn terminate(pid: u32) -> io::Result<()> {
    let pid =
        libc::pid_t::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    Ok(kill(Pid::from_raw(pid), Signal::SIGTERM)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_sane() {
        assert!((1..=10_000).contains(&clock_ticks_per_second()));
    }

    #[test]
    fn entering_a_missing_namespace_fails_cleanly() {
        let e = enter_netns("mcrelay-demo-no-such-namespace").unwrap_err();
        assert!(e.to_string().contains("/run/netns/"), "{e}");
    }
}
