#!/usr/bin/env bash
# What many pools cost when nobody uses them: for 1,000 / 10,000 / 100,000 pools on a Redis
# of its own, an idle minute with one replica and with three (commands/s, Redis CPU, RSS,
# `/metrics` bytes), the lease-reclaim and cooldown-return latency in a pool nobody assigns
# from, and the embedded store's RSS per pool and per member. Prints markdown tables. A
# benchmark, not a test: nothing here passes or fails on a number.
#
#   bash bench/pools.sh
#   SIZES="1000 10000" IDLE_SECONDS=20 bash bench/pools.sh   # a shorter run
#   REPLICAS=1 EMBEDDED=0 bash bench/pools.sh
set -euo pipefail
cd "$(dirname "$0")/.."

source bench/release.sh
exec python3 bench/pools.py "$@"
