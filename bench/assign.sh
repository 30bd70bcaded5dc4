#!/usr/bin/env bash
# Throughput benchmark of the assign path, side by side with redis-benchmark and the HTTP
# ceiling, in one run on this machine. Prints a markdown table. Not a test: nothing here
# passes or fails on a number.
#
#   bash bench/assign.sh                 # pool sizes 100, 10000, 1000000; median of 5 runs of 10 s
#   ROUNDS=9 bash bench/assign.sh        # more runs per figure on a noisier machine
#   SIZES="100 10000" DURATION=5 bash bench/assign.sh
#   WRK_THREADS=2 bash bench/assign.sh   # two wrk threads (redis-benchmark always runs one)
#   PARTS=durable bash bench/assign.sh   # only the embedded store in memory against DATA_DIR
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
exec python3 bench/assign.py "$@"
