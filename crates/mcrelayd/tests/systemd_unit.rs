//! The systemd integration files in `deploy/`: the unit, the sysusers.d and
//! the tmpfiles.d fragments.
//!
//! - The unit's hardening promises, read straight from the file (no tools).
//! - `systemd-analyze verify` accepts the unit with no complaint about it
//!   (it exits 0 even for unknown keys, so its stderr is checked too).
//! - The effective system call filter, expanded with
//!   `systemd-analyze syscall-filter`, allows every call the daemon makes
//!   and denies the privileged ones.
//! - `systemd-sysusers --root` and `systemd-tmpfiles --create --root` apply
//!   the fragments to a scratch root, and the result is checked.
//!
//! Without `systemd-analyze` the tool-based tests print `SKIPPED: ...`,
//! unless `CI` is set: then they fail and say what to install (`.ci/run`
//! installs it).

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const UNIT_NAME: &str = "mcrelay.service";

/// The capabilities the unit grants, and only these (see the comments in
/// the unit for why each is needed).
const CAPABILITIES: [&str; 4] = [
    "CAP_NET_RAW",
    "CAP_NET_ADMIN",
    "CAP_NET_BIND_SERVICE",
    "CAP_BPF",
];

/// Known-harmless `systemd-analyze verify` messages about the unit itself.
/// None so far: add a substring here, with the reason, if a systemd version
/// prints a warning that does not indicate a problem in the unit.
const HARMLESS_VERIFY_MESSAGES: &[&str] = &[];

fn deploy(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(name)
}

fn read_deploy(name: &str) -> String {
    let path = deploy(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

// ---------------------------------------------------------------------------
// Unit file parsing
// ---------------------------------------------------------------------------

/// Every `Key=value` assignment of a unit file, by section, in file order
/// (a key may be assigned several times, e.g. `SystemCallFilter=`).
#[derive(Debug, Default)]
struct Unit {
    sections: BTreeMap<String, Vec<(String, String)>>,
}

impl Unit {
    fn parse(text: &str) -> Unit {
        let mut unit = Unit::default();
        let mut section = String::new();
        let mut pending = String::new();
        for (n, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if pending.is_empty() && (line.is_empty() || line.starts_with(['#', ';'])) {
                continue;
            }
            if pending.is_empty() && line.starts_with('[') {
                assert!(line.ends_with(']'), "line {}: bad section header", n + 1);
                section = line[1..line.len() - 1].to_string();
                continue;
            }
            // A trailing backslash continues the value on the next line.
            if let Some(head) = line.strip_suffix('\\') {
                pending.push_str(head);
                pending.push(' ');
                continue;
            }
            pending.push_str(line);
            let full = std::mem::take(&mut pending);
            let (key, value) = full
                .split_once('=')
                .unwrap_or_else(|| panic!("line {}: not Key=value: {raw}", n + 1));
            assert!(
                !section.is_empty(),
                "line {}: assignment before a section",
                n + 1
            );
            unit.sections
                .entry(section.clone())
                .or_default()
                .push((key.trim().to_string(), value.trim().to_string()));
        }
        assert!(pending.is_empty(), "unit ends inside a continued line");
        unit
    }

    /// Every value assigned to `key` in `section`, in order.
    fn all(&self, section: &str, key: &str) -> Vec<&str> {
        self.sections
            .get(section)
            .map(|entries| {
                entries
                    .iter()
                    .filter(|(k, _)| k == key)
                    .map(|(_, v)| v.as_str())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The one value of `key` in `section`; fails if it is missing or set
    /// more than once.
    fn one(&self, section: &str, key: &str) -> &str {
        match self.all(section, key).as_slice() {
            [value] => value,
            [] => panic!("[{section}] {key}= is missing from {UNIT_NAME}"),
            more => panic!(
                "[{section}] {key}= is set {} times in {UNIT_NAME}",
                more.len()
            ),
        }
    }

    /// A space-separated list setting as a set; fails on a duplicate.
    fn set(&self, section: &str, key: &str) -> BTreeSet<&str> {
        let value = self.one(section, key);
        let items: Vec<&str> = value.split_whitespace().collect();
        let set: BTreeSet<&str> = items.iter().copied().collect();
        assert_eq!(
            set.len(),
            items.len(),
            "[{section}] {key}={value} repeats an entry"
        );
        set
    }
}

fn unit() -> Unit {
    Unit::parse(&read_deploy(UNIT_NAME))
}

// ---------------------------------------------------------------------------
// Tools
// ---------------------------------------------------------------------------

/// `Some(path)` of an installed tool. `None` (after printing `SKIPPED`,
/// saying that `what` did not run) when `systemd-analyze` is missing outside
/// CI; any other missing tool, or any tool missing in CI, fails the test and
/// says what to install.
fn tool(name: &str, what: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .chain(["/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file());
    if found.is_some() {
        return found;
    }
    if name == "systemd-analyze" && std::env::var_os("CI").is_none() {
        eprintln!(
            "SKIPPED: {name} is not installed, so {what} did not run \
             (install the `systemd` package; with CI set this test fails instead)"
        );
        return None;
    }
    panic!("{name} is not installed: install the `systemd` package (apt-get install systemd)");
}

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

fn describe(cmd: &str, out: &Output) -> String {
    format!(
        "{cmd}: {}\n--- stdout ---\n{}--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A scratch directory removed when dropped.
#[derive(Debug)]
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new(name: &str) -> ScratchDir {
        let dir = std::env::temp_dir().join(format!(
            "mcrelayd-systemd-unit-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // systemd tools refuse or warn about world-writable paths; temp_dir()
        // itself is sticky, this directory is ours alone.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        ScratchDir(dir)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn running_as_root() -> bool {
    // /proc/self belongs to the process's effective uid.
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

// ---------------------------------------------------------------------------
// The unit's promises
// ---------------------------------------------------------------------------

#[test]
fn unit_keeps_its_hardening_promises() {
    let unit = unit();
    let expect = [
        ("Type", "notify"),
        ("NotifyAccess", "main"),
        ("User", "mcrelay"),
        ("Group", "mcrelay"),
        ("Restart", "on-failure"),
        ("RuntimeDirectory", "mcrelay"),
        ("RuntimeDirectoryMode", "0750"),
        ("UMask", "0007"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateDevices", "yes"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectKernelLogs", "yes"),
        ("ProtectControlGroups", "yes"),
        ("ProtectClock", "yes"),
        ("ProtectHostname", "yes"),
        ("RestrictNamespaces", "yes"),
        ("RestrictRealtime", "yes"),
        ("RestrictSUIDSGID", "yes"),
        ("LockPersonality", "yes"),
        ("MemoryDenyWriteExecute", "yes"),
        ("SystemCallArchitectures", "native"),
        ("LimitMEMLOCK", "infinity"),
        (
            "ExecStartPre",
            "/usr/bin/mcrelayd check --config /etc/mcrelay/mcrelay.toml",
        ),
        (
            "ExecStart",
            "/usr/bin/mcrelayd --config /etc/mcrelay/mcrelay.toml",
        ),
        ("ExecReload", "/usr/bin/mcrelayctl reload"),
    ];
    for (key, value) in expect {
        assert_eq!(unit.one("Service", key), value, "[Service] {key}=");
    }

    assert_eq!(
        unit.set("Service", "RestrictAddressFamilies"),
        BTreeSet::from([
            "AF_UNIX",
            "AF_INET",
            "AF_INET6",
            "AF_NETLINK",
            "AF_PACKET",
            "AF_XDP"
        ]),
        "RestrictAddressFamilies= must be exactly these families"
    );

    let watchdog = unit.one("Service", "WatchdogSec");
    assert!(
        watchdog.parse::<u32>().is_ok_and(|s| s > 0),
        "WatchdogSec={watchdog}: expected a positive number of seconds"
    );
    assert_eq!(unit.one("Install", "WantedBy"), "multi-user.target");
    assert_eq!(unit.one("Unit", "After"), "network-online.target");
    assert_eq!(unit.one("Unit", "Wants"), "network-online.target");

    let bounding = unit.set("Service", "CapabilityBoundingSet");
    let ambient = unit.set("Service", "AmbientCapabilities");
    assert_eq!(
        bounding, ambient,
        "CapabilityBoundingSet= and AmbientCapabilities= must list the same capabilities"
    );
    assert_eq!(bounding, BTreeSet::from(CAPABILITIES));
}

/// The `SystemCallFilter=` lines, evaluated the way systemd.exec(5) says:
/// the first line's kind (allow list, or `~` deny list) sets the default;
/// each later line adds to or removes from the set. Returns whether it is
/// an allow list, and the resulting entries (groups not yet expanded).
/// Seconds in a systemd time span made of plain seconds or `Ns`/`Nmin`.
fn seconds(span: &str) -> u64 {
    let (n, unit) = span.split_at(
        span.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(span.len()),
    );
    let n: u64 = n.parse().unwrap_or_else(|_| panic!("time span {span:?}"));
    match unit {
        "" | "s" => n,
        "min" => n * 60,
        _ => panic!("time span {span:?}: use seconds or min"),
    }
}

#[test]
fn a_unit_that_keeps_failing_ends_in_the_start_limit() {
    // A broken config fails ExecStartPre, and Restart=on-failure starts it
    // again after RestartSec: each attempt takes at least RestartSec, so
    // the limit trips only if Burst attempts fit in the interval. (The
    // defaults, 5 in 10 s, did not with RestartSec=2: it restarted forever.
    // deploy/nspawn/run.sh watches it end `failed` under a real systemd.)
    let unit = unit();
    assert_eq!(unit.one("Service", "Restart"), "on-failure");
    let restart = seconds(unit.one("Service", "RestartSec"));
    let interval = seconds(unit.one("Unit", "StartLimitIntervalSec"));
    let burst: u64 = unit.one("Unit", "StartLimitBurst").parse().unwrap();
    assert!(burst >= 2, "StartLimitBurst={burst} allows no restart");
    assert!(
        burst * restart < interval,
        "{burst} starts every {restart} s never fit in StartLimitIntervalSec={interval}: \
         a broken config would restart forever"
    );
}

fn syscall_filter(unit: &Unit) -> (bool, Vec<(bool, Vec<String>)>) {
    let lines = unit.all("Service", "SystemCallFilter");
    assert!(!lines.is_empty(), "SystemCallFilter= is missing");
    let mut steps = Vec::new();
    for line in lines {
        if line.is_empty() {
            steps.clear();
            continue;
        }
        let (deny, list) = match line.strip_prefix('~') {
            Some(rest) => (true, rest),
            None => (false, line),
        };
        // Deny entries may carry ":errno"; the name is what matters here.
        let names = list
            .split_whitespace()
            .map(|s| s.split(':').next().unwrap_or(s).to_string())
            .collect();
        steps.push((!deny, names));
    }
    let allow_list = steps.first().is_some_and(|(allow, _)| *allow);
    (allow_list, steps)
}

#[test]
fn unit_syscall_filter_names_io_uring() {
    let unit = unit();
    let (allow_list, steps) = syscall_filter(&unit);
    assert!(
        allow_list,
        "SystemCallFilter= must start with an allow list"
    );
    let first = &steps[0].1;
    for call in ["io_uring_setup", "io_uring_enter", "io_uring_register"] {
        assert!(
            first.iter().any(|c| c == call),
            "the SystemCallFilter= allow list must name {call} explicitly"
        );
    }
}

// ---------------------------------------------------------------------------
// systemd-analyze
// ---------------------------------------------------------------------------

/// Path as written on an Exec line: `%` escaped, quoted if it has blanks.
fn exec_path(path: &Path) -> String {
    let s = path.to_str().expect("UTF-8 path").replace('%', "%%");
    if s.contains(char::is_whitespace) {
        format!("\"{s}\"")
    } else {
        s
    }
}

#[test]
fn unit_passes_systemd_analyze_verify() {
    let Some(analyze) = tool("systemd-analyze", "systemd-analyze verify") else {
        return;
    };
    // verify checks that every Exec binary exists: point them at real ones,
    // changing nothing else. mcrelayctl may not be built yet; /bin/true
    // stands in for it.
    let mcrelayd = exec_path(Path::new(env!("CARGO_BIN_EXE_mcrelayd")));
    let stand_in = ["/bin/true", "/usr/bin/true"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .expect("/bin/true or /usr/bin/true");
    let text = read_deploy(UNIT_NAME)
        .replace("/usr/bin/mcrelayctl", stand_in)
        .replace("/usr/bin/mcrelayd", &mcrelayd);
    assert!(
        !text.contains("/usr/bin/mcrelay"),
        "an Exec path was not replaced"
    );

    let dir = ScratchDir::new("verify");
    let copy = dir.0.join(UNIT_NAME);
    std::fs::write(&copy, &text).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o644)).unwrap();

    let out = run(Command::new(&analyze)
        .arg("verify")
        .arg("--man=no")
        .arg(&copy)
        .env("SYSTEMD_LOG_COLOR", "0"));
    let report = describe("systemd-analyze verify --man=no", &out);
    assert!(out.status.success(), "{report}");

    // verify exits 0 even for unknown keys and unparsable values: it only
    // logs them. Any message about our unit is a failure.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let complaints: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains(UNIT_NAME) || l.contains(copy.to_str().unwrap()))
        .filter(|l| !HARMLESS_VERIFY_MESSAGES.iter().any(|h| l.contains(h)))
        .collect();
    assert!(
        complaints.is_empty(),
        "systemd-analyze verify complained about {UNIT_NAME}:\n{}\n\n{report}",
        complaints.join("\n")
    );
}

/// The system calls of a `systemd-analyze syscall-filter` group, nested
/// groups expanded.
fn expand_group(
    analyze: &Path,
    group: &str,
    cache: &mut BTreeMap<String, BTreeSet<String>>,
) -> BTreeSet<String> {
    if let Some(calls) = cache.get(group) {
        return calls.clone();
    }
    let out = run(Command::new(analyze).args(["syscall-filter", "--no-pager", group]));
    assert!(
        out.status.success(),
        "{}",
        describe(&format!("systemd-analyze syscall-filter {group}"), &out)
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut calls = BTreeSet::new();
    // Line 1 is the group's own name; then "# description" and one entry
    // per line, each a system call or a nested @group.
    for entry in stdout.lines().skip(1).map(str::trim) {
        if entry.is_empty() || entry.starts_with('#') {
            continue;
        }
        if entry.starts_with('@') {
            calls.extend(expand_group(analyze, entry, cache));
        } else {
            calls.insert(entry.to_string());
        }
    }
    assert!(!calls.is_empty(), "{group} expanded to nothing:\n{stdout}");
    cache.insert(group.to_string(), calls.clone());
    calls
}

#[test]
fn syscall_filter_allows_what_the_daemon_needs() {
    let Some(analyze) = tool("systemd-analyze", "the system call filter check") else {
        return;
    };
    let unit = unit();
    let (allow_list, steps) = syscall_filter(&unit);
    assert!(
        allow_list,
        "SystemCallFilter= must start with an allow list"
    );

    let mut cache = BTreeMap::new();
    let mut allowed = BTreeSet::new();
    for (allow, names) in steps {
        for name in names {
            let calls = if name.starts_with('@') {
                expand_group(&analyze, &name, &mut cache)
            } else {
                BTreeSet::from([name])
            };
            for call in calls {
                if allow {
                    allowed.insert(call);
                } else {
                    allowed.remove(&call);
                }
            }
        }
    }

    let needed = [
        ("io_uring_setup", "the data plane's rings"),
        ("io_uring_enter", "the data plane's rings"),
        ("io_uring_register", "provided buffers, registered files"),
        ("capset", "the relaying process drops its capabilities"),
        ("capget", "reading the capability sets"),
        ("prctl", "PR_CAP_AMBIENT_CLEAR_ALL, PR_SET_PDEATHSIG"),
        ("sched_setaffinity", "pinning each worker to its core"),
        ("sched_getaffinity", "finding the allowed CPUs"),
        ("set_mempolicy", "NUMA-local buffer pools"),
        ("mbind", "NUMA-local buffer pools"),
        ("execve", "starting the helper program"),
        ("clone", "threads and the helper process"),
        ("clone3", "threads and the helper process"),
        ("wait4", "reaping the helper"),
        ("close_range", "the helper closes inherited fds"),
        ("socket", "ingress and egress sockets"),
        ("socketpair", "the helper channel"),
        ("bind", "ingress sockets, the control socket"),
        ("setsockopt", "group joins, buffer sizes"),
        ("sendmsg", "SCM_RIGHTS, sd_notify"),
        ("recvmsg", "SCM_RIGHTS"),
        ("sendmmsg", "batched egress fallback"),
        ("recvmmsg", "batched ingress fallback"),
        ("ioctl", "interface lookups"),
        ("mmap", "buffer pools, rings"),
        ("madvise", "buffer pools"),
        ("mlock", "locking pool memory"),
        ("epoll_wait", "the control socket's event loop"),
        ("eventfd2", "waking workers"),
        ("umask", "control socket mode"),
        ("bpf", "the helper's ingress = \"xdp\" program"),
    ];
    let missing: Vec<String> = needed
        .iter()
        .filter(|(call, _)| !allowed.contains(*call))
        .map(|(call, why)| format!("{call} ({why})"))
        .collect();
    assert!(
        missing.is_empty(),
        "SystemCallFilter= denies calls the daemon needs: {}",
        missing.join(", ")
    );

    let forbidden = [
        "setuid",
        "setreuid",
        "setresuid",
        "setgroups",
        "chown",
        "chroot",
        "pivot_root",
        "mount",
        "init_module",
        "reboot",
        "swapon",
        "settimeofday",
        "ptrace",
        "kexec_load",
        "acct",
    ];
    let leaked: Vec<&str> = forbidden
        .into_iter()
        .filter(|call| allowed.contains(*call))
        .collect();
    assert!(
        leaked.is_empty(),
        "SystemCallFilter= allows privileged calls: {}",
        leaked.join(", ")
    );
}

// ---------------------------------------------------------------------------
// sysusers.d and tmpfiles.d
// ---------------------------------------------------------------------------

/// Applies the sysusers fragment to `root` (creating `root/etc/passwd` and
/// friends) and returns mcrelay's uid and gid there.
fn apply_sysusers(root: &Path) -> (u32, u32) {
    let sysusers = tool("systemd-sysusers", "").expect("systemd-sysusers");
    let fragment = deploy("mcrelay.sysusers");

    let out = run(Command::new(&sysusers)
        .arg("--dry-run")
        .arg(format!("--root={}", root.display()))
        .arg(&fragment));
    let report = describe("systemd-sysusers --dry-run", &out);
    assert!(out.status.success(), "{report}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Creating user 'mcrelay'"),
        "dry run does not create user mcrelay:\n{report}"
    );

    std::fs::create_dir_all(root.join("etc")).unwrap();
    let out = run(Command::new(&sysusers)
        .arg(format!("--root={}", root.display()))
        .arg(&fragment));
    let report = describe("systemd-sysusers --root", &out);
    assert!(out.status.success(), "{report}");

    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
    let fields: Vec<&str> = passwd
        .lines()
        .find(|l| l.starts_with("mcrelay:"))
        .unwrap_or_else(|| panic!("no mcrelay in passwd:\n{passwd}\n{report}"))
        .split(':')
        .collect();
    assert_eq!(fields.len(), 7, "passwd line: {fields:?}");
    let uid: u32 = fields[2].parse().unwrap();
    let gid: u32 = fields[3].parse().unwrap();
    assert!(
        uid > 0 && uid < 1000,
        "mcrelay must be a system user, got uid {uid}"
    );
    assert_eq!(fields[5], "/nonexistent", "home directory");
    assert!(fields[6].ends_with("nologin"), "login shell: {}", fields[6]);

    let group = std::fs::read_to_string(root.join("etc/group")).unwrap();
    assert!(
        group
            .lines()
            .any(|l| l.starts_with(&format!("mcrelay:x:{gid}:"))),
        "no group mcrelay with gid {gid}:\n{group}"
    );
    (uid, gid)
}

#[test]
fn sysusers_fragment_creates_the_system_user() {
    // systemd-analyze stands for "systemd is installed" in the skip rule.
    if tool("systemd-analyze", "the sysusers.d check").is_none() {
        return;
    }
    let dir = ScratchDir::new("sysusers");
    apply_sysusers(&dir.0);
}

#[test]
fn tmpfiles_fragment_creates_the_directories() {
    if tool("systemd-analyze", "the tmpfiles.d check").is_none() {
        return;
    }
    let tmpfiles = tool("systemd-tmpfiles", "").expect("systemd-tmpfiles");
    // This systemd-tmpfiles may have no --dry-run (systemd < 256), so apply
    // the fragment for real, to a scratch root whose /etc/passwd (from the
    // sysusers fragment) resolves "mcrelay".
    let dir = ScratchDir::new("tmpfiles");
    let (uid, gid) = apply_sysusers(&dir.0);
    let root = running_as_root();

    let out = run(Command::new(&tmpfiles)
        .arg("--create")
        .arg(format!("--root={}", dir.0.display()))
        .arg(deploy("mcrelay.tmpfiles")));
    let report = describe("systemd-tmpfiles --create --root", &out);
    if root {
        assert!(out.status.success(), "{report}");
        assert!(out.stderr.is_empty(), "{report}");
    } else {
        // Without root only the chown fails; everything else must work.
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr
                .lines()
                .all(|l| l.contains("fchownat()") && l.contains("Operation not permitted")),
            "{report}"
        );
        eprintln!("SKIPPED: ownership checks of the tmpfiles fragment (need root)");
    }

    for (path, mode, owner) in [
        ("run/mcrelay", 0o750, (uid, gid)),
        ("etc/mcrelay", 0o755, (0, 0)),
    ] {
        let meta = std::fs::metadata(dir.0.join(path))
            .unwrap_or_else(|e| panic!("/{path} was not created: {e}\n{report}"));
        assert!(meta.is_dir(), "/{path} is not a directory");
        assert_eq!(meta.mode() & 0o7777, mode, "/{path} mode");
        if root {
            assert_eq!((meta.uid(), meta.gid()), owner, "/{path} owner:group");
        }
    }
}

/// `(version, score)` from docs/security.md's sentence "`systemd-analyze
/// security --offline=yes deploy/mcrelay.service` (systemd N) rates it S".
fn documented_security_score() -> (String, String) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/security.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let doc = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    let after = doc
        .split_once("`systemd-analyze security --offline=yes deploy/mcrelay.service` (systemd ")
        .unwrap_or_else(|| {
            panic!(
                "{}: the systemd-analyze security sentence is gone",
                path.display()
            )
        })
        .1;
    let (version, rest) = after.split_once(')').unwrap();
    let score = rest
        .strip_prefix(" rates it ")
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("{}: no \"rates it <score>\"", path.display()));
    (version.to_owned(), score.to_owned())
}

#[test]
fn security_doc_quotes_the_real_exposure_score() {
    let Some(analyze) = tool("systemd-analyze", "the exposure score check") else {
        return;
    };
    let (doc_version, doc_score) = documented_security_score();
    let version = run(Command::new(&analyze).arg("--version"));
    let version = String::from_utf8_lossy(&version.stdout);
    let version = version
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    if version != doc_version {
        // Scores move between systemd releases (new checks, new weights).
        eprintln!(
            "SKIPPED: docs/security.md quotes systemd {doc_version}'s score; this is {version}"
        );
        return;
    }
    let out = run(Command::new(&analyze)
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(deploy(UNIT_NAME)));
    let text = String::from_utf8_lossy(&out.stdout);
    let score = text
        .lines()
        .find_map(|l| l.split_once("Overall exposure level for mcrelay.service: "))
        .and_then(|(_, s)| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("{}", describe("systemd-analyze security", &out)));
    assert_eq!(
        score, doc_score,
        "systemd-analyze security rates deploy/{UNIT_NAME} {score}; docs/security.md says {doc_score}: update the doc"
    );
}
