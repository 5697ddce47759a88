"""What a run's flow may ask of the audit log while it runs: which replicas a run left
out of a router's rotation (a replica drained by hand must never count as serving), and
the switches of a host's release link (where a rollback by hand goes). An unreadable log
is said, never read as "none"."""

from __future__ import annotations

from typing import assert_never

from bot.audit.rotations import left_out
from bot.audit.store import AuditLog
from bot.core.phases.actions import (
    ReadRotationRecords,
    ReadSwitchHistory,
    RotationRecords,
    SwitchHistory,
)
from bot.errors import AuditError


async def switch_history(audit: AuditLog, service: str, host: str) -> SwitchHistory:
    """The audit log's switches of ``service``'s link on ``host``, oldest first; an
    unreadable log is said (a rollback then says it went by the build times)."""
    try:
        rows = await audit.switch_history(service, host)
    except AuditError as e:
        return SwitchHistory((), f"the audit log cannot say: {e}")
    return SwitchHistory(tuple(r.switch() for r in rows))


class AuditReads:
    """The audit log's answers to a flow's reads; ``audit`` None: a read driven with no
    audit log (a request's preview), which says so."""

    def __init__(self, audit: AuditLog | None = None) -> None:
        self.audit = audit

    async def answer(
        self, action: ReadRotationRecords | ReadSwitchHistory, host: str
    ) -> RotationRecords | SwitchHistory:
        match action:
            case ReadRotationRecords():
                if self.audit is None:
                    return RotationRecords({}, "no audit log to read the rotation records from")
                return await self._records(self.audit, action.router, action.servers)
            case ReadSwitchHistory():
                if self.audit is None:
                    return SwitchHistory((), "no audit log to read the switches from")
                return await switch_history(self.audit, action.service, host)
            case _:
                assert_never(action)

    @staticmethod
    async def _records(audit: AuditLog, router: str, servers: tuple[str, ...]) -> RotationRecords:
        """Which of ``servers`` the audit log says a run left out of ``router``'s
        rotation; an unreadable log is an error, never "none held out"."""
        try:
            last = await audit.latest_rotations(router, servers)
        except AuditError as e:
            return RotationRecords({}, f"the audit log cannot say: {e}")
        held = left_out(list(last.values()))
        return RotationRecords(
            {
                r.server: f"run #{r.run_id} "
                + ("took it out" if r.change == "out" else "could not put it back")
                for r in held
            }
        )
