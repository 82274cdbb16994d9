//! Which changed flows a reload can't replace make-before-break: those
//! whose old and new versions both need an XDP resource of one interface
//! that only one holder may have — its XDP program (`ingress = "xdp"`:
//! one per interface) or its queue 0's AF_XDP socket (`ingress` or
//! `egress = "xdp"`: one per queue). The new flow's sockets could not be
//! opened while the old flow still runs (`EBUSY`), so such a flow is
//! stopped first and then started anew (break-before-make): what arrives
//! between the two is lost, and the helper's bind retry waits for the
//! kernel to release the old socket's queue.

use std::collections::BTreeSet;

use mcrelay_config::{EgressKind, Flow, IngressKind};

/// The interfaces on which `flow` holds an XDP program or an AF_XDP
/// socket.
fn xdp_interfaces(flow: &Flow) -> BTreeSet<&str> {
    let inputs = flow
        .inputs
        .iter()
        .filter(|i| i.ingress == IngressKind::Xdp)
        .map(|i| i.interface.as_str());
    let outputs = flow
        .outputs
        .iter()
        .filter(|o| o.egress == EgressKind::Xdp)
        .map(|o| o.interface.as_str());
    inputs.chain(outputs).collect()
}

/// Whether replacing `old` by `new` must be break-before-make: both hold
/// an XDP program or AF_XDP socket on one interface.
pub(super) fn must_stop_first(old: &Flow, new: &Flow) -> bool {
    let old = xdp_interfaces(old);
    xdp_interfaces(new).iter().any(|i| old.contains(i))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(input: &str, outputs: &str) -> Flow {
        let text = format!("[[flow]]\nname = \"f\"\ninput = {input}\noutputs = [{outputs}]\n");
        let c = mcrelay_config::parse(&text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
        c.flows.as_slice()[0].clone()
    }

    const IN: &str = r#"{ interface = "a", address = "239.1.1.1", port = 5000 }"#;
    const XIN: &str = r#"{ interface = "a", address = "239.1.1.1", port = 5000, ingress = "xdp" }"#;
    const OUT: &str = r#"{ interface = "b", address = "239.2.2.2", port = 6000 }"#;
    const XOUT: &str = r#"{ interface = "b", address = "239.2.2.2", port = 6000, egress = "xdp" }"#;

    #[test]
    fn only_flows_holding_an_xdp_resource_in_both_versions_stop_first() {
        // An xdp output whose TTL changes: the new one needs queue 0 of b.
        let ttl = XOUT.replace("egress", "ttl = 9, egress");
        assert!(must_stop_first(&flow(IN, XOUT), &flow(IN, &ttl)));
        // An xdp input whose port changes: the new program needs a.
        let port = XIN.replace("5000", "5001");
        assert!(must_stop_first(&flow(XIN, OUT), &flow(&port, OUT)));
        // Socket outputs and inputs: make-before-break as before.
        assert!(!must_stop_first(
            &flow(IN, OUT),
            &flow(IN, &OUT.replace("6000", "6001"))
        ));
        // An xdp output added, or moved to another interface: nothing held
        // by the old flow is needed.
        assert!(!must_stop_first(&flow(IN, OUT), &flow(IN, XOUT)));
        let moved = XOUT.replace("\"b\"", "\"c\"");
        assert!(!must_stop_first(&flow(IN, XOUT), &flow(IN, &moved)));
        // The old flow's xdp output on b, the new one's xdp input on b:
        // one AF_XDP socket on queue 0 of b.
        let xin_b = XIN.replace("\"a\"", "\"b\"");
        let out_c = OUT.replace("\"b\"", "\"c\"");
        assert!(must_stop_first(&flow(IN, XOUT), &flow(&xin_b, &out_c)));
    }
}
