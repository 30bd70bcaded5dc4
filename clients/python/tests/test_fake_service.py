"""The client against a small fake of the service, for what the real one cannot show on
demand: the exact requests the client sends (the fake records them, so that the tests check
them against the contract), and answers the real service never gives (a load balancer's
502). Where the fake answers as the service would, it answers as the service does: outcome
reports get a 200 with what each report did, the shape ``test_service.py`` checks against
the real service.
"""

import json
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from proxy_allocator import (
    Client,
    DoneEffect,
    NoProxyAvailable,
    Outcome,
    ProxyAllocatorError,
    Unavailable,
)

P1 = "http://user:pw@p1.example.net:3128"
LEASE_ID = "63eb31054be20f83cbec30683a17781f"

#: (status, headers, body) the fake answers per (method, path); 404 for anything else.
Answer = Tuple[int, Dict[str, str], bytes]
#: An answer, or how to make one from the JSON body of the request.
Answering = Union[Answer, Callable[[Any], Answer]]


class FakeService:
    """An HTTP server on a free loopback port that records every request."""

    def __init__(self, answers: Dict[Tuple[str, str], Answering]) -> None:
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
                sent = json.loads(raw) if raw else None
                fake.ports.append(self.client_address[1])
                fake.requests.append({
                    "method": "POST",
                    "path": self.path,
                    "authorization": self.headers.get("Authorization"),
                    "content_type": self.headers.get("Content-Type"),
                    "body": sent,
                })
                answer = answers.get(("POST", self.path), (404, {}, b""))
                status, headers, body = answer(sent) if callable(answer) else answer
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


def reported(pool: str) -> Callable[[Any], Answer]:
    """The service's answer to one outcome report about a known, eligible member that has
    not failed before: counted, with a streak of 1 after a failure and 0 after a success."""
    def answer(report: Any) -> Answer:
        failures = 0 if report["result"] == "ok" else 1
        return json_answer(200, {
            "pool": pool,
            "outcomes": [{"proxy": report["proxy"], "result": report["result"],
                          "effect": "counted", "consecutive_failures": failures}],
            "unknown": [],
            "rejected": [],
        })
    return answer


class Reports(unittest.TestCase):
    """Outcome reports, alone and at the end of a lease sent as it ends (``carry_done=False``;
    :class:`CarriedEnds` has the default)."""

    def setUp(self) -> None:
        self.fake = FakeService({
            ("POST", "/pools/browsers/assign"): LEASED,
            ("POST", RELEASE): NO_CONTENT,
            ("POST", "/pools/browsers/outcomes"): reported("browsers"),
            ("POST", "/pools/web/outcomes"): reported("web"),
        })
        self.addCleanup(self.fake.stop)
        self.client = Client(self.fake.base, token="worker-token", carry_done=False)

    def test_report_posts_the_proxy_the_result_and_the_status_as_json(self) -> None:
        self.assertEqual(self.client.report("web", P1, "blocked", status=403),
                         Outcome(proxy=P1, result="blocked", effect="counted",
                                 consecutive_failures=1))
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
        self.assertEqual(leased.reported, Outcome(proxy=P1, result="ok", effect="counted",
                                                  consecutive_failures=0))
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

    def test_carry_done_false_on_one_lease_sends_its_end_as_the_block_ends(self) -> None:
        with Client(self.fake.base) as client:
            with client.lease("browsers", report=True, carry_done=False):
                pass
            self.assertEqual(self.fake.calls(), [
                ("/pools/browsers/assign", None),
                (RELEASE, None),
                ("/pools/browsers/outcomes", {"proxy": P1, "result": "ok"}),
            ])


#: What the fake's least-in-flight pool says of a carried ``done`` whose lease was live.
RELEASED = {"released": True, "proxy": P1, "effect": "counted", "consecutive_failures": 0}


def leased_carrying(body: Any) -> Answer:
    """A lease, with what the carried ``done`` did when the assign had one."""
    answer = json.loads(LEASED[2])
    if body is not None and "done" in body:
        answer["done"] = dict(RELEASED, released=body["done"]["lease"] == LEASE_ID)
        if "result" not in body["done"]:
            answer["done"] = {"released": answer["done"]["released"], "proxy": P1}
    return json_answer(200, answer)


class CarriedEnds(unittest.TestCase):
    """The end of a lease block (release and report) carried by the next assign to its pool,
    or sent alone after the delay, on close, and when nothing is left to carry it."""

    def setUp(self) -> None:
        self.answers: Dict[Tuple[str, str], Answering] = {
            ("POST", "/pools/browsers/assign"): leased_carrying,
            ("POST", "/pools/web/assign"): json_answer(
                200, {"pool": "web", "proxy": P1, "assignments": 1}),
            ("POST", RELEASE): NO_CONTENT,
            ("POST", "/pools/browsers/outcomes"): reported("browsers"),
        }
        self.fake = FakeService(self.answers)
        self.addCleanup(self.fake.stop)

    def test_the_next_lease_on_the_pool_carries_the_last_blocks_release_and_report(
            self) -> None:
        with Client(self.fake.base, done_delay=60) as client:
            with client.lease("browsers", report=True) as first:
                self.assertIsNone(first.done)
            self.assertEqual(self.fake.calls(), [("/pools/browsers/assign", None)])
            with client.lease("browsers", report=True) as second:
                second.report_as("blocked", status=429)
            self.assertEqual(second.done, DoneEffect(released=True, proxy=P1,
                                                     effect="counted", consecutive_failures=0))
            self.assertEqual(first.reported, Outcome(proxy=P1, result="ok", effect="counted",
                                                     consecutive_failures=0))
            self.assertIsNone(second.reported)
        # The second block's end, alone on close.
        self.assertEqual(self.fake.calls(), [
            ("/pools/browsers/assign", None),
            ("/pools/browsers/assign", {"done": {"lease": LEASE_ID, "result": "ok"}}),
            (RELEASE, None),
            ("/pools/browsers/outcomes", {"proxy": P1, "result": "blocked", "status": 429}),
        ])
        self.assertEqual(second.reported, Outcome(proxy=P1, result="blocked",
                                                  effect="counted", consecutive_failures=1))

    def test_a_plain_assign_to_the_pool_carries_the_end_and_a_lease_without_report_only_releases(
            self) -> None:
        with Client(self.fake.base, done_delay=60) as client:
            with client.lease("browsers", ttl_ms=5000):
                pass
            client.assign("web")
            assigned = client.assign("browsers")
            self.assertEqual(assigned.done,  # type: ignore[union-attr]
                             DoneEffect(released=True, proxy=P1))
            client.assign("browsers")
        # Another pool's assign leaves it; the next one to the pool carries it, and only it.
        self.assertEqual(self.fake.calls(), [
            ("/pools/browsers/assign", {"ttl_ms": 5000}),
            ("/pools/web/assign", None),
            ("/pools/browsers/assign", {"done": {"lease": LEASE_ID}}),
            ("/pools/browsers/assign", None),
        ])

    def test_an_assign_naming_a_session_carries_the_end_beside_the_session(self) -> None:
        with Client(self.fake.base, done_delay=60) as client:
            with client.lease("browsers"):
                pass
            assigned = client.assign("browsers", session="login")
            self.assertEqual(assigned.done,  # type: ignore[union-attr]
                             DoneEffect(released=True, proxy=P1))
            client.assign("browsers", session="login")
        self.assertEqual(self.fake.calls(), [
            ("/pools/browsers/assign", None),
            ("/pools/browsers/assign", {"session": "login", "done": {"lease": LEASE_ID}}),
            ("/pools/browsers/assign", {"session": "login"}),
        ])

    def test_an_end_no_assign_carries_is_sent_alone_after_the_delay(self) -> None:
        with Client(self.fake.base, done_delay=0.1) as client:
            ended = time.monotonic()
            with client.lease("browsers", report=True) as leased:
                pass
            deadline = ended + 5
            while leased.reported is None:
                self.assertLess(time.monotonic(), deadline, "no report within 5 s")
                time.sleep(0.01)
            self.assertGreaterEqual(time.monotonic() - ended, 0.1)
            self.assertEqual(self.fake.calls(), [
                ("/pools/browsers/assign", None),
                (RELEASE, None),
                ("/pools/browsers/outcomes", {"proxy": P1, "result": "ok"}),
            ])
            self.assertEqual(leased.reported, Outcome(proxy=P1, result="ok", effect="counted",
                                                      consecutive_failures=0))

    def test_each_thread_carries_only_its_own_ends(self) -> None:
        client = Client(self.fake.base, done_delay=60)
        with client.lease("browsers"):
            pass

        def lease_once() -> None:
            with client.lease("browsers", ttl_ms=1000):
                pass

        thread = threading.Thread(target=lease_once)
        thread.start()
        thread.join()
        self.assertEqual(self.fake.calls(), [("/pools/browsers/assign", None),
                                             ("/pools/browsers/assign", {"ttl_ms": 1000})])
        client.close()
        self.assertEqual(self.fake.calls()[2:], [(RELEASE, None), (RELEASE, None)])

    def test_a_503_on_the_carrying_assign_keeps_the_release_and_drops_the_report(
            self) -> None:
        with Client(self.fake.base, done_delay=60) as client:
            with client.lease("browsers", report=True):
                pass
            self.answers[("POST", "/pools/browsers/assign")] = json_answer(
                503, {"error": {"code": "store_unavailable", "message": "retry shortly"}})
            with self.assertLogs("proxy_allocator", "WARNING") as logs:
                with self.assertRaises(Unavailable):
                    with client.lease("browsers", report=True):
                        pass  # pragma: no cover - never entered
            # It may have been applied: a report sent again could count twice.
            self.assertEqual(logs.output, [
                "WARNING:proxy_allocator:outcome report dropped: the assign that carried it "
                "failed (retry shortly (store_unavailable, HTTP 503)) and may have applied it"])
        self.assertEqual(self.fake.calls(), [
            ("/pools/browsers/assign", None),
            ("/pools/browsers/assign", {"done": {"lease": LEASE_ID, "result": "ok"}}),
            (RELEASE, None),
        ])

    def test_a_204_still_applies_the_carried_end_and_says_nothing_of_it(self) -> None:
        with Client(self.fake.base, done_delay=60) as client:
            with client.lease("browsers", report=True) as leased:
                pass
            self.answers[("POST", "/pools/browsers/assign")] = NO_CONTENT
            with self.assertRaises(NoProxyAvailable):
                with client.lease("browsers"):
                    pass  # pragma: no cover - never entered
        self.assertEqual(self.fake.calls(), [
            ("/pools/browsers/assign", None),
            ("/pools/browsers/assign", {"done": {"lease": LEASE_ID, "result": "ok"}}),
        ])
        self.assertIsNone(leased.reported)


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
