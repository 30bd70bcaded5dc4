"""User-space instructions per `POST /assign`, counted by valgrind's callgrind, for one or
more builds of the service: a per-request cost that repeats to within a fraction of a
percent however busy the machine is, where requests per second on a shared machine do not.

    python3 bench/instructions.py BINARY [BINARY ...]

Each binary runs on the embedded store under callgrind twice, answering FEW and then MANY
assigns sent one after another on one keep-alive connection; the difference of the two
totals divided by MANY - FEW is the cost of one assign, start-up and shutdown excluded.

    STORE=redis python3 bench/instructions.py BINARY [BINARY ...]

runs each binary on a Redis of its own, itself under callgrind, and counts the service's
and Redis's instructions apart: the Redis side is the assign script with its call.

    BODY='{"labels": {"country": "de"}}' SIZE=10000 LABELLED_EVERY=100 \
        python3 bench/instructions.py BINARY

counts an assign with that JSON body (default none) on a pool of SIZE members (default
100), every LABELLED_EVERY-th of them carrying `country=de` as bench/labels.py seeds it
(default none). Seeding a million members under callgrind takes long; the script's cost
does not grow with the pool (ZRANGE BYLEX is O(log N)), so a smaller pool of the same
shape counts the same work, as long as every set the script touches is past Redis's
compact encoding as it is at a million: a label's index holds SIZE / LABELLED_EVERY
entries, and at 128 or fewer Redis keeps it as a listpack, where each ZADD scans the whole
set (SIZE=10000 with LABELLED_EVERY=100 counts about 29,000 instructions of that scan per
assign that a million-member pool does not have); SIZE=20000 (200 entries) is past it and
counts a million-member pool's work.
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile

import assign as bench

FEW, MANY = 1000, 6000
BODY = os.environ.get("BODY", "").encode()
SIZE = int(os.environ.get("SIZE", "100"))
LABELLED_EVERY = int(os.environ.get("LABELLED_EVERY", "0"))
ASSIGN = (b"POST /pools/p/assign HTTP/1.1\r\nhost: x\r\n"
          + (b"content-type: application/json\r\n" if BODY else b"")
          + b"content-length: " + str(len(BODY)).encode() + b"\r\n\r\n" + BODY)


REDIS = os.environ.get("STORE", "embedded") == "redis"


def under_callgrind(command, env=None):
    """Starts `command` under callgrind; returns the process and its output file."""
    out = tempfile.NamedTemporaryFile(suffix=".callgrind", delete=False).name
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *command],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, out


def total(out):
    with open(out) as data:
        counted = next(int(line.split()[1]) for line in data
                       if line.startswith(("summary:", "totals:")))
    os.unlink(out)
    return counted


def seed(base):
    """Pool `p` of SIZE members at 0, every LABELLED_EVERY-th labelled `country=de`, in
    chunks small enough to answer within the request timeout under callgrind."""
    chunk = 1_000
    for start in range(0, SIZE, chunk):
        members = [
            {"member": f"proxy-{i:07d}", "labels": {"country": "de"}}
            if LABELLED_EVERY and i % LABELLED_EVERY == 0
            else f"proxy-{i:07d}"
            for i in range(start, min(SIZE, start + chunk))
        ]
        bench.request(base, "POST", "/pools/p/members", {"members": members, "assignments": 0})


def instructions(binary, assigns):
    """Instructions of the service, and of Redis (0 on the embedded store), after
    answering `assigns` assigns."""
    port = bench.free_port()
    # The background tasks an hour apart, so that the count is the assigns' alone however
    # long callgrind takes; a store timeout callgrind's slowness never reaches.
    env = dict(os.environ, ADMIN_TOKEN=bench.TOKEN, LISTEN_ADDR=f"127.0.0.1:{port}",
               LOG_FORMAT="json", RUST_LOG="warn", STORE_TIMEOUT_MS="60000",
               SWEEP_INTERVAL_MS="3600000", CHECK_TICK_MS="3600000",
               METRICS_REFRESH_MS="3600000")
    for name in ["REDIS_URL", "REDIS_CLUSTER_URLS", "REDIS_SENTINEL_URLS"]:
        env.pop(name, None)
    redis = None
    if REDIS:
        redis_port = bench.free_port()
        redis, redis_out = under_callgrind(
            ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"])
        bench.wait_port(redis_port, timeout=120)
        env["REDIS_URL"] = f"redis://127.0.0.1:{redis_port}"
    proc, out = under_callgrind([binary], env)
    try:
        bench.wait_port(port, timeout=120)
        base = f"http://127.0.0.1:{port}"
        bench.request(base, "PUT", "/pools/p", {})
        seed(base)
        with socket.create_connection(("127.0.0.1", port)) as sock:
            pending = b""
            for _ in range(assigns):
                sock.sendall(ASSIGN)
                head, _, pending = bench.read_http(sock, pending)
                assert head.startswith(b"HTTP/1.1 200"), head
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        if redis:
            redis.send_signal(signal.SIGTERM)
            redis.wait(timeout=120)
    return total(out), total(redis_out) if redis else 0


def main():
    results = []
    for binary in sys.argv[1:]:
        many, few = instructions(binary, MANY), instructions(binary, FEW)
        service, redis = ((m - f) / (MANY - FEW) for m, f in zip(many, few))
        results.append((service, redis, service + redis))
        print(f"{service:10,.0f} instructions per assign in the service"
              + (f", {redis:10,.0f} in Redis" if REDIS else "") + f"  {binary}", flush=True)
    for i, what in enumerate(["service", "Redis", "both"][: 3 if REDIS else 1]):
        if len(results) > 1:
            print(f"ratio to the first ({what}): "
                  + ", ".join(f"{r[i] / results[0][i]:.4f}" for r in results[1:]))


if __name__ == "__main__":
    main()
