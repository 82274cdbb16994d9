//! What mcrelay's integration tests share instead of copying: entering a
//! network namespace (through `mcrelay_sys::ns`, no raw `setns` in test
//! files), finding a free loopback port, delaying a namespace's link
//! ([`delay::DelayedLink`], through this crate's `nfdelay` binary: this
//! kernel has no netem), counting allocations ([`counting`], the
//! no-allocation tests' allocator), the `_total` series of a `/metrics`
//! read and which went down ([`metrics`]) and, with feature `uring`, loopback
//! flows for the io_uring driver's tests (`loopback`). A dev-dependency of the crates whose
//! tests use it; nothing in a product build links it.
#![deny(unsafe_code)]

pub mod counting;
pub mod delay;
#[cfg(feature = "uring")]
pub mod loopback;
pub mod metrics;

use std::net::UdpSocket;

/// A UDP port on 127.0.0.1 that nobody uses right now (the kernel's pick
/// for an ephemeral bind, released again).
pub fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("bind an ephemeral loopback port")
        .port()
}

/// Move the calling thread into network namespace `name` (of `ip netns`);
/// sockets it opens afterwards live there. Panics with the reason if it
/// can't (a test's setup failed).
pub fn enter_netns(name: &str) {
    if let Err(e) = mcrelay_sys::ns::enter_netns(name) {
        panic!("enter network namespace {name}: {e}");
    }
}

/// Run `f` on a new thread that has entered network namespace `name`, and
/// return what it returns; the calling thread stays where it is.
pub fn in_netns<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let name = name.to_owned();
    std::thread::spawn(move || {
        enter_netns(&name);
        f()
    })
    .join()
    .expect("the namespace thread panicked")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_port_can_be_bound() {
        let port = free_udp_port();
        assert_ne!(port, 0);
        UdpSocket::bind(("127.0.0.1", port)).expect("the free port binds");
    }

    #[test]
    #[should_panic(expected = "/run/netns/")]
    fn entering_a_missing_namespace_panics_with_the_reason() {
        enter_netns("mcrelay-testkit-no-such-namespace");
    }
}
