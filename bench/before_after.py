"""Two builds of the service side by side in one run: `POST /assign` and `GET /livez` under
the same wrk load as bench/assign.sh, the two binaries' runs alternating (which one goes
first alternates too), on the embedded store and on one Redis.

    python3 bench/before_after.py BEFORE_BINARY AFTER_BINARY

Prints, per store and route, each side's median rate and the median and range of the
after/before ratios of neighbouring runs. A measurement, not a check.
"""

import subprocess
import sys

import assign as bench

POOL_SIZE = 100


def start(binary, redis_url):
    bench.BINARY = binary
    return bench.start_service(redis_url)


def main():
    before_binary, after_binary = sys.argv[1:3]
    redis_port = bench.free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bench.wait_port(redis_port)
    try:
        for store, url in [("embedded", None), ("redis", f"redis://127.0.0.1:{redis_port}")]:
            sides = {}
            for name, binary in [("before", before_binary), ("after", after_binary)]:
                proc, base = start(binary, url)
                # Each side its own key prefix on the shared Redis.
                sides[name] = (proc, base)
                bench.seed(base, f"p-{name}", POOL_SIZE)
            try:
                for route, method in [("/pools/p-{name}/assign", "POST"), ("/livez", "GET")]:
                    runs = bench.alternating(
                        ["before", "after"],
                        lambda name: bench.wrk(sides[name][1] + route.format(name=name),
                                               method=method))
                    print(f"{store:8} {method} {route.replace('p-{name}', '{pool}'):22} "
                          f"{bench.compared(runs, 'before', 'after')}  "
                          f"load {bench.load_average()}", flush=True)
            finally:
                for proc, _ in sides.values():
                    proc.terminate()
                    proc.wait()
    finally:
        redis.terminate()
        redis.wait()


if __name__ == "__main__":
    main()
