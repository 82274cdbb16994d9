#!/usr/bin/env bash
# Does a libsrt listener on 0.0.0.0:9000 still serve its caller when the
# host has joined 239.1.1.1 and that group's datagrams to port 9000 reach
# the listener's socket too (what an ingress = "packet" input beside it
# does)? Everything inside a namespace created here.
set -u
ns=srt4junk-$$
d=$(mktemp -d)
ip netns add $ns
cleanup() { for p in $(jobs -p); do kill $p 2>/dev/null; done; wait; ip netns del $ns; rm -rf $d; }
trap cleanup EXIT
ip -n $ns link set lo up
ip -n $ns link add d0 type veth peer name d1 && ip -n $ns link set d1 up
ip -n $ns addr add 10.0.0.1/24 dev d0
ip -n $ns link set d0 up
ip -n $ns route add 224.0.0.0/4 dev d0
X="ip netns exec $ns"
# membership only (never bound), as the packet ingress holds it
$X python3 -c "
import socket,struct,time
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP,socket.IP_ADD_MEMBERSHIP,struct.pack('4s4s',socket.inet_aton('239.1.1.1'),socket.inet_aton('10.0.0.1')))
time.sleep(60)" &
$X srt-live-transmit -q 'srt://:9000?mode=listener' file://con >$d/out.ts 2>$d/listener.err &
sleep 1
$X srt-live-transmit -q -a:no udp://127.0.0.1:7000 'srt://10.0.0.1:9000' 2>$d/caller.err &
sleep 1
before=$($X nstat -az UdpInDatagrams | awk '/UdpInDatagrams/{print $2}')
# junk: TS-like and RTP-like datagrams to the group, 4000 of them
$X python3 -c "
import socket,time
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP,socket.IP_MULTICAST_IF,socket.inet_aton('10.0.0.1'))
s.setsockopt(socket.IPPROTO_IP,socket.IP_MULTICAST_LOOP,1)
ts=(bytes([0x47,1,0,0x10])+bytes(range(184)))*7
rtp=bytes([0x80,0x21,0,1,0,0,0,0,0,0,0,0])+ts
for i in range(4000):
    s.sendto(ts if i%2 else rtp,('239.1.1.1',9000)); time.sleep(0.0005)" &
junk=$!
# the stream, numbered
$X python3 -c "
import socket,time
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)
data=b''.join((bytes([0x47])+k.to_bytes(4,'big')+bytes(183)) for k in range(2000*7))
open('$d/want.ts','wb').write(data)
for i in range(0,len(data),1316):
    s.sendto(data[i:i+1316],('127.0.0.1',7000)); time.sleep(0.001)
time.sleep(1)
z=(bytes([0x47,0x1f,0xff,0x10])+bytes(184))*7
for i in range(300):
    s.sendto(z,('127.0.0.1',7000)); time.sleep(0.001)
"
wait $junk
sleep 1
after=$($X nstat -az UdpInDatagrams | awk '/UdpInDatagrams/{print $2}')
echo "UDP datagrams received in the namespace meanwhile: $((after-before))"
python3 -c "
w=open('$d/want.ts','rb').read(); g=open('$d/out.ts','rb').read()
print('listener output', len(g), 'bytes; starts with the stream whole:', g[:len(w)]==w)"
echo "listener stderr:"; tail -3 $d/listener.err
