#!/usr/bin/env python3
"""The gateway against Squid, proxy-chain, pproxy and the upstream proxies used directly.

Started by bench/gateway.sh, which starts every program and hands over their addresses.
Each round measures every side once, in an order that turns by one side a round so that
none always runs first or last, with bench/tunnels as the client:

- new tunnels per second with CONCURRENCY clients for DURATION seconds (connect, CONNECT
  or the SOCKS5 handshake, one request to the target, close) and the setup latency
  (connect to the proxy's success reply) at p50 and p99;
- bytes per second over one tunnel (BYTES bytes from the target).

After the rounds, each program's resident memory per open tunnel with TUNNELS held open.
Figures are medians of the rounds; a ratio is the median of the rounds' ratios.

    python3 bench/gateway.py   (through bench/gateway.sh)
"""

import json
import os
import statistics
import subprocess
import sys

ROUNDS = int(os.environ["ROUNDS"])
DURATION = os.environ["DURATION"]
CONCURRENCY = os.environ["CONCURRENCY"]
BYTES = os.environ["BYTES"]
TUNNELS = os.environ["TUNNELS"]
WORKER = os.environ["WORKER_TOKEN"]
TUNNELS_BIN = os.environ["TUNNELS_BIN"]
TARGET = os.environ["TARGET"]

# name, address, SOCKS5 or not, the process whose memory is measured (None: not ours to
# measure), and whether it is one of the programs the gateway is held against.
SIDES = [
    ("gateway", os.environ["GATEWAY"], False, os.environ["GATEWAY_PID"], False),
    ("Squid", os.environ["SQUID"], False, os.environ["SQUID_PID"], True),
    ("proxy-chain", os.environ["PROXY_CHAIN"], False, os.environ["PROXY_CHAIN_PID"], True),
    ("pproxy", os.environ["PPROXY"], False, os.environ["PPROXY_PID"], True),
    ("gateway SOCKS5", os.environ["GATEWAY_SOCKS"], True, os.environ["GATEWAY_SOCKS_PID"], False),
    ("pproxy SOCKS5", os.environ["PPROXY_SOCKS"], True, os.environ["PPROXY_SOCKS_PID"], True),
    ("direct", os.environ["DIRECT"], False, None, False),
]


def tunnels(command, via, socks, *options):
    """Runs bench/tunnels and returns its JSON line, or None when it failed."""
    args = [TUNNELS_BIN, command, "--via", via, "--to", TARGET, "--password", WORKER, *options]
    if socks:
        args.append("--socks")
    done = subprocess.run(args, capture_output=True, text=True)
    sys.stderr.write(done.stderr)
    return json.loads(done.stdout) if done.returncode == 0 else None


def measured(result):
    """A measurement every round needs: without it the run stops."""
    if result is None:
        raise SystemExit("a measurement failed (above)")
    return result


def main():
    runs = {name: [] for name, *_ in SIDES}
    for round_ in range(ROUNDS):
        turn = round_ % len(SIDES)
        for name, via, socks, _, _ in SIDES[turn:] + SIDES[:turn]:
            rate = measured(tunnels("rate", via, socks, "--concurrency", CONCURRENCY, "--duration", DURATION))
            stream = measured(tunnels("bytes", via, socks, "--bytes", BYTES))
            runs[name].append({**rate, "bytes_per_second": stream["per_second"]})
        print(
            f"round {round_ + 1}: tunnels/s "
            + ", ".join(f"{name} {runs[name][-1]['per_second']:.0f}" for name, *_ in SIDES),
            flush=True,
        )

    # A program that cannot hold them all open gets "failed" in its cell, not a lost run.
    memory = {}
    for name, via, socks, pid, _ in SIDES:
        if pid is not None:
            memory[name] = tunnels("hold", via, socks, "--count", TUNNELS, "--pid", pid)

    def median(name, key):
        return statistics.median(run[key] for run in runs[name])

    print()
    print(
        f"| through | new tunnels/s, {CONCURRENCY} clients | setup p50 | setup p99 | bytes/s over one tunnel "
        f"| memory per open tunnel, {TUNNELS} open | failed tunnels |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, *_ in SIDES:
        held = memory.get(name, {})
        per_tunnel = (
            f"{held['per_tunnel_kib']:.1f} KiB (RSS {held['rss_before_kib'] / 1024:.1f} → "
            f"{held['rss_after_kib'] / 1024:.1f} MiB)"
            if held
            else "failed" if name in memory else ""
        )
        print(
            f"| {name} | {median(name, 'per_second'):,.0f} | {median(name, 'p50_ms'):.2f} ms "
            f"| {median(name, 'p99_ms'):.2f} ms | {median(name, 'bytes_per_second') / 1e6:,.0f} MB/s "
            f"| {per_tunnel} | {sum(run['errors'] for run in runs[name])} |"
        )

    def ratio(name, other, key):
        """The median over the rounds of name's figure over other's (other: a name or a
        function of the round giving the figure)."""
        figure = other if callable(other) else lambda i: runs[other][i][key]
        return statistics.median(runs[name][i][key] / figure(i) for i in range(ROUNDS))

    print()
    print("| goal | HTTP | SOCKS5 |")
    print("|---|---|---|")
    for_each = {"HTTP": ("gateway", False), "SOCKS5": ("gateway SOCKS5", True)}
    cells = {"peer": [], "direct": [], "bytes": [], "memory": []}
    for _, (gateway, socks) in for_each.items():
        peers = [name for name, _, side_socks, _, peer in SIDES if peer and side_socks == socks]

        def fastest(i, peers=peers):
            return max(runs[peer][i]["per_second"] for peer in peers)

        best = max(peers, key=lambda peer: median(peer, "per_second"))
        cells["peer"].append(f"{ratio(gateway, fastest, 'per_second'):.2f} (fastest: {best})")
        cells["direct"].append(f"{ratio(gateway, 'direct', 'per_second'):.2f}")
        cells["bytes"].append(f"{ratio(gateway, 'direct', 'bytes_per_second'):.2f}")
        held = memory[gateway]
        cells["memory"].append(f"{held['per_tunnel_kib']:.1f} KiB" if held else "failed")
    print(f"| tunnels/s ≥ 1.0 × the fastest peer | {' | '.join(cells['peer'])} |")
    print(f"| tunnels/s ≥ 0.8 × direct | {' | '.join(cells['direct'])} |")
    print(f"| bytes/s ≥ 0.95 × direct | {' | '.join(cells['bytes'])} |")
    print(f"| ≤ 32 KiB per open tunnel | {' | '.join(cells['memory'])} |")


if __name__ == "__main__":
    sys.exit(main())
