#!/usr/bin/env bash
# mcrelayctl top in a real terminal: install Debian's tmux (no services;
# each test starts its own tmux server on a private socket and kills it),
# then run the tests that drive the view through tmux, against a recorded
# daemon and against the real one in network namespaces
# (crates/mcrelayd/tests/top_tui.rs; they skip without tmux, so the
# workspace run before this step may have skipped them).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
command -v tmux >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends tmux >/dev/null; }
cargo test -p mcrelayd --test top_tui --locked
