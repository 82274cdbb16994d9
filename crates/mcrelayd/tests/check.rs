//! `mcrelayd check` end to end: the shipped example passes, a broken file
//! fails with every error, each with file:line:column.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn mcrelayd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mcrelayd"))
        .args(args)
        .output()
        .expect("run mcrelayd")
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/mcrelay.toml")
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    // Under target/, which cargo cleans, not /tmp.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("mcrelayd-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn example_config_passes_check() {
    // --offline: the example names eth0..eth2 and the mcrelay user, which a
    // build machine needn't have.
    let out = mcrelayd(&[
        "check",
        "--offline",
        "--config",
        example().to_str().unwrap(),
    ]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout,
        "ok: 3 flows, 5 outputs, cores: all CPUs in the affinity mask, pool memory 5.1 MiB per core \
         (1000 small, 500 standard, 200 jumbo); stream health on 2 flows (1 rtp, 1 mpegts); \
         redundancy on 1 flow (1 merge, 0 failover)\n"
    );
    assert!(out.stderr.is_empty());
}

#[test]
fn broken_config_fails_with_every_error() {
    let path = temp_file(
        "broken.toml",
        r#"[daemon]
log_level = "loud"

[pools]
small = 0

[[flow]]
name = "camera-1"
input = { interface = "eth0", adress = "239.1.1.1", address = "239.1.1.300", port = 5000 }
outputs = [{ interface = "eth1", address = "239.2.2.2", port = 6000, ttl = 0 }]
"#,
    );
    let p = path.display();
    let out = mcrelayd(&["check", "--config", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8(out.stderr).unwrap();
    let expected = format!(
        "{p}:2:13: daemon.log_level \"loud\" is not valid; use one of: error, warn, info, debug, trace\n\
         {p}:5:9: pools.small 0 is not allowed; use at least 1\n\
         {p}:9:31: flow \"camera-1\": unknown key \"adress\" in input (expected one of: interface, address, port, source, ingress, receive_buffer_bytes, fec, protocol, buffer_ms)\n\
         {p}:9:63: flow \"camera-1\": input.address 239.1.1.300 is not an IP address\n\
         {p}:10:76: flow \"camera-1\": outputs[0].ttl 0 is out of range; use 1-255\n\
         mcrelayd: {p} has 5 errors; nothing was changed\n"
    );
    assert_eq!(stderr, expected);
}

#[test]
fn syntax_error_and_missing_file() {
    let path = temp_file("syntax.toml", "[daemon\n");
    let out = mcrelayd(&["check", "--config", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.starts_with(&format!("{}:1:8: TOML syntax error: ", path.display())),
        "{stderr}"
    );

    let out = mcrelayd(&["check", "--config", "/nonexistent/mcrelay.toml"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.starts_with("/nonexistent/mcrelay.toml: cannot read: "),
        "{stderr}"
    );
}

#[test]
fn empty_config_is_valid_but_noted() {
    let path = temp_file("empty.toml", "# nothing yet\n");
    let out = mcrelayd(&["check", "--offline", "--config", path.to_str().unwrap()]);
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.starts_with("ok: 0 flows (the daemon will idle until a reload adds one), 0 outputs, cores: all CPUs in the affinity mask, "), "{stdout}");
}

/// Issue 27: what the daemon refuses at start, `check` refuses on the host
/// (and `--offline` skips).
#[test]
fn host_limits_are_checked_unless_offline() {
    let path = temp_file(
        "host.toml",
        "[daemon]\nuser = \"mcrelay-no-such-user-27\"\ncores = [0, 8191]\n\
         [[flow]]\nname = \"f\"\ninput = { interface = \"lo\", address = \"239.1.1.1\", port = 5000 }\n\
         outputs = [{ interface = \"nosuchif27\", address = \"239.2.2.2\", port = 5000 },\
          { interface = \"lo\", address = \"127.0.0.1\", port = 5000 }]\n",
    );
    let p = path.display();
    let out = mcrelayd(&["check", "--config", path.to_str().unwrap()]);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for want in [
        format!("{p}: warning: interface \"nosuchif27\" (flow \"f\") does not exist on this host"),
        format!("{p}: daemon.cores: "),
        format!("{p}: daemon.user \"mcrelay-no-such-user-27\" does not exist on this host"),
        format!(
            "{p}: flow \"f\": outputs[1] (lo 127.0.0.1:5000) sends to this host's own address at port 5000"
        ),
    ] {
        assert!(stderr.contains(&want), "want {want:?} in:\n{stderr}");
    }
    let out = mcrelayd(&["check", "--offline", "--config", path.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_reported_storm_and_start_failure_configs_fail_check() {
    for (name, flow, want) in [
        (
            "mapped",
            "input = { interface = \"lo\", address = \"239.1.1.1\", port = 5000 }\n\
             outputs = [{ interface = \"lo\", address = \"::ffff:239.1.1.1\", port = 5000 }]",
            "which would loop",
        ),
        (
            "unicast",
            "input = { interface = \"lo\", address = \"10.0.0.1\", port = 5000 }\n\
             outputs = [{ interface = \"eth9\", address = \"10.0.0.1\", port = 5000 }]",
            "which would loop",
        ),
    ] {
        let path = temp_file(
            &format!("{name}.toml"),
            &format!("[[flow]]\nname = \"x\"\n{flow}\n"),
        );
        let out = mcrelayd(&["check", "--offline", "--config", path.to_str().unwrap()]);
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(1), "{name}: {stderr}");
        assert!(stderr.contains(want), "{name}: {stderr}");
    }
    let long = "n".repeat(1020);
    let path = temp_file(
        "long.toml",
        &format!(
            "[[flow]]\nname = \"{long}\"\ninput = {{ interface = \"lo\", address = \"239.1.1.1\", port = 5000 }}\n\
             outputs = [{{ interface = \"lo\", address = \"239.1.1.2\", port = 5000 }}]\n"
        ),
    );
    let out = mcrelayd(&["check", "--offline", "--config", path.to_str().unwrap()]);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("the limit is 255"), "{stderr}");
}
