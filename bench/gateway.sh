#!/usr/bin/env bash
# The gateway against the same local upstream proxy used directly (a benchmark, not a test):
# builds the release binary, starts it on the embedded store with GATEWAY_LISTEN, makes a
# test CA and a target certificate with openssl, then bench/gateway.py starts a local HTTP
# proxy and the targets and measures, alternating sides: new HTTPS tunnels per second with
# CONCURRENCY clients and their setup latency (p50/p99), bytes per second over one long
# tunnel, and the service's memory per open tunnel with TUNNELS tunnels held open. Prints a
# table of gateway against direct and the ratios.
#
#   bash bench/gateway.sh
#   ROUNDS=1 DURATION=1 BYTES=20000000 TUNNELS=300 bash bench/gateway.sh   # a short run
#   BIN=target/debug/proxy-allocator bash bench/gateway.sh                # another binary
set -euo pipefail
cd "$(dirname "$0")/.."

export ROUNDS=${ROUNDS:-5} DURATION=${DURATION:-5} CONCURRENCY=${CONCURRENCY:-64}
export BYTES=${BYTES:-536870912} TUNNELS=${TUNNELS:-10000}
export ADMIN_TOKEN=bench-admin-token WORKER_TOKEN=bench-worker-token

# 10,000 tunnels hold a file each in the client and the sink, two in the service and the
# proxy.
ulimit -Hn $((4 * TUNNELS + 4096)) 2>/dev/null || true
ulimit -n "$(ulimit -Hn)"
# The service and the proxy hold two files a tunnel: where the hard limit cannot be raised,
# fewer tunnels are measured, and the table says how many.
most=$((($(ulimit -Hn) - 2048) / 2))
if ((TUNNELS > most)); then
    echo "==> the open-file limit is $(ulimit -Hn): measuring ${most} open tunnels, not ${TUNNELS}"
    TUNNELS=${most}
fi

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

if [[ -z "${BIN:-}" ]]; then
    echo "==> cargo build --release"
    cargo build --release --quiet
    BIN=target/release/proxy-allocator
fi

work="$(mktemp -d)"
pid=""
cleanup() {
    local status=$?
    if ((status != 0)) && [[ -f "${work}/service.log" ]]; then
        echo "==> the service's last log lines"
        tail -n 5 "${work}/service.log"
    fi
    if [[ -n "${pid}" ]]; then
        kill "${pid}" 2>/dev/null || true
        wait "${pid}" 2>/dev/null || true
    fi
    rm -rf "${work}"
}
trap cleanup EXIT

# A CA and a certificate for 127.0.0.1, for the TLS inside the tunnels.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
    -subj "/CN=bench CA" -keyout "${work}/ca.key" -out "${work}/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -subj "/CN=127.0.0.1" -keyout "${work}/target.key" -out "${work}/target.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\n' >"${work}/san.ext"
openssl x509 -req -in "${work}/target.csr" -CA "${work}/ca.pem" -CAkey "${work}/ca.key" \
    -CAcreateserial -days 1 -extfile "${work}/san.ext" -out "${work}/target.pem" 2>/dev/null

api="$(free_port)"
gateway="$(free_port)"
LISTEN_ADDR="127.0.0.1:${api}" GATEWAY_LISTEN="127.0.0.1:${gateway}" LOG_FORMAT=json \
    GATEWAY_MAX_CONNECTIONS=$((TUNNELS + 1024)) \
    RUST_LOG=warn "${BIN}" >"${work}/service.log" 2>&1 &
pid=$!
for _ in $(seq 200); do
    curl -sf "http://127.0.0.1:${api}/livez" >/dev/null && break
    sleep 0.05
done

echo "==> ${ROUNDS} rounds of ${DURATION}s, ${CONCURRENCY} clients, ${BYTES} bytes, ${TUNNELS} open tunnels"
API="127.0.0.1:${api}" GATEWAY="127.0.0.1:${gateway}" SERVICE_PID="${pid}" \
    CERT="${work}/target.pem" KEY="${work}/target.key" CA="${work}/ca.pem" \
    nice python3 bench/gateway.py
