"""Who may request, approve, deny and cancel: pure decisions, no I/O.

Policy entries are Slack user IDs (U…/W…) or user-group IDs (S…).  The caller
resolves each group to its members (through Slack, with a cache) and passes the
result in as a ``Membership``; a group missing from it grants nothing, so a
failed lookup fails closed.

Choices this module makes:

* An empty ``requesters`` list means anyone may request; an empty ``approvers``
  list means anyone may approve (the requester still only with
  ``allow_self_approval``).
* Everything is judged at click time against the *current* policy and
  membership.  Someone removed from the approvers cannot approve a card posted
  before, and approvals they recorded earlier stop counting towards N. A run
  approved for later is judged so again when it is due (``approvals_lapsed``).
* A request needs N = ``min_approvals`` *distinct* eligible approvers; a second
  click by the same person is refused and never counted twice.
* One deny by an eligible approver closes the request.  The requester may also
  deny their own request: that is a withdrawal, allowed whatever the policy.
* A request expires at ``expires_at`` exactly: a click at that instant is late.
  A request already approved or denied reports that rather than expiry.
* With ``allow_self_approval`` the requester's approval counts only if they
  are an approver themselves.
* A service may have its own requesters, approvers and ``min_approvals``
  (``[services.NAME.policy]``); the caller passes that service's effective policy
  (``Settings.policy_for``), so every function here judges one service's rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from bot.core.status import Decision, RunStatus
from bot.settings import PolicySettings

Membership = Mapping[str, frozenset[str]]


def _is_group(entry: str) -> bool:
    return entry.startswith("S")


def _listed(user: str, entries: Sequence[str], membership: Membership) -> bool:
    return any(
        user in membership.get(entry, ()) if _is_group(entry) else user == entry
        for entry in entries
    )


def groups_to_resolve(*policies: PolicySettings) -> frozenset[str]:
    """The user-group IDs the caller must resolve into a ``Membership`` to judge by
    any of ``policies`` (the global one and the services' own)."""
    return frozenset(e for p in policies for e in (*p.requesters, *p.approvers) if _is_group(e))


def run_policy(policy: PolicySettings, *, override: bool) -> PolicySettings:
    """The rule one run is judged by: its service's ``policy``, and for an emergency
    override outside the maintenance window (``--now``, issue 22) that many more
    approvals (``[policy.windows] override_extra_approvals``)."""
    if not override or policy.windows is None:
        return policy
    extra = policy.windows.override_extra_approvals
    return policy.model_copy(update={"min_approvals": policy.min_approvals + extra})


def is_requester(user: str, policy: PolicySettings, membership: Membership) -> bool:
    return not policy.requesters or _listed(user, policy.requesters, membership)


def is_approver(user: str, policy: PolicySettings, membership: Membership) -> bool:
    return not policy.approvers or _listed(user, policy.approvers, membership)


def may_cancel(user: str, requester: str, policy: PolicySettings, membership: Membership) -> bool:
    """The requester or any current approver may cancel a run."""
    return user == requester or is_approver(user, policy, membership)


def _counts(user: str, requester: str, policy: PolicySettings, membership: Membership) -> bool:
    if user == requester and not policy.allow_self_approval:
        return False
    return is_approver(user, policy, membership)


def counted_approvals(
    approvals: Sequence[str], *, requester: str, policy: PolicySettings, membership: Membership
) -> tuple[str, ...]:
    """The distinct approvers whose clicks count now, in order of first click."""
    seen: dict[str, None] = {}
    for user in approvals:
        if user not in seen and _counts(user, requester, policy, membership):
            seen[user] = None
    return tuple(seen)


def approvals_lapsed(
    approvals: Sequence[str], *, requester: str, policy: PolicySettings, membership: Membership
) -> str | None:
    """Why approvals recorded earlier no longer approve the run under ``policy`` and
    ``membership`` as they are now (None: they still do). A run approved for later is
    judged again at its start: an approver removed from the list or the group since, or
    ``min_approvals`` raised, leaves it short."""
    counted = counted_approvals(
        approvals, requester=requester, policy=policy, membership=membership
    )
    needed = policy.min_approvals
    if len(counted) >= needed:
        return None
    gone = sorted(set(approvals) - set(counted))
    why = f"; {', '.join(gone)} no longer counts as an approver" if gone else ""
    noun = "approval" if needed == 1 else "approvals"
    return (
        f"its approvals no longer suffice under the current policy: {len(counted)} of the "
        f"{needed} {noun} it needs count now{why}"
    )


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of one click.

    ``accepted`` says whether to record the click; ``reason`` is the sentence
    to show the clicker when it was refused (empty when accepted); ``state`` is
    the request's status after the click (pending approval, approved, denied or
    expired), and ``approvers`` the approvals that count towards ``needed``
    (including this click when it was an accepted approve).
    """

    accepted: bool
    state: RunStatus
    reason: str
    approvers: tuple[str, ...]
    needed: int

    @property
    def progress(self) -> str:
        """E.g. ``1 of 2 approvals``."""
        noun = "approval" if self.needed == 1 else "approvals"
        return f"{len(self.approvers)} of {self.needed} {noun}"


def evaluate_approval(
    *,
    policy: PolicySettings,
    membership: Membership,
    requester: str,
    approvals: Sequence[str],
    denials: Sequence[str],
    clicker: str,
    action: Decision,
    now: datetime,
    expires_at: datetime,
    service: str | None = None,
) -> Verdict:
    """Judge one Approve/Deny click on a pending request.

    ``approvals`` and ``denials`` are the clicks recorded so far (approvals in
    order, duplicates allowed); the click being judged is not among them. ``policy``
    is the request's service's own (``Settings.policy_for``), and ``service`` names
    it in a refusal: a global approver refused on a service with its own approvers
    must see whose list they are missing from.
    """
    listed = "the approvers list" + (f" for {service}" if service else "")
    needed = policy.min_approvals
    counted = counted_approvals(
        approvals, requester=requester, policy=policy, membership=membership
    )

    pending = RunStatus.PENDING_APPROVAL

    def refuse(state: RunStatus, reason: str) -> Verdict:
        return Verdict(False, state, reason, counted, needed)

    if denials:
        return refuse(RunStatus.DENIED, "This request has already been denied.")
    if len(counted) >= needed:
        return refuse(RunStatus.APPROVED, "This request has already been approved.")
    if now >= expires_at:
        return refuse(RunStatus.EXPIRED, "This request has expired; ask for it again.")

    if action == Decision.DENY:
        if clicker == requester or is_approver(clicker, policy, membership):
            return Verdict(True, RunStatus.DENIED, "", counted, needed)
        return refuse(pending, f"You are not on {listed}, so you cannot deny this.")

    if clicker == requester and not policy.allow_self_approval:
        return refuse(pending, "You cannot approve your own request; another approver must.")
    if not is_approver(clicker, policy, membership):
        return refuse(pending, f"You are not on {listed}, so you cannot approve this.")
    if clicker in counted:
        already = refuse(pending, "")
        return refuse(pending, f"You have already approved this ({already.progress} so far).")
    after = (*counted, clicker)
    return Verdict(True, RunStatus.APPROVED if len(after) >= needed else pending, "", after, needed)
