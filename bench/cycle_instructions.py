"""Instructions per worker cycle, counted by valgrind's callgrind, the service's and Redis's
apart: the cycles of bench/cycle.py, each one request after another on one keep-alive
connection, so that a change to the done or lease path can be judged on a busy machine
(rates there are not trustworthy, instruction counts repeat to a fraction of a percent).

    python3 bench/cycle_instructions.py BINARY [BINARY ...]

Both the service and its Redis run under callgrind. Per cycle kind, after a warm-up, the
counters of both are zeroed, FEW cycles run and are dumped, then again for MANY cycles: the
difference of the two dumps divided by MANY - FEW is one cycle's cost, what runs at a fixed
rate besides (the sweep, Redis's cron) counted only for the time the extra cycles take.

    SCRIPTS_ONLY=1 python3 bench/cycle_instructions.py BINARY

counts Redis alone running the cycle's scripts as bench/cycle.py composes them from the
working tree's files (EVALSHA with the service's arguments, one call per cycle, over one
connection): BINARY only seeds the pools and stops, so a script change is counted before
any build.

The cycles (pools of 100 members; `lif-short` is least-in-flight with a lease ttl of
1,000 ms, so that its bare assigns leave no more leases live than a second's worth and each
assign reclaims the expired ones, as in bench/cycle.py):

    least-used assign                POST /pools/lu/assign
    least-used assign carrying done  POST /pools/lu/assign {"done": {previous proxy, "ok"}}
    least-in-flight assign           POST /pools/lif-short/assign
    least-in-flight assign carrying done  POST /pools/lif/assign {"done": {previous lease}}
"""

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

import assign as bench
import cycle

FEW, MANY = int(os.environ.get("FEW", "500")), int(os.environ.get("MANY", "2500"))
WARMUP = 300
SCRIPTS_ONLY = os.environ.get("SCRIPTS_ONLY") == "1"
# KEEP_DUMPS=1 keeps callgrind's dumps for callgrind_annotate (their paths are printed).
KEEP_DUMPS = os.environ.get("KEEP_DUMPS") == "1"
POOLS = {"lu": {}, "lif": {"policy": "least-in-flight"},
         "lif-short": {"policy": "least-in-flight", "lease_ttl_ms": 1000}}
PROXY = re.compile(rb'"proxy":"([^"]+)"')
LEASE = re.compile(rb'"lease":\{"id":"([0-9a-f]+)"')
# (label, pool, whether each request carries `done` about the previous answer)
KINDS = [
    ("least-used assign", "lu", False),
    ("least-used assign carrying `done`", "lu", True),
    ("least-in-flight assign (lease ttl 1 s)", "lif-short", False),
    ("least-in-flight assign carrying `done`", "lif", True),
]


def under_callgrind(command, env=None):
    """Starts `command` under callgrind; returns the process and the prefix of its dumps."""
    out = tempfile.mktemp(suffix=".callgrind")
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *command],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, out


class Counted:
    """Processes under callgrind, zeroed and dumped together (callgrind_control)."""

    def __init__(self, procs):
        self.procs = procs  # [(pid, dump prefix)]
        self.dumps = 0

    def measure(self, run):
        for pid, _ in self.procs:
            subprocess.run(["callgrind_control", "-z", str(pid)], check=True,
                           capture_output=True)
        run()
        self.dumps += 1
        for pid, _ in self.procs:
            subprocess.run(["callgrind_control", "-d", str(pid)], check=True,
                           capture_output=True)
        return [self.total(f"{out}.{self.dumps}") for _, out in self.procs]

    @staticmethod
    def total(path):
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                with open(path) as data:
                    for line in data:
                        if line.startswith(("summary:", "totals:")):
                            if KEEP_DUMPS:
                                print(f"  dump kept: {path}", flush=True)
                            else:
                                os.unlink(path)
                            return int(line.split()[1])
            except FileNotFoundError:
                pass
            time.sleep(0.1)
        raise SystemExit(f"no dump at {path}")


def http_request(pool, body):
    data = json.dumps(body).encode() if body is not None else b""
    head = (f"POST /pools/{pool}/assign HTTP/1.1\r\nhost: x\r\ncontent-length: {len(data)}\r\n"
            + ("content-type: application/json\r\n" if data else "")).encode()
    return head + b"\r\n" + data


def done_of(pool, answer):
    if pool == "lu":
        return {"done": {"proxy": PROXY.search(answer).group(1).decode(), "result": "ok"}}
    return {"done": {"lease": LEASE.search(answer).group(1).decode()}}


def http_runner(sock, pool, with_done):
    state = {"answer": None, "pending": b""}

    def run(n):
        for _ in range(n):
            body = done_of(pool, state["answer"]) if with_done and state["answer"] else None
            sock.sendall(http_request(pool, body))
            head, state["answer"], state["pending"] = bench.read_http(sock, state["pending"])
            assert head.startswith(b"HTTP/1.1 200"), head
    return run


def resp(*parts):
    out = [f"*{len(parts)}\r\n".encode()]
    for part in parts:
        part = part if isinstance(part, bytes) else str(part).encode()
        out.append(f"${len(part)}\r\n".encode() + part + b"\r\n")
    return b"".join(out)


def read_reply(sock, buf):
    """One RESP reply from the socket, `buf` what was read of it so far: (value, rest)."""
    while b"\r\n" not in buf:
        buf += sock.recv(65536)
    line, rest = buf.split(b"\r\n", 1)
    kind, body = line[:1], line[1:]
    if kind == b"-":
        raise SystemExit(f"Redis: {body.decode()}")
    if kind == b"+":
        return body, rest
    if kind == b":":
        return int(body), rest
    if kind == b"$":
        n = int(body)
        if n < 0:
            return None, rest
        while len(rest) < n + 2:
            rest += sock.recv(65536)
        return rest[:n], rest[n + 2:]
    if kind == b"*":
        items = []
        for _ in range(max(int(body), 0)):
            item, rest = read_reply(sock, rest)
            items.append(item)
        return items, rest
    raise SystemExit(f"unexpected reply {line!r}")


def script_runner(sock, shas, pool, with_done):
    """EVALSHA of the script the service would send for this cycle, with its arguments."""
    keys = [f"{bench.PREFIX}:{{{pool}}}:{part}" for part in bench.KEY_PARTS]
    state = {"last": None, "pending": b""}

    def run(n):
        for _ in range(n):
            lease = secrets.token_hex(16)
            args = [lease, "", "16", "16", "2000", "1"]
            sha = shas["assign"]
            if with_done and state["last"]:
                sha = shas["assign_done"]
                member, previous = state["last"]
                done = [member, "ok", ""] if pool == "lu" else ["", "", previous]
                args += done + ["", str(secrets.randbelow(2001) / 1000 - 1),
                                *cycle.BAN_LIMITS]
            sock.sendall(resp("EVALSHA", sha, len(keys), *keys, *args))
            reply, state["pending"] = read_reply(sock, state["pending"])
            pick = reply[7:] if sha == shas.get("assign_done") else reply
            member = pick[1] if pick[0] == 1 else pick[4]
            state["last"] = (member.decode(), lease)
    return run


def seed(base):
    for pool, config in POOLS.items():
        bench.request(base, "PUT", f"/pools/{pool}", config)
        bench.request(base, "POST", f"/pools/{pool}/members",
                      {"members": [f"proxy-{i:03d}" for i in range(100)], "assignments": 0})


def service_env(port, redis_port):
    env = dict(os.environ, ADMIN_TOKEN=bench.TOKEN, LISTEN_ADDR=f"127.0.0.1:{port}",
               LOG_FORMAT="json", RUST_LOG="warn", REDIS_URL=f"redis://127.0.0.1:{redis_port}",
               KEY_PREFIX=bench.PREFIX)
    for name in ["REDIS_CLUSTER_URLS", "REDIS_SENTINEL_URLS"]:
        env.pop(name, None)
    return env


def measure(binary):
    """{cycle label: [service instructions, Redis instructions] per cycle}."""
    redis_port, port = bench.free_port(), bench.free_port()
    # Redis's cron runs ten times a second of wall-clock time, so on a busy machine (where
    # each cycle under callgrind takes longer) more of it would fall between two dumps: at
    # once a second it is a small share of any cycle's count.
    redis, redis_out = under_callgrind(
        ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--hz", "1"])
    proc = None
    results = {}
    try:
        bench.wait_port(redis_port, timeout=120)
        env = service_env(port, redis_port)
        if SCRIPTS_ONLY:
            proc = subprocess.Popen([binary], env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
        else:
            proc, out = under_callgrind([binary], env)
        bench.wait_port(port, timeout=120)
        seed(f"http://127.0.0.1:{port}")
        if SCRIPTS_ONLY:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
            proc = None
            counted = Counted([(redis.pid, redis_out)])
            sock = socket.create_connection(("127.0.0.1", redis_port))
            shas = {}
            for name in ["assign", "assign_done"]:
                sock.sendall(resp("SCRIPT", "LOAD", cycle.script_texts()[name]))
                sha, _ = read_reply(sock, b"")
                shas[name] = sha.decode()
        else:
            counted = Counted([(proc.pid, out), (redis.pid, redis_out)])
            sock = socket.create_connection(("127.0.0.1", port))
        with sock:
            for label, pool, with_done in KINDS:
                run = (script_runner(sock, shas, pool, with_done) if SCRIPTS_ONLY
                       else http_runner(sock, pool, with_done))
                run(WARMUP)
                few = counted.measure(lambda: run(FEW))
                many = counted.measure(lambda: run(MANY))
                per = [(m - f) / (MANY - FEW) for m, f in zip(many, few)]
                results[label] = [0.0, *per] if SCRIPTS_ONLY else per
                print(f"  {label}: " + ", ".join(f"{v:,.0f}" for v in results[label]),
                      flush=True)
    finally:
        if proc:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
        redis.send_signal(signal.SIGTERM)
        redis.wait(timeout=120)
    return results


def main():
    import sys
    measured = []
    for binary in sys.argv[1:]:
        print(binary, flush=True)
        measured.append(measure(binary))
    print("\n| cycle | build | service instructions | Redis instructions | vs first (service, Redis) |")
    print("|---|---|---:|---:|---:|")
    for label, _, _ in KINDS:
        for i, (binary, results) in enumerate(zip(sys.argv[1:], measured)):
            service, redis = results[label]
            first = measured[0][label]
            ratio = ", ".join(f"{a / b:.3f}" if b else "-" for a, b in zip(results[label], first))
            print(f"| {label} | {os.path.basename(binary)} | "
                  f"{service:,.0f} | {redis:,.0f} | {ratio} |")


if __name__ == "__main__":
    main()
