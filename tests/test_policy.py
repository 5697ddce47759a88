"""Approval policy: requesters, approvers, N-of-M with groups, self-approval,
double clicks, expiry and membership changes between post and click."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bot.core.policy import (
    Membership,
    Verdict,
    approvals_lapsed,
    counted_approvals,
    evaluate_approval,
    groups_to_resolve,
    is_approver,
    is_requester,
    may_cancel,
)
from bot.core.status import Decision, RunStatus
from bot.settings import PolicySettings

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
EXPIRES = T0 + timedelta(seconds=900)

ALICE, BOB, CAROL, DAVE, EVE = "U0ALICE", "U0BOB", "U0CAROL", "W0DAVE", "U0EVE"
SRE = "S0SRE"
LEADS = "S0LEADS"
MEMBERS: Membership = {SRE: frozenset({ALICE, BOB, CAROL}), LEADS: frozenset({DAVE})}


def policy(**kw: Any) -> PolicySettings:
    return PolicySettings(**kw)


def click(
    pol: PolicySettings,
    clicker: str,
    action: Decision = Decision.APPROVE,
    *,
    requester: str = ALICE,
    approvals: Sequence[str] = (),
    denials: Sequence[str] = (),
    now: datetime = T0,
    membership: Membership = MEMBERS,
) -> Verdict:
    return evaluate_approval(
        policy=pol,
        membership=membership,
        requester=requester,
        approvals=approvals,
        denials=denials,
        clicker=clicker,
        action=action,
        now=now,
        expires_at=EXPIRES,
    )


# --- who may request / approve / cancel ------------------------------------------


def test_empty_lists_mean_anyone() -> None:
    pol = policy()
    assert is_requester(EVE, pol, {})
    assert is_approver(EVE, pol, {})
    assert groups_to_resolve(pol) == frozenset()


def test_users_and_groups_are_both_honoured() -> None:
    pol = policy(requesters=[SRE, EVE], approvers=[LEADS, CAROL])
    assert groups_to_resolve(pol) == frozenset({SRE, LEADS})
    assert is_requester(ALICE, pol, MEMBERS)  # via group
    assert is_requester(EVE, pol, MEMBERS)  # listed directly
    assert not is_requester(DAVE, pol, MEMBERS)
    assert is_approver(DAVE, pol, MEMBERS)  # via group
    assert is_approver(CAROL, pol, MEMBERS)  # listed directly
    assert not is_approver(ALICE, pol, MEMBERS)


def test_unresolved_group_grants_nothing() -> None:
    pol = policy(requesters=[SRE], approvers=[SRE])
    assert not is_requester(ALICE, pol, {})
    assert not is_approver(ALICE, pol, {})
    # A group ID is never mistaken for a user ID.
    assert not is_approver(SRE, pol, MEMBERS)


def test_may_cancel_is_requester_or_approver() -> None:
    pol = policy(approvers=[LEADS])
    assert may_cancel(ALICE, ALICE, pol, MEMBERS)
    assert may_cancel(DAVE, ALICE, pol, MEMBERS)
    assert not may_cancel(BOB, ALICE, pol, MEMBERS)
    assert may_cancel(BOB, ALICE, policy(), MEMBERS)  # empty approvers: anyone


# --- approvals --------------------------------------------------------------------


def test_single_approval_approves() -> None:
    d = click(policy(approvers=[SRE]), BOB)
    assert (d.accepted, d.state, d.reason, d.approvers) == (True, RunStatus.APPROVED, "", (BOB,))
    assert d.progress == "1 of 1 approval"


def test_n_of_m_with_groups() -> None:
    pol = policy(approvers=[SRE, LEADS], min_approvals=3)
    d1 = click(pol, BOB)
    assert (d1.accepted, d1.state, d1.progress) == (
        True,
        RunStatus.PENDING_APPROVAL,
        "1 of 3 approvals",
    )
    d2 = click(pol, DAVE, approvals=[BOB])
    assert (d2.accepted, d2.state, d2.approvers) == (True, RunStatus.PENDING_APPROVAL, (BOB, DAVE))
    assert d2.progress == "2 of 3 approvals"
    d3 = click(pol, CAROL, approvals=[BOB, DAVE])
    assert (d3.accepted, d3.state, d3.approvers) == (True, RunStatus.APPROVED, (BOB, DAVE, CAROL))


def test_double_click_counts_once() -> None:
    pol = policy(approvers=[SRE, LEADS], min_approvals=2)
    d = click(pol, BOB, approvals=[BOB, BOB])
    assert not d.accepted
    assert d.state == RunStatus.PENDING_APPROVAL
    assert d.reason == "You have already approved this (1 of 2 approvals so far)."
    # Duplicates in the record never inflate the count.
    d = click(pol, DAVE, approvals=[BOB, BOB, BOB])
    assert d.state == RunStatus.APPROVED
    assert d.approvers == (BOB, DAVE)


def test_duplicates_alone_never_reach_n() -> None:
    pol = policy(approvers=[SRE], min_approvals=2)
    assert counted_approvals([BOB, BOB, BOB], requester=ALICE, policy=pol, membership=MEMBERS) == (
        BOB,
    )


def test_non_approver_is_refused() -> None:
    d = click(policy(approvers=[LEADS]), BOB)
    assert not d.accepted
    assert d.state == RunStatus.PENDING_APPROVAL
    assert "not on the approvers list" in d.reason
    assert d.approvers == ()


def test_self_approval_refused_by_default() -> None:
    pol = policy(approvers=[SRE])
    d = click(pol, ALICE, requester=ALICE)
    assert not d.accepted
    assert d.reason == "You cannot approve your own request; another approver must."
    # Even an approval by the requester already on record does not count.
    d = click(pol, BOB, requester=ALICE, approvals=[ALICE])
    assert d.approvers == (BOB,)
    assert d.state == RunStatus.APPROVED


def test_self_approval_allowed_when_configured() -> None:
    pol = policy(approvers=[SRE], min_approvals=2, allow_self_approval=True)
    d = click(pol, ALICE, requester=ALICE)
    assert (d.accepted, d.state, d.approvers) == (True, RunStatus.PENDING_APPROVAL, (ALICE,))
    d = click(pol, BOB, requester=ALICE, approvals=[ALICE])
    assert (d.accepted, d.state) == (True, RunStatus.APPROVED)


def test_self_approval_still_requires_being_an_approver() -> None:
    pol = policy(approvers=[LEADS], allow_self_approval=True)
    d = click(pol, ALICE, requester=ALICE)
    assert not d.accepted
    assert "not on the approvers list" in d.reason


def test_empty_approvers_lets_anyone_but_the_requester_approve() -> None:
    d = click(policy(), EVE)
    assert (d.accepted, d.state) == (True, RunStatus.APPROVED)
    assert not click(policy(), ALICE, requester=ALICE).accepted


def test_removed_approver_cannot_approve_and_no_longer_counts() -> None:
    pol = policy(approvers=[SRE], min_approvals=2)
    bob_left = {SRE: frozenset({ALICE, CAROL})}
    # Bob approved while in the group; he has since been removed.
    d = click(pol, CAROL, approvals=[BOB], membership=bob_left)
    assert (d.accepted, d.state, d.approvers) == (True, RunStatus.PENDING_APPROVAL, (CAROL,))
    # And he cannot approve again now.
    d = click(pol, BOB, approvals=[BOB], membership=bob_left)
    assert not d.accepted
    assert "not on the approvers list" in d.reason


def test_policy_change_raising_n_is_applied_at_click_time() -> None:
    d = click(policy(approvers=[SRE], min_approvals=2), CAROL, approvals=[BOB])
    assert d.state == RunStatus.APPROVED
    d = click(policy(approvers=[SRE], min_approvals=3), CAROL, approvals=[BOB])
    assert d.state == RunStatus.PENDING_APPROVAL


# --- denials ------------------------------------------------------------------------


def test_approvals_recorded_earlier_are_judged_again_by_the_policy_as_it_is_now() -> None:
    """A run approved for later, judged at its start: still enough, or short and why."""

    def lapsed(pol: PolicySettings, members: Membership = MEMBERS) -> str | None:
        return approvals_lapsed([BOB, BOB, CAROL], requester=ALICE, policy=pol, membership=members)

    assert lapsed(policy(approvers=[SRE], min_approvals=2)) is None
    # CAROL left the group: one of two counts now.
    left = {SRE: frozenset({ALICE, BOB})}
    said = lapsed(policy(approvers=[SRE], min_approvals=2), left)
    assert said is not None and "1 of the 2 approvals it needs count now" in said
    assert said.endswith(f"{CAROL} no longer counts as an approver")
    # min_approvals raised to three: nobody left, and still short.
    said = lapsed(policy(approvers=[SRE], min_approvals=3))
    assert said is not None and "2 of the 3 approvals" in said and "no longer counts" not in said
    # A group Slack did not answer for grants nothing: fail closed.
    said = lapsed(policy(approvers=[SRE]), {})
    assert said is not None and "0 of the 1 approval it needs" in said


def test_approver_deny_closes_the_request() -> None:
    pol = policy(approvers=[SRE, LEADS], min_approvals=2)
    d = click(pol, DAVE, Decision.DENY, approvals=[BOB])
    assert (d.accepted, d.state, d.reason) == (True, RunStatus.DENIED, "")
    assert d.approvers == (BOB,)


def test_requester_may_withdraw() -> None:
    # Alice is not an approver, but it is her request.
    d = click(policy(approvers=[LEADS]), ALICE, Decision.DENY, requester=ALICE)
    assert (d.accepted, d.state) == (True, RunStatus.DENIED)


def test_non_approver_cannot_deny() -> None:
    d = click(policy(approvers=[LEADS]), BOB, Decision.DENY)
    assert (d.accepted, d.state) == (False, RunStatus.PENDING_APPROVAL)
    assert d.reason == "You are not on the approvers list, so you cannot deny this."


def test_clicks_after_denial_are_refused() -> None:
    pol = policy(approvers=[SRE])
    for action in (Decision.APPROVE, Decision.DENY):
        d = click(pol, BOB, action, denials=[CAROL])
        assert (d.accepted, d.state) == (False, RunStatus.DENIED)
        assert d.reason == "This request has already been denied."


def test_clicks_after_approval_are_refused() -> None:
    pol = policy(approvers=[SRE])
    for action in (Decision.APPROVE, Decision.DENY):
        d = click(pol, CAROL, action, approvals=[BOB])
        assert (d.accepted, d.state) == (False, RunStatus.APPROVED)
        assert d.reason == "This request has already been approved."


# --- expiry --------------------------------------------------------------------------


@pytest.mark.parametrize("action", [Decision.APPROVE, Decision.DENY])
def test_expiry_boundary(action: Decision) -> None:
    pol = policy(approvers=[SRE])
    just_before = click(pol, BOB, action, now=EXPIRES - timedelta(microseconds=1))
    assert just_before.accepted
    at = click(pol, BOB, action, now=EXPIRES)
    assert (at.accepted, at.state) == (False, RunStatus.EXPIRED)
    assert at.reason == "This request has expired; ask for it again."
    after = click(pol, BOB, action, now=EXPIRES + timedelta(days=1))
    assert (after.accepted, after.state) == (False, RunStatus.EXPIRED)


def test_expired_request_keeps_its_recorded_progress() -> None:
    d = click(policy(approvers=[SRE], min_approvals=2), CAROL, approvals=[BOB], now=EXPIRES)
    assert d.state == RunStatus.EXPIRED
    assert d.progress == "1 of 2 approvals"


def test_decision_is_frozen() -> None:
    d = click(policy(), BOB)
    with pytest.raises(AttributeError):
        d.accepted = False  # type: ignore[misc]
