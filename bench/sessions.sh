#!/usr/bin/env bash
# What sticky sessions cost in memory: 100,000 distinct sessions started in one pool, on a
# Redis of its own and on the embedded store, then the same once they have all ended.
# Prints a markdown table. A benchmark, not a test: nothing here passes or fails on a number.
#
#   bash bench/sessions.sh
#   SESSIONS=10000 bash bench/sessions.sh   # a shorter run
set -euo pipefail
cd "$(dirname "$0")/.."

source bench/release.sh
exec python3 bench/sessions.py "$@"
