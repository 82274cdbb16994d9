#!/usr/bin/env bash
# Which commits made issue 25's product lines grow: the refactor's own, or
# the rest (the features that landed in the same round, the lead's fixes,
# merge resolutions). Results in docs/architecture.md, "Issue 25 by the
# numbers".
#
#   experiments/lines/attribute.sh [END] [BRANCH=FORK[..TIP] ...]
#
# For every non-merge commit on the first-parent line of each refactor
# branch (`git log --first-parent --no-merges FORK..TIP`, TIP the
# branch's head unless given; a branch may be given in several
# segments), counts the
# product lines (count.sh, this checkout's copy, the same rules for every
# tree) of the commit and of its first parent, and prints the delta; a
# commit on two branches' lines counts once. Then the sums: X, the
# refactor's commits; the whole change from fcea417 (main when issue 25
# was filed) to END (default HEAD); and Y = whole - X, everything else.
#
# FORK is where the branch left main. The defaults are the refactor
# branches with the commit each was created from (`git reflog show
# BRANCH`, "branch: Created from"): arch2's line starts at fcea417 (its
# first seven commits, the crate moves, were made before it had its
# name). arch3 is two segments: its first commit (f8987e7) was merged
# into main by 78cc72d, arch3 was then fast-forwarded to that merge and
# went on from it, so its first-parent line from its head runs into
# main's own commits between b122a13 and 78cc72d, which are not its.
#
# Each tree is `git archive`d into a temporary folder, counted and
# removed; counts are kept by commit for the run (a parent is often the
# previous commit).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$(git rev-parse --show-toplevel)"
end=HEAD
if [[ $# -gt 0 && "$1" != *=* ]]; then
    end=$1
    shift
fi
if [[ $# -gt 0 ]]; then
    specs=("$@")
else
    specs=(arch2=fcea417 arch3=b122a13..f8987e7 arch3=78cc72d arch4=374fb5a arch5=a55fa68 arch6=2057069
        helperbin=fcea417 arch7=5e8405f)
fi
base=fcea417
work=$(mktemp -d /tmp/attribute.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir "$work/counts"

# "lines code" of the product at commit $1.
count() {
    local sha
    sha=$(git rev-parse "$1^{commit}")
    if [[ ! -f "$work/counts/$sha" ]]; then
        mkdir "$work/tree"
        git archive "$sha" crates | tar -x -C "$work/tree"
        "$here/count.sh" "$work/tree" | awk '$1 == "total" { print $3, $4 }' >"$work/counts/$sha"
        rm -rf "$work/tree"
    fi
    cat "$work/counts/$sha"
}

declare -A seen
sum_lines=0
sum_code=0
printf '%-10s %-9s %7s %7s  %s\n' branch commit lines code subject
for spec in "${specs[@]}"; do
    branch=${spec%%=*}
    range=${spec#*=}
    [[ "$range" == *..* ]] || range="$range..$branch"
    b_lines=0
    b_code=0
    for c in $(git rev-list --reverse --first-parent --no-merges "$range"); do
        [[ -n "${seen[$c]:-}" ]] && continue
        seen[$c]=1
        read -r after_l after_c < <(count "$c")
        read -r before_l before_c < <(count "$c^")
        dl=$((after_l - before_l))
        dc=$((after_c - before_c))
        b_lines=$((b_lines + dl))
        b_code=$((b_code + dc))
        printf '%-10s %-9s %+7d %+7d  %s\n' "$branch" "$(git rev-parse --short=9 "$c")" "$dl" "$dc" \
            "$(git log -1 --format=%s "$c" | cut -c1-70)"
    done
    printf '%-10s %-9s %+7d %+7d  (sum)\n' "$branch" "" "$b_lines" "$b_code"
    sum_lines=$((sum_lines + b_lines))
    sum_code=$((sum_code + b_code))
done
read -r base_l base_c < <(count "$base")
read -r end_l end_c < <(count "$end")
echo
printf '%-44s %7s %7s\n' "" lines code
printf '%-44s %7d %7d\n' "at $base" "$base_l" "$base_c"
printf '%-44s %7d %7d\n' "at $end ($(git rev-parse --short=9 "$end"))" "$end_l" "$end_c"
printf '%-44s %+7d %+7d\n' "whole change" "$((end_l - base_l))" "$((end_c - base_c))"
printf '%-44s %+7d %+7d\n' "X: the refactor branches' own commits" "$sum_lines" "$sum_code"
printf '%-44s %+7d %+7d\n' "Y: everything else (whole - X)" \
    "$((end_l - base_l - sum_lines))" "$((end_c - base_c - sum_code))"
