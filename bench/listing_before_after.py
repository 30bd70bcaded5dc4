"""Two builds' `GET /pools?limit=1000` side by side in one run: on one Redis holding `POOLS`
pools (default 100,000, two members each), both builds reading the same pools, and on the
embedded store (each build its own `POOLS_EMBEDDED` pools, default 10,000). The builds'
rounds alternate (which one goes first alternates too); a round is `SAMPLES` pages (default
20) on one keep-alive connection, timed from the request to the answer's last byte.

    python3 bench/listing_before_after.py BEFORE_BINARY AFTER_BINARY

Prints, per store, each side's median page time, the service's and Redis's CPU per page,
and the median and range of the after/before ratios of neighbouring rounds. A measurement,
not a check.
"""

import http.client
import os
import sys
import time

import pools as bench
from assign import TOKEN

POOLS = int(os.environ.get("POOLS", "100000"))
POOLS_EMBEDDED = int(os.environ.get("POOLS_EMBEDDED", "10000"))
ROUNDS = int(os.environ.get("ROUNDS", "5"))
SAMPLES = int(os.environ.get("SAMPLES", "20"))


def cpu_seconds(pid):
    """User + system CPU seconds of a process so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_round(port, pids):
    """Median page time (ms) of SAMPLES pages, and the CPU ms per page of each of `pids`."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    cpu_before = [cpu_seconds(pid) for pid in pids]
    took = []
    for _ in range(SAMPLES):
        began = time.perf_counter()
        conn.request("GET", "/pools?limit=1000", headers=headers)
        response = conn.getresponse()
        data = response.read()
        took.append((time.perf_counter() - began) * 1000)
        assert response.status == 200, (response.status, data[:200])
    took.sort()
    cpu = [(cpu_seconds(pid) - before) * 1000 / SAMPLES for pid, before in zip(pids, cpu_before)]
    return took[len(took) // 2], cpu


def compare(store, sides, redis_pid):
    """Alternating rounds of the two sides; prints one line."""
    runs = {"before": [], "after": []}
    for round_ in range(ROUNDS):
        order = ["before", "after"] if round_ % 2 == 0 else ["after", "before"]
        for name in order:
            proc, port = sides[name]
            pids = [proc.pid] + ([redis_pid] if redis_pid else [])
            runs[name].append(one_round(port, pids))
    ratios = sorted(a[0] / b[0] for a, b in zip(runs["after"], runs["before"]))

    def summary(name):
        times = sorted(r[0] for r in runs[name])
        service = sorted(r[1][0] for r in runs[name])
        text = f"{name} {times[len(times) // 2]:.1f} ms (service CPU {service[len(service) // 2]:.1f} ms"
        if redis_pid:
            redis = sorted(r[1][1] for r in runs[name])
            text += f", Redis CPU {redis[len(redis) // 2]:.1f} ms"
        return text + ")"

    with open("/proc/loadavg") as load:
        loadavg = load.read().split()[0]
    print(f"{store:8} GET /pools?limit=1000  {summary('before')}  {summary('after')}  "
          f"after/before {ratios[len(ratios) // 2]:.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})  "
          f"load {loadavg}", flush=True)


def main():
    before_binary, after_binary = sys.argv[1:3]
    redis, redis_port = bench.start_redis()
    try:
        env = {"REDIS_URL": f"redis://127.0.0.1:{redis_port}"}
        bench.BINARY = after_binary
        proc, port = bench.start_service(env)
        began = time.time()
        bench.create_pools(port, 0, POOLS)
        print(f"created {POOLS:,} pools in {time.time() - began:.0f} s", flush=True)
        bench.stop(proc)
        sides = {}
        try:
            for name, binary in [("before", before_binary), ("after", after_binary)]:
                bench.BINARY = binary
                sides[name] = bench.start_service(env)
            time.sleep(2)
            compare("redis", sides, redis.pid)
        finally:
            for proc, _ in sides.values():
                bench.stop(proc)
    finally:
        redis.terminate()
        redis.wait()
    sides = {}
    try:
        for name, binary in [("before", before_binary), ("after", after_binary)]:
            bench.BINARY = binary
            sides[name] = bench.start_service({})
            bench.create_pools(sides[name][1], 0, POOLS_EMBEDDED)
        compare("embedded", sides, None)
    finally:
        for proc, _ in sides.values():
            bench.stop(proc)


if __name__ == "__main__":
    main()
