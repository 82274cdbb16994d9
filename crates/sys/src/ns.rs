//! Network namespaces of `ip netns`.

use std::fs::File;
use std::io;

use nix::sched::{CloneFlags, setns};

/// Move the calling thread into the network namespace `name` (of `ip
/// netns`). Sockets it opens afterwards belong to that namespace for good;
/// other threads are not affected.
pub fn enter_netns(name: &str) -> io::Result<()> {
    let path = format!("/run/netns/{name}");
    let ns = File::open(&path).map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))?;
    setns(&ns, CloneFlags::CLONE_NEWNET).map_err(|errno| {
        let e = io::Error::from(errno);
        io::Error::new(e.kind(), format!("setns {path}: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entering_a_missing_namespace_fails_cleanly() {
        let e = enter_netns("mcrelay-sys-no-such-namespace").unwrap_err();
        assert!(e.to_string().contains("/run/netns/"), "{e}");
    }
}
