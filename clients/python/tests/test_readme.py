"""The worker examples of the book's workers page, run as written against the real service.

The examples send their requests with ``requests`` to sites the tests cannot reach, so
``requests`` is a stand-in here that records each call and answers as the test says; the
client calls the examples make (assign, report, lease) go to the service.
"""

import contextlib
import io
import sys
import types
import unittest
from typing import Any, Dict, List, Optional, Union

from harness import REPOSITORY, Service

P1 = "http://p1.example.net:3128"
P2 = "http://p2.example.net:3128"


#: The book's page of the workers, as a path from the repository's root.
WORKERS_PAGE = "docs/src/workers.md"


def worker_examples() -> List[str]:
    """The ``python`` blocks of the "Python" section of the book's workers page, in order."""
    text = (REPOSITORY / WORKERS_PAGE).read_text(encoding="utf-8")
    section = text.split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
    blocks = [part.split("\n```", 1)[0] for part in section.split("```python\n")[1:]]
    if len(blocks) != 2:
        raise AssertionError("expected the worker loop and the lease example, found "
                             "{} python blocks".format(len(blocks)))
    return blocks


class Response:
    """What the stand-in's ``get`` returns."""

    def __init__(self, status_code: int) -> None:
        self.status_code = status_code

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise StandInRequests.HTTPError("HTTP {}".format(self.status_code))


class StandInRequests(types.ModuleType):
    """The part of ``requests`` the examples use."""

    class RequestException(OSError):
        pass

    class HTTPError(RequestException):
        pass

    def __init__(self) -> None:
        super().__init__("requests")
        self.calls: List[Dict[str, Any]] = []
        self.answers: List[Union[int, Exception]] = []

    def get(self, url: str, proxies: Optional[Dict[str, str]] = None,
            timeout: Optional[float] = None) -> Response:
        self.calls.append({"url": url, "proxies": proxies, "timeout": timeout})
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return Response(answer)


class ReadmeExamples(unittest.TestCase):
    def setUp(self) -> None:
        # The page's worker runs against a service whose worker routes are open.
        self.service = Service(worker_token=None)
        self.addCleanup(self.service.stop)
        self.service.admin("PUT", "/pools/web", {"health": {"max_consecutive_failures": 1}})
        self.service.seed("web", [P1, P2])
        self.service.admin("PUT", "/pools/browsers",
                           {"policy": "least-in-flight", "max_in_flight": 1})
        self.service.seed("browsers", [P1])
        # The examples' `import requests` finds the stand-in.
        self.requests = StandInRequests()
        sys.modules["requests"] = self.requests
        self.addCleanup(sys.modules.pop, "requests", None)
        self.namespace: Dict[str, Any] = {}

    def run_example(self, source: str) -> str:
        """Runs one example in the namespace the previous ones left; what it printed."""
        source = source.replace("http://127.0.0.1:8080", self.service.base)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(source, WORKERS_PAGE, "exec"), self.namespace)
        return printed.getvalue()

    def member(self, pool: str, proxy: str) -> Dict[str, Any]:
        listing = self.service.admin("GET", "/pools/{}/members".format(pool))
        assert listing is not None
        return next(m for m in listing["members"] if m["member"] == proxy)

    def test_the_worker_loop_and_the_lease_example_run_as_written(self) -> None:
        loop, lease = worker_examples()

        # The first target blocks the first proxy (403), the second times out.
        self.requests.answers = [403, StandInRequests.RequestException("timed out")]
        printed = self.run_example(loop)
        self.assertEqual([(c["url"], c["proxies"]) for c in self.requests.calls], [
            ("https://example.com/a", {"http": P1, "https": P1}),
            ("https://example.com/b", {"http": P2, "https": P2}),
        ])
        # P1's block went with the second assign, P2's failure alone after the loop.
        self.assertEqual(printed, P1 + " cooling down\n" + P2 + " cooling down\n")
        self.assertEqual((self.member("web", P1)["state"], self.member("web", P1)["reason"]),
                         ("ineligible", "blocked"))
        self.assertEqual(self.member("web", P2)["reason"], "unhealthy")

        # One session of two pages through one leased proxy, the second page a 500.
        self.requests.calls.clear()
        self.requests.answers = [200, 500]
        with self.assertRaises(StandInRequests.HTTPError):
            self.run_example(lease)
        self.assertEqual([(c["url"], c["proxies"]) for c in self.requests.calls], [
            ("https://example.com/login", {"http": P1, "https": P1}),
            ("https://example.com/cart", {"http": P1, "https": P1}),
        ])
        # Released and reported as failed once no assign carried them within the client's
        # done_delay (the release goes first, then the report).
        self.service.wait_until(
            lambda: self.member("browsers", P1)["consecutive_failures"] == 1, "no report")
        self.assertEqual(self.service.stats("browsers")["in_flight"], 0)

        # With its one proxy leased elsewhere, the example skips the session.
        with self.service.client(None) as other, other.lease("browsers"):
            self.requests.calls.clear()
            self.run_example(lease)
            self.assertEqual(self.requests.calls, [])
        self.assertEqual(self.service.stats("browsers")["in_flight"], 0)


if __name__ == "__main__":
    unittest.main()
