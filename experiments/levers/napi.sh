#!/usr/bin/env bash
# Issue 19's NAPI lever: io_uring NAPI busy polling on the worker's ring,
# end to end on relay-throughput's veth topology, against the same build
# without it, interleaved.
#
#   experiments/levers/napi.sh [--reps N] [--rates "20000 80000"] [--busy-poll-us 50]
#                              [--seconds S] [--no-build]
#
# Needs root. Builds the release mcrelayd twice (base, and the `napi`
# variant of variant.py, the tree restored after), then for each rate runs
# relay_throughput.py under the bench lock with contenders mcrelay-before
# (base) and mcrelay (napi), 1316 B 1->1, one round of S seconds per
# contender and repetition at that fixed rate (--max-steps 1), both with
# gro + rx-udp-gro-forwarding on the relay's input veth (--input-gro; the
# veth's receive needs both for a NAPI id). Namespaces mcrtp-{a,r,b}-napiPID,
# removed at the end. Prints per round the relay process's CPU (utime +
# stime) and the relay CPU's busy time per delivered packet, the loss, and
# whether the napi worker found and registered its input's NAPI id;
# results JSON and this script's output in experiments/levers/results/napi/.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
reps=3 rates="20000 80000" us=50 seconds=3 build=1
while (($#)); do
    case $1 in
        --reps) reps=$2; shift 2 ;;
        --rates) rates=$2; shift 2 ;;
        --busy-poll-us) us=$2; shift 2 ;;
        --seconds) seconds=$2; shift 2 ;;
        --no-build) build=0; shift ;;
        -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "napi.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
if [[ $(id -u) -ne 0 ]]; then
    echo "napi.sh: needs root (network namespaces, ethtool, sysctl); run it as root" >&2
    exit 2
fi
bin=${BIN:-/tmp/napi-bin}
mkdir -p "$bin"
cd "$root"

if ((build)); then
    trap 'git checkout -- crates/uring/src' EXIT
    git checkout -- crates/uring/src
    cargo build --release -p mcrelayd -p mcrelay-loadgen
    cp target/release/mcrelayd "$bin/mcrelayd-base"
    cp target/release/loadgen "$bin/loadgen"
    python3 experiments/levers/variant.py "napi$us"
    cargo build --release -p mcrelayd
    cp target/release/mcrelayd "$bin/mcrelayd-napi"
    git checkout -- crates/uring/src
    trap - EXIT
fi
for b in mcrelayd-base mcrelayd-napi loadgen; do
    [[ -x $bin/$b ]] || { echo "napi.sh: $bin/$b is missing (run without --no-build)" >&2; exit 2; }
done

# shellcheck source=../lib/topology.sh
. "$here/../lib/topology.sh"
tag=napi$$
mcrtp_backstop "$tag"
out=$here/results/napi
mkdir -p "$out"
# Everything from here on also goes to results/napi/napi-<UTC>.txt.
exec > >(tee "$out/napi-$(date -u +%Y%m%dT%H%M%SZ).txt") 2>&1
for rate in $rates; do
    echo "napi.sh: rate $rate pps, load $(cut -d' ' -f1-3 /proc/loadavg), waiting for the bench lock" >&2
    flock /tmp/mcrelay-bench.lock python3 experiments/relay-throughput/relay_throughput.py \
        --loadgen "$bin/loadgen" --mcrelayd "$bin/mcrelayd-napi" --mcrelayd-before "$bin/mcrelayd-base" \
        --contenders mcrelay-before,mcrelay --sizes 1316 --fanouts 1 --reps "$reps" \
        --round-seconds "$seconds" --input-gro --max-steps 1 --start-rate "$rate" --no-warm-start \
        --no-saturation --tag "$tag" --results "$out" | tee "$bin/last.txt"
    json=$(sed -n 's/^results: //p' "$bin/last.txt")
    python3 - "$json" <<'PY'
import json, statistics, sys
from pathlib import Path
d = json.load(open(sys.argv[1]))
tck = d["meta"]["clk_tck"]
print(f"\n{sys.argv[1]}: input GRO {d['meta']['topology']['input_gro']}")
name = {"mcrelay-before": "base", "mcrelay": "napi"}
rows = {}
for r in d["rounds"]:
    if r["tag"] != "search" or r.get("superseded"):
        continue
    c = name[r["contender"]]
    p = r["relay_process_jiffies"] or {"utime": 0, "stime": 0}
    proc_ns = (p["utime"] + p["stime"]) * 1e9 / tck / r["delivered"] if r["delivered"] else float("nan")
    busy_ns = r["ns_per_delivered"] or float("nan")
    both = (r["relay_cpu"]["busy"] + r["harness_cpu"]["busy"]) * 1e9 / tck / r["delivered"] if r["delivered"] else float("nan")
    log = (Path(r["logdir"]) / f"{r['contender']}.stderr").read_text()
    napi = "napi id " + log.split("napi_id=")[1].split()[0] if "napi_id=" in log else (
        "registered, NO id" if "busy polling registered" in log else "-")
    rows.setdefault(c, []).append((proc_ns, busy_ns, both, r["loss_frac"]))
    print(f"  rep {r['rep']} {c:4} req {r['requested_pps']} got {r['achieved_pps']:.0f} pps: relay process "
          f"{proc_ns:6.0f} ns/pkt, relay CPU busy {busy_ns:6.0f}, both CPUs busy {both:6.0f}, "
          f"loss {r['loss_frac']*100:.3f} %, {napi}")
for c, v in rows.items():
    med = [statistics.median(x[i] for x in v) for i in range(4)]
    print(f"  median {c:4}: relay process {med[0]:.0f} ns/pkt, relay CPU {med[1]:.0f}, "
          f"both CPUs {med[2]:.0f}, loss {med[3]*100:.3f} % ({len(v)} rounds)")
PY
done
echo "napi.sh: done, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
