#!/usr/bin/env bash
# Soak test (not in CI): 10 minutes of 1->4 traffic at 80% of the measured
# max lossless rate, a reload every 30 s, an output interface flapping every
# 60 s. See soak.py for what passes. Needs root.
#
#   experiments/soak/run.sh                       # the documented 10-minute run
#   experiments/soak/run.sh --duration 60         # a shorter one
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
if [[ $(id -u) -ne 0 ]]; then
    echo "soak: needs root (network namespaces)" >&2
    exit 2
fi
(cd "$root" && cargo build --release --locked -q -p mcrelayd -p mcrelayctl -p mcrelay-loadgen)
exec python3 "$here/soak.py" \
    --mcrelayd "$root/target/release/mcrelayd" \
    --mcrelayctl "$root/target/release/mcrelayctl" \
    --loadgen "$root/target/release/loadgen" "$@"
