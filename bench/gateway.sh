#!/usr/bin/env bash
# The gateway against the programs a user would pick instead, and against the upstream
# proxies used directly (a benchmark, not a test). Every peer rotates over the same two
# local upstream proxies:
#
#   gateway       GATEWAY_LISTEN, and GATEWAY_SOCKS_LISTEN in a second process, a pool with both
#   Squid         Debian's squid: cache_peer ... parent ... round-robin no-query, never_direct
#   proxy-chain   npm: prepareRequestFunction returning the next upstream
#   pproxy        PyPI: -r ... -r ... -s rr, one process with an HTTP, one with a SOCKS5 listener
#   direct        the two upstream proxies themselves, taken in turn
#
# bench/tunnels (a small Rust program built here) is the load generator, the two upstream
# proxies and the target. The target speaks plain HTTP inside the tunnels, not TLS: every
# peer only relays a tunnel's bytes, so TLS would cost them all the same and spend the two
# cores on handshakes rather than on the programs measured. bench/gateway.py runs the
# rounds, turning the peers' order each round, and prints the table: new tunnels per
# second with CONCURRENCY clients and their setup p50/p99, bytes per second over one
# tunnel, and each program's memory per open tunnel with TUNNELS held open. Squid,
# proxy-chain and pproxy are installed when missing (apt, npm into bench/proxy-chain, pip
# into a virtual environment under target/).
#
#   bash bench/gateway.sh                                          # about 5 minutes
#   ROUNDS=1 DURATION=1 BYTES=20000000 TUNNELS=300 bash bench/gateway.sh   # a short run
#   BIN=target/debug/proxy-allocator bash bench/gateway.sh        # another binary
set -euo pipefail
cd "$(dirname "$0")/.."

export ROUNDS=${ROUNDS:-5} DURATION=${DURATION:-5} CONCURRENCY=${CONCURRENCY:-64}
export BYTES=${BYTES:-536870912} TUNNELS=${TUNNELS:-10000}
export ADMIN_TOKEN=bench-admin-token WORKER_TOKEN=bench-worker-token

# A held tunnel is a file in the client, in the upstream proxy and in the target, and two
# in the program measured, each a process of its own.
ulimit -Hn $((2 * TUNNELS + 4096)) 2>/dev/null || true
ulimit -n "$(ulimit -Hn)"
# Where the hard limit cannot be raised, fewer tunnels are measured, and the table says how
# many.
most=$((($(ulimit -Hn) - 2048) / 2))
if ((TUNNELS > most)); then
    echo "==> the open-file limit is $(ulimit -Hn): measuring ${most} open tunnels, not ${TUNNELS}"
    TUNNELS=${most}
fi

# ---- the programs ------------------------------------------------------------------------

if [[ ! -x /usr/sbin/squid ]]; then
    echo "==> apt-get install squid"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq squid >/dev/null
fi
if [[ ! -d bench/proxy-chain/node_modules/proxy-chain ]]; then
    echo "==> npm ci (proxy-chain)"
    npm ci --prefix bench/proxy-chain --no-audit --no-fund --silent
fi
venv=target/bench-pproxy
if [[ ! -x "${venv}/bin/pproxy" ]]; then
    echo "==> pip install pproxy"
    python3 -m venv "${venv}"
    "${venv}/bin/pip" install --quiet pproxy==2.7.9
fi
echo "==> cargo build --release (bench/tunnels)"
cargo build --release --quiet --manifest-path bench/tunnels/Cargo.toml --target-dir target/bench-tunnels
export TUNNELS_BIN=target/bench-tunnels/release/tunnels
if [[ -z "${BIN:-}" ]]; then
    echo "==> cargo build --release"
    cargo build --release --quiet
    BIN=target/release/proxy-allocator
fi

# ---- start them --------------------------------------------------------------------------

# Below the ephemeral range (32768 and up), where the rounds' hundreds of thousands of
# connections leave ports in use; and none handed out twice.
taken=" "
free_port() { # VARIABLE: sets it to a free port
    local port
    while :; do
        port=$((20000 + RANDOM % 12000))
        if [[ "${taken}" != *" ${port} "* ]] && ! (exec 3<>"/dev/tcp/127.0.0.1/${port}") 2>/dev/null; then
            taken+="${port} "
            printf -v "$1" %s "${port}"
            return
        fi
    done
}

wait_for_port() {
    for _ in $(seq 200); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return
        sleep 0.05
    done
    echo "nothing listens on port $1 ($2)" >&2
    return 1
}

work="$(mktemp -d)"
pids=()
cleanup() {
    local status=$?
    if ((status != 0)); then
        for log in "${work}"/*.log; do
            [[ -s "${log}" ]] || continue
            echo "==> the last lines of $(basename "${log}")"
            tail -n 5 "${log}"
        done
    fi
    for pid in "${pids[@]}"; do
        kill "${pid}" 2>/dev/null || true
    done
    # Five seconds each to stop, then they are killed.
    for pid in "${pids[@]}"; do
        for _ in $(seq 50); do
            kill -0 "${pid}" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "${pid}" 2>/dev/null || true
        wait "${pid}" 2>/dev/null || true
    done
    rm -rf "${work}"
}
trap cleanup EXIT

# The target and each upstream proxy in a process of its own, one thread each.
free_port target && free_port up1 && free_port up2
"${TUNNELS_BIN}" serve --target "127.0.0.1:${target}" >"${work}/target.log" 2>&1 &
pids+=($!)
for port in "${up1}" "${up2}"; do
    "${TUNNELS_BIN}" serve --upstreams "127.0.0.1:${port}" >"${work}/upstream-${port}.log" 2>&1 &
    pids+=($!)
done
export TARGET="127.0.0.1:${target}" DIRECT="127.0.0.1:${up1},127.0.0.1:${up2}"

# The HTTP and the SOCKS5 port in two processes, so that each one's memory per tunnel is
# measured from a start that the other's tunnels have not grown.
start_service() { # NAME GATEWAY_VARIABLE; sets started (its pid), api_port and gateway_port
    local api gateway
    free_port api && free_port gateway
    env LISTEN_ADDR="127.0.0.1:${api}" "$2=127.0.0.1:${gateway}" LOG_FORMAT=json \
        GATEWAY_MAX_CONNECTIONS=$((TUNNELS + 1024)) GATEWAY_MAX_CONNECTIONS_PER_CLIENT=$((TUNNELS + 1024)) \
        RUST_LOG=warn "${BIN}" >"${work}/$1.log" 2>&1 &
    pids+=($!)
    started=$! api_port=${api} gateway_port=${gateway}
}
start_service service GATEWAY_LISTEN
export GATEWAY_PID=${started} GATEWAY="127.0.0.1:${gateway_port}"
apis=("${api_port}")
start_service service-socks GATEWAY_SOCKS_LISTEN
export GATEWAY_SOCKS_PID=${started} GATEWAY_SOCKS="127.0.0.1:${gateway_port}"
apis+=("${api_port}")

free_port squid
mkdir -m 777 "${work}/squid"
cat >"${work}/squid/squid.conf" <<EOF
http_port 127.0.0.1:${squid}
http_access allow localhost
http_access deny all
cache_peer 127.0.0.1 parent ${up1} 0 round-robin no-query name=up1
cache_peer 127.0.0.1 parent ${up2} 0 round-robin no-query name=up2
never_direct allow all
cache deny all
access_log none
cache_log ${work}/squid/cache.log
pid_filename ${work}/squid/squid.pid
coredump_dir ${work}/squid
max_filedescriptors $(ulimit -Hn)
shutdown_lifetime 0 seconds
EOF
/usr/sbin/squid -N -f "${work}/squid/squid.conf" >"${work}/squid.log" 2>&1 &
pids+=($!)
export SQUID_PID=$! SQUID="127.0.0.1:${squid}"

free_port proxy_chain
node bench/proxy-chain/server.mjs "${proxy_chain}" "${WORKER_TOKEN}" \
    "http://127.0.0.1:${up1}" "http://127.0.0.1:${up2}" >"${work}/proxy-chain.log" 2>&1 &
pids+=($!)
export PROXY_CHAIN_PID=$! PROXY_CHAIN="127.0.0.1:${proxy_chain}"

free_port pproxy && free_port pproxy_socks
"${venv}/bin/pproxy" -l "http://127.0.0.1:${pproxy}#bench:${WORKER_TOKEN}" \
    -r "http://127.0.0.1:${up1}" -r "http://127.0.0.1:${up2}" -s rr >"${work}/pproxy.log" 2>&1 &
pids+=($!)
export PPROXY_PID=$! PPROXY="127.0.0.1:${pproxy}"
"${venv}/bin/pproxy" -l "socks5://127.0.0.1:${pproxy_socks}#bench:${WORKER_TOKEN}" \
    -r "http://127.0.0.1:${up1}" -r "http://127.0.0.1:${up2}" -s rr >"${work}/pproxy-socks.log" 2>&1 &
pids+=($!)
export PPROXY_SOCKS_PID=$! PPROXY_SOCKS="127.0.0.1:${pproxy_socks}"

wait_for_port "${target}" target
wait_for_port "${up1}" upstream
wait_for_port "${up2}" upstream
wait_for_port "${GATEWAY##*:}" "the service's HTTP gateway"
wait_for_port "${GATEWAY_SOCKS##*:}" "the service's SOCKS5 gateway"
wait_for_port "${squid}" squid
wait_for_port "${proxy_chain}" proxy-chain
wait_for_port "${pproxy}" pproxy
wait_for_port "${pproxy_socks}" "pproxy's SOCKS5 listener"

admin=(-sf -H "authorization: Bearer ${ADMIN_TOKEN}" -H "content-type: application/json")
for api in "${apis[@]}"; do
    wait_for_port "${api}" "the service's API"
    curl "${admin[@]}" -X PUT "http://127.0.0.1:${api}/pools/bench" -d '{"rules": {"allow_private": true}}' >/dev/null
    curl "${admin[@]}" -X POST "http://127.0.0.1:${api}/pools/bench/members" \
        -d "{\"members\": [\"http://127.0.0.1:${up1}\", \"http://127.0.0.1:${up2}\"]}" >/dev/null
done

echo "==> ${ROUNDS} rounds of ${DURATION}s, ${CONCURRENCY} clients, ${BYTES} bytes, ${TUNNELS} open tunnels"
python3 bench/gateway.py
