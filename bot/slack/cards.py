"""A run's card as a pure function of its audit record: the plan as it was approved,
the approvals that count now, and the checklist as the steps table recorded it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from bot.audit.store import RunRecord, StepRecord, parse_ts
from bot.core.plan import HostTarget, Plan, PlannedStep, Step
from bot.core.policy import Membership, counted_approvals, run_policy
from bot.core.routers.target import RouterTarget
from bot.core.status import FINAL_STATUSES, Action, StepStatus
from bot.settings import PolicySettings
from bot.slack.blocks import CardView, StepLine, initial_steps

DRY_RUN_NOTE = "Dry run: preflight only, nothing on the host changes; no approval needed."


def plan_from_record(record: RunRecord) -> Plan:
    """The plan as it was requested and shown on the card (stored with the run)."""
    return _plan(record.plan)


def _router(r: dict[str, Any] | None) -> RouterTarget | None:
    """A host run's part's router, for the card's list of services: a record a newer or
    older bot wrote that does not fit shows the service without it."""
    if r is None:
        return None
    tuples = {k: tuple(v) for k in ("drain", "undrain", "in_flight") if (v := r.get(k))}
    try:
        servers = tuple((h, s) for h, s in r["servers"])
        return RouterTarget(**{**r, **tuples, "servers": servers})
    except (KeyError, TypeError, ValueError):
        return None


def _plan(p: dict[str, Any], part: bool = False) -> Plan:
    return Plan(
        action=Action(p["action"]),
        service=p["service"],
        hosts=tuple(p["hosts"]),
        unit=p["unit"],
        package=p["package"],
        version=p.get("version"),
        spec=p["spec"],
        index_name=p.get("index_name"),
        index_url=p.get("index_url"),
        steps=tuple(PlannedStep(Step(s["step"]), s["command"]) for s in p["steps"]),
        dry_run=bool(p.get("dry_run")),
        batch_size=int(p.get("batch_size") or 1),
        # A run recorded before plans bound their hosts has none: the card shows names only.
        targets=tuple(HostTarget(**t) for t in p.get("targets") or ()),
        force=bool(p.get("force")),
        router=_router(p.get("router")) if part else None,
        # A host's maintenance (issue 23): each service's own plan, and the GPUs named.
        parts=tuple(_plan(q, part=True) for q in p.get("parts") or ()),
        gpus=tuple(int(i) for i in p.get("gpus") or ()),
    )


def card_view(
    record: RunRecord,
    policy: PolicySettings,
    membership: Membership | None = None,
    *,
    now: datetime | None = None,
) -> CardView:
    """The card of ``record`` before any step output: with ``membership``, only the
    approvals that count under the policy now are shown (a pending card's progress).
    ``policy`` is the run's service's own (``Settings.policy_for``): the card names who
    may approve that service and how many must (more for an emergency override, issue
    22). ``now``: the instant a scheduled run's countdown counts from."""
    policy = run_policy(policy, override=record.override)
    plan = plan_from_record(record)
    approvals = tuple(record.approved_by)
    if membership is not None:
        approvals = counted_approvals(
            approvals, requester=record.requested_by, policy=policy, membership=membership
        )
    return CardView(
        run_id=record.id,
        plan=plan,
        requested_by=record.requested_by,
        status=record.status,
        needed=policy.min_approvals,
        approvers=tuple(policy.approvers),
        approvals=approvals,
        denied_by=tuple(record.denied_by),
        version_now=record.version_before,
        version_after=record.version_after,
        expires_at=parse_ts(record.expires_at) if record.expires_at else None,
        steps=initial_steps(plan),
        summary=record.summary if record.is_final else None,
        notes=(DRY_RUN_NOTE,) if plan.dry_run else (),
        scheduled_at=parse_ts(record.scheduled_at) if record.scheduled_at else None,
        schedule_zone=policy.timezone,
        now=now,
        override=record.override,
    )


def with_recorded_steps(view: CardView, steps: Iterable[StepRecord]) -> CardView:
    """The checklist as the audit log recorded it; planned steps that never ran are
    shown as skipped once the run is over."""
    lines = list(view.steps)
    used: set[int] = set()
    for rec in steps:
        # A status this bot does not know (a newer bot wrote it) shows as a failure.
        state = rec.status if rec.status in StepStatus else StepStatus.FAILED
        line = StepLine(rec.host, Step(rec.step), state, rec.duration_s)
        # In order: a step a run took twice (each service of a host) fills its lines in turn.
        index = next(
            (
                i
                for i, s in enumerate(lines)
                if (s.host, s.step) == (line.host, line.step) and i not in used
            ),
            None,
        )
        if index is None:
            lines.append(line)
            used.add(len(lines) - 1)
        else:
            lines[index] = line
            used.add(index)
    if view.status in FINAL_STATUSES:
        lines = [
            dataclasses.replace(s, state=StepStatus.SKIPPED) if s.state == StepStatus.PENDING else s
            for s in lines
        ]
    return dataclasses.replace(view, steps=tuple(lines))
