//! A fixed relay workload on loopback, for instruction counts of the
//! worker (`docs/benchmarks.md`): one worker relays `ROUNDS` bursts of
//! `BURST` datagrams to `OUTPUTS` unicast loopback receivers, each burst
//! waiting until every copy has arrived, so batching is the same on every
//! run and under valgrind. Only the public API is used, so the same file
//! builds against older versions of the crate for a before/after count:
//!
//! ```console
//! cargo build --release -p mcrelay-uring --example relay_loopback
//! valgrind --tool=callgrind --toggle-collect='*Worker*run*' \
//!     target/release/examples/relay_loopback [size] [gso: 0|1] [depth]
//! ```
//!
//! `depth` is each output's queue depth (default 256), which also sizes
//! the worker's receive ring (half the smallest depth, 16 to 512).
//!
//! Sends only to 127.0.0.1.

use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mcrelay_pool::PoolConfig;
use mcrelay_uring::{FlowSockets, IngressSocket, OutputSocket, ReceiveMode, WorkerConfig, spawn};

const ROUNDS: usize = 200;
const BURST: usize = 32;
const OUTPUTS: usize = 4;
const RCVBUF: usize = 4 << 20;
const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1316);
    let gso = args.next().is_none_or(|a| a != "0");
    let depth: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(256);
    let ingress = UdpSocket::bind((LOCALHOST, 0))?;
    // Room for a whole burst of jumbo datagrams (32 x 8000 B is more than
    // the default 208 KiB) on the ingress and on every receiver.
    socket2::SockRef::from(&ingress).set_recv_buffer_size(RCVBUF)?;
    let dest = ingress.local_addr()?;
    let mut receivers = Vec::new();
    let mut outputs = Vec::new();
    for i in 0..OUTPUTS {
        let r = UdpSocket::bind((LOCALHOST, 0))?;
        r.set_read_timeout(Some(Duration::from_secs(10)))?;
        socket2::SockRef::from(&r).set_recv_buffer_size(RCVBUF)?;
        let out = UdpSocket::bind((LOCALHOST, 0))?;
        out.connect(r.local_addr()?)?;
        outputs.push(OutputSocket::new(format!("o{i}"), out, depth));
        receivers.push(r);
    }
    let flow = FlowSockets::new("loopback".into(), IngressSocket::Udp(ingress), outputs);
    let stats = flow.stats();
    let (events, _events_rx) = std::sync::mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let worker = spawn(
        WorkerConfig {
            index: 0,
            cpu: None,
            pools: PoolConfig::default(),
            flows: vec![flow],
            receive: ReceiveMode::Auto,
            gso,
            standby: false,
        },
        Arc::clone(&stop),
        events,
    )
    .map_err(std::io::Error::other)?;
    let sender = UdpSocket::bind((LOCALHOST, 0))?;
    let payload = vec![0x5a_u8; size];
    let mut buf = vec![0u8; 65536];
    let mut lost = 0;
    for _ in 0..ROUNDS {
        for _ in 0..BURST {
            sender.send_to(&payload, dest)?;
        }
        for r in &receivers {
            for _ in 0..BURST {
                if r.recv(&mut buf).is_err() {
                    lost += 1;
                    break;
                }
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let _ = worker.join();
    let out: u64 = stats.outputs.iter().map(|(_, c)| c.packets_out.get()).sum();
    println!(
        "relayed {} datagrams of {size} B to {OUTPUTS} outputs ({out} sends delivered, gso {gso}, depth {depth}, {lost} receive timeouts)",
        stats.input.packets_in.get()
    );
    Ok(())
}
