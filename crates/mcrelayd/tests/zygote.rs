//! The privileged zygote: a helper that dies comes back with its
//! privileges, the helper and the zygote hold only the network
//! capabilities, and cgroup-wide `SIGHUP`/`SIGINT` (what `systemctl kill`
//! sends) neither kill them nor leave them behind. In network namespaces
//! (topology in `common/mod.rs`), with the real daemon started as root with
//! `user = "nobody"` and as an ordinary user holding ambient capabilities.
//! Needs root (CI runs as root); skips with a message otherwise.

use std::fs;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use mcrelay_control::{FlowState, Snapshot};

mod common;
use common::*;

/// CAP_NET_BIND_SERVICE, CAP_NET_ADMIN, CAP_NET_RAW, CAP_BPF: what the
/// unit grants.
const NET_CAPS: u64 = (1 << 10) | (1 << 12) | (1 << 13) | (1 << 39);

/// `/proc/<pid>/status` field `key` (e.g. `CapEff`), trimmed.
fn status_field(pid: u32, key: &str) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(|v| v.trim().to_owned())
}

fn caps(pid: u32, key: &str) -> u64 {
    let v = status_field(pid, key).unwrap_or_else(|| panic!("{key} of {pid}"));
    u64::from_str_radix(&v, 16).expect("hex")
}

fn children(pid: u32) -> Vec<u32> {
    fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// mcrelayd's only child is the zygote; the zygote's only child the helper.
fn zygote_and_helper(daemon: u32) -> (u32, u32) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let z = children(daemon);
        if let [zygote] = z[..]
            && let [helper] = children(zygote)[..]
        {
            return (zygote, helper);
        }
        assert!(
            Instant::now() < deadline,
            "expected one zygote with one helper under {daemon}: {z:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn alive(pid: u32) -> bool {
    // A zombie still has a status file: look at its state.
    status_field(pid, "State").is_some_and(|s| !s.starts_with('Z'))
}

fn snapshot(socket: &Path) -> Snapshot {
    let (code, json) = ctl(socket, &["flows", "--json"]);
    assert_eq!(code, 0, "{json}");
    serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"))
}

/// Poll flow `name` until `done` holds (at most 10 s).
fn wait_flow(socket: &Path, name: &str, what: &str, done: impl Fn(&FlowState, u64) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = snapshot(socket);
        let f = s.flow(name).unwrap_or_else(|| panic!("no flow {name}"));
        if done(&f.state, f.packets_in) {
            return;
        }
        assert!(Instant::now() < deadline, "flow {name} not {what}: {f:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn config(t: &Topology, user: Option<&str>, extra: &str) -> String {
    format!(
        r#"[daemon]
{}control_socket = "{}"
[[flow]]
name = "steady"
input = {{ interface = "vRA", address = "239.1.1.1", port = 5000 }}
outputs = [ {{ interface = "vRB", address = "239.2.2.2", port = 6000 }} ]
[[flow]]
name = "flapping"
input = {{ interface = "vRA", address = "239.1.1.2", port = 5000, ingress = "packet" }}
outputs = [ {{ interface = "mcz0", address = "239.2.2.9", port = 6000 }} ]
{extra}"#,
        user.map(|u| format!("user = \"{u}\"\n"))
            .unwrap_or_default(),
        t.dir.join("run/control.sock").display()
    )
}

const ADDED: &str = r#"
[[flow]]
name = "added"
input = { interface = "vRA", address = "239.1.1.3", port = 5000, ingress = "packet" }
outputs = [ { interface = "vRB", address = "239.2.2.4", port = 6000 } ]
"#;

/// A run directory the service user owns (as systemd's RuntimeDirectory=),
/// and a veth pair inside R (mcz0, mcz1) for the flapping flow's output.
fn prepare(t: &Topology) {
    let run = t.dir.join("run");
    fs::create_dir(&run).expect("run dir");
    sh(&["chown", "nobody", &run.display().to_string()]);
    t.ip(
        &t.r,
        &[
            "link", "add", "mcz0", "type", "veth", "peer", "name", "mcz1",
        ],
    );
    t.ip(&t.r, &["addr", "add", "10.10.9.1/24", "dev", "mcz0"]);
    t.ip(&t.r, &["link", "set", "mcz1", "up"]);
    t.ip(&t.r, &["link", "set", "mcz0", "up"]);
}

/// Kill -9 the helper under traffic; a new, as privileged, helper within
/// 1 s; the daemon not degraded; a packet flow paused by a link flap
/// resumes (it reopens an AF_PACKET socket: CAP_NET_RAW); a reload adding
/// a packet flow works; the steady flow loses nothing.
fn helper_comes_back_privileged(t: &Topology, relay: &Relay, uid: &str) {
    let socket = t.dir.join("run/control.sock");
    let daemon = relay.child.id();
    let (zygote, helper) = zygote_and_helper(daemon);
    for (pid, who) in [(zygote, "zygote"), (helper, "helper")] {
        assert!(
            status_field(pid, "Uid").is_some_and(|u| u.starts_with(uid)),
            "the {who} runs as {uid}: {:?}",
            status_field(pid, "Uid")
        );
        assert_eq!(
            caps(pid, "CapPrm"),
            NET_CAPS,
            "{who}: only the network capabilities"
        );
        assert_eq!(
            caps(pid, "CapBnd") & !NET_CAPS,
            0,
            "{who}: bounding set trimmed"
        );
        assert_eq!(
            status_field(pid, "NoNewPrivs").as_deref(),
            Some("1"),
            "{who}"
        );
    }
    assert_eq!(caps(zygote, "CapEff"), 0, "the zygote never uses them");
    assert_eq!(caps(helper, "CapEff"), NET_CAPS, "the helper uses them");
    wait_flow(&socket, "flapping", "running", |s, _| s.is_running());

    let rx = t.receiver("239.2.2.2:6000", 20_000, &[]);
    let sender = t
        .command(&t.a, &loadgen())
        .args(["send", "--dest", "239.1.1.1:5000", "--interface", "vA"])
        .args(["--count", "20000", "--rate", "10000", "--size", "1316"])
        .stdout(Stdio::null())
        .spawn()
        .expect("sender");
    std::thread::sleep(Duration::from_millis(500));
    sh(&["kill", "-KILL", &helper.to_string()]);
    let killed = Instant::now();
    let new = loop {
        if let [new] = children(zygote)[..]
            && new != helper
            && caps(new, "CapEff") == NET_CAPS
        {
            break new;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(1),
            "no new privileged helper within 1 s of the kill:\n{}",
            relay.log()
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(status_field(new, "Uid").is_some_and(|u| u.starts_with(uid)));
    assert_eq!(caps(new, "CapPrm"), NET_CAPS);
    let _ = sender.wait_with_output();
    let out = finish(rx);
    clean(&out);
    assert_eq!(
        (field(&out, "valid"), field(&out, "lost")),
        (20_000, 0),
        "the running flow lost nothing while its helper was replaced: {out}\n{}",
        relay.log()
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (code, status) = ctl(&socket, &["status"]);
        assert_eq!(code, 0, "{status}");
        if !status.contains("degraded") {
            break;
        }
        assert!(Instant::now() < deadline, "still degraded: {status}");
        std::thread::sleep(Duration::from_millis(20));
    }

    // A link flap pauses the packet flow; the new helper reopens it.
    t.ip(&t.r, &["link", "set", "mcz0", "down"]);
    wait_flow(&socket, "flapping", "paused", |s, _| {
        matches!(s, FlowState::InterfaceDown { .. })
    });
    t.ip(&t.r, &["link", "set", "mcz0", "up"]);
    wait_flow(&socket, "flapping", "resumed", |s, _| s.is_running());
    let before = snapshot(&socket).flow("flapping").expect("flow").packets_in;
    t.send("239.1.1.2:5000", &["--count", "200", "--rate", "10000"]);
    wait_flow(&socket, "flapping", "relaying again", |_, n| {
        n >= before + 200
    });

    // A reload adding a packet flow: the new helper opens it.
    let path = t.dir.join("mcrelay.toml");
    let text = fs::read_to_string(&path).expect("config");
    fs::write(&path, format!("{text}{ADDED}")).expect("rewrite config");
    let (code, said) = ctl(&socket, &["reload"]);
    assert_eq!(code, 0, "{said}\n{}", relay.log());
    assert!(said.contains("added: added"), "{said}");
    let rx = t.receiver("239.2.2.4:6000", 500, &[]);
    t.send("239.1.1.3:5000", &["--count", "500", "--rate", "10000"]);
    let out = finish(rx);
    assert_eq!(field(&out, "valid"), 500, "{out}\n{}", relay.log());
    let (_, status) = ctl(&socket, &["status"]);
    assert!(!status.contains("degraded"), "{status}");
    assert!(
        relay.log().contains("privileged helper restarted"),
        "{}",
        relay.log()
    );
}

#[test]
fn root_start_helper_comes_back_with_its_privileges() {
    let Some(t) = Topology::new() else { return };
    prepare(&t);
    let relay = t.relay(&config(&t, Some("nobody"), ""), &[]);
    helper_comes_back_privileged(&t, &relay, "65534");
    relay.stop();
}

#[test]
fn ambient_start_helper_comes_back_with_its_privileges() {
    let Some(t) = Topology::new() else { return };
    prepare(&t);
    let relay = t.relay_with(
        &config(&t, None, ""),
        &[],
        &[
            &AMBIENT_START[..],
            &[
                "--bounding-set=-all,+net_admin,+net_raw,+net_bind_service,+bpf",
                "--no-new-privs",
            ],
        ]
        .concat(),
        &[],
    );
    helper_comes_back_privileged(&t, &relay, "65534");
    relay.stop();
}

/// `systemctl kill -s HUP` and `-s INT` signal the whole cgroup: daemon,
/// zygote and helper. HUP reloads and kills nothing; INT stops the daemon
/// cleanly and the zygote and helper go with it.
#[test]
fn cgroup_wide_hup_and_int_are_survived_and_followed() {
    let Some(t) = Topology::new() else { return };
    prepare(&t);
    let mut relay = t.relay(&config(&t, Some("nobody"), ""), &[]);
    let daemon = relay.child.id();
    let (zygote, helper) = zygote_and_helper(daemon);
    let all = |signal: &str| {
        for pid in [daemon, zygote, helper] {
            sh(&["kill", signal, &pid.to_string()]);
        }
    };
    all("-HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    // The daemon's "reloaded" (`...reload: reloaded`), not the helper's
    // "configuration reloaded", which may come first.
    while !relay.log().contains(": reloaded") {
        assert!(Instant::now() < deadline, "no reload:\n{}", relay.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    // A reload that needs the helper works: it is the same, alive one.
    let path = t.dir.join("mcrelay.toml");
    let text = fs::read_to_string(&path).expect("config");
    fs::write(&path, format!("{text}{ADDED}")).expect("rewrite config");
    let (code, said) = ctl(&t.dir.join("run/control.sock"), &["reload"]);
    assert_eq!(code, 0, "{said}\n{}", relay.log());
    assert!(alive(zygote) && alive(helper), "{}", relay.log());
    assert_eq!(
        zygote_and_helper(daemon),
        (zygote, helper),
        "nothing restarted"
    );
    assert!(
        !relay.log().contains("privileged helper exited"),
        "{}",
        relay.log()
    );

    all("-INT");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = relay.child.try_wait().expect("wait") {
            break s;
        }
        assert!(Instant::now() < deadline, "SIGINT did not stop mcrelayd");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "{status}:\n{}", relay.log());
    while alive(zygote) || alive(helper) {
        assert!(
            Instant::now() < deadline,
            "the zygote or helper outlived the daemon"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A helper that stops answering (SIGSTOP, never continued) is replaced
/// through the zygote as a dead one is, and the flow a reload added while
/// it was stuck (its open failed: the helper timed out) is retried once a
/// helper answers: within a bounded time it relays and the daemon is not
/// degraded, with no restart. The stuck helper is ended, not left behind.
#[test]
fn a_stalled_helper_is_replaced_and_failed_opens_are_retried() {
    let Some(t) = Topology::new() else { return };
    prepare(&t);
    let relay = t.relay(&config(&t, Some("nobody"), ""), &[]);
    let socket = t.dir.join("run/control.sock");
    let daemon = relay.child.id();
    let (zygote, helper) = zygote_and_helper(daemon);
    wait_flow(&socket, "steady", "running", |s, _| s.is_running());

    sh(&["kill", "-STOP", &helper.to_string()]);
    let path = t.dir.join("mcrelay.toml");
    let text = fs::read_to_string(&path).expect("config");
    fs::write(&path, format!("{text}{ADDED}")).expect("rewrite config");
    let stopped = Instant::now();
    // The reload waits for the stuck helper (its bounded timeout) and
    // reports the added flow as not started; what it says is not the test.
    let (_, said) = ctl(&socket, &["reload"]);

    // Bounded: the helper's 10 s timeout, then a tick or two to replace it
    // and retry, with room for a loaded machine.
    let deadline = stopped + Duration::from_secs(40);
    loop {
        let s = snapshot(&socket);
        let added = s.flow("added").map(|f| f.state.clone());
        let (_, status) = ctl(&socket, &["status"]);
        if added.as_ref().is_some_and(FlowState::is_running) && !status.contains("degraded") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "40 s after the helper stopped: flow added {added:?}, status {status}\n\
             reload said: {said}\n{}",
            relay.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let rx = t.receiver("239.2.2.4:6000", 500, &[]);
    t.send("239.1.1.3:5000", &["--count", "500", "--rate", "10000"]);
    let out = finish(rx);
    assert_eq!(field(&out, "valid"), 500, "{out}\n{}", relay.log());

    // The stuck helper was ended; one new helper, as privileged, serves.
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(helper) {
        assert!(
            Instant::now() < deadline,
            "the stopped helper {helper} is still there:\n{}",
            relay.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let [new] = children(zygote)[..] else {
        panic!("zygote's children: {:?}", children(zygote));
    };
    assert_ne!(new, helper);
    assert_eq!(caps(new, "CapEff"), NET_CAPS);
    relay.stop();
}
