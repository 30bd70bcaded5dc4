"""The assign rate per kind of request, at each pool size, through the service and next to
redis-benchmark running the same script (EVALSHA) with the same keys and arguments the
service sends for that kind. Run by `PARTS=kinds bash bench/assign.sh`.

    PARTS=kinds bash bench/assign.sh
    PARTS=kinds KINDS="plain session" SIZES="100" DURATION=2 ROUNDS=1 bash bench/assign.sh

Kinds (`KINDS`, all by default):
- plain: no body.
- labelled: `{"labels": {"country": "de"}}` on a pool where one member in a hundred carries
  `country=de`.
- targeted: `{"target": "shop.example.com"}` on the plain pool, where one member in a hundred
  (at most 10) is banned for that host; the banned ones keep the lowest counts, so every
  targeted assign walks past them.
- paced: no body, on a pool paced pool-wide every `PACING_MS` (default 1 ms).
- session: `{"session": "s<12 digits>"}`, one of `SESSIONS` (default 1,000) ids drawn at
  random per request (by wrk, and by redis-benchmark's `__rand_int__`), on the plain pool:
  after the first pins, the pinned path.
- count10: `{"count": 10}` on the plain pool.

Each round runs the service and then redis-benchmark for one kind and size; figures are
medians of `ROUNDS` rounds, ratios those of the same rounds. The embedded store runs the
same requests (no yardstick). Every number comes from this one run on this machine: compare
the ratios, not the absolute figures, across machines.
"""

import os
import subprocess
from datetime import date

import assign as bench

KINDS = os.environ.get("KINDS", "plain labelled targeted paced session count10").split()
SIZES = [int(s) for s in os.environ.get("SIZES", "100 1000000").split()]
STORES = [s for s in ("redis", "embedded") if s in os.environ.get("STORES", "redis embedded").split()]
PACING_MS = int(os.environ.get("PACING_MS", "1"))
SESSIONS = int(os.environ.get("SESSIONS", "1000"))
TARGET = "shop.example.com"
LEASE_ID = "0123456789abcdef0123456789abcdef"
# ARGV[3..5] as the service sends them (RECLAIM_ON_ASSIGN, RETURN_ON_ASSIGN,
# MAX_LABEL_CHECKS), and for a session ARGV[6] with the ttl left to the pool, MAX_SESSIONS
# and the default ttl (see `run_assign` in src/store/redis/operations.rs).
BATCHES = ["16", "16", "2000"]
SESSION_ARG = "session 0 1000000 600000"

# wrk draws a session id per request, in the form redis-benchmark's __rand_int__ writes.
SESSION_LUA = f"""
wrk.headers["Content-Type"] = "application/json"
request = function()
    local body = string.format('{{"session": "s%012d"}}', math.random(0, {SESSIONS - 1}))
    return wrk.format(nil, nil, nil, body)
end
"""


def pools_for(size):
    """The pool each kind runs on at `size`: three pools (plain, labelled, paced)."""
    return {"plain": f"a{size}", "labelled": f"l{size}", "targeted": f"a{size}",
            "paced": f"p{size}", "session": f"a{size}", "count10": f"a{size}"}


def seed(base, size):
    """Creates and fills the three pools of `size` members at 0."""
    pools = pools_for(size)
    bench.request(base, "PUT", f"/pools/{pools['plain']}", {"health": {"target_ban_ms": 3_600_000}})
    bench.request(base, "PUT", f"/pools/{pools['labelled']}", {})
    bench.request(base, "PUT", f"/pools/{pools['paced']}",
                  {"pacing": {"min_interval_ms": PACING_MS}})
    chunk = 10_000
    for start in range(0, size, chunk):
        ids = [f"proxy-{i:07d}" for i in range(start, min(size, start + chunk))]
        for pool in (pools["plain"], pools["paced"]):
            bench.request(base, "POST", f"/pools/{pool}/members",
                          {"members": ids, "assignments": 0})
        labelled = [{"member": m, "labels": {"country": "de"}} if i % 100 == 0 else m
                    for i, m in zip(range(start, start + chunk), ids)]
        bench.request(base, "POST", f"/pools/{pools['labelled']}/members",
                      {"members": labelled, "assignments": 0})
    banned = [{"proxy": f"proxy-{i:07d}", "result": "blocked", "target": TARGET}
              for i in range(0, size, 100)][:10]
    bench.request(base, "POST", f"/pools/{pools['plain']}/outcomes", banned)


def request_of(kind):
    """(wrk body, wrk lua) of `kind`."""
    return {
        "plain": (None, None),
        "labelled": ({"labels": {"country": "de"}}, None),
        "targeted": ({"target": TARGET}, None),
        "paced": (None, None),
        "session": (None, SESSION_LUA),
        "count10": ({"count": 10}, None),
    }[kind]


def script_call(kind, pool):
    """(keys, arguments, rand) of the EVALSHA the service sends for `kind` on `pool`."""
    head = f"{bench.PREFIX}:{{{pool}}}"
    keys = [f"{head}:{part}" for part in bench.KEY_PARTS]
    args = [LEASE_ID, "", *BATCHES, "1"]
    rand = None
    if kind == "labelled":
        args.append("country de")
    elif kind == "targeted":
        keys += [f"{head}:bans:{TARGET}", f"{head}:paced:{TARGET}"]
    elif kind == "session":
        keys += [f"{head}:sessions", f"{head}:sessions:s__rand_int__"]
        args[-1] = SESSION_ARG
        rand = SESSIONS
    elif kind == "count10":
        args[0] = " ".join([LEASE_ID] * 10)
        args[-1] = "10"
    return keys, args, rand


def main():
    redis_port = bench.free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    try:
        bench.wait_port(redis_port)
        text = "".join(open(os.path.join(bench.SCRIPTS, part)).read()
                       for part in bench.SCRIPT_PARTS)
        sha = subprocess.run(["redis-cli", "-p", str(redis_port), "-x", "SCRIPT", "LOAD"],
                             input=text, check=True, capture_output=True,
                             text=True).stdout.strip()
        for store in STORES:
            url = f"redis://127.0.0.1:{redis_port}" if store == "redis" else None
            proc, base = bench.start_service(url)
            try:
                for size in SIZES:
                    seed(base, size)
                    pools = pools_for(size)
                    for kind in KINDS:
                        body, lua = request_of(kind)
                        target = f"{base}/pools/{pools[kind]}/assign"
                        keys, args, rand = script_call(kind, pools[kind])
                        service, yardstick = [], []
                        for _ in range(bench.ROUNDS):
                            service.append(bench.wrk(target, body=body, lua=lua))
                            if store == "redis":
                                yardstick.append(
                                    bench.redis_benchmark(redis_port, sha, keys, args, rand))
                        figure = bench.median(service)
                        if yardstick:
                            bench.with_ratios(figure, service, yardstick)
                        rows.append((kind, store, size, figure,
                                     bench.median(yardstick) if yardstick else None))
                        print(f"{store:8} {size:>9,} {kind:9} {figure['rps']:9,.0f}/s "
                              f"load {bench.load_average()}", flush=True)
            finally:
                proc.terminate()
                proc.wait()
    finally:
        redis.terminate()
        redis.wait()
    report(rows)


def report(rows):
    plain = {(store, size): r["rps"] for kind, store, size, r, _ in rows if kind == "plain"}
    print(f"\n{date.today()} · {os.cpu_count()} cores · {bench.CONNECTIONS} connections · "
          f"median of {bench.ROUNDS} runs of {bench.DURATION} s, service and redis-benchmark "
          f"alternating · wrk -t{bench.WRK_THREADS} · load average {bench.load_average()}\n")
    print("| kind | store | pool size | requests/s | p50 ms | p99 ms | non-2xx | vs plain "
          "| redis-benchmark EVALSHA /s | service vs redis-benchmark (range) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kind, store, size, r, yardstick in rows:
        vs_plain = (f"{r['rps'] / plain[(store, size)]:.2f}"
                    if (store, size) in plain else "")
        bench_rate = f"{yardstick['rps']:,.0f}" if yardstick else ""
        vs_bench = (f"{r['vs_bench']:.2f} ({r['vs_bench_range'][0]:.2f}–"
                    f"{r['vs_bench_range'][1]:.2f})" if "vs_bench" in r else "")
        print(f"| {kind} | {store} | {size:,} | {r['rps']:,.0f} | {r['p50']:.2f} | "
              f"{r['p99']:.2f} | {r['non2xx']} | {vs_plain} | {bench_rate} | {vs_bench} |")
    print("\ncount10 hands out ten members per request: its members/s is ten times its "
          "requests/s.")
