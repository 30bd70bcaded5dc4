#!/usr/bin/env bash
# Connection flood: builds the release binary, starts it on the embedded store with a probe
# port and default timeouts, under an open-file limit of SERVICE_NOFILE (default 20,000),
# then (bench/flood.py) opens CONNECTIONS idle connections to the API port (default 20,000)
# and reports how long until each was closed, the latency of /livez on the probe port
# throughout, and the answer to a request whose body never arrives. Ends with the service's
# log lines about accept errors and the cap, and its connection metrics.
#
#   bash bench/flood.sh
#   CONNECTIONS=4000 bash bench/flood.sh
#   SERVICE_NOFILE=1048576 bash bench/flood.sh     # a cap far above the flood
set -euo pipefail
cd "$(dirname "$0")/.."

CONNECTIONS=${CONNECTIONS:-20000}
SERVICE_NOFILE=${SERVICE_NOFILE:-20000}
TOKEN=bench-admin-token

# The flood needs a file per connection: raise this shell's limit (the hard one too where
# that is allowed); bench/flood.py spreads the connections over as many processes as the
# limit requires.
ulimit -Hn $((CONNECTIONS + 1024)) 2>/dev/null || true
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
probe="$(free_port)"
# The flood comes from one address and measures the cap, so that address may take all of it
# (bench/flood_per_client.sh measures a client's share).
LISTEN_ADDR="127.0.0.1:${api}" PROBE_LISTEN="127.0.0.1:${probe}" ADMIN_TOKEN="${TOKEN}" \
    MAX_CONNECTIONS_PER_CLIENT="${SERVICE_NOFILE}" \
    LOG_FORMAT=json RUST_LOG=info \
    prlimit --nofile="${SERVICE_NOFILE}:${SERVICE_NOFILE}" -- target/release/proxy-allocator \
    >"${work}/service.log" 2>&1 &
pid=$!
for _ in $(seq 200); do
    curl -sf "http://127.0.0.1:${probe}/livez" >/dev/null && break
    sleep 0.05
done
curl -sf -X PUT "http://127.0.0.1:${api}/pools/p" -H "authorization: Bearer ${TOKEN}" \
    -H 'content-type: application/json' -d '{}' >/dev/null
curl -sf "http://127.0.0.1:${api}/pools/p/members" -H "authorization: Bearer ${TOKEN}" \
    -H 'content-type: application/json' -d '{"members": ["http://p1.example.net:3128"]}' >/dev/null

echo "==> $(date -u +%Y-%m-%dT%H:%MZ); $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); client open-file limit $(ulimit -n)"
grep -E '"(open-file limit|listening|probes listening)"' "${work}/service.log" \
    | python3 -c 'import json, sys
for line in sys.stdin:
    v = json.loads(line)
    print("service:", v["message"], {k: v[k] for k in v if k not in ("timestamp", "level", "target", "message")})'

python3 bench/flood.py --api "${api}" --probe "${probe}" --connections "${CONNECTIONS}"

echo "==> the service's log lines about accepting and the cap"
grep -cE '"message":"(accept failing|accepting connections again|connection cap reached|below the connection cap again)' \
    "${work}/service.log" | sed 's/^/lines: /'
grep -E '"message":"(accept failing|accepting connections again|connection cap reached|below the connection cap again)' \
    "${work}/service.log" | cut -c1-220 || true
echo "==> connection metrics"
curl -s "http://127.0.0.1:${probe}/metrics" | grep -E '^pa_(connection|connections|accept)' | grep 'listener="api"'
