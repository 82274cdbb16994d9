#!/usr/bin/env bash
# CPU per delivered datagram of SRT outputs (issue 29): one flow relayed to
# N SRT callers (one listener, N srt-live-transmit callers) against the
# same flow relayed to N plain unicast outputs, for N = 1, 10, 50,
# interleaved, REPS times each, in one run. The figure is the relay
# process's CPU (user + system, every thread: workers, the SRT thread and
# libsrt's) over the send window, divided by the datagrams delivered
# (unicast: the outputs' packets_out; SRT: what the callers were sent,
# those that left included). SRT runs also print what the callers
# received (their bytes, counted by wc -c) and where the rest went.
#
#   experiments/srt-cost/run.sh                      # release build, then measure
#   experiments/srt-cost/run.sh --bin target/release --rate 2000 --seconds 10 --reps 3
#   /work/shared/tools/quiet -- experiments/srt-cost/run.sh --bin target/release
#   experiments/srt-cost/run.sh --ceiling "5000 10000 20000" --ceiling-seconds 10   # the ceiling run
#
# Needs root, srt-live-transmit and python3. Every packet stays inside the
# three namespaces it creates (mcsrt-PID-{a,r,b}) and removes on exit; the
# unicast outputs' datagrams are dropped by iptables in B (no ICMP back).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin="" rate=2000 seconds=10 reps=3 counts="1 10 50" ceiling="5000 10000 20000 40000 80000" ceiling_seconds=10
while (($#)); do
    case $1 in
        --bin) bin=$2; shift 2 ;;
        --rate) rate=$2; shift 2 ;;
        --seconds) seconds=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --counts) counts=$2; shift 2 ;;
        --ceiling) ceiling=$2; shift 2 ;;
        --ceiling-seconds) ceiling_seconds=$2; shift 2 ;;
        -h | --help) sed -n '2,19p' "$0"; exit 0 ;;
        *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
[[ $(id -u) -eq 0 ]] || { echo "run.sh: needs root (network namespaces)" >&2; exit 2; }
for tool in ip python3 srt-live-transmit iptables; do
    command -v "$tool" >/dev/null || { echo "run.sh: $tool is missing" >&2; exit 2; }
done
if [[ -z $bin ]]; then
    (cd "$root" && cargo build --release -p mcrelayd -p mcrelay-helper -p mcrelayctl -p mcrelay-loadgen)
    bin=$root/target/release
fi
bin=$(cd "$bin" && pwd)
a=mcsrt-$$-a r=mcsrt-$$-r b=mcsrt-$$-b dir=$(mktemp -d /tmp/mcsrt-$$-XXXX)
chmod 755 "$dir" # the helper reads the config as daemon.user
pids=()
teardown() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    pids=()
    for ns in "$a" "$r" "$b"; do ip netns del "$ns" 2>/dev/null || true; done
}
trap 'teardown; rm -rf "$dir"' EXIT

topology() {
    for ns in "$a" "$r" "$b"; do ip netns add "$ns"; ip -n "$ns" link set lo up; done
    ip link add vA netns "$a" type veth peer name vRA netns "$r"
    ip link add vRB netns "$r" type veth peer name vB netns "$b"
    ip -n "$a" addr add 10.10.1.1/24 dev vA
    ip -n "$r" addr add 10.10.1.2/24 dev vRA
    ip -n "$r" addr add 10.10.2.1/24 dev vRB
    ip -n "$b" addr add 10.10.2.2/24 dev vB
    for x in "$a vA" "$r vRA" "$r vRB" "$b vB"; do set -- $x; ip -n "$1" link set "$2" up; done
    ip -n "$a" route add 224.0.0.0/4 dev vA
    ip netns exec "$r" sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.vRA.rp_filter=0
    ip netns exec "$b" iptables -A INPUT -p udp --dport 7000:7999 -j DROP
}

# delivered SOCKET KIND: datagrams delivered so far.
delivered() {
    "$bin/mcrelayctl" --socket "$1" flows --json | python3 -c '
import json, sys
s = json.load(sys.stdin)
kind = sys.argv[1]
n = 0
for f in s["flows"]:
    for o in f["outputs"]:
        if kind == "srt":
            # Every caller'"'"'s, those that left included.
            n += (o.get("srt") or {}).get("sent", 0)
        else:
            n += o["packets_out"]
print(n)' "$2"
}

callers() {
    "$bin/mcrelayctl" --socket "$1" flows --json | python3 -c '
import json, sys
s = json.load(sys.stdin)
print(sum(len((o.get("srt") or {}).get("callers", [])) for f in s["flows"] for o in f["outputs"]))'
}

# why SOCKET: where the datagrams the callers were not sent went.
why() {
    "$bin/mcrelayctl" --socket "$1" flows --json | python3 -c '
import json, sys
s = json.load(sys.stdin)
for f in s["flows"]:
    for o in f["outputs"]:
        t = o.get("srt")
        if not t:
            continue
        c = t["callers"]
        tot = lambda k: sum(x[k] for x in c)
        print("  worker->srt drops_backlog=%d drops_send_error=%d; srt read=%d no_caller=%d"
              " connects=%d disconnects=%d (fell behind %d) refused=%d callers=%d;"
              " to callers: sent=%d dropped=%d; libsrt: too_late=%d retransmitted=%d"
              % (o["drops_backlog"], o["drops_send_error"], t["datagrams"], t["no_caller"],
                 t["connects"], t["disconnects"], t.get("late_disconnects", 0), t["refused"],
                 len(c), t.get("sent", 0), t.get("dropped", 0),
                 tot("too_late"), tot("retransmitted")))'
}

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

measure() { # KIND N
    local kind=$1 n=$2 i outputs="" sock=$dir/control.sock
    topology
    if [[ $kind == srt ]]; then
        outputs="{ protocol = \"srt\", address = \"10.10.2.1\", port = 9000, max_callers = 64 }"
    else
        for ((i = 0; i < n; i++)); do
            outputs+="${outputs:+, }{ interface = \"vRB\", address = \"10.10.2.2\", port = $((7000 + i)) }"
        done
    fi
    cat >"$dir/mcrelay.toml" <<TOML
[daemon]
user = "nobody"
control_socket = "$sock"
cores = [0]
[[flow]]
name = "f"
input = { interface = "vRA", address = "239.1.1.1", port = 5000 }
outputs = [$outputs]
TOML
    : >"$dir/relay.log"
    ip netns exec "$r" "$bin/mcrelayd" --config "$dir/mcrelay.toml" 2>"$dir/relay.log" &
    local relay=$!
    pids+=("$relay")
    local waited=0
    until grep -q "relaying;" "$dir/relay.log"; do
        kill -0 "$relay" 2>/dev/null && ((waited++ < 300)) || { echo "run.sh: mcrelayd did not start:" >&2; cat "$dir/relay.log" >&2; exit 1; }
        sleep 0.1
    done
    if [[ $kind == srt ]]; then
        # Each caller's bytes are counted as they arrive (wc -c on a
        # fifo): what the callers received, not only what was sent.
        for ((i = 0; i < n; i++)); do
            mkfifo "$dir/fifo-$i"
            rm -f "$dir/rx-$i"
            # The shell waits for its caller (not exec wc): a caller
            # nobody reaps would count as another process's CPU in
            # quiet's report.
            ip netns exec "$b" sh -c "srt-live-transmit -q srt://10.10.2.1:9000 file://con >'$dir/fifo-$i' 2>/dev/null &
                echo \$! >'$dir/pid-$i'; wc -c <'$dir/fifo-$i' >'$dir/rx-$i'; wait" &
            pids+=("$!")
        done
        waited=0
        until [[ $(callers "$sock") -ge $n ]]; do
            ((waited++ < 300)) || { echo "run.sh: only $(callers "$sock") of $n callers connected" >&2; cat "$dir/relay.log" >&2; exit 1; }
            sleep 0.2
        done
    fi
    local d0 c0 d1 c1
    d0=$(delivered "$sock" "$kind")
    c0=$(cpu_ticks "$relay")
    ip netns exec "$a" "$bin/loadgen" send --dest 239.1.1.1:5000 --interface vA \
        --rate "$rate" --count $((rate * seconds)) --size 1316 >/dev/null
    sleep 2 # what is still queued, and the SRT counters (published each second)
    c1=$(cpu_ticks "$relay")
    d1=$(delivered "$sock" "$kind")
    local received=-1
    if [[ $kind == srt ]]; then
        why "$sock"
        for ((i = 0; i < n; i++)); do kill -INT "$(cat "$dir/pid-$i")" 2>/dev/null || true; done
        for ((i = 0; i < n; i++)); do
            waited=0
            until [[ -s $dir/rx-$i ]]; do ((waited++ < 100)) || break; sleep 0.1; done
        done
        received=$(cat "$dir"/rx-* 2>/dev/null | python3 -c "
import sys
v = [int(x) // 1316 for x in sys.stdin.read().split()]
print(sum(v), min(v) if v else 0)")
        rm -f "$dir"/fifo-* "$dir"/rx-* "$dir"/pid-*
    fi
    # The last run's relay log, for a look at why (disconnects, warnings).
    cp "$dir/relay.log" "/tmp/mcsrt-last-relay.log" 2>/dev/null || true
    teardown
    python3 -c "
import os
hz = os.sysconf('SC_CLK_TCK')
cpu = ($c1 - $c0) / hz
d = $d1 - $d0
sent = $rate * $seconds * $n
rx = '$received'.split()
got = f' received={rx[0]} ({100 * int(rx[0]) / max(sent, 1):.2f} %, the least a caller got {100 * int(rx[1]) * $n / max(sent, 1):.2f} %)' if len(rx) == 2 else ''
print(f'$kind n=$n rate=$rate cpu_s={cpu:.2f} delivered={d} of {sent} ({100 * d / max(sent, 1):.2f} %) us_per_datagram={cpu / max(d, 1) * 1e6:.2f}{got}')"
}

echo "srt-cost: rate=$rate/s seconds=$seconds reps=$reps counts=[$counts] bin=$bin"
for ((k = 0; k < reps; k++)); do
    for n in $counts; do
        for kind in udp srt; do
            measure "$kind" "$n"
        done
    done
done

# The throughput ceiling with 10 SRT callers: the same measurement at
# rising input rates, --ceiling-seconds each (long enough for callers
# that fall behind to be noticed: 2 s); the ceiling is the highest rate at
# which (nearly) every datagram reached every caller. Above it the relay
# disconnects its newest late caller each second and refuses new ones
# (`why` prints "fell behind" and "refused"; srt-live-transmit calls
# again every second), so fewer callers each receive the whole stream.
# Ten unicast outputs at each rate beside it, as the issue asks (side by
# side in one run).
echo "srt-cost: ceiling with 10 callers and with 10 unicast outputs, rates [$ceiling], $ceiling_seconds s each"
for rate in $ceiling; do
    seconds=$ceiling_seconds
    for kind in udp srt; do
        measure "$kind" 10
    done
done
