"""Per-user rate limits on what anyone in an allowed channel may ask for.

Read-only commands (gpus, status, logs, audit) need no approval, and each posts an
answer in the channel: without a limit one member could keep the channel's posting
queue full.  Time comes from an injected clock, so a test decides when tokens refill.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

# The key under which create_app's middleware puts the read-only ``UserRateLimit`` in
# bolt's context (one per app, so the allowance holds across requests).
LIMIT_KEY = "read_only_limit"
# A burst this big, then one more every 60 / READ_ONLY_PER_MINUTE seconds.
READ_ONLY_PER_MINUTE = 6
# Beyond this many users tracked, forget the ones whose bucket has refilled.
_PRUNE_AT = 10_000


class UserRateLimit:
    """A token bucket per user: ``per_minute`` requests at once, refilled at
    ``per_minute`` a minute."""

    def __init__(
        self, per_minute: int = READ_ONLY_PER_MINUTE, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if per_minute < 1:
            raise ValueError("per_minute must be at least 1")
        self.per_minute = per_minute
        self._rate = per_minute / 60.0  # tokens a second
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # user -> (tokens, as of)

    def _tokens(self, user: str, now: float) -> float:
        tokens, as_of = self._buckets.get(user, (float(self.per_minute), now))
        return min(float(self.per_minute), tokens + (now - as_of) * self._rate)

    def take(self, user: str) -> int | None:
        """Spend one of ``user``'s tokens: None when there was one, else the whole
        seconds until there is."""
        now = self._clock()
        tokens = self._tokens(user, now)
        if tokens >= 1.0:
            self._buckets[user] = (tokens - 1.0, now)
            self._prune(now)
            return None
        self._buckets[user] = (tokens, now)
        return max(1, math.ceil((1.0 - tokens) / self._rate))

    def _prune(self, now: float) -> None:
        if len(self._buckets) > _PRUNE_AT:
            self._buckets = {
                u: b for u, b in self._buckets.items() if self._tokens(u, now) < self.per_minute
            }
