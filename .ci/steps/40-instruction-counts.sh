#!/usr/bin/env bash
# Instruction counts (callgrind via gungraun) of the pool's hot path, gated
# against benches/baselines/pool_instructions.json: more than 10 % over the
# baseline fails CI. Refresh the baseline deliberately with
#   cargo bench -p mcrelay-benches --bench pool_instructions -- --output-format=json \
#     | python3 .ci/instruction_gate.py benches/baselines/pool_instructions.json --write
set -euo pipefail
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind; }
# gungraun-runner must match the gungraun library version in Cargo.lock.
want=$(awk '/^name = "gungraun"$/{getline; gsub(/"/,"",$3); print $3}' Cargo.lock)
have=$(gungraun-runner --version 2>/dev/null | awk '{print $2}' || true)
if [ "$have" != "$want" ]; then
    cargo install --locked --quiet gungraun-runner --version "$want"
fi
cargo bench --locked -p mcrelay-benches --bench pool_instructions -- --output-format=json \
    | python3 .ci/instruction_gate.py benches/baselines/pool_instructions.json
