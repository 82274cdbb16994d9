#!/usr/bin/env bash
# SMPTE 2022-1 FEC against tools nobody here wrote, both ways: ffmpeg's prompeg FEC
# into mcrelayd (fec = "2022-1") with 2 % random loss (iptables statistic
# in the relay's namespace), mcrelayd repairing at least as many packets
# as GStreamer's rtpst2022-1-fecdec on the same input and byte-identical
# to it; and mcrelayd's output FEC repaired by GStreamer behind 2 % loss
# (crates/mcrelayd/tests/fec.rs; it skips without these tools, so
# the workspace run before this step may have skipped it). Also two FEC
# legs merged by 2022-7 (its own sender: no tool needed), checking each
# leg's and the flow's FEC figures.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
need=()
command -v ffmpeg >/dev/null || need+=(ffmpeg)
command -v gst-launch-1.0 >/dev/null || need+=(gstreamer1.0-tools)
gst-inspect-1.0 rtpst2022-1-fecdec >/dev/null 2>&1 || need+=(gstreamer1.0-plugins-good)
command -v iptables >/dev/null || need+=(iptables)
if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
cargo test -p mcrelayd --test fec --locked -- --nocapture
