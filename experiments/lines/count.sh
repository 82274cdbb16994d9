#!/usr/bin/env bash
# Product (non-test) Rust lines of a source tree, counted the same way in
# any tree of this repository (issue 25's "product lines"; results in
# docs/architecture.md, "Issue 25 by the numbers").
#
#   experiments/lines/count.sh [TREE] [EXCLUDE_LIST]
#
# TREE (default: this checkout) is a checkout of any commit. What counts:
# every `*.rs` file under `crates/*/src/` and every `crates/*/build.rs`,
# except
#   - crates that are not the product: `crates/testkit` (test support) and,
#     in trees from before they moved to tools/, `crates/loadgen` and
#     `crates/plot`; tools/, benches/, experiments/, fuzz/ and every
#     crate's tests/ and examples/ are outside `crates/*/src` anyway;
#   - test files inside src: a file named `tests.rs`, or under a `tests/`
#     folder, or whose first attribute is `#![cfg(test)]`, or the file of
#     a module declared test-only (`#[cfg(test)] mod x;`, as below);
#   - inside every other file, each item marked `#[cfg(test)]`,
#     `#[cfg(any(test, ...))]` or `#[cfg(feature = "test-support")]` (a
#     `mod tests { ... }`, a test-only function, a `mod tests;` line,
#     test support behind a feature; none of it in the product build):
#     from the attribute to the item's last line: the item's first line if
#     it opens no block, else the first line after it at the attribute's
#     indentation holding only `}` (or `);`), as rustfmt (checked by CI)
#     lays items out.
# EXCLUDE_LIST (optional) is a file of path prefixes relative to TREE, one
# a line (`#` comments allowed); files under them are left out (used to
# leave out the features a round added, so a refactor's own effect shows).
#
# Prints per crate and in total: files, lines (as `wc -l` counts them) and
# code lines (lines neither blank nor only a `//` comment); with
# EACH_FILE=1 in the environment, each file's lines instead, largest first.
set -euo pipefail
tree=${1:-$(git rev-parse --show-toplevel)}
exclude=${2:-}
cd "$tree"
files=$( { find crates -path '*/src/*' -name '*.rs'; find crates -maxdepth 2 -name build.rs; } \
    | grep -v -E '^crates/(testkit|loadgen|plot)/' \
    | grep -v -E '(^|/)tests\.rs$|/tests/' \
    | sort)
test_attr='^[[:space:]]*#\[cfg\((test\)|any\(test,|feature = "test-support"\))'
# Modules declared test-only in another file (`#[cfg(test)] mod tests;`,
# test support behind `cfg(any(test, ...))`): their files are test code.
# shellcheck disable=SC2086
prefixes=$(awk -v attr="$test_attr" '
$0 ~ attr { pending = 1; next }
pending && /^[[:space:]]*#\[/ { next }
pending && /^[[:space:]]*(pub(\([a-z]+\))? )?mod [a-z_0-9]+;/ {
    name = $0; sub(/.*mod /, "", name); sub(/;.*/, "", name)
    dir = FILENAME; sub(/\/[^\/]*$/, "", dir)
    base = FILENAME; sub(/.*\//, "", base); sub(/\.rs$/, "", base)
    if (base != "mod" && base != "lib" && base != "main") dir = dir "/" base
    print dir "/" name ".rs"; print dir "/" name "/"
}
{ pending = 0 }' $files)
if [[ -n "$exclude" ]]; then
    prefixes+=$'\n'$(grep -v -E '^[[:space:]]*(#|$)' "$exclude" || true)
fi
kept=""
for f in $files; do
    skip=0
    for p in $prefixes; do
        [[ "$f" == "$p"* ]] && { skip=1; break; }
    done
    [[ $skip == 0 ]] && kept+="$f"$'\n'
done
files=$kept
# shellcheck disable=SC2086
awk -v attr="$test_attr" -v each="${EACH_FILE:-}" '
function indent(s) { match(s, /^[[:space:]]*/); return RLENGTH }
FNR == 1 {
    split(FILENAME, part, "/"); crate = part[2]; files[crate]++
    skipping = 0; testfile = 0
}
testfile { next }
FNR == 1 && /^#!\[cfg\(test\)\]/ { testfile = 1; files[crate]--; next }
# rustfmt lays an item out on one line, or from a line that opens a block
# to a line at the same indentation that holds only the closing `}` (or
# `);`). Test code often holds TOML or text at the left margin in raw
# strings, so no other line at that indentation ends the item.
skipping && /^[[:space:]]*$/ { next }
skipping && indent($0) < at { skipping = 0 }
skipping {
    if (indent($0) == at && $0 !~ /^[[:space:]]*#\[/) {
        if (!started && $0 !~ /[{([][[:space:]]*$/) skipping = 0
        else if (started && $0 ~ /^[[:space:]]*(\}[,;]?|\);)[[:space:]]*$/) skipping = 0
        started = 1
    }
    next
}
$0 ~ attr { skipping = 1; started = 0; at = indent($0); next }
{
    lines[crate]++; per_file[FILENAME]++
    if ($0 !~ /^[[:space:]]*$/ && $0 !~ /^[[:space:]]*\/\//) code[crate]++
}
END {
    if (each) for (f in per_file) printf "%6d %s\n", per_file[f], f
    else for (c in files) printf "%-12s %6d %8d %8d\n", c, files[c], lines[c], code[c]
}' $files | sort | if [[ -n "${EACH_FILE:-}" ]]; then sort -rn; else awk '
BEGIN { printf "%-12s %6s %8s %8s\n", "crate", "files", "lines", "code" }
{ print; tf += $2; tl += $3; tc += $4 }
END { printf "%-12s %6d %8d %8d\n", "total", tf, tl, tc }'; fi
