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
