"""The package change a redeploy would make, read when it is requested (issue 10).

Approvers must see that a vLLM upgrade also moves torch and the CUDA wheels *before* they
approve, so the card cannot wait for the preflight: at request time each host's venv is
frozen and the install is dry-run (``bot.core.flows.preview_flow``, read-only), driven by
the same executor as a run (``bot.engine.host_reads``), with no run and no audit record
of its own. The front end
records the result with the run (``environments``, kind ``preview``) and shows it on the
card; the terminal prints it before asking for confirmation.

A host that cannot be read is shown as such (unknown stays unknown): the preflight reads
the same again before anything changes, and refuses if it still cannot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import assert_never

from bot.audit.records import EnvironmentRecord
from bot.audit.store import AuditLog
from bot.core import events as ev
from bot.core.flows import preview_flow
from bot.core.packages import EnvKind, PackageDiff
from bot.core.plan import Plan
from bot.core.status import Action, HostStatus
from bot.engine.host_reads import HostRead, read_hosts
from bot.hosts.pool import HostPool
from bot.settings import Settings


@dataclass(frozen=True, slots=True)
class HostPreview:
    host: str
    diff: PackageDiff | None  # None: could not be read (``error`` says why)
    error: str | None = None


class _Collect:
    def __init__(self) -> None:
        self.diff: PackageDiff | None = None

    async def handle(self, event: ev.Event) -> None:
        match event:
            case ev.PackagesKnown(diff=diff) if diff is not None:
                self.diff = diff
            case (
                ev.PackagesKnown()
                | ev.RunStarted()
                | ev.StepStarted()
                | ev.StepProgress()
                | ev.OutputLine()
                | ev.StepFinished()
                | ev.GpuTable()
                | ev.VersionsKnown()
                | ev.GpuHealthKnown()
                | ev.HostFinished()
                | ev.RunFinished()
                | ev.Notice()
                | ev.RotationChanged()
                | ev.ReleaseSwitched()
            ):
                # A preview only wants the planned change; a package event without one
                # (the dry run could not tell) leaves it unknown, and the rest are the
                # dry run's own progress, which nobody is shown.
                pass
            case _:
                assert_never(event)


async def preview(settings: Settings, pool: HostPool, plan: Plan) -> tuple[HostPreview, ...]:
    """Each host's package change for a redeploy (none for another action or a dry run,
    whose preflight shows it anyway). The dry run runs as the venv's owner, through sudo
    where the host says so, exactly as the preflight runs it."""
    if plan.action != Action.REDEPLOY or plan.dry_run:
        return ()
    svc = settings.services[plan.service]
    reads = await read_hosts(
        settings, pool, plan, lambda host: preview_flow(plan, svc, host), _Collect
    )
    return tuple(_preview_of(r) for r in reads)


def _preview_of(read: HostRead[_Collect]) -> HostPreview:
    if read.outcome is None:
        return HostPreview(read.host, None, read.error)
    if read.outcome.status != HostStatus.SUCCEEDED or read.collected.diff is None:
        return HostPreview(read.host, None, read.outcome.summary)
    return HostPreview(read.host, read.collected.diff)


def preview_lines(previews: tuple[HostPreview, ...], *, limit: int | None = None) -> list[str]:
    """The change as the card and the terminal show it: hosts with the same change share
    one list; a host that could not be read says why."""
    if not previews:
        return []
    groups: dict[PackageDiff, list[str]] = {}
    out: list[str] = []
    for p in previews:
        if p.diff is None:
            out.append(
                f"{p.host}: could not be read ({p.error}); the preflight reads it "
                "again before anything changes"
            )
        else:
            groups.setdefault(p.diff, []).append(p.host)
    for diff, hosts in groups.items():
        if len(groups) > 1 or out:
            out.append(f"on {', '.join(hosts)}:")
        out += diff.lines(limit)
    return out


def preview_json(p: HostPreview) -> dict[str, object]:
    """What the ``environments`` table keeps of a preview (kind ``preview``)."""
    return {**p.diff.to_json()} if p.diff is not None else {"note": p.error or "unknown"}


async def record_previews(audit: AuditLog, run_id: int, previews: tuple[HostPreview, ...]) -> None:
    """Keep what was shown with the run (``environments``, kind ``preview``)."""
    for p in previews:
        await audit.add_environment(run_id, p.host, str(EnvKind.PREVIEW), preview_json(p))


# The card lists this many changes at most (highlighted ones first), then how many more.
CARD_LIMIT = 25


def previews_of(records: Sequence[EnvironmentRecord]) -> tuple[HostPreview, ...]:
    """The previews recorded with a run, as they were shown."""
    out = []
    for r in records:
        if r.kind != EnvKind.PREVIEW:
            continue
        if "changes" in r.data:
            out.append(HostPreview(r.host, PackageDiff.from_json(r.data)))
        else:
            out.append(HostPreview(r.host, None, str(r.data.get("note") or "unknown")))
    return tuple(out)
