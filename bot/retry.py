"""One back-off for every loop of the bot that waits before it tries again: exponential,
capped, with jitter, so that many waiters (a run's thread and the cards of others
after a Slack outage; several writers behind a locked database) do not come back in
step and hit the same limit together.

The ``n``-th wait is ``min(max_s, initial_s * factor ** (n - 1) + uniform(0, jitter_s))``:
stamina's formula. Why not stamina's own loop: it sleeps on
``asyncio.sleep`` and measures its time budget on ``time.monotonic``, neither of which a
test can replace, and the callers here are tested on injected time (the audit writer's
retry window is decided by its ``clock``; the Slack reporter's waits are counted, not
slept). So ``Backoff`` gives the waits and ``retry`` is the one loop, both with the
clock, the sleep and the randomness injectable.

* ``Backoff.delay(n)`` / ``Backoff.delays()``: the waits, for a loop that is not one
  call retried (the reporter's queue, whose next try may be another message; the
  journal merger, which sleeps before it tries).
* ``retry(attempt, on=..., backoff=..., budget_s=...)``: one call until it works, retried
  while ``on(exc)`` says a later try can fix it, within a time budget.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

# A number in [0, 1): how much of the jitter a wait gets.
Random = Callable[[], float]


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long to wait before each retry (seconds)."""

    initial_s: float
    max_s: float = math.inf
    jitter_s: float = 0.0  # at most this much is added to each wait, at random
    factor: float = 2.0

    def delay(self, retry: int, rand: Random = random.random) -> float:
        """The wait before retry number ``retry`` (1 for the first)."""
        try:
            base = self.initial_s * self.factor ** (retry - 1)
        except OverflowError:
            return self.max_s
        return min(self.max_s, base + rand() * self.jitter_s)

    def delays(self, rand: Random = random.random) -> Iterator[float]:
        """The waits before the first, second, ... retry, without end."""
        return (self.delay(n, rand) for n in itertools.count(1))


async def retry(
    attempt: Callable[[], Awaitable[T]],
    *,
    on: Callable[[Exception], bool],
    backoff: Backoff,
    budget_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    rand: Random = random.random,
) -> T:
    """``attempt()`` until it returns. An error ``on`` accepts is tried again after the
    next wait of ``backoff``, as long as that wait ends within ``budget_s`` of the first
    try (None: no limit); any other error, or one whose wait would end past the budget,
    is raised."""
    started = clock()
    for n in itertools.count(1):
        try:
            return await attempt()
        except Exception as exc:
            delay = backoff.delay(n, rand)
            if not on(exc) or (budget_s is not None and clock() - started + delay > budget_s):
                raise
            log.warning("%s; retrying in %.2fs", exc, delay)
        await sleep(delay)
    raise AssertionError("unreachable")  # itertools.count never ends
