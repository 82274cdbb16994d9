#!/usr/bin/env bash
# Which UDP binds the kernel allows beside libsrt's listener socket (see README.md).
# Everything inside a namespace created here; nothing is sent.
set -u
ns=srt4exp-$$
ip netns add $ns
trap 'ip netns del $ns' EXIT
ip -n $ns link set lo up
ip -n $ns link add d0 type veth peer name d1 && ip -n $ns link set d1 up
ip -n $ns addr add 10.0.0.1/24 dev d0
ip -n $ns addr add 10.0.0.2/24 dev d0
ip -n $ns -6 addr add fd00::1/64 dev d0 nodad
ip -n $ns link set d0 up
ip -n $ns route add 224.0.0.0/4 dev d0
# case: udp bind (as open_ingress: SO_REUSEADDR, v6only for IPv6) first, then srt listener; and the other order
run() { # $1 udp addr  $2 srt uri host  $3 order
  ip netns exec $ns python3 - "$1" "$2" "$3" <<'PY'
import socket, subprocess, sys, time
udp, srt, order = sys.argv[1], sys.argv[2], sys.argv[3]
def udp_bind():
    fam = socket.AF_INET6 if ':' in udp else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if fam == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    try:
        s.bind((udp, 9000)); return s, 'ok'
    except OSError as e:
        return None, 'udp bind: ' + e.strerror
def srt_start():
    p = subprocess.Popen(['srt-live-transmit', '-q', f'srt://{srt}:9000?mode=listener', 'file://con'],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)
    if p.poll() is None:
        return p, 'ok'
    return None, 'srt exited: ' + p.stderr.read().decode(errors='replace').strip().splitlines()[-1][:120]
if order == 'udp-first':
    u, ur = udp_bind(); p, pr = srt_start()
else:
    p, pr = srt_start(); u, ur = udp_bind()
print(f'{order:9} udp {udp:12} srt {srt:10}: udp {ur}; srt {pr}')
if p: p.kill(); p.wait()
PY
}
for order in udp-first srt-first; do
  run 239.1.1.1 0.0.0.0 $order
  run 239.1.1.1 '[::]' $order
  run 239.1.1.1 10.0.0.1 $order
  run 10.0.0.1 10.0.0.1 $order
  run 10.0.0.1 10.0.0.2 $order
  run 10.0.0.1 0.0.0.0 $order
  run ff3e::1 0.0.0.0 $order
  run ff3e::1 '[::]' $order
  run ff3e::1 '[fd00::1]' $order
done
