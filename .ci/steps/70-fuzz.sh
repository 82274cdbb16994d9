#!/usr/bin/env bash
# Coverage-guided fuzzing on stable Rust: AFL++ through afl.rs (cargo-afl).
# Installs cargo-afl (pinned) and builds AFL++ from the source it carries
# if missing, builds every target in fuzz/ with AFL's instrumentation, and
# fuzzes each for FUZZ_SECONDS (default 60) from its committed corpus in
# fuzz/corpus/NAME. Fails if a committed input crashes (afl-fuzz refuses to
# start) or the fuzzer finds a crash; prints each target's stats either
# way. See docs/fuzzing.md.
#
#     FUZZ_SECONDS=600 FUZZ_TARGETS="frame rtnetlink" .ci/steps/70-fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)

afl_version=0.18.2
seconds=${FUZZ_SECONDS:-60}
# Every [[bin]] in fuzz/Cargo.toml.
targets=${FUZZ_TARGETS:-$(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -vx mcrelay-fuzz)}
out=${FUZZ_OUT:-$(mktemp -d /tmp/mcrelay-fuzz.XXXXXX)}
mkdir -p "$out"

export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
if ! cargo afl --version 2>/dev/null | grep -qF "cargo-afl $afl_version"; then
    cargo install cargo-afl --version "$afl_version" --locked
fi
# AFL++ (afl-fuzz and its runtime) for this rustc, once per machine.
if ! config=$(cargo afl config --build 2>&1); then
    grep -q 'already built' <<<"$config" || { echo "$config"; exit 1; }
fi

(cd fuzz && cargo afl build --release --locked)

# A shared CI machine: don't ask to change the host's core_pattern or CPU
# governor, don't pin cores, plain log output.
export AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_NO_AFFINITY=1
export AFL_NO_UI=1 AFL_QUIET=1

failed=0
for t in $targets; do
    echo "--- fuzz $t for ${seconds}s (output in $out/$t)"
    rm -rf "${out:?}/$t"
    if ! nice -n 19 cargo afl fuzz -V "$seconds" -i "fuzz/corpus/$t" -o "$out/$t" \
        -- "$root/fuzz/target/release/$t" >"$out/$t.log" 2>&1; then
        tail -n 30 "$out/$t.log"
        echo "FAIL: afl-fuzz on $t did not run to the end"
        failed=1
        continue
    fi
    stats="$out/$t/default/fuzzer_stats"
    awk -F' *: *' '/^(execs_done|execs_per_sec|corpus_count|edges_found|total_edges|bitmap_cvg|saved_crashes|saved_hangs|run_time) /{printf "%s=%s ", $1, $2} END {print ""}' "$stats"
    crashes=$(awk -F' *: *' '$1 == "saved_crashes" {print $2}' "$stats")
    if [ "$crashes" != 0 ]; then
        echo "FAIL: $t crashed; inputs in $out/$t/default/crashes/ (rerun one: fuzz/target/release/$t < FILE)"
        failed=1
    fi
done
exit "$failed"
