"""Fencing (issue 21): a run's writes are its owner's only while the run's epoch is the
one the owner took.

The epoch (``runs.epoch``) moves on at each change of owner and at each recovery
(``bot.audit.runs``). A driver remembers the epoch it took when it started the run, and
every write it makes directly checks it in the same transaction, before anything is
written: a replica that was paused past its lease (a GC pause, a frozen VM,
``SIGSTOP``) while another recovered the run finds the epoch moved and writes nothing
(``FencedError``), so it stops driving instead of acting on a host as an owner it no
longer is. Records merged from a fallback journal are not fenced: they tell what a
driver did while the database could not be written, which is history, not a claim."""

from __future__ import annotations

from dataclasses import dataclass

from bot.audit.db import Conn, fetch
from bot.errors import FencedError


@dataclass(frozen=True, slots=True)
class Fence:
    run_id: int
    epoch: int


async def check(conn: Conn, fence: Fence) -> None:
    """Raise ``FencedError`` unless run ``fence.run_id`` is still at ``fence.epoch``."""
    rows = await fetch(conn, "SELECT epoch, status FROM runs WHERE id = ?", (fence.run_id,))
    if rows and int(rows[0]["epoch"]) == fence.epoch:
        return
    now = f"epoch {rows[0]['epoch']}, {rows[0]['status']}" if rows else "gone"
    raise FencedError(
        f"run #{fence.run_id} is no longer this process's to drive (it took epoch "
        f"{fence.epoch}; the run is now {now}): another replica recovered it"
    )
