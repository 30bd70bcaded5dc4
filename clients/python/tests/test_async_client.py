"""The asyncio client against the real service (both stores) and, for answers the service
cannot be made to give, against the fake."""

import asyncio
import subprocess
import sys
import textwrap
import threading
import time
import unittest
from collections import Counter, defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar, Dict, List, Optional

from harness import ADMIN, WORKER, RedisServer, Service, free_port
from test_fake_service import P1 as FAKE_P1
from test_fake_service import LEASE_ID, LEASED, NO_CONTENT, RELEASE, FakeService, json_answer
from test_fake_service import leased_carrying
from test_service import OUTCOMES_ROUTE, RELEASE_ROUTE, WORKER_ROUTES

from proxy_allocator import (
    AsyncClient,
    Assignment,
    Done,
    DoneEffect,
    Forbidden,
    NoProxyAvailable,
    NotFound,
    Outcome,
    ProxyAllocatorError,
    Unauthorized,
    Unavailable,
    Unreachable,
)

P1 = "http://p1.example.net:3128"
P2 = "http://p2.example.net:3128"
MEMBERS = ["http://m{}.example.net:3128".format(i) for i in range(7)]
TASKS = 200


class AsyncBehaviour(unittest.IsolatedAsyncioTestCase):
    """Tests that hold on either store (removed from the module below; the subclasses run)."""

    on_redis: ClassVar[bool]
    redis: ClassVar[Optional[RedisServer]]
    service: ClassVar[Service]

    @classmethod
    def setUpClass(cls) -> None:
        cls.redis = RedisServer() if cls.on_redis else None
        cls.service = Service(cls.redis.url if cls.redis else None)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.service.stop()
        if cls.redis is not None:
            cls.redis.stop()

    async def asyncSetUp(self) -> None:
        self.client = AsyncClient(self.service.base, token=WORKER, timeout=10)

    async def asyncTearDown(self) -> None:
        await self.client.aclose()

    def leasing_pool(self, **config: object) -> str:
        return self.service.create_pool(dict({"policy": "least-in-flight"}, **config))

    def member_counts(self, pool: str) -> Dict[str, int]:
        listing = self.service.admin("GET", "/pools/{}/members".format(pool))
        assert listing is not None
        return {m["member"]: m["assignments"] for m in listing["members"]}

    async def test_assign_with_labels_takes_the_least_used_proxy_carrying_them(self) -> None:
        pool = self.service.create_pool()
        self.service.admin("POST", "/pools/{}/members".format(pool), {"members": [
            {"member": P1, "labels": {"country": "de"}},
            {"member": P2, "labels": {"country": "fr"}},
        ]})
        self.assertEqual(await self.client.assign(pool, labels={"country": "fr"}),
                         Assignment(pool=pool, proxy=P2, assignments=1))
        self.assertEqual(await self.client.assign(pool, labels={"country": ["de", "fr"]}),
                         Assignment(pool=pool, proxy=P1, assignments=1))
        self.assertIsNone(await self.client.assign(pool, labels={"country": "us"}))

    async def test_a_blocked_report_with_a_target_bans_the_proxy_for_that_target_only(
            self) -> None:
        pool = self.service.create_pool()
        self.service.seed(pool, [P1, P2])
        outcome = await self.client.report(pool, P1, "blocked", target="shop.example.com")
        self.assertEqual((outcome.effect, outcome.consecutive_failures), ("banned", 0))
        self.assertIsNotNone(outcome.banned_until)
        self.assertEqual(await self.client.assign(pool, target="shop.example.com"),
                         Assignment(pool=pool, proxy=P2, assignments=1))
        self.assertEqual(await self.client.assign(pool),
                         Assignment(pool=pool, proxy=P1, assignments=1))

    async def test_assign_with_exclude_never_hands_out_the_proxies_named(self) -> None:
        pool = self.service.create_pool()
        self.service.seed(pool, [P1, P2])
        self.assertEqual(await self.client.assign(pool, exclude=[P1]),
                         Assignment(pool=pool, proxy=P2, assignments=1))
        self.assertIsNone(await self.client.assign(pool, exclude=[P1, P2]))

    async def test_assign_with_count_returns_distinct_members_in_pick_order(self) -> None:
        pool = self.service.create_pool()
        self.service.seed(pool, [P2, P1])
        self.assertEqual(await self.client.assign(pool, count=3),
                         [Assignment(pool=pool, proxy=P1, assignments=1),
                          Assignment(pool=pool, proxy=P2, assignments=1)])
        self.assertEqual(await self.client.assign(pool, labels={"country": "us"}, count=3), [])

    async def test_done_is_applied_before_the_pick_of_the_same_call(self) -> None:
        pool = self.service.create_pool({"health": {"max_consecutive_failures": 1,
                                                    "cooldown_ms": 90000, "jitter_percent": 0}})
        self.service.seed(pool, [P1, P2])
        await self.client.assign(pool)
        await self.client.assign(pool)
        carried = await self.client.assign(pool, target="shop.example.com",
                                           done=Done(proxy=P1, result="blocked",
                                                     target="shop.example.com"))
        assert isinstance(carried, Assignment) and carried.done is not None
        # Banned for that site only: P1 is still the next pick anywhere else.
        self.assertEqual((carried.proxy, carried.done.effect, carried.done.released),
                         (P2, "banned", False))
        self.assertIsNotNone(carried.done.banned_until)
        other = await self.client.assign(pool, target="news.example.org")
        assert isinstance(other, Assignment)
        self.assertEqual((other.proxy, other.done), (P1, None))

    async def test_a_session_keeps_its_proxy_and_ends_once(self) -> None:
        pool = self.service.create_pool()
        self.service.seed(pool, [P1, P2])
        for count in (1, 2):
            pinned = await self.client.assign(pool, session="s", session_ttl_ms=60000)
            assert isinstance(pinned, Assignment) and pinned.session is not None
            self.assertEqual((pinned.proxy, pinned.assignments, pinned.session.repinned),
                             (P1, count, False))
        await self.client.end_session(pool, "s")
        with self.assertRaises(NotFound) as raised:
            await self.client.end_session(pool, "s")
        self.assertEqual(raised.exception.code, "session_not_found")
        fresh = await self.client.assign(pool, session="s")
        assert isinstance(fresh, Assignment) and fresh.session is not None
        self.assertEqual((fresh.proxy, fresh.session.repinned), (P2, False))

    async def test_assign_returns_the_least_used_proxy_and_none_when_nothing_is_eligible(
            self) -> None:
        pool = self.service.create_pool()
        self.service.seed(pool, [P2, P1])
        self.assertEqual(await self.client.assign(pool),
                         Assignment(pool=pool, proxy=P1, assignments=1))
        self.assertEqual(await self.client.assign(pool),
                         Assignment(pool=pool, proxy=P2, assignments=1))
        self.service.admin("POST", "/pools/{}/members/disable".format(pool),
                           {"members": [P1, P2]})
        self.assertIsNone(await self.client.assign(pool))
        with self.assertRaises(NoProxyAvailable) as raised:
            await self.client.assign(pool, raise_if_empty=True)
        # Nothing is cooling down (an operator disabled both): no Retry-After.
        self.assertEqual((raised.exception.status, raised.exception.retry_after), (204, None))

    async def test_errors_are_the_blocking_clients(self) -> None:
        with self.assertRaises(NotFound) as missing:
            await self.client.assign("no-such-pool")
        self.assertEqual((missing.exception.status, missing.exception.code),
                         (404, "pool_not_found"))
        async with AsyncClient(self.service.base, token="wrong") as stranger:
            with self.assertRaises(Unauthorized):
                await stranger.assign("no-such-pool")

    async def test_report_returns_the_services_answer_and_trips_at_the_threshold(self) -> None:
        pool = self.service.create_pool(
            {"health": {"max_consecutive_failures": 2, "jitter_percent": 0}})
        self.service.seed(pool, [P1])
        first = await self.client.report(pool, P1, "failed", status=502)
        second = await self.client.report(pool, P1, "blocked", status=429)
        self.assertEqual(first, Outcome(proxy=P1, result="failed", effect="counted",
                                        consecutive_failures=1))
        self.assertEqual(second, Outcome(proxy=P1, result="blocked", effect="tripped",
                                         consecutive_failures=2))
        self.assertIsNone(await self.client.assign(pool))

    async def test_release_and_renew_act_on_a_live_lease_only(self) -> None:
        pool = self.leasing_pool()
        self.service.seed(pool, [P1])
        assigned = await self.client.assign(pool)
        assert assigned is not None and assigned.lease is not None
        renewed = await self.client.renew(pool, assigned.lease.id, ttl_ms=5000)
        self.assertEqual((renewed.id, renewed.ttl_ms), (assigned.lease.id, 5000))
        await self.client.release(pool, assigned.lease.id)
        with self.assertRaises(NotFound) as raised:
            await self.client.release(pool, assigned.lease.id)
        self.assertEqual(raised.exception.code, "lease_not_found")
        self.assertEqual(self.service.stats(pool)["in_flight"], 0)

    async def test_a_lease_block_holds_the_lease_and_releases_it_when_it_raises(self) -> None:
        pool = self.leasing_pool(health={"max_consecutive_failures": 1, "jitter_percent": 0})
        self.service.seed(pool, [P1, P2])
        with self.assertRaises(RuntimeError):
            async with self.client.lease(pool, report=True, carry_done=False) as leased:
                self.assertEqual((leased.proxy, leased.in_flight), (P1, 1))
                self.assertEqual(self.service.stats(pool)["in_flight"], 1)
                raise RuntimeError("the target reset the connection")
        stats = self.service.stats(pool)
        self.assertEqual((stats["in_flight"], stats["abandoned"], stats["tripped"]), (0, 0, 1))

    async def test_a_cancelled_lease_block_releases_the_lease_and_reports_nothing(self) -> None:
        pool = self.leasing_pool(health={"max_consecutive_failures": 1, "jitter_percent": 0})
        self.service.seed(pool, [P1])
        entered = asyncio.Event()

        async def hold() -> None:
            async with self.client.lease(pool, renew=True, report=True, carry_done=False):
                entered.set()
                await asyncio.Event().wait()  # until cancelled

        task = asyncio.ensure_future(hold())
        await entered.wait()
        self.assertEqual(self.service.stats(pool)["in_flight"], 1)
        task.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await task
        stats = self.service.stats(pool)
        self.assertEqual((stats["in_flight"], stats["abandoned"], stats["tripped"]), (0, 0, 0))
        self.assertEqual(self.member_states(pool), {P1: "eligible"})

    def member_states(self, pool: str) -> Dict[str, str]:
        listing = self.service.admin("GET", "/pools/{}/members".format(pool))
        assert listing is not None
        return {m["member"]: m["state"] for m in listing["members"]}

    async def test_renewing_as_a_task_keeps_a_lease_alive_past_its_ttl(self) -> None:
        pool = self.leasing_pool()
        self.service.seed(pool, [P1])
        async with self.client.lease(pool, ttl_ms=600, renew=True, carry_done=False) as leased:
            # Time passing is what is tested: three ttls, the sweep runs every 100 ms.
            await asyncio.sleep(1.8)
            stats = self.service.stats(pool)
            self.assertEqual((stats["in_flight"], stats["abandoned"]), (1, 0))
            self.assertGreaterEqual(leased.renewals, 4)
            self.assertIsNone(leased.lost)
        stats = self.service.stats(pool)
        self.assertEqual((stats["in_flight"], stats["abandoned"]), (0, 0))

    async def test_200_concurrent_tasks_keep_the_counts_exact(self) -> None:
        pool = self.service.create_pool()
        self.service.seed(pool, MEMBERS)
        seen: Dict[str, List[int]] = defaultdict(list)

        async def worker() -> None:
            for _ in range(5):
                assigned = await self.client.assign(pool)
                assert assigned is not None
                seen[assigned.proxy].append(assigned.assignments)

        await asyncio.gather(*(worker() for _ in range(TASKS)))
        counts = self.member_counts(pool)
        # 1000 assignments over 7 members, always to the least used: 142 or 143 each.
        self.assertEqual(sorted(counts.values()), [142] + [143] * 6)
        self.assertEqual(sum(counts.values()), TASKS * 5)
        # Every count each member went through was handed out exactly once.
        for member, values in seen.items():
            self.assertEqual(sorted(values), list(range(1, counts[member] + 1)))
        self.assertEqual(self.service.stats(pool)["total_assignments"], TASKS * 5)

    async def test_200_concurrent_lease_blocks_fill_the_pool_exactly_and_free_it(self) -> None:
        pool = self.leasing_pool(max_in_flight=20)
        members = ["http://l{}.example.net:3128".format(i) for i in range(10)]
        self.service.seed(pool, members)
        all_in, checked = asyncio.Event(), asyncio.Event()
        inside: List[str] = []

        async def worker() -> None:
            async with self.client.lease(pool, carry_done=False) as leased:
                inside.append(leased.proxy)
                if len(inside) == TASKS:
                    all_in.set()
                await checked.wait()

        tasks = asyncio.gather(*(worker() for _ in range(TASKS)))
        await asyncio.wait_for(all_in.wait(), 60)
        self.assertEqual(self.service.stats(pool)["in_flight"], TASKS)
        checked.set()
        await tasks
        self.assertEqual(sorted(inside.count(m) for m in members), [20] * 10)
        stats = self.service.stats(pool)
        self.assertEqual((stats["in_flight"], stats["abandoned"]), (0, 0))

    def worker_calls(self, before: "Counter[str]") -> Dict[str, int]:
        """The worker calls the service answered since ``before``, by route."""
        after = self.service.requests()
        return {route: after[route] - before[route] for route in WORKER_ROUTES
                if after[route] != before[route]}

    def in_flight(self, pool: str) -> int:
        return int(self.service.stats(pool)["in_flight"])

    async def test_a_steady_loop_of_lease_blocks_makes_one_call_per_block(self) -> None:
        pool = self.leasing_pool(max_in_flight=1)
        self.service.seed(pool, [P1])
        before = self.service.requests()
        ended = []
        # A delay no cycle of a busy machine outlasts: each end waits for the next block.
        async with AsyncClient(self.service.base, token=WORKER, done_delay=30) as client:
            for cycle in range(20):
                # One place only: each block gets it because its assign released the last.
                async with client.lease(pool, report=True) as leased:
                    self.assertEqual((leased.proxy, leased.in_flight), (P1, 1))
                    self.assertEqual(leased.done, None if cycle == 0 else DoneEffect(
                        released=True, proxy=P1, effect="counted", consecutive_failures=0))
                ended.append(leased)
            self.assertEqual(self.worker_calls(before), {"/pools/{pool}/assign": 20})
            self.assertEqual([leased.reported for leased in ended[:-1]],
                             [Outcome(proxy=P1, result="ok", effect="counted",
                                      consecutive_failures=0)] * 19)
            self.assertEqual(self.in_flight(pool), 1)
        # Leaving the client's block sent the last end alone.
        self.assertEqual(self.in_flight(pool), 0)
        self.assertEqual(self.worker_calls(before), {"/pools/{pool}/assign": 20,
                                                     RELEASE_ROUTE: 1, OUTCOMES_ROUTE: 1})

    async def test_an_assign_naming_a_session_carries_the_end_of_the_last_lease_block(
            self) -> None:
        pool = self.leasing_pool(max_in_flight=1)
        self.service.seed(pool, [P1])
        before = self.service.requests()
        async with AsyncClient(self.service.base, token=WORKER, done_delay=30) as client:
            async with client.lease(pool, report=True) as leased:
                pass
            # One place only: the session gets it because its assign released the lease.
            assigned = await client.assign(pool, session="login")
            assert isinstance(assigned, Assignment)
            assert assigned.session is not None
            self.assertEqual((assigned.proxy, assigned.in_flight, assigned.session.id,
                              assigned.session.repinned, assigned.done),
                             (P1, 1, "login", False, DoneEffect(released=True, proxy=P1,
                                                                effect="counted",
                                                                consecutive_failures=0)))
            self.assertEqual(leased.reported, Outcome(proxy=P1, result="ok",
                                                      effect="counted",
                                                      consecutive_failures=0))
            self.assertEqual(self.worker_calls(before), {"/pools/{pool}/assign": 2})
            self.assertEqual(self.in_flight(pool), 1)

    async def test_a_lease_no_assign_follows_is_released_and_reported_after_the_delay(
            self) -> None:
        pool = self.leasing_pool(health={"max_consecutive_failures": 1, "jitter_percent": 0})
        self.service.seed(pool, [P1, P2])
        before = self.service.requests()
        async with AsyncClient(self.service.base, token=WORKER, done_delay=1.0) as client:
            with self.assertRaises(RuntimeError):
                async with client.lease(pool, report=True) as leased:
                    ended = time.monotonic()
                    raise RuntimeError("the target reset the connection")
            # Held for the delay (a second is far longer than this check takes).
            self.assertEqual(self.in_flight(pool), 1)
            while leased.reported is None:
                self.assertLess(time.monotonic() - ended, 5, "no report within 5 s")
                await asyncio.sleep(0.01)
            self.assertGreaterEqual(time.monotonic() - ended, 1.0)
            self.assertEqual(self.in_flight(pool), 0)
            self.assertEqual(leased.reported, Outcome(proxy=P1, result="failed",
                                                      effect="tripped", consecutive_failures=1))
            self.assertEqual(self.worker_calls(before), {"/pools/{pool}/assign": 1,
                                                         RELEASE_ROUTE: 1, OUTCOMES_ROUTE: 1})

    def run_and_count(self, ending: str, printed: str = "") -> None:
        """Runs a script whose lease block's end is left waiting and which ends with
        ``ending`` (printing ``printed``); checks that the lease was released and reported
        all the same."""
        pool = self.leasing_pool()
        self.service.seed(pool, [P1])
        script = textwrap.dedent("""
            import asyncio, sys
            from proxy_allocator import AsyncClient

            async def main():
                client = AsyncClient(sys.argv[1], token=sys.argv[2], done_delay=60)
                async with client.lease(sys.argv[3], report=True) as leased:
                    print(leased.proxy)
                return client
        """) + textwrap.dedent(ending)
        ran = subprocess.run([sys.executable, "-c", script, self.service.base, WORKER, pool],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual((ran.returncode, ran.stdout), (0, P1 + "\n" + printed), ran.stderr)
        self.assertEqual(self.in_flight(pool), 0)
        listing = self.service.admin("GET", "/pools/{}/members".format(pool))
        assert listing is not None
        [member] = listing["members"]
        self.assertEqual((member["assignments"], member["consecutive_failures"]), (1, 0))
        self.assertEqual(self.service.stats(pool)["abandoned"], 0)

    def test_the_end_of_asyncio_run_releases_the_lease_its_last_block_left(self) -> None:
        # Sent as asyncio.run cancelled the sender, not left to the interpreter's exit.
        self.run_and_count("""
            client = asyncio.run(main())
            print("left waiting:", bool(client._unsent))
        """, "left waiting: False\n")

    def test_the_interpreter_exiting_releases_a_lease_a_closed_loop_left(self) -> None:
        self.run_and_count("""
            loop = asyncio.new_event_loop()
            client = loop.run_until_complete(main())
            loop.run_until_complete(client._http().close())
            loop.close()
        """)

    async def test_sources_lists_each_source_with_its_last_fetch_for_the_admin_only(self) -> None:
        class List(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                body = b"p1.example.net:3128\n"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), List)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        url = "http://127.0.0.1:{}/free.txt".format(server.server_address[1])
        pool = self.service.create_pool({"rules": {"allow_private_sources": True},
                                         "sources": [{"url": url, "interval_ms": 60000}]})
        async with AsyncClient(self.service.base, token=ADMIN) as admin:
            for _ in range(200):
                [source] = await admin.sources(pool)
                if source.last_fetch is not None:
                    break
                await asyncio.sleep(0.05)
            assert source.last_fetch is not None
            self.assertEqual((source.url, source.successes, source.last_fetch.outcome,
                              source.last_fetch.added), (url, 1, "ok", 1))
        with self.assertRaises(Forbidden):
            await self.client.sources(pool)


class OnRedis(AsyncBehaviour):
    on_redis = True


class OnEmbedded(AsyncBehaviour):
    on_redis = False


del AsyncBehaviour


class AgainstTheFake(unittest.IsolatedAsyncioTestCase):
    """Requests as sent, connection reuse, and answers only a fake gives."""

    async def asyncSetUp(self) -> None:
        self.fake = FakeService({
            ("POST", "/pools/browsers/assign"): LEASED,
            ("POST", RELEASE): NO_CONTENT,
            ("POST", "/pools/browsers/outcomes"): json_answer(200, {"outcomes": []}),
            ("POST", "/pools/busy/assign"): json_answer(
                503, {"error": {"code": "store_unavailable", "message": "retry shortly"}},
                {"Retry-After": "7"}),
            ("POST", "/pools/gateway/assign"):
                (502, {"Content-Type": "text/html"}, b"<h1>Bad Gateway</h1>"),
        })
        self.addCleanup(self.fake.stop)
        self.client = AsyncClient(self.fake.base, token="worker-token")

    async def asyncTearDown(self) -> None:
        await self.client.aclose()

    async def test_a_lease_block_sends_assign_release_and_report_over_one_connection(
            self) -> None:
        async with self.client.lease("browsers", ttl_ms=5000, report=True,
                                     carry_done=False) as leased:
            self.assertEqual((leased.proxy, leased.lease.id if leased.lease else None),
                             (FAKE_P1, LEASE_ID))
            leased.report_as("blocked", status=429)
        self.assertEqual(self.fake.calls(), [
            ("/pools/browsers/assign", {"ttl_ms": 5000}),
            (RELEASE, None),
            ("/pools/browsers/outcomes", {"proxy": FAKE_P1, "result": "blocked", "status": 429}),
        ])
        self.assertEqual({r["authorization"] for r in self.fake.requests},
                         {"Bearer worker-token"})
        self.assertEqual(len(set(self.fake.ports)), 1)

    async def test_the_next_lease_carries_the_last_blocks_end_and_aclose_sends_the_rest(
            self) -> None:
        self.fake.stop()
        self.fake = FakeService({
            ("POST", "/pools/browsers/assign"): leased_carrying,
            ("POST", RELEASE): NO_CONTENT,
            ("POST", "/pools/browsers/outcomes"): json_answer(200, {"outcomes": [
                {"proxy": FAKE_P1, "result": "ok", "effect": "counted",
                 "consecutive_failures": 0}]}),
        })
        async with AsyncClient(self.fake.base, done_delay=60) as client:
            async with client.lease("browsers", report=True) as first:
                pass
            async with client.lease("browsers", report=True) as second:
                second.report_as("blocked", status=429)
            self.assertEqual(first.reported, Outcome(proxy=FAKE_P1, result="ok",
                                                     effect="counted", consecutive_failures=0))
            self.assertEqual(second.done, DoneEffect(released=True, proxy=FAKE_P1,
                                                     effect="counted", consecutive_failures=0))
        self.assertEqual(self.fake.calls(), [
            ("/pools/browsers/assign", None),
            ("/pools/browsers/assign", {"done": {"lease": LEASE_ID, "result": "ok"}}),
            (RELEASE, None),
            ("/pools/browsers/outcomes",
             {"proxy": FAKE_P1, "result": "blocked", "status": 429}),
        ])

    async def test_a_cancelled_block_leaves_its_release_to_the_next_assign(self) -> None:
        entered = asyncio.Event()

        async def hold() -> None:
            async with self.client.lease("browsers", report=True):
                entered.set()
                await asyncio.Event().wait()  # until cancelled

        task = asyncio.ensure_future(hold())
        await entered.wait()
        task.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await task
        await self.client.assign("browsers")
        # A cancellation says nothing about the proxy: released, not reported.
        self.assertEqual(self.fake.calls(), [("/pools/browsers/assign", None),
                                             ("/pools/browsers/assign",
                                              {"done": {"lease": LEASE_ID}})])

    async def test_a_connection_idle_for_longer_than_idle_timeout_is_not_reused(self) -> None:
        async with AsyncClient(self.fake.base, idle_timeout=0.2) as client:
            await client.assign("browsers")
            await client.assign("browsers")
            # Time passing is what is tested: longer idle than the client keeps connections.
            await asyncio.sleep(0.5)
            await client.assign("browsers")
        first, second, third = self.fake.ports
        self.assertEqual(first, second)
        self.assertNotEqual(second, third)

    async def test_a_503_carries_its_retry_after_and_a_502_keeps_its_status(self) -> None:
        with self.assertRaises(Unavailable) as busy:
            await self.client.assign("busy")
        self.assertEqual((busy.exception.code, busy.exception.retry_after),
                         ("store_unavailable", 7.0))
        with self.assertRaises(ProxyAllocatorError) as gateway:
            await self.client.assign("gateway")
        self.assertEqual((gateway.exception.status, gateway.exception.code), (502, "http_502"))

    async def test_a_service_that_does_not_answer_raises_unreachable(self) -> None:
        async with AsyncClient("http://127.0.0.1:{}".format(free_port()), timeout=2) as client:
            with self.assertRaises(Unreachable) as raised:
                await client.assign("web")
        self.assertEqual((raised.exception.status, raised.exception.code), (None, "unreachable"))


if __name__ == "__main__":
    unittest.main()
