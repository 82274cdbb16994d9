//! Which worker runs a flow. Pure: the worker CPUs and the flows already
//! placed in, a worker index out. A flow's `core` pins it to the worker on
//! that CPU; any other flow goes to the worker with the least load, where a
//! flow weighs its outputs + 1 (ties go to the lowest worker). At start the
//! pinned flows are placed first, so the free ones fill in around them. A
//! flow keeps its worker for as long as it is configured (a paused flow
//! resumes on the same one).
//!
//! A flow with `spread = N` is N shards (shard `k` sends to outputs `k`,
//! `k + N`, ...): each goes to a different worker, shard 0 (the largest) to
//! the least loaded, shard 1 to the next, and so on, each weighing its own
//! outputs + the flow's legs (every shard receives every leg).

use mcrelay_config::{Config, Flow};

/// Why a flow, or the daemon, has no worker.
#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    /// A flow's `core` is not one of the worker CPUs.
    #[error(
        "flow {flow:?}: core {core} is not one of the worker CPUs {cpus:?}; \
         set core to one of them or add it to daemon.cores"
    )]
    CoreNotAWorker {
        flow: String,
        core: usize,
        cpus: Vec<usize>,
    },
    /// A flow's `spread` asks for more workers than there are.
    #[error(
        "flow {flow:?}: spread {spread} needs {spread} workers, but there are {workers}; \
         lower spread to at most {workers}, or add worker CPUs to daemon.cores"
    )]
    SpreadOverWorkers {
        flow: String,
        spread: usize,
        workers: usize,
    },
    /// There are no worker CPUs at all.
    #[error("no worker CPUs")]
    NoWorkers,
    /// `daemon.cores` names a CPU this process may not run on.
    #[error(
        "daemon.cores: CPU {cpu} does not exist or is not in this process's affinity mask \
         (allowed: {allowed:?}); list only allowed CPUs"
    )]
    CoreNotAllowed { cpu: usize, allowed: Vec<usize> },
    /// The affinity mask could not be read.
    #[error("reading the CPU affinity mask: {0}")]
    Affinity(#[source] std::io::Error),
}

/// The worker CPUs: `daemon.cores`, each checked against the affinity
/// mask, or every CPU in the mask.
pub fn worker_cpus(config: &Config) -> Result<Vec<usize>, PlacementError> {
    let allowed = mcrelay_uring::affinity::allowed_cpus().map_err(PlacementError::Affinity)?;
    cores_within(config.daemon.cores.as_deref(), allowed)
}

/// `cores` (every one of them in `allowed`), or all of `allowed`.
fn cores_within(
    cores: Option<&[usize]>,
    allowed: Vec<usize>,
) -> Result<Vec<usize>, PlacementError> {
    let Some(cores) = cores else {
        return Ok(allowed);
    };
    match cores.iter().find(|cpu| !allowed.contains(cpu)) {
        Some(&cpu) => Err(PlacementError::CoreNotAllowed { cpu, allowed }),
        None => Ok(cores.to_vec()),
    }
}

/// Whether every flow's `spread` fits on `workers` workers: a reload that
/// asks for more is refused whole, before anything is touched.
pub fn spread_fits(config: &Config, workers: usize) -> Result<(), PlacementError> {
    match config.flows.iter().find(|f| f.spread > workers) {
        Some(f) => Err(PlacementError::SpreadOverWorkers {
            flow: f.name.clone(),
            spread: f.spread,
            workers,
        }),
        None => Ok(()),
    }
}

/// `flows` in the order start places them: those with a `core` first, then
/// the others, each group in its given order.
pub fn start_order(flows: &[Flow]) -> impl Iterator<Item = &Flow> {
    let pinned = flows.iter().filter(|f| f.core.is_some());
    pinned.chain(flows.iter().filter(|f| f.core.is_none()))
}

/// The load of every worker, and where the next flow goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement<'a> {
    cpus: &'a [usize],
    /// Per worker: outputs + legs (inputs) of each flow on it.
    load: Vec<usize>,
}

impl<'a> Placement<'a> {
    /// No flow placed yet on the workers of `cpus` (worker `i` runs on
    /// `cpus[i]`).
    pub fn new(cpus: &'a [usize]) -> Self {
        Self {
            cpus,
            load: vec![0; cpus.len()],
        }
    }

    /// `placed` (each flow with its workers, shard `k` on the `k`th)
    /// already on the workers.
    pub fn with<'f>(
        cpus: &'a [usize],
        placed: impl IntoIterator<Item = (&'f [usize], &'f Flow)>,
    ) -> Self {
        let mut p = Self::new(cpus);
        for (workers, flow) in placed {
            p.count(workers, flow);
        }
        p
    }

    /// The workers `flow`'s shards go to (one for a flow without
    /// `spread`), counted in the load from now on.
    pub fn place(&mut self, flow: &Flow) -> Result<Vec<usize>, PlacementError> {
        let workers = if flow.spread > 1 {
            self.pick_spread(flow)?
        } else {
            vec![self.pick(flow)?]
        };
        self.count(&workers, flow);
        Ok(workers)
    }

    fn count(&mut self, workers: &[usize], flow: &Flow) {
        for (shard, &w) in workers.iter().enumerate() {
            if let Some(load) = self.load.get_mut(w) {
                *load += weight(flow, shard, workers.len());
            }
        }
    }

    /// `flow.spread` distinct workers, the least loaded first (ties to
    /// the lowest).
    fn pick_spread(&self, flow: &Flow) -> Result<Vec<usize>, PlacementError> {
        if flow.spread > self.cpus.len() {
            return Err(PlacementError::SpreadOverWorkers {
                flow: flow.name.clone(),
                spread: flow.spread,
                workers: self.cpus.len(),
            });
        }
        let mut order: Vec<usize> = (0..self.cpus.len()).collect();
        order.sort_by_key(|&w| (self.load[w], w));
        order.truncate(flow.spread);
        Ok(order)
    }

    /// `flow`'s `core` picks its worker; otherwise the worker with the
    /// least load.
    fn pick(&self, flow: &Flow) -> Result<usize, PlacementError> {
        match flow.core {
            Some(core) => self.cpus.iter().position(|&c| c == core).ok_or_else(|| {
                PlacementError::CoreNotAWorker {
                    flow: flow.name.clone(),
                    core,
                    cpus: self.cpus.to_vec(),
                }
            }),
            None => (0..self.cpus.len())
                .min_by_key(|&w| self.load[w])
                .ok_or(PlacementError::NoWorkers),
        }
    }
}

/// What shard `shard` of `flow`, cut in `shards`, adds to its worker's
/// load.
fn weight(flow: &Flow, shard: usize, shards: usize) -> usize {
    // A receive per leg, a send per output of the shard.
    let outputs = (0..flow.outputs.len())
        .filter(|&i| i % shards.max(1) == shard)
        .count();
    outputs + flow.inputs.len()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A flow named `name` with `outputs` outputs, pinned to `core` if any.
    pub fn flow(name: &str, outputs: usize, core: Option<usize>) -> Flow {
        flow_on(name, 5000, outputs, core)
    }

    /// [`flow`] with input port `port`, parsed from TOML as an operator
    /// would write it.
    pub fn flow_on(name: &str, port: u16, outputs: usize, core: Option<usize>) -> Flow {
        let outputs: Vec<String> = (0..outputs)
            .map(|i| {
                format!(
                    "{{ interface = \"eth1\", address = \"239.2.2.2\", port = {} }}",
                    6000 + i
                )
            })
            .collect();
        let core = core.map(|c| format!("core = {c}\n")).unwrap_or_default();
        let text = format!(
            "[[flow]]\nname = \"{name}\"\n\
             input = {{ interface = \"eth0\", address = \"239.1.1.1\", port = {port} }}\n\
             outputs = [ {} ]\n{core}",
            outputs.join(", ")
        );
        let config = mcrelay_config::parse(&text, "test").unwrap_or_else(|e| panic!("{e}\n{text}"));
        config.flows.iter().next().cloned().expect("one flow")
    }

    /// [`flow`] spread over `spread` workers.
    pub fn spread_flow(name: &str, outputs: usize, spread: usize) -> Flow {
        let mut f = flow(name, outputs, None);
        f.spread = spread;
        f
    }

    /// A flow with `legs` inputs (failover) and one output.
    pub fn flow_with_legs(name: &str, legs: usize) -> Flow {
        let legs: Vec<String> = (0..legs)
            .map(|i| format!("{{ interface = \"eth{i}\", address = \"239.1.1.1\", port = 5000 }}"))
            .collect();
        let text = format!(
            "[[flow]]\nname = \"{name}\"\ninputs = [{}]\nredundancy = \"failover\"\n\
             outputs = [{{ interface = \"eth9\", address = \"239.2.2.2\", port = 6000 }}]\n",
            legs.join(", ")
        );
        let config = mcrelay_config::parse(&text, "test").unwrap_or_else(|e| panic!("{e}\n{text}"));
        config.flows.iter().next().cloned().expect("one flow")
    }

    #[test]
    fn each_leg_weighs_like_an_output() {
        let cpus = [0, 1];
        let mut p = Placement::new(&cpus);
        // Four legs and an output weigh 5: the next four one-leg,
        // one-output flows (2 each) balance it 5 to 4, then 5 to 6.
        assert_eq!(p.place(&flow_with_legs("legs", 4)).unwrap(), [0]);
        assert_eq!(p.place(&flow("a", 1, None)).unwrap(), [1]);
        assert_eq!(p.place(&flow("b", 1, None)).unwrap(), [1]);
        assert_eq!(p.place(&flow("c", 1, None)).unwrap(), [1]);
        assert_eq!(p.place(&flow("d", 1, None)).unwrap(), [0]);
    }

    #[test]
    fn core_pins_a_flow_to_the_worker_on_that_cpu() {
        let cpus = [2, 5, 7];
        let mut p = Placement::new(&cpus);
        assert_eq!(p.place(&flow("a", 1, Some(7))).unwrap(), [2]);
        assert_eq!(
            p.place(&flow("b", 1, Some(7))).unwrap(),
            [2],
            "load ignored"
        );
        assert_eq!(p.place(&flow("c", 1, Some(2))).unwrap(), [0]);
    }

    #[test]
    fn a_core_that_is_not_a_worker_cpu_is_refused_by_name() {
        let cpus = [0, 1];
        let e = Placement::new(&cpus)
            .place(&flow("video", 1, Some(3)))
            .unwrap_err();
        assert!(matches!(e, PlacementError::CoreNotAWorker { core: 3, .. }));
        let text = e.to_string();
        assert!(
            text.contains("\"video\"") && text.contains("[0, 1]"),
            "{text}"
        );
    }

    #[test]
    fn a_free_flow_goes_to_the_worker_with_the_fewest_outputs() {
        let cpus = [0, 1, 2];
        let mut p = Placement::new(&cpus);
        // Ties go to the lowest worker.
        assert_eq!(p.place(&flow("a", 4, None)).unwrap(), [0]); // loads 5 0 0
        assert_eq!(p.place(&flow("b", 1, None)).unwrap(), [1]); // 5 2 0
        assert_eq!(p.place(&flow("c", 2, None)).unwrap(), [2]); // 5 2 3
        assert_eq!(p.place(&flow("d", 1, None)).unwrap(), [1]); // 5 4 3
        assert_eq!(p.place(&flow("e", 1, None)).unwrap(), [2]); // 5 4 5
        assert_eq!(p.place(&flow("f", 1, None)).unwrap(), [1]); // 5 6 5
        assert_eq!(p.place(&flow("g", 1, None)).unwrap(), [0]); // 7 6 5
        assert_eq!(p.place(&flow("h", 2, None)).unwrap(), [2]); // 7 6 8
    }

    #[test]
    fn pinned_flows_count_in_the_load_of_their_worker() {
        let cpus = [0, 1];
        let mut p = Placement::new(&cpus);
        assert_eq!(p.place(&flow("big", 8, Some(0))).unwrap(), [0]);
        for name in ["a", "b", "c"] {
            assert_eq!(p.place(&flow(name, 1, None)).unwrap(), [1], "{name}");
        }
    }

    #[test]
    fn with_counts_flows_already_placed() {
        let cpus = [0, 1];
        let (a, b) = (flow("a", 3, None), flow("b", 1, None));
        let mut p = Placement::with(&cpus, [(&[0][..], &a), (&[1][..], &b)]);
        assert_eq!(p.place(&flow("c", 1, None)).unwrap(), [1]);
        // A worker index out of range (never produced) is ignored, not a
        // panic.
        let p = Placement::with(&cpus, [(&[9][..], &a)]);
        assert_eq!(p, Placement::new(&cpus));
    }

    #[test]
    fn start_places_pinned_flows_first_keeping_the_order_within_each_group() {
        let flows = [
            flow("a", 1, None),
            flow("b", 1, Some(1)),
            flow("c", 1, None),
            flow("d", 1, Some(0)),
        ];
        let order: Vec<&str> = start_order(&flows).map(|f| f.name.as_str()).collect();
        assert_eq!(order, ["b", "d", "a", "c"]);
    }

    #[test]
    fn a_spread_flow_gets_distinct_workers_least_loaded_first() {
        let cpus = [0, 1, 2];
        let mut p = Placement::new(&cpus);
        assert_eq!(p.place(&flow("a", 3, None)).unwrap(), [0]); // 4 0 0
        assert_eq!(p.place(&flow("b", 1, None)).unwrap(), [1]); // 4 2 0
        // Shard 0 (outputs 0, 2, 4, 6: weight 5) to the idle worker 2,
        // shard 1 (outputs 1, 3, 5: weight 4) to worker 1.
        let wide = spread_flow("wide", 7, 2);
        assert_eq!(p.place(&wide).unwrap(), [2, 1]); // 4 6 5
        assert_eq!(p.place(&flow("c", 1, None)).unwrap(), [0]); // 6 6 5
        // Spread over every worker: each once.
        let mut all = p.place(&spread_flow("all", 3, 3)).unwrap();
        all.sort_unstable();
        assert_eq!(all, [0, 1, 2]);
        // `with` counts each shard on its own worker: the same loads.
        let placed = [
            (vec![0], flow("a", 3, None)),
            (vec![1], flow("b", 1, None)),
            (vec![2, 1], wide),
        ];
        let q = Placement::with(&cpus, placed.iter().map(|(w, f)| (&w[..], f)));
        assert_eq!(q.load, [4, 6, 5]);
    }

    #[test]
    fn spread_beyond_the_workers_is_refused_naming_both_numbers() {
        let cpus = [0, 1];
        let e = Placement::new(&cpus)
            .place(&spread_flow("wide", 8, 3))
            .unwrap_err();
        assert!(matches!(
            e,
            PlacementError::SpreadOverWorkers {
                spread: 3,
                workers: 2,
                ..
            }
        ));
        let text = e.to_string();
        assert!(
            text.contains("\"wide\": spread 3 needs 3 workers, but there are 2"),
            "{text}"
        );
    }

    #[test]
    fn spread_fits_checks_every_flow_against_the_worker_count() {
        let text = "[[flow]]\nname = \"a\"\nspread = 2\n\
                    input = { interface = \"eth0\", address = \"239.1.1.1\", port = 5000 }\n\
                    outputs = [{ interface = \"eth1\", address = \"239.2.2.2\", port = 6000 }, \
                    { interface = \"eth1\", address = \"239.2.2.2\", port = 6001 }]\n";
        let config = mcrelay_config::parse(text, "t").unwrap_or_else(|e| panic!("{e}"));
        assert!(spread_fits(&config, 2).is_ok());
        let e = spread_fits(&config, 1).unwrap_err();
        assert!(
            e.to_string()
                .contains("\"a\": spread 2 needs 2 workers, but there are 1"),
            "{e}"
        );
    }

    #[test]
    fn no_worker_cpus_is_an_error_not_a_panic() {
        let e = Placement::new(&[]).place(&flow("a", 1, None)).unwrap_err();
        assert!(matches!(e, PlacementError::NoWorkers));
    }

    #[test]
    fn daemon_cores_must_be_allowed() {
        assert_eq!(cores_within(None, vec![0, 1]).unwrap(), [0, 1]);
        assert_eq!(cores_within(Some(&[1]), vec![0, 1]).unwrap(), [1]);
        let e = cores_within(Some(&[1, 4]), vec![0, 1]).unwrap_err();
        assert!(matches!(e, PlacementError::CoreNotAllowed { cpu: 4, .. }));
        assert!(e.to_string().starts_with("daemon.cores: CPU 4"), "{e}");
    }
}
