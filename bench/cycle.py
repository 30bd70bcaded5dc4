"""The whole worker cycle, measured: assign → request → report (least-used pools) or
assign → request → release (least-in-flight pools), as two calls or as one assign carrying
`done`, side by side with redis-benchmark driving the same scripts with the same
arguments, in one run on one Redis.

    bash bench/cycle.sh                      # median of 5 alternating runs of 10 s
    ROUNDS=3 DURATION=3 bash bench/cycle.sh  # a short run
    POOL_SIZE=10000 bash bench/cycle.sh

Six cycles, each over CONNECTIONS (64) connections from one wrk thread:

    least-used assign                         POST /assign
    least-in-flight assign                    POST /assign on a pool of lease ttl 1 s
    least-used assign + separate report       POST /assign, then POST /outcomes about it
    least-used assign carrying done           POST /assign {"done": {proxy, result: ok}}
    least-in-flight assign + separate release POST /assign, then POST .../release
    least-in-flight assign carrying done      POST /assign {"done": {"lease": id}}

Per cycle: the rate (cycles/s; a two-call cycle is two requests), p50 and p99 of one call,
Redis's CPU (`INFO cpu`, user + sys, before and after) and the service's (utime + stime of
/proc/<pid>/stat) divided by the cycles. redis-benchmark runs, in the same rounds, EVALSHA of
exactly the scripts the service sends (the same text, all of the pool's keys, the service's
arguments with one member and lease id written in): for a two-call cycle each script on its
own, the cycle's rate then 1 / (1/rate_a + 1/rate_b) and its CPU the sum. Its release names
a lease that is not live (the id cannot follow the assigns), a cheaper call than a real
release, so that yardstick is generous. Not a test: nothing here passes or fails on a
number.

The bare least-in-flight assign is the yardstick of the least-in-flight cycles: it runs on
a pool of its own whose lease ttl is 1,000 ms, so that leases never released do not pile
up (about one second's worth stay live, and each assign reclaims the expired ones, as
abandoned). Each row's last column is its rate against the bare assign of its own policy.
"""

import hashlib
import json
import os
import re
import signal
import subprocess
import tempfile
import time
import urllib.request
from datetime import date

import assign as bench

SCRIPTS = bench.SCRIPTS
POOL_SIZE = int(os.environ.get("POOL_SIZE", "100"))
# Every key of a pool, as the service passes them (POOL_KEY_PARTS in keys.rs).
KEY_PARTS = bench.KEY_PARTS
HELPERS = ["labels.lua", "leases.lua", "health.lua"]
LEASE = "0123456789abcdef0123456789abcdef"
# ARGV of an assign as the service sends it (operations.rs): a lease id, no ttl, the reclaim
# and return batch sizes, the label check budget, one member.
ASSIGN_ARGS = [LEASE, "", "16", "16", "2000", "1"]
# assign_done.lua's own seven, after the assign's: member, result, lease, targeted, jitter
# draw, most targets, expired targets to clear.
BAN_LIMITS = ["100000", "16"]


def text(*parts):
    return "".join(open(os.path.join(SCRIPTS, p)).read() for p in parts)


def script_texts():
    """Each script as the service composes it (src/store/redis/scripts.rs)."""
    return {
        "assign": text("leases_fast.lua", "assign_fast.lua", *HELPERS, "assign.lua"),
        "assign_done": text("leases_fast.lua", "assign_done_fast.lua") + "local function pick()\n"
        + text("assign_fast.lua", *HELPERS, "assign.lua")
        + "end\nif done then\n    return done_reply(done, pick())\nend\n"
        + text(*HELPERS, "report.lua", "assign_done.lua") + "local function pick_after_done()\n"
        + text("assign_fast.lua", "assign.lua")
        + "end\nreturn with_done(done, pick_after_done())\n",
        "outcomes": text(*HELPERS, "report.lua", "outcomes.lua"),
        "release": text(*HELPERS, "release.lua"),
    }


def redis_cpu(port):
    info = subprocess.run(["redis-cli", "-p", str(port), "INFO", "cpu"], check=True,
                          capture_output=True, text=True).stdout
    values = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    return float(values["used_cpu_user"]) + float(values["used_cpu_sys"])


def process_cpu(pid):
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid, field="VmRSS:"):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    return float("nan")


# wrk scripts. `response` sees every answer of the thread; the ids it reads go into a queue
# that the next `request` takes from, so each cycle's second call (or the next assign's
# `done`) names what an earlier assign handed out.
def queued(pool, pattern, follow):
    """A wrk script that assigns from `pool`, reads `pattern` from each answer and sends
    `follow` (Lua, of `v`, the value read) as the request after it."""
    return r'''
local queue, head, tail = {}, 1, 0
local assign = wrk.format("POST", "/pools/POOL/assign")
local json = {["Content-Type"] = "application/json"}
request = function()
  if head > tail then return assign end
  local v = queue[head]; queue[head] = nil; head = head + 1
  return FOLLOW
end
response = function(status, headers, body)
  local v = string.match(body, 'PATTERN')
  if v then tail = tail + 1; queue[tail] = v end
end
'''.replace("POOL", pool).replace("PATTERN", pattern).replace("FOLLOW", follow)


PROXY = '^{"pool":"lu","proxy":"([^"]+)"'
LEASE_ID = '"lease":{"id":"(%x+)"'
WRK_SCRIPTS = {
    "assign": 'wrk.method = "POST"\n',
    "report": queued("lu", PROXY, """wrk.format("POST", "/pools/lu/outcomes", json,
      '{"proxy":"' .. v .. '","result":"ok"}')"""),
    "done": queued("lu", PROXY, """wrk.format("POST", "/pools/lu/assign", json,
      '{"done":{"proxy":"' .. v .. '","result":"ok"}}')"""),
    "release": queued("lif", LEASE_ID,
                      'wrk.format("POST", "/pools/lif/leases/" .. v .. "/release")'),
    "lease_done": queued("lif", LEASE_ID, """wrk.format("POST", "/pools/lif/assign", json,
      '{"done":{"lease":"' .. v .. '"}}')"""),
}

# (label, wrk script, pool, calls per cycle, redis-benchmark scripts of one cycle)
CYCLES = [
    ("least-used assign", "assign", "lu", 1, ["assign"]),
    ("least-used assign + separate report", "report", "lu", 2, ["assign", "outcomes"]),
    ("least-used assign carrying `done`", "done", "lu", 1, ["assign_done"]),
    ("least-in-flight assign (lease ttl 1 s)", "assign", "lif-short", 1, ["assign"]),
    ("least-in-flight assign + separate release", "release", "lif", 2, ["assign", "release"]),
    ("least-in-flight assign carrying `done`", "lease_done", "lif", 1, ["assign_done_lease"]),
]


def wrk_run(base, name, pool, pids, redis_port):
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(WRK_SCRIPTS[name])
    cpu_before = {pid: process_cpu(pid) for pid in pids}
    redis_before = redis_cpu(redis_port)
    out = subprocess.run(
        ["wrk", "-t1", f"-c{bench.CONNECTIONS}", f"-d{bench.DURATION}s", "--latency", "-s",
         script.name, f"{base}/pools/{pool}/assign"],
        check=True, capture_output=True, text=True).stdout
    redis_used = redis_cpu(redis_port) - redis_before
    service_used = sum(process_cpu(pid) - cpu_before[pid] for pid in pids)
    os.unlink(script.name)
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    seconds = float(re.search(r"requests in ([\d.]+)s", out).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    return {"requests": requests, "seconds": seconds,
            "p50": bench.to_ms(re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1)),
            "p99": bench.to_ms(re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1)),
            "non2xx": int(non2xx.group(1)) if non2xx else 0,
            "redis_cpu": redis_used, "service_cpu": service_used}


def benchmark_run(redis_port, sha, keys, args):
    requests = max(100_000, 60_000 * bench.DURATION)
    before = redis_cpu(redis_port)
    out = subprocess.run(
        ["redis-benchmark", "-p", str(redis_port), "-c", str(bench.CONNECTIONS), "-n",
         str(requests), "--csv", "EVALSHA", sha, str(len(keys)), *keys, *args],
        check=True, capture_output=True, text=True).stdout.strip().splitlines()
    used = redis_cpu(redis_port) - before
    header = [h.strip('"') for h in out[0].split(",")]
    values = dict(zip(header, [v.strip('"') for v in out[-1].split(",")]))
    return {"rps": float(values["rps"]), "p50": float(values["p50_latency_ms"]),
            "p99": float(values["p99_latency_ms"]), "redis_cpu_per_call": used / requests}


def put(base, path, body, method="PUT"):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method=method)
    req.add_header("Authorization", f"Bearer {bench.TOKEN}")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.status


def seed(base):
    members = [f"proxy-{i:07d}" for i in range(POOL_SIZE)]
    for pool, config in [("lu", {}), ("lif", {"policy": "least-in-flight"}),
                         ("lif-short", {"policy": "least-in-flight", "lease_ttl_ms": 1000})]:
        put(base, f"/pools/{pool}", config)
        for start in range(0, POOL_SIZE, 10_000):
            put(base, f"/pools/{pool}/members",
                {"members": members[start:start + 10_000], "assignments": 0}, method="POST")


def main():
    redis_port = bench.free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc = None
    try:
        bench.wait_port(redis_port)
        proc, base = bench.start_service(f"redis://127.0.0.1:{redis_port}")
        time.sleep(1)
        rss_idle = rss_mb(proc.pid)
        seed(base)
        # The service loads its scripts at start: each text composed here must be one of
        # them, byte for byte, or redis-benchmark would measure another script.
        shas = {name: hashlib.sha1(body.encode()).hexdigest()
                for name, body in script_texts().items()}
        for name, sha in shas.items():
            found = subprocess.run(["redis-cli", "-p", str(redis_port), "SCRIPT", "EXISTS", sha],
                                   check=True, capture_output=True, text=True).stdout.strip()
            if found != "1":
                raise SystemExit(f"{name}: the text composed here is not the service's script")
        keys = {pool: [f"{bench.PREFIX}:{{{pool}}}:{part}" for part in KEY_PARTS]
                for pool in ["lu", "lif", "lif-short"]}
        member = "proxy-0000000"
        draw = "0"
        # What redis-benchmark runs for each script of a cycle: (script, pool, ARGV).
        yardsticks = {
            "assign": ("assign", "lu", ASSIGN_ARGS),
            "outcomes": ("outcomes", "lu", ["worker", draw, *BAN_LIMITS, member, "ok", "", "",
                                            ""]),
            "assign_done": ("assign_done", "lu",
                            [*ASSIGN_ARGS, member, "ok", "", "", draw, *BAN_LIMITS]),
            "release": ("release", "lif", [LEASE]),
            "assign_done_lease": ("assign_done", "lif",
                                  [*ASSIGN_ARGS, "", "", LEASE, "", draw, *BAN_LIMITS]),
        }
        # The least-in-flight assign of redis-benchmark leases without releasing: a ttl of
        # 1 s keeps the live leases at about one second's worth, reclaimed as assigns go.
        lif_assign = ("assign", "lif", [LEASE, "1000", "16", "16", "2000", "1"])
        results = {}
        for label, name, pool, calls, scripts in CYCLES:
            service_runs, bench_runs = [], []
            for round_ in range(bench.ROUNDS):
                def service():
                    service_runs.append(wrk_run(base, name, pool, [proc.pid], redis_port))

                def yardstick():
                    runs = []
                    for script in scripts:
                        sname, spool, args = yardsticks[script]
                        if script == "assign" and pool == "lif":
                            sname, spool, args = lif_assign
                        elif script == "assign" and pool == "lif-short":
                            spool = pool
                        runs.append(benchmark_run(redis_port, shas[sname], keys[spool], args))
                    bench_runs.append(runs)

                for step in (service, yardstick) if round_ % 2 == 0 else (yardstick, service):
                    step()
            results[label] = (calls, service_runs, bench_runs)
            print(f"measured: {label}; load {bench.load_average()}", flush=True)
        rss_load = rss_mb(proc.pid, "VmHWM:")
        report(results, rss_idle, rss_load)
    finally:
        if proc:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        redis.terminate()
        redis.wait()


def mid(values):
    values = sorted(values)
    return values[len(values) // 2]


def report(results, rss_idle, rss_load):
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), "?")
    print(f"\n{date.today()} · {os.cpu_count()} cores ({cpu}) · Redis store, pool of "
          f"{POOL_SIZE:,} members · {bench.CONNECTIONS} connections · median of "
          f"{bench.ROUNDS} runs of {bench.DURATION} s, the service's alternating with "
          f"redis-benchmark's · wrk -t1 · load average {bench.load_average()}\n")
    print("| cycle | by | cycles/s | p50 ms | p99 ms | Redis CPU µs/cycle | "
          "service CPU µs/cycle | non-2xx | vs redis-benchmark (range) | vs bare assign | "
          "vs its policy's bare assign |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    bare = None
    bare_of_policy = {}
    for label, (calls, service_runs, bench_runs) in results.items():
        cycles = [r["requests"] / calls for r in service_runs]
        rates = [c / r["seconds"] for c, r in zip(cycles, service_runs)]
        yard_rates = [1 / sum(1 / s["rps"] for s in runs) for runs in bench_runs]
        ratios = sorted(a / b for a, b in zip(rates, yard_rates))
        redis_us = mid(r["redis_cpu"] / c * 1e6 for r, c in zip(service_runs, cycles))
        service_us = mid(r["service_cpu"] / c * 1e6 for r, c in zip(service_runs, cycles))
        if bare is None:
            bare = rates
        policy = label.split(" assign")[0]
        if calls == 1 and policy not in bare_of_policy:
            bare_of_policy[policy] = rates
        vs_bare = sorted(a / b for a, b in zip(rates, bare))
        vs_own = sorted(a / b for a, b in zip(rates, bare_of_policy.get(policy, bare)))
        print(f"| {label} | service | {mid(rates):,.0f} | {mid(r['p50'] for r in service_runs):.2f} "
              f"| {mid(r['p99'] for r in service_runs):.2f} | {redis_us:.1f} | {service_us:.1f} "
              f"| {sum(r['non2xx'] for r in service_runs)} "
              f"| {ratios[len(ratios) // 2]:.2f} ({ratios[0]:.2f}–{ratios[-1]:.2f}) "
              f"| {vs_bare[len(vs_bare) // 2]:.2f} ({vs_bare[0]:.2f}–{vs_bare[-1]:.2f}) "
              f"| {vs_own[len(vs_own) // 2]:.2f} ({vs_own[0]:.2f}–{vs_own[-1]:.2f}) |")
        yard_redis = mid(sum(s["redis_cpu_per_call"] for s in runs) * 1e6 for runs in bench_runs)
        print(f"| {label} | redis-benchmark | {mid(yard_rates):,.0f} "
              f"| {mid(max(s['p50'] for s in runs) for runs in bench_runs):.2f} "
              f"| {mid(max(s['p99'] for s in runs) for runs in bench_runs):.2f} "
              f"| {yard_redis:.1f} | | | | | |")
    print(f"\nservice RSS: {rss_idle:.1f} MB idle (after start), {rss_load:.1f} MB peak under load")
    print("p50 and p99 are of one call (a two-call cycle has two); redis-benchmark's of a "
          "two-call cycle are the larger of its two scripts'.")


if __name__ == "__main__":
    main()
