"""Drives bench/sessions.sh: the memory 100,000 sticky sessions take, and give back.

One pool of 100 members with `session_ttl_ms` = `TTL_MS` (default 60,000, longer than
starting the sessions takes); `SESSIONS` (default 100,000) assigns, each naming another
session (`s<n>`), from `CLIENTS` (default 4) keep-alive connections. Redis (a server of its
own): `used_memory` and `DBSIZE` before, after the sessions, and once they have all ended
(the keys expire by themselves; nothing touches them meanwhile). Embedded store: the
process's RSS the same three times (its sessions are cleared lazily, 16 per assign in a
session: the third figure is after `SESSIONS / 16` more assigns, each in a session of its
own, once the first ones have ended).

Every figure comes from this one run on this machine; compare ratios, not absolute figures,
across machines.
"""

import http.client
import os
import subprocess
import threading
import time

from bans import call, dbsize, redis_info, rss_kib, start_service, wait_for_expiry
from assign import free_port, wait_port

SESSIONS = int(os.environ.get("SESSIONS", "100000"))
CLIENTS = int(os.environ.get("CLIENTS", "4"))
TTL_MS = int(os.environ.get("TTL_MS", "60000"))


def create_pool(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    call(conn, "PUT", "/pools/s", {"session_ttl_ms": TTL_MS})
    call(conn, "POST", "/pools/s/members",
         {"members": [f"http://m{n}.example.net:3128" for n in range(100)]})
    return conn


def start_sessions(port, first, count):
    """`count` assigns in sessions `s<first>`... from CLIENTS connections; seconds taken."""
    started = time.monotonic()
    failures = []

    def run(client):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            for n in range(first + client, first + count, CLIENTS):
                answer = call(conn, "POST", "/pools/s/assign", {"session": f"s{n}"})
                if answer is None or answer["session"]["repinned"]:
                    failures.append(answer)
        except Exception as error:  # reported below, after every thread ended
            failures.append(error)

    threads = [threading.Thread(target=run, args=(c,)) for c in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise RuntimeError(f"{len(failures)} assigns failed, the first: {failures[0]!r}")
    return time.monotonic() - started


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
            create_pool(port)
            before = redis_info(redis_port, "used_memory")
            keys_before = dbsize(redis_port)
            took = start_sessions(port, 0, SESSIONS)
            after = redis_info(redis_port, "used_memory")
            keys_after = dbsize(redis_port)
            # Every session ends TTL_MS after its assign; Redis expires the keys in its
            # background cycle: wait for it, touching nothing.
            time.sleep(TTL_MS / 1000 + 1)
            wait_for_expiry(redis_port, keys_before, 60)
            ended = redis_info(redis_port, "used_memory")
            rows.append(("redis (used_memory)", before, after, ended, took,
                         f"{keys_before} / {keys_after} / {dbsize(redis_port)}"))
        finally:
            service.terminate()
            service.wait()
    finally:
        redis.terminate()
        redis.wait()

    service, port = start_service({})
    try:
        create_pool(port)
        before = rss_kib(service.pid) * 1024
        took = start_sessions(port, 0, SESSIONS)
        after = rss_kib(service.pid) * 1024
        time.sleep(TTL_MS / 1000 + 1)
        # Each assign in a session clears up to 16 ended ones.
        start_sessions(port, SESSIONS, SESSIONS // 16 + 1)
        ended = rss_kib(service.pid) * 1024
        rows.append(("embedded (RSS)", before, after, ended, took, "-"))
    finally:
        service.terminate()
        service.wait()

    print(f"{SESSIONS} sessions started in one pool of 100 members (session_ttl_ms {TTL_MS}); "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    if any(took * 1000 > TTL_MS for *_, took, _ in rows):
        print("warning: starting the sessions took longer than their ttl; raise TTL_MS")
    print()
    print("| store | before | after the sessions | per session | once ended | assigns took | keys before / after / ended |")
    print("|---|---|---|---|---|---|---|")
    for store, before, after, ended, took, keys in rows:
        per = (after - before) / SESSIONS
        print(f"| {store} | {before / 2**20:.1f} MiB | {after / 2**20:.1f} MiB | {per:.0f} B "
              f"| {ended / 2**20:.1f} MiB | {took:.1f} s | {keys} |")


if __name__ == "__main__":
    main()
