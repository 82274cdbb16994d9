//! Shell completions of both binaries (`completions <shell>`, hidden, used
//! by the Debian package): they generate for bash, zsh and fish, name the
//! visible subcommands and not the hidden ones, and the bash one, sourced
//! into a real bash, completes what a user types.

mod common;

use std::path::Path;
use std::process::Command;

use common::{MCRELAYD, mcrelayctl};

fn script(bin: &Path, shell: &str) -> String {
    let out = Command::new(bin)
        .args(["completions", shell])
        .output()
        .expect("run completions");
    assert!(
        out.status.success(),
        "{} completions {shell}: {}",
        bin.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// What bash offers for the command line `words` (the last one being
/// completed), with `bin`'s completion script sourced.
fn bash_completes(bin: &Path, name: &str, words: &[&str]) -> Vec<String> {
    let script = script(bin, "bash");
    let line = words.join(" ");
    let program = format!(
        "{script}\nCOMP_WORDS=({line}); COMP_CWORD={}; COMP_LINE='{line}'; COMP_POINT=${{#COMP_LINE}}\n\
         _{name} {name} \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"\n\
         printf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        words.len() - 1
    );
    let out = Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &program])
        .output()
        .expect("bash");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut offered: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    offered.sort();
    offered
}

#[test]
fn both_binaries_generate_completions_for_bash_zsh_and_fish() {
    let ctl = mcrelayctl();
    for (bin, name, visible, hidden) in [
        (
            Path::new(MCRELAYD),
            "mcrelayd",
            &["check", "demo", "config", "receive"][..],
            &["helper", "man", "completions"][..],
        ),
        (
            ctl.as_path(),
            "mcrelayctl",
            &[
                "status", "flows", "stats", "reload", "top", "socket", "plain",
            ][..],
            &["man", "completions"][..],
        ),
    ] {
        for (shell, marker) in [
            ("bash", format!("complete -F _{name}")),
            ("zsh", format!("#compdef {name}")),
            ("fish", format!("complete -c {name}")),
        ] {
            let s = script(bin, shell);
            assert!(s.contains(&marker), "{name} {shell}: no {marker:?}");
            for word in visible {
                assert!(s.contains(word), "{name} {shell}: {word} missing");
            }
            if shell == "bash" {
                let top = s
                    .lines()
                    .find(|l| l.trim_start().starts_with("opts=\"-h -V"))
                    .unwrap_or_else(|| panic!("no top-level opts in {s}"));
                for word in hidden {
                    assert!(
                        !top.split(['"', ' ']).any(|w| w == *word),
                        "{name}: hidden {word} offered: {top}"
                    );
                }
            }
        }
        // The bash script is valid bash.
        let check = Command::new("bash")
            .args(["-n", "-c", &script(bin, "bash")])
            .output()
            .expect("bash -n");
        assert!(
            check.status.success(),
            "{}",
            String::from_utf8_lossy(&check.stderr)
        );
    }
}

#[test]
fn bash_completes_subcommands_and_options() {
    let ctl = mcrelayctl();
    assert_eq!(
        bash_completes(&ctl, "mcrelayctl", &["mcrelayctl", "st"]),
        ["standby", "stats", "status"]
    );
    assert_eq!(
        bash_completes(&ctl, "mcrelayctl", &["mcrelayctl", "top", "--p"]),
        ["--plain"]
    );
    assert_eq!(
        bash_completes(Path::new(MCRELAYD), "mcrelayd", &["mcrelayd", "--gs"]),
        ["--gso"]
    );
    assert_eq!(
        bash_completes(Path::new(MCRELAYD), "mcrelayd", &["mcrelayd", "--gso", ""]),
        ["off", "on"]
    );
}
