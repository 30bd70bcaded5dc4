"""Drives bench/pools.sh: what many pools cost a replica that nobody uses.

For each number of pools (1,000 / 10,000 / 100,000 by default, `SIZES`), on a Redis of its
own: the pools are created over HTTP (two members each), then one replica, and then three
on the same Redis, sit idle for `IDLE_SECONDS` (default 60) while Redis is watched:

- commands/s the replicas sent (counted with MONITOR: every command not run by a script),
  EVALSHA/s among them, and every command Redis ran (scripts' own included, `INFO stats`);
- Redis CPU (user + system seconds per second, `INFO cpu`);
- each replica's RSS (`/proc/<pid>/status`, the largest of the three);
- the bytes of one `/metrics` scrape.

Then, in a pool nobody assigns from, how long after its ttl a crashed worker's lease is
reclaimed, and how long after its cooldown a tripped member is back (the sweep interval is
the default, 1 s); how long `GET /pools?limit=1000` takes; and each replica's RSS after
`LOAD_SECONDS` (default 15) of assigns spread over every pool. Last, the embedded store's
RSS per pool and per member.

Every figure comes from this one run on this machine; compare ratios, not absolute figures,
across machines. Prints markdown tables.
"""

import http.client
import json
import os
import queue
import subprocess
import threading
import time

from assign import BINARY, PREFIX, TOKEN, free_port, wait_port

SIZES = [int(s) for s in os.environ.get("SIZES", "1000 10000 100000").split()]
IDLE_SECONDS = int(os.environ.get("IDLE_SECONDS", "60"))
REPLICAS = [int(s) for s in os.environ.get("REPLICAS", "1 3").split()]
THREADS = 16
LOAD_SECONDS = int(os.environ.get("LOAD_SECONDS", "15"))


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


def stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def call(conn, method, path, body=None):
    payload = None if body is None else json.dumps(body)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    conn.request(method, path, body=payload, headers=headers)
    response = conn.getresponse()
    data = response.read()
    if response.status >= 300 and response.status != 204:
        raise RuntimeError(f"{method} {path}: {response.status} {data[:200]!r}")
    return json.loads(data) if data else None


def create_pools(port, first, last):
    """Pools p0000000 .. over HTTP, two members each, from THREADS keep-alive clients."""
    work = queue.Queue()
    for i in range(first, last):
        work.put(f"p{i:07d}")
    failures = []

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            while True:
                try:
                    pool = work.get_nowait()
                except queue.Empty:
                    return
                call(conn, "PUT", f"/pools/{pool}", {})
                call(conn, "POST", f"/pools/{pool}/members",
                     {"members": ["a.example.net:3128", "b.example.net:3128"]})
        except Exception as error:  # reported once the threads are done
            failures.append(error)

    threads = [threading.Thread(target=client) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]


def redis_info(port):
    out = subprocess.run(["redis-cli", "-p", str(port), "INFO", "all"], check=True,
                         capture_output=True, text=True).stdout
    info = {}
    for line in out.splitlines():
        if ":" in line and not line.startswith("#"):
            key, value = line.split(":", 1)
            info[key] = value.strip()
    return info


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def metrics_bytes(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    return len(conn.getresponse().read())


def idle_minute(redis_port, service_ports, pids):
    """Commands the replicas send, Redis CPU and work, over IDLE_SECONDS of nothing."""
    monitor = subprocess.Popen(["redis-cli", "-p", str(redis_port), "MONITOR"],
                               stdout=subprocess.PIPE, text=True)
    counts = {"sent": 0, "evalsha": 0}

    def read_monitor():
        for line in monitor.stdout:
            if " lua] " in line or line.startswith("OK"):
                continue
            counts["sent"] += 1
            if '"EVALSHA"' in line.upper():
                counts["evalsha"] += 1

    reader = threading.Thread(target=read_monitor, daemon=True)
    reader.start()
    before = redis_info(redis_port)
    started = time.time()
    time.sleep(IDLE_SECONDS)
    after = redis_info(redis_port)
    seconds = time.time() - started
    monitor.terminate()
    monitor.wait()
    reader.join(timeout=5)
    cpu = sum(float(after[k]) - float(before[k]) for k in ("used_cpu_sys", "used_cpu_user"))
    ran = int(after["total_commands_processed"]) - int(before["total_commands_processed"])
    return {
        "sent": counts["sent"] / seconds,
        "evalsha": counts["evalsha"] / seconds,
        "ran": ran / seconds,
        "cpu": 100 * cpu / seconds,
        "rss": max(rss_mb(pid) for pid in pids),
        "metrics": metrics_bytes(service_ports[0]),
    }


def listing_ms(port, samples=20):
    """Median and slowest `GET /pools?limit=1000` (the first page), in ms: from the request
    to the answer's last byte. Reading the page's JSON (about 650 KB) is the client's time,
    not the service's, so it is done after the clock stops."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    took = []
    for _ in range(samples):
        began = time.perf_counter()
        conn.request("GET", "/pools?limit=1000", headers=headers)
        response = conn.getresponse()
        data = response.read()
        took.append((time.perf_counter() - began) * 1000)
        assert response.status == 200, (response.status, data[:200])
        page = json.loads(data)
        assert len(page["pools"]) == 1000, len(page["pools"])
    took.sort()
    return took[len(took) // 2], took[-1]


def rss_under_load(service_ports, pids, size):
    """Largest replica RSS after LOAD_SECONDS of assigns spread over every pool, from
    THREADS clients across the replicas; and the assigns per second they made."""
    stop_at = time.time() + LOAD_SECONDS
    done = [0] * THREADS

    def client(n):
        port = service_ports[n % len(service_ports)]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        i = n
        while time.time() < stop_at:
            call(conn, "POST", f"/pools/p{(i * 7919) % size:07d}/assign")
            done[n] += 1
            i += THREADS

    threads = [threading.Thread(target=client, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return max(rss_mb(pid) for pid in pids), sum(done) / LOAD_SECONDS


def poll_stats(conn, pool, until):
    deadline = time.time() + 60
    while time.time() < deadline:
        stats = call(conn, "GET", f"/pools/{pool}")["stats"]
        if until(stats):
            return time.time()
        time.sleep(0.02)
    raise RuntimeError(f"{pool} never got there")


def reclaim_latency(port, tag):
    """Seconds past the ttl / cooldown until the sweep alone ends each, in idle pools."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    ttl_ms = 2000
    leased, cooling = f"leased-{tag}", f"cooling-{tag}"
    call(conn, "PUT", f"/pools/{leased}", {"policy": "least-in-flight", "lease_ttl_ms": ttl_ms})
    call(conn, "POST", f"/pools/{leased}/members", {"members": ["a.example.net:3128"]})
    call(conn, "PUT", f"/pools/{cooling}", {"health": {
        "max_consecutive_failures": 1, "cooldown_ms": ttl_ms, "jitter_percent": 0}})
    call(conn, "POST", f"/pools/{cooling}/members", {"members": ["a.example.net:3128"]})
    handed = time.time()
    call(conn, "POST", f"/pools/{leased}/assign")
    tripped = time.time()
    call(conn, "POST", f"/pools/{cooling}/outcomes",
         {"proxy": "a.example.net:3128", "result": "failed"})
    reclaimed = poll_stats(conn, leased, lambda s: s["abandoned"] == 1)
    returned = poll_stats(conn, cooling, lambda s: s["recovered"] == 1)
    return reclaimed - handed - ttl_ms / 1000, returned - tripped - ttl_ms / 1000


def start_redis():
    """A redis-server of its own on a free port, without persistence."""
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port)
    return proc, port


def redis_rows():
    redis, redis_port = start_redis()
    rows = []
    try:
        env = {"REDIS_URL": f"redis://127.0.0.1:{redis_port}"}
        created = 0
        for size in SIZES:
            proc, port = start_service(env)
            began = time.time()
            create_pools(port, created, size)
            print(f"created {size - created} pools in {time.time() - began:.0f} s", flush=True)
            created = size
            stop(proc)
            for replicas in REPLICAS:
                started = [start_service(env) for _ in range(replicas)]
                try:
                    # Scripts loaded, first sweeps and refreshes done before anything counts.
                    time.sleep(5)
                    figures = idle_minute(redis_port, [p for _, p in started],
                                          [proc.pid for proc, _ in started])
                    lease, back = reclaim_latency(started[0][1], f"{size}-{replicas}")
                    figures.update(reclaim=lease, cooldown=back)
                    figures["list_p50"], figures["list_max"] = listing_ms(started[0][1])
                    figures["rss_load"], figures["assigns"] = rss_under_load(
                        [p for _, p in started], [proc.pid for proc, _ in started], size)
                    rows.append((size, replicas, figures))
                    print(size, replicas, figures, flush=True)
                finally:
                    for proc, _ in started:
                        stop(proc)
    finally:
        redis.terminate()
        redis.wait()
    return rows


def embedded_rows():
    """RSS of the embedded store: empty, with POOLS pools of no members, then MEMBERS more
    members in one pool."""
    pools, members = 10_000, 200_000
    proc, port = start_service({})
    try:
        time.sleep(1)
        empty = rss_mb(proc.pid)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for i in range(pools):
            call(conn, "PUT", f"/pools/e{i:06d}", {})
        with_pools = rss_mb(proc.pid)
        call(conn, "PUT", "/pools/big", {})
        for start in range(0, members, 10_000):
            batch = [f"proxy-{i:07d}.example.net:3128" for i in range(start, start + 10_000)]
            call(conn, "POST", "/pools/big/members", {"members": batch})
        with_members = rss_mb(proc.pid)
    finally:
        stop(proc)
    return {
        "empty": empty,
        "per_pool": (with_pools - empty) * 1024 * 1024 / pools,
        "per_member": (with_members - with_pools) * 1024 * 1024 / members,
        "pools": pools,
        "members": members,
    }


def main():
    rows = redis_rows() if SIZES else []
    print()
    print(f"Idle for {IDLE_SECONDS} s after creating the pools (two members each); sweep "
          "interval 1 s; one replica, then three on the same Redis.")
    print()
    print("| pools | replicas | commands/s sent | EVALSHA/s | Redis commands/s (scripts' "
          "own included) | Redis CPU | RSS per replica (largest) | `/metrics` | lease back "
          "after ttl + | member back after cooldown + |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size, replicas, f in rows:
        print(f"| {size:,} | {replicas} | {f['sent']:.1f} | {f['evalsha']:.1f} | "
              f"{f['ran']:.0f} | {f['cpu']:.1f}% | {f['rss']:.1f} MB | "
              f"{f['metrics'] / 1024:.1f} KB | {f['reclaim'] * 1000:.0f} ms | "
              f"{f['cooldown'] * 1000:.0f} ms |")
    print()
    print(f"Then `GET /pools?limit=1000` (the first page, 20 times) and {LOAD_SECONDS} s of "
          f"assigns over every pool from {THREADS} clients spread over the replicas.")
    print()
    print("| pools | replicas | `GET /pools?limit=1000` median | slowest | assigns/s | "
          "RSS per replica under load (largest) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for size, replicas, f in rows:
        print(f"| {size:,} | {replicas} | {f['list_p50']:.1f} ms | {f['list_max']:.1f} ms | "
              f"{f['assigns']:.0f} | {f['rss_load']:.1f} MB |")
    if os.environ.get("EMBEDDED", "1") == "1":
        e = embedded_rows()
        print()
        print("| embedded store | RSS |")
        print("|---|---:|")
        print(f"| empty | {e['empty']:.1f} MB |")
        print(f"| per pool (no members; {e['pools']:,} pools) | {e['per_pool']:.0f} bytes |")
        print(f"| per member ({e['members']:,} in one pool) | {e['per_member']:.0f} bytes |")


if __name__ == "__main__":
    main()
