#!/usr/bin/env bash
# The warm-standby pair under the real keepalived (crates/mcrelayd/tests/
# keepalived.rs; it skips without keepalived, so the workspace run before
# this step may have skipped it). Installs Debian's keepalived without
# letting its service start: a policy-rc.d that denies every start while
# apt runs (removed afterwards if this step made it), then the unit is
# disabled and, if systemd runs it anyway, stopped. The test runs its own
# keepalived processes inside the network namespaces it creates.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
if [ ! -x /usr/sbin/keepalived ]; then
    made_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\n# keepalived CI step: no service starts during apt-get install\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 0755 /usr/sbin/policy-rc.d
        made_policy=1
    fi
    trap '[ "$made_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d || true' EXIT
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends keepalived >/dev/null
    [ "$made_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
    trap - EXIT
fi
# No keepalived service on the host's own interfaces, now or at a boot.
if command -v systemctl >/dev/null; then
    systemctl disable keepalived.service >/dev/null 2>&1 || true
    if systemctl is-active --quiet keepalived.service 2>/dev/null; then
        systemctl stop keepalived.service
    fi
fi
MCRELAY_REQUIRE_KEEPALIVED=1 cargo test -p mcrelayd --test keepalived --locked -- --nocapture
