//! deploy/keepalived/mcrelay-keepalived as root against a hostile service
//! user (issue 27, item 1). keepalived runs the script as root; the old
//! script wrote `$state.tmp` and opened `$state.lock` in /run/mcrelay, which
//! the service user owns, so a symlink planted there made root overwrite a
//! root-owned file and create one at a path of the attacker's choosing.
//!
//! These tests run the shipped script with a stand-in `mcrelayctl` (a shell
//! script recording its arguments) — no daemon, no keepalived, no network —
//! and check that root's state stays where only root can write, that no
//! link is ever followed, and that the mode is still applied. Root only
//! (the attack is root writing through a link the service user planted);
//! they skip with a message otherwise.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::is_root;

/// The service user of the tests (as in the namespace tests).
const SERVICE_USER: &str = "nobody";

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/keepalived/mcrelay-keepalived")
}

/// A scratch directory owned by root, 0755, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("mcrelay-ka-script-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir(&dir).expect("scratch dir");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod");
        // A stand-in mcrelayctl: records each call, answers `status` with
        // the mode in `ctl.mode` (standby when missing).
        let ctl = dir.join("ctl");
        fs::write(
            &ctl,
            format!(
                "#!/bin/sh\n\
                 echo \"$*\" >>'{dir}/ctl.calls'\n\
                 for last; do :; done\n\
                 if [ \"$last\" = status ]; then\n\
                 \x20   echo \"mode:     $(cat '{dir}/ctl.mode' 2>/dev/null || echo standby)\"\n\
                 fi\n\
                 exit 0\n",
                dir = dir.display()
            ),
        )
        .expect("ctl");
        fs::set_permissions(&ctl, fs::Permissions::from_mode(0o755)).expect("chmod");
        Scratch(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// Run the script with `--state STATE` and `args`; its stderr.
    fn run(&self, state: &Path, args: &[&str]) -> String {
        let out = Command::new("sh")
            .arg(script())
            .arg("--socket")
            .arg(self.path("control.sock"))
            .arg("--state")
            .arg(state)
            .arg("--mcrelayctl")
            .arg(self.path("ctl"))
            .args(args)
            .output()
            .expect("run the script");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success(),
            "script {args:?} failed: {}\n{stderr}",
            out.status
        );
        stderr
    }

    fn calls(&self) -> String {
        fs::read_to_string(self.path("ctl.calls")).unwrap_or_default()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Run `f` as the service user (what a compromised daemon can do), through
/// setpriv; the test process itself stays root.
fn as_service_user(args: &[&str]) {
    let status = Command::new("setpriv")
        .args([
            "--reuid",
            SERVICE_USER,
            "--regid",
            "nogroup",
            "--clear-groups",
            "--",
        ])
        .args(args)
        .status()
        .expect("setpriv (util-linux)");
    assert!(status.success(), "as {SERVICE_USER}: {args:?}: {status}");
}

fn skip_unless_root() -> bool {
    if is_root() {
        return false;
    }
    eprintln!(
        "SKIPPED: the keepalived script's link attack needs root (the script runs as root under keepalived); CI runs it as root"
    );
    true
}

#[test]
fn links_the_service_user_plants_in_its_directory_never_make_root_write() {
    if skip_unless_root() {
        return;
    }
    let s = Scratch::new("attack");
    // The service user's directory (as /run/mcrelay), the old script's
    // state path in it, and what the attacker wants root to write.
    let svc = s.path("svc");
    fs::create_dir(&svc).expect("svc dir");
    fs::set_permissions(&svc, fs::Permissions::from_mode(0o750)).expect("chmod");
    sh_chown(SERVICE_USER, &svc);
    let victim = s.path("victim");
    fs::write(&victim, "root's secret\n").expect("victim");
    fs::set_permissions(&victim, fs::Permissions::from_mode(0o600)).expect("chmod");
    let created = s.path("created-by-root");
    let state = svc.join("keepalived.mode");
    let victim_s = victim.display().to_string();
    let created_s = created.display().to_string();
    for (target, link) in [
        (&victim_s, "keepalived.mode.tmp"),
        (&created_s, "keepalived.mode.lock"),
        (&victim_s, "keepalived.mode"),
    ] {
        let link = svc.join(link).display().to_string();
        as_service_user(&["ln", "-s", target, &link]);
    }

    let mut stderrs = Vec::new();
    for args in [
        &["notify", "INSTANCE", "mcrelay", "BACKUP"][..],
        &["notify", "INSTANCE", "mcrelay", "MASTER"][..],
        &["check"][..],
    ] {
        stderrs.push((args, s.run(&state, args)));
    }
    assert_eq!(
        fs::read_to_string(&victim).expect("victim"),
        "root's secret\n",
        "root overwrote a file through a link the service user planted"
    );
    assert!(
        fs::symlink_metadata(&created).is_err(),
        "root created {} through a planted link",
        created.display()
    );
    for (args, stderr) in stderrs {
        assert!(
            stderr.contains("keeping no state: refusing"),
            "{args:?}: the service user's directory must be refused:\n{stderr}"
        );
    }
    // The links are still the attacker's, untouched; nothing else appeared.
    let mut names: Vec<String> = fs::read_dir(&svc)
        .expect("svc")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "keepalived.mode",
            "keepalived.mode.lock",
            "keepalived.mode.tmp"
        ]
    );
    // The mode was still applied, statelessly.
    let calls = s.calls();
    assert!(calls.contains(" standby\n"), "{calls}");
    assert!(calls.contains(" active\n"), "{calls}");
}

#[test]
fn the_state_lives_in_a_root_only_directory_and_is_put_back() {
    if skip_unless_root() {
        return;
    }
    let s = Scratch::new("state");
    let dir = s.path("state");
    let state = dir.join("mode");
    s.run(&state, &["notify", "INSTANCE", "mcrelay", "MASTER"]);
    let meta = fs::symlink_metadata(&dir).expect("state dir created");
    assert!(meta.is_dir());
    assert_eq!(meta.uid(), 0, "owned by root");
    assert_eq!(meta.mode() & 0o777, 0o700, "only root may enter it");
    assert_eq!(fs::read_to_string(&state).expect("state"), "active\n");
    // No lock file, no temporary left behind.
    let names: Vec<String> = fs::read_dir(&dir)
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["mode"]);
    // A daemon that disagrees (the stand-in says standby): check puts the
    // wanted mode back.
    let before = s.calls().lines().count();
    s.run(&state, &["check"]);
    let calls = s.calls();
    let after: Vec<&str> = calls.lines().skip(before).collect();
    assert!(
        after.iter().any(|c| c.ends_with(" status"))
            && after.last().is_some_and(|c| c.ends_with(" active")),
        "check must restore active: {after:?}"
    );
    // A daemon that agrees: check only asks.
    fs::write(s.path("ctl.mode"), "active\n").expect("ctl.mode");
    let before = s.calls().lines().count();
    s.run(&state, &["check"]);
    let calls = s.calls();
    let after: Vec<&str> = calls.lines().skip(before).collect();
    assert_eq!(after.len(), 1, "{after:?}");
    // Standing down replaces the file (rename), never writes through it.
    s.run(&state, &["notify", "INSTANCE", "mcrelay", "BACKUP"]);
    assert_eq!(fs::read_to_string(&state).expect("state"), "standby\n");
}

#[test]
fn a_state_directory_that_is_a_link_or_open_to_others_is_refused() {
    if skip_unless_root() {
        return;
    }
    let s = Scratch::new("refuse");
    // A link to a root-only directory: refused even though its target
    // would pass (whoever could write the link's directory could point it
    // elsewhere).
    let real = s.path("real");
    fs::create_dir(&real).expect("real");
    fs::set_permissions(&real, fs::Permissions::from_mode(0o700)).expect("chmod");
    let link = s.path("link");
    symlink(&real, &link).expect("symlink");
    let stderr = s.run(&link.join("mode"), &["notify", "INSTANCE", "x", "MASTER"]);
    assert!(stderr.contains("keeping no state: refusing"), "{stderr}");
    assert!(fs::read_dir(&real).expect("real").next().is_none());
    // Group-writable, though root's.
    let open = s.path("open");
    fs::create_dir(&open).expect("open");
    fs::set_permissions(&open, fs::Permissions::from_mode(0o770)).expect("chmod");
    let stderr = s.run(&open.join("mode"), &["notify", "INSTANCE", "x", "MASTER"]);
    assert!(stderr.contains("writable by others"), "{stderr}");
    assert!(fs::read_dir(&open).expect("open").next().is_none());
    // In a parent the service user owns (it could swap the directory).
    let parent = s.path("theirs");
    fs::create_dir(&parent).expect("theirs");
    sh_chown(SERVICE_USER, &parent);
    let stderr = s.run(
        &parent.join("state").join("mode"),
        &["notify", "INSTANCE", "x", "MASTER"],
    );
    assert!(stderr.contains("belongs to uid"), "{stderr}");
    assert!(fs::read_dir(&parent).expect("theirs").next().is_none());
}

fn sh_chown(user: &str, path: &Path) {
    let status = Command::new("chown")
        .arg(user)
        .arg(path)
        .status()
        .expect("chown");
    assert!(status.success());
}
