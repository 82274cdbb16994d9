#!/usr/bin/env bash
# Packet ingress receive methods side by side: io_uring multishot recvmsg on
# provided buffers (the worker's way) vs a TPACKET_V3 ring. See README.md.
#
#   experiments/packet-rx/run.sh            # 3 reps x {1316, 64} B x {50 kpps, unpaced} x 2 methods (~3 min)
#   experiments/packet-rx/run.sh --quick    # 1 rep, 1 s per run
#   experiments/packet-rx/run.sh --help
#
# Needs root. Hold the machine-wide measurement lock when others share it:
#   flock /tmp/mcrelay-netns-tests.lock experiments/packet-rx/run.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

reps=3
sizes="1316 64"
rates="50000 0"
methods="uring tpacket-v3"
duration=3
build=1
recv_args=()
while (($#)); do
    case $1 in
        -h | --help)
            cat <<'EOF'
run.sh [options]
  --quick            1 rep, 1 s per run
  --reps N           repetitions, methods interleaved (default 3)
  --sizes "A B"      UDP payload bytes (default "1316 64")
  --rates "A B"      sender datagrams/s, 0 = unpaced (default "50000 0")
  --methods "A B"    of uring, tpacket-v3, uring-batched (default "uring tpacket-v3")
  --duration S       seconds the sender sends per run (default 3)
  --no-build         use target/release/{packet-rx,loadgen} as they are
  -- ARGS            passed to every `packet-rx recv` (e.g. -- --blocks 64)
EOF
            exit 0
            ;;
        --quick) reps=1 duration=1 ;;
        --reps) reps=$2; shift ;;
        --sizes) sizes=$2; shift ;;
        --rates) rates=$2; shift ;;
        --methods) methods=$2; shift ;;
        --duration) duration=$2; shift ;;
        --no-build) build=0 ;;
        --) shift; recv_args=("$@"); break ;;
        *) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

if [[ $(id -u) -ne 0 ]]; then
    echo "run.sh: needs root (namespaces, AF_PACKET, sysctl, RPS masks)" >&2
    exit 2
fi
if (($(nproc) < 2)); then
    echo "run.sh: needs 2 CPUs (sender on CPU0, receiver on CPU1)" >&2
    exit 2
fi
if ((build)); then
    (cd "$root" && cargo build --quiet --release -p packet-rx -p mcrelay-loadgen)
fi

stamp=$(date -u +%Y%m%dT%H%M%SZ)
log=$(mktemp -d "/tmp/packet-rx.$stamp.XXXX")
# Copies, so a concurrent cargo build can't swap a binary mid-run.
cp "$root/target/release/packet-rx" "$root/target/release/loadgen" "$log/"
pktrx=$log/packet-rx
loadgen=$log/loadgen

ns_s=pktrx-s-$$
ns_r=pktrx-r-$$
old_backlog=$(sysctl -n net.core.netdev_max_backlog)
cleanup() {
    local ns pid
    for ns in "$ns_s" "$ns_r"; do
        if ip netns list 2>/dev/null | grep -qw "$ns"; then
            for pid in $(ip netns pids "$ns" 2>/dev/null); do
                kill -KILL "$pid" 2>/dev/null || true
            done
            ip netns del "$ns" 2>/dev/null || true
        fi
    done
    sysctl -qw "net.core.netdev_max_backlog=$old_backlog" || true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Topology: ns S (sender, CPU0) vS 10.20.1.1 <--veth, MTU 9200--> vR 10.20.1.2 ns R (receiver, CPU1)
ip netns add "$ns_s"
ip netns add "$ns_r"
ip link add vS netns "$ns_s" mtu 9200 type veth peer name vR netns "$ns_r" mtu 9200
in_s() { ip netns exec "$ns_s" "$@"; }
in_r() { ip netns exec "$ns_r" "$@"; }
in_s ip link set lo up
in_r ip link set lo up
in_s ip addr add 10.20.1.1/24 dev vS
in_r ip addr add 10.20.1.2/24 dev vR
in_s ip link set vS up
in_r ip link set vR up
in_s ip route add 224.0.0.0/4 dev vS
# A veth hands a frame to its peer on the *sending* CPU; RPS moves the
# receive path (AF_PACKET delivery included) to the receiver's CPU, so CPU1's
# busy time is all the receiving costs.
in_r sh -c 'echo 2 > /sys/class/net/vR/queues/rx-0/rps_cpus'
sysctl -qw net.core.netdev_max_backlog=10000

softnet_dropped_cpu1() { echo $((16#$(awk 'NR == 2 { print $2 }' /proc/net/softnet_stat))); }
rx_dropped() { in_r cat /sys/class/net/vR/statistics/rx_dropped; }

runs=$log/runs.jsonl
: >"$runs"
run_one() { # rep size rate method
    local rep=$1 size=$2 rate=$3 method=$4 ready=$log/ready pid i
    rm -f "$ready"
    local how
    case $method in
        uring | tpacket-v3) how=(--method "$method") ;;
        # The worker's receive, woken once per batch (DEFER_TASKRUN): at
        # least 32 completions or 1 ms, like the TPACKET_V3 block timeout.
        uring-batched) how=(--method uring --defer-taskrun --wait-nr 32 --min-wait-us 1000 --label uring-batched) ;;
        *) echo "run.sh: unknown method $method" >&2; exit 2 ;;
    esac
    # nice -10: ahead of other users' (niced) builds for the CPU.
    in_r taskset -c 1 nice -n -10 "$pktrx" recv "${how[@]}" --interface vR --cpu 1 \
        --ready-file "$ready" ${recv_args[@]+"${recv_args[@]}"} \
        >"$log/recv.json" 2>"$log/recv.$rep.$size.$rate.$method.err" &
    pid=$!
    for i in $(seq 100); do
        [[ -e $ready ]] && break
        sleep 0.05
    done
    [[ -e $ready ]] || { echo "run.sh: receiver not ready; see $log" >&2; exit 1; }
    local rxd0 snd0 rxd1 snd1
    rxd0=$(rx_dropped)
    snd0=$(softnet_dropped_cpu1)
    in_s taskset -c 0 "$loadgen" send --dest 239.1.1.1:5000 --interface vS \
        --rate "$rate" --duration "$duration" --size "$size" --json >"$log/sender.json"
    wait "$pid"
    rxd1=$(rx_dropped)
    snd1=$(softnet_dropped_cpu1)
    printf '{"rep":%d,"size":%d,"rate":%d,"duration_s":%s,"sender":%s,"receiver":%s,"veth_rx_dropped":%d,"softnet_dropped_cpu1":%d}\n' \
        "$rep" "$size" "$rate" "$duration" "$(cat "$log/sender.json")" "$(cat "$log/recv.json")" \
        $((rxd1 - rxd0)) $((snd1 - snd0)) >>"$runs"
    jq -r '"rep \(.rep) \(.size) B rate \(.rate) \(.receiver.variant): sent \(.sender.sent) got \(.receiver.counts.frames) busy \((.receiver.cpu_busy_ns / .receiver.counts.frames) | floor) ns/frame"' \
        <<<"$(tail -n1 "$runs")" >&2 2>/dev/null || tail -n1 "$runs" >&2
}

for rep in $(seq "$reps"); do
    order=$methods
    # Alternate which method goes first, so neither always follows the other.
    if ((rep % 2 == 0)); then order=$(tr ' ' '\n' <<<"$methods" | tac | tr '\n' ' '); fi
    for size in $sizes; do
        for rate in $rates; do
            for method in $order; do
                run_one "$rep" "$size" "$rate" "$method"
            done
        done
    done
done

mkdir -p "$here/results"
meta=$(printf '{"utc":"%s","kernel":"%s","cpu_model":"%s","commit":"%s","reps":%d,"duration_s":%s,"recv_args":"%s","sender":"loadgen send --rate R --duration %s --size S (CPU0, ns S)","receiver":"packet-rx recv (CPU1, ns R), RPS on vR to CPU1","mtu":9200,"netdev_max_backlog":10000}' \
    "$stamp" "$(uname -r)" "$(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)" \
    "$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)" "$reps" "$duration" \
    "${recv_args[*]+"${recv_args[*]}"}" "$duration")
"$pktrx" summarize "$runs" --out "$here/results/$stamp.json" --meta "$meta"
echo "results: experiments/packet-rx/results/$stamp.json (logs: $log)" >&2
