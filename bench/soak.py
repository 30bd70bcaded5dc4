"""Drives bench/soak.sh: three replicas on one Redis under a mixed load for MINUTES.

Workers spread over the replicas: assigns on least-used pools, leases taken and released
(or left to expire, as crashed workers do) on least-in-flight pools, outcome reports that
trip members, disables and enables, and one import a minute. Every minute a line: requests/s
per kind, errors told apart by route and by status (or by the exception the client raised),
each replica's RSS, Redis's memory and the live leases. Nothing may grow without bound.
"""

import http.client
import json
import os
import random
import threading
import time

from assign import TOKEN
from pools import call, redis_info, rss_mb, start_redis, start_service, stop

MINUTES = int(os.environ.get("MINUTES", "10"))
WORKERS = int(os.environ.get("WORKERS", "12"))
POOLS = 20
MEMBERS = [f"m{i:03d}.example.net:3128" for i in range(50)]


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}
        self.errors = {}

    def add(self, kind, error=None):
        """Counts one request of `kind`; `error` is what went wrong, if anything: the
        status of an answer other than 2xx, or the name of the exception the client
        raised (a connection closed under it, a timeout)."""
        with self.lock:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            if error is not None:
                self.errors[(kind, error)] = self.errors.get((kind, error), 0) + 1

    def take(self):
        with self.lock:
            counts, errors = self.counts, self.errors
            self.counts, self.errors = {}, {}
        return counts, errors


def attempt(tally, kind, conn, method, path, body=None):
    """One request; its answer's JSON when it was 2xx, else None. A failure of the
    connection itself is raised again after it is counted, so that the worker opens a new
    one."""
    payload = None if body is None else json.dumps(body)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    try:
        conn.request(method, path, body=payload, headers=headers)
        response = conn.getresponse()
        data = response.read()
    except (http.client.HTTPException, OSError) as error:
        tally.add(kind, type(error).__name__)
        raise
    if not 200 <= response.status < 300:
        tally.add(kind, str(response.status))
        return None
    tally.add(kind)
    return json.loads(data) if data else None


def worker(port, tally, stop_at):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    rng = random.Random()
    while time.time() < stop_at:
        pick = rng.random()
        used, leased = f"used-{rng.randrange(POOLS)}", f"leased-{rng.randrange(POOLS)}"
        try:
            if pick < 0.45:
                attempt(tally, "assign least-used", conn, "POST", f"/pools/{used}/assign")
            elif pick < 0.80:
                answer = attempt(tally, "assign least-in-flight", conn, "POST",
                                 f"/pools/{leased}/assign")
                # One lease in ten is never released: a crashed worker's, reclaimed later.
                if answer and "lease" in answer and rng.random() < 0.9:
                    attempt(tally, "release", conn, "POST",
                            f"/pools/{leased}/leases/{answer['lease']['id']}/release")
            elif pick < 0.95:
                result = "ok" if rng.random() < 0.7 else "failed"
                attempt(tally, "outcome", conn, "POST", f"/pools/{used}/outcomes",
                        {"proxy": rng.choice(MEMBERS), "result": result})
            else:
                member = rng.choice(MEMBERS)
                attempt(tally, "disable", conn, "POST", f"/pools/{used}/members/disable",
                        {"members": [member], "reason": "soak"})
                attempt(tally, "enable", conn, "POST", f"/pools/{used}/members/enable",
                        {"members": [member]})
        except (http.client.HTTPException, OSError):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)


def importer(port, tally, stop_at):
    minute = 0
    while time.time() < stop_at:
        lines = "\n".join(f"i{minute:03d}-{i:04d}.example.net:3128" for i in range(1000))
        # A connection of its own each time: one kept from a minute before was closed by
        # the service long since (KEEP_ALIVE_TIMEOUT_MS, 5 s), and http.client would send
        # into it and fail.
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            conn.request("POST", "/pools/imported/import", body=lines,
                         headers={"Authorization": f"Bearer {TOKEN}",
                                  "Content-Type": "text/plain"})
            response = conn.getresponse()
            response.read()
            tally.add("import", None if response.status == 200 else str(response.status))
        except (http.client.HTTPException, OSError) as error:
            tally.add("import", type(error).__name__)
        finally:
            conn.close()
        minute += 1
        time.sleep(max(0.0, min(60.0, stop_at - time.time())))


def live_leases(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    total, cursor = 0, ""
    while True:
        page = call(conn, "GET", f"/pools?prefix=leased&cursor={cursor}")
        total += sum(p["stats"]["in_flight"] for p in page["pools"])
        if not page["next_cursor"]:
            return total
        cursor = page["next_cursor"]


def main():
    redis, redis_port = start_redis()
    replicas = []
    try:
        env = {"REDIS_URL": f"redis://127.0.0.1:{redis_port}"}
        replicas = [start_service(env) for _ in range(3)]
        conn = http.client.HTTPConnection("127.0.0.1", replicas[0][1], timeout=30)
        for i in range(POOLS):
            call(conn, "PUT", f"/pools/used-{i}", {"health": {"max_consecutive_failures": 2,
                                                             "cooldown_ms": 5000}})
            call(conn, "POST", f"/pools/used-{i}/members", {"members": MEMBERS})
            call(conn, "PUT", f"/pools/leased-{i}", {"policy": "least-in-flight",
                                                    "lease_ttl_ms": 5000})
            call(conn, "POST", f"/pools/leased-{i}/members", {"members": MEMBERS})
        call(conn, "PUT", "/pools/imported", {"rules": {"max_members": 5000}})
        tally = Tally()
        stop_at = time.time() + 60 * MINUTES
        threads = [threading.Thread(target=worker, args=(replicas[i % 3][1], tally, stop_at))
                   for i in range(WORKERS)]
        threads.append(threading.Thread(target=importer, args=(replicas[0][1], tally, stop_at)))
        for thread in threads:
            thread.start()
        kinds = ["assign least-used", "assign least-in-flight", "release", "outcome",
                 "disable", "enable", "import"]
        print(f"Three replicas on one Redis, {WORKERS} workers, {MINUTES} minutes.")
        print()
        print("| minute | " + " | ".join(f"{k} /s" for k in kinds) +
              " | errors (route, status or client exception, count) | RSS per replica | "
              "Redis memory | leases live |")
        print("|---:|" + "---:|" * (len(kinds) + 4))
        began = time.time()
        for minute in range(1, MINUTES + 1):
            time.sleep(max(0.0, began + 60 * minute - time.time()))
            counts, errors = tally.take()
            rates = " | ".join(f"{counts.get(k, 0) / 60:.1f}" for k in kinds)
            told = ", ".join(f"{kind} {error} ×{n}" for (kind, error), n in sorted(errors.items()))
            rss = " / ".join(f"{rss_mb(proc.pid):.1f}" for proc, _ in replicas)
            memory = int(redis_info(redis_port)["used_memory"]) / (1024 * 1024)
            print(f"| {minute} | {rates} | {told or 0} | {rss} MB | "
                  f"{memory:.1f} MB | {live_leases(replicas[0][1])} |", flush=True)
        for thread in threads:
            thread.join()
    finally:
        for proc, _ in replicas:
            stop(proc)
        redis.terminate()
        redis.wait()


if __name__ == "__main__":
    main()
