#!/usr/bin/env bash
# Multicast egress methods side by side: the product's UDP output socket vs
# AF_PACKET with prebuilt headers (± PACKET_QDISC_BYPASS), both through
# io_uring, and optionally sendmmsg(2) batches. See README.md.
#
#   experiments/packet-tx/run.sh            # 3 reps x {50k, 100k, unpaced} x 5 variants (~4 min)
#   experiments/packet-tx/run.sh --quick    # 1 rep, 1 s per run
#   experiments/packet-tx/run.sh --help
#
# Needs root. Hold the machine-wide measurement lock when others share it:
#   flock /tmp/mcrelay-bench.lock experiments/packet-tx/run.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

reps=3
size=1316
rates="50000 100000 0"
variants="udp udp-gso packet packet-bypass packet-bypass-sendmmsg"
duration=3
batch=16
build=1
while (($#)); do
    case $1 in
        -h | --help)
            cat <<'EOF'
run.sh [options]
  --quick              1 rep, 1 s per run
  --reps N             repetitions, variants interleaved (default 3)
  --size B             UDP payload bytes (default 1316)
  --rates "A B"        datagrams/s, 0 = unpaced (default "50000 100000 0")
  --variants "A B"     of udp, packet, packet-bypass, each optionally with
                       -sendmmsg, and udp-gso, packet-gso (default "udp udp-gso
                       packet packet-bypass packet-bypass-sendmmsg")
  --batch N            datagrams per io_uring submit / sendmmsg (default 16)
  --duration S         seconds each run sends (default 3)
  --no-build           use target/release/{packet-tx,loadgen} as they are
EOF
            exit 0
            ;;
        --quick) reps=1 duration=1 ;;
        --reps) reps=$2; shift ;;
        --size) size=$2; shift ;;
        --rates) rates=$2; shift ;;
        --variants) variants=$2; shift ;;
        --batch) batch=$2; shift ;;
        --duration) duration=$2; shift ;;
        --no-build) build=0 ;;
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
    (cd "$root" && cargo build --quiet --release -p packet-tx -p mcrelay-loadgen)
fi

stamp=$(date -u +%Y%m%dT%H%M%SZ)
log=$(mktemp -d "/tmp/packet-tx.$stamp.XXXX")
# Copies, so a concurrent cargo build can't swap a binary mid-run.
cp "$root/target/release/packet-tx" "$root/target/release/loadgen" "$log/"
pkttx=$log/packet-tx
loadgen=$log/loadgen

ns_s=afpkt-s-$$
ns_r=afpkt-r-$$
old_backlog=$(sysctl -n net.core.netdev_max_backlog)
cleanup() {
    local ns pid
    # No `ip netns list | grep -q` test first: with pipefail, grep quitting
    # at the first match can SIGPIPE `ip` and fail the test (it left a pair
    # of namespaces behind once here).
    for ns in "$ns_s" "$ns_r"; do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do
            kill -KILL "$pid" 2>/dev/null || true
        done
        ip netns del "$ns" 2>/dev/null || true
    done
    sysctl -qw "net.core.netdev_max_backlog=$old_backlog" || true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Topology: ns S (sender, CPU0) vS 10.21.1.1 <--veth, MTU 9200--> vR 10.21.1.2 ns R (receiver, CPU1)
ip netns add "$ns_s"
ip netns add "$ns_r"
ip link add vS netns "$ns_s" mtu 9200 type veth peer name vR netns "$ns_r" mtu 9200
in_s() { ip netns exec "$ns_s" "$@"; }
in_r() { ip netns exec "$ns_r" "$@"; }
in_s ip link set lo up
in_r ip link set lo up
in_s ip addr add 10.21.1.1/24 dev vS
in_r ip addr add 10.21.1.2/24 dev vR
in_s ip link set vS up
in_r ip link set vR up
in_s ip route add 224.0.0.0/4 dev vS
# No UDP segmentation offload on the sender's veth (as relay-throughput does
# on the relay's outputs): a GSO send is segmented in software, on the
# sending CPU, as with a NIC without USO.
in_s ethtool -K vS tx-udp-segmentation off >/dev/null
# A veth hands a frame to its peer on the *sending* CPU; RPS moves the
# receive path to CPU1, so CPU0's busy time is the sending alone.
in_r sh -c 'echo 2 > /sys/class/net/vR/queues/rx-0/rps_cpus'
sysctl -qw net.core.netdev_max_backlog=10000

runs=$log/runs.jsonl
: >"$runs"
run_id=100
run_one() { # rep rate variant
    local rep=$1 rate=$2 variant=$3 ready=$log/ready pid i method submit=uring
    case $variant in
        *-sendmmsg) method=${variant%-sendmmsg} submit=sendmmsg ;;
        *-gso) method=${variant%-gso} submit=gso ;;
        *) method=$variant ;;
    esac
    run_id=$((run_id + 1))
    rm -f "$ready"
    # nice -10: ahead of other users' (niced) builds for the CPU. The
    # receiver stops 3 s after the last datagram: on this shared machine the
    # sender was seen to stall for more than 0.5 s mid-run, and a shorter
    # idle exit then ended the receiver early (its loss figure meaningless).
    in_r taskset -c 1 nice -n -10 "$loadgen" recv --group 239.1.1.1:5000 --interface vR \
        --run-id "$run_id" --idle-exit 3 --ready-file "$ready" --json \
        >"$log/recv.json" 2>"$log/recv.$rep.$rate.$variant.err" &
    pid=$!
    for i in $(seq 100); do
        [[ -e $ready ]] && break
        sleep 0.05
    done
    [[ -e $ready ]] || { echo "run.sh: receiver not ready; see $log" >&2; exit 1; }
    in_s taskset -c 0 nice -n -10 "$pkttx" send --method "$method" --submit "$submit" \
        --interface vS --source 10.21.1.1 --dest 239.1.1.1:5000 --size "$size" \
        --rate "$rate" --duration "$duration" --batch "$batch" --run-id "$run_id" --cpu 0 \
        --label "$variant" >"$log/sender.json"
    wait "$pid"
    printf '{"rep":%d,"size":%d,"rate":%d,"load":"%s","sender":%s,"receiver":%s}\n' \
        "$rep" "$size" "$rate" "$(cut -d' ' -f1-3 /proc/loadavg)" \
        "$(cat "$log/sender.json")" "$(cat "$log/recv.json")" >>"$runs"
    jq -r '"rep \(.rep) rate \(.rate) \(.sender.variant): sent \(.sender.sent) unique \(.receiver.unique) corrupt \(.receiver.corrupt) busy \((.sender.cpu_busy_ns / .sender.sent) | floor) ns/pkt thread \(((.sender.thread_user_ns + .sender.thread_sys_ns) / .sender.sent) | floor) ns/pkt load \(.load)"' \
        <<<"$(tail -n1 "$runs")" >&2 2>/dev/null || tail -n1 "$runs" >&2
}

for rep in $(seq "$reps"); do
    order=$variants
    # Alternate the order, so no variant always follows another.
    if ((rep % 2 == 0)); then order=$(tr ' ' '\n' <<<"$variants" | tac | tr '\n' ' '); fi
    for rate in $rates; do
        for variant in $order; do
            run_one "$rep" "$rate" "$variant"
        done
    done
done

mkdir -p "$here/results"
meta=$(printf '{"utc":"%s","kernel":"%s","cpu_model":"%s","commit":"%s","reps":%d,"duration_s":%s,"batch":%d,"size":%d,"sender":"packet-tx send (CPU0, ns S, nice -10)","receiver":"loadgen recv (CPU1, ns R, nice -10), RPS on vR to CPU1","mtu":9200,"tx_udp_segmentation_vS":"off","netdev_max_backlog":10000,"loadavg_end":"%s"}' \
    "$stamp" "$(uname -r)" "$(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)" \
    "$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)" "$reps" "$duration" \
    "$batch" "$size" "$(cut -d' ' -f1-3 /proc/loadavg)")
"$pkttx" summarize "$runs" --out "$here/results/$stamp.json" --meta "$meta"
echo "results: experiments/packet-tx/results/$stamp.json (logs: $log)" >&2
