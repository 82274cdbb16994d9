//! Network interfaces by name.

use std::io;
use std::net::{IpAddr, SocketAddr};

/// The index of a network interface, or a clear error when it is missing
/// (`NotFound`, naming the interface) or its name can't be one (`NUL`).
pub fn interface_index(name: &str) -> io::Result<u32> {
    if name.as_bytes().contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("interface name {name:?} contains NUL"),
        ));
    }
    nix::net::if_::if_nametoindex(name).map_err(|errno| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "interface {name:?} does not exist: {}",
                io::Error::from(errno)
            ),
        )
    })
}

/// The index of the interface that has address `addr` (`getifaddrs`).
pub fn index_of_address(addr: IpAddr) -> io::Result<u32> {
    let wanted = SocketAddr::new(addr, 0);
    let name = nix::ifaddrs::getifaddrs()?
        .find(|ifa| {
            ifa.address.as_ref().is_some_and(|a| {
                let ip = a.as_sockaddr_in().map(|v4| IpAddr::V4(v4.ip()));
                let ip = ip.or_else(|| a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())));
                ip.map(|ip| SocketAddr::new(ip, 0)) == Some(wanted)
            })
        })
        .map(|ifa| ifa.interface_name)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("no interface has address {addr}"),
            )
        })?;
    Ok(nix::net::if_::if_nametoindex(name.as_str())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_has_an_index_and_a_missing_name_says_so() {
        assert!(interface_index("lo").expect("lo") > 0);
        let e = interface_index("mcrelay-no-such0").expect_err("missing");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(
            e.to_string()
                .contains("\"mcrelay-no-such0\" does not exist"),
            "{e}"
        );
        assert_eq!(
            index_of_address(IpAddr::from([127, 0, 0, 1])).ok(),
            Some(interface_index("lo").expect("lo"))
        );
        let e = index_of_address(IpAddr::from([192, 0, 2, 123])).expect_err("nobody's");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        let e = interface_index("a\0b").expect_err("nul");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
