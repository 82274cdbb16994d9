#!/usr/bin/env bash
# spread = 1 against spread = 2 for one 1->64 flow (issue 18): max lossless
# input rate and CPU per delivered datagram, both in one run, interleaved.
# See spread.py's docstring for the topology and the method.
#
#   flock /tmp/mcrelay-bench.lock experiments/spread/run.sh               # build, then measure
#   flock /tmp/mcrelay-bench.lock experiments/spread/run.sh --bin DIR     # DIR/{mcrelayd,mcrelayctl,loadgen}
#   experiments/spread/run.sh --help                                      # spread.py's options
#
# Needs root. Every packet is sent inside the three namespaces spread.py
# creates (mcspread-<PID>-{s,r,d}) and removes, also on Ctrl-C (a trap here
# is the backstop).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

bin=""
args=()
while (($#)); do
    case $1 in
        --bin) bin=$2; shift 2 ;;
        -h | --help) exec python3 "$here/spread.py" --mcrelayd x --mcrelayctl x --loadgen x --help ;;
        *) args+=("$1"); shift ;;
    esac
done
if [[ $(id -u) -ne 0 ]]; then
    echo "run.sh: needs root (network namespaces, sysctl, RPS masks); run it as root" >&2
    exit 2
fi
if [[ -z $bin ]]; then
    echo "run.sh: cargo build --release -p mcrelayd -p mcrelayctl -p mcrelay-loadgen" >&2
    (cd "$root" && cargo build --release -p mcrelayd -p mcrelayctl -p mcrelay-loadgen)
    bin=$root/target/release
fi
tag=$$
cleanup() {
    local ns p
    for ns in "mcspread-$tag-s" "mcspread-$tag-r" "mcspread-$tag-d"; do
        if ip netns list 2>/dev/null | grep -qw "$ns"; then
            for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
            ip netns del "$ns" 2>/dev/null || true
        fi
    done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
mkdir -p "$here/results"
python3 "$here/spread.py" --mcrelayd "$bin/mcrelayd" --mcrelayctl "$bin/mcrelayctl" \
    --loadgen "$bin/loadgen" --tag "$tag" \
    --out "$here/results/$(date -u +%Y%m%dT%H%M%SZ).json" ${args[@]+"${args[@]}"}
