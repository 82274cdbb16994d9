#!/usr/bin/env bash
# Reruns every scenario of the seed buffer-pool experiment against
# mcrelay's pool and prints the tables that docs/benchmarks.md quotes.
#   experiments/pool-poc/run.sh            # all scenarios, ~2 minutes
#   PAIRS=1000000 experiments/pool-poc/run.sh   # shorter scenario 1
# Pin to one CPU (taskset) when the machine has a quiet one.
set -euo pipefail
cd "$(dirname "$0")/../.."
pairs=${PAIRS:-10000000}
cpu=${CPU:-1}
pin() { taskset -c "$cpu" "$@"; }

cargo build --quiet --release -p pool-poc
cargo build --quiet --release -p pool-poc --features no-metrics --target-dir target/poc-no-metrics
with=target/release/pool-poc
without=target/poc-no-metrics/release/pool-poc

echo "## 1. latency histogram"
pin "$with" latency --pairs "$pairs"

echo; echo "## 2. sustained throughput, one core"
pin "$with" throughput --seconds 2

echo; echo "## 3. latency vs pool size"
pin "$with" scaling

echo; echo "## 4. exhaustion and recovery"
"$with" exhaustion

echo; echo "## 5. metrics overhead (interleaved, 5 rounds each, 1 s per round)"
for round in 1 2 3 4 5; do
    pin "$with" throughput --seconds 1 | awk '/^pool/ { print "with", $4 }'
    pin "$without" throughput --seconds 1 | awk '/^pool/ { print "without", $4 }'
done > target/pool-poc-overhead.txt
median() { grep "^$1 " target/pool-poc-overhead.txt | awk '{ print $2 }' | sort -n | sed -n 3p; }
w=$(median with); o=$(median without)
awk -v w="$w" -v o="$o" 'BEGIN {
    printf "median with metrics %.1f M pairs/s, without %.1f M pairs/s: metrics cost %.1f %%\n", w, o, (o / w - 1) * 100 }'

echo; echo "## 6. cachegrind: D1 and LL data misses per packet (take, copy 1316 B, read, give)"
command -v valgrind >/dev/null || { echo "valgrind missing"; exit 1; }
misses() { # impl packets -> "D1 LL" total data misses
    local out=target/pool-poc-cg.$1.$2
    valgrind --tool=cachegrind --cache-sim=yes --cachegrind-out-file="$out" \
        "$with" packet-loop --with "$1" --packets "$2" >/dev/null 2>&1
    awk '/^summary:/ {
        # events: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw
        print $6 + $9, $7 + $10, $2 }' "$out"
}
n=200000
printf '| memory | D1 misses/packet | LL misses/packet | instructions/packet |\n|---|---|---|---|\n'
for impl in pool alloc; do
    read -r d1a lla ira < <(misses "$impl" 0)
    read -r d1b llb irb < <(misses "$impl" "$n")
    awk -v m="$impl" -v n="$n" -v d1="$((d1b - d1a))" -v ll="$((llb - lla))" -v ir="$((irb - ira))" \
        'BEGIN { printf "| %s | %.3f | %.4f | %.0f |\n", m, d1 / n, ll / n, ir / n }'
done
