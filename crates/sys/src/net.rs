//! Network interfaces by name.

use std::io;

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
        let e = interface_index("a\0b").expect_err("nul");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
