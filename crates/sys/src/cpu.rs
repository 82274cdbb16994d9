//! CPU affinity: which CPUs the calling thread may use, and pinning it to
//! one of them (`sched_getaffinity` / `sched_setaffinity` through nix).

use std::io;

use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;

/// CPUs in the calling thread's affinity mask, ascending.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // Pid 0 is the calling thread.
    let set = sched_getaffinity(Pid::from_raw(0))?;
    Ok((0..CpuSet::count())
        .filter(|&cpu| set.is_set(cpu).unwrap_or(false))
        .collect())
}

/// Pin the calling thread to `cpu`.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    let mut set = CpuSet::new();
    set.set(cpu).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("CPU {cpu} is out of range"),
        )
    })?;
    sched_setaffinity(Pid::from_raw(0), &set)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_to_an_allowed_cpu() {
        let cpus = allowed_cpus().expect("affinity");
        assert!(!cpus.is_empty());
        std::thread::spawn(move || {
            pin_current_thread(cpus[0]).expect("pin");
            assert_eq!(allowed_cpus().expect("affinity"), vec![cpus[0]]);
        })
        .join()
        .expect("thread");
        let e = pin_current_thread(100_000).expect_err("out of range");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
