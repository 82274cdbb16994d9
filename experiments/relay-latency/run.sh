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

# shellcheck source=../lib/topology.sh
. "$here/../lib/topology.sh"
mcrtp_args "$here/relay_latency.py" "  --no-build   use target/release/{mcrelayd,loadgen} as they are" "$@"
set -- ${args[@]+"${args[@]}"}
mcrtp_check "$@"
mcrtp_build "$root" "$build"
# Namespaces: mcrtp-{a,r,b}-lat<PID>.
tag=lat$$
mcrtp_backstop "$tag"

rc=0
python3 "$here/relay_latency.py" \
    --loadgen "$root/target/release/loadgen" \
    --mcrelayd "$root/target/release/mcrelayd" \
    --tag "$tag" "$@" || rc=$?
exit "$rc"
