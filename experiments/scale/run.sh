#!/usr/bin/env bash
# A thousand channels on one host (issue 18): mcrelayd with N flows x 2
# outputs on 2 workers over one veth pair in, one out; groups 239.10.x.y in,
# 239.11.x.y:6000 and 239.12.x.y:6001 out. Measures, against the issue's
# targets:
#   start-up until every flow relays (mcrelayctl status)   <= 2 s
#   RSS and open fds, per flow (a 1-flow daemon is the base)
#   CPU per relayed packet at N flows vs 1 flow, same rate  within 10 %
#   one /metrics scrape (time, bytes)                       <= 50 ms
#   mcrelayctl flows (time, bytes of --json)                <= 200 ms
#   mcrelayctl status (time, bytes of its reply)
#   a reload changing one flow, under traffic               <= 100 ms, the
#     other N-1 flows lose nothing (every datagram checked byte by byte);
#     then five idle ones (median), each also as the daemon's log times it
#   the input interface down and up: until every flow relays again
#   mcrelayd check of a 10 000-flow file                    <= 1 s
#
#   experiments/scale/run.sh                  # build, then measure (~2 min)
#   experiments/scale/run.sh --bin DIR        # use DIR/{mcrelayd,mcrelayctl,loadgen}
#   experiments/scale/run.sh --flows 200 --rate 20000 --seconds 5
#
# Needs root. Every packet is sent inside the three namespaces the script
# creates (prefix mcscale-PID-) and removes, also on Ctrl-C.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

flows=1000
rate=20000
seconds=5
bin=""
while (($#)); do
    case $1 in
        --flows) flows=$2; shift 2 ;;
        --rate) rate=$2; shift 2 ;;
        --seconds) seconds=$2; shift 2 ;;
        --bin) bin=$2; shift 2 ;;
        -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "run.sh: unknown option $1 (--help)" >&2; exit 2 ;;
    esac
done
if [[ $(id -u) -ne 0 ]]; then
    echo "run.sh: needs root (network namespaces); run it as root" >&2
    exit 2
fi
for tool in ip curl python3; do
    command -v "$tool" >/dev/null || { echo "run.sh: $tool is missing" >&2; exit 2; }
done
if [[ -z $bin ]]; then
    echo "run.sh: cargo build --release -p mcrelayd -p mcrelayctl -p mcrelay-loadgen" >&2
    (cd "$root" && cargo build --release -p mcrelayd -p mcrelayctl -p mcrelay-loadgen)
    bin=$root/target/release
fi
mcrelayd=$bin/mcrelayd mcrelayctl=$bin/mcrelayctl loadgen=${LOADGEN:-$bin/loadgen}
for b in "$mcrelayd" "$mcrelayctl" "$loadgen"; do
    [[ -x $b ]] || { echo "run.sh: $b is missing" >&2; exit 2; }
done

tag=mcscale-$$
S=$tag-s R=$tag-r D=$tag-d
work=/tmp/$tag
pids=()
cleanup() {
    local p ns
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    for ns in "$S" "$R" "$D"; do
        if ip netns list 2>/dev/null | grep -qw "$ns"; then
            for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
            ip netns del "$ns" 2>/dev/null || true
        fi
    done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
mkdir -p -m 0755 "$work"
chmod 0755 "$work"

in_ns() { local ns=$1; shift; ip netns exec "$ns" "$@"; }
now_ns() { date +%s%N; }
ms_since() { echo $((($(now_ns) - $1) / 1000000)); }

# --- the namespaces: sender S --va-- relay R --vb-- receivers D ---
for ns in "$S" "$R" "$D"; do ip netns add "$ns"; in_ns "$ns" ip link set lo up; done
ip link add name s0x netns "$S" type veth peer name va netns "$R"
ip link add name vr netns "$D" type veth peer name vb netns "$R"
in_ns "$S" ip addr add 10.18.0.1/24 dev s0x
in_ns "$R" ip addr add 10.18.0.2/24 dev va
in_ns "$R" ip addr add 10.19.0.1/24 dev vb
in_ns "$D" ip addr add 10.19.0.2/24 dev vr
links_up() {
    in_ns "$S" ip link set s0x up
    in_ns "$R" ip link set va up
    in_ns "$R" ip link set vb up
    in_ns "$D" ip link set vr up
    in_ns "$S" ip route add 224.0.0.0/4 dev s0x
}
for k in all default va vb; do in_ns "$R" sysctl -qw "net.ipv4.conf.$k.rp_filter=0"; done
# One receiver socket joins every output group of a range.
in_ns "$D" sysctl -qw net.ipv4.igmp_max_memberships=$((flows + 16))

group() { # group FIRST_OCTETS(a.b) INDEX -> a.b.x.y, counting from .0.1
    local n=$(($2 + 1))
    echo "$1.$((n / 256)).$((n % 256))"
}

write_config() { # write_config FILE FLOWS [TTL_OF_FLOW_0]
    local file=$1 n=$2 ttl0=${3:-1} i
    {
        echo "[daemon]"
        echo "user = \"nobody\""
        echo "control_socket = \"$work/control.sock\""
        echo "cores = [0, 1]"
        echo "metrics_listen = \"127.0.0.1:9464\""
        echo "log_level = \"info\""
        for ((i = 0; i < n; i++)); do
            local ttl=1
            ((i == 0)) && ttl=$ttl0
            printf '\n[[flow]]\nname = "f%05d"\n' "$i"
            echo "input = { interface = \"va\", address = \"$(group 239.10 "$i")\", port = 5000 }"
            echo "outputs = ["
            echo "  { interface = \"vb\", address = \"$(group 239.11 "$i")\", port = 6000, ttl = $ttl },"
            echo "  { interface = \"vb\", address = \"$(group 239.12 "$i")\", port = 6001, ttl = $ttl },"
            echo "]"
        done
    } >"$file.tmp"
    mv "$file.tmp" "$file"
}

ctl() { in_ns "$R" "$mcrelayctl" --socket "$work/control.sock" "$@"; }

daemon_pid=""
start_daemon() { # start_daemon CONFIG LOG -> sets daemon_pid and startup_ms
    local t0
    rm -f "$work/control.sock"
    t0=$(now_ns)
    # `ip netns exec` may stay the parent: the daemon's own PID from sh.
    rm -f "$work/daemon.pid"
    # --gso off: GSO batches consecutive datagrams of one flow into one
    # send, which one flow at 20 kpps gets and a round-robin over N flows
    # never does; off in both runs, the CPU ratio shows what N costs.
    in_ns "$R" sh -c 'echo $$ >"$0"; exec "$@"' "$work/daemon.pid" "$mcrelayd" --config "$1" --gso off >"$2" 2>&1 &
    pids+=("$!")
    while [[ ! -s $work/daemon.pid ]]; do sleep 0.005; done
    daemon_pid=$(cat "$work/daemon.pid")
    pids+=("$daemon_pid")
    local deadline=$((SECONDS + 120))
    while ((SECONDS < deadline)); do
        if [[ -S $work/control.sock ]] && out=$(ctl status 2>/dev/null) &&
            grep -qE "^flows: +[0-9]+ with [0-9]+ outputs$" <<<"$out"; then
            startup_ms=$(ms_since "$t0")
            return 0
        fi
        kill -0 "$daemon_pid" 2>/dev/null || { echo "run.sh: mcrelayd died; log $2" >&2; exit 1; }
        sleep 0.02
    done
    echo "run.sh: flows not all relaying after 120 s; log $2" >&2
    exit 1
}

stop_daemon() {
    kill -TERM "$daemon_pid"
    while kill -0 "$daemon_pid" 2>/dev/null; do sleep 0.02; done
}

rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
fds() { ls "/proc/$1/fd" | wc -l; }
# utime+stime of a process (all threads), in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# traffic N_GROUPS PER_GROUP [EXCLUDE] -> prints the two receivers' JSON
# lines; the sender at $rate pps aggregate.
traffic() {
    local n=$1 per=$2 exclude=${3:-}
    local ex=()
    [[ -n $exclude ]] && ex=(--exclude "$exclude")
    rm -f "$work"/ready-*
    in_ns "$D" "$loadgen" many-recv --first 239.11.0.1:6000 --groups "$n" --interface vr \
        --per-group "$per" "${ex[@]}" --json --ready-file "$work/ready-a" >"$work/recv-a.json" &
    r1=$!
    in_ns "$D" "$loadgen" many-recv --first 239.12.0.1:6001 --groups "$n" --interface vr \
        --per-group "$per" "${ex[@]}" --json --ready-file "$work/ready-b" >"$work/recv-b.json" &
    r2=$!
    pids+=("$r1" "$r2")
    while [[ ! -e $work/ready-a || ! -e $work/ready-b ]]; do sleep 0.02; done
    in_ns "$S" "$loadgen" many-send --first 239.10.0.1:5000 --groups "$n" --source 10.18.0.1 \
        --rate "$rate" --per-group "$per" --json >"$work/send.json" &
    sender=$!
    pids+=("$sender")
}
# Wait for the sender and both receivers; sets got: the datagrams both
# received.
traffic_wait() {
    wait "$sender"
    wait "$r1" 2>/dev/null || true
    wait "$r2" 2>/dev/null || true
    got=$(($(field "$work/recv-a.json" received) + $(field "$work/recv-b.json" received)))
}

field() { python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read())[sys.argv[2]])' "$@"; }

echo "== mcrelay scale: $flows flows x 2 outputs, 2 workers, $rate pps aggregate, ${seconds}s per traffic run"
echo "   binaries: $bin ($(cd "$root" && git rev-parse --short HEAD 2>/dev/null || echo ?))"
tick=$(getconf CLK_TCK)
median() { printf '%s\n' "$@" | sort -n | sed -n "$((($# + 1) / 2))p"; }

# --- N flows, started right after the links came up (as at boot) ---
write_config "$work/many.toml" "$flows"
links_up
start_daemon "$work/many.toml" "$work/many.log"
msn=$startup_ms
rssn=$(rss_kb "$daemon_pid") fdn=$(fds "$daemon_pid")
paused=$(grep -c "interface va down" "$work/many.log" || true)
echo "$flows flows: start-up until every flow relays ${msn} ms (target 2000); $paused 'interface va down' log lines"

pern=$((rate * seconds / flows))
((pern > 0)) || pern=1
c0=$(cpu_ticks "$daemon_pid")
traffic "$flows" "$pern"
traffic_wait
gotn=$got
c1=$(cpu_ticks "$daemon_pid")
lostn=$(($(field "$work/recv-a.json" lost) + $(field "$work/recv-b.json" lost)))
seen=$(($(field "$work/recv-a.json" groups_seen) + $(field "$work/recv-b.json" groups_seen)))
corrupt=$(($(field "$work/recv-a.json" corrupt) + $(field "$work/recv-b.json" corrupt)))
ns_pktn=$(python3 -c "print(round(($c1-$c0)/$tick*1e9/max(1,$gotn)))")
echo "  traffic: $gotn datagrams received from $seen of $((2 * flows)) output groups, lost $lostn, corrupt $corrupt; daemon CPU ${ns_pktn} ns per relayed datagram"

# Control plane at N flows (idle).
metrics_t=()
for _ in 1 2 3 4 5; do
    metrics_t+=("$(in_ns "$R" curl -s -o "$work/metrics.txt" -w '%{time_total}\n' http://127.0.0.1:9464/metrics)")
done
mbytes=$(stat -c %s "$work/metrics.txt")
mmed=$(median "${metrics_t[@]}")
python3 -c "print(f'  /metrics: median of 5 {float(\"$mmed\")*1000:.1f} ms, {$mbytes} bytes (target 50 ms)')"
flows_t=()
for _ in 1 2 3 4 5; do
    t0=$(now_ns); ctl flows --sample 0 >"$work/flows.txt"; flows_t+=("$(ms_since "$t0")")
done
ctl flows --json --sample 0 >"$work/flows.json"
echo "  mcrelayctl flows --sample 0: median of 5 $(median "${flows_t[@]}") ms (target 200); text $(stat -c %s "$work/flows.txt") bytes, --json $(stat -c %s "$work/flows.json") bytes"

# mcrelayctl status, and the size of its reply: what this mcrelayctl asks
# for, and the whole snapshot that a client asking {"cmd":"status"} without
# "summary" gets (all a daemon before the summary sends to either).
reply_bytes() { # reply_bytes REQUEST_JSON -> bytes of the reply line
    in_ns "$R" python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(sys.argv[2].encode() + b"\n")
b = b""
while not b.endswith(b"\n"):
    chunk = s.recv(1 << 20)
    if not chunk:
        break
    b += chunk
print(len(b))' "$work/control.sock" "$1"
}
status_t=()
for _ in 1 2 3 4 5; do
    t0=$(now_ns); ctl status >"$work/status.txt"; status_t+=("$(ms_since "$t0")")
done
echo "  mcrelayctl status: median of 5 $(median "${status_t[@]}") ms; reply to {\"summary\":true} $(reply_bytes '{"v":1,"cmd":"status","summary":true}') bytes, to a plain status (old clients) $(reply_bytes '{"v":1,"cmd":"status"}') bytes"

# The daemon's own time for its latest reload: its log's "reloading the
# configuration" to "reloaded", without mcrelayctl and `ip netns exec`.
daemon_reload_ms() {
    python3 -c '
import re, sys, datetime
start = end = None
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"(\S+Z)\s", line)
    if not m:
        continue
    if "reloading the configuration" in line:
        start, end = m.group(1), None
    elif "daemon::reload: reloaded" in line:
        end = m.group(1)
t = lambda s: datetime.datetime.fromisoformat(s.replace("Z", "+00:00"))
print(round((t(end) - t(start)).total_seconds() * 1000, 1) if start and end else "?")' "$1"
}

# A reload changing flow 0 (its outputs' TTL) half-way through traffic.
traffic "$flows" "$pern" 0
sleep "$(python3 -c "print($seconds/2)")"
write_config "$work/many.toml" "$flows" 2
t0=$(now_ns)
ctl reload >/dev/null
reload_ms=$(ms_since "$t0")
traffic_wait
lostr=$(($(field "$work/recv-a.json" lost) + $(field "$work/recv-b.json" lost)))
exlost=$(($(field "$work/recv-a.json" excluded_lost) + $(field "$work/recv-b.json" excluded_lost)))
echo "  reload changing flow f00000 under traffic: ${reload_ms} ms (target 100; the daemon's own $(daemon_reload_ms "$work/many.log") ms); the other $((flows - 1)) flows lost $lostr (target 0); f00000 lost $exlost"
# Five more, idle, alternating the TTL back and forth: the median.
reload_t=() reload_d=()
for round in 1 2 3 4 5; do
    write_config "$work/many.toml" "$flows" $(((round + 1) % 2 + 1))
    t0=$(now_ns)
    ctl reload >/dev/null
    reload_t+=("$(ms_since "$t0")")
    reload_d+=("$(daemon_reload_ms "$work/many.log")")
done
echo "  reload changing flow f00000, idle: median of 5 $(median "${reload_t[@]}") ms (all: ${reload_t[*]}); the daemon's own: median $(median "${reload_d[@]}") ms"

# The input interface down (every flow pauses), then up: until all relay.
all_relaying() { ctl status 2>/dev/null | grep -qE "^flows: +[0-9]+ with [0-9]+ outputs$"; }
in_ns "$R" ip link set va down
deadline=$((SECONDS + 60))
until ctl status | grep -q "(0 relaying"; do
    ((SECONDS < deadline)) || { echo "run.sh: flows not paused after 60 s" >&2; exit 1; }
    sleep 0.05
done
t0=$(now_ns)
in_ns "$R" ip link set va up
deadline=$((SECONDS + 120))
until all_relaying; do
    ((SECONDS < deadline)) || { echo "run.sh: flows not resumed after 120 s" >&2; exit 1; }
    sleep 0.02
done
echo "  va down, every flow paused; va up: all $flows relaying again after $(ms_since "$t0") ms"
stop_daemon

# --- 1 flow: the base for the per-flow cost and CPU per datagram ---
write_config "$work/one.toml" 1
start_daemon "$work/one.toml" "$work/one.log"
ms1=$startup_ms
rss1=$(rss_kb "$daemon_pid") fd1=$(fds "$daemon_pid")
c0=$(cpu_ticks "$daemon_pid")
traffic 1 $((pern * flows))
traffic_wait
got1=$got
c1=$(cpu_ticks "$daemon_pid")
lost1=$(($(field "$work/recv-a.json" lost) + $(field "$work/recv-b.json" lost)))

# A flow added to the idle daemon: from the reload request to its first
# datagram at a receiver, with its input already carrying 10 000/s (so the
# first datagram after the flow starts is at most 0.1 ms away). Includes
# starting mcrelayctl and the reload itself; 5 rounds (add, then remove).
add_ms=()
for round in 1 2 3 4 5; do
    in_ns "$S" "$loadgen" send --dest 239.10.0.2:5000 --source 10.18.0.1 --interface s0x \
        --rate 10000 --duration 30 --size 200 >/dev/null &
    tx=$!
    pids+=("$tx")
    in_ns "$D" "$loadgen" recv --group 239.11.0.2:6000 --interface vr --expect 1 \
        --idle-exit 0 --duration 20 --ready-file "$work/ready-add" >/dev/null &
    rx=$!
    pids+=("$rx")
    while [[ ! -e $work/ready-add ]]; do sleep 0.01; done
    rm -f "$work/ready-add"
    write_config "$work/one.toml" 2
    t0=$(now_ns)
    ctl reload >/dev/null
    wait "$rx"
    add_ms+=("$(ms_since "$t0")")
    kill "$tx" 2>/dev/null || true
    wait "$tx" 2>/dev/null || true
    write_config "$work/one.toml" 1
    ctl reload >/dev/null
done
echo "flow added to an idle daemon: reload request to first datagram relayed, median of 5 $(median "${add_ms[@]}") ms (all: ${add_ms[*]})"
stop_daemon
ns_pkt1=$(python3 -c "print(round(($c1-$c0)/$tick*1e9/max(1,$got1)))")
echo "1 flow: start-up ${ms1} ms, RSS ${rss1} kB, ${fd1} fds; traffic: $got1 datagrams received, lost $lost1; daemon CPU ${ns_pkt1} ns per relayed datagram"
python3 -c "print(f'per flow: {($rssn-$rss1)/max(1,$flows-1):.1f} kB RSS and {($fdn-$fd1)/max(1,$flows-1):.2f} fds ($flows flows: RSS {$rssn} kB, {$fdn} fds)')"
python3 -c "print(f'CPU per relayed datagram, $flows flows / 1 flow at the same $rate pps: {$ns_pktn/max(1,$ns_pkt1):.2f} (target <= 1.10)')"

# --- mcrelayd check of a 10 000-flow file (40 000 sockets: where the hard
# fd limit is lower, check parses and validates it all and then refuses it
# for the fd budget; timed either way) ---
write_config "$work/check.toml" 10000
check_t=()
for _ in 1 2 3; do
    t0=$(now_ns)
    verdict=ok
    "$mcrelayd" check --config "$work/check.toml" >/dev/null 2>"$work/check.err" || verdict="refused: $(head -c 120 "$work/check.err")..."
    check_t+=("$(ms_since "$t0")")
done
echo "mcrelayd check of 10000 flows: median of 3 $(median "${check_t[@]}") ms (target 1000); $verdict"
