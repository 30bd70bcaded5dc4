"""The worker client: assign, leases with release and renewal, outcome reports."""

import http.client
import json
import logging
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Dict, Mapping, Optional, Tuple, Type

from .errors import (
    Forbidden,
    NoProxyAvailable,
    NotFound,
    ProxyAllocatorError,
    Unauthorized,
    Unavailable,
    Unreachable,
)

logger = logging.getLogger("proxy_allocator")

#: The outcomes a worker may report, as the service names them.
RESULTS = ("ok", "failed", "blocked")

#: Seconds a call may take before it fails with :class:`Unreachable`.
DEFAULT_TIMEOUT = 10.0


@dataclass
class Lease:
    """A live lease on a least-in-flight pool: its id, expiry (RFC 3339, the store's
    clock) and the ttl it was given, in milliseconds."""

    id: str
    expires_at: str
    ttl_ms: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Lease":
        """The lease as the service writes it (``{"id", "expires_at", "ttl_ms"}``)."""
        return cls(id=data["id"], expires_at=data["expires_at"], ttl_ms=int(data["ttl_ms"]))


@dataclass
class Assignment:
    """A member handed out by ``assign``.

    ``assignments`` is the member's count after this assignment. On a least-in-flight
    pool, ``in_flight`` (its live leases, this one included) and ``lease`` are set too.
    """

    pool: str
    proxy: str
    assignments: int
    in_flight: Optional[int] = None
    lease: Optional[Lease] = None

    @property
    def proxies(self) -> Dict[str, str]:
        """The mapping ``requests`` (``proxies=``) and ``urllib`` (``ProxyHandler``) expect:
        both schemes through this proxy. Meaningful when member ids are proxy URLs."""
        return {"http": self.proxy, "https": self.proxy}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Assignment":
        """The assignment as the service writes it."""
        lease = data.get("lease")
        return cls(
            pool=data["pool"],
            proxy=data["proxy"],
            assignments=int(data["assignments"]),
            in_flight=None if data.get("in_flight") is None else int(data["in_flight"]),
            lease=None if lease is None else Lease.from_json(lease),
        )


@dataclass
class Outcome:
    """What the service did with one outcome report.

    ``proxy`` is the member as the pool stores it (its canonical id), ``result`` the result
    reported. ``effect`` is ``counted`` (the member's failure streak was extended or
    cleared), ``tripped`` (the report took the member out to cool down), ``ignored`` (the
    member was not eligible, so the report changed nothing), ``unknown`` (the pool has no
    such member) or ``rejected`` (not a valid member id; ``reason`` says why).
    ``consecutive_failures`` is the member's failure streak after the report, ``None`` for
    ``unknown`` and ``rejected``.
    """

    proxy: str
    result: str
    effect: str
    consecutive_failures: Optional[int]
    reason: Optional[str] = None

    @classmethod
    def from_answer(cls, result: str, data: Mapping[str, Any]) -> "Outcome":
        """The outcome of the one report of a call, from the service's answer
        (``{"outcomes", "unknown", "rejected"}``)."""
        applied = data.get("outcomes") or []
        unknown = data.get("unknown") or []
        rejected = data.get("rejected") or []
        if applied:
            return cls(proxy=applied[0]["proxy"], result=applied[0]["result"],
                       effect=applied[0]["effect"],
                       consecutive_failures=int(applied[0]["consecutive_failures"]))
        if unknown:
            return cls(proxy=unknown[0], result=result, effect="unknown",
                       consecutive_failures=None)
        if rejected:
            return cls(proxy=rejected[0]["member"], result=result, effect="rejected",
                       consecutive_failures=None, reason=rejected[0]["reason"])
        raise ProxyAllocatorError(200, "unexpected_answer",
                                  "the service's answer names no outcome: {!r}".format(data))


@dataclass
class Leased(Assignment):
    """What ``with client.lease(...)`` yields: an assignment whose lease the block holds.

    ``renewals`` counts the background renewals so far; ``lost`` is set when a renewal
    found the lease gone (expired and reclaimed, or its member removed): the proxy may
    then be someone else's. With ``report=True``, ``reported`` is what the service did with
    the report sent when the block ended.
    """

    renewals: int = 0
    lost: Optional[ProxyAllocatorError] = None
    reported: Optional[Outcome] = None
    _outcome: Optional[Tuple[str, Optional[int]]] = field(default=None, repr=False)

    def report_as(self, result: str, status: Optional[int] = None) -> None:
        """Reports ``result`` (and ``status``) on exit instead of ``ok``/``failed``, e.g.
        ``blocked`` with 403 when the target refused the proxy. Needs ``report=True``."""
        _check_result(result)
        self._outcome = (result, status)


def _check_result(result: str) -> None:
    if result not in RESULTS:
        raise ValueError("result is one of {}, not {!r}".format(", ".join(RESULTS), result))


def _error(status: int, raw: bytes, retry_after: Optional[str]) -> ProxyAllocatorError:
    """The exception for an error answer, with the service's code and message."""
    code, message = "http_{}".format(status), "HTTP {}".format(status)
    try:
        detail = json.loads(raw.decode("utf-8"))["error"]
        code, message = str(detail["code"]), str(detail["message"])
    except (ValueError, KeyError, TypeError):
        # Not the service's error shape (a proxy or load balancer in between answered):
        # keep the status, which is all there is.
        pass
    if status == 401:
        return Unauthorized(status, code, message)
    if status == 403:
        return Forbidden(status, code, message)
    if status == 404:
        return NotFound(status, code, message)
    if status == 503:
        seconds = None
        try:
            seconds = None if retry_after is None else float(retry_after)
        except ValueError:
            pass
        return Unavailable(status, code, message, retry_after=seconds)
    return ProxyAllocatorError(status, code, message)


class Client:
    """A client of one proxy-allocator service.

    ``token`` is sent as ``Authorization: Bearer <token>`` (the worker token, or none when
    the service's worker routes are open). Each call makes one HTTP request and waits at
    most ``timeout`` seconds. A client holds no connection and may be shared by threads.
    Proxy settings of the environment (``HTTP_PROXY``...) are ignored for calls to the
    service: they are meant for the worker's own traffic.
    """

    def __init__(self, base_url: str, token: Optional[str] = None,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._token = token
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def __repr__(self) -> str:
        # The token stays out of reprs, and so out of logs and tracebacks.
        return "Client({!r})".format(self.base_url)

    def assign(self, pool: str, ttl_ms: Optional[int] = None) -> Optional[Assignment]:
        """Asks for a member of ``pool``; ``None`` when it has none to give (HTTP 204: skip
        this request). ``ttl_ms`` asks least-in-flight pools for a lease ttl other than the
        pool's.

        Raises :class:`NotFound` (``pool_not_found``), :class:`Unauthorized`,
        :class:`Unavailable`, or :class:`ProxyAllocatorError` for other error answers.
        """
        body = None if ttl_ms is None else {"ttl_ms": ttl_ms}
        status, data = self._call("POST", "/pools/{}/assign".format(_segment(pool)), body)
        if status == 204 or data is None:
            return None
        return Assignment.from_json(data)

    def release(self, pool: str, lease_id: str) -> None:
        """Ends a lease. Raises :class:`NotFound` (``lease_not_found``) when it is not live:
        already released, expired, or ended with its member."""
        self._call("POST", "/pools/{}/leases/{}/release".format(
            _segment(pool), _segment(lease_id)))

    def renew(self, pool: str, lease_id: str, ttl_ms: Optional[int] = None) -> Lease:
        """Extends a live lease to ``ttl_ms`` from now (the pool's ``lease_ttl_ms`` when
        ``None``); returns the lease with its new expiry. Raises :class:`NotFound`
        (``lease_not_found``) when it is not live."""
        body = None if ttl_ms is None else {"ttl_ms": ttl_ms}
        _, data = self._call("POST", "/pools/{}/leases/{}/renew".format(
            _segment(pool), _segment(lease_id)), body)
        return Lease.from_json(_expect(data)["lease"])

    def report(self, pool: str, proxy: str, result: str,
               status: Optional[int] = None) -> Outcome:
        """Reports how a request through ``proxy`` went: ``ok``, ``failed`` or ``blocked``,
        with the target's HTTP ``status`` when there was one
        (``POST /pools/{pool}/outcomes``). Returns what the service did with it: its
        ``effect`` (``tripped`` when this report took the proxy out) and the proxy's
        ``consecutive_failures``."""
        _check_result(result)
        body: Dict[str, Any] = {"proxy": proxy, "result": result}
        if status is not None:
            body["status"] = int(status)
        _, data = self._call("POST", "/pools/{}/outcomes".format(_segment(pool)), body)
        return Outcome.from_answer(result, _expect(data))

    def lease(self, pool: str, ttl_ms: Optional[int] = None, renew: bool = False,
              report: bool = False) -> "LeaseScope":
        """A lease on a least-in-flight pool for the length of a ``with`` block::

            with client.lease("browsers", renew=True, report=True) as leased:
                fetch(url, proxies=leased.proxies)

        The block gets a :class:`Leased`. The lease is released when the block ends, also
        when it raises. With ``renew``, a daemon thread renews it every third of its ttl
        while the block runs. With ``report``, the outcome is reported on exit: ``ok`` when
        the block ends normally, ``failed`` when it raises an ``Exception`` (nothing for
        ``KeyboardInterrupt`` and the like, which say nothing about the proxy), or what the
        block set with :meth:`Leased.report_as`.

        Entering raises :class:`NoProxyAvailable` when the pool has no member to give
        (HTTP 204), and the errors of :meth:`assign`. Release and report failures on exit
        are logged, not raised: the block's own result matters more, and an unreleased
        lease is reclaimed once its ttl has passed.
        """
        return LeaseScope(self, pool, ttl_ms=ttl_ms, renew=renew, report=report)

    def _call(self, method: str, path: str, body: Optional[Any] = None,
              ) -> Tuple[int, Optional[Dict[str, Any]]]:
        """Sends one request; returns the status and the JSON body (``None`` when empty),
        or raises the error matching the answer."""
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if self._token:
            headers["Authorization"] = "Bearer " + self._token
        request = urllib.request.Request(self.base_url + path, data=data, method=method,
                                         headers=headers)
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as answer:
            with answer:
                raise _error(answer.code, answer.read(),
                             answer.headers.get("Retry-After")) from None
        except (OSError, http.client.HTTPException) as failure:
            # URLError, timeouts, refused and reset connections are all OSErrors.
            reason = getattr(failure, "reason", failure)
            raise Unreachable(None, "unreachable", "cannot reach {}: {}".format(
                self.base_url, reason)) from failure
        return status, (json.loads(raw.decode("utf-8")) if raw else None)


def _segment(text: str) -> str:
    """One path segment, escaped so that no id can reach another route."""
    return urllib.parse.quote(text, safe="")


def _expect(data: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    if data is None:
        raise ProxyAllocatorError(None, "empty_answer", "the service answered without a body")
    return data


class _Renewer(threading.Thread):
    """Renews one lease every third of its ttl until stopped or the lease is lost."""

    def __init__(self, client: Client, leased: Leased) -> None:
        lease = leased.lease
        assert lease is not None
        super().__init__(name="proxy-allocator-renew-{}".format(lease.id[:8]), daemon=True)
        self._client = client
        self._leased = leased
        self._ttl_ms = lease.ttl_ms
        self._stop_event = threading.Event()

    def stop(self) -> None:
        """Stops renewing and waits for an ongoing renewal to end."""
        self._stop_event.set()
        self.join()

    def run(self) -> None:
        leased = self._leased
        # A third of the ttl leaves two more tries before expiry when one renewal fails.
        interval = max(self._ttl_ms / 3000.0, 0.01)
        while not self._stop_event.wait(interval):
            lease = leased.lease
            assert lease is not None
            try:
                # The ttl is passed explicitly: a renewal without one would fall back to the
                # pool's lease_ttl_ms, not the ttl this lease was asked with.
                leased.lease = self._client.renew(leased.pool, lease.id, ttl_ms=self._ttl_ms)
                leased.renewals += 1
            except NotFound as lost:
                leased.lost = lost
                logger.warning("lease lost, no longer renewing it",
                               extra={"pool": leased.pool, "lease": lease.id})
                return
            except ProxyAllocatorError as error:
                # A passing outage: the lease lives until its expiry, the next tick retries.
                logger.warning("lease renewal failed: %s", error,
                               extra={"pool": leased.pool, "lease": lease.id})


class LeaseScope:
    """The context manager returned by :meth:`Client.lease`."""

    def __init__(self, client: Client, pool: str, ttl_ms: Optional[int], renew: bool,
                 report: bool) -> None:
        self._client = client
        self._pool = pool
        self._ttl_ms = ttl_ms
        self._renew = renew
        self._report = report
        self._leased: Optional[Leased] = None
        self._renewer: Optional[_Renewer] = None

    def __enter__(self) -> Leased:
        assigned = self._client.assign(self._pool, ttl_ms=self._ttl_ms)
        if assigned is None:
            raise NoProxyAvailable(self._pool)
        if assigned.lease is None:
            raise ProxyAllocatorError(
                200, "no_lease",
                "pool {!r} gives no leases (least-used): use assign()".format(self._pool))
        leased = Leased(pool=assigned.pool, proxy=assigned.proxy,
                        assignments=assigned.assignments, in_flight=assigned.in_flight,
                        lease=assigned.lease)
        self._leased = leased
        if self._renew:
            self._renewer = _Renewer(self._client, leased)
            self._renewer.start()
        return leased

    def __exit__(self, exc_type: Optional[Type[BaseException]],
                 exc: Optional[BaseException], traceback: Optional[TracebackType]) -> None:
        leased = self._leased
        if leased is None or leased.lease is None:
            return
        if self._renewer is not None:
            self._renewer.stop()
        try:
            self._client.release(leased.pool, leased.lease.id)
        except ProxyAllocatorError as error:
            logger.warning("lease release failed: %s", error,
                           extra={"pool": leased.pool, "lease": leased.lease.id})
        if not self._report:
            return
        if leased._outcome is not None:
            result, status = leased._outcome
        elif exc_type is None:
            result, status = "ok", None
        elif issubclass(exc_type, Exception):
            result, status = "failed", None
        else:
            return
        try:
            leased.reported = self._client.report(leased.pool, leased.proxy, result, status)
        except ProxyAllocatorError as error:
            logger.warning("outcome report failed: %s", error, extra={"pool": leased.pool})
