"""The clocks a process judges time by, and whose clocks they are.

Two bot instances (or a bot and a CLI) on different machines do not share a wall clock:
30 s of skew is ordinary. A deadline written with one wall clock is only meaningful to
a reader of the same one, and a length of time is only measured honestly on one
monotonic clock. So each clock comes with an id saying who shares it:

* the wall clock (CLOCK_REALTIME) is one per running kernel, whatever the namespaces
  (time namespaces do not virtualise it): its id is the boot id;
* the monotonic clock (CLOCK_MONOTONIC) is one per running kernel and time namespace:
  two processes with the same boot id and time namespace read the same one, so a
  reading one of them stored can be compared with the other's (``bot.engine.liveness``
  keeps its sightings in the audit log for that reason). Where either cannot be read,
  the id is this process's own, and its readings mean something to itself alone.

Tests inject both (``RunLifecycle(clock=..., monotonic=..., wall_id=...)``).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from bot.engine.owner import PROC, boot_id, namespace_inode

Clock = Callable[[], datetime]


@dataclass(frozen=True, slots=True)
class Monotonic:
    """A monotonic clock (seconds) and its id: readings under one id compare."""

    read: Callable[[], float]
    id: str

    def __call__(self) -> float:
        return self.read()


def monotonic_id(proc: Path = PROC) -> str:
    boot, timens = boot_id(proc), namespace_inode("time", proc)
    if boot is not None and timens is not None:
        return f"{boot}/timens={timens}"
    # Nobody can tell whether another process shares our clock: only we compare with it.
    return f"{boot or 'unknown-boot'}/process={os.getpid()}-{uuid.uuid4().hex}"


def system_monotonic(proc: Path = PROC) -> Monotonic:
    return Monotonic(time.monotonic, monotonic_id(proc))


def wall_clock_id(proc: Path = PROC) -> str | None:
    """Whose wall clock this process reads (the boot id), or None when unknown."""
    return boot_id(proc)
