//! The SRT thread on loopback (127.0.0.1 only): callers made with the same
//! libsrt receive every datagram byte-exact; a wrong passphrase, an
//! unknown stream ID and a caller past `max_callers` are refused without
//! costing the others a datagram.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use mcrelay_config::{SrtMode, SrtOutput};
use mcrelay_srt::ffi::{Opt, Socket, State};
use mcrelay_srt::{OutputSpec, RouteView, SrtService, feed_pair};

fn free_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn srt(passphrase: Option<&str>, stream_id: Option<&str>, max_callers: u32) -> SrtOutput {
    SrtOutput {
        mode: SrtMode::Listener,
        latency_ms: 120,
        passphrase: passphrase.map(str::to_owned),
        key_length: 16,
        max_callers,
        stream_id: stream_id.map(str::to_owned),
    }
}

fn add(svc: &SrtService, flow: &str, addr: SocketAddr, s: SrtOutput) -> UnixDatagram {
    let (worker, feed): (OwnedFd, OwnedFd) = feed_pair().expect("pair");
    svc.add(
        OutputSpec {
            flow: flow.into(),
            label: format!("srt://{addr}"),
            address: addr,
            srt: s,
        },
        feed,
    );
    UnixDatagram::from(worker)
}

/// A caller; `Some` once connected, `None` if refused.
fn call(addr: SocketAddr, passphrase: Option<&str>, stream_id: Option<&str>) -> Option<Socket> {
    let s = Socket::new_live().expect("socket");
    if let Some(p) = passphrase {
        s.as_ref().set_str(Opt::Passphrase, p).expect("pass");
    }
    if let Some(id) = stream_id {
        s.as_ref().set_str(Opt::StreamId, id).expect("id");
    }
    s.connect(addr).expect("connect");
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        match s.as_ref().state() {
            State::Connected => return Some(s),
            st if st.is_gone() => return None,
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    None
}

fn view_of(svc: &SrtService, flow: &str) -> Option<RouteView> {
    svc.view().into_iter().find(|r| r.flow == flow)
}

fn wait_callers(svc: &SrtService, flow: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if view_of(svc, flow).is_some_and(|v| v.callers.len() == n) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{flow}: not {n} callers: {:?}", view_of(svc, flow));
}

fn datagram(i: u32) -> Vec<u8> {
    let mut d = vec![0u8; 1316];
    for (j, b) in d.iter_mut().enumerate() {
        *b = i.to_le_bytes()[0]
            .wrapping_mul(7)
            .wrapping_add(j.to_le_bytes()[0]);
    }
    d[..4].copy_from_slice(&i.to_be_bytes());
    d
}

/// Receives `n` datagrams from each caller, checking each byte.
fn receive_all(callers: &[Socket], n: u32) {
    let mut next = vec![0u32; callers.len()];
    let mut buf = [0u8; 1500];
    let deadline = Instant::now() + Duration::from_secs(30);
    while next.iter().any(|&k| k < n) {
        assert!(Instant::now() < deadline, "received {next:?} of {n}");
        let mut idle = true;
        for (c, k) in callers.iter().zip(next.iter_mut()) {
            while let Some(len) = c.recv(&mut buf).expect("recv") {
                idle = false;
                assert_eq!(&buf[..len], &datagram(*k)[..], "datagram {k}");
                *k += 1;
            }
        }
        if idle {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

#[test]
fn many_callers_byte_exact_and_refusals_cost_nothing() {
    let svc = SrtService::start().expect("start");
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let pass = "correct horse battery";
    let a = add(&svc, "a", addr, srt(Some(pass), Some("a"), 4));
    let b = add(&svc, "b", addr, srt(None, Some("b"), 1));
    wait_for_listener(&svc);

    let callers: Vec<Socket> = (0..4)
        .map(|_| call(addr, Some(pass), Some("a")).expect("caller of a connects"))
        .collect();
    let b_caller = call(addr, None, Some("b")).expect("caller of b connects");
    wait_callers(&svc, "a", 4);
    wait_callers(&svc, "b", 1);

    // Refused: wrong passphrase, no passphrase, unknown stream, a fifth
    // caller of a, a second of b.
    assert!(call(addr, Some("wrong passphrase!"), Some("a")).is_none());
    assert!(call(addr, None, Some("a")).is_none());
    assert!(call(addr, None, Some("nobody")).is_none());
    assert!(call(addr, Some(pass), Some("a")).is_none());
    assert!(call(addr, None, Some("b")).is_none());

    for i in 0..2000u32 {
        let d = datagram(i);
        // The socket pair holds few datagrams: wait for room (the worker
        // would count a drop instead).
        loop {
            match a.send(&d) {
                Ok(_) => break,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_micros(200));
                }
                Err(e) => panic!("send: {e}"),
            }
        }
        if i % 2 == 0 {
            loop {
                match b.send(&d) {
                    Ok(_) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                    Err(e) => panic!("send: {e}"),
                }
            }
        }
    }
    receive_all(&callers, 2000);
    let mut buf = [0u8; 1500];
    let mut k = 0u32;
    let deadline = Instant::now() + Duration::from_secs(20);
    while k < 1000 {
        assert!(Instant::now() < deadline, "b got {k}");
        match b_caller.recv(&mut buf).expect("recv") {
            Some(len) => {
                assert_eq!(&buf[..len], &datagram(k * 2)[..]);
                k += 1;
            }
            None => std::thread::sleep(Duration::from_millis(2)),
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = view_of(&svc, "a").expect("a");
        if v.refused >= 3 || Instant::now() > deadline {
            assert_eq!(v.refused, 3, "{v:?}");
            assert!(
                v.callers.iter().all(|c| c.sent == 2000 && c.dropped == 0),
                "{v:?}"
            );
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // The flow's end closes its feed: its callers are disconnected, b's stay.
    drop(a);
    wait_callers_gone(&svc, "a");
    assert_eq!(view_of(&svc, "b").map(|v| v.callers.len()), Some(1));
    svc.stop();
}

fn wait_for_listener(svc: &SrtService) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while svc.view().len() < 2 {
        assert!(Instant::now() < deadline, "routes not added");
        std::thread::sleep(Duration::from_millis(10));
    }
    for v in svc.view() {
        assert_eq!(v.error, None, "{v:?}");
    }
}

fn wait_callers_gone(svc: &SrtService, flow: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while view_of(svc, flow).is_some() {
        assert!(Instant::now() < deadline, "{flow} still there");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A listener on `::` is dual-stack: an IPv4 caller (127.0.0.1) is
/// served, as the config's port rules take it (`::` holds the port on
/// IPv4 too). The listener sets `SRTO_IPV6ONLY` off so that holds even
/// with net.ipv6.bindv6only = 1; with the sysctl's default (0) libsrt 1.5
/// is dual-stack without it, so this passes either way here.
#[test]
fn a_listener_on_the_ipv6_wildcard_serves_an_ipv4_caller() {
    let svc = SrtService::start().expect("start");
    let port = free_port();
    let addr: SocketAddr = format!("[::]:{port}").parse().expect("addr");
    let feed = add(&svc, "v6", addr, srt(None, None, 2));
    let deadline = Instant::now() + Duration::from_secs(10);
    while view_of(&svc, "v6").is_none() {
        assert!(Instant::now() < deadline, "route not added");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(view_of(&svc, "v6").and_then(|v| v.error), None);
    let v4: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let caller = call(v4, None, None).expect("an IPv4 caller of the :: listener connects");
    wait_callers(&svc, "v6", 1);
    for i in 0..10 {
        feed.send(&datagram(i)).expect("feed");
    }
    receive_all(&[caller], 10);
    svc.stop();
}
