"""What a target costs an assign: on one pool of SIZE members (default 100), the plain
assign (no body) against `{"target": "shop.example.com"}` while one member in a hundred is
banned for that host (the banned members keep the lowest counts, so every targeted assign
walks past them: the walk's cost shows), their runs alternating, on the embedded store and
on one Redis, with the release build. The bans last an hour, longer than the run.

    python3 bench/targets.py
    SIZE=10000 python3 bench/targets.py

Prints, per store, each side's median rate and the median and range of the targeted/plain
ratios of neighbouring runs. A measurement, not a check.
"""

import os

import assign as bench

SIZE = int(os.environ.get("SIZE", "100"))
BANNED_EVERY = 100
TARGETED = {"target": "shop.example.com"}


def seed(base, pool):
    bench.request(base, "PUT", f"/pools/{pool}",
                  {"health": {"target_ban_ms": 3_600_000}})
    chunk = 10_000
    for start in range(0, SIZE, chunk):
        members = [f"proxy-{i:07d}" for i in range(start, min(SIZE, start + chunk))]
        bench.request(base, "POST", f"/pools/{pool}/members",
                      {"members": members, "assignments": 0})
    banned = [{"proxy": f"proxy-{i:07d}", "result": "blocked", "target": TARGETED["target"]}
              for i in range(0, SIZE, BANNED_EVERY)]
    for start in range(0, len(banned), 10_000):
        bench.request(base, "POST", f"/pools/{pool}/outcomes", banned[start:start + 10_000])


def main():
    bench.against_plain("targeted", TARGETED, seed, f"{SIZE:>9,} members, 1% banned for the target")


if __name__ == "__main__":
    main()
