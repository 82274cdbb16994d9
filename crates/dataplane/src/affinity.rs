//! CPU affinity: which CPUs the process may use, and pinning a worker
//! thread to one of them.
#![allow(unsafe_code)]

use std::io;
use std::mem::size_of;

/// CPUs in the calling thread's affinity mask, ascending.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: `cpu_set_t` is plain data for which all-zero is valid.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a live `cpu_set_t` of the size passed; pid 0 is the
    // calling thread.
    let rc = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &raw mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let max = 8 * size_of::<libc::cpu_set_t>();
    // SAFETY: `CPU_ISSET` reads `set`, which is initialised, and `cpu < max`
    // is within its bit range.
    Ok((0..max)
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect())
}

/// Pin the calling thread to `cpu`.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    if cpu >= 8 * size_of::<libc::cpu_set_t>() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("CPU {cpu} is out of range"),
        ));
    }
    // SAFETY: all-zero is a valid empty `cpu_set_t`.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is within the set's bit range (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a live, initialised `cpu_set_t` of the size passed.
    let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
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
        assert!(pin_current_thread(100_000).is_err());
    }
}
