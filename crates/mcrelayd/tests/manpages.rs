//! The manual pages are generated, not written: mcrelayd(8) from the same
//! clap definitions as `--help`, mcrelay.toml(5) from docs/configuration.md.
//! These tests check that what is generated is a well-formed page that
//! names every option, and that groff (when installed) renders it cleanly.

use std::process::{Command, Stdio};

fn man(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_mcrelayd"))
        .arg("man")
        .args(args)
        .output()
        .expect("run mcrelayd man");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("roff is UTF-8")
}

/// Renders with groff's warnings on; returns the plain text. `None` when
/// groff isn't installed (the structural checks still run).
pub fn groff_text(roff: &str) -> Option<String> {
    let mut child = Command::new("groff")
        .args(["-man", "-Tutf8", "-ww", "-z"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    use std::io::Write;
    child.stdin.take()?.write_all(roff.as_bytes()).ok()?;
    let out = child.wait_with_output().ok()?;
    Some(String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn mcrelayd_8_names_every_option_of_help() {
    let page = man(&[]);
    assert!(page.contains(".TH mcrelayd 8"), "{page}");
    for option in ["--config", "--receive", "--gso", "--version"] {
        let roff = option.replace('-', "\\-");
        assert!(page.contains(&roff), "{option} missing from mcrelayd(8)");
    }
    assert!(page.contains("check"), "the check subcommand is documented");
    if let Some(warnings) = groff_text(&page) {
        assert!(warnings.trim().is_empty(), "groff warnings: {warnings}");
    }
}

#[test]
fn mcrelay_toml_5_covers_the_configuration_reference() {
    let page = man(&["--config-file"]);
    assert!(page.starts_with(".TH MCRELAY.TOML 5"), "{}", &page[..80]);
    for section in [
        "[daemon]",
        "[pools]",
        "[[flow]]",
        "ingress",
        "control_socket",
    ] {
        assert!(
            page.contains(section),
            "{section} missing from mcrelay.toml(5)"
        );
    }
    if let Some(warnings) = groff_text(&page) {
        assert!(warnings.trim().is_empty(), "groff warnings: {warnings}");
    }
}
