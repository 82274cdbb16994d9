//! `ingress = "packet"` on an input with a 1500-byte MTU: the packet ring
//! takes the `TPACKET_V2` layout (a frame slot per packet, handed over as
//! soon as it is copied; issue 19), woken per frame while the flow is light
//! and walked every `WAKE_INTERVAL` once it is busy. It relays every
//! datagram byte-exact from a source the relay has no route back to and
//! counts IP fragments, as the V3 ring does for jumbo-capable inputs
//! (`packet.rs`, whose topology has 9200-byte MTUs).

use std::process::Command;

mod common;
use common::*;

/// The unroutable source: on A's link, unknown to R.
const SOURCE: &str = "192.168.78.1";

const FLOW: &str = r#"
[[flow]]
name = "frames"
input = { interface = "vRA", address = "239.1.1.1", port = 5000, ingress = "packet" }
outputs = [ { interface = "vRB", address = "239.2.2.2", port = 6000 } ]
"#;

fn mtu(ns: &str, dev: &str) -> String {
    let out = Command::new("ip")
        .args(["-n", ns, "-o", "link", "show", dev])
        .output()
        .expect("ip link show");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split_whitespace()
        .skip_while(|w| *w != "mtu")
        .nth(1)
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn a_1500_byte_mtu_input_is_read_frame_by_frame_and_relayed_byte_exact() {
    let Some(t) = Topology::new() else { return };
    t.ip(&t.a, &["link", "set", "vA", "mtu", "1500"]);
    t.ip(&t.r, &["link", "set", "vRA", "mtu", "1500"]);
    assert_eq!(mtu(&t.r, "vRA"), "1500");
    t.ip(&t.a, &["addr", "add", &format!("{SOURCE}/32"), "dev", "vA"]);
    for key in ["all", "vRA"] {
        t.rp_filter(key, 1);
    }

    let relay = t.relay(FLOW, &[]);
    let rx = t.receiver("239.2.2.2:6000", 800, &[]);
    t.send(
        "239.1.1.1:5000",
        &[
            "--source",
            SOURCE,
            "--count",
            "1000",
            // Well above INTERVAL_FROM_PPS: after the first rate window the
            // ring is walked by interval, not per frame (1200 frames with
            // the fragments fit its 2048 slots whatever the worker does).
            "--rate",
            "60000",
            "--size",
            "1316,1,1472,1000,2000",
        ],
    );
    let out = finish(rx);
    let log = relay.stop();
    clean(&out);
    // 200 of each size; the 2000-byte ones leave A as two IP fragments
    // each, which the ring delivers and the worker drops, counted.
    assert_eq!(
        (field(&out, "valid"), field(&out, "short")),
        (600, 200),
        "{out}"
    );
    assert_eq!(field(&out, "max_len"), 1472, "{out}");
    assert!(
        log.contains("packet ingress on a TPACKET_V2 ring"),
        "the 1500-byte MTU input should get frame slots:\n{log}"
    );
    let flow = ["flow=frames", "packets_in"];
    assert_eq!(counter(&log, &flow, "packets_in"), 800);
    assert_eq!(counter(&log, &flow, "drop_fragment"), 400, "{log}");
    for reason in ["truncated", "malformed", "bad_checksum"] {
        assert_eq!(
            counter(&log, &flow, &format!("drop_{reason}")),
            0,
            "{reason}"
        );
    }
    assert_eq!(
        counter(&log, &["output=239.2.2.2:6000"], "packets_out"),
        800
    );
}
