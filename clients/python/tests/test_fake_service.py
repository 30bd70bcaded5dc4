"""The client against a small fake of the service, for what the real one cannot show yet.

``POST /pools/{pool}/outcomes`` (outcome reports) is specified but not served by this
version of the service: the fake records what the client sends so that the tests check the
request against the contract, ``{"proxy", "result", "status"?}``. The fake also answers
with shapes the real service never gives (a load balancer's 502).
"""

import json
import threading
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple

from proxy_allocator import Client, ProxyAllocatorError, Unavailable

P1 = "http://user:pw@p1.example.net:3128"
LEASE_ID = "63eb31054be20f83cbec30683a17781f"

#: (status, headers, body) the fake answers per (method, path); 404 for anything else.
Answer = Tuple[int, Dict[str, str], bytes]


class FakeService:
    """An HTTP server on a free loopback port that records every request."""

    def __init__(self, answers: Dict[Tuple[str, str], Answer]) -> None:
        self.requests: List[Dict[str, Any]] = []
        #: The client's port of each request: one port, one connection.
        self.ports: List[int] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            # Keeps connections open between requests, as the service does.
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                fake.ports.append(self.client_address[1])
                fake.requests.append({
                    "method": "POST",
                    "path": self.path,
                    "authorization": self.headers.get("Authorization"),
                    "content_type": self.headers.get("Content-Type"),
                    "body": json.loads(raw) if raw else None,
                })
                status, headers, body = answers.get(("POST", self.path), (404, {}, b""))
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = "http://127.0.0.1:{}".format(self._server.server_address[1])
        # A short poll keeps shutdown() quick; the default half second adds up over tests.
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops serving and closes the socket."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def calls(self) -> List[Tuple[str, Optional[Any]]]:
        """Path and JSON body of every request, in order."""
        return [(r["path"], r["body"]) for r in self.requests]


def json_answer(status: int, body: Any, headers: Optional[Dict[str, str]] = None) -> Answer:
    return status, dict({"Content-Type": "application/json"}, **(headers or {})), \
        json.dumps(body).encode()


LEASED = json_answer(200, {
    "pool": "browsers", "proxy": P1, "in_flight": 1, "assignments": 7,
    "lease": {"id": LEASE_ID, "expires_at": "2026-11-30T10:17:19.384Z", "ttl_ms": 60000},
})
NO_CONTENT: Answer = (204, {}, b"")
RELEASE = "/pools/browsers/leases/{}/release".format(LEASE_ID)


class Reports(unittest.TestCase):
    """Outcome reports, alone and at the end of a lease."""

    def setUp(self) -> None:
        self.fake = FakeService({
            ("POST", "/pools/browsers/assign"): LEASED,
            ("POST", RELEASE): NO_CONTENT,
            ("POST", "/pools/browsers/outcomes"): NO_CONTENT,
            ("POST", "/pools/web/outcomes"): NO_CONTENT,
        })
        self.addCleanup(self.fake.stop)
        self.client = Client(self.fake.base, token="worker-token")

    def test_report_posts_the_proxy_the_result_and_the_status_as_json(self) -> None:
        self.client.report("web", P1, "blocked", status=403)
        self.assertEqual(self.fake.requests, [{
            "method": "POST",
            "path": "/pools/web/outcomes",
            "authorization": "Bearer worker-token",
            "content_type": "application/json",
            "body": {"proxy": P1, "result": "blocked", "status": 403},
        }])

    def test_report_leaves_the_status_out_when_there_is_none(self) -> None:
        self.client.report("web", P1, "failed")
        self.assertEqual(self.fake.calls(),
                         [("/pools/web/outcomes", {"proxy": P1, "result": "failed"})])

    def test_report_refuses_an_unknown_result_without_calling_the_service(self) -> None:
        with self.assertRaises(ValueError):
            self.client.report("web", P1, "meh")
        self.assertEqual(self.fake.requests, [])

    def test_a_lease_with_report_releases_then_reports_ok_when_the_block_ends(self) -> None:
        with self.client.lease("browsers", report=True) as leased:
            self.assertEqual((leased.proxy, leased.assignments), (P1, 7))
        self.assertEqual(self.fake.calls(), [
            ("/pools/browsers/assign", None),
            (RELEASE, None),
            ("/pools/browsers/outcomes", {"proxy": P1, "result": "ok"}),
        ])

    def test_a_lease_with_report_reports_failed_when_the_block_raises(self) -> None:
        with self.assertRaises(ConnectionError):
            with self.client.lease("browsers", report=True):
                raise ConnectionError("proxy refused the connection")
        self.assertEqual(self.fake.calls()[1:], [
            (RELEASE, None),
            ("/pools/browsers/outcomes", {"proxy": P1, "result": "failed"}),
        ])

    def test_report_as_replaces_the_outcome_reported_on_exit(self) -> None:
        with self.client.lease("browsers", ttl_ms=5000, report=True) as leased:
            leased.report_as("blocked", status=429)
        self.assertEqual(self.fake.calls(), [
            ("/pools/browsers/assign", {"ttl_ms": 5000}),
            (RELEASE, None),
            ("/pools/browsers/outcomes", {"proxy": P1, "result": "blocked", "status": 429}),
        ])

    def test_an_interrupt_releases_the_lease_but_reports_nothing(self) -> None:
        with self.assertRaises(KeyboardInterrupt):
            with self.client.lease("browsers", report=True):
                raise KeyboardInterrupt
        self.assertEqual(self.fake.calls(), [("/pools/browsers/assign", None), (RELEASE, None)])

    def test_a_lease_without_report_reports_nothing(self) -> None:
        with self.client.lease("browsers"):
            pass
        self.assertEqual(self.fake.calls(), [("/pools/browsers/assign", None), (RELEASE, None)])


class Answers(unittest.TestCase):
    """Error answers the real service cannot be made to give on demand."""

    def setUp(self) -> None:
        self.fake = FakeService({
            ("POST", "/pools/gateway/assign"):
                (502, {"Content-Type": "text/html"}, b"<h1>Bad Gateway</h1>"),
            ("POST", "/pools/busy/assign"): json_answer(
                503, {"error": {"code": "store_unavailable", "message": "retry shortly"}},
                {"Retry-After": "7"}),
            ("POST", "/pools/web/outcomes"): json_answer(
                400, {"error": {"code": "invalid_request", "message": "status is 100 to 599"}}),
        })
        self.addCleanup(self.fake.stop)
        self.client = Client(self.fake.base)

    def test_an_answer_not_from_the_service_keeps_its_status_as_the_code(self) -> None:
        with self.assertRaises(ProxyAllocatorError) as raised:
            self.client.assign("gateway")
        self.assertEqual((raised.exception.status, raised.exception.code), (502, "http_502"))

    def test_a_503_carries_its_retry_after_in_seconds(self) -> None:
        with self.assertRaises(Unavailable) as raised:
            self.client.assign("busy")
        self.assertEqual((raised.exception.code, raised.exception.retry_after),
                         ("store_unavailable", 7.0))

    def test_a_refused_report_raises_with_the_servers_code_and_message(self) -> None:
        with self.assertRaises(ProxyAllocatorError) as raised:
            self.client.report("web", P1, "ok", status=42)
        self.assertEqual((raised.exception.status, raised.exception.code, str(raised.exception)),
                         (400, "invalid_request", "status is 100 to 599 (invalid_request, HTTP 400)"))


if __name__ == "__main__":
    unittest.main()
