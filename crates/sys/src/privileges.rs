//! Process credentials: reading them ([`status_of`]), giving them up for
//! good, and keeping only the helper's.
//!
//! The daemon, started as root or with capabilities, first starts the
//! privileged helper (`mcrelay_sockets::spawn`), then drops to the service user
//! ([`drop_to_user`], when started as root) and then drops every capability
//! ([`drop_all_capabilities`]) — in that order: with no capabilities left,
//! changing the user is no longer possible.
//!
//! These calls change credentials that Linux keeps per *thread*. glibc's
//! `setgroups`/`setresgid`/`setresuid` wrappers apply the change to every
//! thread, but `capset`, the ambient and bounding sets and
//! `PR_SET_NO_NEW_PRIVS` apply to the calling thread only. So call them
//! while the process is single-threaded — before any worker, logger or
//! runtime thread starts; [`drop_all_capabilities`] checks and refuses
//! otherwise, rather than leave another thread privileged.
#![allow(unsafe_code)]

use std::io;

use nix::unistd::{self, Gid, Uid};
use tracing::debug;

use crate::prctl;

/// The ids and capability sets of a process, from `/proc/<pid>/status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStatus {
    /// Real, effective, saved and filesystem uid.
    pub uid: [u32; 4],
    /// Real, effective, saved and filesystem gid.
    pub gid: [u32; 4],
    /// Supplementary groups.
    pub groups: Vec<u32>,
    /// Inheritable capabilities (bit n = capability n).
    pub cap_inh: u64,
    /// Permitted capabilities.
    pub cap_prm: u64,
    /// Effective capabilities.
    pub cap_eff: u64,
    /// Bounding set.
    pub cap_bnd: u64,
    /// Ambient capabilities (0 before Linux 4.3, which has none).
    pub cap_amb: u64,
    /// `PR_SET_NO_NEW_PRIVS` is set (false before Linux 4.10, which does
    /// not report it).
    pub no_new_privs: bool,
    /// Threads in the process.
    pub threads: u32,
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

impl ProcStatus {
    /// Parse the text of a `/proc/<pid>/status` file.
    pub fn parse(text: &str) -> io::Result<Self> {
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        let required =
            |name: &str| field(name).ok_or_else(|| invalid(format!("no {name}: line in status")));
        let ids = |name: &str| -> io::Result<[u32; 4]> {
            let v: Vec<u32> = required(name)?
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .map_err(|e| invalid(format!("{name}: {e}")))?;
            v.try_into()
                .map_err(|v: Vec<u32>| invalid(format!("{name}: {} ids, expected 4", v.len())))
        };
        let caps = |name: &str, value: Option<&str>| -> io::Result<u64> {
            value.map_or(Ok(0), |v| {
                u64::from_str_radix(v, 16).map_err(|e| invalid(format!("{name}: {e}")))
            })
        };
        Ok(ProcStatus {
            uid: ids("Uid")?,
            gid: ids("Gid")?,
            groups: field("Groups")
                .unwrap_or_default()
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .map_err(|e| invalid(format!("Groups: {e}")))?,
            cap_inh: caps("CapInh", Some(required("CapInh")?))?,
            cap_prm: caps("CapPrm", Some(required("CapPrm")?))?,
            cap_eff: caps("CapEff", Some(required("CapEff")?))?,
            cap_bnd: caps("CapBnd", Some(required("CapBnd")?))?,
            cap_amb: caps("CapAmb", field("CapAmb"))?,
            no_new_privs: field("NoNewPrivs") == Some("1"),
            threads: required("Threads")?
                .parse()
                .map_err(|e| invalid(format!("Threads: {e}")))?,
        })
    }
}

/// The status of process `pid` (`std::process::id()` for this one).
pub fn status_of(pid: u32) -> io::Result<ProcStatus> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot read {path}: {e}")))?;
    ProcStatus::parse(&text)
}

/// A user account, from the system's user database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// The login name.
    pub name: String,
    /// Its uid.
    pub uid: u32,
    /// Its primary group.
    pub gid: u32,
}

/// Look `name` up in the user database (`getpwnam_r`: `/etc/passwd`,
/// or whatever NSS is configured with).
pub fn lookup_user(name: &str) -> io::Result<User> {
    if name.as_bytes().contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("user name {name:?} contains NUL"),
        ));
    }
    // nix grows getpwnam_r's buffer on ERANGE, as this did by hand.
    match nix::unistd::User::from_name(name) {
        Ok(Some(found)) => Ok(User {
            name: found.name,
            uid: found.uid.as_raw(),
            gid: found.gid.as_raw(),
        }),
        Ok(None) => Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "user {name:?} does not exist; create it or set daemon.user to an existing user"
            ),
        )),
        Err(errno) => {
            let e = io::Error::from(errno);
            Err(io::Error::new(
                e.kind(),
                format!("cannot look up user {name:?}: {e}"),
            ))
        }
    }
}

/// A nix result as an `io::Result`, its error labelled with the call.
fn check(result: nix::Result<()>, call: &str) -> io::Result<()> {
    result.map_err(|errno| {
        let e = io::Error::from(errno);
        io::Error::new(e.kind(), format!("{call}: {e}"))
    })
}

/// Become `user` for good: supplementary groups = its primary group only,
/// then real/effective/saved gid, then real/effective/saved uid (the order
/// matters: changing groups needs the privilege the uid change gives up).
/// Then checks that root cannot be regained (`setuid(0)` must fail) and
/// that `/proc/self/status` shows the new ids.
///
/// For a process started as root; a process already running as exactly
/// `user` returns `Ok` without changes. Refuses a user with uid 0.
/// Changing uid away from 0 also empties the permitted, effective and
/// ambient capability sets; call [`drop_all_capabilities`] after it for
/// the rest. The calls go through glibc, which applies them to every thread;
/// still, call it before starting threads (see the module docs).
pub fn drop_to_user(user: &str) -> io::Result<()> {
    let u = lookup_user(user)?;
    if u.uid == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("user {user:?} has uid 0; set daemon.user to an unprivileged user"),
        ));
    }
    let before = status_of(std::process::id())?;
    if before.uid == [u.uid; 4] && before.gid == [u.gid; 4] {
        return Ok(());
    }
    let (uid, gid) = (Uid::from_raw(u.uid), Gid::from_raw(u.gid));
    check(unistd::setgroups(&[gid]), "setgroups")?;
    check(unistd::setresgid(gid, gid, gid), "setresgid")?;
    check(unistd::setresuid(uid, uid, uid), "setresuid")?;
    // It must fail now.
    if unistd::setuid(Uid::from_raw(0)).is_ok() {
        return Err(io::Error::other(format!(
            "after switching to user {user:?} the process could become root again; refusing to continue"
        )));
    }
    let after = status_of(std::process::id())?;
    if after.uid != [u.uid; 4] || after.gid != [u.gid; 4] {
        return Err(io::Error::other(format!(
            "after switching to user {user:?} (uid {}, gid {}) the process has uids {:?} and gids {:?}",
            u.uid, u.gid, after.uid, after.gid
        )));
    }
    debug!(user, uid = u.uid, gid = u.gid, "switched user");
    Ok(())
}

/// The highest capability number this kernel knows.
fn last_capability() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63)
}

/// `struct __user_cap_header_struct`.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct`.
#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// `_LINUX_CAPABILITY_VERSION_3`: 64-bit sets, as two [`CapData`].
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Drop every capability, for good:
/// 1. clear the ambient set (`PR_CAP_AMBIENT_CLEAR_ALL`);
/// 2. empty the bounding set (`PR_CAPBSET_DROP` for each capability) — this
///    needs `CAP_SETPCAP`; without it (e.g. after [`drop_to_user`]) it is
///    skipped, which is harmless since step 4 already stops `execve` from
///    granting capabilities;
/// 3. empty the effective, permitted and inheritable sets (`capset`);
/// 4. set `PR_SET_NO_NEW_PRIVS`: no `execve` can gain privileges again
///    (setuid bits and file capabilities are ignored);
/// 5. check `/proc/self/status`: effective, permitted, inheritable and
///    ambient sets all empty, no-new-privs set.
///
/// Must run while the process is single-threaded: these are per-thread
/// settings, so it refuses (an error) if there are other threads.
pub fn drop_all_capabilities() -> io::Result<()> {
    let threads = status_of(std::process::id())?.threads;
    if threads != 1 {
        return Err(io::Error::other(format!(
            "drop_all_capabilities must run while the process is single-threaded (capabilities are per thread); it has {threads} threads"
        )));
    }
    if let Err(e) = prctl::clear_ambient_capabilities() {
        // EINVAL: a kernel before 4.3, which has no ambient set.
        if e.raw_os_error() != Some(libc::EINVAL) {
            return Err(io::Error::new(
                e.kind(),
                format!("clearing the ambient capabilities: {e}"),
            ));
        }
    }
    trim_bounding_set(0)?;
    capset(0, 0, 0)?;
    set_no_new_privs()?;
    let s = status_of(std::process::id())?;
    if s.cap_eff != 0 || s.cap_prm != 0 || s.cap_inh != 0 || s.cap_amb != 0 || !s.no_new_privs {
        return Err(io::Error::other(format!(
            "capabilities remain after dropping them: {s:?}"
        )));
    }
    debug!(
        bounding = format_args!("{:#x}", s.cap_bnd),
        "dropped all capabilities"
    );
    Ok(())
}

/// Drop every capability not in `keep` (bit n = capability n) from the
/// bounding set (`PR_CAPBSET_DROP`). Needs `CAP_SETPCAP`; without it (a
/// start with ambient capabilities, as under systemd) the set is left as
/// is, which is harmless once no-new-privs is set.
fn trim_bounding_set(keep: u64) -> io::Result<()> {
    for cap in 0..=last_capability() {
        if cap < 64 && keep & (1u64 << cap) != 0 {
            continue;
        }
        if let Err(e) = prctl::drop_from_bounding_set(cap) {
            match e.raw_os_error() {
                Some(libc::EINVAL) => break, // past the last capability
                Some(libc::EPERM) => {
                    debug!("no CAP_SETPCAP: bounding set left as is (no_new_privs covers execve)");
                    break;
                }
                _ => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("dropping capability {cap} from the bounding set: {e}"),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Set this thread's effective, permitted and inheritable capability sets.
fn capset(effective: u64, permitted: u64, inheritable: u64) -> io::Result<()> {
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    // Version 3 splits each 64-bit set into a low and a high half.
    let half = |set: u64, high: bool| {
        let bits = if high { set >> 32 } else { set & 0xffff_ffff };
        u32::try_from(bits).unwrap_or(u32::MAX)
    };
    let data = [false, true].map(|high| CapData {
        effective: half(effective, high),
        permitted: half(permitted, high),
        inheritable: half(inheritable, high),
    });
    // SAFETY: `header` and `data` are live, correctly laid out
    // (`#[repr(C)]`) and sized for version 3 (two data structs); the kernel
    // reads `data` and may write `header.version`.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &raw mut header, data.as_ptr()) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("capset: {e}")));
    }
    Ok(())
}

fn set_no_new_privs() -> io::Result<()> {
    prctl::set_no_new_privs()
        .map_err(|e| io::Error::new(e.kind(), format!("PR_SET_NO_NEW_PRIVS: {e}")))
}

/// `CAP_NET_BIND_SERVICE`, `CAP_NET_ADMIN`, `CAP_NET_RAW` and `CAP_BPF`:
/// what the helper needs (ports below 1024; `SO_RCVBUFFORCE`/
/// `SO_SNDBUFFORCE`; `AF_PACKET` ingress and, before Linux 5.7,
/// `SO_BINDTODEVICE`; `ingress = "xdp"`: the XDP program, its map and its
/// attachment, with `CAP_NET_ADMIN`, and the AF_XDP socket, with
/// `CAP_NET_RAW`) and what the shipped unit grants.
pub const HELPER_CAPABILITIES: u64 = (1 << 10) | (1 << 12) | (1 << 13) | (1 << 39);

/// Keep `keep` and nothing more, for good, in a process that must go on
/// holding them (the zygote): the mirror of what systemd does with
/// `User=`, `CapabilityBoundingSet=` and `AmbientCapabilities=`.
///
/// 1. trim the bounding set to `keep` (needs `CAP_SETPCAP`: done when
///    started as root, skipped under an ambient-capability start, whose
///    bounding set the service manager already trimmed);
/// 2. with `user` (started as root): become that user with
///    `PR_SET_KEEPCAPS`, so the permitted set survives the uid change;
/// 3. permitted = inheritable = `keep` ∩ what is held; effective empty
///    unless `effective` (the helper raises them with
///    [`raise_kept_capabilities`], the zygote never uses them);
/// 4. `PR_SET_NO_NEW_PRIVS`;
/// 5. check `/proc/self/status`: nothing outside `keep` in any set (the
///    bounding set too when step 1 ran), and root not regainable.
///
/// Single-threaded only, as [`drop_all_capabilities`].
pub fn keep_only_capabilities(keep: u64, user: Option<&str>) -> io::Result<ProcStatus> {
    let before = status_of(std::process::id())?;
    if before.threads != 1 {
        return Err(io::Error::other(format!(
            "keep_only_capabilities must run while the process is single-threaded; it has {} threads",
            before.threads
        )));
    }
    let could_trim = before.cap_eff & CAP_SETPCAP != 0;
    trim_bounding_set(keep)?;
    if let Some(user) = user {
        let keepcaps = |keep| {
            prctl::set_keepcaps(keep)
                .map_err(|e| io::Error::new(e.kind(), format!("PR_SET_KEEPCAPS: {e}")))
        };
        keepcaps(true)?;
        drop_to_user(user)?;
        keepcaps(false)?;
    }
    let kept = keep & before.cap_prm;
    capset(0, kept, kept & before.cap_inh)?;
    set_no_new_privs()?;
    let s = status_of(std::process::id())?;
    let outside = !keep;
    if (s.cap_prm | s.cap_eff | s.cap_inh | s.cap_amb) & outside != 0
        || (could_trim && s.cap_bnd & outside != 0)
        || !s.no_new_privs
    {
        return Err(io::Error::other(format!(
            "capabilities beyond {keep:#x} remain after trimming: {s:?}"
        )));
    }
    Ok(s)
}

/// Make the permitted capabilities effective (after
/// [`keep_only_capabilities`] left them permitted only).
pub fn raise_kept_capabilities() -> io::Result<()> {
    let s = status_of(std::process::id())?;
    capset(s.cap_prm, s.cap_prm, s.cap_inh)
}

const CAP_SETPCAP: u64 = 1 << 8;

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\tcat
Umask:\t0022
State:\tR (running)
Uid:\t1000\t1001\t1002\t1003
Gid:\t100\t101\t102\t103
Groups:\t4 24 27 
Threads:\t1
CapInh:\t0000000000000000
CapPrm:\t000001ffffffffff
CapEff:\t0000000000003000
CapBnd:\t000001ffffffffff
CapAmb:\t0000000000000400
NoNewPrivs:\t1
Seccomp:\t0
";

    #[test]
    fn parses_proc_status() {
        let s = ProcStatus::parse(STATUS).expect("parse");
        assert_eq!(s.uid, [1000, 1001, 1002, 1003]);
        assert_eq!(s.gid, [100, 101, 102, 103]);
        assert_eq!(s.groups, [4, 24, 27]);
        assert_eq!(s.threads, 1);
        assert_eq!(s.cap_inh, 0);
        assert_eq!(s.cap_prm, 0x1ff_ffff_ffff);
        assert_eq!(s.cap_eff, 0x3000);
        assert_eq!(s.cap_bnd, 0x1ff_ffff_ffff);
        assert_eq!(s.cap_amb, 0x400);
        assert!(s.no_new_privs);
    }

    #[test]
    fn old_kernels_and_broken_files() {
        let old = STATUS
            .replace("CapAmb:\t0000000000000400\n", "")
            .replace("NoNewPrivs:\t1\n", "");
        let s = ProcStatus::parse(&old).expect("parse");
        assert_eq!((s.cap_amb, s.no_new_privs), (0, false));
        for broken in [
            STATUS.replace("Uid:\t1000\t1001\t1002\t1003", "Uid:\t1000\t1001"),
            STATUS.replace("CapEff:\t0000000000003000", "CapEff:\tzz"),
            STATUS.replace("Threads:\t1\n", ""),
        ] {
            assert!(ProcStatus::parse(&broken).is_err(), "{broken}");
        }
    }

    #[test]
    fn own_status_and_users() {
        let s = status_of(std::process::id()).expect("status");
        assert!(s.threads >= 1);
        let root = lookup_user("root").expect("root");
        assert_eq!((root.uid, root.gid), (0, 0));
        let e = lookup_user("no-such-user-mcrelay").expect_err("missing");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("does not exist"), "{e}");
        let e = drop_to_user("root").expect_err("uid 0");
        assert!(e.to_string().contains("uid 0"), "{e}");
    }

    #[test]
    fn capability_drop_refuses_a_multithreaded_process() {
        // Tests run on a harness thread next to the main thread; if this
        // harness ran it on the only thread it would really drop them, so
        // check first.
        if status_of(std::process::id()).expect("status").threads < 2 {
            eprintln!("SKIPPED: single-threaded harness");
            return;
        }
        let e = drop_all_capabilities().expect_err("threads");
        assert!(e.to_string().contains("single-threaded"), "{e}");
    }
}
