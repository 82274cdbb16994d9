//! `spread = N`: one flow's outputs served by N workers, each joining the
//! input on its own socket (issue 18). Every output must receive every
//! datagram exactly once, in order, byte-exact: that can only hold if the
//! kernel hands a copy of each datagram to every shard's socket (bound with
//! SO_REUSEADDR to the same group and port), not one socket's share.
//! Readers must see one flow. Needs root (CI runs as root); skips with a
//! message otherwise.

use std::fs;
use std::path::Path;
use std::process::{Child, Command};

mod common;
use common::*;

/// Eight outputs on vRB, 239.2.2.1:6000 to 239.2.2.8:6000.
fn groups(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("239.2.2.{i}:6000")).collect()
}

/// The config: flow "wide" from 239.1.1.1:5000 to the first `outputs` of
/// [`groups`], with `spread`, on workers of `cores`.
fn config(socket: &Path, cores: &str, outputs: usize, spread: usize) -> String {
    let outs: Vec<String> = groups(outputs)
        .iter()
        .map(|g| {
            let (address, port) = g.split_once(':').expect("group:port");
            format!("{{ interface = \"vRB\", address = \"{address}\", port = {port} }}")
        })
        .collect();
    format!(
        "[daemon]\nuser = \"nobody\"\ncontrol_socket = \"{}\"\ncores = {cores}\n\
         [[flow]]\nname = \"wide\"\nspread = {spread}\n\
         input = {{ interface = \"vRA\", address = \"239.1.1.1\", port = 5000 }}\n\
         outputs = [ {} ]\n",
        socket.display(),
        outs.join(", ")
    )
}

/// Send `count` datagrams to the flow and check that each of the first
/// `outputs` groups got every one, once, in order, byte-exact.
fn every_output_gets_everything(
    t: &Topology,
    outputs: usize,
    count: u64,
    log: impl Fn() -> String,
) {
    let rxs: Vec<(String, Child)> = groups(outputs)
        .into_iter()
        .map(|g| {
            let rx = t.receiver(&g, count, &[]);
            (g, rx)
        })
        .collect();
    t.send(
        "239.1.1.1:5000",
        &[
            "--count",
            &count.to_string(),
            "--rate",
            "10000",
            "--size",
            "1316",
        ],
    );
    for (g, rx) in rxs {
        let out = finish(rx);
        clean(&out);
        assert_eq!(
            (field(&out, "valid"), field(&out, "lost")),
            (whole(count), 0),
            "{g}: {out}\n{}",
            log()
        );
    }
}

#[test]
fn a_spread_flow_relays_every_datagram_to_every_output_once_in_order() {
    let Some(t) = Topology::new() else { return };
    let socket = t.dir.join("control.sock");
    let path = t.dir.join("mcrelay.toml");

    // More shards than workers: refused at start, naming both numbers.
    fs::write(&path, config(&socket, "[0]", 8, 2)).expect("config");
    let out = Command::new("ip")
        .args(["netns", "exec", &t.r, MCRELAYD, "--config"])
        .arg(&path)
        .output()
        .expect("mcrelayd");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started anyway:\n{stderr}");
    assert!(
        stderr.contains("flow \"wide\": spread 2 needs 2 workers, but there are 1"),
        "{stderr}"
    );

    // 1 -> 8 over two workers.
    let relay = t.relay(&config(&socket, "[0, 1]", 8, 2), &[]);
    let s = snapshot(&socket);
    assert_eq!(s.flows.len(), 1, "one flow, not one per shard: {s:?}");
    let f = s.flow("wide").expect("flow wide");
    let mut workers = f.workers.clone();
    workers.sort_unstable();
    assert_eq!(workers, [0, 1], "{f:?}");
    assert_eq!(f.worker, f.workers[0]);
    let labels: Vec<String> = f.outputs.iter().map(|o| o.label.clone()).collect();
    let want: Vec<String> = groups(8).iter().map(|g| format!("{g}@vRB")).collect();
    assert_eq!(labels, want, "outputs in config order");
    let (code, table) = ctl(&socket, &["flows", "--sample", "0"]);
    assert_eq!(code, 0, "{table}");
    let shown = format!("{},{}", f.workers[0], f.workers[1]);
    assert!(
        table.matches("wide").count() == 1 && table.contains(&shown),
        "one row for the flow, with both workers ({shown}):\n{table}"
    );

    every_output_gets_everything(&t, 8, 3000, || relay.log());
    let s = snapshot(&socket);
    let f = s.flow("wide").expect("flow wide");
    // The input is counted once, not once per shard; each output's own.
    assert_eq!(f.packets_in, 3000, "{f:?}");
    for o in &f.outputs {
        assert_eq!(o.packets_out, 3000, "{o:?}");
    }
    // Both workers sent: each served its share.
    for w in &s.workers {
        assert!(
            w.sends_submitted > 0,
            "worker {} sent nothing: {s:?}",
            w.index
        );
    }

    // A reload asking for more shards than workers is refused whole; the
    // flow runs on as it was.
    fs::write(&path, config(&socket, "[0, 1]", 8, 3)).expect("config");
    let (code, said) = ctl(&socket, &["reload"]);
    assert_eq!(code, 1, "{said}");
    assert!(
        said.contains("spread 3 needs 3 workers, but there are 2"),
        "{said}"
    );

    // A reload that changes the flow (one output fewer) replaces both
    // shards: the seven outputs left get everything, the eighth nothing.
    fs::write(&path, config(&socket, "[0, 1]", 7, 2)).expect("config");
    let (code, said) = ctl(&socket, &["reload"]);
    assert_eq!(code, 0, "{said}");
    assert!(said.contains("changed: wide"), "{said}");
    let s = snapshot(&socket);
    let f = s.flow("wide").expect("flow wide");
    assert_eq!(
        (s.flows.len(), f.outputs.len(), f.workers.len()),
        (1, 7, 2),
        "{f:?}"
    );
    let gone = t.receiver("239.2.2.8:6000", 1, &[]);
    every_output_gets_everything(&t, 7, 2000, || relay.log());
    let gone = terminate(gone);
    assert_eq!(field(&gone, "received"), 0, "the removed output: {gone}");
    let f = snapshot(&socket).flow("wide").cloned().expect("flow wide");
    // The changed flow's counters go on from its predecessor's (issue
    // 26: no `_total` goes down on a reload): 3000 before, 2000 after.
    assert_eq!(
        f.packets_in, 5000,
        "counters carried across the change: {f:?}"
    );
    for o in &f.outputs {
        assert_eq!(o.packets_out, 5000, "{o:?}");
    }

    // An output interface down pauses the flow (every shard leaves its
    // worker), up resumes it (every shard back, on the same workers).
    let running = |want: bool| {
        wait_until(&format!("flow wide running: {want}"), || {
            let f = snapshot(&socket).flow("wide").cloned().expect("flow wide");
            if f.state.is_running() == want {
                Ok(f)
            } else {
                Err(format!("{f:?}"))
            }
        })
    };
    let placed = f.workers.clone();
    t.ip(&t.r, &["link", "set", "vRB", "down"]);
    running(false);
    t.ip(&t.r, &["link", "set", "vRB", "up"]);
    let f = running(true);
    assert_eq!(f.workers, placed, "resumed on the same workers");
    every_output_gets_everything(&t, 7, 1000, || relay.log());

    // Back to one worker: one shard, on one worker.
    fs::write(&path, config(&socket, "[0, 1]", 7, 1)).expect("config");
    let (code, said) = ctl(&socket, &["reload"]);
    assert_eq!(code, 0, "{said}");
    let f = snapshot(&socket).flow("wide").cloned().expect("flow wide");
    assert!(f.workers.is_empty(), "{f:?}");
    every_output_gets_everything(&t, 7, 1000, || relay.log());

    // The final counters carry every change before: 3000 + 2000 + 1000
    // (paused and resumed) + 1000.
    let log = relay.stop();
    assert_eq!(
        counter(&log, &["flow=wide", "packets_in"], "packets_in"),
        7000
    );
}
