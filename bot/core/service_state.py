"""How a run left the service on a host, as a value rather than a sentence.

Summaries ("... the service is DOWN", "UP but NOT READY") are rendered from this; tests,
the audit log (`audit --json`) and the front ends read the value. A run's state is the
worst of its hosts' (``worst``): one host left down makes the run's service down.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class ServiceState(StrEnum):
    # The unit is active and answered its health check (or, for a run that never touched
    # it, preflight read it active).
    UP = "up"
    # The unit is active but its health gate never passed: it may serve nothing.
    UP_NOT_READY = "up_not_ready"
    # The unit was started and is not running (failed, exited, crash loop).
    DOWN = "down"
    # The run stopped the unit and it was not started again (start refused, abandoned).
    STOPPED = "stopped"
    # The state could not be read (host lost, query refused).
    UNKNOWN = "unknown"


# Worst first: the order in which a run's hosts decide the run's state.
_SEVERITY = (
    ServiceState.DOWN,
    ServiceState.STOPPED,
    ServiceState.UNKNOWN,
    ServiceState.UP_NOT_READY,
    ServiceState.UP,
)


def worst(states: Iterable[ServiceState]) -> ServiceState:
    """The run's state from its hosts' (UNKNOWN for a run with no host outcome)."""
    seen = set(states)
    return next((s for s in _SEVERITY if s in seen), ServiceState.UNKNOWN)
