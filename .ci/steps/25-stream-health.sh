#!/usr/bin/env bash
# Stream health against a real encoder: install Debian's ffmpeg (no
# services), then run the namespace test that relays ffmpeg's
# `-f rtp_mpegts` stream through the daemon and expects zero errors on
# every counter (crates/mcrelayd/tests/health.rs; it skips without ffmpeg,
# so the workspace run before this step may have skipped it), and the
# redundancy test that merges a recorded ffmpeg stream from two lossy legs
# (crates/mcrelayd/tests/redundancy.rs), and the failover between two
# independent ffmpeg encoders decoded with `rtp_rewrite`
# (crates/mcrelayd/tests/hitless.rs; it too skips without ffmpeg, so on a
# fresh machine only this step runs it).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
command -v ffmpeg >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends ffmpeg >/dev/null; }
command -v iptables >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends iptables >/dev/null; }
cargo test -p mcrelayd --test health --locked -- a_real_encoders_stream_shows_no_errors
cargo test -p mcrelayd --test redundancy --locked -- a_real_encoders_stream_merged_from_two_lossy_legs_decodes_cleanly
cargo test -p mcrelayd --test hitless --locked -- ffmpeg_decodes_straight_through_a_failover_with_rtp_rewrite
