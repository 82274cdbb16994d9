//! Start-up failures reach the operator as one line naming the step that
//! failed and its cause (`mcrelayd: step: cause`), now that the modules
//! below `main` return typed errors instead of anyhow's.
//! No packets are sent: the daemon stops before any flow opens.

mod common;

use std::fs;
use std::net::TcpListener;
use std::process::Command;

use common::{MCRELAYD, is_root};

/// Start the daemon on `daemon_toml` plus one flow on loopback; its
/// failure's stderr.
fn start_fails(name: &str, daemon_toml: &str) -> String {
    let dir = std::env::temp_dir().join(format!(
        "mcrelay-start-errors-{name}-{}",
        std::process::id()
    ));
    fs::create_dir_all(&dir).expect("dir");
    let config = dir.join("mcrelay.toml");
    fs::write(
        &config,
        format!(
            "[daemon]\ncores = [0]\ncontrol_socket = \"{}\"\n{daemon_toml}\n\
             [[flow]]\nname = \"f\"\ninput = {{ interface = \"lo\", address = \"239.9.9.9\", port = 5000 }}\n\
             outputs = [{{ interface = \"lo\", address = \"239.9.9.10\", port = 5000 }}]\n",
            dir.join("ctl.sock").display()
        ),
    )
    .expect("config");
    let out = Command::new(MCRELAYD)
        .arg("--config")
        .arg(&config)
        .output()
        .expect("mcrelayd");
    let _ = fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "started anyway:\n{stderr}");
    stderr
}

#[test]
fn a_taken_metrics_port_is_named_with_its_cause() {
    // Held for the whole test: the daemon's bind must fail.
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr");
    let user = if is_root() { "user = \"nobody\"\n" } else { "" };
    let stderr = start_fails("metrics", &format!("{user}metrics_listen = \"{addr}\""));
    let want = format!("mcrelayd: binding the metrics endpoint {addr}: ");
    assert!(
        stderr.contains(&want) && stderr.to_lowercase().contains("in use"),
        "want {want:?} and the cause (address in use) in:\n{stderr}"
    );
}

#[test]
fn a_missing_service_user_is_named_with_the_fix() {
    if !is_root() {
        eprintln!("skipped: needs root (only a root start switches to daemon.user)");
        return;
    }
    let stderr = start_fails("user", "user = \"mcrelay-no-such-user-15\"");
    assert!(
        stderr.contains(
            "mcrelayd: daemon.user \"mcrelay-no-such-user-15\": started as root, mcrelayd switches \
             to this user; create it (systemd-sysusers deploy/mcrelay.sysusers) or name another: "
        ),
        "{stderr}"
    );
}
