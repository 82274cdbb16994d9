#!/usr/bin/env bash
# SRT outputs and inputs against tools nobody here wrote (crates/mcrelayd/
# tests/srt.rs): srt-live-transmit callers and listener, an ffmpeg srt://
# caller on an output listener and into an SRT input, GStreamer's srtsrc,
# failover between an SRT leg and a multicast leg, and 5 % loss both ways
# with 40 ms RTT (nfdelay, crates/testkit) at latency_ms = 200. The test
# skips without these tools, so the workspace run before this step may
# have skipped parts of it. The loss test runs the 60 s: its
# default, set here too so no MCRELAY_SRT_LOSS_SECONDS in the environment
# (a developer's shorter local run) shortens CI's.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
need=()
command -v ffmpeg >/dev/null || need+=(ffmpeg)
command -v srt-live-transmit >/dev/null || need+=(srt-tools)
command -v gst-launch-1.0 >/dev/null || need+=(gstreamer1.0-tools)
gst-inspect-1.0 srtsrc >/dev/null 2>&1 || need+=(gstreamer1.0-plugins-bad)
command -v iptables >/dev/null || need+=(iptables)
if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# nfdelay, the helper and loadgen beside mcrelayd's test binary.
cargo build --locked -p mcrelay-testkit -p mcrelay-helper -p mcrelay-loadgen -p mcrelayctl --bins
MCRELAY_SRT_LOSS_SECONDS=60 cargo test -p mcrelayd --test srt --locked -- --nocapture
