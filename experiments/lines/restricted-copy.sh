#!/usr/bin/env bash
# Copy the files git tracks in this checkout, minus those under the path
# prefixes listed in LIST (as for count.sh), to DEST, for a `duplicates`
# run over what existed before a round's features:
#
#   experiments/lines/restricted-copy.sh experiments/lines/features-since-fcea417.txt /tmp/restricted
#   (cd /tmp/restricted && duplicates --most 1 --seconds 300)
set -euo pipefail
list=$1
dest=$2
prefixes=$(grep -v -E '^[[:space:]]*(#|$)' "$list")
mkdir -p "$dest"
git ls-files -co --exclude-standard | while read -r f; do
    for p in $prefixes; do
        [[ "$f" == "$p"* ]] && continue 2
    done
    printf '%s\n' "$f"
done | tar -cf - -T - | tar -xf - -C "$dest"
