"""The asyncio client: the methods and errors of :class:`~proxy_allocator.Client`, on aiohttp.

Install with ``pip install 'proxy-allocator[async]'``. aiohttp keeps a pool of kept-alive
connections per client, so create one :class:`AsyncClient` per event loop and share it
between tasks. (aiohttp rather than httpx: on one loopback connection an assign took
0.18 ms through aiohttp and 1.3 ms through httpx 0.28, and 200 tasks making 1,000 assigns
took 0.15 s against 3.8 s; see ``bench/client_keepalive.py``.)
"""

import asyncio
import json
import logging
from types import TracebackType
from typing import Any, List, Optional, Tuple, Type, Union

import aiohttp
from yarl import URL

from .client import (
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_TIMEOUT,
    Assignment,
    Done,
    Labels,
    Lease,
    Leased,
    Outcome,
    Source,
    _Answer,
    _Scope,
    _answer,
    _assign_body,
    _assigned,
    _exit_outcome,
    _expect,
    _leased,
    _report_body,
    _segment,
    _ttl_body,
)
from .errors import NotFound, ProxyAllocatorError, Unreachable

logger = logging.getLogger("proxy_allocator")

#: Connections one client keeps at most; more concurrent calls wait for a free one.
DEFAULT_MAX_CONNECTIONS = 100


class AsyncClient:
    """An asyncio client of one proxy-allocator service.

    ``token`` is sent as ``Authorization: Bearer <token>``. Each call waits at most
    ``timeout`` seconds, including the wait for one of ``max_connections`` kept-alive
    connections, each reused while it was idle less than ``idle_timeout`` seconds (below
    the service's ``KEEP_ALIVE_TIMEOUT_MS``, after which it closes idle connections). The
    connections are opened on first use, in the running event loop, and belong to it. Use it as ``async with AsyncClient(...) as client:`` or call
    :meth:`aclose`. Proxy settings of the environment are ignored for calls to the service.
    """

    def __init__(self, base_url: str, token: Optional[str] = None,
                 timeout: float = DEFAULT_TIMEOUT,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 idle_timeout: float = DEFAULT_IDLE_TIMEOUT) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.max_connections = max_connections
        self.idle_timeout = idle_timeout
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = "Bearer " + token
        self._session: Optional[aiohttp.ClientSession] = None

    def __repr__(self) -> str:
        return "AsyncClient({!r})".format(self.base_url)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Closes the kept-alive connections; a later call opens new ones."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _http(self) -> aiohttp.ClientSession:
        # Made on first use: aiohttp binds a session to the loop it is created in, and a
        # client is often built before the loop runs (a Scrapy middleware is).
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self._headers, trust_env=False,
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                connector=aiohttp.TCPConnector(limit=self.max_connections,
                                               keepalive_timeout=self.idle_timeout))
        return self._session

    async def assign(self, pool: str, ttl_ms: Optional[int] = None, *,
                     labels: Optional[Labels] = None, target: Optional[str] = None,
                     count: Optional[int] = None, session: Optional[str] = None,
                     session_ttl_ms: Optional[int] = None, done: Optional[Done] = None,
                     raise_if_empty: bool = False
                     ) -> Union[Optional[Assignment], List[Assignment]]:
        """As :meth:`Client.assign`: a member (carrying ``labels`` when given, not banned
        for ``target``, the same one for a live ``session`` while it stays eligible),
        ``None`` on 204 (or with ``raise_if_empty`` :class:`NoProxyAvailable` with
        ``retry_after``); with ``count``, a list of up to that many distinct members, empty
        on 204. ``done`` (a :class:`Done`) reports the previous request and releases its
        lease in the same step, before the pick (``assignment.done`` says what it did)."""
        answer = await self._call("/pools/{}/assign".format(_segment(pool)),
                                  _assign_body(ttl_ms, labels, target, count, session,
                                               session_ttl_ms, done))
        return _assigned(pool, answer, raise_if_empty, count)

    async def end_session(self, pool: str, session: str) -> None:
        """As :meth:`Client.end_session`: ends a sticky session, :class:`NotFound`
        (``session_not_found``) when the pool has no such live session."""
        await self._call("/pools/{}/sessions/{}".format(_segment(pool), _segment(session)),
                         method="DELETE")

    async def release(self, pool: str, lease_id: str) -> None:
        """As :meth:`Client.release`: ends a lease, :class:`NotFound` when it is not live."""
        await self._call("/pools/{}/leases/{}/release".format(_segment(pool),
                                                              _segment(lease_id)))

    async def renew(self, pool: str, lease_id: str, ttl_ms: Optional[int] = None) -> Lease:
        """As :meth:`Client.renew`: the lease with its new expiry."""
        answer = await self._call("/pools/{}/leases/{}/renew".format(
            _segment(pool), _segment(lease_id)), _ttl_body(ttl_ms))
        return Lease.from_json(_expect(answer.data)["lease"])

    async def report(self, pool: str, proxy: str, result: str,
                     status: Optional[int] = None, *,
                     target: Optional[str] = None) -> Outcome:
        """As :meth:`Client.report`: returns what the service did with the report, an
        :class:`Outcome` with its ``effect`` (``tripped`` when this report took the proxy
        out) and the proxy's ``consecutive_failures``; with ``target``, a ``blocked``
        report bans the proxy for that host only (``banned``, ``banned_until``)."""
        answer = await self._call("/pools/{}/outcomes".format(_segment(pool)),
                                  _report_body(proxy, result, status, target))
        return Outcome.from_answer(result, _expect(answer.data))

    async def sources(self, pool: str) -> List[Source]:
        """As :meth:`Client.sources`: the pool's sources with their last fetch (needs the
        admin token)."""
        answer = await self._call("/pools/{}/sources".format(_segment(pool)), method="GET")
        return [Source.from_json(source) for source in _expect(answer.data)["sources"]]

    def lease(self, pool: str, ttl_ms: Optional[int] = None, renew: bool = False,
              report: bool = False) -> "AsyncLeaseScope":
        """A lease for the length of an ``async with`` block, as :meth:`Client.lease`::

            async with client.lease("browsers", renew=True, report=True) as leased:
                await fetch(url, proxy=leased.proxy)

        Renewal runs as a task. The lease is released when the block ends, raises or is
        cancelled; a cancellation reports nothing, and the release survives a second
        cancellation (it is shielded).
        """
        return AsyncLeaseScope(self, pool, ttl_ms=ttl_ms, renew=renew, report=report)

    async def _call(self, path: str, body: Optional[Any] = None,
                    method: str = "POST") -> _Answer:
        """Sends one request (a POST unless said otherwise: every worker route is one);
        returns the answer or raises the error matching it."""
        content = None if body is None else json.dumps(body).encode("utf-8")
        headers = None if body is None else {"Content-Type": "application/json"}
        # The path is escaped already (_segment): it is sent as it is.
        url = URL(self.base_url + path, encoded=True)
        try:
            async with self._http().request(method, url, data=content,
                                            headers=headers) as response:
                raw = await response.read()
                status, retry_after = response.status, response.headers.get("Retry-After")
        except (aiohttp.ClientError, asyncio.TimeoutError) as failure:
            # Refused, reset, timed out (also waiting for a pooled connection); nothing is
            # sent twice.
            raise Unreachable(None, "unreachable", "cannot reach {}: {}".format(
                self.base_url, failure or type(failure).__name__)) from failure
        return _answer(status, raw, retry_after)


class AsyncLeaseScope(_Scope):
    """The async context manager returned by :meth:`AsyncClient.lease`."""

    def __init__(self, client: AsyncClient, pool: str, ttl_ms: Optional[int], renew: bool,
                 report: bool) -> None:
        super().__init__(pool, ttl_ms, renew, report)
        self._client = client
        self._renewer: Optional["asyncio.Task[None]"] = None

    async def __aenter__(self) -> Leased:
        assigned = await self._client.assign(self._pool, ttl_ms=self._ttl_ms,
                                             raise_if_empty=True)
        assert assigned is not None
        leased = _leased(self._pool, assigned)
        self._leased = leased
        if self._renew:
            self._renewer = asyncio.ensure_future(_renew_until_cancelled(self._client, leased))
        return leased

    async def __aexit__(self, exc_type: Optional[Type[BaseException]],
                        exc: Optional[BaseException],
                        traceback: Optional[TracebackType]) -> None:
        leased = self._leased
        if leased is None or leased.lease is None:
            return
        if self._renewer is not None:
            self._renewer.cancel()
        outcome = _exit_outcome(leased, exc_type) if self._report else None
        # Shielded: a task cancelled while it releases still frees the proxy; the end
        # work runs to completion in its own task whatever happens to this one.
        await asyncio.shield(_end(self._client, leased, self._renewer, outcome))


async def _end(client: AsyncClient, leased: Leased, renewer: "Optional[asyncio.Task[None]]",
               outcome: Optional[Tuple[str, Optional[int]]]) -> None:
    """Waits for the renewer to stop, releases the lease, reports the outcome; failures are
    logged, as in the blocking client."""
    assert leased.lease is not None
    if renewer is not None:
        await asyncio.gather(renewer, return_exceptions=True)
    try:
        await client.release(leased.pool, leased.lease.id)
    except ProxyAllocatorError as error:
        logger.warning("lease release failed: %s", error,
                       extra={"pool": leased.pool, "lease": leased.lease.id})
    if outcome is None:
        return
    result, status = outcome
    try:
        leased.reported = await client.report(leased.pool, leased.proxy, result, status)
    except ProxyAllocatorError as error:
        logger.warning("outcome report failed: %s", error, extra={"pool": leased.pool})


async def _renew_until_cancelled(client: AsyncClient, leased: Leased) -> None:
    """Renews the lease every third of its ttl until cancelled or the lease is lost."""
    assert leased.lease is not None
    ttl_ms = leased.lease.ttl_ms
    interval = max(ttl_ms / 3000.0, 0.01)
    while True:
        await asyncio.sleep(interval)
        lease = leased.lease
        try:
            # The lease's own ttl, not the pool's lease_ttl_ms a bare renewal would use.
            leased.lease = await client.renew(leased.pool, lease.id, ttl_ms=ttl_ms)
            leased.renewals += 1
        except NotFound as lost:
            leased.lost = lost
            logger.warning("lease lost, no longer renewing it",
                           extra={"pool": leased.pool, "lease": lease.id})
            return
        except ProxyAllocatorError as error:
            logger.warning("lease renewal failed: %s", error,
                           extra={"pool": leased.pool, "lease": lease.id})
