#!/bin/bash
# Build relay_loopback once per lever variant (variant.py) into $BIN
# (default /tmp/levers-bin), restoring the tree after each.
set -e
cd "$(dirname "$0")/../.."
BIN=${BIN:-/tmp/levers-bin}
mkdir -p "$BIN"
trap 'git checkout -- crates/uring/src crates/pool/src' EXIT
for v in "$@"; do
  git checkout -- crates/uring/src crates/pool/src
  python3 experiments/levers/variant.py "$v"
  cargo build --release -p mcrelay-uring --example relay_loopback
  cp target/release/examples/relay_loopback "$BIN/$v"
done
