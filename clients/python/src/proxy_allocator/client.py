"""The worker client: assign, leases with release and renewal, outcome reports; and, with
the admin token, a pool's sources."""

import atexit
import collections
import http.client
import json
import logging
import select
import socket
import ssl
import threading
import time
import urllib.parse
import weakref
from dataclasses import dataclass, field
from types import TracebackType
from typing import (
    Any,
    Dict,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    Type,
    Union,
)

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

#: Seconds a kept-alive connection may stay idle and still be reused. Below the service's
#: own limit (``KEEP_ALIVE_TIMEOUT_MS``, 5 s by default, after which it closes an idle
#: connection), so that a call never races the service closing its connection.
DEFAULT_IDLE_TIMEOUT = 4.0

#: Seconds the end of a lease block (its release, and its report) waits for the next assign
#: to the same pool to carry it as ``done``, before it is sent alone. A lease is held at
#: most this long past its block; a steady worker's next block starts well within it.
DEFAULT_DONE_DELAY = 0.2


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
class Session:
    """A sticky session as an assign left it: its ``id``, when it ends unless another assign
    names it (``expires_at``, RFC 3339, the store's clock), and whether this assign moved it
    to another member because its own was no longer eligible (``repinned``)."""

    id: str
    expires_at: str
    repinned: bool

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Session":
        """The session as the service writes it (``{"id", "expires_at", "repinned"}``)."""
        return cls(id=data["id"], expires_at=data["expires_at"],
                   repinned=bool(data["repinned"]))


@dataclass
class Done:
    """How the worker's previous request through a pool ended, sent with the next assign
    (``assign(..., done=...)``) instead of a report and a release of their own: the service
    applies it first, in the same atomic step as the pick, so a proxy the report takes out
    is not handed out again.

    ``proxy`` and ``result`` (``ok``, ``failed``, ``blocked``; ``status`` and ``target`` as
    in :meth:`Client.report`) report an outcome; ``lease`` (an ``assignment.lease.id``)
    releases a lease of a least-in-flight pool, with an optional ``result`` about its
    proxy (``proxy`` may then be left out).
    """

    proxy: Optional[str] = None
    result: Optional[str] = None
    status: Optional[int] = None
    target: Optional[str] = None
    lease: Optional[str] = None

    def to_json(self) -> Dict[str, Any]:
        """The assign body's ``done``, after checking that it says something."""
        if self.lease is None and (self.proxy is None or self.result is None):
            raise ValueError("done needs a lease, or a proxy and a result")
        if self.result is not None:
            _check_result(self.result)
        body: Dict[str, Any] = {}
        for name in ("proxy", "result", "status", "target", "lease"):
            value = getattr(self, name)
            if value is not None:
                body[name] = value
        return body


@dataclass
class DoneEffect:
    """What the service did with an assign's :class:`Done`: the report's ``effect`` (as
    :class:`Outcome` says it; ``unknown`` for a proxy the pool does not have; ``None``
    without a result), the proxy's ``consecutive_failures`` and ``banned_until``, and
    whether the lease was live and is now ``released``. An unknown proxy or lease never
    fails the assign."""

    released: bool
    proxy: Optional[str] = None
    effect: Optional[str] = None
    consecutive_failures: Optional[int] = None
    banned_until: Optional[str] = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "DoneEffect":
        """The answer's ``done`` as the service writes it."""
        failures = data.get("consecutive_failures")
        return cls(released=bool(data["released"]), proxy=data.get("proxy"),
                   effect=data.get("effect"),
                   consecutive_failures=None if failures is None else int(failures),
                   banned_until=data.get("banned_until"))


@dataclass
class Assignment:
    """A member handed out by ``assign``.

    ``assignments`` is the member's count after this assignment. On a least-in-flight
    pool, ``in_flight`` (its live leases, this one included) and ``lease`` are set too; in a
    sticky session, ``session``; for an assign that carried a :class:`Done`, ``done`` says
    what it did.
    """

    pool: str
    proxy: str
    assignments: int
    in_flight: Optional[int] = None
    lease: Optional[Lease] = None
    session: Optional[Session] = None
    done: Optional[DoneEffect] = None

    @property
    def proxies(self) -> Dict[str, str]:
        """The mapping ``requests`` (``proxies=``) and ``urllib`` (``ProxyHandler``) expect:
        both schemes through this proxy. Meaningful when member ids are proxy URLs."""
        return {"http": self.proxy, "https": self.proxy}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Assignment":
        """The assignment as the service writes it."""
        lease = data.get("lease")
        session = data.get("session")
        done = data.get("done")
        return cls(
            pool=data["pool"],
            proxy=data["proxy"],
            assignments=int(data["assignments"]),
            in_flight=None if data.get("in_flight") is None else int(data["in_flight"]),
            lease=None if lease is None else Lease.from_json(lease),
            session=None if session is None else Session.from_json(session),
            done=None if done is None else DoneEffect.from_json(done),
        )


@dataclass
class SourceFetch:
    """The last fetch of a pool's source: when it ended (RFC 3339, the store's clock), its
    ``outcome`` (``ok`` or ``failed``), on ``ok`` the counts of the import it made (lines
    ``accepted`` = ``added`` + ``existing``, ``duplicates``, ``rejected``), on ``failed``
    the ``error`` (``timed out``, ``private address refused``, ``status 404``, ...)."""

    at: str
    outcome: str
    accepted: Optional[int] = None
    added: Optional[int] = None
    existing: Optional[int] = None
    duplicates: Optional[int] = None
    rejected: Optional[int] = None
    error: Optional[str] = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "SourceFetch":
        """The fetch as the service writes it."""
        counts = data.get("counts") or {}

        def count(name: str) -> Optional[int]:
            return None if counts.get(name) is None else int(counts[name])

        return cls(at=data["at"], outcome=data["outcome"], accepted=count("accepted"),
                   added=count("added"), existing=count("existing"),
                   duplicates=count("duplicates"), rejected=count("rejected"),
                   error=data.get("error"))


@dataclass
class Source:
    """One of a pool's sources (its ``sources`` configuration: ``url``, ``interval_ms``,
    ``format``, ``default_scheme``) with its schedule: ``next_fetch_at`` (``None`` before
    the service first saw it), ``failures`` in a row, ``successes`` so far and the
    ``last_fetch`` (``None`` before the first)."""

    url: str
    interval_ms: int
    format: str
    default_scheme: str
    next_fetch_at: Optional[str]
    failures: int
    successes: int
    last_fetch: Optional[SourceFetch]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Source":
        """The source as ``GET /pools/{pool}/sources`` lists it."""
        last = data.get("last_fetch")
        return cls(url=data["url"], interval_ms=int(data["interval_ms"]),
                   format=data["format"], default_scheme=data["default_scheme"],
                   next_fetch_at=data.get("next_fetch_at"),
                   failures=int(data["failures"]), successes=int(data["successes"]),
                   last_fetch=None if last is None else SourceFetch.from_json(last))


@dataclass
class Outcome:
    """What the service did with one outcome report.

    ``proxy`` is the member as the pool stores it (its canonical id), ``result`` the result
    reported. ``effect`` is ``counted`` (the member's failure streak was extended or
    cleared), ``tripped`` (the report took the member out to cool down), ``banned`` (a
    ``blocked`` report with a target banned it for that target until ``banned_until``),
    ``ignored`` (the member was not eligible, or already banned for the target, so the
    report changed nothing), ``unknown`` (the pool has no such member) or ``rejected`` (not
    a valid member id; ``reason`` says why).
    ``consecutive_failures`` is the member's failure streak after the report, ``None`` for
    ``unknown`` and ``rejected``.
    """

    proxy: str
    result: str
    effect: str
    consecutive_failures: Optional[int]
    reason: Optional[str] = None
    #: For a ``blocked`` report with a target: until when (RFC 3339) the proxy is banned
    #: for that target.
    banned_until: Optional[str] = None

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
                       consecutive_failures=int(applied[0]["consecutive_failures"]),
                       banned_until=applied[0].get("banned_until"))
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
    the report of the block's end, once it was sent: by the next assign to the pool that
    carried it (``None`` if that assign answered 204, which says nothing of it), by the
    report sent alone after the client's ``done_delay`` or on ``close()``, or as the block
    ended with ``carry_done=False``. ``done`` (of :class:`Assignment`) is what this block's own assign
    did with the end of the previous block it carried.
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


def _ttl_body(ttl_ms: Optional[int]) -> Optional[Dict[str, Any]]:
    """The optional body of a renewal."""
    return None if ttl_ms is None else {"ttl_ms": ttl_ms}


#: A label filter: for every key, the value a member must carry or a list of accepted ones.
Labels = Mapping[str, Union[str, Sequence[str]]]


def _assign_body(ttl_ms: Optional[int], labels: Optional[Labels],
                 target: Optional[str] = None,
                 count: Optional[int] = None,
                 session: Optional[str] = None,
                 session_ttl_ms: Optional[int] = None,
                 done: Optional[Done] = None,
                 exclude: Optional[Sequence[str]] = None) -> Optional[Dict[str, Any]]:
    """The optional body of an assign. New assign fields of the service join here, and only
    once the service accepts them: it refuses unknown fields."""
    body: Dict[str, Any] = {}
    if ttl_ms is not None:
        body["ttl_ms"] = ttl_ms
    if labels is not None:
        body["labels"] = {key: value if isinstance(value, str) else list(value)
                          for key, value in labels.items()}
    if count is not None:
        body["count"] = int(count)
    if target is not None:
        body["target"] = target
    if session is not None:
        body["session"] = session
    if session_ttl_ms is not None:
        body["session_ttl_ms"] = int(session_ttl_ms)
    if done is not None:
        body["done"] = done.to_json()
    if exclude is not None:
        if isinstance(exclude, str):
            raise TypeError("exclude is a list of member ids, not one string")
        body["exclude"] = list(exclude)
    return body or None


def _report_body(proxy: str, result: str, status: Optional[int],
                 target: Optional[str] = None) -> Dict[str, Any]:
    """One outcome report, ``{"proxy", "result", "status"?, "target"?}``, after checking
    ``result``."""
    _check_result(result)
    body: Dict[str, Any] = {"proxy": proxy, "result": result}
    if status is not None:
        body["status"] = int(status)
    if target is not None:
        body["target"] = target
    return body


def _retry_after(value: Optional[str]) -> Optional[float]:
    """``Retry-After`` in seconds; ``None`` when absent or not a number of seconds."""
    try:
        return None if value is None else float(value)
    except ValueError:
        return None


def _exit_outcome(leased: "Leased", exc_type: Optional[Type[BaseException]],
                  ) -> Optional[Tuple[str, Optional[int]]]:
    """What a lease block that reports sends on exit: the block's choice, ``ok`` when it
    ended normally, ``failed`` on an ``Exception``, nothing on an interrupt or a
    cancellation, which say nothing about the proxy."""
    if leased._outcome is not None:
        return leased._outcome
    if exc_type is None:
        return "ok", None
    if issubclass(exc_type, Exception):
        return "failed", None
    return None


@dataclass
class _Ended:
    """The end of a lease block, not sent yet: the release of its lease and, with
    ``report=True``, the block's outcome, which the next assign to the pool carries as its
    ``done`` or which is sent alone once ``due`` (``time.monotonic()``) has passed."""

    pool: str
    lease: str
    leased: Leased
    result: Optional[str]
    status: Optional[int]
    due: float

    def done(self) -> Done:
        """The assign body's ``done`` that releases (and reports) it."""
        return Done(lease=self.lease, result=self.result, status=self.status)


def _ended(leased: Leased, outcome: Optional[Tuple[str, Optional[int]]],
           delay: float) -> _Ended:
    """The end of a lease block whose outcome (with ``report=True``) is ``outcome``."""
    assert leased.lease is not None
    result, status = outcome if outcome is not None else (None, None)
    return _Ended(pool=leased.pool, lease=leased.lease.id, leased=leased, result=result,
                  status=status, due=time.monotonic() + delay)


class _Unsent:
    """The ends of lease blocks waiting for an assign to carry them, by key (the pool; in the
    blocking client the thread and the pool), oldest first, and whether a sender (a thread
    or a task) is there to send them alone when they are due. Both are read and changed
    under one lock, so that an end is never left without a sender: one that finds nothing
    left stops in the same step as an addition would see it running."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: Dict[Any, "collections.deque[_Ended]"] = {}
        self._sending = False

    def __bool__(self) -> bool:
        # Read without the lock, for the assign path: only a key's own thread (or the event
        # loop) adds ends under it, so "nothing" is never wrong for the caller's own key.
        return bool(self._by_key)

    def add(self, key: Any, ended: _Ended, first: bool = False) -> bool:
        """Keeps ``ended`` under ``key``, last (``first``: an assign that carried it failed,
        it goes back in front); whether no sender runs, so that the caller starts one."""
        with self._lock:
            waiting = self._by_key.setdefault(key, collections.deque())
            if first:
                waiting.appendleft(ended)
            else:
                waiting.append(ended)
            start, self._sending = not self._sending, True
            return start

    def take(self, key: Any) -> Optional[_Ended]:
        """The oldest end under ``key``, for an assign to carry."""
        with self._lock:
            waiting = self._by_key.get(key)
            if not waiting:
                return None
            ended = waiting.popleft()
            if not waiting:
                del self._by_key[key]
            return ended

    def take_due(self, now: float) -> List[_Ended]:
        """Every end due by ``now``, to send alone. Under a key, ends are in due order (an
        end put back in front is older than the rest)."""
        due: List[_Ended] = []
        with self._lock:
            for key in list(self._by_key):
                waiting = self._by_key[key]
                while waiting and waiting[0].due <= now:
                    due.append(waiting.popleft())
                if not waiting:
                    del self._by_key[key]
        return due

    def take_all(self) -> List[_Ended]:
        """Every end, to send alone now (``close``, interpreter exit)."""
        with self._lock:
            every = [ended for waiting in self._by_key.values() for ended in waiting]
            self._by_key.clear()
            return every

    def soonest(self) -> Optional[float]:
        """When the next end is due; ``None`` when there is none."""
        with self._lock:
            return min((w[0].due for w in self._by_key.values() if w), default=None)

    def retire(self, stopped: bool = False) -> bool:
        """For the sender: whether it ends now, because nothing is left (or, ``stopped``,
        because ``close`` took the rest); the next addition starts another."""
        with self._lock:
            if self._by_key and not stopped:
                return False
            self._sending = False
            return True


def _outcome_of(ended: _Ended, effect: DoneEffect) -> Optional[Outcome]:
    """What the service did with a carried end's report, as :meth:`Client.report` says
    it; ``None`` for an end without a result."""
    if ended.result is None or effect.effect is None:
        return None
    return Outcome(proxy=effect.proxy or ended.leased.proxy, result=ended.result,
                   effect=effect.effect, consecutive_failures=effect.consecutive_failures,
                   banned_until=effect.banned_until)


def _carried(ended: _Ended, answer: "_Answer") -> None:
    """Notes on the ended block what the assign that carried its end did with it."""
    data = answer.data.get("done") if answer.data is not None else None
    if data is None:
        # A 204 applies the done all the same, but says nothing of what it did.
        return
    effect = DoneEffect.from_json(data)
    ended.leased.reported = _outcome_of(ended, effect)
    if not effect.released:
        # As a release sent alone would have been refused (lease_not_found).
        logger.warning("lease release failed: the lease was no longer live when the next "
                       "assign carried it", extra={"pool": ended.pool, "lease": ended.lease})


def _after_failure(ended: _Ended, error: ProxyAllocatorError) -> _Ended:
    """What is left to send of an end whose carrying assign failed. An error answer (4xx)
    was refused before the store: all of it. A 503, or no answer at all, may have been
    applied: only the release, which is harmless twice, and not the report, which would
    count twice."""
    if isinstance(error, Unavailable) and ended.result is not None:
        logger.warning("outcome report dropped: the assign that carried it failed (%s) and "
                       "may have applied it", error, extra={"pool": ended.pool})
        return _Ended(pool=ended.pool, lease=ended.lease, leased=ended.leased, result=None,
                      status=None, due=ended.due)
    return ended


#: Clients whose unsent lease ends go out when the interpreter exits.
_clients: "weakref.WeakSet[Any]" = weakref.WeakSet()


@atexit.register
def _send_unsent_at_exit() -> None:
    for client in list(_clients):
        try:
            client._send_unsent_now()
        except Exception as error:  # noqa: BLE001 - exit goes on whatever one client does
            logger.warning("lease ends not sent at exit: %s", error)


class _Answer(NamedTuple):
    """One answer of the service: its status, JSON body (``None`` when empty) and
    ``Retry-After`` in seconds."""

    status: int
    data: Optional[Dict[str, Any]]
    retry_after: Optional[float]


def _answer(status: int, raw: bytes, retry_after: Optional[str]) -> _Answer:
    """The answer, or the error it stands for raised."""
    if status >= 300:
        raise _error(status, raw, retry_after)
    return _Answer(status, json.loads(raw.decode("utf-8")) if raw else None,
                   _retry_after(retry_after))


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
        return Unavailable(status, code, message, retry_after=_retry_after(retry_after))
    return ProxyAllocatorError(status, code, message)


class Client:
    """A client of one proxy-allocator service.

    ``token`` is sent as ``Authorization: Bearer <token>`` (the worker token, or none when
    the service's worker routes are open). Each call makes one HTTP request and waits at
    most ``timeout`` seconds. Calls reuse one kept-alive connection per thread, so a
    client may be shared by threads, for as long as it was idle less than
    ``idle_timeout`` seconds (keep it below the service's ``KEEP_ALIVE_TIMEOUT_MS``);
    ``close()`` (or ``with Client(...) as client:``) closes them. Proxy settings of the environment (``HTTP_PROXY``...) are ignored for
    calls to the service: they are meant for the worker's own traffic.

    With ``carry_done`` (the default), the end of a :meth:`lease` block (its release and
    report) is carried by the next assign to the same pool from the same thread, as its
    ``done``: one call per block instead of two or three. An end no assign carried within
    ``done_delay`` seconds is sent alone, and so is every end still waiting on ``close()``
    and when the interpreter exits. ``carry_done=False`` releases and reports on exit.
    """

    def __init__(self, base_url: str, token: Optional[str] = None,
                 timeout: float = DEFAULT_TIMEOUT,
                 idle_timeout: float = DEFAULT_IDLE_TIMEOUT, *, carry_done: bool = True,
                 done_delay: float = DEFAULT_DONE_DELAY) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.carry_done = carry_done
        self.done_delay = done_delay
        self._token = token
        self._connections = _Connections(self.base_url, timeout, idle_timeout)
        self._unsent = _Unsent()
        self._sender: Optional[_Sender] = None
        _clients.add(self)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Sends alone the ends of lease blocks no assign carried yet, then closes the
        kept-alive connections of every thread; a later call opens a new one."""
        self._send_unsent_now()
        self._connections.close_all()

    def _send_unsent_now(self) -> None:
        """Stops the sender and sends every waiting end from this thread."""
        sender = self._sender
        if sender is not None:
            sender.stop()
        for ended in self._unsent.take_all():
            _send_alone(self, ended)

    def _keep(self, ended: _Ended, first: bool = False) -> None:
        """Keeps a lease block's end for the next assign to its pool from this thread, and
        makes sure a sender sends it alone once it is due."""
        if self._unsent.add((threading.get_ident(), ended.pool), ended, first):
            self._sender = _Sender(self)
            self._sender.start()
        elif first and self._sender is not None:
            # Due before what the sender waits for.
            self._sender.wake.set()

    def __del__(self) -> None:
        # A client dropped without close() must not leave its sockets open.
        connections = getattr(self, "_connections", None)
        if connections is not None:
            connections.close_all()

    def __repr__(self) -> str:
        # The token stays out of reprs, and so out of logs and tracebacks.
        return "Client({!r})".format(self.base_url)

    def assign(self, pool: str, ttl_ms: Optional[int] = None, *,
               labels: Optional[Labels] = None, target: Optional[str] = None,
               count: Optional[int] = None, session: Optional[str] = None,
               session_ttl_ms: Optional[int] = None, done: Optional[Done] = None,
               exclude: Optional[Sequence[str]] = None,
               raise_if_empty: bool = False) -> Union[Optional[Assignment], List[Assignment]]:
        """Asks for a member of ``pool``; ``None`` when it has none to give (HTTP 204: skip
        this request), or with ``raise_if_empty`` :class:`NoProxyAvailable`, whose
        ``retry_after`` says when the first member cooling down returns. ``ttl_ms`` asks
        least-in-flight pools for a lease ttl other than the pool's. ``labels``
        (``{"country": "de"}`` or ``{"country": ["de", "fr"]}``) chooses among the members
        carrying them only. ``target`` names the host the request goes to: proxies that
        host blocked (see :meth:`report`) are skipped while their ban lasts. ``count`` (1 to
        100) asks for up to that many distinct members at once: the answer is then a list of
        assignments in pick order (each with its own lease on a least-in-flight pool),
        shorter when fewer fit, empty on 204. ``session`` (1 to 128 visible ASCII
        characters, your own id) keeps handing out the same member while it stays eligible
        for the request, else moves the session to a fresh pick (``assignment.session.
        repinned``); each call slides the session's end to ``session_ttl_ms`` (the pool's by
        default) from now. It does not combine with ``count``. ``exclude`` (up to 100
        member ids) are never handed out by this call, as if they were ineligible for it:
        a retry that moves on from the proxies it already tried.

        ``done`` (a :class:`Done`) reports how the previous request through this pool
        ended and releases its lease in the same step, before the pick: one call per
        request cycle instead of two. It is applied also when the answer is 204; what it
        did is ``assignment.done`` (with ``count``, on the first assignment). With a
        ``session``, the done comes first: a done that trips the session's member re-pins
        the session in the same call. Without ``done``, the assign carries the end of this
        thread's last :meth:`lease` block on the pool, if one is waiting (see
        ``carry_done``), with or without ``session``.

        Raises :class:`NotFound` (``pool_not_found``), :class:`Unauthorized`,
        :class:`Unavailable`, or :class:`ProxyAllocatorError` for other error answers.
        """
        ended = None
        if done is None and self._unsent:
            ended = self._unsent.take((threading.get_ident(), pool))
            if ended is not None:
                done = ended.done()
        try:
            answer = self._call("POST", "/pools/{}/assign".format(_segment(pool)),
                                _assign_body(ttl_ms, labels, target, count, session,
                                             session_ttl_ms, done, exclude))
        except ProxyAllocatorError as error:
            if ended is not None:
                self._keep(_after_failure(ended, error), first=True)
            raise
        if ended is not None:
            _carried(ended, answer)
        return _assigned(pool, answer, raise_if_empty, count)

    def end_session(self, pool: str, session: str) -> None:
        """Ends a sticky session: the next assign naming it picks afresh. Raises
        :class:`NotFound` (``session_not_found``) when the pool has no such live session."""
        self._call("DELETE", "/pools/{}/sessions/{}".format(_segment(pool), _segment(session)))

    def release(self, pool: str, lease_id: str) -> None:
        """Ends a lease. Raises :class:`NotFound` (``lease_not_found``) when it is not live:
        already released, expired, or ended with its member."""
        self._call("POST", "/pools/{}/leases/{}/release".format(
            _segment(pool), _segment(lease_id)))

    def renew(self, pool: str, lease_id: str, ttl_ms: Optional[int] = None) -> Lease:
        """Extends a live lease to ``ttl_ms`` from now (the pool's ``lease_ttl_ms`` when
        ``None``); returns the lease with its new expiry. Raises :class:`NotFound`
        (``lease_not_found``) when it is not live."""
        _, data, _ = self._call("POST", "/pools/{}/leases/{}/renew".format(
            _segment(pool), _segment(lease_id)), _ttl_body(ttl_ms))
        return Lease.from_json(_expect(data)["lease"])

    def report(self, pool: str, proxy: str, result: str,
               status: Optional[int] = None, *, target: Optional[str] = None) -> Outcome:
        """Reports how a request through ``proxy`` went: ``ok``, ``failed`` or ``blocked``,
        with the target's HTTP ``status`` when there was one
        (``POST /pools/{pool}/outcomes``). Returns what the service did with it: its
        ``effect`` (``tripped`` when this report took the proxy out) and the proxy's
        ``consecutive_failures``. With ``target`` (the host the request went to), a
        ``blocked`` report bans the proxy for that host only: ``effect`` is then ``banned``
        and ``banned_until`` says until when."""
        _, data, _ = self._call("POST", "/pools/{}/outcomes".format(_segment(pool)),
                                _report_body(proxy, result, status, target))
        return Outcome.from_answer(result, _expect(data))

    def sources(self, pool: str) -> List[Source]:
        """The pool's sources in configuration order, each with its last fetch
        (``GET /pools/{pool}/sources``; needs the admin token). Raises :class:`NotFound`
        (``pool_not_found``), :class:`Forbidden` with the worker token."""
        _, data, _ = self._call("GET", "/pools/{}/sources".format(_segment(pool)))
        return [Source.from_json(source) for source in _expect(data)["sources"]]

    def lease(self, pool: str, ttl_ms: Optional[int] = None, renew: bool = False,
              report: bool = False, *, carry_done: Optional[bool] = None) -> "LeaseScope":
        """A lease on a least-in-flight pool for the length of a ``with`` block::

            with client.lease("browsers", renew=True, report=True) as leased:
                fetch(url, proxies=leased.proxies)

        The block gets a :class:`Leased`. The lease is released when the block ends, also
        when it raises. With ``renew``, a daemon thread renews it every third of its ttl
        while the block runs. With ``report``, the outcome is reported on exit: ``ok`` when
        the block ends normally, ``failed`` when it raises an ``Exception`` (nothing for
        ``KeyboardInterrupt`` and the like, which say nothing about the proxy), or what the
        block set with :meth:`Leased.report_as`.

        The release and the report go with the next assign to the pool from this thread
        (the next block's, typically), which applies them before its pick, or alone after
        ``done_delay`` seconds, on ``close()`` or at interpreter exit, whichever comes
        first; ``carry_done`` (the client's by default) ``False`` sends them when the block
        ends. ``leased.done`` says what this block's assign did with the previous end.

        Entering raises :class:`NoProxyAvailable` when the pool has no member to give
        (HTTP 204), and the errors of :meth:`assign`. Release and report failures are
        logged, not raised: the block's own result matters more, and an unreleased lease
        is reclaimed once its ttl has passed.
        """
        carry = self.carry_done if carry_done is None else carry_done
        return LeaseScope(self, pool, ttl_ms=ttl_ms, renew=renew, report=report, carry=carry)

    def _call(self, method: str, path: str, body: Optional[Any] = None) -> _Answer:
        """Sends one request on this thread's connection; returns the answer, or raises the
        error matching it."""
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if self._token:
            headers["Authorization"] = "Bearer " + self._token
        connection = self._connections.get()
        try:
            connection.request(method, self._connections.prefix + path, body=data,
                               headers=headers)
            response = connection.getresponse()
            status, raw = response.status, response.read()
            retry_after = response.getheader("Retry-After")
        except (OSError, http.client.HTTPException) as failure:
            # Refused, reset and timed-out connections are OSErrors; nothing is sent twice
            # (an assign is not idempotent), the next call opens a new connection.
            self._connections.drop(connection)
            raise Unreachable(None, "unreachable", "cannot reach {}: {}".format(
                self.base_url, failure)) from failure
        if response.will_close:
            self._connections.drop(connection)
        else:
            self._connections.idle()
        return _answer(status, raw, retry_after)


def _assigned(pool: str, answer: _Answer, raise_if_empty: bool,
              count: Optional[int] = None) -> Union[Optional[Assignment], List[Assignment]]:
    """The assignment in an assign's answer (with ``count``, the list of them); ``None``
    (an empty list) or :class:`NoProxyAvailable` on 204."""
    if answer.status == 204 or answer.data is None:
        if raise_if_empty:
            raise NoProxyAvailable(pool, retry_after=answer.retry_after)
        return None if count is None else []
    if count is not None:
        batch = [Assignment.from_json(entry) for entry in answer.data["assigned"]]
        done = answer.data.get("done")
        if batch and done is not None:
            batch[0].done = DoneEffect.from_json(done)
        return batch
    return Assignment.from_json(answer.data)


class _Connections:
    """One kept-alive connection to the service per thread, and all of them for ``close``.

    A connection idle for ``idle_timeout`` seconds is not reused: the service closes idle
    connections after its own timeout, and a call sent just as it does would fail. One the
    service (or a load balancer) closed anyway is noticed before it is reused. Either way
    the cost is a reconnect, not a failed call.
    """

    def __init__(self, base_url: str, timeout: float, idle_timeout: float) -> None:
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("base_url is http:// or https:// with a host, not {!r}".format(
                base_url))
        self.prefix = parts.path.rstrip("/")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._timeout = timeout
        self._idle_timeout = idle_timeout
        self._local = threading.local()
        self._lock = threading.Lock()
        # Weak: a thread that ends takes its connection with it (its socket closes when it
        # is collected); close_all reaches the ones still in use.
        self._open: "weakref.WeakSet[http.client.HTTPConnection]" = weakref.WeakSet()

    def get(self) -> http.client.HTTPConnection:
        """This thread's connection, a new one if it has none or the other side closed it."""
        connection: Optional[http.client.HTTPConnection] = getattr(self._local, "connection",
                                                                   None)
        if connection is not None:
            idle = time.monotonic() - getattr(self._local, "idle_since", 0.0)
            if idle >= self._idle_timeout or _closed_by_peer(connection):
                self.drop(connection)
                connection = None
        if connection is None:
            if self._https:
                connection = http.client.HTTPSConnection(
                    self._host, self._port, timeout=self._timeout,
                    context=ssl.create_default_context())
            else:
                connection = http.client.HTTPConnection(self._host, self._port,
                                                        timeout=self._timeout)
            self._local.connection = connection
            with self._lock:
                self._open.add(connection)
        return connection

    def idle(self) -> None:
        """Notes that this thread's connection is idle from now."""
        self._local.idle_since = time.monotonic()

    def close_current(self) -> None:
        """Closes this thread's connection, for a thread that is done calling."""
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            self.drop(connection)

    def drop(self, connection: http.client.HTTPConnection) -> None:
        """Closes a connection and forgets it."""
        connection.close()
        if getattr(self._local, "connection", None) is connection:
            self._local.connection = None
        with self._lock:
            self._open.discard(connection)

    def close_all(self) -> None:
        """Closes every thread's connection."""
        with self._lock:
            connections, self._open = list(self._open), weakref.WeakSet()
        for connection in connections:
            connection.close()
        self._local = threading.local()


def _closed_by_peer(connection: http.client.HTTPConnection) -> bool:
    """Whether an idle connection can no longer be used: between two answers nothing is due
    from the service, so a readable socket means it was closed (or sent something
    unexpected, which makes it unusable too)."""
    sock: Optional[socket.socket] = connection.sock
    if sock is None:
        return False
    try:
        if hasattr(select, "poll"):
            # poll, unlike select, takes descriptors above 1023 (busy workers have them).
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            return bool(poller.poll(0))
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


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
        # A third of the ttl leaves two more tries before expiry when one renewal fails.
        interval = max(self._ttl_ms / 3000.0, 0.01)
        try:
            self._renew_until_stopped(interval)
        finally:
            # This thread's connection would otherwise stay open until the client closes.
            self._client._connections.close_current()

    def _renew_until_stopped(self, interval: float) -> None:
        leased = self._leased
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


def _leased(pool: str, assigned: Assignment) -> Leased:
    """The assignment as a lease block's value; refused on a pool that gives no leases."""
    if assigned.lease is None:
        raise ProxyAllocatorError(
            200, "no_lease", "pool {!r} gives no leases (least-used): use assign()".format(pool))
    return Leased(pool=assigned.pool, proxy=assigned.proxy, assignments=assigned.assignments,
                  in_flight=assigned.in_flight, lease=assigned.lease, done=assigned.done)


class _Scope:
    """What a lease block (blocking or asyncio) was asked for, and the lease it holds."""

    def __init__(self, pool: str, ttl_ms: Optional[int], renew: bool, report: bool,
                 carry: bool) -> None:
        self._pool = pool
        self._ttl_ms = ttl_ms
        self._renew = renew
        self._report = report
        self._carry = carry
        self._leased: Optional[Leased] = None


class LeaseScope(_Scope):
    """The context manager returned by :meth:`Client.lease`."""

    def __init__(self, client: Client, pool: str, ttl_ms: Optional[int], renew: bool,
                 report: bool, carry: bool = True) -> None:
        super().__init__(pool, ttl_ms, renew, report, carry)
        self._client = client
        self._renewer: Optional[_Renewer] = None

    def __enter__(self) -> Leased:
        assigned = self._client.assign(self._pool, ttl_ms=self._ttl_ms, raise_if_empty=True)
        assert assigned is not None
        leased = _leased(self._pool, assigned)
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
        outcome = _exit_outcome(leased, exc_type) if self._report else None
        ended = _ended(leased, outcome, self._client.done_delay)
        if self._carry:
            self._client._keep(ended)
        else:
            _send_alone(self._client, ended)


def _send_alone(client: Client, ended: _Ended) -> None:
    """Releases an ended block's lease and reports its outcome, each in a call of its own;
    failures are logged."""
    try:
        client.release(ended.pool, ended.lease)
    except ProxyAllocatorError as error:
        logger.warning("lease release failed: %s", error,
                       extra={"pool": ended.pool, "lease": ended.lease})
    if ended.result is None:
        return
    try:
        ended.leased.reported = client.report(ended.pool, ended.leased.proxy, ended.result,
                                              ended.status)
    except ProxyAllocatorError as error:
        logger.warning("outcome report failed: %s", error, extra={"pool": ended.pool})


class _Sender(threading.Thread):
    """Sends alone each lease block's end of a client that no assign carried before it was
    due. Ends when none is left (the next end starts another) or when stopped."""

    def __init__(self, client: Client) -> None:
        super().__init__(name="proxy-allocator-done", daemon=True)
        self._client: Optional[Client] = client
        self._stopping = False
        #: Set when an end due sooner than the ones waiting joins them.
        self.wake = threading.Event()

    def stop(self) -> None:
        """Stops sending and waits for an ongoing send to end; the waiting ends are the
        caller's to send."""
        self._stopping = True
        self.wake.set()
        if self is not threading.current_thread():
            self.join()

    def run(self) -> None:
        client = self._client
        assert client is not None
        # The client keeps this thread (for close); without a reference back, no cycle
        # delays the client's collection, whose closing of its connections needs them still
        # reachable (the garbage collector clears the weak ones of a cycle first).
        self._client = None
        unsent = client._unsent
        try:
            while not self._stopping:
                self.wake.clear()
                for ended in unsent.take_due(time.monotonic()):
                    _send_alone(client, ended)
                soonest = unsent.soonest()
                if soonest is None:
                    if unsent.retire():
                        return
                    continue
                self.wake.wait(max(soonest - time.monotonic(), 0.0))
            unsent.retire(stopped=True)
        finally:
            # This thread's connection would otherwise stay open until the client closes.
            client._connections.close_current()
