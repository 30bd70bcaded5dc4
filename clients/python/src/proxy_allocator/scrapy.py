"""A Scrapy downloader middleware: every request goes out through a proxy of the pool.

Install with ``pip install 'proxy-allocator[scrapy]'`` and enable it in ``settings.py``::

    DOWNLOADER_MIDDLEWARES = {"proxy_allocator.scrapy.ProxyAllocatorMiddleware": 740}
    PROXY_ALLOCATOR_URL = "http://127.0.0.1:8080"
    PROXY_ALLOCATOR_POOL = "web"
    PROXY_ALLOCATOR_TOKEN = "worker-token"      # when the service has a worker token
    PROXY_ALLOCATOR_LABELS = {"country": "de"}  # optional: only members carrying these

Before each download it assigns a member (through the asyncio client, so the reactor never
waits) and sets ``request.meta["proxy"]``; after it, it reports ``ok``, ``blocked`` (the
statuses in ``PROXY_ALLOCATOR_BLOCKED_CODES``) or ``failed`` (a download exception) and
releases the lease, if the pool gave one: by default both ride on the next request's assign
to the same pool (the assign's ``done``: one call and one store step per request instead of
two), or go alone after ``PROXY_ALLOCATOR_DONE_DELAY`` seconds (0.5) when no assign comes
first, and at the latest when the spider closes (``PROXY_ALLOCATOR_CARRY_DONE = False``
sends each at once). The request's host is the assign's and the
report's ``target``: a site that blocks a proxy bans it for that site only, and the pool's
per-target pacing applies (``PROXY_ALLOCATOR_PER_TARGET = False`` sends no target, so a
block takes the proxy out for every site). A 204 (no proxy right now) or a 503 makes the
request wait the service's ``Retry-After`` and ask again, up to ``PROXY_ALLOCATOR_MAX_WAIT``
seconds in all. A 401, 403 or 404 from the service (a wrong token, a pool it does not
know) fails every request alike: the middleware closes the spider with the reason
``proxy_allocator_<code>`` (``proxy_allocator_unauthorized``,
``proxy_allocator_pool_not_found``, ...) unless ``PROXY_ALLOCATOR_CLOSE_ON_ERROR = False``,
which drops each such request on its own and crawls on. Priority 740 puts it before Scrapy's ``HttpProxyMiddleware`` (750), which
turns the proxy's credentials into a ``Proxy-Authorization`` header, and after
``RetryMiddleware`` (550), so that a retried request gets a proxy of its own.
"""

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Deque, Dict, FrozenSet, Optional, Tuple

from scrapy import Request, Spider, signals
from scrapy.crawler import Crawler
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.reactor import is_asyncio_reactor_installed

from .aio import AsyncClient
from .client import DEFAULT_TIMEOUT, Done, DoneEffect
from .errors import (Forbidden, NoProxyAvailable, NotFound, ProxyAllocatorError,
                     Unauthorized, Unavailable)

logger = logging.getLogger("proxy_allocator.scrapy")

#: Statuses reported as ``blocked`` unless ``PROXY_ALLOCATOR_BLOCKED_CODES`` says otherwise.
DEFAULT_BLOCKED_CODES = (403, 429)
#: Seconds a request waits in all for a proxy before it is dropped (``IgnoreRequest``).
DEFAULT_MAX_WAIT = 600.0
#: Seconds to wait after a 204 or 503 that names no ``Retry-After``.
DEFAULT_EMPTY_WAIT = 1.0

#: Per-request keys of ``request.meta``.
META_POOL = "proxy_allocator_pool"
META_TARGET = "proxy_allocator_target"
META_LABELS = "proxy_allocator_labels"
META_SESSION = "proxy_allocator_session"
META_SKIP = "proxy_allocator_skip"
#: Set by the middleware: the member id the request went out through.
META_PROXY = "proxy_allocator_proxy"
_META_USED = "_proxy_allocator_used"

META_SESSION_TTL_MS = "proxy_allocator_session_ttl_ms"


@dataclass
class _Used:
    """What one download was given: kept in ``request.meta`` until its outcome is known."""

    pool: str
    proxy: str
    lease_id: Optional[str]
    target: Optional[str]


#: Seconds a finished download's report and release wait for an assign to carry them.
DEFAULT_DONE_DELAY = 0.5


@dataclass
class _Finished:
    """A download whose report (``result``, ``status``) and lease release are still to be
    sent: with the next assign to its pool, or alone once ``due`` (monotonic seconds)."""

    used: _Used
    result: Optional[str]
    status: Optional[int]
    due: float

    def done(self) -> Done:
        """The assign's ``done`` that reports and releases it."""
        return Done(proxy=self.used.proxy, result=self.result, status=self.status,
                    target=self.used.target if self.result is not None else None,
                    lease=self.used.lease_id)


class ProxyAllocatorMiddleware:
    """The downloader middleware; see the module's documentation for its settings.

    Per request, ``request.meta`` may name another pool (``proxy_allocator_pool``), labels
    (``proxy_allocator_labels``, instead of ``PROXY_ALLOCATOR_LABELS``), the target
    (``proxy_allocator_target``; by default the request's host), a sticky session
    (``proxy_allocator_session``, with ``proxy_allocator_session_ttl_ms``: every request
    naming it goes out through the same proxy while that proxy stays eligible for it), or
    skip the middleware (``proxy_allocator_skip``).
    """

    def __init__(self, crawler: Crawler) -> None:
        settings = crawler.settings
        url = settings.get("PROXY_ALLOCATOR_URL")
        pool = settings.get("PROXY_ALLOCATOR_POOL")
        if not url or not pool:
            # Raised, not NotConfigured: a disabled middleware would send every request
            # straight from the crawler's own address.
            raise ValueError("ProxyAllocatorMiddleware needs PROXY_ALLOCATOR_URL and "
                             "PROXY_ALLOCATOR_POOL")
        if not is_asyncio_reactor_installed():
            raise ValueError("ProxyAllocatorMiddleware needs Scrapy's asyncio reactor: "
                             "TWISTED_REACTOR = 'twisted.internet.asyncioreactor."
                             "AsyncioSelectorReactor'")
        self.pool: str = pool
        self.blocked_codes: FrozenSet[int] = frozenset(
            int(code) for code in settings.getlist("PROXY_ALLOCATOR_BLOCKED_CODES",
                                                   list(DEFAULT_BLOCKED_CODES)))
        self.max_wait = settings.getfloat("PROXY_ALLOCATOR_MAX_WAIT", DEFAULT_MAX_WAIT)
        self.empty_wait = settings.getfloat("PROXY_ALLOCATOR_EMPTY_WAIT", DEFAULT_EMPTY_WAIT)
        ttl = settings.get("PROXY_ALLOCATOR_LEASE_TTL_MS")
        self.lease_ttl_ms: Optional[int] = None if ttl is None else int(ttl)
        labels = settings.getdict("PROXY_ALLOCATOR_LABELS")
        self.labels: Optional[Dict[str, Any]] = labels or None
        self.per_target = settings.getbool("PROXY_ALLOCATOR_PER_TARGET", True)
        self.stats = crawler.stats
        self.crawler = crawler
        self.close_on_error = settings.getbool("PROXY_ALLOCATOR_CLOSE_ON_ERROR", True)
        self._closing = False
        self.client = AsyncClient(
            url, token=settings.get("PROXY_ALLOCATOR_TOKEN"),
            timeout=settings.getfloat("PROXY_ALLOCATOR_TIMEOUT", DEFAULT_TIMEOUT),
            max_connections=max(settings.getint("CONCURRENT_REQUESTS", 16), 1))
        # Leases not yet released, so that a download that never comes back (cancelled
        # when the spider closes) still gets its lease released.
        self._live: Dict[str, _Used] = {}
        self.carry = settings.getbool("PROXY_ALLOCATOR_CARRY_DONE", True)
        self.done_delay = settings.getfloat("PROXY_ALLOCATOR_DONE_DELAY", DEFAULT_DONE_DELAY)
        # Finished downloads per pool, oldest first, waiting for an assign to carry them.
        self._finished: Dict[str, Deque[_Finished]] = {}
        self._sender: Optional["asyncio.Task[None]"] = None
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> "ProxyAllocatorMiddleware":
        """Scrapy's constructor hook."""
        return cls(crawler)

    def _inc(self, key: str, count: int = 1) -> None:
        assert self.stats is not None
        self.stats.inc_value("proxy_allocator/" + key, count)

    async def process_request(self, request: Request,
                              spider: Optional[Spider] = None) -> None:
        """Assigns a proxy to the request, waiting out 204s and 503s."""
        meta = request.meta
        if meta.get(META_SKIP):
            return None
        pool = meta.get(META_POOL) or self.pool
        labels = meta.get(META_LABELS, self.labels)
        target = None
        if self.per_target:
            target = meta.get(META_TARGET) or urlparse_cached(request).hostname or None
        waited = 0.0
        session = meta.get(META_SESSION)
        while True:
            # In a session too: the service applies the done first, so a report that takes
            # the session's proxy out moves the session to another in the same call.
            carried = self._take_finished(pool)
            try:
                assigned = await self.client.assign(
                    pool, self.lease_ttl_ms, labels=labels, target=target,
                    session=session,
                    session_ttl_ms=meta.get(META_SESSION_TTL_MS),
                    done=None if carried is None else carried.done(), raise_if_empty=True)
                if carried is not None:
                    self._count_done(carried, assigned.done if assigned is not None else None)
                break
            except NoProxyAvailable as empty:
                if carried is not None:
                    # A 204 applies the done all the same, but says nothing of what it did.
                    self._count_done(carried, None)
                self._inc("no_proxy")
                wait = empty.retry_after or self.empty_wait
                logger.debug("no proxy in pool %r right now, waiting %s s", pool, wait)
            except (Unauthorized, Forbidden, NotFound) as refused:
                if carried is not None:
                    self._put_back(carried)
                self._refused(pool, refused)
            except Unavailable as down:
                if carried is not None:
                    self._put_back(carried)
                self._inc("unavailable")
                wait = down.retry_after or self.empty_wait
                logger.warning("no proxy from pool %r (%s), waiting %s s", pool, down, wait)
            if waited + wait > self.max_wait:
                self._inc("gave_up")
                raise IgnoreRequest("no proxy in pool {!r} within {} s".format(
                    pool, self.max_wait))
            self._inc("waits")
            self._inc("waited_ms", round(wait * 1000))
            await asyncio.sleep(wait)
            waited += wait
        assert assigned is not None
        lease_id = None if assigned.lease is None else assigned.lease.id
        used = _Used(pool=pool, proxy=assigned.proxy, lease_id=lease_id, target=target)
        if lease_id is not None:
            self._live[lease_id] = used
        self._inc("assigned")
        if "://" not in assigned.proxy:
            await self._finish(used, None, None)
            raise ValueError("member {!r} of pool {!r} is not a proxy URL".format(
                assigned.proxy, pool))
        meta[_META_USED] = used
        meta[META_PROXY] = assigned.proxy
        meta["proxy"] = assigned.proxy
        return None

    def _refused(self, pool: str, error: ProxyAllocatorError) -> None:
        """An assign the service refused (401, 403, 404): every other request would meet
        the same answer, so the spider closes with the error's code as its reason (once),
        unless ``PROXY_ALLOCATOR_CLOSE_ON_ERROR`` is off. Raises ``IgnoreRequest`` either
        way: the request must not go out without a proxy."""
        reason = "proxy_allocator_" + error.code
        if self.close_on_error and not self._closing:
            self._closing = True
            logger.error("pool %r: %s; closing the spider (%s)", pool, error, reason)
            engine = self.crawler.engine
            assert engine is not None
            # Not awaited: closing waits for the downloads in progress, this one among them.
            asyncio.ensure_future(engine.close_spider_async(reason=reason))
        elif not self.close_on_error:
            logger.error("pool %r: %s; request dropped", pool, error)
        self._inc("refused/" + error.code)
        raise IgnoreRequest("pool {!r}: {}".format(pool, error))

    async def process_response(self, request: Request, response: Response,
                               spider: Optional[Spider] = None) -> Response:
        """Reports ``ok`` or ``blocked`` with the status, and releases the lease."""
        used = request.meta.pop(_META_USED, None)
        if used is not None:
            result = "blocked" if response.status in self.blocked_codes else "ok"
            await self._finish(used, result, response.status)
        return response

    async def process_exception(self, request: Request, exception: Exception,
                                spider: Optional[Spider] = None) -> None:
        """Reports ``failed`` (nothing for ``IgnoreRequest``, which says nothing about the
        proxy), releases the lease, and lets the other middlewares (retries) handle it."""
        used = request.meta.pop(_META_USED, None)
        if used is not None:
            result = None if isinstance(exception, IgnoreRequest) else "failed"
            await self._finish(used, result, None)
        return None

    async def _finish(self, used: _Used, result: Optional[str], status: Optional[int]) -> None:
        """Reports ``result`` and releases the lease: carried by the next assign to the
        pool when ``PROXY_ALLOCATOR_CARRY_DONE`` (the default), else at once."""
        live = used.lease_id is not None and self._live.pop(used.lease_id, None) is not None
        if not live and result is None:
            return
        if not live:
            used = _Used(pool=used.pool, proxy=used.proxy, lease_id=None, target=used.target)
        if not self.carry:
            self._inc("sent_alone")
            await self._send(used, result, status)
            return
        finished = _Finished(used, result, status, time.monotonic() + self.done_delay)
        self._finished.setdefault(used.pool, deque()).append(finished)
        if self._sender is None or self._sender.done():
            self._sender = asyncio.ensure_future(self._send_when_due())

    def _take_finished(self, pool: str) -> Optional[_Finished]:
        """The oldest finished download of ``pool``, for an assign to carry."""
        waiting = self._finished.get(pool)
        if not waiting:
            return None
        finished = waiting.popleft()
        if not waiting:
            del self._finished[pool]
        return finished

    def _put_back(self, finished: _Finished) -> None:
        """An assign that failed before the service applied its done: send it later."""
        self._finished.setdefault(finished.used.pool, deque()).appendleft(finished)
        if self._sender is None or self._sender.done():
            self._sender = asyncio.ensure_future(self._send_when_due())

    def _count_done(self, finished: _Finished, effect: Optional[DoneEffect]) -> None:
        """Stats for a done an assign carried; ``effect`` is ``None`` on a 204, whose empty
        answer does not say what it did (the lease was live, so it counts as released)."""
        self._inc("carried")
        if finished.used.lease_id is not None and (effect is None or effect.released):
            self._inc("released")
        if finished.result is not None:
            self._inc("reported/" + finished.result)
            if effect is not None and effect.effect in ("tripped", "banned"):
                self._inc(effect.effect)

    async def _send_when_due(self) -> None:
        """Sends alone each finished download no assign carried before it was due."""
        while self._finished:
            now = time.monotonic()
            due = [f for waiting in self._finished.values() for f in waiting if f.due <= now]
            for finished in due:
                waiting = self._finished.get(finished.used.pool)
                if waiting is None or finished not in waiting:
                    continue  # an assign took it meanwhile
                waiting.remove(finished)
                if not waiting:
                    del self._finished[finished.used.pool]
                self._inc("sent_alone")
                await self._send(finished.used, finished.result, finished.status)
            if self._finished:
                soonest = min(f.due for waiting in self._finished.values() for f in waiting)
                await asyncio.sleep(max(soonest - time.monotonic(), 0.0))

    async def _send_all(self) -> None:
        """Sends every finished download still waiting, at once."""
        while self._finished:
            pool = next(iter(self._finished))
            finished = self._take_finished(pool)
            assert finished is not None
            self._inc("sent_alone")
            await self._send(finished.used, finished.result, finished.status)

    async def _send(self, used: _Used, result: Optional[str], status: Optional[int]) -> None:
        """Releases, then reports, each in a call of its own. Failures are logged and
        counted, never raised: the response matters more, and an unreleased lease is
        reclaimed after its ttl."""
        if used.lease_id is not None:
            try:
                await self.client.release(used.pool, used.lease_id)
                self._inc("released")
            except ProxyAllocatorError as error:
                self._inc("release_failed")
                logger.warning("lease release failed: %s", error)
        if result is None:
            return
        try:
            outcome = await self.client.report(used.pool, used.proxy, result, status,
                                               target=used.target)
        except ProxyAllocatorError as error:
            self._inc("report_failed")
            logger.warning("outcome report failed: %s", error)
            return
        self._inc("reported/" + result)
        if outcome.effect in ("tripped", "banned"):
            # Taken out: for every site (tripped), or for this request's site (banned).
            self._inc(outcome.effect)

    async def spider_closed(self, spider: Spider) -> None:
        """Sends what finished downloads left to send, releases the leases of downloads
        that never came back, then closes the client."""
        if self._sender is not None:
            self._sender.cancel()
        await self._send_all()
        for used in list(self._live.values()):
            self._live.pop(used.lease_id or "", None)
            self._inc("released_at_close")
            await self._send(used, None, None)
        await self.client.aclose()
