#!/usr/bin/env bash
# A soak: a mixed load (assigns on both policies, releases, outcome reports, disables and
# enables, an import every minute) against three replicas on one Redis for MINUTES
# (default 10), printing every minute requests/s per route, errors, each replica's RSS,
# Redis memory and live leases. A benchmark, not a test: it shows whether anything grows
# without bound.
#
#   bash bench/soak.sh
#   MINUTES=3 bash bench/soak.sh
set -euo pipefail
cd "$(dirname "$0")/.."

source bench/release.sh
exec python3 bench/soak.py "$@"
