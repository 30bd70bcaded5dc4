"""Drives bench/assign.sh: starts Redis and the release build, seeds pools, measures.

Then the embedded store in memory against the embedded store in a data directory
(`DATA_DIR`), two services side by side, their runs alternating; the disk written per
assign, the log's size before and after compaction, and the time a restart takes to
recover the data directory.

Every number in the table comes from this one run, on this machine, with the load
generator, Redis and the service sharing its cores; compare the ratios, not the absolute
figures, across machines.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import date

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARY = os.path.join(ROOT, "target", "release", "proxy-allocator")
SCRIPTS = os.path.join(ROOT, "src", "store", "scripts")
# The service sends the fast path and the shared helpers in front of the assign script
# (`fast_path_then_helpers` in src/store/redis/scripts.rs) with every key of the pool
# (`POOL_KEY_PARTS` in src/store/redis/keys.rs); redis-benchmark must run exactly that
# script with exactly those keys to be a fair yardstick.
SCRIPT_PARTS = ["leases_fast.lua", "assign_fast.lua", "labels.lua", "leases.lua", "health.lua", "assign.lua"]
KEY_PARTS = ["meta", "eligible", "ineligible", "taken_out", "by_in_flight", "in_flight",
             "leases", "lease_expiry", "health", "returns", "checks", "check_round", "labels",
             "by_label", "label_members", "sources", "origins", "seen", "check_fails", "prune",
             "bans", "paced"]
SIZES = [int(s) for s in os.environ.get("SIZES", "100 10000 1000000").split()]
DURATION = int(os.environ.get("DURATION", "10"))
# The machines are shared and noisy: every figure is the median of ROUNDS runs, and the
# runs that are compared alternate, so that a slow minute slows both sides.
ROUNDS = int(os.environ.get("ROUNDS", "5"))
CONNECTIONS = int(os.environ.get("CONNECTIONS", "64"))
# redis-benchmark drives its connections from one thread, so wrk gets one thread too: on two
# shared cores every load-generator thread takes CPU from Redis and the service, and the
# yardstick is fair only if both generators take the same share. The middle pool size is
# also measured with two wrk threads, in the same rounds, to show what the choice is worth.
WRK_THREADS = int(os.environ.get("WRK_THREADS", "1"))
# Pool sizes of the in-memory against DATA_DIR comparison.
DURABLE_SIZES = [int(s) for s in os.environ.get("DURABLE_SIZES", "100 1000000").split()]
FSYNC_INTERVAL_S = int(os.environ.get("FSYNC_INTERVAL_MS", "1000")) / 1000
# Which parts run: "redis", "embedded", "durable" (all by default); "kinds" alone runs
# bench/kinds.py instead, the assign rate per kind of request.
PARTS = os.environ.get("PARTS", "redis embedded durable").split()
TOKEN = "bench-token"
ASSIGN = "service `POST /assign`"
PREFIX = "bench"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"nothing listens on {port}")


def request(base, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {TOKEN}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.status


def seed(base, pool, size):
    request(base, "PUT", f"/pools/{pool}", {})
    chunk = 10_000
    for start in range(0, size, chunk):
        members = [f"proxy-{i:07d}" for i in range(start, min(size, start + chunk))]
        request(base, "POST", f"/pools/{pool}/members", {"members": members, "assignments": 0})


def to_ms(text):
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def read_http(sock, pending):
    """One HTTP/1.1 answer read off a kept-alive socket: (head, body, bytes after it)."""
    while b"\r\n\r\n" not in pending:
        pending += sock.recv(65536)
    head, rest = pending.split(b"\r\n\r\n", 1)
    length = int(re.search(rb"content-length: (\d+)", head, re.I).group(1))
    while len(rest) < length:
        rest += sock.recv(65536)
    return head, rest[:length], rest[length:]


def wrk(url, method="POST", threads=None, body=None, lua=None):
    """One wrk run; `lua` is more of its script (a `request` function that varies bodies)."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(f'wrk.method = "{method}"\n')
        if body is not None:
            script.write(f'wrk.body = [[{json.dumps(body)}]]\n')
            script.write('wrk.headers["Content-Type"] = "application/json"\n')
        if lua is not None:
            script.write(lua)
    out = subprocess.run(
        ["wrk", f"-t{threads or WRK_THREADS}", f"-c{CONNECTIONS}", f"-d{DURATION}s", "--latency", "-s", script.name, url],
        check=True, capture_output=True, text=True,
    ).stdout
    os.unlink(script.name)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p50 = to_ms(re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1))
    p99 = to_ms(re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors:.*", out)
    return {"rps": rps, "p50": p50, "p99": p99,
            "non2xx": int(non2xx.group(1)) if non2xx else 0,
            "socket_errors": errors.group(0) if errors else ""}


def redis_benchmark(port, sha, keys, args, rand=None):
    """One redis-benchmark run of the script; with `rand`, `__rand_int__` in keys and
    arguments stands for a number below it (12 digits, zero-padded)."""
    requests = max(100_000, 60_000 * DURATION)
    keyspace = ["-r", str(rand)] if rand else []
    out = subprocess.run(
        ["redis-benchmark", "-p", str(port), "-c", str(CONNECTIONS), "-n", str(requests), "--csv",
         *keyspace, "EVALSHA", sha, str(len(keys)), *keys, *args],
        check=True, capture_output=True, text=True,
    ).stdout.strip().splitlines()
    header = [h.strip('"') for h in out[0].split(",")]
    row = [v.strip('"') for v in out[-1].split(",")]
    values = dict(zip(header, row))
    return {"rps": float(values["rps"]), "p50": float(values["p50_latency_ms"]),
            "p99": float(values["p99_latency_ms"]), "non2xx": 0}


def median(runs):
    """The run with the median rate, and the median p50 and p99 of all runs."""
    runs = sorted(runs, key=lambda r: r["rps"])
    mid = runs[len(runs) // 2]
    return {"rps": mid["rps"],
            "p50": sorted(r["p50"] for r in runs)[len(runs) // 2],
            "p99": sorted(r["p99"] for r in runs)[len(runs) // 2],
            "p99_range": (min(r["p99"] for r in runs), max(r["p99"] for r in runs)),
            "non2xx": sum(r["non2xx"] for r in runs),
            "socket_errors": "; ".join(r["socket_errors"] for r in runs if r.get("socket_errors"))}


def with_ratios(figure, runs, yardstick):
    """Adds to `figure` the median and range of the ratios runs / yardstick, round by round.

    Each round's runs follow each other, so their ratio is the least disturbed by the
    machine's slow minutes.
    """
    ratios = sorted(a["rps"] / b["rps"] for a, b in zip(runs, yardstick))
    figure["vs_bench"] = ratios[len(ratios) // 2]
    figure["vs_bench_range"] = (ratios[0], ratios[-1])
    return figure


def alternating(sides, run):
    """Runs `run(side)` ROUNDS times for each of `sides`, the sides taking turns and the
    first of each round alternating, so that a slow minute of the machine slows every side.
    Returns side -> its runs, round by round."""
    runs = {side: [] for side in sides}
    for round_ in range(ROUNDS):
        for side in sides if round_ % 2 == 0 else sides[::-1]:
            runs[side].append(run(side))
    return runs


def compared(runs, base, other):
    """`other` against `base` from `alternating`'s runs, as text: each side's median rate
    and p99, and the median and range of the other/base ratios of the same rounds."""
    ratios = sorted(o["rps"] / b["rps"] for o, b in zip(runs[other], runs[base]))
    medians = {side: median(runs[side]) for side in (base, other)}
    return (
        f"{base} {medians[base]['rps']:9,.0f}/s p99 {medians[base]['p99']:.2f} ms  "
        f"{other} {medians[other]['rps']:9,.0f}/s p99 {medians[other]['p99']:.2f} ms  "
        f"{other}/{base} {ratios[len(ratios) // 2]:.3f} ({ratios[0]:.3f}-{ratios[-1]:.3f})  "
        f"non-2xx {medians[base]['non2xx']}+{medians[other]['non2xx']}"
    )


def against_plain(side, body, seed, what):
    """Runs the plain assign (no body) and the assign with `body` alternating on one pool
    `p` that `seed(base, pool)` fills, on the embedded store and then on a Redis of its own,
    printing per store the median rates and the side/plain ratios with `what` (the pool)."""
    redis_port = free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(redis_port)
    try:
        for store, url in [("embedded", None), ("redis", f"redis://127.0.0.1:{redis_port}")]:
            proc, base = start_service(url)
            try:
                seed(base, "p")
                target = base + "/pools/p/assign"
                runs = alternating(
                    ["plain", side],
                    lambda name: wrk(target, body=body if name == side else None))
                print(f"{store:8} {what}  {compared(runs, 'plain', side)}  "
                      f"load {load_average()}", flush=True)
            finally:
                proc.terminate()
                proc.wait()
    finally:
        redis.terminate()
        redis.wait()


def load_average():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def peak_rss_mb(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def start_service(redis_url, data_dir=None, log_to=os.devnull):
    port = free_port()
    env = dict(os.environ, ADMIN_TOKEN=TOKEN, LISTEN_ADDR=f"127.0.0.1:{port}",
               KEY_PREFIX=PREFIX, LOG_FORMAT="json")
    env.pop("REDIS_URL", None)
    env.pop("DATA_DIR", None)
    if redis_url:
        env["REDIS_URL"] = redis_url
    if data_dir:
        env["DATA_DIR"] = data_dir
    log = open(log_to, "w")
    proc = subprocess.Popen([BINARY], env=env, stdout=log, stderr=log)
    wait_port(port, timeout=60)
    return proc, f"http://127.0.0.1:{port}"


def storage_written(pid):
    """Bytes the process has sent to the storage layer so far (`write_bytes`)."""
    with open(f"/proc/{pid}/io") as io:
        for line in io:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    return 0


def data_files(data_dir):
    """(total bytes of log files, total bytes of snapshots) in the directory now."""
    logs = snapshots = 0
    for name in os.listdir(data_dir):
        try:
            size = os.path.getsize(os.path.join(data_dir, name))
        except OSError:
            continue
        if name.startswith("log."):
            logs += size
        elif name.startswith("snapshot.") and not name.endswith(".partial"):
            snapshots += size
    return logs, snapshots


class DirectoryWatch:
    """Samples the data directory every 0.2 s: the log's largest size before each
    compaction, and its size and the snapshot's right after."""

    def __init__(self, data_dir):
        import threading
        self.data_dir, self.compactions, self.running = data_dir, [], True
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        largest_log, last_snapshot = 0, data_files(self.data_dir)[1]
        while self.running:
            logs, snapshot = data_files(self.data_dir)
            if snapshot != last_snapshot and snapshot > 0:
                self.compactions.append({"log_before": largest_log, "log_after": logs,
                                         "snapshot": snapshot})
                largest_log, last_snapshot = logs, snapshot
            largest_log = max(largest_log, logs)
            time.sleep(0.2)

    def stop(self):
        self.running = False
        self.thread.join()


def recover(data_dir):
    """Restarts a service on `data_dir`: seconds until it listens, and the recovery's own
    figure from its log line."""
    log = os.path.join(tempfile.mkdtemp(), "recovery.log")
    started = time.time()
    proc, _ = start_service(None, data_dir=data_dir, log_to=log)
    listening = time.time() - started
    # CPU the process used to get there (recovery, mostly): on a busy machine the wall
    # time says more about the neighbours.
    with open(f"/proc/{proc.pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    took_ms = None
    deadline = time.time() + 10
    while took_ms is None and time.time() < deadline:
        with open(log) as lines:
            for line in lines:
                if "recovered the data directory" in line:
                    took_ms = json.loads(line)["took_ms"]
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    return listening, took_ms, cpu


def durable_rows():
    """In memory against DATA_DIR: one service of each, alternating runs."""
    rows, extra = [], []
    data_dir = tempfile.mkdtemp(prefix="pa-bench-data-")
    memory, memory_base = start_service(None)
    disk, disk_base = start_service(None, data_dir=data_dir)
    watch = DirectoryWatch(data_dir)
    written, assigns = 0, 0
    try:
        for size in DURABLE_SIZES:
            pool = f"p{size}"
            seed(memory_base, pool, size)
            seed(disk_base, pool, size)
            on_memory, on_disk = [], []
            for _ in range(ROUNDS):
                on_memory.append(wrk(f"{memory_base}/pools/{pool}/assign"))
                before = storage_written(disk.pid)
                on_disk.append(wrk(f"{disk_base}/pools/{pool}/assign"))
                # The last interval's records reach the file after the run: wait for them.
                time.sleep(FSYNC_INTERVAL_S + 0.5)
                written += storage_written(disk.pid) - before
                assigns += on_disk[-1]["rps"] * DURATION
            memory_figure = median(on_memory)
            disk_figure = with_ratios(median(on_disk), on_disk, on_memory)
            rows.append((ASSIGN + ", in memory", "embedded", size, memory_figure, None))
            rows.append((ASSIGN + ", `DATA_DIR`", "embedded", size, disk_figure, None))
        rows.append(("peak RSS of the service, in memory", "embedded", "-",
                     {"rss": peak_rss_mb(memory.pid)}, None))
        rows.append(("peak RSS of the service, `DATA_DIR`", "embedded", "-",
                     {"rss": peak_rss_mb(disk.pid)}, None))
    finally:
        watch.stop()
        for proc in (memory, disk):
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    logs, snapshot = data_files(data_dir)
    extra.append(f"disk written per assign with DATA_DIR: {written / max(assigns, 1):.1f} bytes "
                 f"({written / 1e6:,.0f} MB for {assigns:,.0f} assigns, compactions included)")
    for c in watch.compactions:
        extra.append(f"compaction: log {c['log_before'] / 1e6:,.1f} MB before, "
                     f"{c['log_after'] / 1e6:,.1f} MB after, snapshot {c['snapshot'] / 1e6:,.1f} MB")
    extra.append(f"at shutdown: log {logs / 1e6:,.1f} MB, snapshot {snapshot / 1e6:,.1f} MB")
    for attempt in (1, 2):
        listening, took_ms, cpu = recover(data_dir)
        extra.append(f"restart {attempt} on the directory (pools of {', '.join(f'{s:,}' for s in DURABLE_SIZES)} "
                     f"members): recovery {took_ms} ms, listening after {listening:.2f} s, "
                     f"{cpu:.2f} s of CPU until then; load average {os.getloadavg()[0]:.1f}")
    subprocess.run(["rm", "-rf", data_dir], check=False)
    return rows, extra



def main():
    if "kinds" in PARTS:
        import kinds

        kinds.main()
        return
    rows, durable, extra = [], [], []
    if "redis" in PARTS or "embedded" in PARTS:
        rows = redis_and_embedded_rows()
    if "durable" in PARTS:
        durable, extra = durable_rows()
    report(rows)
    if durable:
        report_durable(durable, extra)


def redis_and_embedded_rows():
    redis_port = free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    try:
        wait_port(redis_port)
        text = "".join(open(os.path.join(SCRIPTS, part)).read() for part in SCRIPT_PARTS)
        sha = subprocess.run(["redis-cli", "-p", str(redis_port), "-x", "SCRIPT", "LOAD"],
                             input=text, check=True, capture_output=True, text=True).stdout.strip()
        for store in [p for p in ["redis", "embedded"] if p in PARTS]:
            url = f"redis://127.0.0.1:{redis_port}" if store == "redis" else None
            proc, base = start_service(url)
            try:
                ceiling = median([wrk(base + "/livez", method="GET") for _ in range(ROUNDS)])
                rows.append(("HTTP ceiling (`GET /livez`)", store, "-", ceiling, None))
                for size in SIZES:
                    pool = f"p{size}"
                    seed(base, pool, size)
                    keys = [f"{PREFIX}:{{{pool}}}:{part}" for part in KEY_PARTS]
                    # ARGV as the service sends them: a lease id (unused on a
                    # least-used pool), no ttl, the reclaim and return batch sizes, the
                    # label check budget and one member.
                    args = ["0123456789abcdef0123456789abcdef", "", "16", "16", "2000", "1"]
                    service, yardstick, two_threads = [], [], []
                    compare_threads = store == "redis" and size == SIZES[len(SIZES) // 2] \
                        and WRK_THREADS != 2
                    for _ in range(ROUNDS):
                        service.append(wrk(f"{base}/pools/{pool}/assign"))
                        if store == "redis":
                            yardstick.append(redis_benchmark(redis_port, sha, keys, args))
                        if compare_threads:
                            two_threads.append(wrk(f"{base}/pools/{pool}/assign", threads=2))
                    assign = median(service)
                    if yardstick:
                        with_ratios(assign, service, yardstick)
                    rows.append((ASSIGN, store, size, assign, ceiling))
                    if two_threads:
                        rows.append(("service `POST /assign`, wrk -t2", store, size,
                                     with_ratios(median(two_threads), two_threads, yardstick),
                                     ceiling))
                    if yardstick:
                        rows.append(("redis-benchmark EVALSHA", "redis", size, median(yardstick), None))
                rss = peak_rss_mb(proc.pid)
                rows.append(("peak RSS of the service", store, "-", {"rss": rss}, None))
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)
    finally:
        redis.terminate()
        redis.wait()
    return rows


def report_durable(rows, extra):
    print(f"\n{date.today()} · embedded store in memory against DATA_DIR (FSYNC_INTERVAL_MS "
          f"{os.environ.get('FSYNC_INTERVAL_MS', '1000')}), two services side by side · "
          f"{CONNECTIONS} connections · median of {ROUNDS} runs of {DURATION} s, alternating · "
          f"wrk -t{WRK_THREADS}\n")
    print("| what | pool size | requests/s | p50 ms | p99 ms (range) | non-2xx | vs in memory (range) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for what, _, size, r, _ in rows:
        if "rss" in r:
            print(f"| {what} | | {r['rss']:.1f} MB | | | | |")
            continue
        ratio = (f"{r['vs_bench']:.2f} ({r['vs_bench_range'][0]:.2f}–{r['vs_bench_range'][1]:.2f})"
                 if "vs_bench" in r else "")
        print(f"| {what} | {size:,} | {r['rps']:,.0f} | {r['p50']:.2f} | {r['p99']:.2f} "
              f"({r['p99_range'][0]:.2f}–{r['p99_range'][1]:.2f}) | {r['non2xx']} | {ratio} |")
    for line in extra:
        print(f"\n{line}", end="")
    print()


def report(rows):
    if not rows:
        return
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"\n{date.today()} · {os.cpu_count()} cores ({cpu}) · {CONNECTIONS} connections · "
          f"median of {ROUNDS} runs of {DURATION} s, alternating · wrk -t{WRK_THREADS} and "
          f"redis-benchmark (one thread), Redis and the service on the same machine\n")
    print("| what | store | pool size | requests/s | p50 ms | p99 ms (range) | non-2xx | vs redis-benchmark (range) | vs HTTP ceiling |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for what, store, size, r, ceiling in rows:
        if "rss" in r:
            print(f"| {what} | {store} | | {r['rss']:.1f} MB | | | | | |")
            continue
        vs_bench = (f"{r['vs_bench']:.2f} ({r['vs_bench_range'][0]:.2f}–{r['vs_bench_range'][1]:.2f})"
                    if "vs_bench" in r else "")
        vs_ceiling = f"{r['rps'] / ceiling['rps']:.2f}" if ceiling else ""
        size_text = f"{size:,}" if isinstance(size, int) else size
        print(f"| {what} | {store} | {size_text} | {r['rps']:,.0f} | {r['p50']:.2f} | {r['p99']:.2f} ({r['p99_range'][0]:.2f}–{r['p99_range'][1]:.2f}) | "
              f"{r['non2xx']} | {vs_bench} | {vs_ceiling} |")
    assigns = [r for (what, _, size, r, _) in rows if what.startswith("service")]
    by_size = {(store, size): r["rps"] for (what, store, size, r, _) in rows if what == ASSIGN}
    for store in ["redis", "embedded"]:
        if (store, SIZES[0]) in by_size and (store, SIZES[-1]) in by_size:
            print(f"\n{store}: throughput at {SIZES[-1]:,} members / at {SIZES[0]:,} members = "
                  f"{by_size[(store, SIZES[-1])] / by_size[(store, SIZES[0])]:.2f}", end="")
    print()
    errors = [r["socket_errors"] for r in assigns if r.get("socket_errors")]
    if errors:
        print("\nwrk socket errors:", *errors, sep="\n  ")


if __name__ == "__main__":
    main()
