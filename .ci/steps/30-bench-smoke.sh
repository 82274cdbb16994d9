#!/usr/bin/env bash
# A quick pass over the Criterion suite: every benchmark builds and runs;
# the numbers are not judged here (they are noisy on a shared VM).
set -euo pipefail
cargo bench --locked -p mcrelay-benches --bench pool --bench dataplane --bench health --bench redundancy -- --quick --noplot
