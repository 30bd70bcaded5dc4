"""How soon a pool's source is first fetched once configured: the bound is CHECK_TICK_MS
(default 1,000 ms) plus a second.

    cargo build --release
    python3 bench/source_fetch.py            # POOLS=20; PROXY_ALLOCATOR_BIN to pick a binary

It starts the binary (embedded store, default CHECK_TICK_MS) and a list server on loopback
that notes when each list is asked for. For each of POOLS pools, one after another, it
creates the pool with one source of its own (`interval_ms` one hour, so only the first
fetch counts) and measures from the PUT's answer to the list server receiving the GET.
"""

import os
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict

for part in ("tests", "src"):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                    "clients", "python", part))

from harness import Service  # noqa: E402

POOLS = int(os.environ.get("POOLS", "20"))
TICK_MS = 1000


def main() -> None:
    asked: Dict[str, float] = {}
    arrived = threading.Condition()

    class Lists(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            with arrived:
                asked.setdefault(self.path, time.monotonic())
                arrived.notify_all()
            body = b"p1.example.net:3128\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except OSError:
                pass  # the service was stopped right after its last request arrived

        def log_message(self, format: str, *args: Any) -> None:
            pass

    lists = ThreadingHTTPServer(("127.0.0.1", 0), Lists)
    threading.Thread(target=lists.serve_forever, daemon=True).start()
    base = "http://127.0.0.1:{}".format(lists.server_address[1])
    service = Service()
    waits = []
    try:
        for i in range(POOLS):
            path = "/list-{}.txt".format(i)
            service.admin("PUT", "/pools/fetched-{}".format(i), {
                "rules": {"allow_private_sources": True},
                "sources": [{"url": base + path, "interval_ms": 3_600_000}]})
            configured = time.monotonic()
            with arrived:
                if not arrived.wait_for(lambda: path in asked, timeout=10):
                    raise RuntimeError("{} was not fetched within 10 s".format(path))
            waits.append((asked[path] - configured) * 1000)
    finally:
        service.stop()
        lists.shutdown()
    waits.sort()
    print("{} pools, first fetch after the PUT (ms): min {:.0f}, median {:.0f}, "
          "p95 {:.0f}, max {:.0f}; bound CHECK_TICK_MS + 1000 = {}".format(
              len(waits), waits[0], statistics.median(waits),
              waits[max(0, int(len(waits) * 0.95) - 1)], waits[-1], TICK_MS + 1000))
    print("load average: {:.2f} {:.2f} {:.2f} on {} cores".format(*os.getloadavg(),
                                                                  os.cpu_count()))


if __name__ == "__main__":
    main()
