"""The book's Python examples against ``proxy-allocator demo``, pointed at it the way the
getting-started page tells a reader to ("name the pool ``demo`` where they say ``web``,
pass no worker token, and fetch the printed site's URL"): the worker loop of the workers
page with the real ``requests``, and a Scrapy crawl with the page's ``settings.py``, each
fetching the demo's local page through the demo's own proxies (two healthy, one slow, one
failing). Nothing is stood in for: nothing here leaves the machine.
"""

import contextlib
import io
import json
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from typing import Any, Dict, List

import requests

from harness import REPOSITORY, Demo
from test_readme import WORKERS_PAGE, worker_examples

#: What the demo's site answers to every request.
PAGE = "hello from the proxy-allocator demo site\n"


def for_the_demo(source: str, demo: Demo) -> str:
    """An example of the workers page as the getting-started page says to point it at the
    demo: its API's address, the pool ``demo`` for ``web``, the printed site's URL for the
    example's sites."""
    return (source.replace("http://127.0.0.1:8080", demo.api)
            .replace('"web"', '"demo"')
            .replace("https://example.com/", demo.site))


def scrapy_settings() -> str:
    """The ``settings.py`` of the workers page's Scrapy section."""
    text = (REPOSITORY / WORKERS_PAGE).read_text(encoding="utf-8")
    section = text.split("\n## Scrapy\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```python\n", 1)[1].split("\n```", 1)[0]


class BookExamplesOnTheDemo(unittest.TestCase):
    def setUp(self) -> None:
        self.demo = Demo()
        self.addCleanup(self.demo.stop)

    def test_the_book_s_worker_loop_fetches_the_demo_page_through_every_demo_proxy(self) -> None:
        loop = for_the_demo(worker_examples()[0], self.demo)
        # The real requests.get, watched: what each fetch went through and how it ended.
        fetches: List[Dict[str, Any]] = []
        real_get = requests.get

        def get(url: str, **options: Any) -> requests.Response:
            fetch = {"url": url, "proxy": options["proxies"]["http"]}
            fetches.append(fetch)
            try:
                response = real_get(url, **options)
            except requests.RequestException as error:
                fetch["error"] = type(error).__name__
                raise
            fetch.update(status=response.status_code, text=response.text,
                         seconds=response.elapsed.total_seconds())
            return response

        requests.get = get  # type: ignore[assignment]
        self.addCleanup(setattr, requests, "get", real_get)

        # Twice round the loop's two sites: four assigns, one to each of the four members
        # (least-used), so the failing proxy is among them once.
        for _ in range(2):
            self.assertEqual(self._run(loop), "")
        kinds = {member: info["kind"] for member, info in self.demo.members().items()}
        self.assertEqual(sorted(kinds[fetch["proxy"]] for fetch in fetches),
                         ["failing", "healthy", "healthy", "slow"])
        self.assertEqual([fetch["url"] for fetch in fetches], [self.demo.site + "a",
                                                               self.demo.site + "b"] * 2)
        for fetch in fetches:
            if kinds[fetch["proxy"]] == "failing":
                # It closes the connection without an answer.
                self.assertEqual(fetch["error"], "ProxyError")
            else:
                self.assertEqual((fetch["status"], fetch["text"]), (200, PAGE))
            if kinds[fetch["proxy"]] == "slow":
                self.assertGreaterEqual(fetch["seconds"], 1.5)
        # Every outcome reached the service: one failure on the failing proxy (the pool
        # trips at two), a clean streak on the others.
        self.assertEqual(
            sorted((info["kind"], info["state"], info["assignments"],
                    info["consecutive_failures"]) for info in self.demo.members().values()),
            [("failing", "eligible", 1, 1), ("healthy", "eligible", 1, 0),
             ("healthy", "eligible", 1, 0), ("slow", "eligible", 1, 0)])

    def _run(self, source: str) -> str:
        """Runs an example; what it printed."""
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(source, WORKERS_PAGE, "exec"), {})
        return printed.getvalue()

    def test_a_scrapy_crawl_with_the_book_s_settings_fetches_the_demo_page_through_its_proxies(
            self) -> None:
        settings: Dict[str, Any] = {}
        exec(compile(for_the_demo(scrapy_settings(), self.demo), WORKERS_PAGE, "exec"), settings)
        work = Path(tempfile.mkdtemp(prefix="pa-demo-"))
        self.addCleanup(shutil.rmtree, work)
        urls = [self.demo.site + page for page in ("a", "b", "c", "d")]
        (work / "config.json").write_text(json.dumps({
            "settings": dict({name: value for name, value in settings.items() if name.isupper()},
                             LOG_LEVEL="WARNING"),
            "urls": urls,
            "meta": {},
        }))
        crawl = subprocess.run(
            [sys.executable, str(Path(__file__).parent / "crawl.py"), str(work / "config.json"),
             str(work / "out.json")], capture_output=True, text=True, timeout=60)
        self.assertEqual(crawl.returncode, 0, crawl.stderr)
        result = json.loads((work / "out.json").read_text())

        kinds = {member: info["kind"] for member, info in self.demo.members().items()}
        pages = sorted((item["url"], item["status"]) for item in result["items"])
        self.assertEqual(pages, [(url, 200) for url in urls])
        self.assertEqual({kinds[item["proxy"]] for item in result["items"]} - {"healthy", "slow"},
                         set())
        stats = result["stats"]
        # The first four downloads took the four members; the one through the failing proxy
        # was reported failed and retried, through the failing proxy again when the tie
        # between the members at one assignment fell on it (the second failure trips it),
        # and through another then.
        failed = stats["proxy_allocator/reported/failed"]
        self.assertEqual((stats["proxy_allocator/reported/ok"],
                          stats["proxy_allocator/assigned"], stats["finish_reason"]),
                         (4, 4 + failed, "finished"))
        self.assertIn(failed, (1, 2))
        self.assertEqual(self.demo.members()[next(m for m, k in kinds.items() if k == "failing")]
                         ["consecutive_failures"], failed)


if __name__ == "__main__":
    unittest.main()
