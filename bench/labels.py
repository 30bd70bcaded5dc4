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
                runs = {"plain": [], "labelled": []}
                for round_ in range(bench.ROUNDS):
                    order = ["plain", "labelled"] if round_ % 2 == 0 else ["labelled", "plain"]
                    for side in order:
                        body = FILTER if side == "labelled" else None
                        runs[side].append(bench.wrk(target, body=body))
                ratios = sorted(l["rps"] / p["rps"] for l, p in zip(runs["labelled"], runs["plain"]))
                medians = {side: bench.median(r) for side, r in runs.items()}
                print(
                    f"{store:8} {SIZE:>9,} members, 1% labelled  "
                    f"plain {medians['plain']['rps']:9,.0f}/s p99 {medians['plain']['p99']:.2f} ms  "
                    f"labelled {medians['labelled']['rps']:9,.0f}/s p99 {medians['labelled']['p99']:.2f} ms  "
                    f"labelled/plain {ratios[len(ratios) // 2]:.3f} ({ratios[0]:.3f}-{ratios[-1]:.3f})  "
                    f"non-2xx {medians['plain']['non2xx']}+{medians['labelled']['non2xx']}",
                    flush=True,
                )
            finally:
                proc.terminate()
                proc.wait()
    finally:
        redis.terminate()
        redis.wait()


if __name__ == "__main__":
    main()
