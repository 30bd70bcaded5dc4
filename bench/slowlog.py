"""How long each large operation holds Redis (driven by bench/slowlog.sh).

Starts its own redis-server with `slowlog-log-slower-than 1000` (every command or script
call slower than 1 ms is logged) and the service on it, builds a 1,000,000-member pool by
importing a 1,000,000-line list, then runs every large operation on that pool: seeding,
disabling, enabling and removing 10,000 members per call, listing pages deep in the pool,
reading the pool's numbers, the sweep of 10,000 expired leases, and the deletion of the
pool with a few more large ones. For each it prints the longest command Redis ran meanwhile (from `SLOWLOG`), and the
assign p99 (and max) on another, 100-member pool measured by wrk while the operation ran,
next to that p99 in a window of the same length just before, when nothing else runs.
Quick operations are repeated for the length of the window so that the p99 is taken while
they run; the import runs once. Only the operation's own calls count for its longest call:
the other pool's assigns are left out.

The sweep's row is of the service's own background sweep: the driver finds when a sweep has
just run (a lease of 100 ms on a pool of its own reclaimed), gives the 10,000 leases right
after, and opens the window just before the next sweep, which then finds all of them
expired (none reclaimed by an earlier sweep). The deletion's row deletes the 1,000,000-member
pool and then `DOOMED` more pools of a quarter of that size each (default 3, built before
its idle window), each one once Redis has freed the one before on its background thread
(`lazyfree_pending_objects` back to 0): one deletion's window is a few milliseconds, too
few assigns for a p99.

SLOWLOG counts wall time, so a script that the kernel preempted (on two cores shared by
Redis, the service, wrk and whatever else the machine runs) is logged for as long as it
waited. With `PIN=1` Redis runs on a core of its own, the last one, and this driver, the
service and wrk on the others (`taskset`, `sched_setaffinity`): nothing this benchmark
starts then takes Redis's core. Other processes of the machine still may, and then Redis
cannot move to the other core: on the shared development machine Redis waited for a core
about three times as long pinned as not (12.1 s against 4.4 s during the import), so the
default is `PIN=0`, everything anywhere; pin on a machine nothing else uses. For each
operation it also prints how long Redis ran on a core meanwhile and how long it was
runnable but waited for one (`/proc/<pid>/schedstat`): the share of the logged time that
was the machine's, not the script's.

A measurement, not a test: nothing passes or fails on a number.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

BIN = os.environ.get("BIN", "target/release/proxy-allocator")
TOKEN = "bench-admin-token"
MEMBERS = int(os.environ.get("MEMBERS", "1000000"))
CALL = 10_000
LEASES = 10_000
WINDOW = float(os.environ.get("WINDOW", "3"))
CONNECTIONS = 16
LEASE_TTL_MS = 5_000
SWEEP_INTERVAL_MS = 12_000
DOOMED = int(os.environ.get("DOOMED", "3"))
PIN = os.environ.get("PIN", "0") == "1" and (os.cpu_count() or 1) >= 2


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(check, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.05)
    sys.exit(f"gave up waiting for {what}")


class Redis:
    """Just enough RESP to read SLOWLOG and send a few commands."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.file = self.sock.makefile("rb")

    def call(self, *args):
        out = b"*%d\r\n" % len(args)
        for arg in args:
            arg = str(arg).encode()
            out += b"$%d\r\n%s\r\n" % (len(arg), arg)
        self.sock.sendall(out)
        return self.read()

    def read(self):
        line = self.file.readline()[:-2]
        kind, rest = line[:1], line[1:]
        if kind in (b"+", b"-"):
            return rest.decode()
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.file.read(n + 2)[:-2]
            return data.decode(errors="replace")
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise ValueError(f"unexpected reply {line!r}")


def request(base, method, path, body=None, content_type="application/json"):
    data = None
    headers = {"Authorization": f"Bearer {TOKEN}"}
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers["content-type"] = content_type
    req = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=600) as response:
            text = response.read()
            return response.status, (json.loads(text) if text else None)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


def checked(base, method, path, body=None, content_type="application/json"):
    status, answer = request(base, method, path, body, content_type)
    if status >= 300:
        sys.exit(f"{method} {path}: {status} {answer}")
    return answer


class Wrk:
    """wrk on the other pool's assign, from start() until stop() (wrk prints its summary on
    SIGINT)."""

    def __init__(self, url):
        self.url = url
        self.script = tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False)
        self.script.write('wrk.method = "POST"\n')
        self.script.close()
        self.process = None

    def start(self):
        self.process = subprocess.Popen(
            ["wrk", "-t1", f"-c{CONNECTIONS}", "-d600s", "--latency", "-s", self.script.name, self.url],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        # wrk connects and starts timing at once; give it a moment so that the window holds
        # the operation rather than wrk's start.
        time.sleep(0.2)

    def stop(self):
        self.process.send_signal(signal.SIGINT)
        out, _ = self.process.communicate(timeout=30)
        p99 = maximum = None
        for line in out.splitlines():
            parts = line.split()
            if parts[:1] == ["99%"]:
                p99 = to_ms(parts[1])
            if parts[:1] == ["Latency"] and len(parts) >= 4:
                maximum = to_ms(parts[3])
        if p99 is None:
            sys.exit(f"wrk printed no latency:\n{out}")
        return p99, maximum


def to_ms(text):
    for unit, factor in (("us", 0.001), ("ms", 1.0), ("s", 1000.0)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * factor
    raise ValueError(text)


def schedstat(pid):
    """Seconds the process has run on a core, and seconds it waited runnable for one
    (`/proc/<pid>/schedstat`)."""
    with open(f"/proc/{pid}/schedstat") as stat:
        ran, waited = stat.read().split()[:2]
    return int(ran) / 1e9, int(waited) / 1e9


def measure(redis, wrk, name, operation):
    """Runs `operation` with wrk on the other pool, right after a window of wrk alone (the
    machine's noise moves the idle p99 from one minute to the next, so each operation is
    compared with its neighbour); returns the row for `name`."""
    idle = window(redis, wrk, lambda: time.sleep(WINDOW))[-2]  # its p99
    return (name, *window(redis, wrk, operation), idle)


def window(redis, wrk, operation):
    """What Redis logged and what wrk measured while `operation` ran."""
    redis.call("SLOWLOG", "RESET")
    wrk.start()
    started = time.monotonic()
    ran_before, waited_before = schedstat(redis.pid)
    operation()
    seconds = time.monotonic() - started
    ran_after, waited_after = schedstat(redis.pid)
    p99, maximum = wrk.stop()
    entries = redis.call("SLOWLOG", "GET", "-1")
    # Only the calls of the operation: the other pool's assigns run meanwhile and, on a busy
    # machine, are sometimes logged too.
    own = [entry for entry in entries
           if entry[3][0].lower() not in ("slowlog", "info")
           and not any("{other}" in arg for arg in entry[3])]
    longest, command = 0.0, "-"
    for entry in own:
        micros, args = entry[2], entry[3]
        if micros / 1000 > longest:
            longest, command = micros / 1000, args[0].lower()
    over_5 = sum(1 for entry in own if entry[2] > 5000)
    return (longest, command, len(own), over_5, seconds, ran_after - ran_before,
            waited_after - waited_before, p99, maximum)


def repeat(window, step):
    """Calls step(i) for i = 0, 1, ... until `window` seconds have passed (at least once)."""

    def run():
        deadline = time.monotonic() + window
        i = 0
        while True:
            step(i)
            i += 1
            if time.monotonic() >= deadline:
                break

    return run


def address(i, first=11):
    """The i-th of a family of distinct public addresses (the family is the first octet)."""
    return f"{first}.{i // 62500}.{i // 250 % 250}.{i % 250 + 1}:8080"


def member(i):
    return "http://" + address(i)


def sweep_ran(base):
    """When the service's background sweep has just run: the moment it reclaims a lease of
    100 ms on a pool of its own (nothing else assigns from it, so only a sweep does)."""
    checked(base, "PUT", "/pools/tick", {"policy": "least-in-flight", "lease_ttl_ms": 100})
    checked(base, "POST", "/pools/tick/members", {"members": [address(0, first=160)]})
    checked(base, "POST", "/pools/tick/assign")
    deadline = time.monotonic() + SWEEP_INTERVAL_MS / 1000 * 2
    while checked(base, "GET", "/pools/tick")["stats"]["in_flight"]:
        if time.monotonic() > deadline:
            sys.exit("no sweep reclaimed the tick pool's lease")
        time.sleep(0.01)
    return time.monotonic()


def give_leases(port):
    """LEASES leases of the leased pool, through one keep-alive connection."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        one = b"POST /pools/leased/assign HTTP/1.1\r\nhost: bench\r\ncontent-length: 0\r\n\r\n"
        file = sock.makefile("rb")
        for _ in range(LEASES // 100):
            sock.sendall(one * 100)
            for _ in range(100):
                length = 0
                while (line := file.readline()) not in (b"\r\n", b""):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                file.read(length)


def lazyfree_pending(redis):
    """How many unlinked values Redis's background thread has yet to free."""
    for line in redis.call("INFO", "memory").splitlines():
        if line.startswith("lazyfree_pending_objects:"):
            return int(line.split(":")[1])
    sys.exit("INFO memory has no lazyfree_pending_objects")


def main():
    work = tempfile.mkdtemp(prefix="slowlog-")
    redis_port, app_port = free_port(), free_port()
    processes = []
    pinned = []
    if PIN:
        redis_core = (os.cpu_count() or 2) - 1
        # This driver first: the service and wrk inherit its cores.
        os.sched_setaffinity(0, set(range(redis_core)))
        pinned = ["taskset", "-c", str(redis_core)]
    load_before = open("/proc/loadavg").read().split()[0]
    try:
        processes.append(subprocess.Popen(
            pinned + ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", work, "--slowlog-log-slower-than", "1000",
             "--slowlog-max-len", "100000"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_for(lambda: Redis(redis_port).call("PING") == "PONG", "redis-server")
        redis = Redis(redis_port)
        redis.pid = processes[0].pid
        env = dict(os.environ, REDIS_URL=f"redis://127.0.0.1:{redis_port}",
                   LISTEN_ADDR=f"127.0.0.1:{app_port}", ADMIN_TOKEN=TOKEN, RUST_LOG="warn",
                   LOG_FORMAT="json", SWEEP_INTERVAL_MS=str(SWEEP_INTERVAL_MS),
                   STORE_TIMEOUT_MS="10000")
        processes.append(subprocess.Popen([BIN], env=env, stdout=subprocess.DEVNULL,
                                          stderr=open(os.path.join(work, "app.log"), "w")))
        base = f"http://127.0.0.1:{app_port}"
        wait_for(lambda: urllib.request.urlopen(base + "/readyz", timeout=1).status == 200,
                 "the service")

        checked(base, "PUT", "/pools/other", {})
        checked(base, "POST", "/pools/other/members",
                {"members": [address(i, first=120) for i in range(100)]})
        checked(base, "PUT", "/pools/big", {})
        checked(base, "PUT", "/pools/leased",
                {"policy": "least-in-flight", "lease_ttl_ms": LEASE_TTL_MS})
        checked(base, "POST", "/pools/leased/members",
                {"members": [address(i, first=130) for i in range(LEASES)]})
        wrk = Wrk(f"{base}/pools/other/assign")
        rows = []

        lines = "".join(address(i) + "\n" for i in range(MEMBERS)).encode()

        def imported():
            report = checked(base, "POST", "/pools/big/import", lines, "text/plain")
            assert report["added"] == MEMBERS, report

        rows.append(measure(redis, wrk, f"import of {MEMBERS:,} lines", imported))
        del lines

        rows.append(measure(redis, wrk, "pool info", repeat(WINDOW, lambda i: checked(
            base, "GET", "/pools/big"))))

        def page(i):
            offset = (i * 7919 * 1000) % max(MEMBERS - 1000, 1)
            checked(base, "GET", f"/pools/big/members?limit=1000&cursor={offset}.0")

        rows.append(measure(redis, wrk, "listing (pages of 1,000)", repeat(WINDOW, page)))

        def seed(i):
            members = [address(i * CALL + j, first=140) for j in range(CALL)]
            answer = checked(base, "POST", "/pools/big/members", {"members": members})
            assert len(answer["added"]) == CALL, len(answer["added"])

        rows.append(measure(redis, wrk, f"seed {CALL:,} new members", repeat(WINDOW, seed)))

        calls = {}

        def named(i):
            return [member(i * CALL + j) for j in range(CALL)]

        sets = MEMBERS // CALL

        def disable(i):
            answer = checked(base, "POST", "/pools/big/members/disable",
                             {"members": named(i % sets)})
            assert len(answer["disabled"]) + len(answer["already_ineligible"]) == CALL
            calls["disabled"] = min(i + 1, sets)

        rows.append(measure(redis, wrk, f"disable {CALL:,} members", repeat(WINDOW, disable)))

        def enable(i):
            answer = checked(base, "POST", "/pools/big/members/enable",
                             {"members": named(i % calls["disabled"])})
            assert len(answer["enabled"]) + len(answer["already_eligible"]) == CALL

        rows.append(measure(redis, wrk, f"enable {CALL:,} members", repeat(WINDOW, enable)))

        def remove(i):
            answer = checked(base, "POST", "/pools/big/members/remove",
                             {"members": named(sets - 1 - i % sets)})
            assert len(answer["removed"]) + len(answer["unknown"]) == CALL

        rows.append(measure(redis, wrk, f"remove {CALL:,} members", repeat(WINDOW, remove)))

        # The sweep's row: 10,000 leases given right after a sweep has run, all expired
        # before the next one, whose work the window holds.
        ran_at = sweep_ran(base)
        give_leases(app_port)
        gave = time.monotonic() - ran_at
        if gave + LEASE_TTL_MS / 1000 > SWEEP_INTERVAL_MS / 1000 - WINDOW - 1.5:
            print(f"warning: giving the leases took {gave:.1f} s, so some had not expired "
                  "when the window opened", file=sys.stderr)
        # The idle window ends just before the next sweep.
        time.sleep(max(0.0, ran_at + SWEEP_INTERVAL_MS / 1000 - WINDOW - 1.0 - time.monotonic()))
        expired = checked(base, "GET", "/pools/leased")["stats"]["in_flight"]

        def swept():
            wait_for(lambda: checked(base, "GET", "/pools/leased")["stats"]["in_flight"] == 0,
                     "the sweep", timeout=SWEEP_INTERVAL_MS / 1000 * 2)

        rows.append(measure(redis, wrk, f"sweep of {expired:,} expired leases", swept))

        doomed = [f"doomed-{i}" for i in range(DOOMED)]
        for i, pool in enumerate(doomed):
            checked(base, "PUT", f"/pools/{pool}", {})
            lines = "".join(address(j, first=150 + i) + "\n"
                            for j in range(MEMBERS // 4)).encode()
            checked(base, "POST", f"/pools/{pool}/import", lines, "text/plain")
            del lines

        def deleted():
            for pool in ["big", *doomed]:
                checked(base, "DELETE", f"/pools/{pool}")
                # Redis frees unlinked keys on a thread of its own; the pool is gone once
                # it has.
                wait_for(lambda: lazyfree_pending(redis) == 0, "the pool's keys to go",
                         timeout=120)

        name = f"delete the {MEMBERS:,}-member pool"
        if doomed:
            name += f" and {len(doomed)} of {MEMBERS // 4:,}"
        rows.append(measure(redis, wrk, name, deleted))
        assert not redis.call("KEYS", "*{big}*") and not redis.call("KEYS", "*{doomed-*")

        placement = (f"Redis pinned to core {redis_core}, the rest to the others" if PIN
                     else "nothing pinned")
        print(f"{os.cpu_count()} cores, load average {load_before} at the start and "
              f"{open('/proc/loadavg').read().split()[0]} at the end; {placement}; "
              f"wrk -t1 -c{CONNECTIONS} on a 100-member pool")
        print()
        print("| operation | its longest Redis call | its calls > 1 ms | > 5 ms | took | "
              "Redis ran | Redis waited for a core | assign p99 on another pool | its max | "
              "p99 idle just before | p99 ÷ idle |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for (name, longest, command, slow, over_5, seconds, ran, waited, p99, maximum,
             idle) in rows:
            longest_text = f"{longest:.1f} ms ({command})" if slow else "< 1 ms"
            print(f"| {name} | {longest_text} | {slow} | {over_5} | {seconds:.2f} s | "
                  f"{ran:.2f} s | {waited:.2f} s | {p99:.2f} ms | {maximum:.1f} ms | "
                  f"{idle:.2f} ms | {p99 / idle:.2f} |")
    finally:
        for process in reversed(processes):
            process.terminate()
            process.wait()


if __name__ == "__main__":
    main()
