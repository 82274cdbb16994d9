#!/usr/bin/env bash
# README "A first stream: ffmpeg -> mcrelay -> ffplay": the README's own
# shell blocks (read from README.md by the test) run in three network
# namespaces with Debian's ffmpeg/ffprobe (crates/mcrelayd/tests/
# readme_walkthrough.rs; it skips without ffmpeg, so the workspace run
# before this step may have skipped it). iptables for the loop guard's
# test (a DNAT rule that sends the relay's output back to its input).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
command -v ffprobe >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends ffmpeg >/dev/null; }
command -v iptables >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends iptables >/dev/null; }
MCRELAY_REQUIRE_FFMPEG=1 cargo test -p mcrelayd --test readme_walkthrough --locked -- --nocapture
cargo test -p mcrelayd --test loop_guard --locked -- --nocapture
