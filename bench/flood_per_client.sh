#!/usr/bin/env bash
# One client's flood against the others: builds the release binary, starts it on the
# embedded store with both caps at CAP (default 2,000, so a default share of 500 per client
# on each port) and head and unauthenticated timeouts of a minute (so that the attacker
# keeps what it gets for the whole run, the worst case for the share), then
# bench/flood_per_client.py floods both ports with ATTACK idle connections each from
# 127.0.0.2 (default 2,500) while 127.0.0.3 asks for /livez and opens gateway tunnels, and
# prints what each got. Ends with the service's per-client log lines and metrics.
#
#   bash bench/flood_per_client.sh
#   CAP=400 ATTACK=1000 SECONDS_=10 bash bench/flood_per_client.sh
set -euo pipefail
cd "$(dirname "$0")/.."

CAP=${CAP:-2000}
ATTACK=${ATTACK:-2500}
SECONDS_=${SECONDS_:-20}
TOKEN=bench-admin-token

# The attacker holds a file per connection on each port.
ulimit -Hn $((2 * ATTACK + 4096)) 2>/dev/null || true
ulimit -n "$(ulimit -Hn)"

free_port() {
    local port
    while :; do
        port=$((20000 + RANDOM % 40000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/${port}") 2>/dev/null; then
            echo "${port}"
            return
        fi
    done
}

echo "==> cargo build --release"
cargo build --release --quiet

work="$(mktemp -d)"
pid=""
cleanup() {
    if [[ -n "${pid}" ]]; then
        kill "${pid}" 2>/dev/null || true
        wait "${pid}" 2>/dev/null || true
    fi
    rm -rf "${work}"
}
trap cleanup EXIT

api="$(free_port)"
gateway="$(free_port)"
# No worker token: the gateway is on loopback, where any proxy password is taken.
LISTEN_ADDR="127.0.0.1:${api}" GATEWAY_LISTEN="127.0.0.1:${gateway}" ADMIN_TOKEN="${TOKEN}" \
    MAX_CONNECTIONS="${CAP}" GATEWAY_MAX_CONNECTIONS="${CAP}" \
    HEADER_READ_TIMEOUT_MS=60000 UNAUTHENTICATED_TIMEOUT_MS=60000 \
    LOG_FORMAT=json RUST_LOG=info target/release/proxy-allocator >"${work}/service.log" 2>&1 &
pid=$!
# Ready once it answers and its start lines have reached the log (written every 100 ms).
for _ in $(seq 200); do
    curl -sf "http://127.0.0.1:${api}/livez" >/dev/null \
        && grep -q '"gateway listening"' "${work}/service.log" && break
    sleep 0.05
done

echo "==> $(date -u +%Y-%m-%dT%H:%MZ); $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
grep -E '"(listening|gateway listening)"' "${work}/service.log" \
    | python3 -c 'import json, sys
for line in sys.stdin:
    v = json.loads(line)
    print("service:", v["message"], {k: v[k] for k in ("max_connections", "max_connections_per_client")})'

python3 bench/flood_per_client.py --api "${api}" --gateway "${gateway}" --token "${TOKEN}" \
    --attack "${ATTACK}" --seconds "${SECONDS_}"

echo "==> the service's log lines about a client's share"
grep -c '"client at its share of connections' "${work}/service.log" | sed 's/^/lines: /' || true
grep '"client at its share of connections' "${work}/service.log" | cut -c1-260 || true
echo "==> connection metrics"
curl -s "http://127.0.0.1:${api}/metrics" \
    | grep -E '^pa_connections_(refused|refused_per_client|max_per_client|open)' || true
