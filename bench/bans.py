"""Drives bench/bans.sh: the memory 100,000 targets' bans take, and give back.

One pool of 100 members; `TARGETS` (default 100,000) `blocked` reports, each naming another
target (`site<n>.example`), in batches of 10,000 (the outcome limit per call), member n % 100.
Redis (a server of its own): `used_memory` before, after the reports, and once every ban is
forgotten (a ban of `target_ban_ms` = 2,000 ms is forgotten 2 s after it ends; the keys
expire by themselves, and `DBSIZE` shows it). Embedded store: the process's RSS the same
three times (its bans are cleared lazily, by later bans: the third figure is after one more
ban once they are all forgotten, which clears 16 targets, so it shows what lazily stays).

Every figure comes from this one run on this machine; compare ratios, not absolute figures,
across machines.
"""

import http.client
import json
import os
import subprocess
import time

from assign import BINARY, PREFIX, TOKEN, free_port, wait_port

TARGETS = int(os.environ.get("TARGETS", "100000"))
BATCH = int(os.environ.get("BATCH", "10000"))
BAN_MS = 2_000


def call(conn, method, path, body=None):
    payload = None if body is None else json.dumps(body)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    conn.request(method, path, body=payload, headers=headers)
    response = conn.getresponse()
    data = response.read()
    if response.status >= 300:
        raise RuntimeError(f"{method} {path}: {response.status} {data[:200]!r}")
    return json.loads(data) if data else None


def redis_info(port, field):
    out = subprocess.check_output(["redis-cli", "-p", str(port), "INFO", "memory"], text=True)
    for line in out.splitlines():
        if line.startswith(field + ":"):
            return int(line.split(":", 1)[1])
    raise RuntimeError(field)


def dbsize(port):
    return int(subprocess.check_output(["redis-cli", "-p", str(port), "DBSIZE"], text=True))


def wait_for_expiry(port, keys_before, timeout):
    """Waits, touching nothing, until Redis's background cycle has expired every key added
    since there were `keys_before`, or `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while dbsize(port) > keys_before and time.monotonic() < deadline:
        time.sleep(0.5)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("VmRSS")


def start_service(env_extra):
    port = free_port()
    env = dict(os.environ, ADMIN_TOKEN=TOKEN, LISTEN_ADDR=f"127.0.0.1:{port}",
               KEY_PREFIX=PREFIX, LOG_FORMAT="json", RUST_LOG="warn")
    for key in ("REDIS_URL", "DATA_DIR", "WORKER_TOKEN"):
        env.pop(key, None)
    env.update(env_extra)
    proc = subprocess.Popen([BINARY], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    wait_port(port, timeout=60)
    return proc, port


def ban_everything(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    call(conn, "PUT", "/pools/b", {"health": {"target_ban_ms": BAN_MS, "max_cooldown_ms": BAN_MS}})
    call(conn, "POST", "/pools/b/members",
         {"members": [f"http://m{n}.example.net:3128" for n in range(100)]})
    started = time.monotonic()
    for first in range(0, TARGETS, BATCH):
        reports = [{"proxy": f"http://m{n % 100}.example.net:3128", "result": "blocked",
                    "target": f"site{n}.example"} for n in range(first, min(TARGETS, first + BATCH))]
        answer = call(conn, "POST", "/pools/b/outcomes", reports)
        banned = sum(1 for o in answer["outcomes"] if o["effect"] == "banned")
        if banned != len(reports):
            raise RuntimeError(f"{banned} of {len(reports)} banned")
    return conn, time.monotonic() - started


def main():
    rows = []
    redis_port = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
                              "--save", "", "--appendonly", "no"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(redis_port)
        service, port = start_service({"REDIS_URL": f"redis://127.0.0.1:{redis_port}"})
        try:
            before = redis_info(redis_port, "used_memory")
            keys_before = dbsize(redis_port)
            conn, took = ban_everything(port)
            after = redis_info(redis_port, "used_memory")
            keys_after = dbsize(redis_port)
            time.sleep(2 * BAN_MS / 1000 + 1.5)
            # Redis expires keys lazily and in its background cycle.
            wait_for_expiry(redis_port, keys_before, 30)
            forgotten = redis_info(redis_port, "used_memory")
            rows.append(("redis (used_memory)", before, after, forgotten, took,
                         f"{keys_before} / {keys_after} / {dbsize(redis_port)}"))
        finally:
            service.terminate()
            service.wait()
    finally:
        redis.terminate()
        redis.wait()

    service, port = start_service({})
    try:
        before = rss_kib(service.pid) * 1024
        conn, took = ban_everything(port)
        after = rss_kib(service.pid) * 1024
        time.sleep(2 * BAN_MS / 1000 + 0.5)
        call(conn, "POST", "/pools/b/outcomes",
             {"proxy": "http://m0.example.net:3128", "result": "blocked", "target": "late.example"})
        forgotten = rss_kib(service.pid) * 1024
        rows.append(("embedded (RSS)", before, after, forgotten, took, "-"))
    finally:
        service.terminate()
        service.wait()

    print(f"{TARGETS} targets banned in one pool of 100 members; "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    print()
    print("| store | before | after the bans | per target | once forgotten | reports took | keys before / after / forgotten |")
    print("|---|---|---|---|---|---|---|")
    for store, before, after, forgotten, took, keys in rows:
        per = (after - before) / TARGETS
        print(f"| {store} | {before / 2**20:.1f} MiB | {after / 2**20:.1f} MiB | {per:.0f} B "
              f"| {forgotten / 2**20:.1f} MiB | {took:.1f} s | {keys} |")


if __name__ == "__main__":
    main()
