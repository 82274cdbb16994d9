#!/usr/bin/env bash
# The pool's unsafe code has no miri on stable: run its tests (unit and
# property) under valgrind memcheck and require zero errors and no leaks.
set -euo pipefail
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind; }
bins=$(cargo test -p mcrelay-pool --locked --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])')
[ -n "$bins" ] || { echo "no pool test binaries found"; exit 1; }
for b in $bins; do
    echo "memcheck: $b"
    PROPTEST_CASES=24 valgrind --tool=memcheck --error-exitcode=1 --leak-check=full \
        --errors-for-leak-kinds=definite,indirect --show-leak-kinds=definite,indirect --quiet "$b" --test-threads=1 -q
done
