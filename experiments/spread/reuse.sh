#!/usr/bin/env bash
# Does every socket bound to a multicast group and joined get a copy of each
# datagram, or does a reuse group share them out? Two receiving sockets on
# 239.77.0.1:5000 with SO_REUSEADDR, SO_REUSEPORT, or both; 100 datagrams
# sent from a peer namespace; prints each socket's count (spread = N needs
# "[100, 100]": every shard's socket sees every datagram). Needs root;
# every packet stays in the two namespaces it creates (mcreuse-PID-{a,b}).
set -euo pipefail
a=mcreuse-$$-a b=mcreuse-$$-b ready=/tmp/mcreuse-$$-ready
cleanup() { ip netns del "$a" 2>/dev/null || true; ip netns del "$b" 2>/dev/null || true; rm -f "$ready"; }
trap cleanup EXIT
ip netns add "$a"
ip netns add "$b"
ip link add name rx0 netns "$a" type veth peer name rx1 netns "$b"
ip -n "$a" addr add 10.77.0.1/24 dev rx0
ip -n "$b" addr add 10.77.0.2/24 dev rx1
ip -n "$a" link set rx0 up
ip -n "$b" link set rx1 up
for mode in reuseaddr reuseport both; do
    rm -f "$ready"
    ip netns exec "$b" python3 - "$mode" "$ready" <<'PY' &
import socket, struct, sys, time
mode, ready = sys.argv[1], sys.argv[2]
socks = []
for _ in range(2):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    if mode in ("reuseaddr", "both"):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if mode in ("reuseport", "both"):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("239.77.0.1", 5000))
    mreq = struct.pack("4s4s", socket.inet_aton("239.77.0.1"), socket.inet_aton("10.77.0.2"))
    s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
    s.setblocking(False)
    socks.append(s)
open(ready, "w").close()
time.sleep(1.5)
counts = []
for s in socks:
    n = 0
    while True:
        try:
            s.recv(2000)
            n += 1
        except BlockingIOError:
            break
    counts.append(n)
print(f"{mode}: {counts}")
PY
    rx=$!
    while [[ ! -e $ready ]]; do sleep 0.05; done
    ip netns exec "$a" python3 -c "
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(('10.77.0.1', 0))
s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton('10.77.0.1'))
for _ in range(100):
    s.sendto(b'x' * 100, ('239.77.0.1', 5000))"
    wait "$rx"
done
