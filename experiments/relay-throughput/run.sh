#!/usr/bin/env bash
# End-to-end relay throughput: mcrelay vs the loadgen baseline relay vs
# kernel multicast forwarding (smcroute), max lossless rate and relay-CPU ns
# per delivered packet. See README.md next to this file.
#
#   experiments/relay-throughput/run.sh --quick      # smoke test, a few minutes
#   experiments/relay-throughput/run.sh              # 3 reps, 1316 and 64 B, 1->1 and 1->4 (~30 min)
#   experiments/relay-throughput/run.sh --help       # every option
#
# Needs root. Builds the release binaries, then relay_throughput.py builds
# the namespaces, measures, prints the table and writes results/<UTC>.json.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

build=1
args=()
for arg in "$@"; do
    case $arg in
        -h | --help)
            echo "run.sh [--no-build] [options of relay_throughput.py below]"
            echo "  --no-build   use target/release/{mcrelayd,loadgen} as they are (e.g. while the"
            echo "               workspace does not build); their sha256 goes into the results"
            echo
            exec python3 "$here/relay_throughput.py" --loadgen x --mcrelayd x --help
            ;;
        --no-build) build=0 ;;
        *) args+=("$arg") ;;
    esac
done
set -- ${args[@]+"${args[@]}"}

if [[ $(id -u) -ne 0 ]]; then
    echo "run.sh: needs root (network namespaces, sysctl, RPS masks, ethtool); run it as root" >&2
    exit 2
fi
for tool in ip taskset nice sysctl python3 cargo; do
    command -v "$tool" >/dev/null || { echo "run.sh: $tool is missing" >&2; exit 2; }
done
if ! command -v ethtool >/dev/null; then
    echo "run.sh: installing ethtool" >&2
    apt-get install -y ethtool >/dev/null
fi
if [[ " $* " != *" --contenders "* || " $* " == *kernel* ]] && ! command -v smcrouted >/dev/null; then
    echo "run.sh: installing smcroute (kernel forwarding contender)" >&2
    apt-get install -y smcroute >/dev/null
fi

if ((build)); then
    echo "run.sh: cargo build --release -p mcrelayd -p mcrelay-loadgen" >&2
    (cd "$root" && cargo build --release -p mcrelayd -p mcrelay-loadgen)
else
    echo "run.sh: --no-build: using the binaries in target/release as they are" >&2
fi
for bin in mcrelayd loadgen; do
    [[ -x $root/target/release/$bin ]] || { echo "run.sh: target/release/$bin is missing" >&2; exit 2; }
done

# Backstop teardown: relay_throughput.py removes its namespaces and restores
# netdev_max_backlog itself; this covers it being killed outright.
tag=$$
old_backlog=$(sysctl -n net.core.netdev_max_backlog)
cleanup() {
    local ns pid
    for ns in "mcrtp-a-$tag" "mcrtp-r-$tag" "mcrtp-b-$tag"; do
        if ip netns list 2>/dev/null | grep -qw "$ns"; then
            for pid in $(ip netns pids "$ns" 2>/dev/null); do
                kill -KILL "$pid" 2>/dev/null || true
            done
            ip netns del "$ns" 2>/dev/null || true
        fi
    done
    if [[ $(sysctl -n net.core.netdev_max_backlog) != "$old_backlog" ]]; then
        sysctl -qw "net.core.netdev_max_backlog=$old_backlog" || true
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

rc=0
python3 "$here/relay_throughput.py" \
    --loadgen "$root/target/release/loadgen" \
    --mcrelayd "$root/target/release/mcrelayd" \
    --tag "$tag" "$@" || rc=$?
exit "$rc"
