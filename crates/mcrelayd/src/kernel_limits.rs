//! Kernel limits on group memberships, checked up front (at start-up and
//! on every reload, in the daemon's network namespace) so a config the
//! kernel would refuse fails with the sysctl to raise instead of a bare
//! `ENOBUFS` from a join, flow by flow.
//!
//! Each flow's input joins its group on a socket of its own (so is a
//! packet flow's join-only socket), so the per-socket limits need room for
//! one membership, and one source for a source-specific input:
//! `net.ipv4.igmp_max_memberships` (groups per IPv4 socket),
//! `net.ipv4.igmp_max_msf` (sources per IPv4 socket) and
//! `net.ipv6.mld_max_msf` (sources per IPv6 socket; IPv6 has no group
//! count limit). A limit set to 0 — or lower than a future design joining
//! several groups per socket would need — refuses every join.
//!
//! `net.core.rmem_max` caps each input's `receive_buffer_bytes`: not an
//! error, but said once here, with the flows it affects, instead of once
//! per socket.
//!
//! Every multicast output group on an interface needs a neighbour entry
//! (the group's MAC mapping). The neighbour tables are shared by the whole
//! host; above `gc_thresh2` entries the kernel garbage-collects them every
//! few seconds and above `gc_thresh3` on every new entry, so with more
//! output groups than that, entries are evicted and re-created while they
//! are in use (seen as `___neigh_create` in a profile of 2000 output
//! groups). Relaying goes on; each send costs more. Said once, with the
//! sysctls to raise (readable in the host's network namespace only).

use std::net::IpAddr;
use std::path::Path;

use mcrelay_config::Config;

/// The limits as read from `/proc/sys` (`None`: unreadable, not checked).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sysctls {
    pub igmp_max_memberships: Option<u64>,
    pub igmp_max_msf: Option<u64>,
    pub mld_max_msf: Option<u64>,
    pub rmem_max: Option<u64>,
    /// `net.ipv4.neigh.default.gc_thresh2` and the IPv6 one.
    pub neigh_gc_thresh2: [Option<u64>; 2],
}

fn read_sysctl(name: &str) -> Option<u64> {
    let path = format!("/proc/sys/{}", name.replace('.', "/"));
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

impl Sysctls {
    /// This network namespace's values.
    pub fn read() -> Self {
        Self {
            igmp_max_memberships: read_sysctl("net.ipv4.igmp_max_memberships"),
            igmp_max_msf: read_sysctl("net.ipv4.igmp_max_msf"),
            mld_max_msf: read_sysctl("net.ipv6.mld_max_msf"),
            rmem_max: read_sysctl("net.core.rmem_max"),
            neigh_gc_thresh2: [
                read_sysctl("net.ipv4.neigh.default.gc_thresh2"),
                read_sysctl("net.ipv6.neigh.default.gc_thresh2"),
            ],
        }
    }
}

/// A limit the config's joins need more of than the kernel allows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{file}: flow {flow:?} (and {others} more) joins {what} on its input socket, but {sysctl} is \
     {value} in this network namespace; raise it to at least {need} \
     (sysctl -w {sysctl}={need}, and in /etc/sysctl.d/ to keep it), or remove those flows"
)]
pub struct LimitError {
    pub file: String,
    pub flow: String,
    pub others: usize,
    pub what: &'static str,
    pub sysctl: &'static str,
    pub value: u64,
    pub need: u64,
}

/// What each input socket needs of one limit, and who needs it.
struct Need {
    sysctl: &'static str,
    what: &'static str,
    value: Option<u64>,
    flows: Vec<String>,
}

/// Whether `config`'s joins fit the kernel's per-socket limits.
pub fn check(path: &Path, config: &Config, sysctls: &Sysctls) -> Result<(), LimitError> {
    let mut needs = [
        Need {
            sysctl: "net.ipv4.igmp_max_memberships",
            what: "an IPv4 group",
            value: sysctls.igmp_max_memberships,
            flows: Vec::new(),
        },
        Need {
            sysctl: "net.ipv4.igmp_max_msf",
            what: "an IPv4 source-specific group (one source)",
            value: sysctls.igmp_max_msf,
            flows: Vec::new(),
        },
        Need {
            sysctl: "net.ipv6.mld_max_msf",
            what: "an IPv6 source-specific group (one source)",
            value: sysctls.mld_max_msf,
            flows: Vec::new(),
        },
    ];
    for flow in config.flows.iter() {
        // Each input (leg) joins on its own socket.
        for input in &flow.inputs {
            if !input.address.is_multicast() {
                continue;
            }
            let which: &[usize] = match (input.address, input.source.is_some()) {
                (IpAddr::V4(_), false) => &[0],
                (IpAddr::V4(_), true) => &[0, 1],
                (IpAddr::V6(_), false) => &[],
                (IpAddr::V6(_), true) => &[2],
            };
            for &i in which {
                if needs[i].flows.last() != Some(&flow.name) {
                    needs[i].flows.push(flow.name.clone());
                }
            }
        }
    }
    for n in needs {
        if let (Some(value), Some(first)) = (n.value, n.flows.first())
            && value < 1
        {
            return Err(LimitError {
                file: path.display().to_string(),
                flow: first.clone(),
                others: n.flows.len() - 1,
                what: n.what,
                sysctl: n.sysctl,
                value,
                need: 1,
            });
        }
    }
    Ok(())
}

/// The flows whose `receive_buffer_bytes` `net.core.rmem_max` caps (the
/// kernel grants the cap; with privileges the helper forces past it), and
/// the largest asked for.
pub fn capped_receive_buffers(config: &Config, sysctls: &Sysctls) -> Option<(usize, u64)> {
    let max = sysctls.rmem_max?;
    let (n, largest) = config
        .flows
        .iter()
        .flat_map(|f| f.udp_inputs())
        .map(|i| u64::from(i.receive_buffer_bytes))
        .filter(|&b| b > max)
        .fold((0usize, 0u64), |(n, l), b| (n + 1, l.max(b)));
    (n > 0).then_some((n, largest))
}

/// The IPv4 and IPv6 multicast output groups (distinct per interface)
/// beyond their family's `gc_thresh2`: `(sysctl prefix, groups, gc_thresh2)`.
pub fn neighbour_pressure(config: &Config, sysctls: &Sysctls) -> Vec<(&'static str, usize, u64)> {
    let mut groups = [
        std::collections::HashSet::new(),
        std::collections::HashSet::new(),
    ];
    for o in config.flows.iter().flat_map(|f| &f.outputs) {
        if o.address.is_multicast() {
            groups[usize::from(o.address.is_ipv6())].insert((o.interface.as_str(), o.address));
        }
    }
    ["net.ipv4.neigh.default", "net.ipv6.neigh.default"]
        .into_iter()
        .zip(groups)
        .zip(sysctls.neigh_gc_thresh2)
        .filter_map(|((name, g), thresh)| {
            let thresh = thresh?;
            (u64::try_from(g.len()).unwrap_or(u64::MAX) > thresh).then_some((name, g.len(), thresh))
        })
        .collect()
}

/// At start-up and on reload: check, and log the receive buffer cap once.
pub fn at_load(path: &Path, config: &Config) -> Result<(), LimitError> {
    let sysctls = Sysctls::read();
    check(path, config, &sysctls)?;
    for (prefix, groups, thresh) in neighbour_pressure(config, &sysctls) {
        tracing::warn!(
            "{groups} multicast output groups need as many neighbour entries, more than \
             {prefix}.gc_thresh2 ({thresh}): the kernel evicts and re-creates them while in use, \
             costing CPU on every send; raise {prefix}.gc_thresh2 and gc_thresh3 above {groups}"
        );
    }
    if let (Some((n, largest)), Some(max)) =
        (capped_receive_buffers(config, &sysctls), sysctls.rmem_max)
    {
        tracing::info!(
            flows = n,
            "net.core.rmem_max is {max}: {n} inputs ask for more (up to {largest} bytes); \
             the helper forces their size with CAP_NET_ADMIN, otherwise the kernel grants {max}"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(inputs: &[(&str, Option<&str>)]) -> Config {
        let mut text = String::from("[daemon]\ncores = [0]\n");
        for (i, (addr, source)) in inputs.iter().enumerate() {
            let source = source.map_or(String::new(), |s| format!(", source = \"{s}\""));
            text.push_str(&format!(
                "[[flow]]\nname = \"f{i}\"\ninput = {{ interface = \"d0\", address = \"{addr}\", port = {}{source} }}\noutputs = [{{ interface = \"d1\", address = \"239.9.9.9\", port = 6000 }}]\n",
                5000 + i
            ));
        }
        mcrelay_config::parse(&text, "t.toml").expect("valid")
    }

    const DEFAULTS: Sysctls = Sysctls {
        igmp_max_memberships: Some(20),
        igmp_max_msf: Some(10),
        mld_max_msf: Some(64),
        rmem_max: Some(212_992),
        neigh_gc_thresh2: [Some(512), Some(512)],
    };

    #[test]
    fn defaults_fit_any_number_of_flows() {
        let many: Vec<(String, Option<&str>)> = (0..300)
            .map(|i| (format!("239.10.{}.{}", i / 250, i % 250 + 1), None))
            .collect();
        let inputs: Vec<(&str, Option<&str>)> =
            many.iter().map(|(a, s)| (a.as_str(), *s)).collect();
        let c = config(&inputs);
        assert_eq!(check(Path::new("t.toml"), &c, &DEFAULTS), Ok(()));
    }

    #[test]
    fn a_zero_limit_names_the_sysctl_the_flows_and_the_fix() {
        let c = config(&[
            ("239.1.1.1", None),
            ("10.0.0.1", None),
            ("239.1.1.2", Some("10.9.9.9")),
            ("ff3e::1", Some("2001:db8::1")),
        ]);
        let no_groups = Sysctls {
            igmp_max_memberships: Some(0),
            ..DEFAULTS
        };
        let e = check(Path::new("/etc/mcrelay/mcrelay.toml"), &c, &no_groups).expect_err("0");
        assert_eq!(e.sysctl, "net.ipv4.igmp_max_memberships");
        assert_eq!(
            (e.flow.as_str(), e.others),
            ("f0", 1),
            "unicast f1 joins nothing"
        );
        let text = e.to_string();
        assert!(
            text.starts_with("/etc/mcrelay/mcrelay.toml: flow \"f0\" (and 1 more)"),
            "{text}"
        );
        assert!(
            text.contains("sysctl -w net.ipv4.igmp_max_memberships=1"),
            "{text}"
        );

        let no_v4_sources = Sysctls {
            igmp_max_msf: Some(0),
            ..DEFAULTS
        };
        let e = check(Path::new("t.toml"), &c, &no_v4_sources).expect_err("msf 0");
        assert_eq!(
            (e.sysctl, e.flow.as_str(), e.others),
            ("net.ipv4.igmp_max_msf", "f2", 0)
        );

        let no_v6_sources = Sysctls {
            mld_max_msf: Some(0),
            ..DEFAULTS
        };
        let e = check(Path::new("t.toml"), &c, &no_v6_sources).expect_err("mld 0");
        assert_eq!((e.sysctl, e.flow.as_str()), ("net.ipv6.mld_max_msf", "f3"));

        // Unreadable: not checked.
        let unknown = Sysctls::default();
        assert_eq!(check(Path::new("t.toml"), &c, &unknown), Ok(()));
    }

    #[test]
    fn receive_buffers_above_rmem_max_are_counted_once() {
        let c = config(&[("239.1.1.1", None), ("239.1.1.2", None)]);
        // The default receive_buffer_bytes is 4 MiB.
        assert_eq!(capped_receive_buffers(&c, &DEFAULTS), Some((2, 4 << 20)));
        let big = Sysctls {
            rmem_max: Some(8 << 20),
            ..DEFAULTS
        };
        assert_eq!(capped_receive_buffers(&c, &big), None);
    }

    #[test]
    fn more_output_groups_than_gc_thresh2_are_named() {
        let c = |n: usize| {
            let mut text = String::from("[daemon]\ncores = [0]\n");
            for i in 0..n {
                text.push_str(&format!(
                    "[[flow]]\nname = \"f{i}\"\ninput = {{ interface = \"d0\", address = \"239.1.{}.{}\", port = 5000 }}\noutputs = [{{ interface = \"d1\", address = \"239.2.{}.{}\", port = 6000 }}, {{ interface = \"d1\", address = \"10.0.0.9\", port = {} }}]\n",
                    i / 250, i % 250 + 1, i / 250, i % 250 + 1, 6001 + i
                ));
            }
            mcrelay_config::parse(&text, "t.toml").expect("valid")
        };
        assert!(
            neighbour_pressure(&c(512), &DEFAULTS).is_empty(),
            "unicast outputs not counted"
        );
        assert_eq!(
            neighbour_pressure(&c(513), &DEFAULTS),
            [("net.ipv4.neigh.default", 513, 512)]
        );
        let unreadable = Sysctls {
            neigh_gc_thresh2: [None, None],
            ..DEFAULTS
        };
        assert!(neighbour_pressure(&c(600), &unreadable).is_empty());
    }

    #[test]
    fn this_namespace_can_be_read() {
        // /proc/sys/net is there on any Linux with IPv4.
        assert!(Sysctls::read().igmp_max_memberships.is_some());
    }
}
