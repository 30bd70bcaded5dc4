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
releases the lease, if the pool gave one. The request's host is the assign's and the
report's ``target``: a site that blocks a proxy bans it for that site only, and the pool's
per-target pacing applies (``PROXY_ALLOCATOR_PER_TARGET = False`` sends no target, so a
block takes the proxy out for every site). A 204 (no proxy right now) or a 503 makes the
request wait the service's ``Retry-After`` and ask again, up to ``PROXY_ALLOCATOR_MAX_WAIT``
seconds in all. Priority 740 puts it before Scrapy's ``HttpProxyMiddleware`` (750), which
turns the proxy's credentials into a ``Proxy-Authorization`` header, and after
``RetryMiddleware`` (550), so that a retried request gets a proxy of its own.
"""

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, Optional

from scrapy import Request, Spider, signals
from scrapy.crawler import Crawler
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.reactor import is_asyncio_reactor_installed

from .aio import AsyncClient
from .client import DEFAULT_TIMEOUT
from .errors import NoProxyAvailable, ProxyAllocatorError, Unavailable

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
        self.client = AsyncClient(
            url, token=settings.get("PROXY_ALLOCATOR_TOKEN"),
            timeout=settings.getfloat("PROXY_ALLOCATOR_TIMEOUT", DEFAULT_TIMEOUT),
            max_connections=max(settings.getint("CONCURRENT_REQUESTS", 16), 1))
        # Leases not yet released, so that a download that never comes back (cancelled
        # when the spider closes) still gets its lease released.
        self._live: Dict[str, _Used] = {}
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
        while True:
            try:
                assigned = await self.client.assign(
                    pool, self.lease_ttl_ms, labels=labels, target=target,
                    session=meta.get(META_SESSION),
                    session_ttl_ms=meta.get(META_SESSION_TTL_MS), raise_if_empty=True)
                break
            except NoProxyAvailable as empty:
                self._inc("no_proxy")
                wait = empty.retry_after or self.empty_wait
                logger.debug("no proxy in pool %r right now, waiting %s s", pool, wait)
            except Unavailable as down:
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
        """Releases, then reports. Failures are logged and counted, never raised: the
        response matters more, and an unreleased lease is reclaimed after its ttl."""
        if used.lease_id is not None and self._live.pop(used.lease_id, None) is not None:
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
        """Releases the leases of downloads that never came back, then closes the client."""
        for used in list(self._live.values()):
            self._inc("released_at_close")
            await self._finish(used, None, None)
        await self.client.aclose()
