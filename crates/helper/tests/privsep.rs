//! Privilege separation end to end, in real child processes: this binary
//! (`harness = false`, so its `main` is single-threaded) runs each scenario
//! by starting itself again with `--mcrelay-child <mode>`; the child does
//! the process-wide thing (drop privileges, become the helper) and reports
//! through its exit code and stderr.
#![allow(unsafe_code)]

use std::collections::BTreeSet;
use std::io;
use std::net::UdpSocket;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use mcrelay_helper::server::KEPT_ENVIRONMENT;
use mcrelay_helper::{run_helper, sanitize_process, serve};
use mcrelay_sockets::{HELPER_FD, HelperError, spawn_helper};
use mcrelay_sys::privileges::{
    HELPER_CAPABILITIES, drop_all_capabilities, drop_to_user, keep_only_capabilities, lookup_user,
    status_of,
};

const CHILD: &str = "--mcrelay-child";

type Outcome = Result<(), String>;
type Scenario = (&'static str, fn() -> Outcome);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(CHILD) {
        let mode = args.get(2).map_or("", String::as_str);
        let rest = args.get(3..).unwrap_or_default();
        let outcome = child(mode, rest);
        return match outcome {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("child {mode}: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let scenarios: [Scenario; 6] = [
        (
            "helper_process_serves_on_fd_3",
            helper_process_serves_on_fd_3,
        ),
        (
            "sanitize_clears_environment_and_fds",
            sanitize_clears_environment_and_fds,
        ),
        (
            "drop_to_nobody_leaves_no_privileges",
            drop_to_nobody_leaves_no_privileges,
        ),
        (
            "capability_drop_as_root_empties_every_set",
            capability_drop_as_root,
        ),
        (
            "capability_drop_refuses_other_threads",
            capability_drop_refuses_other_threads,
        ),
        (
            "keep_only_the_network_capabilities_as_nobody",
            keep_only_network_capabilities,
        ),
    ];
    let mut failed = 0;
    for (name, scenario) in scenarios {
        match scenario() {
            Ok(()) => println!("test {name} ... ok"),
            Err(e) if e.starts_with("SKIPPED") => println!("test {name} ... {e}"),
            Err(e) => {
                println!("test {name} ... FAILED\n    {e}");
                failed += 1;
            }
        }
    }
    println!("privsep: {} scenarios, {failed} failed", scenarios.len());
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

// ---------------------------------------------------------------- parent

fn is_root() -> bool {
    status_of(std::process::id()).is_ok_and(|s| s.uid[1] == 0)
}

fn needs_root() -> Outcome {
    if is_root() {
        Ok(())
    } else {
        Err("SKIPPED: needs root".to_owned())
    }
}

fn exe() -> PathBuf {
    std::env::current_exe().expect("current_exe")
}

/// Run this binary in `mode` and wait: Ok if the child reported success.
fn run_child(mode: &str) -> Outcome {
    let out = Command::new(exe())
        .args([CHILD, mode])
        .output()
        .map_err(|e| format!("spawn: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "child {mode} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn free_port() -> u16 {
    let s = UdpSocket::bind("127.0.0.1:0").expect("bind");
    s.local_addr().expect("addr").port()
}

/// A config with one unicast flow on lo into `ingress_port`, out to
/// `output_port`; its path.
fn write_config(tag: &str, ingress_port: u16, output_port: u16) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mcrelay-privsep-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let path = dir.join("mcrelay.toml");
    let text = format!(
        "[[flow]]\nname = \"lo\"\n\
         input = {{ interface = \"lo\", address = \"127.0.0.1\", port = {ingress_port} }}\n\
         outputs = [{{ interface = \"lo\", address = \"127.0.0.1\", port = {output_port} }}]\n"
    );
    std::fs::write(&path, text).expect("write config");
    path
}

fn open_fds(pid: u32) -> io::Result<BTreeSet<i32>> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))?
        .map(|e| Ok(e?.file_name().to_string_lossy().parse().unwrap_or(-1)))
        .collect()
}

/// Start a helper child in `mode` with an inheritable (non-close-on-exec)
/// socket open, check it serves a flow and holds only fds 0-3, and that it
/// exits cleanly when the daemon end closes.
fn helper_child(mode: &str) -> Outcome {
    let listener = UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let ingress_port = free_port();
    let config = write_config(
        mode,
        ingress_port,
        listener.local_addr().expect("addr").port(),
    );
    // A leak to catch: not close-on-exec, so the child inherits it.
    let leak = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)
        .map_err(|e| e.to_string())?;
    leak.set_cloexec(false).map_err(|e| e.to_string())?;
    let config_arg = config.to_str().expect("utf-8 temp path");
    let (mut child, mut client) =
        spawn_helper(&exe(), &[CHILD, mode, config_arg]).map_err(|e| format!("spawn: {e}"))?;
    let pid = child.id();
    let result = (|| -> Outcome {
        client.ping().map_err(|e| format!("ping: {e}"))?;
        match open_fds(pid) {
            Ok(fds) => {
                if fds != BTreeSet::from([0, 1, 2, HELPER_FD]) {
                    return Err(format!(
                        "helper holds fds {fds:?}; expected 0-3 (leaked fd was {})",
                        leak.as_raw_fd()
                    ));
                }
            }
            // A non-dumpable process's fds are readable only with privilege.
            Err(e) if !is_root() && e.kind() == io::ErrorKind::PermissionDenied => {}
            Err(e) => return Err(format!("/proc/{pid}/fd: {e}")),
        }
        let flow = client
            .open_flow("lo")
            .map_err(|e| format!("open_flow: {e}"))?;
        let t = Some(Duration::from_secs(60));
        let probe = UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        probe
            .send_to(b"in", ("127.0.0.1", ingress_port))
            .map_err(|e| e.to_string())?;
        let ingress = UdpSocket::from(flow.legs.into_iter().next().ok_or("no leg")?.socket);
        ingress.set_read_timeout(t).map_err(|e| e.to_string())?;
        let mut buf = [0u8; 16];
        let n = ingress
            .recv(&mut buf)
            .map_err(|e| format!("ingress recv: {e}"))?;
        if &buf[..n] != b"in" {
            return Err("wrong datagram on ingress".into());
        }
        flow.outputs[0].send(b"out").map_err(|e| e.to_string())?;
        listener.set_read_timeout(t).map_err(|e| e.to_string())?;
        let n = listener
            .recv(&mut buf)
            .map_err(|e| format!("output recv: {e}"))?;
        if &buf[..n] != b"out" {
            return Err("wrong datagram from output".into());
        }
        match client.open_flow("other") {
            Err(HelperError::Refused(r)) if r.contains("no flow named \"other\"") => {}
            other => return Err(format!("unknown flow: {other:?}")),
        }
        Ok(())
    })();
    drop(client);
    let status = child.wait().map_err(|e| e.to_string());
    if let Some(dir) = config.parent() {
        let _ = std::fs::remove_dir_all(dir);
    }
    let status = status?;
    result?;
    if !status.success() {
        return Err(format!("helper exited with {status}"));
    }
    Ok(())
}

fn helper_process_serves_on_fd_3() -> Outcome {
    helper_child("helper")
}

fn sanitize_clears_environment_and_fds() -> Outcome {
    // The child checks its environment (cargo sets many CARGO_* variables
    // for us to inherit) and dumpable flag after sanitize_process.
    if std::env::vars_os().all(|(k, _)| KEPT_ENVIRONMENT.iter().any(|kept| k == *kept)) {
        return Err("SKIPPED: nothing in the environment to clear".into());
    }
    helper_child("sanitize-check")
}

fn drop_to_nobody_leaves_no_privileges() -> Outcome {
    needs_root()?;
    lookup_user("nobody").map_err(|e| format!("SKIPPED: {e}"))?;
    run_child("drop-to-nobody")
}

fn capability_drop_as_root() -> Outcome {
    needs_root()?;
    run_child("caps-only")
}

fn keep_only_network_capabilities() -> Outcome {
    needs_root()?;
    run_child("keep-net-caps")
}

fn capability_drop_refuses_other_threads() -> Outcome {
    run_child("multithreaded")
}

// ----------------------------------------------------------------- child

fn child(mode: &str, rest: &[String]) -> Outcome {
    match mode {
        "helper" => {
            let config = rest.first().ok_or("no config path")?;
            // SAFETY: nothing in this process owns any fd but 0-2 yet (the
            // parent's are close-on-exec or a leak we mean to close), and fd
            // 3 is the connection spawn_helper put there, owned by nothing.
            unsafe { run_helper(HELPER_FD, Path::new(config)) }.map_err(|e| e.to_string())
        }
        "sanitize-check" => {
            let config = rest.first().ok_or("no config path")?;
            // SAFETY: as in "helper": no fd but 0-3 is owned by anything.
            unsafe { sanitize_process(HELPER_FD) }.map_err(|e| format!("sanitize: {e}"))?;
            let left: Vec<_> = std::env::vars_os()
                .map(|(k, _)| k)
                .filter(|k| !KEPT_ENVIRONMENT.iter().any(|kept| k == kept))
                .collect();
            if !left.is_empty() {
                return Err(format!("environment not cleared: {left:?}"));
            }
            // SAFETY: PR_GET_DUMPABLE takes no arguments and touches no memory.
            let dumpable = unsafe { libc::prctl(libc::PR_GET_DUMPABLE) };
            if dumpable != 0 {
                return Err(format!("still dumpable ({dumpable})"));
            }
            // SAFETY: fd 3 is the connection spawn_helper put there; nothing
            // else in this process owns it.
            let conn = UnixStream::from(unsafe { OwnedFd::from_raw_fd(HELPER_FD) });
            serve(conn, Path::new(config)).map_err(|e| e.to_string())
        }
        "keep-net-caps" => {
            let nobody = lookup_user("nobody").map_err(|e| e.to_string())?;
            let s = keep_only_capabilities(HELPER_CAPABILITIES, Some("nobody"))
                .map_err(|e| format!("keep_only_capabilities: {e}"))?;
            let expected = (
                [nobody.uid; 4],
                HELPER_CAPABILITIES,
                0,
                HELPER_CAPABILITIES,
                true,
            );
            let got = (s.uid, s.cap_prm, s.cap_eff, s.cap_bnd, s.no_new_privs);
            if got != expected {
                return Err(format!("expected {expected:x?}, got {s:x?}"));
            }
            // SAFETY: a plain syscall; it must fail now.
            if unsafe { libc::setuid(0) } == 0 {
                return Err("root regained".into());
            }
            Ok(())
        }
        "drop-to-nobody" => {
            let nobody = lookup_user("nobody").map_err(|e| e.to_string())?;
            drop_to_user("nobody").map_err(|e| format!("drop_to_user: {e}"))?;
            drop_all_capabilities().map_err(|e| format!("drop_all_capabilities: {e}"))?;
            let s = status_of(std::process::id()).map_err(|e| e.to_string())?;
            let ok = s.cap_eff == 0
                && s.cap_prm == 0
                && s.cap_amb == 0
                && s.cap_inh == 0
                && s.uid == [nobody.uid; 4]
                && s.gid == [nobody.gid; 4]
                && s.groups == [nobody.gid]
                && s.no_new_privs;
            if !ok {
                return Err(format!("status after the drop: {s:?}"));
            }
            // SAFETY: a plain syscall on ids; it must fail.
            if unsafe { libc::setuid(0) } == 0 {
                return Err("setuid(0) succeeded after the drop".into());
            }
            check_network_privileges_gone()
        }
        "caps-only" => {
            // Still uid 0, but with no capability root means nothing.
            drop_all_capabilities().map_err(|e| format!("drop_all_capabilities: {e}"))?;
            let s = status_of(std::process::id()).map_err(|e| e.to_string())?;
            if s.uid != [0; 4] || s.cap_eff != 0 || s.cap_prm != 0 || s.cap_amb != 0 {
                return Err(format!("status after the drop: {s:?}"));
            }
            if s.cap_bnd != 0 {
                return Err(format!(
                    "bounding set not emptied with CAP_SETPCAP: {:#x}",
                    s.cap_bnd
                ));
            }
            check_network_privileges_gone()
        }
        "multithreaded" => {
            let before = status_of(std::process::id()).map_err(|e| e.to_string())?;
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let other = std::thread::spawn(move || rx.recv());
            let result = drop_all_capabilities();
            drop(tx);
            let _ = other.join();
            match result {
                Err(e) if e.to_string().contains("single-threaded") => {}
                other => return Err(format!("expected a refusal, got {other:?}")),
            }
            let after = status_of(std::process::id()).map_err(|e| e.to_string())?;
            if (after.cap_eff, after.cap_prm, after.no_new_privs)
                != (before.cap_eff, before.cap_prm, before.no_new_privs)
            {
                return Err(format!("refused, yet changed: {before:?} -> {after:?}"));
            }
            Ok(())
        }
        _ => Err(format!("unknown mode {mode:?}")),
    }
}

/// No raw sockets, no privileged ports.
fn check_network_privileges_gone() -> Outcome {
    match socket2::Socket::new(socket2::Domain::PACKET, socket2::Type::RAW, None) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
        other => return Err(format!("AF_PACKET socket: expected EPERM, got {other:?}")),
    }
    let start: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1024);
    if start <= 500 {
        eprintln!("note: ip_unprivileged_port_start = {start}; port 500 is not privileged here");
        return Ok(());
    }
    match UdpSocket::bind("127.0.0.1:500") {
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => Ok(()),
        other => Err(format!(
            "binding UDP port 500: expected EACCES, got {other:?}"
        )),
    }
}
