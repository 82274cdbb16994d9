#!/usr/bin/env python3
"""Gate gungraun instruction counts against a committed baseline.

stdin: `cargo bench ... -- --output-format=json` (one JSON object per line).
argv[1]: baseline JSON file {"<module_path> <id>": instructions, ...}.
Fails when any count exceeds its baseline by more than 10 %, or when a
benchmark in the baseline did not run. `--write` rewrites the baseline
with the gated benchmarks (the `pool` group); `--write --all` writes every
count, which is how benches/results/pool_instructions.json (the data behind
the pool-vs-allocator plot, allocator included) is made.
"""
import json
import sys

LIMIT = 1.10
# Only our own code is gated: the `alloc` group counts glibc's allocator.
GATED = "pool_instructions::pool::"


def counts(lines):
    out = {}
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        bench = json.loads(line)
        key = f'{bench["module_path"]} {bench["id"]}'
        for profile in bench["profiles"]:
            for part in profile["data"]["parts"]:
                ir = part["metrics"].get("Ir")
                if ir is not None:
                    out[key] = int(ir["values"]["new"])
    return out


def main():
    path = sys.argv[1]
    got = counts(sys.stdin)
    if not got:
        sys.exit("no instruction counts in the benchmark output")
    if "--write" in sys.argv:
        if "--all" not in sys.argv:
            got = {k: v for k, v in got.items() if k.startswith(GATED)}
        with open(path, "w") as f:
            json.dump(got, f, indent=2, sort_keys=True)
            f.write("\n")
        print(f"wrote {path}")
        return
    with open(path) as f:
        base = json.load(f)
    failed = False
    for key, want in sorted(base.items()):
        have = got.get(key)
        if have is None:
            print(f"MISSING {key}: in the baseline but not run")
            failed = True
            continue
        ratio = have / want
        verdict = "REGRESSED" if ratio > LIMIT else "ok"
        failed |= ratio > LIMIT
        print(f"{verdict:9} {key}: {have} instructions (baseline {want}, {ratio:.3f}x)")
    for key in sorted(set(got) - set(base)):
        why = "not in the baseline yet" if key.startswith(GATED) else "not gated"
        print(f"new       {key}: {got[key]} instructions ({why})")
    if failed:
        sys.exit(f"instruction counts regressed more than {LIMIT - 1:.0%} against {path}")


main()
