"""``doctor``'s approvers rows (issue 22): for each service checked, who may approve its
runs under its effective policy (``Settings.policy_for``), with each user group's size
where Slack could be asked, and whether enough people exist to approve a run at all.

Pure: the edge (``bot.engine.slack_groups``) reads the groups' members and hands them
in; a group it could not read is named with why, never counted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from bot.core.doctor_types import Check, Outcome
from bot.settings import Settings

CHECK = "approvers"
# The HOST column of a row about a service's policy, which no host holds.
NO_HOST = "-"


def services_checked(settings: Settings, hosts: Sequence[str], service: str | None) -> list[str]:
    """The services whose approvers a doctor of ``hosts`` (or of ``service``) lists."""
    return [
        name
        for name, svc in settings.services.items()
        if service in (None, name) and set(svc.hosts) & set(hosts)
    ]


def _entry(entry: str, members: Mapping[str, frozenset[str]], unresolved: str) -> str:
    if not entry.startswith("S"):
        return entry
    found = members.get(entry)
    if found is None:
        return f"{entry} (members not resolved: {unresolved or 'Slack did not answer'})"
    noun = "member" if len(found) == 1 else "members"
    return f"{entry} ({len(found)} {noun})"


def approver_checks(
    settings: Settings,
    services: Sequence[str],
    members: Mapping[str, frozenset[str]],
    unresolved: str = "",
) -> list[Check]:
    """One row per service: its approvers and how many approvals it needs. ``members``
    are the groups Slack answered for; ``unresolved`` says why the others were not read
    (no token, an API error)."""
    out: list[Check] = []
    for name in services:
        policy = settings.policy_for(name)
        own = settings.services[name].policy
        whose = "own" if own.approvers is not None else "from [policy]"
        needed = policy.min_approvals
        noun = "approval" if needed == 1 else "approvals"
        if not policy.approvers:
            slack = settings.slack_bot_token is not None
            out.append(
                Check(
                    NO_HOST,
                    name,
                    CHECK,
                    Outcome.FAIL if slack else Outcome.OK,
                    "nobody is named: the Slack bot refuses to start so; the terminal "
                    "operator's confirmation approves their own runs",
                    f"name approvers in [policy] or [services.{name}.policy]",
                )
            )
            continue
        listed = ", ".join(_entry(e, members, unresolved) for e in policy.approvers)
        detail = f"{listed} ({whose}); {needed} {noun} needed"
        groups = [e for e in policy.approvers if e.startswith("S")]
        if any(g not in members for g in groups):
            fix = _fix(groups, token=settings.slack_bot_token is not None)
            out.append(Check(NO_HOST, name, CHECK, Outcome.WARN, detail, fix))
            continue
        people = {e for e in policy.approvers if not e.startswith("S")}
        people |= {u for g in groups for u in members[g]}
        if len(people) < needed:
            out.append(
                Check(
                    NO_HOST,
                    name,
                    CHECK,
                    Outcome.FAIL,
                    f"{detail}, but only {len(people)} can approve: no run could be approved",
                    f"add approvers or lower min_approvals for {name}",
                )
            )
            continue
        out.append(Check(NO_HOST, name, CHECK, Outcome.OK, detail))
    return out


def _fix(groups: Sequence[str], *, token: bool) -> str:
    if not token:
        return f"set SLACK_BOT_TOKEN (scope usergroups:read) to resolve {', '.join(groups)}"
    return f"check that {', '.join(groups)} exist and the bot has usergroups:read"
