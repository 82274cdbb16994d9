#!/usr/bin/env bash
# Reloads changing one flow of 1000, timed three ways, for builds given
# side by side and interleaved (A B A B ...): the way run.sh times it
# (`ip netns exec mcrelayctl reload`, start to exit), a request straight on
# the control socket (request to reply), and the daemon's own log
# ("reloading the configuration" to "reloaded"). No traffic.
#
#   experiments/scale/reload.sh --rounds 10 --pairs 2 DIR_A DIR_B
#
# Each DIR holds mcrelayd and mcrelayctl. Needs root; every namespace it
# creates (prefix mcreload-PID-) is removed on exit. Wrap it in
# `flock /tmp/mcrelay-bench.lock` on a shared machine.
set -euo pipefail
rounds=10 pairs=1 dirs=()
while (($#)); do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --pairs) pairs=$2; shift 2 ;;
        -h | --help) sed -n '2,13p' "$0"; exit 0 ;;
        *) dirs+=("$1"); shift ;;
    esac
done
((${#dirs[@]} > 0)) || { echo "reload.sh: give at least one build directory (--help)" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "reload.sh: needs root (network namespaces)" >&2; exit 2; }

tag=mcreload-$$
R=$tag-r S=$tag-s D=$tag-d
work=/tmp/$tag
dpid=""
cleanup() {
    if [[ -n $dpid ]]; then
        kill -TERM "$dpid" 2>/dev/null || true
        while kill -0 "$dpid" 2>/dev/null; do sleep 0.05; done
    fi
    for ns in "$S" "$R" "$D"; do ip netns del "$ns" 2>/dev/null || true; done
}
trap cleanup EXIT
mkdir -p -m 0755 "$work"
for ns in "$S" "$R" "$D"; do ip netns add "$ns"; ip netns exec "$ns" ip link set lo up; done
ip link add name s0x netns "$S" type veth peer name va netns "$R"
ip link add name vr netns "$D" type veth peer name vb netns "$R"
ip netns exec "$R" ip addr add 10.18.0.2/24 dev va
ip netns exec "$R" ip addr add 10.19.0.1/24 dev vb
ip netns exec "$S" ip link set s0x up
ip netns exec "$D" ip link set vr up
ip netns exec "$R" ip link set va up
ip netns exec "$R" ip link set vb up

write_config() { # write_config TTL_OF_FLOW_0
    local i k ttl
    {
        printf '[daemon]\nuser = "nobody"\ncontrol_socket = "%s/control.sock"\ncores = [0, 1]\n' "$work"
        for ((i = 0; i < 1000; i++)); do
            k=$((i + 1)) ttl=1
            ((i == 0)) && ttl=$1
            printf '\n[[flow]]\nname = "f%05d"\n' "$i"
            printf 'input = { interface = "va", address = "239.10.%d.%d", port = 5000 }\n' $((k / 256)) $((k % 256))
            printf 'outputs = [\n  { interface = "vb", address = "239.11.%d.%d", port = 6000, ttl = %d },\n' $((k / 256)) $((k % 256)) "$ttl"
            printf '  { interface = "vb", address = "239.12.%d.%d", port = 6001, ttl = %d },\n]\n' $((k / 256)) $((k % 256)) "$ttl"
        done
    } >"$work/c.toml.tmp"
    mv "$work/c.toml.tmp" "$work/c.toml"
}

median() { printf '%s\n' "$@" | sort -n | sed -n "$((($# + 1) / 2))p"; }

one_build() { # one_build DIR: prints one line of medians
    local bin=$1 r t0 t1 ctl=() direct=() own
    write_config 1
    rm -f "$work/control.sock" "$work/pid"
    ip netns exec "$R" sh -c 'echo $$ >"$0"; exec "$@"' "$work/pid" "$bin/mcrelayd" --config "$work/c.toml" >"$work/log" 2>&1 &
    while [[ ! -s $work/pid ]]; do sleep 0.01; done
    dpid=$(cat "$work/pid")
    until [[ -S $work/control.sock ]] &&
        ip netns exec "$R" "$bin/mcrelayctl" --socket "$work/control.sock" status 2>/dev/null |
        grep -qE "^flows: +1000 with 2000 outputs$"; do
        kill -0 "$dpid" 2>/dev/null || { echo "reload.sh: mcrelayd died; log $work/log" >&2; exit 1; }
        sleep 0.1
    done
    for ((r = 1; r <= rounds; r++)); do
        write_config $((r % 2 + 1))
        if ((r % 2)); then
            t0=$(date +%s%N)
            ip netns exec "$R" "$bin/mcrelayctl" --socket "$work/control.sock" reload >/dev/null
            t1=$(date +%s%N)
            ctl+=($(((t1 - t0) / 1000000)))
        else
            direct+=("$(ip netns exec "$R" python3 -c '
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
t = time.monotonic()
s.sendall(b"{\"v\":1,\"cmd\":\"reload\"}\n")
b = b""
while not b.endswith(b"\n"):
    b += s.recv(65536)
print(round((time.monotonic() - t) * 1000, 1))' "$work/control.sock")")
        fi
    done
    own=$(python3 -c '
import sys, datetime
t = lambda s: datetime.datetime.fromisoformat(s.split()[0].replace("Z", "+00:00"))
start, out = None, []
for line in open(sys.argv[1], errors="replace"):
    if "reloading the configuration" in line:
        start = t(line)
    elif "daemon::reload: reloaded" in line and start:
        out.append((t(line) - start).total_seconds() * 1000)
        start = None
out.sort()
print(round(out[len(out) // 2], 1) if out else "?")' "$work/log")
    kill -TERM "$dpid"
    while kill -0 "$dpid" 2>/dev/null; do sleep 0.05; done
    dpid=""
    echo "$bin: mcrelayctl reload (run.sh's way) median $(median "${ctl[@]}") ms (${ctl[*]}); on the socket median $(median "${direct[@]}") ms (${direct[*]}); the daemon's own median $own ms; load $(cut -d' ' -f1 /proc/loadavg)"
}

for ((p = 1; p <= pairs; p++)); do
    for d in "${dirs[@]}"; do one_build "$d"; done
done
