"""The client against the real service, once on Redis and once on the embedded store."""

import subprocess
import sys
import textwrap
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from collections import Counter
from typing import Any, ClassVar, Dict, Optional

from harness import ADMIN, WORKER, RedisServer, Service, free_port

from proxy_allocator import (
    Assignment,
    Client,
    Done,
    DoneEffect,
    Lease,
    NoProxyAvailable,
    NotFound,
    Forbidden,
    Outcome,
    ProxyAllocatorError,
    Source,
    SourceFetch,
    Unauthorized,
    Unavailable,
    Unreachable,
)

P1 = "http://p1.example.net:3128"
P2 = "http://p2.example.net:3128"

RELEASE_ROUTE = "/pools/{pool}/leases/{lease}/release"
OUTCOMES_ROUTE = "/pools/{pool}/outcomes"
#: The routes a worker calls in a request cycle.
WORKER_ROUTES = ("/pools/{pool}/assign", RELEASE_ROUTE, OUTCOMES_ROUTE)

#: A lease ttl short enough for tests to outlive it, long enough that renewing every third
#: of it survives a busy machine.
SHORT_TTL_MS = 600


class ClientBehaviour(unittest.TestCase):
    """Tests that hold on either store; the subclasses below say which (this class itself is
    removed from the module so that it does not run on its own)."""

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

    def leasing_pool(self, **config: object) -> str:
        """A new least-in-flight pool with ``config`` on top."""
        return self.service.create_pool(dict({"policy": "least-in-flight"}, **config))

    def test_assign_returns_the_least_used_proxy_its_count_and_a_proxies_mapping(self) -> None:
        pool = self.service.create_pool()
        self.service.seed(pool, [P2, P1])
        client = self.service.client()
        self.assertEqual(client.assign(pool), Assignment(pool=pool, proxy=P1, assignments=1))
        second = client.assign(pool)
        self.assertEqual(second, Assignment(pool=pool, proxy=P2, assignments=1))
        assert second is not None
        self.assertEqual(second.proxies, {"http": P2, "https": P2})

    def test_assign_with_labels_takes_the_least_used_proxy_carrying_them(self) -> None:
        pool = self.service.create_pool()
        self.service.admin("POST", "/pools/{}/members".format(pool), {"members": [
            {"member": P1, "labels": {"country": "de"}},
            {"member": P2, "labels": {"country": "fr"}},
        ]})
        client = self.service.client()
        for count in (1, 2):
            self.assertEqual(client.assign(pool, labels={"country": "fr"}),
                             Assignment(pool=pool, proxy=P2, assignments=count))
        self.assertEqual(client.assign(pool, labels={"country": ("de", "fr")}),
                         Assignment(pool=pool, proxy=P1, assignments=1))
        self.assertIsNone(client.assign(pool, labels={"country": "us"}))
        with self.assertRaises(ProxyAllocatorError) as raised:
            client.assign(pool, labels={"country": "d e"})
        self.assertEqual(raised.exception.code, "invalid_request")

    def test_a_blocked_report_with_a_target_bans_the_proxy_for_that_target_only(self) -> None:
        pool = self.service.create_pool()
        self.service.seed(pool, [P1, P2])
        client = self.service.client()
        outcome = client.report(pool, P1, "blocked", 403, target="Shop.Example.com")
        self.assertEqual((outcome.effect, outcome.consecutive_failures), ("banned", 0))
        assert outcome.banned_until is not None
        for count in (1, 2):
            self.assertEqual(client.assign(pool, target="shop.example.com"),
                             Assignment(pool=pool, proxy=P2, assignments=count))
        self.assertEqual(client.assign(pool, target="other.example.org"),
                         Assignment(pool=pool, proxy=P1, assignments=1))
        listing = self.service.admin(
            "GET", "/pools/{}/members?target=shop.example.com".format(pool))
        assert listing is not None
        self.assertEqual({m["member"]: m["banned_until"] for m in listing["members"]},
                         {P1: outcome.banned_until, P2: None})
        with self.assertRaises(ProxyAllocatorError) as raised:
            client.assign(pool, target="https://shop.example.com/")
        self.assertEqual(raised.exception.code, "invalid_request")

    def test_assign_with_exclude_never_hands_out_the_proxies_named(self) -> None:
        pool = self.service.create_pool()
        self.service.seed(pool, [P1, P2])
        client = self.service.client()
        self.assertEqual(client.assign(pool, exclude=[P1]),
                         Assignment(pool=pool, proxy=P2, assignments=1))
        self.assertIsNone(client.assign(pool, exclude=(P1, P2)))
        self.assertEqual(client.assign(pool, count=2, exclude=[P2]),
                         [Assignment(pool=pool, proxy=P1, assignments=1)])
        with self.assertRaises(TypeError):
            client.assign(pool, exclude=P1)

    def test_assign_with_count_returns_distinct_members_in_pick_order(self) -> None:
        pool = self.service.create_pool()
        self.service.seed(pool, [P2, P1])
        client = self.service.client()
        self.assertEqual(client.assign(pool, count=5),
                         [Assignment(pool=pool, proxy=P1, assignments=1),
                          Assignment(pool=pool, proxy=P2, assignments=1)])
        leasing = self.leasing_pool(max_in_flight=1)
        self.service.seed(leasing, [P1, P2])
        batch = client.assign(leasing, count=2)
        assert isinstance(batch, list)
        self.assertEqual([a.proxy for a in batch], [P1, P2])
        self.assertEqual(len({a.lease.id for a in batch if a.lease is not None}), 2)
        self.assertEqual(client.assign(leasing, count=2), [])

    def test_a_session_keeps_its_proxy_moves_when_it_is_disabled_and_ends_once(self) -> None:
        pool = self.service.create_pool()
        self.service.seed(pool, [P1, P2])
        client = self.service.client()
        first = client.assign(pool, session="login/1", session_ttl_ms=60000)
        assert isinstance(first, Assignment) and first.session is not None
        self.assertEqual((first.proxy, first.assignments), (P1, 1))
        self.assertEqual((first.session.id, first.session.repinned), ("login/1", False))
        again = client.assign(pool, session="login/1")
        assert isinstance(again, Assignment) and again.session is not None
        self.assertEqual((again.proxy, again.assignments, again.session.repinned),
                         (P1, 2, False))
        self.service.admin("POST", "/pools/{}/members/disable".format(pool), {"members": [P1]})
        moved = client.assign(pool, session="login/1")
        assert isinstance(moved, Assignment) and moved.session is not None
        self.assertEqual((moved.proxy, moved.session.repinned), (P2, True))
        self.assertIsNone(client.assign(pool).session)  # type: ignore[union-attr]
        client.end_session(pool, "login/1")
        with self.assertRaises(NotFound) as raised:
            client.end_session(pool, "login/1")
        self.assertEqual(raised.exception.code, "session_not_found")
        with self.assertRaises(ProxyAllocatorError) as raised_bad:
            client.assign(pool, session="with space")
        self.assertEqual(raised_bad.exception.code, "invalid_request")

    def test_done_reports_the_last_request_and_releases_its_lease_before_the_pick(
            self) -> None:
        pool = self.service.create_pool({"health": {"max_consecutive_failures": 1,
                                                    "cooldown_ms": 90000, "jitter_percent": 0}})
        self.service.seed(pool, [P1, P2])
        client = self.service.client()
        client.assign(pool)
        client.assign(pool)
        # Tied at one each: P1 would be next, but the failure carried with this assign takes
        # it out first.
        carried = client.assign(pool, done=Done(proxy=P1, result="failed", status=502))
        self.assertEqual(carried, Assignment(
            pool=pool, proxy=P2, assignments=2,
            done=DoneEffect(released=False, proxy=P1, effect="tripped", consecutive_failures=1)))
        unknown = client.assign(pool, done=Done(proxy="http://nobody.example.net:1", result="ok"))
        assert isinstance(unknown, Assignment)
        self.assertEqual((unknown.proxy, unknown.done), (P2, DoneEffect(released=False,
                                                                        effect="unknown")))
        with self.assertRaises(ValueError):
            client.assign(pool, done=Done(result="ok"))

        leased = self.service.create_pool({"policy": "least-in-flight", "max_in_flight": 1})
        self.service.seed(leased, [P1])
        first = client.assign(leased)
        assert isinstance(first, Assignment) and first.lease is not None
        self.assertIsNone(client.assign(leased))
        following = client.assign(leased, done=Done(lease=first.lease.id, result="ok"))
        assert isinstance(following, Assignment)
        self.assertEqual((following.proxy, following.in_flight, following.done),
                         (P1, 1, DoneEffect(released=True, proxy=P1, effect="counted",
                                            consecutive_failures=0)))
        self.assertIsNone(client.assign(leased, done=Done(lease=first.lease.id)))

    def test_assign_returns_none_when_every_member_is_disabled(self) -> None:
        pool = self.service.create_pool()
        self.service.seed(pool, [P1])
        self.service.admin("POST", "/pools/{}/members/disable".format(pool),
                           {"members": [P1], "reason": "timeouts"})
        self.assertIsNone(self.service.client().assign(pool))

    def test_assign_can_raise_no_proxy_available_with_the_wait_until_the_first_return(
            self) -> None:
        pool = self.service.create_pool(
            {"health": {"max_consecutive_failures": 1, "cooldown_ms": 90000,
                        "jitter_percent": 0}})
        self.service.seed(pool, [P1])
        client = self.service.client()
        client.report(pool, P1, "blocked", status=429)
        self.assertIsNone(client.assign(pool))
        with self.assertRaises(NoProxyAvailable) as raised:
            client.assign(pool, raise_if_empty=True)
        # 90 s from the trip, rounded up to whole seconds by the service.
        self.assertIn(raised.exception.retry_after, (89.0, 90.0))
        self.assertEqual(raised.exception.pool, pool)

    def test_assign_on_a_missing_pool_raises_not_found_with_the_servers_code(self) -> None:
        with self.assertRaises(NotFound) as raised:
            self.service.client().assign("no-such-pool")
        error = raised.exception
        self.assertEqual((error.status, error.code, error.message),
                         (404, "pool_not_found", "pool not found"))

    def test_worker_and_admin_tokens_may_assign_and_others_are_unauthorized(self) -> None:
        pool = self.service.create_pool()
        self.service.seed(pool, [P1])
        self.assertEqual(self.service.client(WORKER).assign(pool),
                         Assignment(pool=pool, proxy=P1, assignments=1))
        self.assertEqual(self.service.client(ADMIN).assign(pool),
                         Assignment(pool=pool, proxy=P1, assignments=2))
        for token in ("wrong-token", None):
            with self.assertRaises(Unauthorized) as raised:
                self.service.client(token).assign(pool)
            self.assertEqual((raised.exception.status, raised.exception.code),
                             (401, "unauthorized"))

    def test_assign_on_a_least_in_flight_pool_returns_in_flight_and_the_lease(self) -> None:
        pool = self.leasing_pool(lease_ttl_ms=45000)
        self.service.seed(pool, [P1])
        assigned = self.service.client().assign(pool)
        assert assigned is not None and assigned.lease is not None
        self.assertEqual((assigned.proxy, assigned.in_flight, assigned.assignments,
                          assigned.lease.ttl_ms), (P1, 1, 1, 45000))
        self.assertEqual(len(assigned.lease.id), 32)

    def test_release_and_renew_act_on_a_live_lease_and_refuse_a_released_one(self) -> None:
        pool = self.leasing_pool()
        self.service.seed(pool, [P1])
        client = self.service.client()
        assigned = client.assign(pool)
        assert assigned is not None and assigned.lease is not None
        renewed = client.renew(pool, assigned.lease.id, ttl_ms=5000)
        self.assertIsInstance(renewed, Lease)
        self.assertEqual((renewed.id, renewed.ttl_ms), (assigned.lease.id, 5000))
        client.release(pool, assigned.lease.id)
        self.assertEqual(self.service.stats(pool)["in_flight"], 0)
        with self.assertRaises(NotFound) as raised:
            client.release(pool, assigned.lease.id)
        self.assertEqual(raised.exception.code, "lease_not_found")

    def member_states(self, pool: str) -> dict:
        listing = self.service.admin("GET", "/pools/{}/members".format(pool))
        assert listing is not None
        return {m["member"]: (m["state"], m.get("reason")) for m in listing["members"]}

    def test_reported_failures_take_a_proxy_out_at_the_pools_threshold(self) -> None:
        pool = self.service.create_pool(
            {"health": {"max_consecutive_failures": 2, "jitter_percent": 0}})
        self.service.seed(pool, [P1, P2])
        client = self.service.client()
        self.assertEqual(client.report(pool, P1, "failed", status=502),
                         Outcome(proxy=P1, result="failed", effect="counted",
                                 consecutive_failures=1))
        self.assertEqual(self.member_states(pool)[P1], ("eligible", None))
        self.assertEqual(client.report(pool, P1, "failed"),
                         Outcome(proxy=P1, result="failed", effect="tripped",
                                 consecutive_failures=2))
        self.assertEqual(self.member_states(pool)[P1], ("ineligible", "unhealthy"))
        # Reports never change counts: P2 (0) is next, then P2 again, since P1 is out.
        self.assertEqual([client.assign(pool).proxy for _ in range(2)], [P2, P2])

    def test_report_returns_what_the_service_did_with_the_report(self) -> None:
        pool = self.service.create_pool(
            {"health": {"max_consecutive_failures": 1, "jitter_percent": 0}})
        self.service.seed(pool, [P1, P2])
        client = self.service.client()
        # Written as a list would have it; the answer names the member as the pool has it.
        self.assertEqual(client.report(pool, "p2.example.net:3128", "ok"),
                         Outcome(proxy=P2, result="ok", effect="counted",
                                 consecutive_failures=0))
        self.assertEqual(client.report(pool, P1, "blocked", status=403),
                         Outcome(proxy=P1, result="blocked", effect="tripped",
                                 consecutive_failures=1))
        # Out of the eligible set, P1's later reports change nothing.
        self.assertEqual(client.report(pool, P1, "ok"),
                         Outcome(proxy=P1, result="ok", effect="ignored",
                                 consecutive_failures=1))
        self.assertEqual(client.report(pool, "http://p9.example.net:3128", "failed"),
                         Outcome(proxy="http://p9.example.net:3128", result="failed",
                                 effect="unknown", consecutive_failures=None))
        self.assertEqual(client.report(pool, "bad id", "failed"),
                         Outcome(proxy="bad id", result="failed", effect="rejected",
                                 consecutive_failures=None, reason="invalid_characters"))

    def test_a_lease_that_reports_marks_the_proxy_failed_when_the_block_raises(self) -> None:
        pool = self.leasing_pool(health={"max_consecutive_failures": 1, "jitter_percent": 0})
        self.service.seed(pool, [P1, P2])
        with self.assertRaises(RuntimeError):
            with self.service.client(carry_done=False).lease(pool, report=True) as leased:
                self.assertEqual(leased.proxy, P1)
                raise RuntimeError("connection reset by the target")
        self.assertEqual(leased.reported, Outcome(proxy=P1, result="failed", effect="tripped",
                                                  consecutive_failures=1))
        self.assertEqual(self.member_states(pool)[P1], ("ineligible", "unhealthy"))
        self.assertEqual(self.service.stats(pool)["in_flight"], 0)

    def test_a_lease_is_held_in_the_block_and_released_when_it_ends(self) -> None:
        pool = self.leasing_pool()
        self.service.seed(pool, [P1])
        with self.service.client(carry_done=False).lease(pool) as leased:
            self.assertEqual((leased.proxy, leased.in_flight), (P1, 1))
            self.assertEqual(self.service.stats(pool)["in_flight"], 1)
        self.assertEqual(self.service.stats(pool)["in_flight"], 0)

    def test_a_lease_is_released_when_the_block_raises(self) -> None:
        pool = self.leasing_pool(max_in_flight=1)
        self.service.seed(pool, [P1])
        client = self.service.client(carry_done=False)
        with self.assertRaises(RuntimeError):
            with client.lease(pool):
                raise RuntimeError("the target timed out")
        stats = self.service.stats(pool)
        self.assertEqual((stats["in_flight"], stats["abandoned"]), (0, 0))
        # The only place is free again: the next lease gets it.
        with client.lease(pool) as leased:
            self.assertEqual((leased.proxy, leased.in_flight), (P1, 1))

    def test_a_lease_raises_no_proxy_available_when_every_member_is_at_its_cap(self) -> None:
        pool = self.leasing_pool(max_in_flight=1)
        self.service.seed(pool, [P1])
        client = self.service.client()
        with client.lease(pool):
            with self.assertRaises(NoProxyAvailable) as raised:
                with client.lease(pool):
                    pass  # pragma: no cover - never entered
            self.assertEqual((raised.exception.status, raised.exception.code),
                             (204, "no_proxy_available"))
            self.assertEqual(self.service.stats(pool)["in_flight"], 1)

    def test_a_lease_on_a_least_used_pool_is_refused(self) -> None:
        pool = self.service.create_pool()
        self.service.seed(pool, [P1])
        with self.assertRaises(ProxyAllocatorError) as raised:
            with self.service.client().lease(pool):
                pass  # pragma: no cover - never entered
        self.assertEqual(raised.exception.code, "no_lease")

    def test_renewing_in_the_background_keeps_a_lease_alive_past_its_ttl(self) -> None:
        pool = self.leasing_pool()
        self.service.seed(pool, [P1])
        with self.service.client(carry_done=False).lease(pool, ttl_ms=SHORT_TTL_MS,
                                                         renew=True) as leased:
            assert leased.lease is not None
            first_expiry = leased.lease.expires_at
            # Time passing is what is tested: three ttls, while the sweep runs every 100 ms.
            time.sleep(3 * SHORT_TTL_MS / 1000)
            stats = self.service.stats(pool)
            self.assertEqual((stats["in_flight"], stats["abandoned"]), (1, 0))
            self.assertGreaterEqual(leased.renewals, 6)
            self.assertIsNone(leased.lost)
            self.assertEqual(leased.lease.ttl_ms, SHORT_TTL_MS)
            # RFC 3339 timestamps in one zone and format order as text.
            self.assertGreater(leased.lease.expires_at, first_expiry)
        stats = self.service.stats(pool)
        self.assertEqual((stats["in_flight"], stats["abandoned"]), (0, 0))

    def test_a_lease_that_is_not_renewed_is_reclaimed_and_its_exit_does_not_raise(self) -> None:
        pool = self.leasing_pool()
        self.service.seed(pool, [P1])
        with self.assertLogs("proxy_allocator", "WARNING") as logs:
            with self.service.client(carry_done=False).lease(pool,
                                                             ttl_ms=SHORT_TTL_MS) as leased:
                time.sleep(3 * SHORT_TTL_MS / 1000)
                self.assertEqual(leased.renewals, 0)
        self.assertEqual(logs.output, [
            "WARNING:proxy_allocator:lease release failed: no such live lease in this pool "
            "(lease_not_found, HTTP 404)"])
        stats = self.service.stats(pool)
        self.assertEqual((stats["in_flight"], stats["abandoned"]), (0, 1))

    def worker_calls(self, before: "Counter[str]") -> Dict[str, int]:
        """The worker calls the service answered since ``before``, by route."""
        after = self.service.requests()
        return {route: after[route] - before[route] for route in WORKER_ROUTES
                if after[route] != before[route]}

    def in_flight(self, pool: str) -> int:
        return int(self.service.stats(pool)["in_flight"])

    def test_a_steady_loop_of_lease_blocks_makes_one_call_per_block(self) -> None:
        pool = self.leasing_pool(max_in_flight=1)
        self.service.seed(pool, [P1])
        # A delay no cycle of a busy machine outlasts: each end waits for the next block.
        client = self.service.client(done_delay=30)
        self.addCleanup(client.close)
        before = self.service.requests()
        ended = []
        for cycle in range(20):
            # One place only: each block gets it because its assign released the last one.
            with client.lease(pool, report=True) as leased:
                self.assertEqual((leased.proxy, leased.in_flight), (P1, 1))
                self.assertEqual(leased.done, None if cycle == 0 else DoneEffect(
                    released=True, proxy=P1, effect="counted", consecutive_failures=0))
            ended.append(leased)
        self.assertEqual(self.worker_calls(before), {"/pools/{pool}/assign": 20})
        self.assertEqual([leased.reported for leased in ended[:-1]],
                         [Outcome(proxy=P1, result="ok", effect="counted",
                                  consecutive_failures=0)] * 19)
        self.assertEqual(self.in_flight(pool), 1)
        client.close()
        self.assertEqual(self.in_flight(pool), 0)
        self.assertEqual(self.worker_calls(before), {"/pools/{pool}/assign": 20,
                                                     RELEASE_ROUTE: 1, OUTCOMES_ROUTE: 1})
        self.assertEqual(self.service.stats(pool)["total_assignments"], 20)

    def test_an_assign_naming_a_session_carries_the_end_of_the_last_lease_block(
            self) -> None:
        pool = self.leasing_pool(max_in_flight=1)
        self.service.seed(pool, [P1])
        client = self.service.client(done_delay=30)
        self.addCleanup(client.close)
        before = self.service.requests()
        with client.lease(pool, report=True) as leased:
            pass
        # One place only: the session gets it because its assign released the block's lease.
        assigned = client.assign(pool, session="login")
        assert isinstance(assigned, Assignment)
        assert assigned.session is not None
        self.assertEqual((assigned.proxy, assigned.in_flight, assigned.session.id,
                          assigned.session.repinned, assigned.done),
                         (P1, 1, "login", False, DoneEffect(released=True, proxy=P1,
                                                            effect="counted",
                                                            consecutive_failures=0)))
        self.assertEqual(leased.reported, Outcome(proxy=P1, result="ok", effect="counted",
                                                  consecutive_failures=0))
        self.assertEqual(self.worker_calls(before), {"/pools/{pool}/assign": 2})
        self.assertEqual(self.in_flight(pool), 1)

    def test_a_lease_no_assign_follows_is_released_and_reported_after_the_delay(
            self) -> None:
        pool = self.leasing_pool(health={"max_consecutive_failures": 1, "jitter_percent": 0})
        self.service.seed(pool, [P1, P2])
        client = self.service.client(done_delay=1.0)
        self.addCleanup(client.close)
        before = self.service.requests()
        with self.assertRaises(RuntimeError):
            with client.lease(pool, report=True) as leased:
                ended = time.monotonic()
                raise RuntimeError("the target reset the connection")
        # Held for the delay (a second is far longer than this check takes), then released.
        self.assertEqual(self.in_flight(pool), 1)
        self.service.wait_until(lambda: self.in_flight(pool) == 0, "no release")
        self.assertGreaterEqual(time.monotonic() - ended, 1.0)
        self.service.wait_until(lambda: leased.reported is not None, "no report")
        self.assertEqual(leased.reported, Outcome(proxy=P1, result="failed", effect="tripped",
                                                  consecutive_failures=1))
        self.assertEqual(self.worker_calls(before), {"/pools/{pool}/assign": 1,
                                                     RELEASE_ROUTE: 1, OUTCOMES_ROUTE: 1})

    def test_closing_the_client_releases_the_lease_its_last_block_left(self) -> None:
        pool = self.leasing_pool()
        self.service.seed(pool, [P1])
        with self.service.client(done_delay=60) as client:
            with client.lease(pool):
                pass
            self.assertEqual(self.in_flight(pool), 1)
        self.assertEqual(self.in_flight(pool), 0)
        stats = self.service.stats(pool)
        self.assertEqual((stats["total_assignments"], stats["abandoned"]), (1, 0))

    def test_the_interpreter_exiting_releases_the_lease_its_last_block_left(self) -> None:
        pool = self.leasing_pool()
        self.service.seed(pool, [P1])
        script = textwrap.dedent("""
            import sys
            from proxy_allocator import Client

            client = Client(sys.argv[1], token=sys.argv[2], done_delay=60)
            with client.lease(sys.argv[3], report=True) as leased:
                print(leased.proxy)
        """)
        ran = subprocess.run([sys.executable, "-c", script, self.service.base, WORKER, pool],
                             capture_output=True, text=True, timeout=30, check=True)
        self.assertEqual((ran.stdout, ran.stderr), (P1 + "\n", ""))
        self.assertEqual(self.in_flight(pool), 0)
        self.assertEqual(self.member_counts(pool), {P1: (1, 0)})

    def member_counts(self, pool: str) -> Dict[str, Any]:
        listing = self.service.admin("GET", "/pools/{}/members".format(pool))
        assert listing is not None
        return {m["member"]: (m["assignments"], m["consecutive_failures"])
                for m in listing["members"]}

    def test_sources_lists_each_source_with_its_last_fetch_for_the_admin_only(self) -> None:
        class List(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                body = b"p1.example.net:3128\nnot a proxy\n"
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
        admin = self.service.client(ADMIN)
        deadline = time.monotonic() + 10
        while admin.sources(pool)[0].last_fetch is None:
            self.assertLess(time.monotonic(), deadline, "no fetch within 10 s")
            time.sleep(0.05)
        [source] = admin.sources(pool)
        assert source.last_fetch is not None
        self.assertEqual(source, Source(
            url=url, interval_ms=60000, format="lines", default_scheme="http",
            next_fetch_at=source.next_fetch_at, failures=0, successes=1,
            last_fetch=SourceFetch(at=source.last_fetch.at, outcome="ok", accepted=1,
                                   added=1, existing=0, duplicates=0, rejected=1)))
        self.assertIsNotNone(source.next_fetch_at)
        with self.assertRaises(Forbidden):
            self.service.client().sources(pool)


class OnRedis(ClientBehaviour):
    """The client against the service on Redis."""

    on_redis = True


class OnEmbedded(ClientBehaviour):
    """The client against the service on its embedded store."""

    on_redis = False


del ClientBehaviour


class Outages(unittest.TestCase):
    """Answers a worker gets when the store or the service is gone."""

    def test_assign_raises_unavailable_with_retry_after_when_redis_is_stopped(self) -> None:
        redis = RedisServer()
        service = Service(redis.url)
        try:
            pool = service.create_pool()
            service.seed(pool, [P1])
            redis.stop()
            with self.assertRaises(Unavailable) as raised:
                service.client().assign(pool)
            error = raised.exception
            self.assertEqual(type(error), Unavailable)
            self.assertEqual((error.status, error.code, error.retry_after),
                             (503, "store_unavailable", 1.0))
        finally:
            service.stop()
            redis.stop()

    def test_a_service_that_does_not_answer_raises_unreachable(self) -> None:
        client = Client("http://127.0.0.1:{}".format(free_port()), token=WORKER, timeout=2)
        with self.assertRaises(Unreachable) as raised:
            client.assign("web")
        self.assertEqual((raised.exception.status, raised.exception.code,
                          raised.exception.retry_after), (None, "unreachable", None))
        self.assertIsInstance(raised.exception, Unavailable)


if __name__ == "__main__":
    unittest.main()
