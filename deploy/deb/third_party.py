#!/usr/bin/env python3
"""Licences of the Rust crates statically linked into mcrelayd, mcrelayctl and
mcrelay-helper.

Walks `cargo metadata`'s resolved graph from the two binaries' packages
along normal (not dev or build) dependencies and prints, per crate, its
name, version, licence expression and source, followed by the licence and
notice files shipped in the crate (MIT and Apache-2.0 ask for the notices to
travel with binaries). deploy/deb/build.sh gzips the output into
/usr/share/doc/mcrelay/third-party-licenses.gz. Run from the workspace root.
"""
import json
import os
import subprocess
import sys

ROOTS = ("mcrelayd", "mcrelayctl", "mcrelay-helper")
PREFIXES = ("license", "licence", "copying", "notice", "copyright", "unlicense")


def main():
    rustc = subprocess.run(["rustc", "-vV"], check=True, capture_output=True, text=True).stdout
    host = next(l.split()[1] for l in rustc.splitlines() if l.startswith("host:"))
    # Only the dependencies compiled for this machine (no windows-sys etc.).
    meta = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--locked", "--filter-platform", host],
            check=True,
            capture_output=True,
        ).stdout
    )
    packages = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    workspace = set(meta["workspace_members"])
    todo = [i for i, p in packages.items() if p["name"] in ROOTS and i in workspace]
    if len(todo) != len(ROOTS):
        sys.exit(f"third_party.py: did not find {ROOTS} in the workspace")
    seen = set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        for dep in nodes[pid]["deps"]:
            if any(k["kind"] is None for k in dep["dep_kinds"]):
                todo.append(dep["pkg"])

    out = sys.stdout
    out.write(
        "Rust crates statically linked into /usr/bin/mcrelayd, /usr/bin/mcrelayctl\n"
        "and /usr/libexec/mcrelay/mcrelay-helper\n"
        "(the mcrelay crates themselves are Apache-2.0, see copyright), with the\n"
        "licence and notice files each one ships.\n"
    )
    third = sorted(
        (packages[i] for i in seen if i not in workspace),
        key=lambda p: (p["name"], p["version"]),
    )
    for p in third:
        out.write("\n" + "=" * 76 + "\n")
        out.write(f'{p["name"]} {p["version"]}: {p.get("license") or "(no licence field)"}\n')
        if p.get("repository"):
            out.write(f'{p["repository"]}\n')
        crate_dir = os.path.dirname(p["manifest_path"])
        files = sorted(
            f
            for f in os.listdir(crate_dir)
            if f.lower().startswith(PREFIXES) and os.path.isfile(os.path.join(crate_dir, f))
        )
        if p.get("license_file"):
            files = sorted(set(files) | {p["license_file"]})
        if not files:
            out.write("(the crate ships no licence file; its licence is the expression above)\n")
        for f in files:
            with open(os.path.join(crate_dir, f), encoding="utf-8", errors="replace") as fh:
                out.write(f"\n--- {f}\n\n{fh.read().rstrip()}\n")


main()
