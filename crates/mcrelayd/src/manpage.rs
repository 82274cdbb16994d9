//! Manual pages, generated so they can't drift from what they describe:
//! mcrelayd(8) from the same clap definitions as `--help`, and
//! mcrelay.toml(5) from `docs/configuration.md`, compiled in and turned
//! into roff by the small converter below (headings, paragraphs, lists,
//! code blocks and tables; inline code in bold).

use std::io::{self, Write};

/// The configuration reference, as written for the docs.
const CONFIGURATION_MD: &str = include_str!("../../../docs/configuration.md");

/// mcrelay.toml(5) in roff.
pub fn config_page(out: &mut impl Write) -> io::Result<()> {
    writeln!(
        out,
        ".TH MCRELAY.TOML 5 \"mcrelay {}\" mcrelay",
        env!("CARGO_PKG_VERSION")
    )?;
    writeln!(out, ".SH NAME")?;
    writeln!(
        out,
        "mcrelay.toml \\- configuration file of the mcrelay multicast relay daemon"
    )?;
    writeln!(out, ".SH SYNOPSIS")?;
    writeln!(out, "/etc/mcrelay/mcrelay.toml")?;
    markdown_to_roff(CONFIGURATION_MD, out)?;
    writeln!(out, ".SH SEE ALSO")?;
    writeln!(out, "mcrelayd(8), mcrelayctl(8)")
}

/// `[text](target)` becomes `text`.
fn strip_links(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        let after = &rest[open + 1..];
        let Some(close) = after.find("](") else {
            break;
        };
        let Some(end) = after[close + 2..].find(')') else {
            break;
        };
        out.push_str(&rest[..open]);
        out.push_str(&after[..close]);
        rest = &after[close + 2 + end + 1..];
    }
    out.push_str(rest);
    out
}

/// Inline markup: `code` in bold, **strong** in bold, links as their text.
fn inline(text: &str) -> String {
    let text = &strip_links(text);
    let mut out = String::with_capacity(text.len() + 16);
    let mut code = false;
    for (i, part) in text.split('`').enumerate() {
        if i > 0 {
            out.push_str(if code { "\\fR" } else { "\\fB" });
            code = !code;
        }
        let part = if code {
            part.to_owned()
        } else {
            part.replace("**", "")
        };
        out.push_str(&mcrelay_control::roff::escape(&part));
    }
    if code {
        out.push_str("\\fR");
    }
    out
}

fn markdown_to_roff(md: &str, out: &mut impl Write) -> io::Result<()> {
    let mut in_code = false;
    for line in md.lines() {
        if line.starts_with("```") {
            writeln!(out, "{}", if in_code { ".fi\n.RE" } else { ".RS 4\n.nf" })?;
            in_code = !in_code;
            continue;
        }
        if in_code {
            writeln!(out, "{}", mcrelay_control::roff::escape(line))?;
        } else if let Some(h) = line.strip_prefix("# ") {
            // The page has its own NAME; the document title becomes the
            // description heading.
            let _ = h;
            writeln!(out, ".SH DESCRIPTION")?;
        } else if let Some(h) = line.strip_prefix("## ") {
            writeln!(out, ".SH {}", inline(&h.to_uppercase()))?;
        } else if let Some(h) = line.strip_prefix("### ") {
            writeln!(out, ".SS {}", inline(h))?;
        } else if line.starts_with('|') {
            if line.chars().all(|c| matches!(c, '|' | '-' | ':' | ' ')) {
                continue;
            }
            let cells: Vec<String> = line
                .trim_matches('|')
                .split(" | ")
                .map(|c| inline(c.trim()))
                .collect();
            writeln!(out, ".TP\n{}", cells.first().cloned().unwrap_or_default())?;
            writeln!(
                out,
                "{}",
                cells.get(1..).unwrap_or_default().join(" \\(em ")
            )?;
        } else if let Some(item) = line.strip_prefix("- ") {
            writeln!(out, ".IP \\(bu 2\n{}", inline(item))?;
        } else if line.trim().is_empty() {
            writeln!(out, ".PP")?;
        } else {
            writeln!(out, "{}", inline(line.trim_start()))?;
        }
    }
    if in_code {
        writeln!(out, ".fi\n.RE")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(md: &str) -> String {
        let mut out = Vec::new();
        markdown_to_roff(md, &mut out).expect("render");
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn headings_tables_code_and_inline_markup() {
        let roff = render(
            "# Title\nSee [the example](../x.toml) and [Errors](#errors).\n## Keys\n| Key | Default |\n|---|---|\n| `user` | `\"mcrelay\"` |\n\n```toml\n.dot = 1\n```\n- a **b** `c-d`\n",
        );
        assert!(
            roff.contains(".SH DESCRIPTION\nSee the example and Errors.\n.SH KEYS\n"),
            "{roff}"
        );
        assert!(
            roff.contains(".TP\n\\fBuser\\fR\n\\fB\"mcrelay\"\\fR"),
            "{roff}"
        );
        assert!(roff.contains(".RS 4\n.nf\n\\&.dot = 1\n.fi\n.RE"), "{roff}");
        assert!(roff.contains(".IP \\(bu 2\na b \\fBc\\-d\\fR"), "{roff}");
    }

    #[test]
    fn the_configuration_page_covers_every_section() {
        let mut out = Vec::new();
        config_page(&mut out).expect("render");
        let page = String::from_utf8(out).expect("utf-8");
        for section in ["[DAEMON]", "[POOLS]", "[[FLOW]]", "\\fBcontrol_socket\\fR"] {
            assert!(page.contains(section), "{section} missing");
        }
    }
}
