"""Test harness: the real service binary and a real redis-server, each on a free loopback port.

The binary is ``PROXY_ALLOCATOR_BIN`` or, by default, ``target/release/proxy-allocator`` of
this repository (``cargo build --release``).
"""

import json
import os
import re
import secrets
import socket
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Optional

from proxy_allocator import Client

#: The admin token every test service is started with.
ADMIN = "test-admin-token"
#: The worker token every test service is started with.
WORKER = "test-worker-token"

REPOSITORY = Path(__file__).resolve().parents[3]

#: One series of ``pa_http_requests_total``: its labels and its count.
_REQUESTS = re.compile(r'^pa_http_requests_total\{(?P<labels>.*)\} (?P<count>\S+)$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def binary() -> str:
    """The service binary under test; a missing one fails loudly, never skips."""
    path = os.environ.get("PROXY_ALLOCATOR_BIN",
                          str(REPOSITORY / "target" / "release" / "proxy-allocator"))
    if not os.access(path, os.X_OK):
        raise RuntimeError("no service binary at {} (run `cargo build --release` or set "
                           "PROXY_ALLOCATOR_BIN)".format(path))
    return path


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class RedisServer:
    """A throw-away redis-server that keeps nothing on disk."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = "redis://127.0.0.1:{}".format(self.port)
        self._process: Optional["subprocess.Popen[bytes]"] = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError("redis-server on port {} did not answer PING".format(self.port))

    def stop(self) -> None:
        """Kills the process, as a crash would."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None


class Service:
    """The service binary on a free port, with the test tokens (``worker_token=None``
    leaves worker routes open; ``admin_token`` for an example that names its own) and a fast
    background sweep."""

    def __init__(self, redis_url: Optional[str] = None,
                 worker_token: Optional[str] = WORKER, admin_token: str = ADMIN) -> None:
        self.admin_token = admin_token
        env = {
            "PATH": os.environ.get("PATH", ""),
            "LISTEN_ADDR": "127.0.0.1:0",
            "ADMIN_TOKEN": admin_token,
            "KEY_PREFIX": "py" + secrets.token_hex(6),
            "SWEEP_INTERVAL_MS": "100",
            "STORE_TIMEOUT_MS": "500",
            "LOG_FORMAT": "json",
            "RUST_LOG": "warn,proxy_allocator::startup=info",
        }
        if worker_token is not None:
            env["WORKER_TOKEN"] = worker_token
        if redis_url is not None:
            env["REDIS_URL"] = redis_url
        self._process = subprocess.Popen([binary()], env=env, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL)
        found = threading.Event()
        addr: List[str] = []

        def drain() -> None:
            # Reads the bound address from the "listening" line, then keeps the pipe empty
            # so that logging never blocks the service.
            assert self._process.stdout is not None
            for line in self._process.stdout:
                if not found.is_set() and b'"listening"' in line:
                    addr.append(json.loads(line)["addr"])
                    found.set()

        threading.Thread(target=drain, daemon=True).start()
        if not found.wait(10):
            self.stop()
            raise RuntimeError("the service did not log its address within 10 s")
        self.base = "http://{}".format(addr[0])

    def stop(self) -> None:
        """Stops the process."""
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait()

    def client(self, token: Optional[str] = WORKER, timeout: float = 5.0,
               **options: Any) -> Client:
        """A client of this service (the worker token by default) with ``options``
        (``carry_done``, ``done_delay``)."""
        return Client(self.base, token=token, timeout=timeout, **options)

    def requests(self) -> "Counter[str]":
        """The POST requests the service answered so far, by route template (its
        ``pa_http_requests_total``, all statuses)."""
        with urllib.request.urlopen(self.base + "/metrics", timeout=5) as answer:
            text = answer.read().decode("utf-8")
        counts: "Counter[str]" = Counter()
        for line in text.splitlines():
            found = _REQUESTS.match(line)
            if found is None:
                continue
            labels = dict(_LABEL.findall(found.group("labels")))
            if labels.get("method") == "POST":
                counts[labels["route"]] += int(float(found.group("count")))
        return counts

    def wait_until(self, condition: Any, what: str, within: float = 5.0) -> float:
        """Waits for ``condition()`` to hold, checking every 10 ms; the seconds it took.
        Raises AssertionError after ``within`` seconds."""
        start = time.monotonic()
        while not condition():
            if time.monotonic() - start > within:
                raise AssertionError("{} within {} s".format(what, within))
            time.sleep(0.01)
        return time.monotonic() - start

    def admin(self, method: str, path: str, body: Optional[Any] = None) -> Optional[Dict[str, Any]]:
        """An admin call; the answer's JSON body."""
        return self.client(self.admin_token)._call(method, path, body)[1]

    def create_pool(self, config: Optional[Dict[str, Any]] = None) -> str:
        """A new pool with a random id and ``config``; its id."""
        pool = "py-" + secrets.token_hex(4)
        self.admin("PUT", "/pools/" + pool, config or {})
        return pool

    def seed(self, pool: str, members: List[Any]) -> None:
        """Adds members to a pool: ids, or ``{"member", "labels"}`` objects."""
        self.admin("POST", "/pools/{}/members".format(pool), {"members": members})

    def stats(self, pool: str) -> Dict[str, Any]:
        """The pool's numbers."""
        info = self.admin("GET", "/pools/" + pool)
        assert info is not None
        return dict(info["stats"])


class Demo:
    """``proxy-allocator demo`` as the book's "Try it without proxies" starts it, on free
    ports (``--listen`` and ``--gateway-listen`` port 0), and what it printed: ``api`` (the
    base URL the assign line names), ``site`` (the local page the gateway line fetches),
    ``admin_token`` (the dashboard line's), ``gateway`` (its proxy URL)."""

    def __init__(self) -> None:
        env = {"PATH": os.environ.get("PATH", ""), "LOG_FORMAT": "json", "RUST_LOG": "warn"}
        self._process = subprocess.Popen(
            [binary(), "demo", "--listen", "127.0.0.1:0", "--gateway-listen", "127.0.0.1:0"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        printed: List[str] = []
        done = threading.Event()

        def drain() -> None:
            # The demo's own lines are text, its log lines JSON; keeps the pipe empty after.
            assert self._process.stdout is not None
            for raw in self._process.stdout:
                line = raw.decode("utf-8").rstrip("\n")
                if not done.is_set() and not line.startswith("{"):
                    printed.append(line)
                    if line.startswith("Stop it"):
                        done.set()

        threading.Thread(target=drain, daemon=True).start()
        if not done.wait(10):
            self.stop()
            raise RuntimeError("the demo did not print its lines within 10 s: {}".format(printed))
        #: The printed lines by their label (``proxies``, ``dashboard``, ``assign`` ...).
        self.lines = dict((label, text.strip()) for label, text in
                          (line.split(":", 1) for line in printed[1:-1]))
        self.api = self.lines["assign"].split(" ")[-1].split("/pools/")[0]
        gateway = re.fullmatch(r"curl -x (\S+) (\S+)", self.lines["gateway"])
        dashboard = re.search(r"\(admin token: (\w+)\)", self.lines["dashboard"])
        if gateway is None or dashboard is None:
            self.stop()
            raise RuntimeError("unexpected demo lines: {}".format(printed))
        self.gateway, self.site = gateway.group(1), gateway.group(2)
        self.admin_token = dashboard.group(1)

    def stop(self) -> None:
        """Stops the process."""
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait()

    def members(self) -> Dict[str, Dict[str, Any]]:
        """The pool ``demo``'s members by id, each with its ``kind`` label's value as
        ``kind``."""
        listing = Client(self.api, token=self.admin_token)._call(
            "GET", "/pools/demo/members", None)[1]
        assert listing is not None
        return {member["member"]: dict(member, kind=member["labels"]["kind"])
                for member in listing["members"]}
