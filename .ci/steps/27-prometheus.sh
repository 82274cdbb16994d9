#!/usr/bin/env bash
# The Prometheus alert rules (deploy/prometheus/mcrelay-alerts.yml) against
# the real Prometheus: install Debian's `prometheus` (promtool and the
# server) without letting it start a server on this host, check the rules,
# run their unit tests (deploy/prometheus/tests/), lint a real scrape of
# mcrelayd with `promtool check metrics`, and run the namespace test where
# a Prometheus server inside a namespace sees an alert fire and resolve
# (crates/mcrelayd/tests/prometheus.rs; it skips without prometheus, so the
# workspace run before this step may have skipped it).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

install_prometheus() {
    # The package's postinst starts prometheus.service, which listens on
    # every interface (:9090). policy-rc.d answering 101 ("action
    # forbidden") makes invoke-rc.d / deb-systemd-invoke skip the start;
    # the unit is then disabled so no boot starts it either.
    local policy=/usr/sbin/policy-rc.d made_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 0755 "$policy"
        made_policy=1
        trap "rm -f '$policy'" EXIT
    fi
    apt-get update -qq
    # No recommends: prometheus-node-exporter would be another service.
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    if [ "$made_policy" = 1 ]; then
        rm -f "$policy"
        trap - EXIT
    fi
    if command -v systemctl >/dev/null; then
        systemctl disable prometheus.service >/dev/null 2>&1 || true
        systemctl stop prometheus.service >/dev/null 2>&1 || true
    fi
}
command -v promtool >/dev/null && command -v prometheus >/dev/null || install_prometheus

# Nothing of the package may be serving on this host.
if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus.service 2>/dev/null; then
    echo "prometheus.service is running on this host; stop it (systemctl disable --now prometheus)"
    exit 1
fi
if ss -Hltn 'sport = :9090' | grep -q .; then
    echo "something listens on :9090 on this host (a prometheus server?); not going on"
    exit 1
fi

promtool check rules deploy/prometheus/mcrelay-alerts.yml
# Every alert of the rules file has a unit test (promtool only runs tests).
alerts=$(sed -n 's/^ *- alert: *//p' deploy/prometheus/mcrelay-alerts.yml | sort -u)
tested=$(sed -n 's/^ *alertname: *//p' deploy/prometheus/tests/*.yml | sort -u)
untested=$(comm -23 <(echo "$alerts") <(echo "$tested"))
[ -z "$untested" ] || { echo "alerts without a promtool test: $untested"; exit 1; }
promtool test rules deploy/prometheus/tests/*.yml
# Every runbook names a section of docs/operations.md that exists.
for anchor in $(sed -n 's/^ *runbook: *"docs\/operations.md#\(.*\)"/\1/p' deploy/prometheus/mcrelay-alerts.yml); do
    grep -qix "### $anchor" docs/operations.md || { echo "runbook #$anchor: no such section in docs/operations.md"; exit 1; }
done


# `promtool check metrics` on a real scrape of mcrelayd (naming problems: a
# counter without _total, units, ...), and a real Prometheus server in a
# namespace seeing McrelayFlowDown fire and resolve.
MCRELAY_REQUIRE_PROMETHEUS=1 cargo test -p mcrelayd --test prometheus --locked
