//! A local attacker against a running daemon (issue 13): another process
//! of the service user reaching into the daemon, clients that hold the
//! control socket and the metrics endpoint with slow requests, a group
//! member whose group is only supplementary. Each daemon here has no flows
//! (nothing is relayed, no packet leaves), so these run in the host's
//! namespace; the fd budget tests, which need flows, run in a namespace of
//! their own.
//!
//! The attacker is a thread of this test that changes its own credentials
//! with the raw `setgroups`/`setresgid`/`setresuid` system calls: Linux
//! keeps credentials per thread (glibc's wrappers copy them to every thread,
//! the raw calls don't), and `connect`, `ptrace` and `pidfd_getfd` check the
//! calling thread's.
#![allow(unsafe_code)]

mod common;

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::{AMBIENT_START, MCRELAYD, is_root};

const NOBODY: u32 = 65534;
/// A uid and gid no account on a test machine has.
const STRANGER: u32 = 61_013;

/// A daemon with no flows, started as root with `user = "nobody"` or, with
/// `wrapper`, the way the shipped unit starts it.
struct Daemon {
    child: Child,
    dir: PathBuf,
    socket: PathBuf,
    metrics: SocketAddr,
}

static NEXT: AtomicU32 = AtomicU32::new(0);

impl Daemon {
    fn start(wrapper: &[&str]) -> Self {
        let daemon = Self::spawn("", wrapper);
        daemon.wait_relaying();
        daemon
    }

    /// Started with `flows` (TOML) after the `[daemon]` table; not waited for.
    fn spawn(flows: &str, wrapper: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "mcrelay-hostile-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let run = dir.join("run");
        fs::create_dir_all(&run).expect("temp dir");
        // The socket directory is the service user's, as tmpfiles and
        // RuntimeDirectory= make it; its group may search it.
        sh(&["chown", "nobody:nogroup", &run.display().to_string()]);
        sh(&["chmod", "0750", &run.display().to_string()]);
        let socket = run.join("control.sock");
        let metrics = {
            let probe = TcpListener::bind("127.0.0.1:0").expect("free port");
            probe.local_addr().expect("addr")
        };
        let config = dir.join("mcrelay.toml");
        fs::write(
            &config,
            format!(
                "[daemon]\nuser = \"nobody\"\ncores = [0]\ncontrol_socket = \"{}\"\nmetrics_listen = \"{metrics}\"\n{flows}",
                socket.display()
            ),
        )
        .expect("config");
        let log = dir.join("mcrelayd.log");
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(MCRELAYD);
                c
            }
            None => Command::new(MCRELAYD),
        };
        let child = command
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "info")
            .stderr(fs::File::create(&log).expect("log"))
            .spawn()
            .expect("spawn mcrelayd");
        Daemon {
            child,
            dir,
            socket,
            metrics,
        }
    }

    fn rewrite(&self, flows: &str) {
        let text = format!(
            "[daemon]\nuser = \"nobody\"\ncores = [0]\ncontrol_socket = \"{}\"\nmetrics_listen = \"{}\"\n{flows}",
            self.socket.display(),
            self.metrics
        );
        // Replaced atomically, as docs/operations.md asks.
        let tmp = self.dir.join("mcrelay.toml.new");
        fs::write(&tmp, text).expect("config");
        fs::rename(&tmp, self.dir.join("mcrelay.toml")).expect("rename");
    }

    fn wait_relaying(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.log().contains("relaying;") {
            assert!(
                Instant::now() < deadline,
                "mcrelayd did not start:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.join("mcrelayd.log")).unwrap_or_default()
    }

    fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("pid")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn sh(args: &[&str]) {
    let status = Command::new(args[0])
        .args(&args[1..])
        .status()
        .expect("run");
    assert!(status.success(), "{args:?}");
}

fn skip_unless_root() -> bool {
    if is_root() {
        return false;
    }
    eprintln!("SKIPPED: these tests start mcrelayd as root (CI runs them as root)");
    true
}

/// Run `f` on a new thread whose credentials (only its own) are `uid`,
/// `gid` and `groups`, with no capabilities.
fn as_user<T: Send + 'static>(
    uid: u32,
    gid: u32,
    groups: &[u32],
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let groups = groups.to_vec();
    std::thread::spawn(move || {
        // SAFETY: `groups` is a live vector of `groups.len()` gid_t; the
        // call changes only this thread's groups (a raw system call, not
        // glibc's every-thread wrapper) and reads no other memory.
        let groups_rc =
            unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
        // SAFETY: plain ids; this thread's credentials only, as above.
        let gid_rc = unsafe { libc::syscall(libc::SYS_setresgid, gid, gid, gid) };
        // SAFETY: as above.
        let uid_rc = unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, uid) };
        let rcs = [groups_rc, gid_rc, uid_rc];
        assert_eq!(
            rcs,
            [0, 0, 0],
            "changing credentials: {}",
            std::io::Error::last_os_error()
        );
        f()
    })
    .join()
    .expect("attacker thread")
}

/// `pidfd_getfd` of each of `pid`'s fds 0..32 and `ptrace(PTRACE_SEIZE)`,
/// from the calling thread: what was taken (fds and whether ptrace
/// attached), with errno values for what was refused.
fn reach_into(pid: i32) -> (Vec<i32>, Result<(), i32>) {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    assert!(
        pidfd >= 0,
        "pidfd_open: {}",
        std::io::Error::last_os_error()
    );
    let pidfd = i32::try_from(pidfd).expect("fd");
    let mut taken = Vec::new();
    for target in 0..32 {
        // SAFETY: pidfd_getfd takes two fds and flags; a returned fd is
        // ours and closed below.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd, target, 0) };
        if fd >= 0 {
            taken.push(target);
            // SAFETY: `fd` was just returned to this process and is closed once.
            unsafe { libc::close(i32::try_from(fd).expect("fd")) };
        }
    }
    // SAFETY: PTRACE_SEIZE takes a pid and no memory; a successful seize
    // ends when this thread exits (the tracer going away detaches).
    let seized = unsafe {
        libc::ptrace(
            libc::PTRACE_SEIZE,
            pid,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
        )
    };
    let seized = if seized == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    };
    // SAFETY: closes the pidfd opened above, once.
    unsafe { libc::close(pidfd) };
    (taken, seized)
}

fn assert_sealed(daemon: &Daemon, mode: &str) {
    let pid = daemon.pid();
    let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("Uid:") && l.contains("65534")),
        "{mode}: the daemon runs as nobody:\n{status}"
    );
    let (taken, seized) = as_user(NOBODY, NOBODY, &[NOBODY], move || reach_into(pid));
    assert_eq!(
        taken,
        Vec::<i32>::new(),
        "{mode}: another process of the service user took these fds of the daemon with pidfd_getfd"
    );
    assert_eq!(
        seized,
        Err(libc::EPERM),
        "{mode}: ptrace(PTRACE_SEIZE) of the daemon by another process of its user"
    );
    // The daemon still serves its own user and group after the change
    // (it no longer reads its uid from its /proc entry, now root's).
    let socket = daemon.socket.clone();
    let reply = as_user(NOBODY, NOBODY, &[NOBODY], move || request(&socket));
    assert!(reply.contains("\"ok\":true"), "{mode}: {reply}");
}

#[test]
fn a_same_uid_process_cannot_take_fds_or_ptrace_after_an_ambient_start() {
    if skip_unless_root() {
        return;
    }
    let daemon = Daemon::start(&AMBIENT_START);
    assert_sealed(&daemon, "ambient capabilities");
}

#[test]
fn a_same_uid_process_cannot_take_fds_or_ptrace_after_a_root_start() {
    if skip_unless_root() {
        return;
    }
    let daemon = Daemon::start(&[]);
    assert_sealed(&daemon, "root with user=");
}

/// One status request on a new connection; the reply line, or the error.
fn request(socket: &Path) -> String {
    control(socket, "status")
}

#[test]
fn a_member_by_supplementary_group_is_served() {
    if skip_unless_root() {
        return;
    }
    let daemon = Daemon::start(&[]);
    let socket = daemon.socket.clone();
    // Primary group its own; the socket's group (nogroup) only supplementary.
    let reply = as_user(STRANGER, STRANGER, &[STRANGER, NOBODY], move || {
        request(&socket)
    });
    assert!(reply.contains("\"ok\":true"), "{reply}");
    let socket = daemon.socket.clone();
    // Without the group, the socket's mode already keeps it out.
    let reply = as_user(STRANGER, STRANGER, &[STRANGER], move || request(&socket));
    assert!(!reply.contains("\"ok\":true"), "{reply}");
}

/// `n` clients that each send one byte a second and never finish a
/// request, reconnecting whenever the server closes them; stopped (and
/// joined) when the returned flag is set.
fn slow_clients(
    n: usize,
    connect: impl Fn() -> Option<Box<dyn Write + Send>> + Send + Sync + 'static,
) -> (Arc<AtomicBool>, Vec<std::thread::JoinHandle<()>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let connect = Arc::new(connect);
    let threads = (0..n)
        .map(|_| {
            let (stop, connect) = (Arc::clone(&stop), Arc::clone(&connect));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Some(mut conn) = connect() else {
                        std::thread::sleep(Duration::from_millis(100));
                        continue;
                    };
                    while !stop.load(Ordering::Relaxed) && conn.write_all(b"G").is_ok() {
                        std::thread::sleep(Duration::from_secs(1));
                    }
                }
            })
        })
        .collect();
    (stop, threads)
}

fn stop_clients((stop, threads): (Arc<AtomicBool>, Vec<std::thread::JoinHandle<()>>)) {
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
}

/// Wait until the daemon has accepted the slow clients: a few of their
/// one-byte-a-second writes.
fn let_them_settle() {
    std::thread::sleep(Duration::from_secs(3));
}

/// The slow clients' source address: loopback, but not the scraper's
/// 127.0.0.1.
const FLOOD_SOURCE: std::net::Ipv4Addr = std::net::Ipv4Addr::new(127, 0, 0, 2);

/// A TCP connection to `addr` from `source` (any port).
fn connect_from(source: std::net::Ipv4Addr, addr: SocketAddr) -> Option<TcpStream> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).ok()?;
    socket.bind(&SocketAddr::from((source, 0)).into()).ok()?;
    socket.connect(&addr.into()).ok()?;
    Some(socket.into())
}

fn scrape(addr: SocketAddr) -> Result<String, String> {
    let mut conn = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut reply = String::new();
    conn.read_to_string(&mut reply)
        .map_err(|e| format!("read: {e}"))?;
    Ok(reply)
}

#[test]
fn slow_clients_do_not_hold_the_metrics_endpoint() {
    if skip_unless_root() {
        return;
    }
    let daemon = Daemon::start(&[]);
    let addr = daemon.metrics;
    // The flood comes from another address than the scraper, as the
    // endpoint's rules promise (a newer connection from one address
    // displaces that address's oldest still reading: from the scraper's
    // own address, the flood's reconnections could displace the scrape
    // before its request is read, which a CI run saw).
    let clients = slow_clients(16, move || {
        connect_from(FLOOD_SOURCE, addr).map(|c| Box::new(c) as Box<dyn Write + Send>)
    });
    let_them_settle();
    for _ in 0..3 {
        let started = Instant::now();
        let reply = scrape(addr);
        let took = started.elapsed();
        assert!(
            reply
                .as_deref()
                .is_ok_and(|r| r.starts_with("HTTP/1.1 200")),
            "a scrape among 16 slow clients: {reply:?} after {took:?}"
        );
        // The slow clients' requests each take at least a second a byte;
        // a scrape served while they wait takes far less.
        assert!(took < Duration::from_secs(3), "scrape took {took:?}");
    }
    stop_clients(clients);
}

#[test]
fn slow_clients_of_one_user_do_not_hold_the_control_socket() {
    if skip_unless_root() {
        return;
    }
    let daemon = Daemon::start(&[]);
    let socket = daemon.socket.clone();
    // The attacker: the service user (allowed on the socket), 16 slow
    // connections, each from a thread with the service user's credentials.
    let clients = slow_clients(16, move || {
        let socket = socket.clone();
        as_user(NOBODY, NOBODY, &[NOBODY], move || {
            UnixStream::connect(&socket)
                .ok()
                .map(|c| Box::new(c) as Box<dyn Write + Send>)
        })
    });
    let_them_settle();
    for _ in 0..3 {
        let started = Instant::now();
        let reply = request(&daemon.socket);
        let took = started.elapsed();
        assert!(
            reply.contains("\"ok\":true"),
            "root's request among 16 slow clients of the service user: {reply} after {took:?}"
        );
        assert!(took < Duration::from_secs(3), "request took {took:?}");
    }
    stop_clients(clients);
}

/// A network namespace of this test's own with a veth pair (`d0`, `d1`)
/// for flows to name; nothing is sent into it. Removed on drop.
struct Netns(String);

impl Netns {
    fn new() -> Self {
        let name = format!(
            "mcr-ep-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        sh(&["ip", "netns", "add", &name]);
        let ns = Netns(name);
        for args in [
            &["link", "set", "lo", "up"][..],
            &["link", "add", "d0", "type", "veth", "peer", "name", "d1"],
            &["link", "set", "d1", "up"],
            &["link", "set", "d0", "up"],
            &["addr", "add", "10.99.0.1/24", "dev", "d0"],
        ] {
            let mut v = vec!["ip", "-n", &ns.0];
            v.extend_from_slice(args);
            sh(&v);
        }
        ns
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// `n` flows on `d0`, one output each: 3 fds a flow.
fn flows(n: usize) -> String {
    (0..n)
        .map(|i| {
            format!(
                "[[flow]]\nname = \"f{i}\"\ninput = {{ interface = \"d0\", address = \"239.1.{}.{}\", port = 5000 }}\n\
                 outputs = [ {{ interface = \"d0\", address = \"239.2.{}.{}\", port = 6000 }} ]\n",
                i / 200,
                i % 200 + 1,
                i / 200,
                i % 200 + 1
            )
        })
        .collect()
}

/// `cmd` on a new connection; the reply line, or the error.
fn control(socket: &Path, cmd: &str) -> String {
    let mut conn = match UnixStream::connect(socket) {
        Ok(c) => c,
        Err(e) => return format!("connect: {e}"),
    };
    // A reload of hundreds of flows may take a while on a loaded machine.
    let _ = conn.set_read_timeout(Some(Duration::from_secs(120)));
    if let Err(e) = conn.write_all(format!("{{\"v\":1,\"cmd\":\"{cmd}\"}}\n").as_bytes()) {
        return format!("write: {e}");
    }
    let mut reply = Vec::new();
    let mut byte = [0u8; 1];
    while !reply.ends_with(b"\n") {
        match conn.read(&mut byte) {
            Ok(0) => break,
            Ok(_) => reply.push(byte[0]),
            Err(e) => return format!("read: {e}"),
        }
    }
    String::from_utf8_lossy(&reply).into_owned()
}

#[test]
fn flows_beyond_the_fd_limit_are_refused_at_start_with_the_limit_to_raise() {
    if skip_unless_root() {
        return;
    }
    let ns = Netns::new();
    let mut daemon = Daemon::spawn(
        &flows(400),
        &[
            "ip",
            "netns",
            "exec",
            &ns.0,
            "prlimit",
            "--nofile=1024:1024",
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = daemon.child.try_wait().expect("wait") {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "mcrelayd started 400 flows under a limit of 1024 fds:\n{}",
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = daemon.log();
    assert!(!status.success(), "{log}");
    assert!(
        log.contains("400 flows need") && log.contains("the limit (RLIMIT_NOFILE) is 1024"),
        "{log}"
    );
    assert!(log.contains("raise LimitNOFILE="), "{log}");
}

#[test]
fn the_fd_limit_is_raised_and_a_reload_beyond_it_is_refused() {
    if skip_unless_root() {
        return;
    }
    let ns = Netns::new();
    // A soft limit of 64 (too few for 30 flows), a hard one of 1024.
    let daemon = Daemon::spawn(
        &flows(30),
        &["ip", "netns", "exec", &ns.0, "prlimit", "--nofile=64:1024"],
    );
    daemon.wait_relaying();
    let log = daemon.log();
    assert!(log.contains("relaying=30"), "every flow started:\n{log}");
    let pid = daemon.pid();
    let limits = fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    assert!(
        limits
            .lines()
            .any(|l| l.starts_with("Max open files") && l.split_whitespace().nth(3) == Some("1024")),
        "soft limit raised to the hard one:\n{limits}"
    );
    // 400 flows don't fit in 1024: refused, and nothing changes.
    daemon.rewrite(&flows(400));
    let reply = control(&daemon.socket, "reload");
    assert!(
        reply.contains("\"applied\":false") && reply.contains("raise LimitNOFILE="),
        "{reply}"
    );
    let reply = control(&daemon.socket, "status");
    assert!(reply.contains("\"ok\":true"), "{reply}");
    // Back to a small config: applied.
    daemon.rewrite(&flows(2));
    let reply = control(&daemon.socket, "reload");
    assert!(reply.contains("\"applied\":true"), "{reply}");
    assert!(reply.contains("\"errors\":[]"), "{reply}");
}

#[test]
fn check_refuses_flows_beyond_the_fd_limit() {
    // No root needed: any process may lower its own limit.
    let dir = std::env::temp_dir().join(format!("mcrelay-hostile-check-{}", std::process::id()));
    fs::create_dir_all(&dir).expect("dir");
    let config = dir.join("mcrelay.toml");
    let check = |flows_toml: &str| {
        // An existing user: `check` on the host looks it up (issue 27).
        fs::write(
            &config,
            format!("[daemon]\nuser = \"nobody\"\ncores = [0]\n{flows_toml}"),
        )
        .expect("config");
        Command::new("prlimit")
            .arg("--nofile=256:256")
            .arg(MCRELAYD)
            .arg("check")
            .arg("--config")
            .arg(&config)
            .output()
            .expect("mcrelayd check")
    };
    let out = check(&flows(100));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("100 flows need 368 file descriptors")
            && stderr.contains("the limit (RLIMIT_NOFILE) is 256")
            && stderr.contains("raise LimitNOFILE= in mcrelay.service to at least 368"),
        "{stderr}"
    );
    let out = check(&flows(10));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = fs::remove_dir_all(&dir);
}
