#!/usr/bin/env bash
# Instructions per GeoIP lookup of a member at import (the issue's goal: at most 5 µs
# each), counted by callgrind: examples/geoip_lookup.rs runs with FEW and then MANY
# lookups, and the difference of the two totals over MANY - FEW is one lookup's cost,
# the database's writing and reading excluded. Instruction counts repeat however busy
# the machine is; at the 2 to 4 instructions per nanosecond of a current core, N
# instructions take about N / 3 ns.
#
#     bash bench/geoip_lookup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
FEW=${FEW:-10000}
MANY=${MANY:-110000}
cargo build --release --quiet --example geoip_lookup
binary=target/release/examples/geoip_lookup
count() {
    local out
    out=$(mktemp)
    valgrind --tool=callgrind --callgrind-out-file="$out" "$binary" "$1" >/dev/null 2>&1
    local total
    total=$(grep -m1 '^summary:' "$out" | awk '{print $2}')
    rm -f "$out"
    echo "$total"
}
few=$(count "$FEW")
many=$(count "$MANY")
echo "instructions: $FEW lookups $few, $MANY lookups $many"
echo "per lookup: $(( (many - few) / (MANY - FEW) ))"
