"""One active-check round of 1,000 members through a local HTTP proxy to a local HTTPS
target, timed; and the same round when the proxy never answers, which shows the bound.

    cargo build --release
    python3 bench/check_round.py            # MEMBERS=1000 ROUNDS=3 CONCURRENCY=32 TIMEOUT_MS=200

It starts, on free loopback ports: an HTTPS target (a certificate from a test CA made with
the openssl command, the CA trusted through `check.ca_pem`), an HTTP proxy that tunnels CONNECT to it
(or, in the "hung" runs, accepts and never answers), and the release binary (embedded
store). The members are MEMBERS distinct ids of that one proxy (`http://m<i>:x@host:port`,
credentials the proxy ignores). Each run creates a pool, seeds the members, turns on an
`http` check of `https://127.0.0.1:<port>/`, and measures the round from the members'
`last_check` times (first probe's start to last result). Healthy and hung runs alternate, so a busy moment on this shared
machine slows both alike.

A round is bounded by `ceil(MEMBERS / CONCURRENCY) * TIMEOUT_MS` when every probe times out;
the hung runs print that bound beside the measured time.
"""

import asyncio
import calendar
import json
import math
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Dict, List, Tuple

# The Python client's test harness starts the service; it needs the client itself, which
# this script takes from the source tree (no install needed).
for part in ("tests", "src"):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                    "clients", "python", part))

from harness import ADMIN, Service  # noqa: E402

MEMBERS = int(os.environ.get("MEMBERS", "1000"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
CONCURRENCY = int(os.environ.get("CONCURRENCY", "32"))
TIMEOUT_MS = int(os.environ.get("TIMEOUT_MS", "200"))
# The healthy rounds' probe timeout: long enough that no answer is cut off on a loaded machine.
HEALTHY_TIMEOUT_MS = 5000


def certificate(directory: str) -> Tuple[str, str, str]:
    """A test CA and a server certificate for 127.0.0.1 it signed, with the server's key, as
    file paths (CA, certificate, key). The checks' TLS (rustls) refuses a self-signed CA
    certificate used as the server's own."""
    path = lambda name: os.path.join(directory, name)  # noqa: E731
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    with open(path("ext"), "w") as handle:
        handle.write("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                     "extendedKeyUsage=serverAuth\n")
    for command in (
            ["openssl", "req", "-x509", *ec, "-days", "1", "-subj", "/CN=bench CA",
             "-keyout", path("ca.key"), "-out", path("ca.pem")],
            ["openssl", "req", *ec, "-subj", "/CN=127.0.0.1", "-keyout", path("key.pem"),
             "-out", path("server.csr")],
            ["openssl", "x509", "-req", "-in", path("server.csr"), "-CA", path("ca.pem"),
             "-CAkey", path("ca.key"), "-CAcreateserial", "-days", "1", "-extfile",
             path("ext"), "-out", path("cert.pem")]):
        subprocess.run(command, check=True, capture_output=True)
    return path("ca.pem"), path("cert.pem"), path("key.pem")


class Servers:
    """The target and the proxy, on one asyncio loop in a thread of their own."""

    def __init__(self, cert: str, key: str) -> None:
        self.hang = False
        self.loop = asyncio.new_event_loop()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        ready = threading.Event()
        ports: List[int] = []

        async def start() -> None:
            target = await asyncio.start_server(self.answer, "127.0.0.1", 0, ssl=context,
                                                backlog=1024)
            proxy = await asyncio.start_server(self.tunnel, "127.0.0.1", 0, backlog=1024)
            ports.extend([target.sockets[0].getsockname()[1],
                          proxy.sockets[0].getsockname()[1]])
            ready.set()

        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(start(), self.loop)
        ready.wait(10)
        self.target_port, self.proxy_port = ports

    async def answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def tunnel(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if self.hang:
                await asyncio.sleep(3600)
                return
            host, port = head.split(b" ")[1].decode().rsplit(":", 1)
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")

            async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
                try:
                    while chunk := await src.read(65536):
                        dst.write(chunk)
                        await dst.drain()
                finally:
                    dst.close()

            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


def call(base: str, method: str, route: str, body: object = None) -> Dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + route, data=data, method=method, headers={
        "Authorization": "Bearer " + ADMIN, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read()
    return json.loads(text) if text else {}


def parse_ms(at: str) -> float:
    """Milliseconds since the epoch of an RFC 3339 UTC time with milliseconds."""
    seconds, _, fraction = at.rstrip("Z").partition(".")
    whole = calendar.timegm(time.strptime(seconds, "%Y-%m-%dT%H:%M:%S"))
    return whole * 1000 + float("0." + (fraction or "0")) * 1000


def one_round(base: str, servers: Servers, pem: str, pool: str,
              hang: bool) -> Tuple[float, Dict[str, int], List[int], List[str]]:
    """Seconds the round took, and its result counts. The round starts up to CHECK_TICK_MS
    after the check is turned on, so its start is taken from the results: the earliest
    result's time less that probe's own duration (its latency, or the timeout)."""
    servers.hang = hang
    rules = {"allow_private": True}
    call(base, "PUT", "/pools/" + pool, {"rules": rules})
    members = ["http://m{}:x@127.0.0.1:{}".format(i, servers.proxy_port) for i in range(MEMBERS)]
    call(base, "POST", "/pools/{}/members".format(pool), {"members": members})
    check = {"kind": "http", "url": "https://127.0.0.1:{}/".format(servers.target_port),
             "ca_pem": pem, "interval_ms": 600000,
             "timeout_ms": TIMEOUT_MS if hang else HEALTHY_TIMEOUT_MS,
             "concurrency": CONCURRENCY}
    call(base, "PUT", "/pools/" + pool, {"rules": rules, "health": {
        "max_consecutive_failures": 1000, "check": check}})
    while True:
        listed = call(base, "GET", "/pools/{}/members?limit=1000".format(pool))["members"]
        checks = [m["last_check"] for m in listed if "last_check" in m]
        if len(checks) == MEMBERS:
            break
        time.sleep(0.05)
    results: Dict[str, int] = {}
    for check in checks:
        results[check["result"]] = results.get(check["result"], 0) + 1
    last = max(parse_ms(c["at"]) for c in checks)
    started = min(parse_ms(c["at"]) - c.get("latency_ms", TIMEOUT_MS) for c in checks)
    latencies = sorted(c["latency_ms"] for c in checks if "latency_ms" in c)
    call(base, "DELETE", "/pools/" + pool)
    details = sorted({c["detail"] for c in checks})
    return (last - started) / 1000, results, latencies, details


def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        ca, cert, key = certificate(directory)
        with open(ca) as handle:
            pem = handle.read()
        servers = Servers(cert, key)
        service = Service()
        try:
            healthy: List[float] = []
            hung: List[float] = []
            p50: List[int] = []
            for i in range(ROUNDS):
                seconds, results, latencies, details = one_round(
                    service.base, servers, pem, "ok{}".format(i), False)
                assert results == {"ok": MEMBERS}, (results, details)
                healthy.append(seconds)
                p50.append(latencies[len(latencies) // 2])
                seconds, results, _, details = one_round(
                    service.base, servers, pem, "hung{}".format(i), True)
                assert results == {"failed": MEMBERS} and details == ["timeout"], (results, details)
                hung.append(seconds)
        finally:
            service.stop()
    bound = math.ceil(MEMBERS / CONCURRENCY) * TIMEOUT_MS / 1000
    print("{} members, concurrency {}, timeout {} ms (hung) / {} ms (healthy), "
          "{} rounds each, alternating".format(MEMBERS, CONCURRENCY, TIMEOUT_MS,
                                               HEALTHY_TIMEOUT_MS, ROUNDS))
    print("healthy proxy: median {:.2f} s (range {:.2f}-{:.2f}), all ok, "
          "median probe latency {} ms".format(statistics.median(healthy), min(healthy),
                                             max(healthy), statistics.median(p50)))
    print("hung proxy:    median {:.2f} s (range {:.2f}-{:.2f}), all failed; "
          "bound ceil({}/{}) x {} ms = {:.2f} s".format(
              statistics.median(hung), min(hung), max(hung), MEMBERS, CONCURRENCY, TIMEOUT_MS,
              bound))


if __name__ == "__main__":
    main()
