#!/usr/bin/env bash
# The unit under a real systemd as PID 1: deploy/nspawn/run.sh boots a
# minimal Debian container (systemd-nspawn, private network) with the .deb
# and checks install, READY/STATUS, reloads, relaying, journal priorities,
# the exposure score, the watchdog, upgrades, the start limit, stop and
# purge. The rootfs is cached in /var/cache/mcrelay-ci (debootstrap from this
# machine's apt mirror, about 3 min the first time); the package is the one
# 50-deb.sh built (cargo finds nothing to rebuild). 4 min 17 s cold, 1 min
# 26 s cached (docs/operations.md). Needs root.
set -euo pipefail
deploy/nspawn/run.sh
