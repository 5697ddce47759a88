"""The user-group membership cache behind the approval policy, against the fake Slack."""

from __future__ import annotations

from slack_sdk.web.async_client import AsyncWebClient

from bot.core.status import Action, RunStatus, Source
from bot.slack.cards import plan_from_record
from bot.slack.membership import MembershipCache
from tests.fakes import FakeSlack
from tests.support.clock import ManualClock


async def test_members_are_cached_for_the_ttl_then_fetched_again() -> None:
    async with FakeSlack(usergroups={"S0OPS": ["U0BOB"]}) as fake:
        clock = ManualClock()
        cache = MembershipCache(
            AsyncWebClient(token=fake.bot_token, base_url=fake.base_url), ttl_s=60, clock=clock
        )
        assert await cache.resolve(["S0OPS"]) == {"S0OPS": frozenset({"U0BOB"})}
        fake.usergroups["S0OPS"].append("U0CAROL")
        assert await cache.resolve(["S0OPS"]) == {"S0OPS": frozenset({"U0BOB"})}
        assert len(fake.calls("usergroups.users.list")) == 1
        clock.advance(61)
        assert await cache.resolve(["S0OPS"]) == {"S0OPS": frozenset({"U0BOB", "U0CAROL"})}
        assert len(fake.calls("usergroups.users.list")) == 2


async def test_a_failed_lookup_grants_nothing_and_is_not_cached() -> None:
    async with FakeSlack(usergroups={"S0OPS": ["U0BOB"]}) as fake:
        cache = MembershipCache(
            AsyncWebClient(token=fake.bot_token, base_url=fake.base_url), ttl_s=60
        )
        fake.fail_next("usergroups.users.list", "internal_error")
        assert await cache.resolve(["S0OPS"]) == {}
        assert await cache.resolve(["S0OPS", "S0GONE"]) == {"S0OPS": frozenset({"U0BOB"})}


def test_the_stored_plan_round_trips() -> None:
    from bot.audit.store import RunRecord
    from bot.core.plan import Plan, PlannedStep, Step

    plan = Plan(
        action=Action.REDEPLOY,
        service="s",
        hosts=("a", "b"),
        unit="u",
        package="vllm",
        version="0.16.0",
        spec="vllm==0.16.0",
        index_name="n",
        index_url="http://i/",
        steps=(PlannedStep(Step.STOP, "systemctl stop u"),),
        dry_run=True,
        batch_size=2,
    )
    record = RunRecord(
        id=1,
        service="s",
        action=Action.REDEPLOY,
        hosts=["a", "b"],
        requested_by="U1",
        source=Source.SLACK,
        status=RunStatus.PENDING_APPROVAL,
        current_step=None,
        summary=None,
        version_before=None,
        version_after=None,
        created_at="",
        started_at=None,
        finished_at=None,
        expires_at=None,
        channel=None,
        message_ts=None,
        plan=plan.to_json(),
        package_spec=plan.spec,
        index_name="n",
        dry_run=True,
        approved_by=[],
        denied_by=[],
    )
    assert plan_from_record(record) == plan
