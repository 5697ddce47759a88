"""`rotation`, `drain` and `undrain` (issue 19, item 4) in the pure flows: the plan each
makes, what each sends the router, and what each refuses. HAProxy's side is
tests/test_rotation_kinds.py's fake in the real `show stat` format; the real HAProxy runs
these commands in tests/test_rotation_e2e.py."""

from __future__ import annotations

from typing import Any

import pytest

from bot.core.flows import FLOWS
from bot.core.plan import Step, make_plan
from bot.core.service_state import ServiceState
from bot.core.status import Action
from bot.errors import InputError
from bot.settings import Settings
from tests.test_rotation_flow import rotations
from tests.test_rotation_flow import settings as command_settings
from tests.test_rotation_kinds import HAProxy, LbHost, haproxy_changes, haproxy_settings
from tests.test_sequence import drive, steps, verbs


def run(h: LbHost, action: Action, host: str = "h1", s: Settings | None = None) -> Any:
    s = s or haproxy_settings()
    plan = make_plan(s, action, "kimi", host=host if action.one_host else None)
    return drive(FLOWS[plan.action](plan, s.services["kimi"], host), h)


def test_rotation_reads_each_replica_and_changes_nothing() -> None:
    h = LbHost(
        haproxy=HAProxy(status={"node1": "DRAIN", "node2": "UP"}, scur=[2]),
        healthy_after_checks=0,
    )
    out = run(h, Action.ROTATION)
    assert out.status == "succeeded", out.summary
    assert out.summary == (
        "draining (no new requests) (DRAIN, 2 session(s)) at router front (server node1); "
        "health 200"
    )
    assert haproxy_changes(h) == [] and verbs(h) == [] and rotations(h) == []
    other = run(
        LbHost(haproxy=HAProxy(status={"node1": "UP", "node2": "MAINT"})), Action.ROTATION, "h2"
    )
    assert other.summary.startswith("OUT of rotation (MAINT, 0 session(s)) at router front")


def test_rotation_says_when_the_router_cannot_be_read() -> None:
    h = LbHost(haproxy=HAProxy(status={"node9": "UP"}))
    out = run(h, Action.ROTATION)
    assert out.status == "failed"
    assert "backend vllm_kimi has no server node1, node2" not in out.summary
    assert "backend vllm_kimi has no server node1" in out.summary


def test_the_rotation_plans_name_the_router_commands_and_one_host() -> None:
    s = haproxy_settings()
    drain = make_plan(s, Action.DRAIN, "kimi", host="h2")
    assert drain.hosts == ("h2",) and [p.step for p in drain.steps] == [Step.ROTATION_OUT]
    assert "`set server vllm_kimi/node2 state drain`" in drain.steps[0].command
    assert "vllm-kimi-k25 on h2 keeps running" in drain.steps[0].command
    undrain = make_plan(s, Action.UNDRAIN, "kimi", host="h1")
    assert [p.step for p in undrain.steps] == [Step.READINESS, Step.ROTATION_IN]
    assert "`set server vllm_kimi/node1 state ready`" in undrain.steps[1].command
    assert drain.system_approver is None and undrain.system_approver is None
    # A rotation read is no run: nobody approves it, nothing records it.
    assert make_plan(s, Action.ROTATION, "kimi").system_approver is None


@pytest.mark.parametrize(
    ("action", "host", "needle"),
    [
        (Action.DRAIN, None, "drain needs the host: one of h1, h2"),
        (Action.UNDRAIN, "lb-1", "`lb-1` is not a host of kimi; its hosts: h1, h2"),
        (Action.REDEPLOY, "h1", "a host only applies to drain and undrain"),
    ],
)
def test_a_drain_names_one_of_the_service_hosts(
    action: Action, host: str | None, needle: str
) -> None:
    with pytest.raises(InputError, match=needle):
        make_plan(haproxy_settings(), action, "kimi", host=host)


def test_a_service_without_a_router_has_no_rotation_commands() -> None:
    s = command_settings()
    plain = Settings(
        hosts=s.model_dump()["hosts"],
        services={
            "kimi": {**s.services["kimi"].model_dump(), "router": None, "router_servers": {}}
        },
    )
    for action in (Action.ROTATION, Action.DRAIN):
        with pytest.raises(InputError, match="kimi has no router configured"):
            make_plan(plain, action, "kimi", host="h1" if action.one_host else None)


def test_drain_takes_it_out_waits_for_its_sessions_and_leaves_the_service_running() -> None:
    h = LbHost(healthy_after_checks=0)
    out = run(h, Action.DRAIN)
    assert out.status == "succeeded", out.summary
    assert haproxy_changes(h) == [
        "set server vllm_kimi/node1 state drain",
        "set server vllm_kimi/node1 state maint",
    ]
    assert h.haproxy.status == {"node1": "MAINT", "node2": "UP"}
    assert rotations(h) == [("out", "node1", True)]
    assert verbs(h) == []  # no stop, no start, nothing on the unit
    assert out.state == ServiceState.UP
    assert "h1 is out of rotation at router front (server node1)" in out.summary
    assert "/vllm undrain kimi h1" in out.summary


def test_drain_refuses_to_take_out_the_only_serving_replica() -> None:
    h = LbHost(haproxy=HAProxy(status={"node1": "UP", "node2": "MAINT"}))
    out = run(h, Action.DRAIN)
    assert out.status == "aborted"
    assert "refused to take h1 out of rotation: 0 of 1 others serving" in out.summary
    assert haproxy_changes(h) == [] and rotations(h) == []


def test_undrain_puts_a_ready_replica_back_and_confirms_it() -> None:
    h = LbHost(haproxy=HAProxy(status={"node1": "MAINT", "node2": "UP"}))
    h.healthy_after_checks = 0
    out = run(h, Action.UNDRAIN, s=haproxy_settings(served_model="kimi-k2.5"))
    assert out.status == "succeeded", out.summary
    assert haproxy_changes(h) == ["set server vllm_kimi/node1 state ready"]
    assert h.haproxy.status["node1"] == "UP"
    assert [s for s, _ in steps(h)] == ["readiness", "rotation_in"]
    assert rotations(h) == [("in", "node1", True)]
    # readiness really asked the server: its model list and the version
    assert {r.url.rsplit("/", 1)[-1] for r in h.requests} >= {"models", "version"}


def test_undrain_refuses_a_replica_whose_health_fails() -> None:
    h = LbHost(haproxy=HAProxy(status={"node1": "MAINT", "node2": "UP"}), health_status=503)
    h.healthy_after_checks = 0
    out = run(h, Action.UNDRAIN)
    assert out.status == "aborted"
    assert out.summary.startswith("refused to put h1 back in rotation: GET ")
    assert "answered health 503. It stays out." in out.summary
    assert haproxy_changes(h) == [] and h.haproxy.status["node1"] == "MAINT"


def test_undrain_refuses_a_replica_that_serves_the_wrong_model() -> None:
    h = LbHost(
        haproxy=HAProxy(status={"node1": "MAINT", "node2": "UP"}),
        models=(200, '{"object":"list","data":[{"id":"Kimi-K2-Instruct"}]}'),
    )
    h.healthy_after_checks = 0
    s = haproxy_settings(served_model="kimi-k2.5")
    out = run(h, Action.UNDRAIN, s=s)
    assert out.status == "aborted", out.summary
    assert "refused to put h1 back in rotation: not ready" in out.summary
    assert out.state == ServiceState.UP_NOT_READY
    assert haproxy_changes(h) == [] and h.haproxy.status["node1"] == "MAINT"


def test_drain_of_a_replica_already_out_by_hand_sends_the_router_nothing() -> None:
    """node1 in MAINT by hand: a `state drain` would lift the MAINT (HAProxy 2.6 shows
    `DRAIN` after it, tests/samples/routers/ha_show_stat_maint_then_drain.txt)."""
    h = LbHost(haproxy=HAProxy(status={"node1": "MAINT", "node2": "UP"}))
    out = run(h, Action.DRAIN)
    assert out.status == "succeeded", out.summary
    assert haproxy_changes(h) == [] and h.haproxy.status["node1"] == "MAINT"
    assert "h1 was already held out of rotation by hand (MAINT); left out" in out.summary
    assert rotations(h) == [("out", "node1", True)]
