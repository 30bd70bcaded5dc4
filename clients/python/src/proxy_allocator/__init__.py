"""Client for the proxy-allocator service (standard library only, Python 3.9+).

Workers ask a pool for a proxy before each outgoing request, skip the request when the pool
has none (``assign`` returns ``None``), and on least-in-flight pools hold a lease for the
length of the request (``with client.lease(pool) as leased:``).
"""

from .client import (
    DEFAULT_TIMEOUT,
    RESULTS,
    Assignment,
    Client,
    Lease,
    Leased,
    LeaseScope,
    Outcome,
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
    "Assignment",
    "Client",
    "DEFAULT_TIMEOUT",
    "Forbidden",
    "Lease",
    "LeaseScope",
    "Leased",
    "NoProxyAvailable",
    "NotFound",
    "Outcome",
    "ProxyAllocatorError",
    "RESULTS",
    "Unauthorized",
    "Unavailable",
    "Unreachable",
]
