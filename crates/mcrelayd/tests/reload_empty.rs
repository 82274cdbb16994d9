//! A reload must not stop every flow by accident (issue 13, item 4): a
//! config file read while `cp` rewrote it was empty, an empty file is a
//! valid config, and the reload removed every flow. Now a file with no
//! flows is refused while flows are configured — on SIGHUP always, over
//! the control socket unless the client asks for it (`mcrelayctl reload
//! --allow-empty`) — and the refusal says how to do it on purpose.

mod common;

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{Topology, ctl, field, finish, sh};
use mcrelay_control::Snapshot;

fn snapshot(socket: &Path) -> Snapshot {
    let (code, json) = ctl(socket, &["flows", "--json", "--sample", "0"]);
    assert_eq!(code, 0, "{json}");
    serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"))
}

/// The flows the daemon has, and whether each relays.
fn flows(socket: &Path) -> Vec<(String, bool)> {
    snapshot(socket)
        .flows
        .iter()
        .map(|f| (f.name.clone(), f.state.is_running()))
        .collect()
}

fn config(socket: &Path) -> String {
    format!(
        r#"
[daemon]
user = "nobody"
control_socket = "{}"
[[flow]]
name = "a"
input = {{ interface = "vRA", address = "239.1.1.1", port = 5000 }}
outputs = [ {{ interface = "vRB", address = "239.2.2.2", port = 6000 }} ]
[[flow]]
name = "b"
input = {{ interface = "vRA", address = "239.1.1.2", port = 5000 }}
outputs = [ {{ interface = "vRB", address = "239.2.2.3", port = 6000 }} ]
"#,
        socket.display()
    )
}

#[test]
fn an_empty_file_never_removes_every_flow_unless_asked_explicitly() {
    let Some(t) = Topology::new() else { return };
    let socket = t.dir.join("control.sock");
    let path = t.dir.join("mcrelay.toml");
    let relay = t.relay(&config(&socket), &[]);
    let both = vec![("a".to_owned(), true), ("b".to_owned(), true)];
    assert_eq!(flows(&socket), both);

    // What a reader of a half-written file sees: 0 bytes.
    fs::write(&path, "").expect("truncate config");

    // SIGHUP: refused, logged with how to do it on purpose.
    // The daemon's verdict: "reload rejected", or its own "reloaded" line
    // (`...reload: reloaded ...`), not the helper's "configuration
    // reloaded", which the helper may log first now that its parse runs
    // beside the daemon's.
    let outcomes =
        |log: &str| log.matches("reload rejected").count() + log.matches(": reloaded").count();
    let before = outcomes(&relay.log());
    sh(&["kill", "-HUP", &relay.child.id().to_string()]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while outcomes(&relay.log()) == before {
        assert!(
            Instant::now() < deadline,
            "no answer to SIGHUP:\n{}",
            relay.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = relay.log();
    assert!(log.contains("reload rejected"), "{log}");
    assert!(
        log.contains("--allow-empty") && log.contains("a SIGHUP never removes every flow"),
        "{log}"
    );
    assert_eq!(
        flows(&socket),
        both,
        "SIGHUP of an empty file kept every flow"
    );

    // `mcrelayctl reload`: refused too, exit 1, with the way out.
    let (code, said) = ctl(&socket, &["reload"]);
    assert_eq!(code, 1, "{said}");
    assert!(said.contains("rejected"), "{said}");
    assert!(said.contains("mcrelayctl reload --allow-empty"), "{said}");
    assert!(said.contains("stop all 2 configured flows"), "{said}");
    assert_eq!(
        flows(&socket),
        both,
        "reload of an empty file kept every flow"
    );

    // And the flows still relay.
    let rx = t.receiver("239.2.2.2:6000", 300, &[]);
    t.send("239.1.1.1:5000", &["--count", "300", "--rate", "5000"]);
    let out = finish(rx);
    assert_eq!(field(&out, "valid"), 300, "{out}\n{}", relay.log());

    // Asked explicitly: applied, every flow removed.
    let (code, said) = ctl(&socket, &["reload", "--allow-empty", "--json"]);
    assert_eq!(code, 0, "{said}");
    let outcome: mcrelay_control::ReloadOutcome =
        serde_json::from_str(&said).unwrap_or_else(|e| panic!("{e}: {said}"));
    assert!(outcome.applied, "{said}");
    assert_eq!(outcome.removed, ["a", "b"], "{said}");
    assert!(flows(&socket).is_empty());

    // From no flows, an empty file is nothing to refuse; and flows come
    // back with the next reload.
    let (code, said) = ctl(&socket, &["reload"]);
    assert_eq!(code, 0, "{said}");
    fs::write(&path, config(&socket)).expect("restore config");
    let (code, said) = ctl(&socket, &["reload"]);
    assert_eq!(code, 0, "{said}");
    assert_eq!(flows(&socket), both);
    relay.stop();
}
