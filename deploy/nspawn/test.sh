#!/bin/bash
# Runs INSIDE the container deploy/nspawn/run.sh boots, as a unit started by
# the container's systemd (PID 1): installs the mcrelay .deb and proves the
# unit under a real service manager. Everything it sends stays inside the
# container's private network: two network namespaces it creates (sender,
# receiver) joined to the container's own by veths.
#
# Expects in /root/mcrelay-ci: mcrelay.deb, and security-score (the figure
# docs/security.md quotes). Writes PASS or FAIL to /root/mcrelay-ci/result.
set -euo pipefail
ci=/root/mcrelay-ci
conf=/etc/mcrelay/mcrelay.toml
unit=mcrelay.service
t0=$(date +%s)
step() { printf '\n=== [%3ss] %s\n' "$(($(date +%s) - t0))" "$*"; }
fail() {
    echo "FAIL: $*"
    systemctl status --no-pager "$unit" || true
    journalctl -u "$unit" --no-pager -n 60 || true
    echo FAIL >"$ci/result"
    exit 1
}
prop() { systemctl show -p "$1" --value "$unit"; }
# wait_until SECONDS DESCRIPTION COMMAND...: polls COMMAND every 0.2 s.
wait_until() {
    local limit=$1 what=$2
    shift 2
    local deadline=$(($(date +%s) + limit))
    until "$@"; do
        [ "$(date +%s)" -lt "$deadline" ] || fail "$what: not within ${limit} s"
        sleep 0.2
    done
}
is_active() { [ "$(prop ActiveState)" = active ]; }
status_is() { case "$(prop StatusText)" in "$1"*) return 0 ;; *) return 1 ;; esac; }
new_pid() { local p; p=$(prop MainPID); [ "$p" != 0 ] && [ "$p" != "$1" ] && is_active; }

write_config() { # $1: extra outputs line(s)
    cat >"$conf" <<EOF
# Written by deploy/nspawn/test.sh.
[daemon]
cores = [0]

[[flow]]
name = "ci"
input = { interface = "vin", address = "239.1.1.1", port = 5000 }
outputs = [
  { interface = "vout", address = "198.51.100.2", port = 6000 },
$1
]
EOF
}

# relayed COUNT PORT...: send COUNT numbered datagrams into the flow from
# the sender namespace; every receiver port must get each number once.
relayed() {
    local count=$1 port pids=()
    shift
    for port in "$@"; do
        rm -f "$ci/rx-$port.ready"
        ip netns exec mcci-rcv python3 - "$count" "$port" "$ci/rx-$port" <<'EOF' &
import socket, sys, time
count, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("198.51.100.2", port))
s.settimeout(1.0)
open(out + ".ready", "w").close()
seen, dup, deadline = set(), 0, time.monotonic() + 60
while len(seen) < count and time.monotonic() < deadline:
    try:
        data = s.recv(2048)
    except socket.timeout:
        continue
    n = int(data.split(b" ")[0])
    dup += n in seen
    seen.add(n)
ok = seen == set(range(count)) and dup == 0
print(f"port {port}: {len(seen)} of {count} distinct, {dup} duplicates")
sys.exit(0 if ok else 1)
EOF
        pids+=($!)
        wait_until 30 "receiver on port $port" test -e "$ci/rx-$port.ready"
    done
    ip netns exec mcci-snd python3 - "$count" <<'EOF'
import socket, sys, time
count = int(sys.argv[1])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("192.0.2.1"))
s.bind(("192.0.2.1", 0))
for n in range(count):
    s.sendto(f"{n} mcrelay-nspawn".encode().ljust(200, b"."), ("239.1.1.1", 5000))
    time.sleep(0.001)
EOF
    local rc=0 pid
    for pid in "${pids[@]}"; do
        wait "$pid" || rc=1
    done
    return "$rc"
}

step "install the package"
dpkg -i "$ci/mcrelay.deb"
[ "$(systemctl is-enabled "$unit" || true)" = disabled ] || fail "enabled by the install"

step "network: sender and receiver namespaces joined by veths"
ip netns add mcci-snd
ip netns add mcci-rcv
ip link add vin type veth peer name vsnd netns mcci-snd
ip link add vout type veth peer name vrcv netns mcci-rcv
ip addr add 192.0.2.2/24 dev vin
ip addr add 198.51.100.1/24 dev vout
ip link set vin up
ip link set vout up
ip link set lo up
ip -n mcci-snd addr add 192.0.2.1/24 dev vsnd
ip -n mcci-snd link set vsnd up
ip -n mcci-snd link set lo up
ip -n mcci-rcv addr add 198.51.100.2/24 dev vrcv
ip -n mcci-rcv link set vrcv up
ip -n mcci-rcv link set lo up

step "start: Type=notify, READY=1 with STATUS="
write_config ""
mcrelayd check --config "$conf"
systemctl start "$unit" || fail "systemctl start failed"
is_active || fail "not active after start"
status=$(prop StatusText)
echo "StatusText: $status"
case "$status" in "running; 1 flows (1 relaying), 1 outputs;"*) ;; *) fail "StatusText right after start: '$status'" ;; esac
pid=$(prop MainPID)

step "traffic relayed"
relayed 500 6000 || fail "datagrams lost or duplicated"

step "reload, good: a second output"
write_config '  { interface = "vout", address = "198.51.100.2", port = 6001 },'
systemctl reload "$unit" || fail "good reload refused"
[ "$(prop MainPID)" = "$pid" ] || fail "the reload restarted the daemon"
# The READY=1 that ends the reload carries the new status.
wait_until 10 "StatusText after the reload" status_is "running; 1 flows (1 relaying), 2 outputs;"
relayed 500 6000 6001 || fail "datagrams lost after the reload"

step "reload, bad: rejected, the old config keeps running"
good=$(cat "$conf")
echo 'this is = not [valid' >>"$conf"
if systemctl reload "$unit"; then fail "a broken config was accepted"; fi
is_active || fail "a rejected reload stopped the service"
[ "$(prop MainPID)" = "$pid" ] || fail "a rejected reload restarted the daemon"
wait_until 10 "StatusText after a bad reload" status_is "reload rejected"
printf '%s\n' "$good" >"$conf"
systemctl reload "$unit" || fail "reload back to the good config refused"
relayed 200 6000 6001 || fail "datagrams lost after the rejected reload"

step "journal: warnings at their priority, no colour"
since=$(date '+%Y-%m-%d %H:%M:%S')
ip link set vout down
wait_until 30 "the pause warning in journalctl -p warning" \
    sh -c "journalctl -u $unit -p warning --since '$since' -o cat | grep -q 'interface vout down'"
ip link set vout up
wait_until 30 "the flow to resume" sh -c "systemctl show -p StatusText --value $unit | grep -q '(1 relaying)'"
journalctl -u "$unit" -p warning --since "$since" -o cat --no-pager
journalctl -u "$unit" -p err -o cat --no-pager | grep -q 'reload rejected' || fail "the rejected reload is not at priority err"
if journalctl -u "$unit" -o cat --no-pager | grep -q $'\e'; then fail "ANSI escapes in the journal"; fi
if journalctl -u "$unit" -o cat --no-pager | grep -q '^<[0-7]>'; then fail "unparsed <N> prefixes in the journal"; fi

step "security: the score docs/security.md quotes"
score=$(systemd-analyze security --no-pager "$unit" | sed -n 's/.*Overall exposure level for mcrelay.service: \([0-9.]*\).*/\1/p')
echo "systemd-analyze security $unit: $score"
[ "$score" = "$(cat "$ci/security-score")" ] || fail "exposure $score, docs/security.md says $(cat "$ci/security-score")"

step "watchdog: a stopped daemon is killed and restarted"
restarts=$(prop NRestarts)
kill -STOP "$pid"
wait_until 90 "a restart after the watchdog timeout" new_pid "$pid"
[ "$(prop NRestarts)" -gt "$restarts" ] || fail "NRestarts did not grow"
journalctl -u "$unit" -o cat --no-pager | grep -qi 'watchdog timeout' || fail "no watchdog timeout in the journal"
pid=$(prop MainPID)
relayed 200 6000 6001 || fail "datagrams lost after the watchdog restart"

step "upgrade with a broken config on disk: the running relay stays"
echo 'this is = not [valid' >>"$conf"
dpkg -i "$ci/mcrelay.deb" 2>&1 | tee "$ci/upgrade.log"
grep -q 'NOT restarting' "$ci/upgrade.log" || fail "postinst did not say it kept the relay"
is_active || fail "the upgrade took the relay down"
[ "$(prop MainPID)" = "$pid" ] || fail "the upgrade restarted the relay onto a broken config"
printf '%s\n' "$good" >"$conf"

step "upgrade with a good config: restarted onto the new binary"
dpkg -i "$ci/mcrelay.deb"
wait_until 30 "the restart by the upgrade" new_pid "$pid"
pid=$(prop MainPID)

step "start limit: a broken config ends failed"
since=$(date '+%Y-%m-%d %H:%M:%S')
echo 'this is = not [valid' >>"$conf"
systemctl restart "$unit" || true
# systemd 252 keeps Result=exit-code when the limit stops an automatic
# restart; its message says which it was.
wait_until 120 "the start limit" sh -c "journalctl -u $unit -o cat --since '$since' | grep -q 'Start request repeated too quickly'"
[ "$(prop ActiveState)" = failed ] || fail "not failed after the start limit: $(prop ActiveState)"
restarts=$(prop NRestarts)
sleep 5 # RestartSec=2: a restart that was still to come would have come
[ "$(prop ActiveState)" = failed ] && [ "$(prop NRestarts)" = "$restarts" ] || fail "restarted after the start limit"
journalctl -u "$unit" -p err -o cat --no-pager | grep -q 'nothing was changed' || fail "the config errors are not at priority err"
printf '%s\n' "$good" >"$conf"
systemctl reset-failed "$unit"
systemctl start "$unit" || fail "systemctl start failed"
is_active || fail "did not start again after reset-failed"

step "stop"
systemctl stop "$unit"
[ "$(prop ActiveState)" = inactive ] || fail "not inactive after stop: $(prop ActiveState)"
if grep -qx mcrelayd /proc/[0-9]*/comm 2>/dev/null; then fail "mcrelayd processes left after stop"; fi
if grep -qx mcrelay-helper /proc/[0-9]*/comm 2>/dev/null; then fail "mcrelay-helper processes left after stop"; fi
journalctl -u "$unit" -o cat --no-pager | grep -q 'final ' || fail "no final counters on stop"

step "purge"
dpkg --purge mcrelay
for gone in /usr/bin/mcrelayd /usr/bin/mcrelayctl /etc/mcrelay /usr/lib/systemd/system/"$unit"; do
    [ ! -e "$gone" ] || fail "$gone is still there after purge"
done
[ "$(systemctl show -p LoadState --value "$unit")" = not-found ] || fail "the unit is still loaded after purge"

ip netns del mcci-snd
ip netns del mcci-rcv
step "PASS in $(($(date +%s) - t0)) s"
echo PASS >"$ci/result"
