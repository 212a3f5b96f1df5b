"""Per-client request rate limits, counted by the `limits` library (a moving window per client).

A client is its API key when the server has keys (a hash of it: keys never reach the counters' storage), and its
address otherwise. Several replicas share their counts through a common storage (`TOLK_RATE_LIMIT_STORAGE`, any
URI the `limits` library knows, e.g. a Redis one); the default keeps them in this process.
"""

from __future__ import annotations

import hashlib
import math
import time

from fastapi import Request
from limits import RateLimitItem, parse_many
from limits.storage import storage_from_string
from limits.strategies import MovingWindowRateLimiter

from server.errors import RateLimited


def client_identity(request: Request, api_key: str | None) -> str:
    """Whom a request counts against: its API key (hashed) when it has one, else its address."""
    if api_key:
        return "key:" + hashlib.sha256(api_key.encode()).hexdigest()[:32]
    return "addr:" + (request.client.host if request.client else "unknown")


class RateLimiter:
    """Requests per client within every window of `rules` ("60/minute", "10/second;1000/hour")."""

    def __init__(self, rules: str, storage_uri: str = "memory://") -> None:
        self.items: list[RateLimitItem] = parse_many(rules)
        self.limiter = MovingWindowRateLimiter(storage_from_string(storage_uri))

    def hit(self, identity: str) -> None:
        """Count one request, or raise RateLimited (429) without counting it if any window is full."""
        full = [item for item in self.items if not self.limiter.test(item, identity)]
        if full:
            reset = max(self.limiter.get_window_stats(item, identity).reset_time for item in full)
            wait = max(1, math.ceil(reset - time.time()))
            raise RateLimited(f"rate limit of {', '.join(map(str, full))} reached; retry in {wait} s", wait)
        for item in self.items:
            self.limiter.hit(item, identity)
