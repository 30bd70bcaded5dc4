"""User-space instructions the gateway spends per tunnel, and per MiB relayed, counted by
valgrind's callgrind for one or more builds of the service: a per-tunnel cost that
repeats to within a fraction of a percent however busy the machine is, where tunnels per
second on two shared cores do not.

    python3 bench/gateway_instructions.py BINARY [BINARY ...]

Each binary runs on the embedded store under callgrind with both gateway ports and a
least-used pool of two local upstream proxies (bench/tunnels serve, as bench/gateway.sh
uses them, outside callgrind). bench/tunnels opens exactly FEW and then MANY tunnels
(CONCURRENCY at a time; each a CONNECT or a SOCKS5 handshake, one request to the target,
its answer, close) through the HTTP port and then through the SOCKS5 port, and streams
BYTES over one tunnel; callgrind's counters are zeroed before and dumped after each step,
so that the difference of the two tunnel counts divided by MANY - FEW is one tunnel's
cost, start-up, warm-up and shutdown excluded.

    KEEP=dir python3 bench/gateway_instructions.py BINARY

keeps the MANY dumps (dir/http.callgrind, dir/socks5.callgrind, dir/bytes.callgrind) for
callgrind_annotate --inclusive=yes, which says where a tunnel's instructions go.
Build bench/tunnels first (bench/gateway.sh does):
cargo build --release --manifest-path bench/tunnels/Cargo.toml --target-dir target/bench-tunnels
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import assign as bench

FEW, MANY = int(os.environ.get("FEW", "500")), int(os.environ.get("MANY", "2500"))
CONCURRENCY = os.environ.get("CONCURRENCY", "8")
BYTES = int(os.environ.get("BYTES", str(256 << 20)))
TUNNELS_BIN = os.environ.get("TUNNELS_BIN", "target/bench-tunnels/release/tunnels")
PASSWORD = "bench-worker-token"
KEEP = os.environ.get("KEEP")


def tunnels(*args):
    subprocess.run([TUNNELS_BIN, *args], check=True, stdout=subprocess.DEVNULL)


class Callgrind:
    """A process under callgrind whose counters can be zeroed and dumped while it runs."""

    def __init__(self, command, env):
        self.dir = tempfile.mkdtemp(prefix="gateway-callgrind-")
        self.out = os.path.join(self.dir, "out")
        self.proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={self.out}", *command],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.dumps = 0

    def control(self, option):
        subprocess.run(["callgrind_control", option, str(self.proc.pid)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def measure(self, work, keep_as=None):
        """Instructions the process ran while `work()` ran."""
        self.control("-z")
        work()
        self.control("-d")
        self.dumps += 1
        # callgrind names the n-th dump out.n.
        dump = f"{self.out}.{self.dumps}"
        for _ in range(600):
            if os.path.exists(dump):
                break
            time.sleep(0.1)
        with open(dump) as data:
            counted = next(int(line.split()[1]) for line in data
                           if line.startswith(("summary:", "totals:")))
        if keep_as and KEEP:
            os.makedirs(KEEP, exist_ok=True)
            shutil.copy(dump, os.path.join(KEEP, f"{keep_as}.callgrind"))
        return counted

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)
        shutil.rmtree(self.dir, ignore_errors=True)


def measure(binary):
    target, up1, up2 = bench.free_port(), bench.free_port(), bench.free_port()
    servers = [
        subprocess.Popen([TUNNELS_BIN, "serve", "--target", f"127.0.0.1:{target}"],
                         stdout=subprocess.DEVNULL),
        subprocess.Popen([TUNNELS_BIN, "serve", "--upstreams", f"127.0.0.1:{up1},127.0.0.1:{up2}"],
                         stdout=subprocess.DEVNULL),
    ]
    api, http, socks = bench.free_port(), bench.free_port(), bench.free_port()
    # The background tasks an hour apart, so that the counts are the tunnels' alone however
    # long callgrind takes.
    env = dict(os.environ, ADMIN_TOKEN=bench.TOKEN, WORKER_TOKEN=PASSWORD,
               LISTEN_ADDR=f"127.0.0.1:{api}", GATEWAY_LISTEN=f"127.0.0.1:{http}",
               GATEWAY_SOCKS_LISTEN=f"127.0.0.1:{socks}", LOG_FORMAT="json", RUST_LOG="warn",
               STORE_TIMEOUT_MS="60000", SWEEP_INTERVAL_MS="3600000",
               CHECK_TICK_MS="3600000", METRICS_REFRESH_MS="3600000",
               GATEWAY_CONNECT_TIMEOUT_MS="60000")
    for name in ["REDIS_URL", "REDIS_CLUSTER_URLS", "REDIS_SENTINEL_URLS"]:
        env.pop(name, None)
    service = Callgrind([binary], env)
    try:
        for port in (target, up1, up2):
            bench.wait_port(port, timeout=30)
        for port in (api, http, socks):
            bench.wait_port(port, timeout=120)
        base = f"http://127.0.0.1:{api}"
        bench.request(base, "PUT", "/pools/bench", {"rules": {"allow_private": True}})
        bench.request(base, "POST", "/pools/bench/members",
                      {"members": [f"http://127.0.0.1:{up1}", f"http://127.0.0.1:{up2}"]})
        to = ["--to", f"127.0.0.1:{target}", "--user", "bench", "--password", PASSWORD]
        results = {}
        for name, via, socks_flag in [("http", http, []), ("socks5", socks, ["--socks"])]:
            def rate(count, via=via, socks_flag=socks_flag):
                return lambda: tunnels("rate", "--via", f"127.0.0.1:{via}", *to, *socks_flag,
                                       "--concurrency", CONCURRENCY, "--count", str(count))
            service.measure(rate(200))  # warm-up: buffers, tables, the route cache
            few = service.measure(rate(FEW))
            many = service.measure(rate(MANY), keep_as=name)
            results[name] = (many - few) / (MANY - FEW)
        # One tunnel of BYTES, less one of none: what relaying costs per MiB.
        stream = service.measure(lambda: tunnels("bytes", "--via", f"127.0.0.1:{http}", *to,
                                                 "--bytes", str(BYTES)), keep_as="bytes")
        results["per_mib"] = (stream - results["http"]) / (BYTES / (1 << 20))
        return results
    finally:
        service.stop()
        for server in servers:
            server.kill()
            server.wait()


def main():
    rows = []
    for binary in sys.argv[1:]:
        results = measure(binary)
        rows.append(results)
        print(f"{results['http']:10,.0f} instructions per HTTP CONNECT tunnel, "
              f"{results['socks5']:10,.0f} per SOCKS5 tunnel, "
              f"{results['per_mib']:10,.0f} per MiB relayed  {binary}", flush=True)
    for row in rows[1:]:
        print("ratio to the first: "
              + ", ".join(f"{key} {row[key] / rows[0][key]:.4f}" for key in row))


if __name__ == "__main__":
    main()
