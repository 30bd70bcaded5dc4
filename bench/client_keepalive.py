"""The Python clients' connection reuse, measured: 10,000 assigns from one client over one
kept-alive connection against a fresh connection (a new client) per call.

    cargo build --release
    pip install './clients/python[async]'
    python3 bench/client_keepalive.py            # CALLS=10000 ROUNDS=5 REDIS=0

It starts the release binary on a free loopback port (embedded store, or Redis with
REDIS=1, started here too) and runs the four loops in turn, round after round, so that a
busy minute on this shared machine slows every side alike. It prints each loop's median
rate with its range over the rounds and the ratio of the medians; the numbers are this
machine's, compare the ratios.
"""

import asyncio
import os
import statistics
import sys
import time
from typing import Callable, Dict, List

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients",
                                "python", "tests"))

from harness import WORKER, RedisServer, Service  # noqa: E402

from proxy_allocator import AsyncClient, Client  # noqa: E402

CALLS = int(os.environ.get("CALLS", "10000"))
ROUNDS = int(os.environ.get("ROUNDS", "5"))


def blocking_kept_alive(base: str, pool: str) -> None:
    with Client(base, token=WORKER) as client:
        for _ in range(CALLS):
            client.assign(pool)


def blocking_fresh(base: str, pool: str) -> None:
    for _ in range(CALLS):
        with Client(base, token=WORKER) as client:
            client.assign(pool)


async def _async_kept_alive(base: str, pool: str) -> None:
    async with AsyncClient(base, token=WORKER) as client:
        for _ in range(CALLS):
            await client.assign(pool)


async def _async_fresh(base: str, pool: str) -> None:
    for _ in range(CALLS):
        async with AsyncClient(base, token=WORKER) as client:
            await client.assign(pool)


LOOPS: Dict[str, Callable[[str, str], None]] = {
    "blocking Client, one kept-alive connection": blocking_kept_alive,
    "blocking Client, a fresh connection per call": blocking_fresh,
    "AsyncClient, one kept-alive connection": lambda b, p: asyncio.run(_async_kept_alive(b, p)),
    "AsyncClient, a fresh connection per call": lambda b, p: asyncio.run(_async_fresh(b, p)),
}


def main() -> None:
    redis = RedisServer() if os.environ.get("REDIS") == "1" else None
    service = Service(redis.url if redis else None)
    try:
        pool = service.create_pool()
        service.seed(pool, ["http://p{}.example.net:3128".format(i) for i in range(10)])
        rates: Dict[str, List[float]] = {name: [] for name in LOOPS}
        for round_ in range(ROUNDS):
            for name, loop in LOOPS.items():
                started = time.perf_counter()
                loop(service.base, pool)
                rates[name].append(CALLS / (time.perf_counter() - started))
            print("round {}: {}".format(round_ + 1, ", ".join(
                "{:.0f}".format(r[-1]) for r in rates.values())), file=sys.stderr)
        total = service.stats(pool)["total_assignments"]
        assert total == CALLS * ROUNDS * len(LOOPS), total
        print("{} assigns per loop, {} rounds, {} store, load average {}".format(
            CALLS, ROUNDS, "Redis" if redis else "embedded",
            " ".join("{:.2f}".format(x) for x in os.getloadavg())))
        print("| loop | assigns/s (median) | range |")
        print("|---|---|---|")
        for name, values in rates.items():
            print("| {} | {:.0f} | {:.0f}–{:.0f} |".format(
                name, statistics.median(values), min(values), max(values)))
        names = list(LOOPS)
        for kept, fresh in ((names[0], names[1]), (names[2], names[3])):
            print("{}: {:.1f}× the rate of a fresh connection per call".format(
                kept, statistics.median(rates[kept]) / statistics.median(rates[fresh])))
    finally:
        service.stop()
        if redis is not None:
            redis.stop()


if __name__ == "__main__":
    main()
