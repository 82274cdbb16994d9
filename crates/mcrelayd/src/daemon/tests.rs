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

/// Flow `f` on interfaces that don't exist (the link table is empty): it
/// is configured and waits for them, no socket is opened, so each reload
/// that changes it stops it and configures it anew. `legs` inputs
/// (`settings` after them), outputs 1 to `outputs`.
fn waiting_flow(dir: &Path, legs: u8, outputs: u8, settings: &str) -> String {
    let leg =
        |k: u8| format!("{{ interface = \"mcrx{k}\", address = \"239.26.9.{k}\", port = 5000 }}");
    let inputs: Vec<String> = (1..=legs).map(leg).collect();
    let outs: Vec<String> = (1..=outputs)
        .map(|k| format!("{{ interface = \"mcrx9\", address = \"239.26.8.{k}\", port = 5000 }}"))
        .collect();
    let inputs = match inputs.as_slice() {
        [one] => format!("input = {one}"),
        more => format!("inputs = [{}]", more.join(", ")),
    };
    format!(
        "[daemon]\ncontrol_socket = \"{}\"\n\n[[flow]]\nname = \"f\"\npayload = \"rtp\"\n\
         {inputs}\noutputs = [{}]\n{settings}\n",
        dir.join("control.sock").display(),
        outs.join(", ")
    )
}

/// Start the daemon on `configs[0]` (flow `f` waiting for its
/// interfaces), give flow `f` what it counted before (`counted`), then
/// reload each next config, recording the readers' table at every lock
/// the supervisor takes ([`reads`]); every read checked against the
/// highest of each `_total` series read before it, series absent for a
/// while included. The last read.
fn reads_across_reloads(
    name: &str,
    configs: &[String],
    counted: impl FnOnce(&mut report::FlowEntry),
) -> mcrelay_control::Snapshot {
    use mcrelay_testkit::metrics::{fell, totals};

    let dir = std::env::temp_dir().join(format!("mcrelay-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("mcrelay.toml");
    let config = |c: &String| c.replace("{dir}", &dir.display().to_string());
    std::fs::write(&path, config(&configs[0])).expect("config");
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
    {
        let shared = daemon.shared();
        let mut s = lock(&shared);
        let e = daemon
            .flows
            .entry_mut(&mut s.flows, FlowKey::from_name("f"))
            .expect("flow f");
        counted(e);
    }
    let mut highest = totals(&mcrelay_control::render_metrics(
        &lock(&daemon.shared()).snapshot(),
    ));
    let mut last = None;
    for (k, c) in configs.iter().enumerate().skip(1) {
        std::fs::write(&path, config(c)).expect("config");
        reads::record();
        let outcome = daemon.reload(false);
        let mut seen = reads::take();
        seen.push(lock(&daemon.shared()).snapshot());
        assert_eq!(outcome.changed, ["f"], "reload {k}: {outcome:?}");
        for (i, s) in seen.iter().enumerate() {
            let now = totals(&mcrelay_control::render_metrics(s));
            let down = fell(&highest, &now);
            assert!(
                down.is_empty(),
                "reload {k}, read {i} of {}: {down:#?}",
                seen.len()
            );
            highest.extend(now);
        }
        last = seen.pop();
    }
    daemon.stop().expect("stop");
    let _ = std::fs::remove_dir_all(&dir);
    last.expect("a reload")
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
    let d = Path::new("{dir}");
    let last = reads_across_reloads(
        "reads",
        &[
            waiting_flow(d, 2, 1, "redundancy = \"merge\""),
            waiting_flow(d, 2, 1, "redundancy = \"failover\""),
        ],
        |e| {
            e.stats.input.packets_in.add(1000);
            e.stats.input.redundancy.duplicates.add(990);
            e.interface_pauses = 2;
        },
    );
    let f = last.flows.first().expect("flow f");
    assert_eq!(f.interface_pauses, 2);
    assert_eq!(f.redundancy.as_ref().map(|r| r.duplicates), Some(990));
}

/// Issue 26: a section a reload takes away and a later one brings back
/// goes on from where it stood, not from 0: merge, then one input and
/// one output fewer, then merge and both outputs again. The merge's
/// totals, the second leg's and the second output's are absent in
/// between, and never lower after (it failed before: the snapshot a
/// successor goes on from had dropped them).
#[test]
fn a_section_a_reload_removes_and_brings_back_goes_on_from_where_it_stood() {
    let d = Path::new("{dir}");
    let merged = waiting_flow(d, 2, 2, "redundancy = \"merge\"");
    let last = reads_across_reloads(
        "back",
        &[merged.clone(), waiting_flow(d, 1, 1, ""), merged],
        |e| {
            let r = &e.stats.input.redundancy;
            r.duplicates.add(990);
            r.lost.add(3);
            r.forwarded[1].add(10);
            if let Some((_, o)) = e.stats.outputs.get(1) {
                o.packets_out.add(500);
            }
        },
    );
    let f = last.flows.first().expect("flow f");
    let r = f.redundancy.as_ref().expect("merged");
    assert_eq!((r.duplicates, r.lost), (990, 3));
    assert_eq!(r.legs.get(1).map(|l| l.forwarded), Some(10));
    assert_eq!(f.outputs.get(1).map(|o| o.packets_out), Some(500));
}
