"""Client for the proxy-allocator service (standard library only, Python 3.9+).

Workers ask a pool for a proxy before each outgoing request, skip the request when the pool
has none (``assign`` returns ``None``), and on least-in-flight pools hold a lease for the
length of the request (``with client.lease(pool) as leased:``).

:class:`AsyncClient` (the same for asyncio, ``pip install 'proxy-allocator[async]'``) and
``proxy_allocator.scrapy.ProxyAllocatorMiddleware`` (``proxy-allocator[scrapy]``) need
aiohttp; they are imported on first use, so the blocking client stays standard library only.
"""

from typing import Any

from .client import (
    DEFAULT_DONE_DELAY,
    DEFAULT_TIMEOUT,
    RESULTS,
    Assignment,
    Client,
    Done,
    DoneEffect,
    Lease,
    Leased,
    LeaseScope,
    Outcome,
    Session,
    Source,
    SourceFetch,
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

__all__ = [
    "AsyncClient",
    "AsyncLeaseScope",
    "Assignment",
    "Client",
    "DEFAULT_DONE_DELAY",
    "DEFAULT_TIMEOUT",
    "Done",
    "DoneEffect",
    "Forbidden",
    "Lease",
    "LeaseScope",
    "Leased",
    "NoProxyAvailable",
    "NotFound",
    "Outcome",
    "ProxyAllocatorError",
    "RESULTS",
    "Session",
    "Source",
    "SourceFetch",
    "Unauthorized",
    "Unavailable",
    "Unreachable",
]


def __getattr__(name: str) -> Any:
    # The asyncio client needs aiohttp, an optional extra: imported only when asked for.
    if name in ("AsyncClient", "AsyncLeaseScope"):
        from . import aio

        return getattr(aio, name)
    raise AttributeError("module {!r} has no attribute {!r}".format(__name__, name))
