"""The Scrapy middleware in real crawls: the release binary (both stores), a local site,
real pproxy upstreams (one the site answers 429, one dead), Scrapy's CrawlerProcess."""

import json
import os
import subprocess
import sys
import tempfile
import unittest
from typing import Any, ClassVar, Dict, List, Optional

from harness import WORKER, RedisServer, Service
from upstreams import Proxy, Site, dead_proxy

GOOD_SOURCE = "127.0.0.2"
BLOCKED_SOURCE = "127.0.0.3"
PAGES = 12
CRAWL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "crawl.py")


class CrawlBehaviour(unittest.TestCase):
    """Crawls that hold on either store (removed below; the subclasses run)."""

    on_redis: ClassVar[bool]
    redis: ClassVar[Optional[RedisServer]]
    service: ClassVar[Service]
    good: ClassVar[Proxy]
    blocked: ClassVar[Proxy]

    @classmethod
    def setUpClass(cls) -> None:
        cls.redis = RedisServer() if cls.on_redis else None
        cls.service = Service(cls.redis.url if cls.redis else None)
        cls.good = Proxy(GOOD_SOURCE)
        cls.blocked = Proxy(BLOCKED_SOURCE)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.good.stop()
        cls.blocked.stop()
        cls.service.stop()
        if cls.redis is not None:
            cls.redis.stop()

    def setUp(self) -> None:
        self.site = Site(blocked={BLOCKED_SOURCE})
        self.addCleanup(self.site.stop)

    def crawl(self, pool: str, urls: List[str], meta: Optional[Dict[str, Any]] = None,
              **settings: Any) -> Dict[str, Any]:
        """Runs the spider over ``urls`` (each request with ``meta``) through ``pool``; its
        items and stats."""
        config = {"urls": urls, "meta": meta or {}, "settings": dict({
            "DOWNLOADER_MIDDLEWARES": {"proxy_allocator.scrapy.ProxyAllocatorMiddleware": 740},
            "PROXY_ALLOCATOR_URL": self.service.base,
            "PROXY_ALLOCATOR_POOL": pool,
            "PROXY_ALLOCATOR_TOKEN": WORKER,
            "TWISTED_REACTOR": "twisted.internet.asyncioreactor.AsyncioSelectorReactor",
            "CONCURRENT_REQUESTS": 4,
            "RETRY_TIMES": 2,
            "DOWNLOAD_TIMEOUT": 10,
            "ROBOTSTXT_OBEY": False,
            "TELNETCONSOLE_ENABLED": False,
            "LOG_LEVEL": "INFO",
        }, **settings)}
        with tempfile.TemporaryDirectory() as scratch:
            config_path = os.path.join(scratch, "config.json")
            out_path = os.path.join(scratch, "out.json")
            with open(config_path, "w") as file:
                json.dump(config, file)
            run = subprocess.run([sys.executable, CRAWL, config_path, out_path],
                                 capture_output=True, text=True, timeout=120)
            self.assertEqual(run.returncode, 0, run.stderr[-4000:])
            with open(out_path) as file:
                result: Dict[str, Any] = json.load(file)
            result["log"] = run.stderr[-3000:]
        return result

    def members(self, pool: str) -> Dict[str, Dict[str, Any]]:
        listing = self.service.admin("GET", "/pools/{}/members".format(pool))
        assert listing is not None
        return {m["member"]: m for m in listing["members"]}

    def crawl_through_a_good_a_blocking_and_a_dead_proxy(
            self, **settings: Any) -> Dict[str, Any]:
        """A crawl of PAGES pages on a least-in-flight pool of the good, the blocked and a
        dead proxy; checks what holds whether blocks are per site or pool-wide, and returns
        the pool, the dead member, the stats and the listing."""
        dead = dead_proxy()
        pool = self.service.create_pool({
            "policy": "least-in-flight",
            "rules": {"allow_private": True},
            "health": {"max_consecutive_failures": 1, "cooldown_ms": 600000,
                       "target_ban_ms": 600000, "jitter_percent": 0},
        })
        self.service.seed(pool, [self.good.url, self.blocked.url, dead])
        result = self.crawl(pool, self.site.urls(PAGES), **settings)
        items, stats = result["items"], result["stats"]

        # The crawl completed: every page, each through the good proxy.
        self.assertEqual(sorted(i["url"] for i in items), sorted(self.site.urls(PAGES)))
        self.assertEqual({(i["status"], i["proxy"]) for i in items}, {(200, self.good.url)})

        # What the site saw through each proxy is what was reported about it.
        blocked_hits = self.site.by_client().get((BLOCKED_SOURCE, 429), 0)
        self.assertEqual(self.site.by_client(), {(GOOD_SOURCE, 200): PAGES,
                                                 (BLOCKED_SOURCE, 429): blocked_hits})
        failed = stats.get("proxy_allocator/reported/failed", 0)
        self.assertGreaterEqual(blocked_hits, 1)
        self.assertGreaterEqual(failed, 1)
        self.assertEqual(stats["proxy_allocator/reported/ok"], PAGES)
        self.assertEqual(stats["proxy_allocator/reported/blocked"], blocked_hits)

        # Counts: the service's per member are the downloads through each.
        members = self.members(pool)
        self.assertEqual({m: members[m]["assignments"] for m in members},
                         {self.good.url: PAGES, self.blocked.url: blocked_hits, dead: failed})
        self.assertEqual(stats["proxy_allocator/assigned"], PAGES + blocked_hits + failed)

        # Every lease released, none left to the sweep.
        self.assertEqual(stats["proxy_allocator/released"], stats["proxy_allocator/assigned"])
        pool_stats = self.service.stats(pool)
        self.assertEqual((pool_stats["in_flight"], pool_stats["abandoned"]), (0, 0))
        self.assertNotIn("proxy_allocator/report_failed", stats)
        self.assertNotIn("proxy_allocator/release_failed", stats)
        # Each download's report and release went once: with a later assign, or alone.
        self.assertEqual(stats.get("proxy_allocator/carried", 0)
                         + stats.get("proxy_allocator/sent_alone", 0),
                         stats["proxy_allocator/assigned"])
        return {"pool": pool, "dead": dead, "stats": stats, "members": members}

    def test_a_crawl_takes_out_the_dead_proxy_and_bans_the_blocking_one_for_that_site_only(
            self) -> None:
        crawled = self.crawl_through_a_good_a_blocking_and_a_dead_proxy()
        pool, dead, stats, members = (crawled[k] for k in ("pool", "dead", "stats", "members"))
        # By default the reports ride on later assigns: a download that finishes while
        # others wait for a proxy leaves its report to the next of them.
        self.assertGreaterEqual(stats["proxy_allocator/carried"], 1)
        # The dead proxy is out for every site; the blocking one only for the site's host.
        self.assertEqual((stats["proxy_allocator/tripped"], stats["proxy_allocator/banned"]),
                         (1, 1))
        self.assertEqual({m: (members[m]["state"], members[m].get("reason")) for m in members},
                         {self.good.url: ("eligible", None),
                          self.blocked.url: ("eligible", None),
                          dead: ("ineligible", "unhealthy")})
        for_site = self.service.admin("GET", "/pools/{}/members?target=127.0.0.1".format(pool))
        assert for_site is not None
        banned = {m["member"] for m in for_site["members"] if m.get("banned_until")}
        self.assertEqual(banned, {self.blocked.url})
        other = self.service.client().assign(pool, target="elsewhere.example")
        assert other is not None and not isinstance(other, list)
        self.assertEqual(other.proxy, self.blocked.url)

    def test_without_per_target_reports_a_block_takes_the_proxy_out_for_every_site(
            self) -> None:
        # Reports and releases sent at once, each in a call of its own, hold the same.
        crawled = self.crawl_through_a_good_a_blocking_and_a_dead_proxy(
            PROXY_ALLOCATOR_PER_TARGET=False, PROXY_ALLOCATOR_CARRY_DONE=False)
        dead, stats, members = (crawled[k] for k in ("dead", "stats", "members"))
        self.assertNotIn("proxy_allocator/carried", stats)
        self.assertEqual(stats["proxy_allocator/tripped"], 2)
        self.assertNotIn("proxy_allocator/banned", stats)
        # Taken out, each with the reason its last report gave.
        self.assertEqual({m: (members[m]["state"], members[m].get("reason")) for m in members},
                         {self.good.url: ("eligible", None),
                          self.blocked.url: ("ineligible", "blocked"),
                          dead: ("ineligible", "unhealthy")})

    def test_a_pool_the_service_does_not_know_closes_the_spider_with_pool_not_found(
            self) -> None:
        result = self.crawl("no-such-pool", self.site.urls(3))
        self.assertEqual(result["stats"]["finish_reason"], "proxy_allocator_pool_not_found")
        self.assertEqual((result["items"], self.site.by_client()), ([], {}))
        self.assertIn("pool_not_found", result["log"])

    def test_a_wrong_token_closes_the_spider_as_unauthorized(self) -> None:
        pool = self.service.create_pool({"rules": {"allow_private": True}})
        self.service.seed(pool, [self.good.url])
        result = self.crawl(pool, self.site.urls(3), PROXY_ALLOCATOR_TOKEN="not-the-token")
        self.assertEqual(result["stats"]["finish_reason"], "proxy_allocator_unauthorized")
        self.assertEqual((result["items"], self.site.by_client()), ([], {}))

    def test_with_close_on_error_off_the_crawl_finishes_and_sends_nothing_direct(
            self) -> None:
        result = self.crawl("no-such-pool", self.site.urls(3),
                            PROXY_ALLOCATOR_CLOSE_ON_ERROR=False)
        self.assertEqual(result["stats"]["finish_reason"], "finished")
        self.assertEqual((result["items"], self.site.by_client()), ([], {}))
        self.assertEqual(result["stats"]["log_count/ERROR"], 3)

    def test_a_crawl_waits_out_a_204_and_drops_nothing(self) -> None:
        pool = self.service.create_pool({
            "rules": {"allow_private": True},
            "health": {"max_consecutive_failures": 1, "cooldown_ms": 6000,
                       "jitter_percent": 0},
        })
        self.service.seed(pool, [self.good.url])
        # The only proxy cools down for 6 s, longer than the crawler takes to start: each
        # first assign of the crawl answers 204 with Retry-After.
        self.service.client().report(pool, self.good.url, "failed")
        # As many pages as requests run at once (CONCURRENT_REQUESTS), so all meet the 204.
        pages = self.site.urls(4)
        result = self.crawl(pool, pages)
        items, stats = result["items"], result["stats"]
        self.assertEqual(sorted(i["url"] for i in items), sorted(pages))
        self.assertEqual(self.site.by_client(), {(GOOD_SOURCE, 200): 4})
        # Each request met one 204, waited its Retry-After (whole seconds, at least 1),
        # then got the proxy back: nothing dropped.
        self.assertEqual((stats["proxy_allocator/no_proxy"], stats["proxy_allocator/waits"]),
                         (4, 4))
        self.assertGreaterEqual(stats["proxy_allocator/waited_ms"], 4 * 1000)
        self.assertEqual(stats["proxy_allocator/assigned"], 4)
        self.assertEqual(stats["proxy_allocator/reported/ok"], 4)
        self.assertNotIn("proxy_allocator/gave_up", stats)
        self.assertEqual(self.members(pool)[self.good.url]["assignments"], 4)

    def test_a_download_that_times_out_as_the_crawl_closes_is_reported_and_released(
            self) -> None:
        pool = self.service.create_pool({"policy": "least-in-flight",
                                         "rules": {"allow_private": True}})
        self.service.seed(pool, [self.good.url])
        # The first page closes the crawl (one item); the slow one is still downloading,
        # and times out before the site answers.
        result = self.crawl(pool, [self.site.base + "/slow", self.site.urls(1)[0]],
                            CLOSESPIDER_ITEMCOUNT=1, DOWNLOAD_TIMEOUT=2, RETRY_ENABLED=False)
        stats = result["stats"]
        self.assertEqual([i["url"] for i in result["items"]], self.site.urls(1))
        self.assertEqual(stats["finish_reason"], "closespider_itemcount")
        self.assertEqual(stats["downloader/exception_type_count/scrapy.exceptions."
                               "DownloadTimeoutError"], 1)
        self.assertEqual((stats["proxy_allocator/reported/ok"],
                          stats["proxy_allocator/reported/failed"]), (1, 1))
        self.assertEqual((stats["proxy_allocator/assigned"], stats["proxy_allocator/released"]),
                         (2, 2))
        pool_stats = self.service.stats(pool)
        self.assertEqual((pool_stats["in_flight"], pool_stats["abandoned"]), (0, 0))

    def test_labels_choose_among_the_members_carrying_them_per_setting_and_per_request(
            self) -> None:
        pool = self.service.create_pool({"rules": {"allow_private": True}})
        self.service.seed(pool, [{"member": self.good.url, "labels": {"tier": "a"}},
                                 {"member": self.blocked.url, "labels": {"tier": "b"}}])
        # The setting's labels keep the crawl off the blocking proxy; a request's meta
        # labels replace them.
        result = self.crawl(pool, self.site.urls(3), PROXY_ALLOCATOR_LABELS={"tier": "a"})
        self.assertEqual({(i["status"], i["proxy"]) for i in result["items"]},
                         {(200, self.good.url)})
        self.assertEqual(self.site.by_client(), {(GOOD_SOURCE, 200): 3})
        result = self.crawl(pool, self.site.urls(1), meta={"proxy_allocator_labels": {"tier": "b"}},
                            PROXY_ALLOCATOR_LABELS={"tier": "a"}, RETRY_ENABLED=False)
        self.assertEqual(result["stats"]["proxy_allocator/reported/blocked"], 1)
        self.assertEqual({m: v["assignments"] for m, v in self.members(pool).items()},
                         {self.good.url: 3, self.blocked.url: 1})

    def test_requests_naming_a_session_go_out_through_its_one_proxy_and_others_rotate(
            self) -> None:
        pool = self.service.create_pool({"rules": {"allow_private": True}})
        other = Proxy("127.0.0.4")
        self.addCleanup(other.stop)
        self.service.seed(pool, [self.good.url, other.url])
        result = self.crawl(pool, self.site.urls(6), meta={"proxy_allocator_session": "login-1"})
        self.assertEqual(len(result["items"]), 6)
        # One proxy for the whole session, though least-used would have alternated.
        self.assertEqual(len({i["proxy"] for i in result["items"]}), 1)
        counts = {m: v["assignments"] for m, v in self.members(pool).items()}
        self.assertEqual(sorted(counts.values()), [0, 6])
        # Without a session the crawl rotates again, to the least used first.
        result = self.crawl(pool, self.site.urls(2), CONCURRENT_REQUESTS=1)
        self.assertEqual(sorted(v["assignments"] for v in self.members(pool).values()), [2, 6])

    def test_a_session_s_report_rides_on_its_next_assign_and_a_block_moves_the_session(
            self) -> None:
        pool = self.service.create_pool({"rules": {"allow_private": True}})
        # The blocking proxy is the least used: the session is pinned to it first.
        self.service.seed(pool, [self.blocked.url])
        self.service.admin("POST", "/pools/{}/members".format(pool),
                           {"members": [self.good.url], "assignments": 5})
        pages = self.site.urls(4)
        # One request at a time, and reports never sent alone before the crawl closes:
        # each download's report rides on the next assign, all in the session.
        result = self.crawl(pool, pages, meta={"proxy_allocator_session": "login-2"},
                            CONCURRENT_REQUESTS=1, PROXY_ALLOCATOR_DONE_DELAY=60)
        items, stats = result["items"], result["stats"]
        # The first page's block rode on the next assign, which banned the blocking proxy
        # for the site and moved the session to the good one in the same call; the page
        # was retried through it, as was every other.
        self.assertEqual(sorted(i["url"] for i in items), sorted(pages))
        self.assertEqual({(i["status"], i["proxy"]) for i in items}, {(200, self.good.url)})
        self.assertEqual(self.site.by_client(), {(BLOCKED_SOURCE, 429): 1, (GOOD_SOURCE, 200): 4})
        self.assertEqual((stats["proxy_allocator/assigned"], stats["proxy_allocator/carried"],
                          stats["proxy_allocator/sent_alone"]), (5, 4, 1))
        self.assertEqual((stats["proxy_allocator/reported/blocked"],
                          stats["proxy_allocator/reported/ok"],
                          stats["proxy_allocator/banned"]), (1, 4, 1))
        self.assertEqual({m: v["assignments"] for m, v in self.members(pool).items()},
                         {self.blocked.url: 1, self.good.url: 9})


class OnRedis(CrawlBehaviour):
    on_redis = True


class OnEmbedded(CrawlBehaviour):
    on_redis = False


del CrawlBehaviour


if __name__ == "__main__":
    unittest.main()
