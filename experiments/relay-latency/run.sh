#!/usr/bin/env bash
# One-way latency through mcrelay (socket and packet ingress), the loadgen
# baseline relay and kernel forwarding, on relay-throughput's topology:
# p50 / p99 / p99.9 / max at 10, 50 and 90 % of each contender's max
# lossless rate (and at 1 kpps), interleaved. See README.md next to this file.
#
#   experiments/relay-latency/run.sh --quick    # smoke test, ~3 min
#   experiments/relay-latency/run.sh            # 3 reps (~8-10 min)
#   experiments/relay-latency/run.sh --help     # every option
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

build=1
args=()
for arg in "$@"; do
    case $arg in
        -h | --help)
            echo "run.sh [--no-build] [options of relay_latency.py below]"
            echo "  --no-build   use target/release/{mcrelayd,loadgen} as they are"
            echo
            exec python3 "$here/relay_latency.py" --loadgen x --mcrelayd x --help
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
fi
for bin in mcrelayd loadgen; do
    [[ -x $root/target/release/$bin ]] || { echo "run.sh: target/release/$bin is missing" >&2; exit 2; }
done

# Backstop teardown (relay_latency.py cleans up itself; this covers it
# being killed outright). Namespaces: mcrtp-{a,r,b}-lat<PID>.
tag=lat$$
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
python3 "$here/relay_latency.py" \
    --loadgen "$root/target/release/loadgen" \
    --mcrelayd "$root/target/release/mcrelayd" \
    --tag "$tag" "$@" || rc=$?
exit "$rc"
