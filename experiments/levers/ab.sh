#!/bin/bash
# usage: ab.sh REPS item...  where item = variant@args, args separated by commas (size,gso,depth)
# Task-clock of relay_loopback variants built by build.sh, interleaved:
# REPS rounds of every item in order. Run under flock /tmp/mcrelay-bench.lock.
BIN=${BIN:-/tmp/levers-bin}
reps=$1; shift
out=$BIN/ab-$(date +%H%M%S).txt
echo "start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $out
for i in $(seq $reps); do for it in "$@"; do
  v=${it%@*}; args=${it#*@}; args=${args//,/ }
  ms=$(perf stat -e task-clock -x, $BIN/$v $args 2>&1 >$BIN/last.out | grep task-clock | cut -d, -f1)
  echo "$it $ms $(grep -o '[0-9]* receive timeouts' $BIN/last.out)" | tee -a $out
done; done
echo "end $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $out
python3 - $out "$@" <<'PY'
import sys,statistics
f=sys.argv[1]; vs=sys.argv[2:]
d={v:[] for v in vs}
for l in open(f):
    p=l.split()
    if p and p[0] in d: d[p[0]].append(float(p[1]))
for v in vs: print(v, 'median %.1f'%statistics.median(d[v]), ' '.join('%.1f'%x for x in sorted(d[v])))
PY
