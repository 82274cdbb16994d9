//! mcrelayctl(8) is generated from the same clap definitions as `--help`.

use std::process::Command;

#[test]
fn mcrelayctl_8_names_every_subcommand() {
    let out = Command::new(env!("CARGO_BIN_EXE_mcrelayctl"))
        .arg("man")
        .output()
        .expect("run mcrelayctl man");
    assert!(out.status.success());
    let page = String::from_utf8(out.stdout).expect("UTF-8");
    assert!(page.contains(".TH mcrelayctl 8"), "{page}");
    for cmd in [
        "status",
        "flows",
        "stats",
        "reload",
        "top",
        "standby",
        "active",
        "\\-\\-socket",
        "\\-\\-json",
    ] {
        assert!(page.contains(cmd), "{cmd} missing from mcrelayctl(8)");
    }
    assert!(
        !page.contains("mcrelayctl\\-man"),
        "the hidden man command stays hidden"
    );
}
