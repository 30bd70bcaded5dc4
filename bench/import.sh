#!/usr/bin/env bash
# Benchmark of POST /pools/{pool}/import on Redis (or, with STORE=embedded, the embedded
# store): builds the release binary, starts its own redis-server and service on free
# loopback ports, generates a list of LINES candidates
# (default 100,000; mixed valid, duplicate, private, credentialed and garbage lines),
# imports it with curl into fresh pools RUNS times (default 3) and prints lines per second,
# end to end as curl measures it (upload, parsing, writes, report), and the service's peak
# RSS above what it held before the first import (VmHWM less VmRSS, from /proc).
#
#   bash bench/import.sh                 # 100,000 lines, 3 runs
#   STORE=embedded bash bench/import.sh  # the embedded store in memory
#   LINES=500000 RUNS=1 bash bench/import.sh
#   LINES=1550000 RUNS=1 bash bench/import.sh   # just under the 32 MiB import limit
#   BIN=/path/to/proxy-allocator bash bench/import.sh   # another build
set -euo pipefail
cd "$(dirname "$0")/.."

LINES=${LINES:-100000}
# redis: its own redis-server; embedded: the embedded store in memory.
STORE=${STORE:-redis}
RUNS=${RUNS:-3}
TOKEN=bench-admin-token

free_port() {
    local port
    while :; do
        port=$((20000 + RANDOM % 40000))
        # Nothing answers on it: free enough for a benchmark.
        if ! (exec 3<>"/dev/tcp/127.0.0.1/${port}") 2>/dev/null; then
            echo "${port}"
            return
        fi
    done
}

wait_for() {
    local tries=0
    until "$@" >/dev/null 2>&1; do
        tries=$((tries + 1))
        if ((tries > 200)); then
            echo "gave up waiting for: $*" >&2
            exit 1
        fi
        sleep 0.05
    done
}

BIN=${BIN:-}
if [[ -z "${BIN}" ]]; then
    echo "==> cargo build --release"
    cargo build --release --quiet
    BIN=target/release/proxy-allocator
fi

work="$(mktemp -d)"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do
        kill "${pid}" 2>/dev/null || true
        wait "${pid}" 2>/dev/null || true
    done
    rm -rf "${work}"
}
trap cleanup EXIT

store=()
if [[ "${STORE}" == redis ]]; then
    redis_port="$(free_port)"
    redis-server --port "${redis_port}" --bind 127.0.0.1 --save '' --appendonly no \
        --dir "${work}" >"${work}/redis.log" 2>&1 &
    pids+=($!)
    wait_for redis-cli -p "${redis_port}" ping
    store=(REDIS_URL="redis://127.0.0.1:${redis_port}")
fi

app_port="$(free_port)"
env "${store[@]}" LISTEN_ADDR="127.0.0.1:${app_port}" \
    ADMIN_TOKEN="${TOKEN}" LOG_FORMAT=json RUST_LOG=warn \
    "${BIN}" >"${work}/app.log" 2>&1 &
pids+=($!)
app_pid=$!
base="http://127.0.0.1:${app_port}"
wait_for curl -sf "${base}/readyz"

# One line in twenty of each kind, so the mix is the same at any size:
# 12 unique public addresses, 2 with user:pass@, 1 host:port:user:pass, 1 repeat of an
# earlier line in another spelling, 2 private addresses, 1 database port on loopback,
# 1 garbage line.
awk -v n="${LINES}" 'BEGIN {
    print "# benchmark list"
    for (i = 0; i < n; i++) {
        k = i % 20
        ip = sprintf("%d.%d.%d.%d", 11 + int(i / 65536) % 100, int(i / 256) % 256, i % 256, 1 + k)
        if (k < 12) print ip ":8080"
        else if (k < 14) print "http://user" i ":pw" i "@" ip ":3128"
        else if (k == 14) print ip ":3128:user" i ":pw" i
        else if (k == 15) print "HTTP://" sprintf("%d.%d.%d.%d", 11 + int((i - 15) / 65536) % 100, int((i - 15) / 256) % 256, (i - 15) % 256, 1) ":8080/"
        else if (k < 18) print "10." int(i / 256) % 256 "." i % 256 ".1:80"
        else if (k == 18) print "127.0.0.1:6379"
        else print "not a proxy " i
    }
}' >"${work}/list.txt"
bytes=$(wc -c <"${work}/list.txt")
echo "==> ${STORE}: ${LINES} lines, ${bytes} bytes; $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"

kb() { awk -v key="$1:" '$1 == key { print $2 }' "/proc/${app_pid}/status"; }
rss_before=$(kb VmRSS)
for run in $(seq 1 "${RUNS}"); do
    pool="bench-${run}"
    curl -sf -X PUT "${base}/pools/${pool}" -H "Authorization: Bearer ${TOKEN}" >/dev/null
    seconds=$(curl -sf -o "${work}/report.json" -w '%{time_total}' \
        "${base}/pools/${pool}/import" -H "Authorization: Bearer ${TOKEN}" \
        -H 'content-type: text/plain' --data-binary @"${work}/list.txt")
    rate=$(awk -v n="${LINES}" -v s="${seconds}" 'BEGIN { printf "%d", n / s }')
    peak=$(kb VmHWM)
    echo "run ${run}: ${seconds} s, ${rate} lines/s; service RSS ${rss_before} kB before the first import, peak ${peak} kB: $(awk -v p="${peak}" -v b="${rss_before}" -v n="${bytes}" 'BEGIN { printf "%.1f MB above, %.2f x the list", (p - b) / 1024, (p - b) * 1024 / n }')"
done
echo "==> last report (examples left out)"
sed -e 's/,"examples":.*$/}/' "${work}/report.json"
echo
