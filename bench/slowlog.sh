#!/usr/bin/env bash
# How long each large operation holds Redis, and what that does to assigns on another pool:
# runs bench/slowlog.py (its own redis-server with slowlog-log-slower-than 1000, a
# 1,000,000-member pool, every large operation on it) and prints a markdown table. Not a
# test: nothing here passes or fails on a number.
#
#   bash bench/slowlog.sh                          # builds the release binary first
#   BIN=/path/to/proxy-allocator bash bench/slowlog.sh   # another build (e.g. before a change)
#   MEMBERS=100000 WINDOW=2 bash bench/slowlog.sh  # a smaller pool, shorter windows
#   PIN=1 bash bench/slowlog.sh                    # Redis pinned to a core of its own
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v taskset >/dev/null 2>&1 || missing+=(util-linux)
if ((${#missing[@]})); then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [[ -z "${BIN:-}" ]]; then
    cargo build --release --quiet
fi
exec python3 bench/slowlog.py "$@"
