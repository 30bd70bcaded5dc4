"""What a label filter costs: on one pool of SIZE members (default 1,000,000) of which one in
a hundred carries `country=de`, the plain assign (no body) against the assign with
`{"labels": {"country": "de"}}`, their runs alternating, on the embedded store and on one
Redis, with the release build.

    python3 bench/labels.py

Prints, per store, each side's median rate and the median and range of the
labelled/plain ratios of neighbouring runs. A measurement, not a check.
"""

import os
import subprocess

import assign as bench

SIZE = int(os.environ.get("SIZE", "1000000"))
LABELLED_EVERY = 100
FILTER = {"labels": {"country": "de"}}


def seed(base, pool):
    bench.request(base, "PUT", f"/pools/{pool}", {})
    chunk = 10_000
    for start in range(0, SIZE, chunk):
        members = [
            {"member": f"proxy-{i:07d}", "labels": {"country": "de"}}
            if i % LABELLED_EVERY == 0
            else f"proxy-{i:07d}"
            for i in range(start, min(SIZE, start + chunk))
        ]
        bench.request(base, "POST", f"/pools/{pool}/members",
                      {"members": members, "assignments": 0})


def main():
    redis_port = bench.free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bench.wait_port(redis_port)
    try:
        for store, url in [("embedded", None), ("redis", f"redis://127.0.0.1:{redis_port}")]:
            proc, base = bench.start_service(url)
            try:
                seed(base, "p")
                target = base + "/pools/p/assign"
                runs = bench.alternating(
                    ["plain", "labelled"],
                    lambda side: bench.wrk(target, body=FILTER if side == "labelled" else None))
                print(f"{store:8} {SIZE:>9,} members, 1% labelled  "
                      f"{bench.compared(runs, 'plain', 'labelled')}  "
                      f"load {bench.load_average()}", flush=True)
            finally:
                proc.terminate()
                proc.wait()
    finally:
        redis.terminate()
        redis.wait()


if __name__ == "__main__":
    main()
