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

# shellcheck source=../lib/topology.sh
. "$here/../lib/topology.sh"
mcrtp_args "$here/relay_throughput.py" \
    "  --no-build   use target/release/{mcrelayd,loadgen} as they are (e.g. while the
               workspace does not build); their sha256 goes into the results" "$@"
set -- ${args[@]+"${args[@]}"}
mcrtp_check "$@"
mcrtp_build "$root" "$build"
tag=$$
mcrtp_backstop "$tag"

rc=0
python3 "$here/relay_throughput.py" \
    --loadgen "$root/target/release/loadgen" \
    --mcrelayd "$root/target/release/mcrelayd" \
    --tag "$tag" "$@" || rc=$?
exit "$rc"
