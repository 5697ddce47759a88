"""The ``release_switches`` table (migration ``0014_release_switches``): every switch of a
side-by-side service's link the bot made on a host (a redeploy's, the switch back after
a failed start, a rollback by hand's), from which release to which. A rollback by hand
goes by it (``bot.core.releases.rollback_target``): the release live before the live
one is the ``from`` of the last switch to it. Who made it is the run's record."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bot.audit.backend import Row
from bot.audit.db import Conn, fetch, insert, qmarks
from bot.audit.records import stored
from bot.core.releases import Switch, SwitchKind

# A rollback by hand reads at most this many of a host's newest switches: the last
# switch to the live release is among the newest, and the history stays one bounded read.
HISTORY = 200


@dataclass(frozen=True, slots=True)
class SwitchRow:
    run_id: int
    service: str
    host: str
    from_release: str | None
    to_release: str
    kind: SwitchKind
    at: str

    def switch(self) -> Switch:
        return Switch(self.from_release, self.to_release, self.run_id, self.kind)


_COLUMNS = "run_id, service, host, from_release, to_release, kind, at"


async def add(
    conn: Conn,
    run_id: int,
    service: str,
    host: str,
    from_release: str | None,
    to_release: str,
    kind: SwitchKind,
    now: str,
) -> int:
    return await insert(
        conn,
        f"INSERT INTO release_switches ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",  # noqa: S608
        (run_id, service, host, from_release, to_release, str(kind), now),
    )


def _row(r: Row) -> SwitchRow:
    return SwitchRow(
        r["run_id"],
        r["service"],
        r["host"],
        r["from_release"],
        r["to_release"],
        stored(SwitchKind, r["kind"], "release switch kind"),
        r["at"],
    )


async def of_runs(conn: Conn, run_ids: Sequence[int]) -> list[SwitchRow]:
    """Every switch these runs made, in the order they were made."""
    if not run_ids:
        return []
    rows = await fetch(
        conn,
        f"SELECT {_COLUMNS} FROM release_switches "  # noqa: S608 - constant
        f"WHERE run_id IN ({qmarks(run_ids)}) ORDER BY id",
        tuple(run_ids),
    )
    return [_row(r) for r in rows]


async def history(conn: Conn, service: str, host: str, limit: int = HISTORY) -> list[SwitchRow]:
    """The newest ``limit`` switches of ``service``'s link on ``host``, oldest first."""
    rows = await fetch(
        conn,
        f"SELECT {_COLUMNS} FROM release_switches "  # noqa: S608 - constant
        "WHERE service = ? AND host = ? ORDER BY id DESC LIMIT ?",
        (service, host, limit),
    )
    return [_row(r) for r in reversed(rows)]
