use super::*;
use crate::links::{InterfaceState, LinkMessage, LinkTable};

/// Interfaces in `states` (absent ones are missing).
fn table(states: &[(&str, InterfaceState)]) -> LinkTable {
    let mut t = LinkTable::default();
    for (index, (name, state)) in (1..).zip(states) {
        let up = u32::try_from(libc::IFF_UP | libc::IFF_RUNNING).unwrap_or(0);
        if *state != InterfaceState::Missing {
            t.apply(&LinkMessage {
                deleted: false,
                family: 0,
                index,
                flags: if *state == InterfaceState::Up { up } else { 0 },
                name: Some((*name).to_owned()),
                operstate: None,
            });
        }
    }
    t
}

#[test]
fn one_leg_up_is_enough_every_output_must_be() {
    use InterfaceState::{Down, Missing, Up};
    let f = placement::tests::flow_with_legs("legs", 2); // eth0, eth1 -> eth9
    let blocked =
        |states: &[(&str, InterfaceState)], running| blocked(Some(&table(states)), &f, running);
    let all_up = [("eth0", Up), ("eth1", Up), ("eth9", Up)];
    assert_eq!(blocked(&all_up, false), None);
    // One leg down: the flow runs on, and starts.
    let a_down = [("eth0", Down), ("eth1", Up), ("eth9", Up)];
    assert_eq!(blocked(&a_down, true), None);
    assert_eq!(blocked(&a_down, false), None);
    // One leg gone: running on the other; not started (its sockets
    // can't be opened).
    let a_gone = [("eth0", Missing), ("eth1", Up), ("eth9", Up)];
    assert_eq!(blocked(&a_gone, true), None);
    assert_eq!(
        blocked(&a_gone, false),
        Some(FlowState::WaitingForInterface {
            interface: "eth0".into()
        })
    );
    // Every leg down: paused, naming the first.
    let both = [("eth0", Down), ("eth1", Missing), ("eth9", Up)];
    assert_eq!(
        blocked(&both, true),
        Some(FlowState::InterfaceDown {
            interface: "eth0".into()
        })
    );
    // An output down: paused whatever the legs.
    let out = [("eth0", Up), ("eth1", Up), ("eth9", Down)];
    assert_eq!(
        blocked(&out, true),
        Some(FlowState::InterfaceDown {
            interface: "eth9".into()
        })
    );
    // A one-input flow: its input down pauses it, as before.
    let single = placement::tests::flow("one", 1, None); // eth0 -> eth1
    let down = table(&[("eth0", Down), ("eth1", Up)]);
    assert!(super::blocked(Some(&down), &single, true).is_some());
    assert_eq!(super::blocked(None, &f, false), None, "not watched");
}

/// What a reader could see while the supervisor works: each time this
/// thread takes the readers' lock, the table as the previous holder left
/// it (a reader taking the lock just before would have read exactly
/// that). Recorded only on a thread that asked ([`record`]).
pub(super) mod reads {
    use std::cell::RefCell;

    use mcrelay_control::Snapshot;

    use super::super::Shared;

    thread_local! {
        static READS: RefCell<Option<Vec<Snapshot>>> = const { RefCell::new(None) };
    }

    /// Called by [`super::super::lock`] with the lock just taken.
    pub(in crate::daemon) fn taken(shared: &Shared) {
        READS.with(|r| {
            if let Some(reads) = r.borrow_mut().as_mut() {
                reads.push(shared.snapshot());
            }
        });
    }

    /// Record on this thread from now on.
    pub(in crate::daemon) fn record() {
        READS.with(|r| *r.borrow_mut() = Some(Vec::new()));
    }

    /// What was recorded; recording stops.
    pub(in crate::daemon) fn take() -> Vec<Snapshot> {
        READS.with(|r| r.borrow_mut().take().unwrap_or_default())
    }
}

/// Issue 26: a flow changed by a reload while it does not relay (paused:
/// its interfaces down or gone) is stopped and configured anew, fresh
/// counters plus what the old one counted. No state the supervisor leaves
/// the readers' table in, at any moment of the reload, may show a total
/// lower than before it: the carry was once applied in a second step,
/// after the new entry was published, and a scrape in between read the
/// merge's duplicates and the interface pauses (every total of the flow)
/// as 0. Deterministic: every moment a reader could take the lock is
/// recorded (no thread, no timing).
#[test]
fn no_read_during_a_reload_sees_a_total_lower_than_before_it() {
    use mcrelay_testkit::metrics::{fell, totals};

    let dir = std::env::temp_dir().join(format!("mcrelay-reads-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("mcrelay.toml");
    // Interfaces that don't exist (the link table is empty): the flow is
    // configured and waits for them, no socket is opened.
    let config = |settings: &str| {
        format!(
            "[daemon]\ncontrol_socket = \"{}\"\n\n[[flow]]\nname = \"f\"\npayload = \"rtp\"\n\
             inputs = [{{ interface = \"mcrx0\", address = \"239.26.9.1\", port = 5000 }}, \
             {{ interface = \"mcrx1\", address = \"239.26.9.2\", port = 5000 }}]\n\
             outputs = [{{ interface = \"mcrx2\", address = \"239.26.9.3\", port = 5000 }}]\n{settings}\n",
            dir.join("control.sock").display()
        )
    };
    std::fs::write(&path, config("redundancy = \"merge\"")).expect("config");
    let loaded = mcrelay_config::load(&path).expect("valid config");
    let options = RunOptions {
        receive: mcrelay_uring::ReceiveMode::Single,
        gso: false,
    };
    let mut daemon = Daemon::start(
        &path,
        loaded,
        options,
        Opener::direct(),
        Some(LinkTable::default()),
        || Ok::<(), std::io::Error>(()),
    )
    .expect("daemon");
    let key = FlowKey::from_name("f");
    // What the flow counted before: merged, paused twice.
    {
        let shared = daemon.shared();
        let mut s = lock(&shared);
        let e = daemon.flows.entry_mut(&mut s.flows, key).expect("flow f");
        e.stats.input.packets_in.add(1000);
        e.stats.input.redundancy.duplicates.add(990);
        e.interface_pauses = 2;
    }
    let before = totals(&mcrelay_control::render_metrics(
        &lock(&daemon.shared()).snapshot(),
    ));
    for series in [
        "mcrelay_flow_received_packets_total{flow=\"f\"}",
        "mcrelay_flow_merge_duplicate_packets_total{flow=\"f\"}",
        "mcrelay_flow_interface_pauses_total{flow=\"f\"}",
    ] {
        assert!(
            before.get(series).is_some_and(|&v| v > 0.0),
            "{series}: {before:#?}"
        );
    }
    std::fs::write(&path, config("redundancy = \"failover\"")).expect("config");
    reads::record();
    let outcome = daemon.reload(false);
    let mut seen = reads::take();
    seen.push(lock(&daemon.shared()).snapshot());
    assert_eq!(outcome.changed, ["f"], "{outcome:?}");
    let mut highest = before;
    for (i, s) in seen.iter().enumerate() {
        let now = totals(&mcrelay_control::render_metrics(s));
        let down = fell(&highest, &now);
        assert!(down.is_empty(), "read {i} of {}: {down:#?}", seen.len());
        highest.extend(now);
    }
    let last = seen.last().and_then(|s| s.flows.first()).expect("flow f");
    assert_eq!(last.interface_pauses, 2);
    assert_eq!(last.redundancy.as_ref().map(|r| r.duplicates), Some(990));
    daemon.stop().expect("stop");
    let _ = std::fs::remove_dir_all(&dir);
}
