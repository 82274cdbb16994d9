//! Warm standby with the real daemon in a network namespace (issue 20,
//! "Beyond one host"): a daemon started with `daemon.mode = "standby"`
//! receives its flow's datagrams and relays none; `mcrelayctl active`
//! makes it relay, `mcrelayctl standby` stops it again, a reload keeps
//! whichever mode it is in, and status, flows --json and /metrics say so.

mod common;

use std::path::Path;

use common::{Topology, ctl, field, snapshot, stop_sender, terminate, wait_until};
use mcrelay_control::{Mode, Snapshot};

/// In R's own network namespace: no clash with anything on the host.
const METRICS_PORT: u16 = 9464;

fn config(t: &Topology) -> String {
    format!(
        r#"[daemon]
user = "nobody"
control_socket = "{}"
metrics_listen = "127.0.0.1:{METRICS_PORT}"
mode = "standby"

[[flow]]
name = "main"
input = {{ interface = "vRA", address = "239.1.1.1", port = 5000 }}
outputs = [ {{ interface = "vRB", address = "239.2.2.2", port = 6000 }} ]
"#,
        t.dir.join("control.sock").display()
    )
}

/// The value of `series` in R's `/metrics`.
fn metric(t: &Topology, series: &str) -> String {
    t.metric(METRICS_PORT, series)
}

/// (datagrams in, discarded in standby, sent on the output).
fn counts(s: &Snapshot) -> (u64, u64, u64) {
    let f = s.flow("main").expect("flow main");
    (f.packets_in, f.standby_discarded, f.outputs[0].packets_out)
}

/// Wait until `n` more datagrams have been discarded than `from`.
fn discard_more(socket: &Path, from: u64, n: u64) -> Snapshot {
    wait_until(&format!("{n} more datagrams discarded in standby"), || {
        let s = snapshot(socket);
        if counts(&s).1 >= from + n {
            Ok(s)
        } else {
            Err(format!("{:?}", counts(&s)))
        }
    })
}

fn set(socket: &Path, mode: &str) -> String {
    let (code, out) = ctl(socket, &[mode]);
    assert_eq!(code, 0, "mcrelayctl {mode}: {out}");
    out
}

fn reload(socket: &Path) {
    let (code, out) = ctl(socket, &["reload"]);
    assert_eq!(code, 0, "reload: {out}");
}

#[test]
fn standby_relays_nothing_active_relays_standby_stops_and_reload_keeps_the_mode() {
    let Some(t) = Topology::new() else { return };
    let socket = t.dir.join("control.sock");
    let relay = t.relay(&config(&t), &[]);
    assert!(relay.log().contains("mode=standby"), "{}", relay.log());

    let (_, status) = ctl(&socket, &["status"]);
    assert!(
        status.contains("\nmode:     standby: receiving"),
        "{status}"
    );
    assert_eq!(snapshot(&socket).mode, Mode::Standby);
    assert_eq!(metric(&t, "mcrelay_standby"), "1");
    let (_, flows) = ctl(&socket, &["flows", "--sample", "0"]);
    assert!(flows.contains("main  standby "), "{flows}");

    // The receiver counts what reaches B; it stops on SIGTERM.
    let rx = t.receiver("239.2.2.2:6000", u64::MAX, &["--duration", "600"]);
    let tx = t.sender(&t.a, "239.1.1.1:5000", Some("vA"), None, 2000);

    // Standby: the flow's datagrams arrive and are discarded, none sent.
    let s = discard_more(&socket, 0, 1000);
    let (packets_in, discarded, sent) = counts(&s);
    assert_eq!(sent, 0, "a standby sends nothing");
    assert!(packets_in >= discarded);
    let f = s.flow("main").expect("flow");
    assert_eq!(f.drops.total(), 0, "standby is not a drop: {f:?}");
    assert_eq!(f.outputs[0].drops(), 0);
    assert!(f.state.is_running(), "sockets open: {:?}", f.state);

    // A reload keeps standby (the file says standby too, but the point is
    // that it does not restart or flip anything).
    reload(&socket);
    assert_eq!(snapshot(&socket).mode, Mode::Standby);

    // Take over: relays from the next datagram on.
    let out = set(&socket, "active");
    assert!(out.contains("active (was standby"), "{out}");
    let s = wait_until("relaying after `mcrelayctl active`", || {
        let s = snapshot(&socket);
        if counts(&s).2 >= 1000 {
            Ok(s)
        } else {
            Err(format!("{:?}", counts(&s)))
        }
    });
    assert_eq!(s.mode, Mode::Active);
    assert_eq!(metric(&t, "mcrelay_standby"), "0");
    let discarded_while_standby = counts(&s).1;
    assert!(discarded_while_standby >= 1000, "{discarded_while_standby}");
    // Idempotent, as keepalived's notify script needs.
    assert!(set(&socket, "active").contains("active (already"));

    // A reload keeps the mode the daemon is in, not the file's default.
    reload(&socket);
    assert_eq!(snapshot(&socket).mode, Mode::Active);
    let (_, status) = ctl(&socket, &["status"]);
    assert!(status.contains("\nmode:     active\n"), "{status}");
    let relayed = counts(&snapshot(&socket)).2;
    wait_until("still relaying after the reload", || {
        let now = counts(&snapshot(&socket)).2;
        if now >= relayed + 500 {
            Ok(())
        } else {
            Err(format!("{now}"))
        }
    });

    // Stand by again: nothing more is sent. The reply comes once the
    // worker has the mode; sends it had already handed to the kernel
    // complete, so the count is read once discards have resumed.
    let out = set(&socket, "standby");
    assert!(out.contains("standby (was active"), "{out}");
    let s = discard_more(&socket, discarded_while_standby, 200);
    let sent_at_standby = counts(&s).2;
    let s = discard_more(&socket, counts(&s).1, 1000);
    assert_eq!(
        counts(&s).2,
        sent_at_standby,
        "sent while in standby: {:?}",
        counts(&s)
    );
    assert_eq!(metric(&t, "mcrelay_standby"), "1");
    assert!(
        metric(
            &t,
            "mcrelay_flow_standby_discarded_packets_total{flow=\"main\"}"
        )
        .parse::<u64>()
        .expect("a count")
            >= counts(&s).1
    );

    stop_sender(tx);
    let got = terminate(rx);
    // Everything the relay sent arrived, once: nothing was sent in standby
    // that the counters missed, and no datagram came twice.
    assert_eq!(field(&got, "duplicates"), 0, "{got}");
    assert_eq!(field(&got, "corrupt"), 0, "{got}");
    let received = u64::try_from(field(&got, "received")).expect("count");
    let final_sent = counts(&snapshot(&socket)).2;
    assert_eq!(received, final_sent, "{got}");
    assert_eq!(final_sent, sent_at_standby);
    let log = relay.stop();
    assert!(log.contains("mode changed"), "{log}");
}
