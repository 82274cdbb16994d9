#!/usr/bin/env bash
# ingress = "xdp" (issue 30), shown on its own: the XDP program and AF_XDP
# glue against the kernel (crates/sys/tests/xdp.rs), the worker's packet
# path without allocations (crates/uring/tests/no_alloc_xdp.rs, and
# no_alloc_xdp_egress.rs for egress = "xdp") and the
# daemon's namespace tests (crates/mcrelayd/tests/xdp.rs: delivery, other
# traffic untouched, detach after SIGKILL and restart, link flap, helper
# death, reload, standby, merge legs, latency = "low", the MTU limit;
# tests/xdp_egress.rs: egress = "xdp" delivery, fan-out, flap, reload).
# Then: no XDP program of ours is left loaded anywhere (each is held by a
# bpf_link the daemon or test owned; all of them are gone now). bpftool
# reads the kernel's list of programs.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
if ! command -v bpftool >/dev/null; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends bpftool >/dev/null
fi
cargo test -p mcrelay-sys --test xdp --locked
cargo test -p mcrelay-uring --test no_alloc_xdp --locked
cargo test -p mcrelay-uring --test no_alloc_xdp_egress --locked
cargo test -p mcrelayd --test xdp --locked
cargo test -p mcrelayd --test xdp_egress --locked
# A program is freed once its last reference (link, fd) is gone; the
# kernel does that asynchronously (RCU), so allow it a few seconds.
for _ in $(seq 1 50); do
    left=$(bpftool prog show 2>/dev/null | grep -c 'name mcrelay_xdp' || true)
    [ "$left" -eq 0 ] && break
    sleep 0.2
done
if [ "$left" -ne 0 ]; then
    echo "XDP programs left loaded after the tests:" >&2
    bpftool prog show | grep -A3 'name mcrelay_xdp' >&2
    exit 1
fi
echo "no mcrelay_xdp program left loaded"
