"""Per-service policy (issue 22 item 4): ``[services.NAME.policy]`` overrides who may
request and approve a service and how many must, through the real front ends: signed
Slack requests into the bolt app (Slack faked at its HTTP boundary), the CLI as a
subprocess."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest

from bot.audit.store import AuditLog
from bot.core.doctor_approvers import approver_checks
from bot.core.doctor_types import Outcome
from bot.core.plan import make_plan
from bot.core.status import Action, Decision, Source
from bot.engine.leftover_gate import LeftoverRequest
from bot.engine.lifecycle import RunLifecycle
from bot.engine.operations import ChatUser, Operations, Requested
from bot.engine.run_results import Approved, Counted, Refusal, Refused
from bot.errors import ConfigError
from bot.settings import Settings, load_settings
from bot.sim.kit import SERVICE, SimKit
from bot.slack.app import _check_credentials
from bot.slack.leftovers import LeftoverDesk
from tests.fakes import FakeSlack
from tests.polling import eventually
from tests.slack_harness import (
    ALICE,
    APPROVERS_GROUP,
    BOB,
    CAROL,
    CHANNEL,
    blocks_text,
    buttons,
    default_policy,
    new_fake,
    slack_bot,
    terminate_buttons,
)
from tests.support.cli import cli, write_toml
from tests.support.sim import touched

DAVE, ERIN = "U0DAVE", "U0ERIN"
TERMINATE = "Terminate leftover processes"
KIMI_GROUP = "S0KIMI"
# kimi-k25's own rule: DAVE or the kimi group (ERIN) approve, two of them; only ALICE asks.
OWN = {"approvers": [DAVE, KIMI_GROUP], "min_approvals": 2, "requesters": [ALICE]}


def fragment(kit: SimKit, **own: Any) -> dict[str, Any]:
    return kit.settings_fragment(policy=own or OWN)


def ack_text(body: str) -> str:
    return str(json.loads(body)["text"]) if body.startswith("{") else body


# ---- settings --------------------------------------------------------------------------


def _settings(tmp_path: Path, service_policy: str) -> Settings:
    path = tmp_path / "chatops.toml"
    path.write_text(
        "[policy]\n"
        f'approvers = ["{BOB}"]\nmin_approvals = 1\nrequesters = ["{BOB}", "{ALICE}"]\n'
        '[hosts.h]\naddress = "local"\n'
        '[services.a]\nhosts = ["h"]\nunit = "a.service"\npython = "/v/bin/python"\n'
        '[services.b]\nhosts = ["h"]\nunit = "b.service"\npython = "/v/bin/python"\n'
        f"[services.a.policy]\n{service_policy}"
    )
    return load_settings(path)


def test_a_service_overrides_what_it_names_and_inherits_the_rest(tmp_path: Path) -> None:
    s = _settings(tmp_path, f'approvers = ["{DAVE}", "{KIMI_GROUP}"]\nmin_approvals = 2\n')
    own = s.policy_for("a")
    assert (own.approvers, own.min_approvals) == ([DAVE, KIMI_GROUP], 2)
    # Not overridden: the global requesters and the global rest.
    assert own.requesters == [BOB, ALICE]
    assert own.approval_ttl_s == s.policy.approval_ttl_s
    assert s.policy_for("b") == s.policy
    # A run of a service since removed from the file is judged by [policy].
    assert s.policy_for("gone") == s.policy


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("approvers = []\n", "services.a.policy.approvers: must name someone"),
        ('approvers = ["bob"]\n', "services.a.policy.approvers: 'bob' is not a Slack user"),
        ('requesters = ["U0X", "x"]\n', "services.a.policy.requesters: 'x' is not a Slack"),
        ("min_approvals = 0\n", "services.a.policy.min_approvals"),
        ("allow_self_approval = true\n", "services.a.policy.allow_self_approval: unknown key"),
    ],
)
def test_a_bad_service_policy_fails_at_start_naming_the_key(
    tmp_path: Path, body: str, message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        _settings(tmp_path, body)
    assert message in str(err.value)


# ---- Slack ------------------------------------------------------------------------------


def _fake() -> FakeSlack:
    return new_fake(usergroups={APPROVERS_GROUP: [BOB, CAROL], KIMI_GROUP: [ERIN]})


async def test_a_global_approver_is_refused_on_a_service_with_its_own_approvers(
    tmp_path: Path, sim_host: SimKit
) -> None:
    async with _fake() as fake, slack_bot(tmp_path, sim_host, fake, **fragment(sim_host)) as bot:
        await bot.command(f"restart {SERVICE}", user=ALICE)
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        card = blocks_text(await bot.card(record.id))
        # The card says whose approval this service needs, and how many.
        assert f"Needs 2 approver(s) of {SERVICE}: <@{DAVE}>, <!subteam^{KIMI_GROUP}>" in card
        assert "0 of 2 approvals" in card

        # BOB approves every other service ([policy]), not this one.
        await bot.click("approve", record.id, user=BOB)
        said = (await bot.ephemerals_for(BOB))[-1]["text"]
        assert f"not on the approvers list for {SERVICE}" in said
        rows = await bot.refusals(1)
        assert rows[-1].user == BOB and f"#{record.id}" in rows[-1].command
        # Nor may he cancel it or deny it.
        await bot.click("deny", record.id, user=BOB)
        await bot.refusals(2)
        await bot.command(f"cancel {record.id}", user=BOB)
        rows = await bot.refusals(3)
        assert all(r.user == BOB for r in rows)
        assert (await bot.run(record.id)).status == "pending_approval"

        # The service's own: DAVE by name, ERIN through the kimi group; two are needed.
        await bot.click("approve", record.id, user=DAVE)
        await bot.front_end.idle()
        assert (await bot.run(record.id)).status == "pending_approval"
        assert "1 of 2 approvals" in blocks_text(await bot.card(record.id))
        await bot.click("approve", record.id, user=ERIN)
        done = await bot.wait_status(record.id, "succeeded", "failed", "aborted")
        assert done.status == "succeeded", done.summary
        assert done.approved_by == [DAVE, ERIN]
        await bot.front_end.idle()
        assert buttons(await bot.card(record.id)) == []


async def test_the_requesters_of_a_service_are_its_own(tmp_path: Path, sim_host: SimKit) -> None:
    async with _fake() as fake, slack_bot(tmp_path, sim_host, fake, **fragment(sim_host)) as bot:
        # BOB may ask for any service under [policy], not for this one.
        await bot.command(f"restart {SERVICE}", user=BOB)
        said = (await bot.ephemerals_for(BOB))[-1]["text"]
        assert f"not on the requesters list for {SERVICE}" in said
        rows = await bot.refusals(1)
        assert rows[0].user == BOB
        await bot.front_end.idle()
        assert await bot.runtime.audit.list_runs() == []
        assert touched(sim_host) == []


async def test_min_approvals_of_one_service_leaves_the_global_rule_alone(
    tmp_path: Path, sim_host: SimKit
) -> None:
    # [policy] needs two; this service one, of the global approvers.
    async with (
        _fake() as fake,
        slack_bot(
            tmp_path,
            sim_host,
            fake,
            policy=default_policy(min_approvals=2),
            **fragment(sim_host, min_approvals=1),
        ) as bot,
    ):
        await bot.command(f"restart {SERVICE}", user=ALICE)
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        assert f"Needs 1 approver(s) of {SERVICE}" in blocks_text(await bot.card(record.id))
        await bot.click("approve", record.id, user=CAROL)
        done = await bot.wait_status(record.id, "succeeded", "failed", "aborted")
        assert done.status == "succeeded" and done.approved_by == [CAROL]


async def test_help_says_who_may_approve_each_service(tmp_path: Path, sim_host: SimKit) -> None:
    async with _fake() as fake, slack_bot(tmp_path, sim_host, fake, **fragment(sim_host)) as bot:
        answer = ack_text((await bot.command("help", user=CAROL)).text)
        assert "*Who may approve*" in answer
        line = next(x for x in answer.splitlines() if x.startswith(f"`{SERVICE}`"))
        assert f"<@{DAVE}>, <!subteam^{KIMI_GROUP}>" in line and "2 approvals needed" in line
        assert f"<!subteam^{APPROVERS_GROUP}>" not in line
        assert bot.fake.messages(CHANNEL) == []


# ---- doctor ----------------------------------------------------------------------------


def test_doctor_rows_judge_the_effective_policy() -> None:
    s = Settings(
        policy={"approvers": [BOB]},
        hosts={"h": {"address": "local"}},
        services={
            "a": {"hosts": ["h"], "unit": "a", "python": "/v/bin/python", "policy": OWN},
            "b": {"hosts": ["h"], "unit": "b", "python": "/v/bin/python"},
            "c": {
                "hosts": ["h"],
                "unit": "c",
                "python": "/v/bin/python",
                "policy": {"approvers": [KIMI_GROUP], "min_approvals": 3},
            },
        },
    )
    members = {KIMI_GROUP: frozenset({ERIN, DAVE})}
    a, b, c = approver_checks(s, ["a", "b", "c"], members)
    assert (a.outcome, a.detail) == (
        Outcome.OK,
        f"{DAVE}, {KIMI_GROUP} (2 members) (own); 2 approvals needed",
    )
    assert (b.outcome, b.detail) == (Outcome.OK, f"{BOB} (from [policy]); 1 approval needed")
    # Two people can never give three approvals.
    assert c.outcome == Outcome.FAIL and "only 2 can approve" in c.detail
    unread = approver_checks(s, ["a"], {}, "SLACK_BOT_TOKEN is not set")[0]
    assert unread.outcome == Outcome.WARN
    assert "S0KIMI (members not resolved: SLACK_BOT_TOKEN is not set)" in unread.detail
    assert "SLACK_BOT_TOKEN" in unread.fix


def _cli_env(kit: SimKit, tmp_path: Path, **extra: str) -> dict[str, str]:
    config = write_toml(tmp_path / "chatops.toml", fragment(kit))
    return {"CHATOPS_CONFIG": str(config), "CHATOPS_DB": str(tmp_path / "audit.db"), **extra}


async def test_cli_doctor_lists_the_services_approvers_with_group_sizes(
    tmp_path: Path, sim_host: SimKit
) -> None:
    async with _fake() as fake:
        env = _cli_env(
            sim_host, tmp_path, SLACK_BOT_TOKEN=fake.bot_token, SLACK_API_URL=fake.base_url
        )
        code, out, err = await cli("doctor", SERVICE, "--json", cwd=tmp_path, env=env)
        assert code == 0, err + out
        rows = [r for r in json.loads(out) if r["check"] == "approvers"]
        assert rows == [
            {
                "host": "-",
                "service": SERVICE,
                "check": "approvers",
                "result": "ok",
                "detail": f"{DAVE}, {KIMI_GROUP} (1 member) (own); 2 approvals needed",
                "fix": "",
            }
        ]
        assert fake.calls("usergroups.users.list")[0].params["usergroup"] == KIMI_GROUP


async def test_cli_doctor_says_when_it_could_not_resolve_a_group(
    tmp_path: Path, sim_host: SimKit
) -> None:
    code, out, err = await cli("doctor", SERVICE, cwd=tmp_path, env=_cli_env(sim_host, tmp_path))
    # A warning, not a failure: the setup works, doctor just could not count the group.
    assert code == 0, err + out
    line = next(x for x in out.splitlines() if " approvers " in x)
    assert "WARN" in line and "members not resolved: SLACK_BOT_TOKEN is not set" in line
    assert "fix: set SLACK_BOT_TOKEN" in out


# ---- leftover processes --------------------------------------------------------------


async def test_terminating_leftovers_takes_the_services_own_approvers(tmp_path: Path) -> None:
    settings = Settings(
        policy={"approvers": [BOB]},
        hosts={"gpu-node-1": {"address": "local"}},
        services={
            SERVICE: {
                "hosts": ["gpu-node-1"],
                "unit": "vllm-kimi-k25",
                "python": "/v/bin/python",
                "policy": OWN,
            }
        },
    )
    members = {KIMI_GROUP: frozenset({ERIN})}
    async with AuditLog.open(tmp_path / "audit.db") as audit:
        run_id = await audit.create_run(
            service=SERVICE,
            action=Action.RESTART,
            hosts=["gpu-node-1"],
            requested_by=ALICE,
            source=Source.SLACK,
            plan={},
            package_spec=None,
        )
        desk = LeftoverDesk(Operations(RunLifecycle(settings, audit)))
        request = LeftoverRequest(run_id, "gpu-node-1", "gpu-node-1: 1 process", (48304,))
        waiting = asyncio.ensure_future(desk.wait(request, "q-1", lambda approvals: None))
        await eventually(lambda: desk.waiting(run_id) or None, "the question open")

        async def press(user: str) -> str:
            return await desk.press(
                run_id,
                f"{run_id}:gpu-node-1:q-1",
                user=user,
                membership=members,
                channel=CHANNEL,
                command="terminate",
            )

        said = await press(BOB)
        assert f"Only an approver of {SERVICE}" in said and not waiting.done()
        assert [r.user for r in await audit.refusals()] == [BOB]
        assert "1 of 2" in await press(DAVE) and not waiting.done()
        assert (await press(ERIN)).startswith("Terminating")
        assert (await waiting).approved_by == f"{DAVE}, {ERIN}"
        assert [g.user for g in await audit.leftover_approvals(run_id)] == [DAVE, ERIN]


def test_the_bot_starts_without_global_approvers_only_when_each_service_has_its_own() -> None:
    base: dict[str, Any] = {
        "hosts": {"h": {"address": "local"}},
        "SLACK_BOT_TOKEN": "xoxb-test-token",
        "SLACK_SIGNING_SECRET": "secret-secret",
    }
    svc = {"hosts": ["h"], "unit": "a", "python": "/v/bin/python"}
    err = io.StringIO()
    owned = Settings(**base, services={"a": {**svc, "policy": {"approvers": [DAVE]}}})
    assert _check_credentials(owned, err) and err.getvalue() == ""
    mixed = Settings(**base, services={"a": {**svc, "policy": {"approvers": [DAVE]}}, "b": {**svc}})
    assert not _check_credentials(mixed, err)
    assert "none for: b" in err.getvalue()


async def test_the_terminate_button_on_the_card_counts_by_the_services_rule(
    tmp_path: Path, sim_host: SimKit
) -> None:
    sim_host.set_faults(orphan_workers=True)
    async with _fake() as fake, slack_bot(tmp_path, sim_host, fake, **fragment(sim_host)) as bot:
        await bot.command(f"restart {SERVICE}", user=ALICE)
        record = await bot.wait_for_run(lambda r: r.message_ts is not None, "the card")
        await bot.click("approve", record.id, user=DAVE)
        await bot.click("approve", record.id, user=ERIN)
        await bot.fake.wait_for(
            lambda: TERMINATE in buttons(bot.fake.message(CHANNEL, record.message_ts or "")),
            what="the Terminate button",
            timeout=30,
        )
        # The host's question asks for the service's two, not [policy]'s one.
        assert (
            "0 of 2 approvals" in terminate_buttons(await bot.card(record.id))["gpu-node-1"]["text"]
        )
        await bot.press_terminate(record.id, "gpu-node-1", user=BOB)
        assert f"Only an approver of {SERVICE}" in (await bot.ephemerals_for(BOB))[-1]["text"]
        await bot.press_terminate(record.id, "gpu-node-1", user=DAVE)
        assert "1 of 2" in (await bot.ephemerals_for(DAVE))[-1]["text"]
        assert sim_host.signalled() == []
        await bot.press_terminate(record.id, "gpu-node-1", user=ERIN)
        done = await bot.wait_status(record.id, "succeeded", "failed", timeout_s=60)
        assert done.status == "succeeded", done.summary
        assert sim_host.signalled()


async def test_slack_doctor_of_a_service_is_for_its_requesters_and_lists_its_approvers(
    tmp_path: Path, sim_host: SimKit
) -> None:
    async with _fake() as fake, slack_bot(tmp_path, sim_host, fake, **fragment(sim_host)) as bot:
        # BOB asks for the whole fleet's doctor under [policy], not for this service's.
        refused = ack_text((await bot.command(f"doctor {SERVICE}", user=BOB)).text)
        assert f"not on the requesters list for {SERVICE}" in refused
        assert (await bot.refusals(1))[0].user == BOB
        await bot.command(f"doctor {SERVICE}", user=ALICE)
        answer = blocks_text((await bot.ephemerals_for(ALICE))[-1])
        await bot.front_end.idle()
        line = next(x for x in answer.splitlines() if " approvers " in x)
        assert f"{DAVE}, {KIMI_GROUP} (1 member) (own); 2 approvals needed" in line


# ---- rotation commands (drain, undrain) ------------------------------------------------


@pytest.mark.parametrize("action", [Action.DRAIN, Action.UNDRAIN])
async def test_drain_and_undrain_are_judged_by_the_services_policy(
    tmp_path: Path, action: Action
) -> None:
    lb = ["/usr/local/bin/lb"]
    settings = Settings(
        policy={"approvers": [BOB], "requesters": [BOB, ALICE]},
        hosts={"n1": {"address": "local"}, "n2": {"address": "local"}},
        routers={
            "lb": {
                "kind": "command",
                "host": "n1",
                "drain": [*lb, "out", "{server}"],
                "undrain": [*lb, "in", "{server}"],
            }
        },
        services={
            SERVICE: {
                "hosts": ["n1", "n2"],
                "unit": "vllm-kimi-k25",
                "python": "/v/bin/python",
                "router": "lb",
                "router_servers": {"n1": "s1", "n2": "s2"},
                "policy": OWN,
            }
        },
        db_path=tmp_path / "audit.db",
    )
    members = {KIMI_GROUP: frozenset({ERIN})}

    async def membership() -> dict[str, frozenset[str]]:
        return members

    plan = make_plan(settings, action, SERVICE, host="n1")
    async with AuditLog.open(settings.db_path) as audit:
        ops = Operations(RunLifecycle(settings, audit))
        refused = await ops.request(plan, by=ChatUser(BOB, CHANNEL, str(action), membership))
        assert isinstance(refused, Refused) and refused.code is Refusal.NOT_REQUESTER
        asked = await ops.request(plan, by=ChatUser(ALICE, CHANNEL, str(action), membership))
        assert isinstance(asked, Requested)
        run_id = asked.record.id
        # [policy]'s approver is not this service's; its own two are needed.
        no = await ops.decide(run_id, Decision.APPROVE, user=BOB, membership=members, channel=None)
        assert isinstance(no, Refused) and f"approvers list for {SERVICE}" in no.text
        one = await ops.decide(
            run_id, Decision.APPROVE, user=DAVE, membership=members, channel=None
        )
        assert isinstance(one, Counted) and one.needed == 2
        two = await ops.decide(
            run_id, Decision.APPROVE, user=ERIN, membership=members, channel=None
        )
        assert isinstance(two, Approved)
        assert [r.user for r in await audit.refusals()] == [BOB, BOB]
