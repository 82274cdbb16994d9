//! The daemon's client against the helper's server over a socket pair, in
//! one process (the server on a thread), with real sockets on loopback.

use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Duration;

use mcrelay_helper::{ServeError, serve};
use mcrelay_sockets::{HelperClient, HelperError, fdpass};

struct Helper {
    config: PathBuf,
    client: HelperClient,
    server: JoinHandle<Result<(), ServeError>>,
}

fn start(config: &Path) -> Helper {
    let (daemon, helper) = fdpass::pair().expect("pair");
    let path = config.to_owned();
    let server = std::thread::spawn(move || serve(helper, &path));
    let client = HelperClient::with_timeout(daemon, Duration::from_secs(60)).expect("client");
    Helper {
        config: config.to_owned(),
        client,
        server,
    }
}

impl Helper {
    fn stop(self) {
        drop(self.client);
        self.server
            .join()
            .expect("server did not panic")
            .expect("server exits cleanly when the daemon closes");
        if let Some(dir) = self.config.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn free_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

fn flow(name: &str, ingress_port: u16, output_port: u16) -> String {
    format!(
        "[[flow]]\nname = \"{name}\"\n\
         input = {{ interface = \"lo\", address = \"127.0.0.1\", port = {ingress_port}, receive_buffer_bytes = 262144 }}\n\
         outputs = [{{ interface = \"lo\", address = \"127.0.0.1\", port = {output_port} }}]\n\n"
    )
}

fn config_path(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mcrelay-helper-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    dir.join("mcrelay.toml")
}

fn listener() -> UdpSocket {
    let l = UdpSocket::bind("127.0.0.1:0").expect("bind");
    l.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    l
}

/// The sockets of `name` work: a datagram to the ingress port arrives on
/// the ingress socket, and one sent on the output reaches `out`.
fn check_flow(client: &mut HelperClient, name: &str, ingress_port: u16, out: &UdpSocket) {
    let flow = client.open_flow(name).expect("open_flow");
    assert_eq!(flow.outputs.len(), 1);
    assert_eq!(flow.legs.len(), 1);
    assert!(flow.legs[0].receive_buffer_bytes > 0);
    let ingress = UdpSocket::from(flow.legs.into_iter().next().expect("one leg").socket);
    assert_eq!(ingress.local_addr().expect("addr").port(), ingress_port);
    ingress
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let probe = UdpSocket::bind("127.0.0.1:0").expect("bind");
    probe
        .send_to(name.as_bytes(), ("127.0.0.1", ingress_port))
        .expect("send to ingress");
    let mut buf = [0u8; 64];
    let n = ingress.recv(&mut buf).expect("ingress receives");
    assert_eq!(&buf[..n], name.as_bytes());
    flow.outputs[0].send(b"relayed").expect("send on output");
    let (n, from) = out.recv_from(&mut buf).expect("listener receives");
    assert_eq!(&buf[..n], b"relayed");
    assert_eq!(from, flow.outputs[0].local_addr().expect("addr"));
}

#[test]
fn open_flow_returns_working_sockets_and_refuses_others() {
    let out = listener();
    let port = free_port();
    let path = config_path("open");
    std::fs::write(
        &path,
        flow("lo-test", port, out.local_addr().expect("addr").port()),
    )
    .expect("write");
    let mut h = start(&path);
    h.client.ping().expect("ping");
    check_flow(&mut h.client, "lo-test", port, &out);

    match h.client.open_flow("not-in-config") {
        Err(HelperError::Refused(reason)) => {
            assert!(
                reason.contains("no flow named \"not-in-config\""),
                "{reason}"
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // A refusal leaves the connection usable.
    h.client.ping().expect("ping after refusal");
    h.stop();
}

#[test]
fn reload_reads_the_file_again() {
    let out = listener();
    let out_port = out.local_addr().expect("addr").port();
    let (first, second) = (free_port(), free_port());
    let path = config_path("reload");
    std::fs::write(&path, flow("first", first, out_port)).expect("write");
    let mut h = start(&path);
    match h.client.open_flow("second") {
        Err(HelperError::Refused(_)) => {}
        other => panic!("not configured yet: {other:?}"),
    }

    let both = flow("first", first, out_port) + &flow("second", second, out_port);
    std::fs::write(&path, both).expect("rewrite");
    assert_eq!(h.client.reload().expect("reload"), 2);
    check_flow(&mut h.client, "second", second, &out);

    // A broken file is refused with its errors; the previous configuration
    // stays in force.
    std::fs::write(&path, "[[flow]]\nname = 3\n").expect("break");
    match h.client.reload() {
        Err(HelperError::Refused(reason)) => {
            assert!(
                reason.contains("keeps the previous configuration"),
                "{reason}"
            );
            assert!(
                reason.contains("mcrelay.toml:2:"),
                "names file and line: {reason}"
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    check_flow(&mut h.client, "second", second, &out);
    h.stop();
}

#[test]
fn many_outputs_are_passed_over_several_messages() {
    let outs: Vec<UdpSocket> = (0..300).map(|_| listener()).collect();
    let port = free_port();
    let list: Vec<String> = outs
        .iter()
        .map(|o| {
            format!(
                "{{ interface = \"lo\", address = \"127.0.0.1\", port = {} }}",
                o.local_addr().expect("addr").port()
            )
        })
        .collect();
    let text = format!(
        "[[flow]]\nname = \"wide\"\ninput = {{ interface = \"lo\", address = \"127.0.0.1\", port = {port} }}\noutputs = [\n{}\n]\n",
        list.join(",\n")
    );
    let path = config_path("wide");
    std::fs::write(&path, text).expect("write");
    let mut h = start(&path);
    let flow = h.client.open_flow("wide").expect("open");
    assert_eq!(flow.outputs.len(), 300);
    // In config order: the last output reaches the last listener.
    flow.outputs[299].send(b"last").expect("send");
    let mut buf = [0u8; 8];
    let n = outs[299].recv(&mut buf).expect("recv");
    assert_eq!(&buf[..n], b"last");
    h.stop();
}
