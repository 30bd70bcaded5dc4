#!/usr/bin/env bash
# What per-target bans cost in memory: 100,000 distinct targets banned in one pool, on a
# Redis of its own and on the embedded store, then the same after the bans are forgotten.
# Prints a markdown table. A benchmark, not a test: nothing here passes or fails on a number.
#
#   bash bench/bans.sh
#   TARGETS=10000 bash bench/bans.sh   # a shorter run
set -euo pipefail
cd "$(dirname "$0")/.."

source bench/release.sh
exec python3 bench/bans.py "$@"
