"""The exceptions the client raises, one class per answer a worker handles differently."""

from typing import Optional


class ProxyAllocatorError(Exception):
    """An error answer of the service, or no answer at all.

    ``status`` is the HTTP status (``None`` when the service could not be reached),
    ``code`` the service's stable snake_case error code and ``message`` its human text.
    """

    def __init__(self, status: Optional[int], code: str, message: str) -> None:
        super().__init__("{} ({}{})".format(
            message, code, "" if status is None else ", HTTP {}".format(status)))
        self.status = status
        self.code = code
        self.message = message


class Unauthorized(ProxyAllocatorError):
    """401: no token, or a token the service does not accept on this route."""


class Forbidden(ProxyAllocatorError):
    """403: a valid token without the right to this route (the worker token on an admin route)."""


class NotFound(ProxyAllocatorError):
    """404: ``code`` says what is missing (``pool_not_found``, ``lease_not_found``, ``not_found``)."""


class Unavailable(ProxyAllocatorError):
    """503: the service cannot reach its store; retry after ``retry_after`` seconds.

    Also raised (as :class:`Unreachable`) when the service itself gives no answer, so that
    ``except Unavailable`` covers every "try again later".
    """

    def __init__(self, status: Optional[int], code: str, message: str,
                 retry_after: Optional[float] = None) -> None:
        super().__init__(status, code, message)
        self.retry_after = retry_after


class Unreachable(Unavailable):
    """No HTTP answer: connection refused, reset or timed out. ``status`` is ``None``."""


class NoProxyAvailable(ProxyAllocatorError):
    """Raised by :meth:`Client.lease` when the pool has no member to give (HTTP 204).

    :meth:`Client.assign` returns ``None`` instead (unless asked to raise); a ``with``
    block cannot be skipped by a value, so the lease raises, and the worker skips its
    request in an ``except``. ``retry_after`` is the service's ``Retry-After`` in seconds:
    when the first member cooling down returns (``None`` when none is cooling down).
    """

    def __init__(self, pool: str, retry_after: Optional[float] = None) -> None:
        super().__init__(204, "no_proxy_available",
                         "pool {!r} has no member to give right now".format(pool))
        self.pool = pool
        self.retry_after = retry_after
