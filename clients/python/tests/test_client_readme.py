"""The code of the client's README (clients/python/README.md), run as written against the
real service.

Every fenced block of the README is listed in ``BLOCKS``: the test that runs it, or why no
test does. A block added to the README and not to the list fails
``test_every_block_of_the_readme_is_run_here_or_skipped_for_a_reason``.

The examples send their requests to sites the tests cannot reach, so what they send them
with is a stand-in that records each request and answers as the test says: ``requests``
and ``aiohttp`` (only the example's own ``import aiohttp``: the client keeps the real one),
and, for the Scrapy spider, a download handler (``standin_site.py``). Everything the
examples ask the service (assign, report, lease, sessions, the operator's commands) goes to
the service.
"""

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types
import unittest
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import proxy_allocator.aio  # noqa: F401 (the client's aiohttp, imported before the stand-in)
from harness import ADMIN, REPOSITORY, Service, binary
from proxy_allocator import Client, NotFound
from test_readme import StandInRequests

#: The README, as a path from the repository's root.
README = "clients/python/README.md"

P1 = "http://p1.example.net:3128"
P2 = "http://p2.example.net:3128"
R1 = "http://user:pass@r1.example.net:8000"

#: Every fenced block of the README, in order: its language, the start of its first line,
#: and the test that runs it or, after "skipped:", why none does.
BLOCKS: List[Tuple[str, str, str]] = [
    ("sh", "pip install ./clients/python",
     "skipped: installs the package, which this suite imports installed"),
    ("python", "import time", "test_the_worker_loop_and_the_report_example_run_as_written"),
    ("python", 'outcome = client.report("web", assigned.proxy, "failed", status=502)',
     "test_the_worker_loop_and_the_report_example_run_as_written"),
    ("python", 'assigned = client.assign("web", target="shop.example.com")\n',
     "test_the_target_exclude_session_and_done_examples_run_as_written"),
    ("python", 'assigned = client.assign("web", target="shop.example.com", exclude=',
     "test_the_target_exclude_session_and_done_examples_run_as_written"),
    ("python", 'assigned = client.assign("web", session="account-42"',
     "test_the_target_exclude_session_and_done_examples_run_as_written"),
    ("python", "from proxy_allocator import Done",
     "test_the_target_exclude_session_and_done_examples_run_as_written"),
    ("python", "from proxy_allocator import NoProxyAvailable",
     "test_the_lease_example_runs_as_written"),
    ("python", "import asyncio", "test_the_asyncio_example_runs_as_written"),
    ("sh", "export ADMIN_TOKEN=s3cret",
     "test_the_operator_commands_and_the_scrapy_spider_run_as_written"),
    ("python", "import scrapy", "test_the_operator_commands_and_the_scrapy_spider_run_as_written"),
    ("sh", "cargo build --release",
     "skipped: builds the service and runs this very suite"),
]

_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def readme_blocks() -> List[Tuple[str, str]]:
    """Every fenced block of the README: its language and its text, in order."""
    text = (REPOSITORY / README).read_text(encoding="utf-8")
    return [(found.group(1), found.group(2)) for found in _BLOCK.finditer(text)]


def block(start: str) -> str:
    """The one block of ``BLOCKS`` that starts with ``start``."""
    entries = [i for i, (_, first, _) in enumerate(BLOCKS) if first == start]
    assert len(entries) == 1, start
    return readme_blocks()[entries[0]][1]


class StandInAiohttp(types.ModuleType):
    """The part of ``aiohttp`` the asyncio example uses for its own requests:
    ``ClientSession().get(url, proxy=...)`` answers the first of ``answers[url]`` (a status
    or an exception to raise) and drops it."""

    class ClientError(Exception):
        pass

    def __init__(self) -> None:
        super().__init__("aiohttp")
        self.calls: List[Tuple[str, Optional[str]]] = []
        self.answers: Dict[str, List[Union[int, Exception]]] = {}

    def ClientSession(self) -> "StandInAiohttp._Session":  # noqa: N802 (aiohttp's name)
        return StandInAiohttp._Session(self)

    class _Session:
        def __init__(self, module: "StandInAiohttp") -> None:
            self._module = module

        async def __aenter__(self) -> "StandInAiohttp._Session":
            return self

        async def __aexit__(self, *_: Any) -> None:
            return None

        @contextlib.asynccontextmanager
        async def get(self, url: str, proxy: Optional[str] = None) -> Any:
            self._module.calls.append((url, proxy))
            answer = self._module.answers[url].pop(0)
            if isinstance(answer, Exception):
                raise answer
            yield StandInAiohttp._Response(answer)

    class _Response:
        def __init__(self, status: int) -> None:
            self.status = status

        async def read(self) -> bytes:
            return b"<html></html>"


class ClientReadme(unittest.TestCase):
    def start(self, worker_token: Optional[str] = None, admin_token: Optional[str] = None) -> None:
        """The service, with the tokens the example names."""
        self.service = Service(worker_token=worker_token, admin_token=admin_token or ADMIN)
        self.addCleanup(self.service.stop)
        self.namespace: Dict[str, Any] = {}

    def pools(self, web_health: Optional[Dict[str, Any]] = None) -> None:
        """The README's pools: ``web`` (least-used: P1, P2) and ``browsers``
        (least-in-flight, one lease per member: P1)."""
        self.service.admin("PUT", "/pools/web", {"health": web_health or {}})
        self.service.seed("web", [P1, P2])
        self.service.admin("PUT", "/pools/browsers",
                           {"policy": "least-in-flight", "max_in_flight": 1})
        self.service.seed("browsers", [P1])

    def stand_in(self, name: str, module: types.ModuleType) -> None:
        """The examples' ``import name`` finds ``module`` until the test ends."""
        previous = sys.modules.get(name)
        sys.modules[name] = module

        def restore() -> None:
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous
        self.addCleanup(restore)

    def run_block(self, start: str) -> str:
        """Runs one block in the namespace the previous ones left, the service's address
        for the README's; what it printed."""
        source = block(start).replace("http://127.0.0.1:8080", self.service.base)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(source, README, "exec"), self.namespace)
        return printed.getvalue()

    def member(self, pool: str, proxy: str) -> Dict[str, Any]:
        listing = self.service.admin("GET", "/pools/{}/members".format(pool))
        assert listing is not None
        return next(m for m in listing["members"] if m["member"] == proxy)

    def test_every_block_of_the_readme_is_run_here_or_skipped_for_a_reason(self) -> None:
        found = [(language, text.split("\n", 1)[0]) for language, text in readme_blocks()]
        listed = [(language, start.split("\n", 1)[0]) for language, start, _ in BLOCKS]
        self.assertEqual(len(found), len(listed), "the README's blocks: {}".format(found))
        for (language, first), (listed_language, start) in zip(found, listed):
            self.assertEqual((language, first[:len(start)]), (listed_language, start))
        for _, _, runner in BLOCKS:
            if not runner.startswith("skipped: "):
                self.assertTrue(callable(getattr(self, runner, None)), runner)
        skipped = [(language, start) for language, start, runner in BLOCKS
                   if runner.startswith("skipped: ")]
        self.assertEqual(skipped, [("sh", "pip install ./clients/python"),
                                   ("sh", "cargo build --release")])

    def test_the_worker_loop_and_the_report_example_run_as_written(self) -> None:
        self.start(worker_token="worker-token")
        self.pools(web_health={"max_consecutive_failures": 2})
        requests = StandInRequests()
        self.stand_in("requests", requests)

        # The first site blocks the first proxy (403), the second times out.
        requests.answers = [403, StandInRequests.RequestException("timed out")]
        self.assertEqual(self.run_block("import time"), "")
        self.assertEqual([(c["url"], c["proxies"], c["timeout"]) for c in requests.calls], [
            ("https://example.com/a", {"http": P1, "https": P1}, 10),
            ("https://example.com/b", {"http": P2, "https": P2}, 10),
        ])
        self.assertEqual((self.member("web", P1)["consecutive_failures"],
                          self.member("web", P2)["consecutive_failures"]), (1, 1))

        # A second failure in a row (the pool trips at two) takes P2 out.
        printed = self.run_block(
            'outcome = client.report("web", assigned.proxy, "failed", status=502)')
        self.assertEqual(printed, P2 + " cooling down after 2 failures\n")
        self.assertEqual((self.member("web", P2)["state"], self.member("web", P2)["reason"]),
                         ("ineligible", "unhealthy"))

    def test_the_target_exclude_session_and_done_examples_run_as_written(self) -> None:
        self.start(worker_token="worker-token")
        self.pools()
        # The worker loop's client, and the assignments the examples say a worker holds.
        client = Client(self.service.base, token="worker-token")
        self.addCleanup(client.close)
        self.namespace["client"] = client

        # Blocked on shop.example.com: P1 is banned there only.
        self.run_block('assigned = client.assign("web", target="shop.example.com")\n')
        self.assertEqual(self.namespace["assigned"].proxy, P1)
        self.assertEqual(self.member("web", P1)["state"], "eligible")

        # A retry there that already failed on P2: P1 is banned, P2 excluded, nothing left.
        self.namespace["failed"] = client.assign("web")
        self.assertEqual(self.namespace["failed"].proxy, P2)
        self.run_block('assigned = client.assign("web", target="shop.example.com", exclude=')
        self.assertIsNone(self.namespace["assigned"])

        # The session is pinned to the one proxy not banned on the site, then ended.
        self.run_block('assigned = client.assign("web", session="account-42"')
        self.assertEqual((self.namespace["assigned"].proxy,
                          self.namespace["assigned"].session.id), (P2, "account-42"))
        with self.assertRaises(NotFound) as ended:
            client.end_session("web", "account-42")
        self.assertEqual(ended.exception.code, "session_not_found")

        # The previous requests' ends ride on the next assigns.
        self.namespace["last"] = client.assign("web")
        self.namespace["previous"] = client.assign("browsers")
        self.assertEqual((self.namespace["last"].proxy,
                          self.service.stats("browsers")["in_flight"]), (P1, 1))
        self.run_block("from proxy_allocator import Done")
        done = self.namespace["assigned"].done
        self.assertEqual((done.proxy, done.effect, done.released), (P1, "ignored", False))
        self.assertEqual((self.namespace["leased"].proxy, self.namespace["leased"].done.released,
                          self.namespace["leased"].done.proxy), (P1, True, P1))
        self.assertEqual(self.service.stats("browsers")["in_flight"], 1)

    def test_the_lease_example_runs_as_written(self) -> None:
        self.start(worker_token="worker-token")
        self.pools()
        # The worker loop's `client` and `requests`.
        requests = StandInRequests()
        client = Client(self.service.base, token="worker-token")
        self.addCleanup(client.close)
        self.namespace.update(client=client, requests=requests)

        # One session of two pages through one leased proxy; released and reported ok once
        # no assign carried the block's end within the client's done_delay.
        requests.answers = [200, 200]
        self.run_block("from proxy_allocator import NoProxyAvailable")
        self.assertEqual([(c["url"], c["proxies"]) for c in requests.calls], [
            ("https://example.com/login", {"http": P1, "https": P1}),
            ("https://example.com/cart", {"http": P1, "https": P1}),
        ])
        self.service.wait_until(
            lambda: self.service.requests()["/pools/{pool}/outcomes"] == 1, "no report")
        calls = self.service.requests()
        self.assertEqual([calls[route] for route in ("/pools/{pool}/assign",
                                                     "/pools/{pool}/leases/{lease}/release",
                                                     "/pools/{pool}/outcomes")], [1, 1, 1])
        self.assertEqual(self.service.stats("browsers")["in_flight"], 0)

        # With its one proxy leased elsewhere, the block is skipped.
        with self.service.client("worker-token") as other, other.lease("browsers"):
            requests.calls.clear()
            self.run_block("from proxy_allocator import NoProxyAvailable")
            self.assertEqual(requests.calls, [])

    def test_the_asyncio_example_runs_as_written(self) -> None:
        self.start(worker_token=None)
        self.pools(web_health={"max_consecutive_failures": 1})
        aiohttp = StandInAiohttp()
        self.stand_in("aiohttp", aiohttp)

        # a answers, b blocks its proxy, then a blocks the leased browser proxy.
        aiohttp.answers = {"https://example.com/a": [200, 429], "https://example.com/b": [429]}
        printed = self.run_block("import asyncio")
        through = dict(aiohttp.calls[:2])
        self.assertEqual(sorted(through.values()), [P1, P2])
        self.assertEqual(sorted(printed.splitlines()), [
            "https://example.com/a {} counted".format(through["https://example.com/a"]),
            "https://example.com/b {} tripped".format(through["https://example.com/b"]),
        ])
        self.assertEqual(aiohttp.calls[2:], [("https://example.com/a", P1)])
        # The lease's block reported blocked (with 429) and released on leaving the client.
        self.assertEqual([self.member("browsers", P1)[key] for key in
                          ("state", "consecutive_failures", "in_flight")], ["eligible", 1, 0])
        self.assertEqual(self.service.stats("browsers")["in_flight"], 0)

        # With nothing to lease, the example says when to come back: never by itself.
        aiohttp.calls.clear()
        aiohttp.answers = {"https://example.com/a": [200], "https://example.com/b": [200]}
        with self.service.client(None) as other, other.lease("browsers"):
            printed = self.run_block("import asyncio")
        self.assertEqual(printed.splitlines()[-1],
                         "every browser proxy is busy; retry in None s")
        self.assertEqual([url for url, _ in aiohttp.calls],
                         ["https://example.com/a", "https://example.com/b"])

    def test_the_operator_commands_and_the_scrapy_spider_run_as_written(self) -> None:
        self.start(worker_token=None, admin_token="s3cret")
        work = Path(tempfile.mkdtemp(prefix="pa-readme-"))
        self.addCleanup(shutil.rmtree, work)
        # `proxy-allocator` on the PATH, talking to this service.
        (work / "bin").mkdir()
        (work / "bin" / "proxy-allocator").symlink_to(binary())
        env = {"PATH": "{}:{}".format(work / "bin", os.environ.get("PATH", "")),
               "PROXY_ALLOCATOR_URL": self.service.base}
        commands = subprocess.run(["bash", "-e", "-c", block("export ADMIN_TOKEN=s3cret")],
                                  env=env, capture_output=True, text=True, timeout=30)
        self.assertEqual(commands.returncode, 0, commands.stderr)
        self.assertEqual(sorted(m["member"] for m in
                                self.service.admin("GET", "/pools/web/members")["members"]),
                         [P1, P2])
        self.assertEqual([m["member"] for m in
                          self.service.admin("GET", "/pools/residential/members")["members"]],
                         [R1])

        # `scrapy runspider spider.py -o pages.jsonl`, the site stood in for.
        (work / "spider.py").write_text(
            block("import scrapy").replace("http://127.0.0.1:8080", self.service.base))
        env["PYTHONPATH"] = str(Path(__file__).parent)
        env["STANDIN_SITE_LOG"] = str(work / "site.jsonl")
        crawl = subprocess.run(
            [sys.executable, "-m", "scrapy", "runspider", "spider.py", "-o", "pages.jsonl",
             "-s", 'DOWNLOAD_HANDLERS={"https": "standin_site.StandInSite"}'],
            cwd=work, env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(crawl.returncode, 0, crawl.stderr)
        self.assertIn("'finish_reason': 'finished'", crawl.stderr)

        pages = [json.loads(line) for line in (work / "pages.jsonl").read_text().splitlines()]
        by_url = {page["url"]: page["proxy"] for page in pages}
        self.assertEqual((len(pages), sorted(by_url)), (3, [
            "https://example.com/a", "https://example.com/b", "https://example.com/next"]))
        self.assertEqual(sorted([by_url["https://example.com/a"],
                                 by_url["https://example.com/b"]]), [P1, P2])
        self.assertEqual(by_url["https://example.com/next"], R1)
        # Scrapy's HttpProxyMiddleware took the residential member's credentials into
        # Proxy-Authorization (user:pass).
        seen = sorted((json.loads(line) for line in
                       (work / "site.jsonl").read_text().splitlines()),
                      key=lambda hit: hit["url"])
        self.assertEqual(seen, [
            {"url": "https://example.com/a", "proxy": by_url["https://example.com/a"],
             "proxy_authorization": None},
            {"url": "https://example.com/b", "proxy": by_url["https://example.com/b"],
             "proxy_authorization": None},
            {"url": "https://example.com/next", "proxy": "http://r1.example.net:8000",
             "proxy_authorization": "Basic dXNlcjpwYXNz"},
        ])
        # Each download was reported ok once the spider closed.
        self.assertEqual([self.member("residential", R1)[k] for k in
                          ("assignments", "consecutive_failures")], [1, 0])
        self.assertEqual(self.service.requests()["/pools/{pool}/assign"], 3)


if __name__ == "__main__":
    unittest.main()
