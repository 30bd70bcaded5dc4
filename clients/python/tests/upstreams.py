"""What a crawl goes through in the tests: a local site and local upstream proxies.

The proxies are real ``pproxy`` servers, each dialling the site from a loopback address of
its own (``127.0.0.2``, ``127.0.0.3``: the whole of 127.0.0.0/8 is loopback), so the site
knows which proxy a request came through, as a real site knows a proxy by its address.
The site answers 429 to the addresses it was told to block, as a rate-limited target does.
"""

import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Set, Tuple

from harness import free_port


class Site:
    """An HTTP site on a free loopback port: ``/page/N`` answers a small HTML page, or 429
    to a blocked client address; ``/slow`` the same after ``slow_seconds``. ``hits``
    records (client address, path, status)."""

    def __init__(self, blocked: Set[str]) -> None:
        self.hits: List[Tuple[str, str, int]] = []
        #: How long ``/slow`` takes to answer.
        self.slow_seconds = 5.0
        site = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                client = self.client_address[0]
                if self.path.startswith("/slow"):
                    # A page that takes its time: a download still running when the crawl
                    # is closed.
                    time.sleep(site.slow_seconds)
                status = 429 if client in blocked else 200
                body = "<html><body>{}</body></html>".format(self.path).encode()
                site.hits.append((client, self.path, status))
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "text/html")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up on a slow page: nobody to answer

            def handle(self) -> None:
                try:
                    super().handle()
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = "http://127.0.0.1:{}".format(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        daemon=True)
        self._thread.start()

    def urls(self, count: int) -> List[str]:
        """``count`` page URLs."""
        return ["{}/page/{}".format(self.base, i) for i in range(count)]

    def by_client(self) -> Dict[Tuple[str, int], int]:
        """How many requests came from each address, with each status."""
        counts: Dict[Tuple[str, int], int] = {}
        for client, _, status in self.hits:
            counts[(client, status)] = counts.get((client, status), 0) + 1
        return counts

    def stop(self) -> None:
        """Stops serving."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


class Proxy:
    """A ``pproxy`` HTTP proxy on a free loopback port, dialling out from ``source``."""

    def __init__(self, source: str) -> None:
        self.port = free_port()
        self.url = "http://127.0.0.1:{}".format(self.port)
        self.source = source
        self._process: Optional["subprocess.Popen[bytes]"] = subprocess.Popen(
            [sys.executable, "-m", "pproxy", "-l",
             "http://127.0.0.1:{}/@{}".format(self.port, source)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if self._process.poll() is not None:
                    break
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("pproxy on port {} did not start".format(self.port))

    def stop(self) -> None:
        """Stops the process."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None


def dead_proxy() -> str:
    """The URL of a proxy that is not there: nothing listens on its port."""
    return "http://127.0.0.1:{}".format(free_port())
