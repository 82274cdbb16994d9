//! File descriptors, budgeted up front. Each flow holds, per input (leg),
//! its ingress socket, a duplicate of it (the kernel drop counter's watch)
//! and, for a packet leg on a group, the socket holding its membership;
//! and one socket per output (a flow with `spread = N` holds its legs'
//! N times: each shard has its own); the process also needs a fixed set (stdio, the helper link, the
//! control and metrics listeners, netlink, the signal pipe, one io_uring
//! per worker) and a reserve that is never spent on flows: a config read
//! on reload, [`CONTROL_CLIENTS`] control clients and
//! [`METRICS_CONNECTIONS`] scrapes (the control socket and the metrics
//! listener take their limits from here, so this module depends on
//! neither). At start-up the soft
//! `RLIMIT_NOFILE` is raised to the hard one; then a config whose flows
//! don't fit under it is refused — at start, on reload and by `mcrelayd
//! check` — with the numbers and the limit to raise, instead of flows
//! failing one by one with `EMFILE` and the control socket locked out.

use std::io;
use std::path::Path;

use mcrelay_config::Config;
use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// Descriptors the process holds whatever the flows: stdio, the helper
/// link, the control and metrics listeners, netlink, the signal pipe and
/// a margin for the runtime.
const FIXED: u64 = 24;
/// Per worker: its io_uring and a margin for the ring's internals.
const PER_WORKER: u64 = 4;
/// Kept free for what must always work: a config read (1) and a full
/// house of control clients and scrapes, with room to spare.
const RESERVE: u64 = 8 + CONTROL_CLIENTS as u64 + METRICS_CONNECTIONS as u64;

/// Control clients served at once (`control::MAX_CLIENTS`); more are told
/// to retry and closed.
pub const CONTROL_CLIENTS: usize = 16;
/// /metrics connections served at once (`metrics::MAX_CONNECTIONS`).
pub const METRICS_CONNECTIONS: usize = 16;

/// What a config needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub flows: usize,
    /// Descriptors the flows hold: 2 per leg (3 for a packet leg on a
    /// group) per shard + outputs each.
    pub flow_fds: u64,
    /// Everything else, including the reserve.
    pub base_fds: u64,
}

impl Budget {
    pub fn of(config: &Config) -> Self {
        let workers = config.daemon.cores.as_ref().map_or_else(
            || std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
            Vec::len,
        );
        let flow_fds = config
            .flows
            .iter()
            .map(|f| {
                let legs: u64 = f
                    .inputs
                    .iter()
                    .map(|i| {
                        let membership = i.ingress != mcrelay_config::IngressKind::Socket
                            && i.address.is_multicast();
                        // An xdp leg also holds its UMEM's memfd and its
                        // program's bpf_link.
                        let xdp = i.ingress == mcrelay_config::IngressKind::Xdp;
                        2 + u64::from(membership) + 2 * u64::from(xdp)
                    })
                    .sum::<u64>()
                    .saturating_mul(u64::try_from(f.spread).unwrap_or(u64::MAX));
                // An xdp output also holds its AF_XDP socket and UMEM.
                let outputs: u64 = f
                    .outputs
                    .iter()
                    .map(|o| 1 + 2 * u64::from(o.egress == mcrelay_config::EgressKind::Xdp))
                    .sum();
                legs.saturating_add(outputs)
            })
            .fold(0u64, u64::saturating_add);
        Budget {
            flows: config.flows.len(),
            flow_fds,
            base_fds: FIXED + PER_WORKER * u64::try_from(workers).unwrap_or(u64::MAX) + RESERVE,
        }
    }

    pub fn total(&self) -> u64 {
        self.flow_fds.saturating_add(self.base_fds)
    }
}

/// The config needs more descriptors than the process may open.
#[derive(Debug, thiserror::Error)]
#[error(
    "{file}: {flows} flows need {need} file descriptors ({flow_fds} for the flows: 2 + one per output \
     each; {base_fds} for the daemon and the reserve that keeps reloads and the control socket working), \
     but the limit (RLIMIT_NOFILE) is {limit}; raise LimitNOFILE= in mcrelay.service to at least {need} \
     (or `ulimit -n {need}` before starting mcrelayd), or configure fewer flows or outputs"
)]
pub struct OverBudget {
    pub file: String,
    pub flows: usize,
    pub need: u64,
    pub flow_fds: u64,
    pub base_fds: u64,
    pub limit: u64,
}

/// Whether `config` fits under `limit` descriptors.
pub fn check(path: &Path, config: &Config, limit: u64) -> Result<Budget, OverBudget> {
    let budget = Budget::of(config);
    if budget.total() > limit {
        return Err(OverBudget {
            file: path.display().to_string(),
            flows: budget.flows,
            need: budget.total(),
            flow_fds: budget.flow_fds,
            base_fds: budget.base_fds,
            limit,
        });
    }
    Ok(budget)
}

/// The soft and hard `RLIMIT_NOFILE`.
pub fn limits() -> io::Result<(u64, u64)> {
    Ok(getrlimit(Resource::RLIMIT_NOFILE)?)
}

/// Raise the soft `RLIMIT_NOFILE` to the hard limit (systemd starts a
/// service with a soft limit of 1024 whatever `LimitNOFILE=` allows, for
/// select(2)'s sake, which mcrelay doesn't use). Returns the soft limit now
/// in force. The helper, started after this, inherits it.
pub fn raise_limit() -> io::Result<u64> {
    let (soft, hard) = limits()?;
    if soft >= hard {
        return Ok(soft);
    }
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    Ok(hard)
}

/// At start-up: raise the soft limit, then check the config against it.
pub fn at_start(path: &Path, config: &Config) -> Result<(), AtStartError> {
    let limit = raise_limit().map_err(AtStartError::RaiseLimit)?;
    let budget = check(path, config, limit)?;
    tracing::info!(
        need = budget.total(),
        limit,
        "file descriptors: {} for {} flows, {} for the daemon and its reserve",
        budget.flow_fds,
        budget.flows,
        budget.base_fds
    );
    Ok(())
}

/// Why the descriptor check at start-up failed.
#[derive(Debug, thiserror::Error)]
pub enum AtStartError {
    #[error("raising RLIMIT_NOFILE")]
    RaiseLimit(#[source] io::Error),
    #[error(transparent)]
    OverBudget(#[from] OverBudget),
}

/// On reload: check the new config against the limit in force.
pub fn at_reload(path: &Path, config: &Config) -> Result<(), String> {
    let limit = limits().map_or(u64::MAX, |(soft, _)| soft);
    check(path, config, limit)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(flows: usize, outputs: usize) -> Config {
        let mut text = String::from("[daemon]\ncores = [0]\n");
        for i in 0..flows {
            text.push_str(&format!(
                "[[flow]]\nname = \"f{i}\"\ninput = {{ interface = \"d0\", address = \"239.1.{}.{}\", port = 5000 }}\noutputs = [",
                i / 200,
                i % 200 + 1
            ));
            for o in 0..outputs {
                text.push_str(&format!(
                    "{{ interface = \"d0\", address = \"239.2.{}.{}\", port = {} }},",
                    i / 200,
                    i % 200 + 1,
                    6000 + o
                ));
            }
            text.push_str("]\n");
        }
        mcrelay_config::parse(&text, "t.toml").expect("valid")
    }

    #[test]
    fn each_flow_costs_two_plus_its_outputs() {
        let b = Budget::of(&config(10, 3));
        assert_eq!(b.flows, 10);
        assert_eq!(b.flow_fds, 50);
        assert_eq!(b.base_fds, FIXED + PER_WORKER + RESERVE);
    }

    #[test]
    fn each_leg_costs_two_and_a_membership_one_more() {
        let text = "[[flow]]\nname = \"r\"\ninputs = [\
                    { interface = \"a\", address = \"239.1.1.1\", port = 5000 }, \
                    { interface = \"b\", address = \"239.1.1.1\", port = 5000, ingress = \"packet\" }, \
                    { interface = \"c\", address = \"10.0.0.1\", port = 5000, ingress = \"packet\" }]\n\
                    redundancy = \"failover\"\n\
                    outputs = [{ interface = \"d\", address = \"239.2.2.2\", port = 5000 }]\n";
        let config = mcrelay_config::parse(text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
        // 2 + 3 (packet, group) + 2 (packet, unicast) + 1 output.
        assert_eq!(Budget::of(&config).flow_fds, 8);
    }

    #[test]
    fn an_xdp_leg_adds_its_umem_and_link() {
        let text = "[[flow]]\nname = \"x\"\n\
                    input = { interface = \"a\", address = \"239.1.1.1\", port = 5000, ingress = \"xdp\" }\n\
                    outputs = [{ interface = \"d\", address = \"239.2.2.2\", port = 5000 }]\n";
        let config = mcrelay_config::parse(text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
        // 2 (the AF_XDP socket and its watch) + membership + UMEM + link
        // + 1 output.
        assert_eq!(Budget::of(&config).flow_fds, 6);
    }

    #[test]
    fn an_xdp_output_adds_its_af_xdp_socket_and_umem() {
        let text = "[[flow]]\nname = \"x\"\n\
                    input = { interface = \"a\", address = \"239.1.1.1\", port = 5000 }\n\
                    outputs = [{ interface = \"d\", address = \"239.2.2.2\", port = 5000, egress = \"xdp\" }]\n";
        let config = mcrelay_config::parse(text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
        // 2 (socket and its watch) + the output's UDP socket, AF_XDP
        // socket and UMEM.
        assert_eq!(Budget::of(&config).flow_fds, 5);
    }

    #[test]
    fn each_shard_of_a_spread_flow_holds_its_own_legs() {
        let text = "[[flow]]\nname = \"s\"\nspread = 2\n\
                    input = { interface = \"a\", address = \"239.1.1.1\", port = 5000 }\n\
                    outputs = [{ interface = \"d\", address = \"239.2.2.2\", port = 5000 }, \
                    { interface = \"d\", address = \"239.2.2.2\", port = 5001 }]\n";
        let config = mcrelay_config::parse(text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
        // 2 shards x 2 (socket and its watch) + 2 outputs.
        assert_eq!(Budget::of(&config).flow_fds, 6);
    }

    #[test]
    fn over_the_limit_names_the_numbers_and_the_fix() {
        let c = config(400, 1);
        let need = 1200 + FIXED + PER_WORKER + RESERVE;
        let e = check(Path::new("/etc/mcrelay/mcrelay.toml"), &c, 1024).expect_err("over");
        let text = e.to_string();
        assert!(
            text.starts_with("/etc/mcrelay/mcrelay.toml: 400 flows need "),
            "{text}"
        );
        assert!(
            text.contains(&format!("need {need} file descriptors")),
            "{text}"
        );
        assert!(text.contains("the limit (RLIMIT_NOFILE) is 1024"), "{text}");
        assert!(
            text.contains(&format!(
                "LimitNOFILE= in mcrelay.service to at least {need}"
            )),
            "{text}"
        );
        assert!(check(Path::new("x"), &c, need).is_ok());
    }
}
