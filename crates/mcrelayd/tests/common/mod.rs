//! Scaffolding shared by the namespace tests: a three-namespace topology
//! (sender A, relay R, receivers B) removed on drop, the daemon under test,
//! the load generator, and readers for their output.
//!
//! ```text
//!  ns A (sender)          ns R (mcrelayd)                 ns B (receivers)
//!  vA 10.10.1.1 <--veth--> vRA 10.10.1.2 | vRB 10.10.2.1 <--veth--> vB 10.10.2.2
//!     fd01::1                 fd01::2    |    fd02::1                  fd02::2
//! ```
#![allow(dead_code)] // each test binary uses a different part

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How long a test waits for something it has started to happen (a
/// daemon to come up, a receiver to join, a counter to move) before it
/// fails. Generous on purpose: on a loaded 2-core machine, starting a
/// process alone can take seconds. Tests poll for the event and go on as
/// soon as it is seen, so a passing run never waits this long.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// Poll `done` every 20 ms until it returns `Ok`, failing after
/// [`DEADLINE`] with `what` and the last `Err` it returned.
pub fn wait_until<T>(what: &str, done: impl FnMut() -> Result<T, String>) -> T {
    wait_within(DEADLINE, what, done)
}

/// [`wait_until`] with a deadline of `limit` instead of [`DEADLINE`], for a
/// wait on a chain of events (e.g. a scrape, a rule evaluation, an alert).
pub fn wait_within<T>(
    limit: Duration,
    what: &str,
    mut done: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        match done() {
            Ok(v) => return v,
            Err(last) => assert!(
                Instant::now() < deadline,
                "not {what} within {limit:?}: {last}"
            ),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Receive buffer each test receiver asks for (`loadgen recv --rcvbuf`,
/// granted whole through `SO_RCVBUFFORCE` as root; the kernel doubles it
/// for bookkeeping): room for a whole test's burst (4000 datagrams of
/// 4000 bytes are 16 MB of payload, plus the kernel's overhead per
/// datagram), so a receiver
/// that gets no CPU for a while on a loaded machine drops nothing and
/// what the tests count is the relay's delivery. loadgen's own 8 MiB
/// default overflowed after ~100 ms without a CPU.
pub const RECEIVER_RCVBUF: &str = "67108864";

/// The run id of an end marker ([`Topology::end_marker`]): every
/// receiver started by [`Topology::receiver_on`] stops when one arrives.
pub const END_RUN: u32 = 999;

pub const MCRELAYD: &str = env!("CARGO_BIN_EXE_mcrelayd");

/// The privileged helper program mcrelayd starts when it has privileges:
/// `mcrelay-helper` beside it. Another package's binary, so `cargo test -p
/// mcrelayd` alone does not build it; `cargo test --workspace` (and CI)
/// does.
pub fn helper_program() -> PathBuf {
    let path = Path::new(MCRELAYD).with_file_name("mcrelay-helper");
    assert!(
        path.is_file(),
        "{} is missing: build it first (cargo build -p mcrelay-helper; cargo test --workspace does)",
        path.display()
    );
    path
}

/// A wrapper ([`Topology::relay_with`]) that starts mcrelayd as nobody
/// with only the capabilities it needs, as ambient capabilities (the way
/// a systemd unit with `AmbientCapabilities=` starts it).
pub const AMBIENT_START: [&str; 6] = [
    "setpriv",
    "--reuid=nobody",
    "--regid=nogroup",
    "--clear-groups",
    "--inh-caps=+net_admin,+net_raw,+net_bind_service,+bpf",
    "--ambient-caps=+net_admin,+net_raw,+net_bind_service,+bpf",
];

pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// A binary of another package of the workspace, next to `mcrelayd`,
/// built if missing.
pub fn sibling(package: &str, bin: &str) -> PathBuf {
    let path = Path::new(MCRELAYD).with_file_name(bin);
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", package, "--bin", bin])
            .status()
            .expect("cargo build");
        assert!(status.success(), "building {bin}");
    }
    path
}

pub fn loadgen() -> PathBuf {
    sibling("mcrelay-loadgen", "loadgen")
}

pub fn mcrelayctl() -> PathBuf {
    sibling("mcrelayctl", "mcrelayctl")
}

pub fn sh(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .expect("run command");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Three namespaces and two veth pairs, removed on drop.
pub struct Topology {
    pub a: String,
    pub r: String,
    pub b: String,
    pub dir: PathBuf,
    /// One topology at a time: these tests measure delivery, and on a
    /// 2-core machine parallel relays would starve each other.
    _serial: NetnsSerial,
}

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Held while a test uses network namespaces; see [`netns_serial`].
pub type NetnsSerial = (std::sync::MutexGuard<'static, ()>, fs::File);

/// Wait until no other namespace test runs, in this test binary or any
/// other (other binaries, other checkouts), and hold that until dropped.
pub fn netns_serial() -> NetnsSerial {
    let serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // One at a time across test binaries and checkouts: an flock that the
    // kernel releases when the holder exits, even by a crash.
    let machine =
        fs::File::create(std::env::temp_dir().join("mcrelay-netns-tests.lock")).expect("lock file");
    lock_exclusive(&machine);
    (serial, machine)
}

static NEXT: AtomicU32 = AtomicU32::new(0);

impl Topology {
    pub fn new() -> Option<Self> {
        let t = Self::bare("mcr")?;
        helper_program();
        sh(&[
            "ip", "link", "add", "vA", "netns", &t.a, "mtu", "9200", "type", "veth", "peer",
            "name", "vRA", "netns", &t.r, "mtu", "9200",
        ]);
        sh(&[
            "ip", "link", "add", "vRB", "netns", &t.r, "mtu", "9200", "type", "veth", "peer",
            "name", "vB", "netns", &t.b, "mtu", "9200",
        ]);
        for (ns, dev, v4, v6) in [
            (&t.a, "vA", "10.10.1.1/24", "fd01::1/64"),
            (&t.r, "vRA", "10.10.1.2/24", "fd01::2/64"),
            (&t.r, "vRB", "10.10.2.1/24", "fd02::1/64"),
            (&t.b, "vB", "10.10.2.2/24", "fd02::2/64"),
        ] {
            t.ip(ns, &["addr", "add", v4, "dev", dev]);
            t.ip(ns, &["-6", "addr", "add", v6, "dev", dev, "nodad"]);
            t.ip(ns, &["link", "set", dev, "up"]);
        }
        t.ip(&t.a, &["route", "add", "224.0.0.0/4", "dev", "vA"]);
        t.ip(&t.b, &["route", "add", "224.0.0.0/4", "dev", "vB"]);
        t.ip(&t.a, &["route", "add", "10.10.2.0/24", "via", "10.10.1.2"]);
        // IPv6 takes multicast only once addrconf has added the ff00::/8
        // route, a moment after the link comes up.
        for (ns, dev) in [(&t.a, "vA"), (&t.r, "vRA"), (&t.r, "vRB"), (&t.b, "vB")] {
            let deadline = Instant::now() + DEADLINE;
            loop {
                let out = Command::new("ip")
                    .args([
                        "-n", ns, "-6", "route", "show", "table", "local", "dev", dev,
                    ])
                    .output()
                    .expect("ip route");
                if String::from_utf8_lossy(&out.stdout).contains("ff00::/8") {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "IPv6 multicast route on {dev} never appeared"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        for key in ["all", "default", "vRA", "vRB"] {
            t.rp_filter(key, 0);
        }
        Some(t)
    }

    /// Three empty namespaces (only `lo` up), `{prefix}-a-ID`,
    /// `{prefix}-r-ID` and `{prefix}-b-ID`, and a temporary directory,
    /// removed on drop like [`Topology::new`]'s, for a test that wires
    /// its own links (e.g. two paths from A into R: tests/redundancy.rs).
    /// Holds the machine-wide namespace lock.
    pub fn bare(prefix: &str) -> Option<Self> {
        if !is_root() {
            eprintln!("SKIPPED: namespace tests need root (CI runs them as root)");
            return None;
        }
        let serial = netns_serial();
        let id = format!(
            "{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let t = Topology {
            _serial: serial,
            a: format!("{prefix}-a-{id}"),
            r: format!("{prefix}-r-{id}"),
            b: format!("{prefix}-b-{id}"),
            dir: std::env::temp_dir().join(format!("mcrelay-{prefix}-{id}")),
        };
        fs::create_dir_all(&t.dir).expect("temp dir");
        for ns in [&t.a, &t.r, &t.b] {
            sh(&["ip", "netns", "add", ns]);
            t.ip(ns, &["link", "set", "lo", "up"]);
        }
        Some(t)
    }

    /// Two legs from A to R, one path from R to B, in namespaces
    /// `prefix-*`; `net` picks the addresses (10.`net`.x.0/24):
    ///
    /// ```text
    ///  vA1 10.net.1.1 <--veth--> vRA1 10.net.1.2   (leg 0)
    ///  vA2 10.net.3.1 <--veth--> vRA2 10.net.3.2   (leg 1)
    ///                            vRB  10.net.2.1 <--veth--> vB 10.net.2.2
    /// ```
    ///
    /// B routes multicast to vB; every link has carrier before this
    /// returns (else a daemon's flow begins paused, "interface down"), and
    /// R's reverse-path filter is off.
    pub fn two_legs(prefix: &str, net: u8) -> Option<Self> {
        let t = Self::bare(prefix)?;
        let veth = |ns1: &str, d1: &str, ns2: &str, d2: &str| {
            sh(&[
                "ip", "link", "add", d1, "netns", ns1, "mtu", "9200", "type", "veth", "peer",
                "name", d2, "netns", ns2, "mtu", "9200",
            ]);
        };
        veth(&t.a, "vA1", &t.r, "vRA1");
        veth(&t.a, "vA2", &t.r, "vRA2");
        veth(&t.r, "vRB", &t.b, "vB");
        let links = [
            (&t.a, "vA1", 1, 1),
            (&t.r, "vRA1", 1, 2),
            (&t.a, "vA2", 3, 1),
            (&t.r, "vRA2", 3, 2),
            (&t.r, "vRB", 2, 1),
            (&t.b, "vB", 2, 2),
        ];
        for (ns, dev, subnet, host) in links {
            let v4 = format!("10.{net}.{subnet}.{host}/24");
            t.ip(ns, &["addr", "add", &v4, "dev", dev]);
            t.ip(ns, &["link", "set", dev, "up"]);
        }
        t.ip(&t.b, &["route", "add", "224.0.0.0/4", "dev", "vB"]);
        for (ns, dev, _, _) in links {
            wait_link_up(ns, dev);
        }
        for key in ["all", "default", "vRA1", "vRA2", "vRB"] {
            t.rp_filter(key, 0);
        }
        Some(t)
    }

    /// The value of `series` in the `/metrics` the daemon in R serves on
    /// `127.0.0.1:port` (python's urllib: no curl needed).
    pub fn metric(&self, port: u16, series: &str) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.r, "python3", "-c"])
            .arg(format!(
                "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}/metrics', timeout=5).read().decode())"
            ))
            .output()
            .expect("python3");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{series} ")))
            .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
            .to_owned()
    }

    /// Lower the input link's MTU (vA, vRA) to 1500: an `ingress = "xdp"`
    /// input's frames must fit a UMEM frame (1792 bytes).
    pub fn fit_input_to_umem(&self) {
        self.ip(&self.a, &["link", "set", "vA", "mtu", "1500"]);
        self.ip(&self.r, &["link", "set", "vRA", "mtu", "1500"]);
    }

    /// Send 1000 datagrams of mixed sizes, up to the largest a 1500-byte
    /// MTU carries, from A to 239.1.1.1:5000, and check that each of
    /// `receivers` (an interface of B and a group) got every one
    /// byte-exact.
    pub fn relays_mixed_sizes_byte_exact(&self, receivers: &[(&str, &str)]) {
        let rx: Vec<Child> = receivers
            .iter()
            .map(|(interface, group)| self.receiver_on(interface, group, 1000, &[]))
            .collect();
        self.send(
            "239.1.1.1:5000",
            &[
                "--count",
                "1000",
                "--rate",
                "20000",
                "--size",
                "1316,64,1472,700",
            ],
        );
        for rx in rx {
            let out = finish(rx);
            clean(&out);
            assert_eq!(field(&out, "valid"), 1000, "{out}");
            assert_eq!(field(&out, "max_len"), 1472, "{out}");
        }
    }

    /// Set `net.ipv4.conf.<key>.rp_filter` in R.
    pub fn rp_filter(&self, key: &str, value: u8) {
        let setting = format!("net.ipv4.conf.{key}.rp_filter={value}");
        sh(&["ip", "netns", "exec", &self.r, "sysctl", "-qw", &setting]);
    }

    pub fn ip(&self, ns: &str, args: &[&str]) {
        let mut v = vec!["ip", "-n", ns];
        v.extend_from_slice(args);
        sh(&v);
    }

    /// `iptables args` in namespace `ns`.
    pub fn iptables(&self, ns: &str, args: &[&str]) {
        let mut v = vec!["ip", "netns", "exec", ns, "iptables"];
        v.extend_from_slice(args);
        sh(&v);
    }

    /// Add the iptables rule `rule` in `ns` (table, chain and match, e.g.
    /// `-A INPUT -p udp`) dropping a random `probability` of what it
    /// matches: loss on a link (this kernel has no netem).
    pub fn drop_randomly(&self, ns: &str, rule: &[&str], probability: &str) {
        let mut v = rule.to_vec();
        v.extend_from_slice(&[
            "-m",
            "statistic",
            "--mode",
            "random",
            "--probability",
            probability,
            "-j",
            "DROP",
        ]);
        self.iptables(ns, &v);
    }

    pub fn command(&self, ns: &str, program: &Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]).arg(program);
        c
    }

    /// Start mcrelayd in R with `config`; returns once it is relaying.
    pub fn relay(&self, config: &str, extra: &[&str]) -> Relay {
        self.relay_with(config, extra, &[], &[])
    }

    /// `relay`, with mcrelayd started through `wrapper` (e.g. `setpriv
    /// ...`) and with `env` added to its environment.
    pub fn relay_with(
        &self,
        config: &str,
        extra: &[&str],
        wrapper: &[&str],
        env: &[(&str, String)],
    ) -> Relay {
        let path = self.dir.join("mcrelay.toml");
        // Each topology's daemon gets its own control socket.
        let config = if config.contains("[daemon]") {
            config.to_owned()
        } else {
            format!(
                "[daemon]\nuser = \"nobody\"\ncontrol_socket = \"{}\"\n{config}",
                self.dir.join("control.sock").display()
            )
        };
        fs::write(&path, config).expect("write config");
        let log = self.dir.join("mcrelayd.log");
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.r])
            .args(wrapper)
            .arg(MCRELAYD);
        let child = command
            .arg("--config")
            .arg(&path)
            .args(extra)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", "info")
            .stderr(fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn mcrelayd");
        let relay = Relay { child, log };
        let deadline = Instant::now() + DEADLINE;
        while !relay.log().contains("relaying;") {
            assert!(
                Instant::now() < deadline,
                "mcrelayd did not start:\n{}",
                relay.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        relay
    }

    /// Start a validating receiver in B on vB; returns once it has joined.
    pub fn receiver(&self, group: &str, expect: u64, extra: &[&str]) -> Child {
        self.receiver_on("vB", group, expect, extra)
    }

    /// A validating receiver in B joined on `interface`. It stops on an
    /// event: `expect` datagrams, an end marker ([`Topology::end_marker`])
    /// or SIGTERM ([`terminate`]); never on an idle timeout, which would
    /// race the test's own steps on a loaded machine. `--duration` (60 s
    /// unless `extra` gives one) only bounds a failing test.
    pub fn receiver_on(&self, interface: &str, group: &str, expect: u64, extra: &[&str]) -> Child {
        let idle = if extra.contains(&"--idle-exit") {
            &[][..]
        } else {
            &["--idle-exit", "0"][..]
        };
        let ready = self.dir.join(format!(
            "ready-{interface}-{}",
            group.replace([':', '[', ']'], "_")
        ));
        // A receiver of the same group earlier in the test left its file:
        // waiting on it would not wait for this one.
        let _ = fs::remove_file(&ready);
        let child = self
            .command(&self.b, &loadgen())
            .args(["recv", "--group", group, "--interface", interface, "--json"])
            .args(if extra.contains(&"--duration") {
                &[][..]
            } else {
                &["--duration", "60"][..]
            })
            .args(idle)
            .args(if extra.contains(&"--rcvbuf") {
                &[][..]
            } else {
                &["--rcvbuf", RECEIVER_RCVBUF][..]
            })
            .args(["--end-run-id", &END_RUN.to_string()])
            .args(["--expect", &expect.to_string(), "--ready-file"])
            .arg(&ready)
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn receiver");
        let deadline = Instant::now() + DEADLINE;
        while !ready.exists() {
            assert!(
                Instant::now() < deadline,
                "receiver for {group} never joined"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // Let the IGMP/MLD join settle on the veth.
        std::thread::sleep(Duration::from_millis(50));
        child
    }

    /// Send from A and wait for the sender to finish.
    pub fn send(&self, dest: &str, args: &[&str]) {
        let status = self
            .command(&self.a, &loadgen())
            .args(["send", "--dest", dest, "--interface", "vA"])
            .args(args)
            .stdout(Stdio::null())
            .status()
            .expect("sender");
        assert!(status.success(), "sender failed");
    }

    /// A paced sender of 1316-byte datagrams in namespace `ns`, in the
    /// background: `count` of them, or with `None` until [`stop_sender`]
    /// (at most 10 minutes), so that traffic lasts as long as the test's
    /// steps need, however long they take.
    pub fn sender(
        &self,
        ns: &str,
        dest: &str,
        interface: Option<&str>,
        count: Option<u64>,
        rate: u64,
    ) -> Child {
        let mut c = self.command(ns, &loadgen());
        c.args(["send", "--dest", dest, "--json"]);
        if let Some(i) = interface {
            c.args(["--interface", i]);
        }
        match count {
            Some(n) => c.args(["--count", &n.to_string()]),
            None => c.args(["--duration", "600"]),
        };
        c.args(["--rate", &rate.to_string()])
            .args(["--size", "1316"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn sender")
    }

    /// Send one end marker (a datagram of run [`END_RUN`]) from namespace
    /// `ns` to `dest`, out of `interface`, once the traffic being counted
    /// has been sent: a receiver behind an in-order path stops when it
    /// arrives, having received all that came before it.
    pub fn end_marker(&self, ns: &str, dest: &str, interface: Option<&str>) {
        let mut c = self.command(ns, &loadgen());
        c.args(["send", "--dest", dest, "--count", "1", "--run-id"])
            .arg(END_RUN.to_string());
        if let Some(i) = interface {
            c.args(["--interface", i]);
        }
        let status = c.stdout(Stdio::null()).status().expect("end marker");
        assert!(status.success(), "end marker to {dest} failed");
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for ns in [&self.a, &self.r, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Wait until `dev` in namespace `ns` has carrier (`state UP`).
pub fn wait_link_up(ns: &str, dev: &str) {
    wait_until(&format!("{dev} up"), || {
        let out = Command::new("ip")
            .args(["-n", ns, "-o", "link", "show", "dev", dev])
            .output()
            .expect("ip link");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.contains("state UP") {
            Ok(())
        } else {
            Err(text)
        }
    });
}

pub struct Relay {
    pub child: Child,
    pub log: PathBuf,
}

impl Relay {
    pub fn log(&self) -> String {
        let mut s = String::new();
        let _ = fs::File::open(&self.log).and_then(|mut f| f.read_to_string(&mut s));
        s
    }

    /// SIGTERM; asserts a clean exit within a second; the final counters.
    pub fn stop(mut self) -> String {
        // The signal is sent in-process: spawning `kill` would add its own
        // start-up, seconds on a loaded machine, to the time measured.
        let start = Instant::now();
        signal(&self.child, libc::SIGTERM);
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                break s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "mcrelayd ignored SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        let took = start.elapsed();
        let log = self.log();
        assert!(status.success(), "mcrelayd exit status {status}:\n{log}");
        assert!(
            took < Duration::from_secs(1),
            "SIGTERM to exit took {took:?}:\n{log}"
        );
        log
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A flow input in TOML: `{ interface = .., address = .., port = .. }`
/// for `group` (`address:port`) on `iface`.
pub fn leg_toml(iface: &str, group: &str) -> String {
    let (addr, port) = group.split_once(':').expect("group:port");
    format!("{{ interface = \"{iface}\", address = \"{addr}\", port = {port} }}")
}

/// A number from a receiver's JSON line.
pub fn field(json: &str, key: &str) -> i64 {
    let at = json
        .find(&format!("\"{key}\":"))
        .unwrap_or_else(|| panic!("{key} missing in {json}"));
    json[at + key.len() + 3..]
        .split([',', '}'])
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(-1)
}

/// A count as the receivers' JSON numbers are read ([`field`]).
pub fn whole(n: u64) -> i64 {
    i64::try_from(n).expect("small")
}

pub fn finish(rx: Child) -> String {
    String::from_utf8(rx.wait_with_output().expect("receiver").stdout).expect("utf-8")
}

/// Stop a sender (SIGTERM); how many datagrams it sent.
pub fn stop_sender(tx: Child) -> u64 {
    signal(&tx, libc::SIGTERM);
    let out = tx.wait_with_output().expect("sender");
    assert!(out.status.success(), "sender failed");
    let json = String::from_utf8_lossy(&out.stdout);
    u64::try_from(field(&json, "sent")).expect("sent count")
}

/// Send `sig` to a child (`ip netns exec` execs its program, so the child
/// is the program itself); no process is started, so the signal goes out
/// now, whatever the load.
#[allow(unsafe_code)]
pub fn signal(child: &Child, sig: i32) {
    let pid = i32::try_from(child.id()).expect("pid");
    // SAFETY: kill(2) on our own child, which has not been reaped (we hold
    // its Child), so the pid names it; no memory is passed.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
}

/// Stop a receiver with SIGTERM (once the test has seen that nothing more
/// can come) and read its summary.
pub fn terminate(rx: Child) -> String {
    signal(&rx, libc::SIGTERM);
    finish(rx)
}

/// A counter from mcrelayd's `final ...` lines: the line containing every
/// `selector` word, then `key=value`.
pub fn counter(log: &str, selectors: &[&str], key: &str) -> u64 {
    let line = log
        .lines()
        .find(|l| l.starts_with("final") && selectors.iter().all(|s| l.contains(s)))
        .unwrap_or_else(|| panic!("no final line with {selectors:?} in:\n{log}"));
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{key} missing in {line}"))
}

pub fn clean(out: &str) {
    assert_eq!(field(out, "corrupt"), 0, "no corrupt payloads: {out}");
    assert_eq!(field(out, "duplicates"), 0, "no duplicates: {out}");
    assert_eq!(field(out, "reordered"), 0, "no reordering: {out}");
}

/// `flock(LOCK_EX)` (std's `File::lock` is newer than this workspace's MSRV).
#[allow(unsafe_code)]
fn lock_exclusive(file: &fs::File) {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor this function borrows; no memory is
    // passed to the kernel.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(rc, 0, "flock: {}", std::io::Error::last_os_error());
}

/// The daemon's snapshot, through `mcrelayctl flows --json`.
pub fn snapshot(socket: &Path) -> mcrelay_control::Snapshot {
    let (code, json) = ctl(socket, &["flows", "--json"]);
    assert_eq!(code, 0, "{json}");
    serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"))
}

/// `mcrelayctl stats --json`, parsed.
pub fn stats_json(socket: &Path) -> serde_json::Value {
    let (code, out) = ctl(socket, &["stats", "--json"]);
    assert_eq!(code, 0, "{out}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// `GET /metrics` from the daemon's endpoint `addr`, fetched from inside
/// namespace `ns` (where it listens): the whole response.
pub fn scrape_in(ns: &str, addr: &'static str) -> String {
    use std::io::Write;
    in_netns(ns, move || {
        let mut c = std::net::TcpStream::connect(addr).expect("connect to metrics");
        c.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")
            .expect("request");
        let mut body = String::new();
        c.read_to_string(&mut body).expect("response");
        body
    })
}

/// Wait until flow `name` has received at least `n` datagrams: traffic
/// is under way.
pub fn wait_for_packets_in(socket: &Path, name: &str, n: u64) {
    wait_until(&format!("{n} datagrams into flow {name}"), || {
        let s = snapshot(socket);
        match s.flow(name) {
            Some(f) if f.packets_in >= n => Ok(()),
            _ => Err(format!("{s:?}")),
        }
    });
}

/// Poll flow `name` until `done` (its state and `packets_in`) holds.
pub fn wait_flow(
    socket: &Path,
    name: &str,
    what: &str,
    done: impl Fn(&mcrelay_control::FlowState, u64) -> bool,
) {
    wait_until(&format!("flow {name} {what}"), || {
        let s = snapshot(socket);
        let f = s.flow(name).ok_or_else(|| format!("no flow {name}"))?;
        if done(&f.state, f.packets_in) {
            Ok(())
        } else {
            Err(format!("{:?}, {} in", f.state, f.packets_in))
        }
    });
}

/// Write `config` over the daemon's file `path` and reload it through
/// the control socket; the reload must succeed.
pub fn reload_config(relay: &Relay, socket: &Path, path: &Path, config: &str) {
    fs::write(path, config).expect("rewrite");
    let (code, said) = ctl(socket, &["reload"]);
    assert_eq!(code, 0, "{said}\n{}", relay.log());
}

/// `mcrelayctl --socket SOCKET args...`: exit code and output.
pub fn ctl(socket: &Path, args: &[&str]) -> (i32, String) {
    let out = Command::new(mcrelayctl())
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .expect("mcrelayctl");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Run `f` on a thread that has entered network namespace `ns` (a path
/// under /var/run/netns, as `ip netns add` makes): to connect to a
/// daemon's loopback-only endpoint, or send from inside the namespace.
pub fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = PathBuf::from("/var/run/netns").join(ns);
    std::thread::spawn(move || {
        let file = fs::File::open(&path).expect("netns file");
        enter_netns(&file);
        f()
    })
    .join()
    .expect("netns thread")
}

#[allow(unsafe_code)]
pub fn enter_netns(file: &fs::File) {
    use std::os::fd::AsRawFd;
    // SAFETY: setns on a descriptor this function borrows, for the calling
    // thread only (network namespace); no memory is passed.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
}
