#!/usr/bin/env bash
# Proves mcrelay's unit under a real systemd as PID 1: boots a minimal
# Debian container (systemd-nspawn --boot) with the .deb built by
# deploy/deb/build.sh, and runs deploy/nspawn/test.sh in it as a unit:
# install, Type=notify READY/STATUS, reload good and bad, traffic relayed
# between veths inside the container, journal priorities, the exposure
# score docs/security.md quotes, the watchdog, upgrades with a good and a
# broken config, the start limit, stop and purge.
#
#   deploy/nspawn/run.sh [DEB]     # default: build it with deploy/deb/build.sh
#
# Needs root. Installs systemd-container and debootstrap if missing. The
# container has a private network (--private-network): every datagram the
# test sends stays inside it. The rootfs is built once by rootfs.sh and
# cached (see there); each run boots a fresh copy of it, removed after.
# Exits 0 only if every check passed; the container's console (the test's
# output) is printed as it runs.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
[ "$(id -u)" = 0 ] || { echo "run.sh: needs root (systemd-nspawn)"; exit 1; }
need() { command -v "$1" >/dev/null || { apt-get update -qq && apt-get install -y -qq "$2" >/dev/null; }; }
need systemd-nspawn systemd-container
need debootstrap debootstrap

t0=$(date +%s)
rootfs=$("$here/rootfs.sh")
echo "rootfs: $rootfs ($(($(date +%s) - t0)) s)"
deb=${1:-$(deploy/deb/build.sh)}
[ -f "$deb" ] || { echo "run.sh: no package at $deb"; exit 1; }
# The figure the test compares with the installed unit's real score.
score=$(tr -s ' \n' '  ' <docs/security.md \
    | sed -n 's/.*`systemd-analyze security --offline=yes deploy\/mcrelay.service` (systemd [0-9]*) rates it \([0-9.]*\).*/\1/p')
[ -n "$score" ] || { echo "run.sh: no exposure score in docs/security.md"; exit 1; }

work=$(mktemp -d /var/tmp/mcrelay-nspawn.XXXXXX)
mounted_run=0
cleanup() {
    rm -rf "$work"
    if [ "$mounted_run" = 1 ]; then umount /run/systemd/nspawn || true; fi
}
trap cleanup EXIT

# nspawn keeps per-container state under /run/systemd/nspawn and expects a
# tmpfs there; hosts whose /run is not one (containers, some CI runners)
# get one just for this run.
if [ "$(findmnt -n -o FSTYPE --target /run/systemd/nspawn 2>/dev/null || true)" != tmpfs ]; then
    mkdir -p /run/systemd/nspawn
    mount -t tmpfs -o mode=0755 tmpfs /run/systemd/nspawn
    mounted_run=1
fi

t1=$(date +%s)
cp -a --reflink=auto "$rootfs" "$work/root"
chmod 0755 "$work/root" # the container's /, whatever the cache's mode
echo "fresh copy of the rootfs: $(($(date +%s) - t1)) s"
ci=$work/root/root/mcrelay-ci
install -d -m 0700 "$ci"
install -m 0644 "$deb" "$ci/mcrelay.deb"
install -m 0755 "$here/test.sh" "$ci/test.sh"
echo "$score" >"$ci/security-score"
# The test runs as a unit once the container reached multi-user.target and
# ends the container with its result (systemctl exit: nspawn's exit code).
cat >"$work/root/etc/systemd/system/mcrelay-ci.service" <<'EOF'
[Unit]
Description=mcrelay under systemd (deploy/nspawn/test.sh)
After=multi-user.target

[Service]
Type=oneshot
ExecStart=/bin/bash /root/mcrelay-ci/test.sh
ExecStopPost=/bin/sh -c 'if [ "$EXIT_STATUS" = 0 ]; then systemctl --no-block exit 0; else systemctl --no-block exit 1; fi'
StandardOutput=journal+console
StandardError=journal+console
TimeoutStartSec=600

[Install]
WantedBy=multi-user.target
EOF
ln -sf ../mcrelay-ci.service "$work/root/etc/systemd/system/multi-user.target.wants/mcrelay-ci.service"

echo "booting the container (systemd-nspawn --boot --keep-unit --register=no --private-network)"
rc=0
timeout --kill-after=30 900 systemd-nspawn --quiet --boot --keep-unit --register=no \
    --private-network --console=read-only --machine="mcrelay-ci-$$" \
    --setenv=SYSTEMD_COLORS=0 --directory="$work/root" -- --show-status=error || rc=$?
result=$(cat "$ci/result" 2>/dev/null || echo "no result (the test did not finish)")
echo "container exited $rc; test: $result; $(($(date +%s) - t0)) s in all"
[ "$rc" = 0 ] && [ "$result" = PASS ]
