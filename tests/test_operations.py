"""The operations service both front ends call (issue 18): each change a person asks of a
run comes back as a typed result, and every refusal is a ``Refused`` with its reason as a
value and a refusals row. Real SQLite, no hosts (nothing here runs a run). The command
table both front ends' parsers are built from is checked at the end."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bot.audit.store import AuditLog, RunRecord
from bot.cli.main import build_parser
from bot.core.commands import Front, commands_of
from bot.core.plan import DRY_RUN_APPROVER, make_plan
from bot.core.policy import Membership
from bot.core.status import Action, Decision, RunStatus
from bot.engine.leftover_gate import LeftoverRequest
from bot.engine.lifecycle import RunLifecycle
from bot.engine.operations import (
    Busy,
    ChatUser,
    LeftoversAlreadyCounted,
    LeftoversApproved,
    LeftoversCounted,
    LeftoverVote,
    Operations,
    Operator,
    Requested,
)
from bot.engine.run_results import Approved, Refusal, Refused
from bot.settings import LOCAL, Settings
from bot.slack import grammar
from bot.slack.handlers.commands.help import DESCRIPTIONS
from tests.support.audit_db import Target
from tests.support.wall_clock import ManualWallClock

ALICE, BOB, CAROL, MALLORY = "U0ALICE", "U0BOB", "U0CAROL", "U0MALLORY"
APPROVERS, REQUESTERS = "S0APPROVERS", "S0REQUESTERS"
MEMBERS: Membership = {APPROVERS: frozenset({BOB, CAROL}), REQUESTERS: frozenset({ALICE})}
CHANNEL = "C0OPS"


@dataclass
class World:
    settings: Settings
    audit: AuditLog
    ops: Operations

    def asker(self, user: str) -> ChatUser:
        async def membership() -> Membership:
            return MEMBERS

        return ChatUser(user, CHANNEL, "/vllm restart svc", membership)

    async def pending(self) -> RunRecord:
        asked = await self.ops.request(
            make_plan(self.settings, Action.RESTART, "svc"), by=self.asker(ALICE)
        )
        assert isinstance(asked, Requested)
        return asked.record

    async def refusals(self) -> list[tuple[str, str]]:
        return [(r.user, r.reason) for r in await self.audit.refusals()]


def settings(tmp_path: Path, min_approvals: int) -> Settings:
    return Settings(
        hosts={"gpu1": {"address": LOCAL}},
        services={"svc": {"hosts": ["gpu1"], "unit": "vllm-svc", "python": "/opt/v/bin/python"}},
        policy={
            "approvers": [APPROVERS],
            "requesters": [REQUESTERS],
            "min_approvals": min_approvals,
            "approval_ttl_s": 600,
        },
        db_path=tmp_path / "audit.db",
    )


@pytest.fixture(params=[1, 2], ids=["one-approval", "two-approvals"])
async def world(
    tmp_path: Path, request: pytest.FixtureRequest, audit_target: Target
) -> AsyncIterator[World]:
    s = settings(tmp_path, request.param).model_copy(update={"db_path": audit_target})
    async with AuditLog.open(s.db_path) as audit:
        yield World(s, audit, Operations(RunLifecycle(s, audit, clock=ManualWallClock())))


async def test_someone_not_on_the_requesters_list_is_refused_and_nothing_is_recorded(
    world: World,
) -> None:
    plan = make_plan(world.settings, Action.RESTART, "svc")
    refused = await world.ops.request(plan, by=world.asker(MALLORY))
    assert isinstance(refused, Refused) and refused.code is Refusal.NOT_REQUESTER
    assert await world.audit.list_runs() == []
    assert await world.refusals() == [(MALLORY, refused.text)]


async def test_a_second_request_is_busy_naming_the_holder(world: World) -> None:
    first = await world.pending()
    busy = await world.ops.request(
        make_plan(world.settings, Action.RESTART, "svc"), by=world.asker(ALICE)
    )
    assert isinstance(busy, Busy) and busy.holder == first.id
    assert busy.text.startswith(f"Refused: svc is busy: run #{first.id}")
    assert [u for u, _ in await world.refusals()] == [ALICE]


async def test_an_operators_request_is_approved_by_them_and_a_dry_run_by_the_system(
    world: World,
) -> None:
    asked = await world.ops.request(
        make_plan(world.settings, Action.RESTART, "svc"), by=Operator("cli:root@box")
    )
    assert isinstance(asked, Requested) and asked.record.status == RunStatus.APPROVED
    assert asked.record.approved_by == ["cli:root@box"]
    await world.audit.release_locks(asked.record.id)
    dry = await world.ops.request(
        make_plan(world.settings, Action.RESTART, "svc", dry_run=True), by=world.asker(ALICE)
    )
    assert isinstance(dry, Requested) and dry.record.approved_by == [DRY_RUN_APPROVER]


async def test_decide_counts_to_min_approvals_and_refuses_the_requester(world: World) -> None:
    record = await world.pending()
    own = await world.ops.decide(
        record.id, Decision.APPROVE, user=ALICE, membership=MEMBERS, channel=CHANNEL
    )
    assert isinstance(own, Refused) and own.code is Refusal.NOT_ALLOWED
    results = [
        await world.ops.decide(
            record.id, Decision.APPROVE, user=u, membership=MEMBERS, channel=CHANNEL
        )
        for u in (BOB, CAROL)
    ]
    assert Approved(record.id, start=True) in results
    with pytest.raises(ValueError):
        await world.ops.decide(
            record.id, Decision.CANCEL, user=BOB, membership=MEMBERS, channel=CHANNEL
        )


async def test_a_leftover_press_is_judged_counted_and_recorded_by_the_service(world: World) -> None:
    record = await world.pending()
    needed = world.settings.policy.min_approvals
    vote = LeftoverVote(LeftoverRequest(record.id, "gpu1", "gpu1: 1 process", (4242,)), "q-1")

    async def press(user: str, v: LeftoverVote | None = vote) -> object:
        return await world.ops.terminate_leftovers(
            v,
            run_id=record.id,
            user=user,
            membership=MEMBERS,
            channel=CHANNEL,
            command="terminate",
            waiting=["gpu1"],
        )

    stale = await press(BOB, None)
    assert isinstance(stale, Refused) and stale.code is Refusal.NO_QUESTION
    assert "It waits now for gpu1" in stale.text
    requester = await press(ALICE)
    assert isinstance(requester, Refused) and requester.code is Refusal.NOT_ALLOWED
    first = await press(BOB)
    if needed == 1:
        assert first == LeftoversApproved("gpu1", (BOB,), "4242")
    else:
        assert first == LeftoversCounted("gpu1", (BOB,), 2, "4242")
        assert await press(BOB) == LeftoversAlreadyCounted("gpu1")
        assert await press(CAROL) == LeftoversApproved("gpu1", (BOB, CAROL), "4242")
    goes = await world.audit.leftover_approvals(record.id)
    assert [(g.user, g.host, list(g.pids)) for g in goes] == [
        (u, "gpu1", [4242]) for u in (BOB, CAROL)[:needed]
    ]
    assert sorted(u for u, _ in await world.refusals()) == [ALICE, BOB]


@pytest.mark.parametrize("world", [2], indirect=True, ids=["two-approvals"])
async def test_two_approvers_pressing_at_once_on_two_replicas_answer_the_question(
    world: World,
) -> None:
    """Issue 21: the driving replica recorded its question; each of two replicas read it
    (nobody had pressed yet), then each records its own press. The second must count
    the first, which it read nothing of, and answer the question: a press counted only
    against what it read before would leave both at "1 of 2" and the host waiting."""
    record = await world.pending()
    request = LeftoverRequest(record.id, "gpu1", "gpu1: 1 process", (4242,))
    await world.ops.ask_leftovers(request, "q-1")
    seen_by_b = await world.ops.leftover_vote(record.id, "gpu1", "q-1")
    seen_by_c = await world.ops.leftover_vote(record.id, "gpu1", "q-1")
    assert seen_by_b is not None and seen_by_c is not None

    async def press(user: str, vote: LeftoverVote) -> object:
        return await world.ops.terminate_leftovers(
            vote, run_id=record.id, user=user, membership=MEMBERS, channel=CHANNEL,
            command="terminate",
        )  # fmt: skip

    assert await press(BOB, seen_by_b) == LeftoversCounted("gpu1", (BOB,), 2, "4242")
    assert await press(CAROL, seen_by_c) == LeftoversApproved("gpu1", (BOB, CAROL), "4242")
    found = await world.audit.question("q-1")
    assert found is not None and found[0].closed and found[0].approved_by == f"{BOB}, {CAROL}"


async def test_recovering_a_run_nothing_drives_is_refused_with_a_row(world: World) -> None:
    record = await world.pending()
    look = await world.ops.look(record.id)
    assert look.verdict is None and look.locks

    def never(alive: bool) -> None:
        raise AssertionError("nothing to confirm: it is refused first")

    refused = await world.ops.recover_run(look, user="cli:root@box", force=True, confirm=never)
    assert isinstance(refused, Refused) and refused.code is Refusal.NOT_DRIVEN
    assert await world.refusals() == [("cli:root@box", refused.text)]
    assert (await world.audit.get_run(record.id)).status == RunStatus.PENDING_APPROVAL


def test_both_front_ends_are_built_from_the_one_command_table() -> None:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == [c.name for c in commands_of(Front.CLI)]
    helps = {a.dest: a.help for a in sub._choices_actions}
    assert helps == {c.name: c.help for c in commands_of(Front.CLI)}
    chat = commands_of(Front.CHAT)
    assert grammar.COMMANDS == tuple(c.name for c in chat)
    assert grammar.USAGE == {c.name: c.chat_usage() for c in chat}
    assert DESCRIPTIONS == {c.name: c.chat_help for c in chat}
    # An option only one front end has stays out of the other's.
    assert "--yes" not in grammar.USAGE["redeploy"]
    assert "--dry-run" in grammar.USAGE["redeploy"]
