"""What a label filter costs: on one pool of SIZE members (default 1,000,000) of which one in
a hundred carries `country=de`, the plain assign (no body) against the assign with
`{"labels": {"country": "de"}}`, their runs alternating, on the embedded store and on one
Redis, with the release build.

    python3 bench/labels.py

Prints, per store, each side's median rate and the median and range of the
labelled/plain ratios of neighbouring runs. A measurement, not a check.
"""

import os

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
    bench.against_plain("labelled", FILTER, seed, f"{SIZE:>9,} members, 1% labelled")


if __name__ == "__main__":
    main()
