#!/usr/bin/env bash
# The worker cycle benchmark (bench/cycle.py): assign + report, assign + release, and each
# as one assign carrying `done`, beside redis-benchmark running the same scripts, on one
# Redis. Prints a markdown table. Not a test: nothing here passes or fails on a number.
#
#   bash bench/cycle.sh                       # median of 5 alternating runs of 10 s
#   ROUNDS=3 DURATION=3 bash bench/cycle.sh   # a short run
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-benchmark >/dev/null 2>&1 || missing+=(redis-tools)
if ((${#missing[@]})); then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

cargo build --release --quiet
exec python3 bench/cycle.py "$@"
