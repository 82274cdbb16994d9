//! A command wakes an idle worker: a flow added to a worker with nothing
//! to do is applied in the loop turn its wake-up starts (the eventfd's
//! poll completes on the worker's ring), not at the worker's next 100 ms
//! tick, and then relays its first datagram. The latency itself is
//! measured by experiments/scale, not asserted here.

use std::net::{Ipv4Addr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use mcrelay_pool::PoolConfig;
use mcrelay_uring::{
    Command, Event, FlowSockets, IngressSocket, OutputSocket, ReceiveMode, WorkerConfig,
};

/// How long a wait for something expected may take before the test fails:
/// generous for a loaded 2-core machine; a passing run never waits it out.
const DEADLINE: Duration = Duration::from_secs(60);

fn added_flow_is_applied_on_its_wake_up(receive: ReceiveMode) {
    let stop = Arc::new(AtomicBool::new(false));
    let (events_tx, events) = mpsc::channel();
    let worker = mcrelay_uring::spawn(
        WorkerConfig {
            index: 0,
            cpu: None,
            pools: PoolConfig::default(),
            flows: Vec::new(),
            receive,
            gso: false,
            standby: false,
        },
        Arc::clone(&stop),
        events_tx,
    )
    .expect("worker");
    let ingress = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind ingress");
    let to = ingress.local_addr().expect("addr");
    let receiver = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind receiver");
    receiver.set_read_timeout(Some(DEADLINE)).expect("timeout");
    let egress = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind egress");
    egress
        .connect(receiver.local_addr().expect("addr"))
        .expect("connect");
    let flow = FlowSockets::new(
        "late".into(),
        IngressSocket::Udp(ingress),
        vec![OutputSocket::new("out".into(), egress, 64)],
    );

    // Idle: no flows, so nothing completes on its ring until woken.
    let completions = &worker.stats.loop_counters.completions;
    assert_eq!(completions.get(), 0, "an idle worker completes nothing");
    worker
        .command(Command::AddFlow(Box::new(flow)))
        .expect("the command queue has room");
    let event = events.recv_timeout(DEADLINE).expect("the worker answers");
    assert_eq!(
        event,
        Event::FlowAdded {
            worker: 0,
            flow: "late".into()
        }
    );
    assert!(
        completions.get() >= 1,
        "the flow was added in a turn started by the wake-up's completion, not by the tick"
    );

    let sender = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind sender");
    sender.send_to(b"first datagram", to).expect("send");
    let mut buf = [0u8; 64];
    let n = receiver
        .recv(&mut buf)
        .expect("the added flow relays its first datagram");
    assert_eq!(&buf[..n], b"first datagram");

    stop.store(true, Ordering::Relaxed);
    worker.join().expect("worker stops cleanly");
}

#[test]
fn an_added_flow_wakes_an_idle_worker() {
    added_flow_is_applied_on_its_wake_up(ReceiveMode::Auto);
}

#[test]
fn an_added_flow_wakes_an_idle_worker_with_rearmed_receives() {
    added_flow_is_applied_on_its_wake_up(ReceiveMode::Single);
}
