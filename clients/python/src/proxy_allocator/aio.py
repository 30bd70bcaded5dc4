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
import time
from types import TracebackType
from typing import Any, List, Optional, Sequence, Type, Union

import aiohttp
from yarl import URL

from .client import (
    DEFAULT_DONE_DELAY,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_TIMEOUT,
    Assignment,
    Client,
    Done,
    Labels,
    Lease,
    Leased,
    Outcome,
    Source,
    _after_failure,
    _Answer,
    _carried,
    _clients,
    _Ended,
    _ended,
    _Scope,
    _send_alone,
    _Unsent,
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

    ``carry_done`` and ``done_delay`` are :class:`~proxy_allocator.Client`'s: the end of a
    :meth:`lease` block goes with the next assign to the pool from this client (any task),
    or alone from a task after ``done_delay`` seconds, on :meth:`aclose`, when the event
    loop's ``asyncio.run`` ends, or at interpreter exit.
    """

    def __init__(self, base_url: str, token: Optional[str] = None,
                 timeout: float = DEFAULT_TIMEOUT,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 idle_timeout: float = DEFAULT_IDLE_TIMEOUT, *, carry_done: bool = True,
                 done_delay: float = DEFAULT_DONE_DELAY) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.max_connections = max_connections
        self.idle_timeout = idle_timeout
        self.carry_done = carry_done
        self.done_delay = done_delay
        self._token = token
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = "Bearer " + token
        self._session: Optional[aiohttp.ClientSession] = None
        self._unsent = _Unsent()
        self._sender: Optional["asyncio.Task[None]"] = None
        _clients.add(self)

    def __repr__(self) -> str:
        return "AsyncClient({!r})".format(self.base_url)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Sends alone the ends of lease blocks no assign carried yet, then closes the
        kept-alive connections; a later call opens new ones."""
        sender = self._sender
        if sender is not None and not sender.done():
            # Its cancellation sends what is waiting (see _send_when_due).
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
        for ended in self._unsent.take_all():
            await _send_alone_async(self, ended)
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _send_unsent_now(self) -> None:
        """At interpreter exit, with the event loop gone: the waiting ends through a
        blocking client."""
        unsent = self._unsent.take_all()
        if not unsent:
            return
        with Client(self.base_url, token=self._token, timeout=self.timeout,
                    carry_done=False) as client:
            for ended in unsent:
                _send_alone(client, ended)

    def _keep(self, ended: _Ended, first: bool = False) -> None:
        """Keeps a lease block's end for the next assign to its pool, and makes sure a task
        sends it alone once it is due."""
        if self._unsent.add(ended.pool, ended, first):
            self._sender = asyncio.ensure_future(self._send_when_due())

    async def _send_when_due(self) -> None:
        """Sends alone each end no assign carried before it was due; ends when none is left
        (the next end starts another). Cancelled (by aclose, or by asyncio.run as the loop
        ends), it sends every end still waiting first."""
        unsent = self._unsent
        sending: "Optional[asyncio.Future[None]]" = None
        try:
            while True:
                for ended in unsent.take_due(time.monotonic()):
                    # Shielded: a cancellation mid-send leaves the call to finish.
                    sending = asyncio.ensure_future(_send_alone_async(self, ended))
                    await asyncio.shield(sending)
                    sending = None
                soonest = unsent.soonest()
                if soonest is None:
                    if unsent.retire():
                        return
                    continue
                # An end put back by a failed assign is due no later than the ones waiting
                # already: sleeping until the soonest of them is soon enough.
                await asyncio.sleep(max(soonest - time.monotonic(), 0.0))
        except asyncio.CancelledError:
            if sending is not None:
                await asyncio.gather(sending, return_exceptions=True)
            unsent.retire(stopped=True)
            for ended in unsent.take_all():
                await _send_alone_async(self, ended)
            raise

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
                     exclude: Optional[Sequence[str]] = None,
                     raise_if_empty: bool = False
                     ) -> Union[Optional[Assignment], List[Assignment]]:
        """As :meth:`Client.assign`: a member (carrying ``labels`` when given, not banned
        for ``target``, the same one for a live ``session`` while it stays eligible),
        ``None`` on 204 (or with ``raise_if_empty`` :class:`NoProxyAvailable` with
        ``retry_after``); with ``count``, a list of up to that many distinct members, empty
        on 204. ``done`` (a :class:`Done`) reports the previous request and releases its
        lease in the same step, before the pick (``assignment.done`` says what it did).
        ``exclude`` (member ids) are never handed out by this call.
        Without ``done``, it carries the end of a :meth:`lease` block on the pool that waits
        for one (see ``carry_done``), with or without ``session``."""
        ended = None
        if done is None and self._unsent:
            ended = self._unsent.take(pool)
            if ended is not None:
                done = ended.done()
        try:
            answer = await self._call("/pools/{}/assign".format(_segment(pool)),
                                      _assign_body(ttl_ms, labels, target, count, session,
                                                   session_ttl_ms, done, exclude))
        except ProxyAllocatorError as error:
            if ended is not None:
                self._keep(_after_failure(ended, error), first=True)
            raise
        if ended is not None:
            _carried(ended, answer)
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
              report: bool = False, *, carry_done: Optional[bool] = None
              ) -> "AsyncLeaseScope":
        """A lease for the length of an ``async with`` block, as :meth:`Client.lease`::

            async with client.lease("browsers", renew=True, report=True) as leased:
                await fetch(url, proxy=leased.proxy)

        Renewal runs as a task. The lease is released when the block ends, raises or is
        cancelled; a cancellation reports nothing. The release and the report go with the
        next assign to the pool (``leased.done`` of the next block says what it did with
        them), or alone after ``done_delay``; with ``carry_done=False`` (the client's by
        default) they are sent as the block ends, shielded, so that they survive a second
        cancellation.
        """
        carry = self.carry_done if carry_done is None else carry_done
        return AsyncLeaseScope(self, pool, ttl_ms=ttl_ms, renew=renew, report=report,
                               carry=carry)

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
                 report: bool, carry: bool = True) -> None:
        super().__init__(pool, ttl_ms, renew, report, carry)
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
        ended = _ended(leased, outcome, self._client.done_delay)
        if self._carry:
            # Kept without awaiting anything: a cancellation cannot lose it.
            self._client._keep(ended)
            return
        # Shielded: a task cancelled while it releases still frees the proxy; the end
        # work runs to completion in its own task whatever happens to this one.
        await asyncio.shield(_end(self._client, ended, self._renewer))


async def _end(client: AsyncClient, ended: _Ended,
               renewer: "Optional[asyncio.Task[None]]") -> None:
    """Waits for the renewer to stop, then releases the lease and reports the outcome."""
    if renewer is not None:
        await asyncio.gather(renewer, return_exceptions=True)
    await _send_alone_async(client, ended)


async def _send_alone_async(client: AsyncClient, ended: _Ended) -> None:
    """As the blocking client's: releases an ended block's lease and reports its outcome,
    each in a call of its own; failures are logged."""
    try:
        await client.release(ended.pool, ended.lease)
    except ProxyAllocatorError as error:
        logger.warning("lease release failed: %s", error,
                       extra={"pool": ended.pool, "lease": ended.lease})
    if ended.result is None:
        return
    try:
        ended.leased.reported = await client.report(ended.pool, ended.leased.proxy,
                                                    ended.result, ended.status)
    except ProxyAllocatorError as error:
        logger.warning("outcome report failed: %s", error, extra={"pool": ended.pool})


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
