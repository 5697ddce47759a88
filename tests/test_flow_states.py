"""How each flow path leaves the service (``HostOutcome.state``), driven by hand-made replies.

Every end of a redeploy or a restart says, as a value, whether the service is UP, UP but
NOT READY, DOWN, STOPPED or unknown; the summary's words for it are rendered from that
value (``service_is``), so a path that sets the wrong state fails here, and a sentence
that disagrees with its state fails ``test_every_summary_says_the_state_it_carries``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from bot.core import events as ev
from bot.core.flows import Checkpoint, Flow, HostOutcome, Sleep, Tick, gpu_health_flow
from bot.core.flows import preview_flow as preview
from bot.core.phases.actions import EndStep, service_is
from bot.core.phases.common import read_state
from bot.core.plan import make_plan
from bot.core.service_state import ServiceState
from bot.core.status import Action, HostStatus
from bot.engine.executor import Executor
from bot.hosts.base import CommandResult
from tests.test_sequence import Host, drive, ok, run, settings, verbs

UP, NOT_READY, DOWN = ServiceState.UP, ServiceState.UP_NOT_READY, ServiceState.DOWN
STOPPED, UNKNOWN = ServiceState.STOPPED, ServiceState.UNKNOWN

SUDO_REFUSED = "sudo refused `systemctl start`: no rule for it on this host"


class Unit(Host):
    """A host whose unit preflight reads in ``active_state``, and whose ``systemctl``
    ``verb`` (start or stop) sudo refuses when ``refuse`` names it."""

    def __init__(self, active_state: str = "active", refuse: str | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.active_state, self.refuse = active_state, refuse

    def command(self, a: tuple[str, ...]) -> CommandResult:
        if a[:2] == ("systemctl", "show") and a[3] != "User":
            return ok(
                a, f"LoadState=loaded\nActiveState={self.active_state}\nSubState=dead\nMainPID=0\n"
            )
        if self.refuse is not None and a[:2] == ("systemctl", self.refuse):
            return CommandResult(
                a, 1, "", "sudo: a password is required\n", 0.0, refused=SUDO_REFUSED
            )
        return super().command(a)


def _cancel_in_drain(action: Any) -> bool:
    return isinstance(action, Sleep) and action.seconds > 0


# (id, host, action, settings, plan keywords, expected status, expected state)
CASES: list[
    tuple[str, Callable[[], Host], str, dict[str, Any], dict[str, Any], str, ServiceState]
] = [
    ("redeployed", Host, "redeploy", {}, {}, HostStatus.SUCCEEDED, UP),
    ("restarted", Host, "restart", {}, {}, HostStatus.SUCCEEDED, UP),
    ("dry run", Host, "redeploy", {}, {"dry_run": True}, HostStatus.SUCCEEDED, UP),
    # Ends before the stop leave the service as preflight read it.
    (
        "disk refusal, unit active",
        lambda: Host(free_mib=10),
        "redeploy",
        {},
        {},
        HostStatus.ABORTED,
        UP,
    ),
    (
        "disk refusal, unit inactive",
        lambda: Unit("inactive", free_mib=10),
        "redeploy",
        {},
        {},
        HostStatus.ABORTED,
        STOPPED,
    ),
    (
        "disk refusal, unit failed",
        lambda: Unit("failed", free_mib=10),
        "redeploy",
        {},
        {},
        HostStatus.ABORTED,
        DOWN,
    ),
    (
        "host unreachable",
        lambda: Host(lose=lambda a: True),
        "redeploy",
        {},
        {},
        HostStatus.ABORTED,
        UNKNOWN,
    ),
    (
        "restart, host unreachable",
        lambda: Host(lose=lambda a: True),
        "restart",
        {},
        {},
        HostStatus.ABORTED,
        UNKNOWN,
    ),
    (
        "prefetch failed",
        lambda: Host(prefetch_ok=False),
        "redeploy",
        {},
        {},
        HostStatus.ABORTED,
        UP,
    ),
    (
        "cancelled before the change",
        lambda: Host(cancel_at=lambda a: isinstance(a, Checkpoint)),
        "redeploy",
        {},
        {},
        HostStatus.CANCELLED,
        UP,
    ),
    (
        "stop refused by sudo",
        lambda: Unit(refuse="stop"),
        "redeploy",
        {},
        {},
        HostStatus.FAILED,
        UP,
    ),
    ("stop failed", lambda: Host(stop_ok=False), "redeploy", {}, {}, HostStatus.FAILED, UNKNOWN),
    # Stopped, and never started again.
    ("drain timeout", lambda: Host(stuck=True), "redeploy", {}, {}, HostStatus.FAILED, STOPPED),
    (
        "restart, drain timeout",
        lambda: Host(stuck=True),
        "restart",
        {},
        {},
        HostStatus.FAILED,
        STOPPED,
    ),
    (
        "restart, start refused after the stop",
        lambda: Unit(refuse="start"),
        "restart",
        {},
        {},
        HostStatus.FAILED,
        STOPPED,
    ),
    (
        "reinstall and both rollbacks fail",
        lambda: Host(install_fails=1, sync_fails=2),
        "redeploy",
        {},
        {},
        HostStatus.FAILED,
        STOPPED,
    ),
    # Started, and the gate said how it runs.
    (
        "restart, unit dies",
        lambda: Host(unit_dies=True),
        "restart",
        {},
        {},
        HostStatus.FAILED,
        DOWN,
    ),
    (
        "restart, start fails and the unit is failed",
        lambda: Host(start_ok=False, unit_dies=True),
        "restart",
        {},
        {},
        HostStatus.FAILED,
        DOWN,
    ),
    (
        "restart, unhealthy",
        lambda: Host(health_status=503),
        "restart",
        {"start_timeout_s": 5},
        {},
        HostStatus.FAILED,
        NOT_READY,
    ),
    (
        "unhealthy, rollback off",
        lambda: Host(health_status=503),
        "redeploy",
        {"start_timeout_s": 5, "rollback_on_unhealthy": False},
        {},
        HostStatus.FAILED,
        NOT_READY,
    ),
    (
        "unhealthy, rolled back and unhealthy again",
        lambda: Host(health_status=503),
        "redeploy",
        {"start_timeout_s": 5},
        {},
        HostStatus.FAILED,
        NOT_READY,
    ),
    (
        "install failed, rollback's unit dies",
        lambda: Host(install_fails=1, unit_dies=True),
        "redeploy",
        {},
        {},
        HostStatus.FAILED,
        DOWN,
    ),
    # The rollback served again.
    (
        "install failed, rolled back",
        lambda: Host(install_fails=1),
        "redeploy",
        {},
        {},
        HostStatus.ROLLED_BACK,
        UP,
    ),
    (
        "import gate refused, rolled back",
        lambda: Host(gate_exit=3, gate_stdout=""),
        "redeploy",
        {},
        {},
        HostStatus.ROLLED_BACK,
        UP,
    ),
    (
        "cancelled in the drain, restarted",
        lambda: Host(drain_after_polls=100, cancel_at=_cancel_in_drain),
        "redeploy",
        {},
        {},
        HostStatus.CANCELLED,
        UP,
    ),
    ("status", Host, "status", {}, {}, HostStatus.SUCCEEDED, UP),
]


def _run(
    case: tuple[str, Callable[[], Host], str, dict[str, Any], dict[str, Any], str, ServiceState],
) -> tuple[Host, HostOutcome]:
    _, make, action, svc, plan, _, _ = case
    host = make()
    return host, run(host, action, svc=svc, **plan)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_each_path_leaves_the_state_it_says(case: Any) -> None:
    _, out = _run(case)
    assert (out.status, out.state) == (case[5], case[6]), out.summary


# What the summaries say of the service, back to the value.
SAID = {"UP but NOT READY": NOT_READY, "DOWN": DOWN, "STOPPED": STOPPED, "UP": UP}
PHRASE = re.compile(
    r"[Tt]he service is (UP but NOT READY|DOWN|STOPPED|UP)\b"
    r"|(Whether the service runs is unknown)"
)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_summary_says_the_state_it_carries(case: Any) -> None:
    _, out = _run(case)
    said = {SAID[m[0]] if m[0] else UNKNOWN for m in PHRASE.findall(out.summary)}
    assert said <= {out.state}, out.summary


def test_the_words_are_rendered_from_the_state() -> None:
    assert service_is(STOPPED) == "The service is STOPPED"
    assert service_is(STOPPED, mid=True) == "the service is STOPPED"
    assert service_is(NOT_READY) == "The service is UP but NOT READY"
    assert service_is(DOWN) == "The service is DOWN"
    assert service_is(UP) == "The service is UP"
    assert service_is(UNKNOWN) == "Whether the service runs is unknown"
    # The sentences themselves, as operators read them.
    out = run(Unit(refuse="start"), "restart")
    assert out.summary.endswith(
        "systemctl start failed (" + SUDO_REFUSED + "). The service is STOPPED."
    ), out.summary
    out = run(Host(stuck=True))
    assert "The service is STOPPED and nothing was reinstalled" in out.summary


def test_a_start_that_never_ran_is_not_read_as_down() -> None:
    # systemctl is-active would say "inactive" (DOWN for a start that ran and died): the
    # start never ran, so the unit is as this run's stop left it, and nothing asks.
    h = Unit(refuse="start")
    out = run(h, "restart")
    assert out.state == STOPPED and verbs(h) == ["stop", "start"]
    assert ("systemctl", "is-active", "--no-pager", "--", "vllm-kimi-k25") not in h.calls[-2:]


@pytest.mark.parametrize(
    ("active", "state"),
    [
        ("active", UP),
        ("reloading", UP),
        ("failed", DOWN),
        ("activating", DOWN),
        ("inactive", STOPPED),
        ("deactivating", STOPPED),
        ("maintenance", UNKNOWN),
    ],
)
def test_what_preflight_reads_is_the_untouched_state(active: str, state: ServiceState) -> None:
    r = ok(("systemctl", "show"), f"ActiveState={active}\n")
    assert read_state(r, {"ActiveState": active}) == state
    assert read_state(ok(("systemctl", "show"), status=1), {"ActiveState": active}) == UNKNOWN


def test_read_only_flows_do_not_claim_a_state() -> None:
    # The preview and the GPU health read look at the environment and the GPUs, not at
    # the unit: how the service runs, they do not know.
    s = settings()
    svc = s.services["kimi"]
    plan = make_plan(s, Action.REDEPLOY, "kimi", version="0.16.0")
    assert drive(preview(plan, svc, "h1"), Host()).state == UNKNOWN
    assert drive(gpu_health_flow(svc, "h1"), Host()).state == UNKNOWN


# ---- the executor puts the outcome's state on its event ------------------------------------


class _Named:
    host = "h1"


class _Events:
    def __init__(self) -> None:
        self.events: list[ev.Event] = []

    async def handle(self, event: ev.Event) -> None:
        self.events.append(event)


@pytest.mark.parametrize("state", list(ServiceState))
async def test_host_finished_carries_the_outcomes_state(state: ServiceState) -> None:
    def flow() -> Flow:
        tick = yield Checkpoint()
        assert isinstance(tick, Tick)
        return HostOutcome(HostStatus.FAILED, "done", state)

    sink = _Events()
    out = await Executor(1, _Named(), sink).drive(flow())  # type: ignore[arg-type]
    assert out.state == state
    assert [(type(e), e.state) for e in sink.events if isinstance(e, ev.HostFinished)] == [
        (ev.HostFinished, state)
    ]


async def test_a_reply_of_the_wrong_type_is_a_bug_said_at_once() -> None:
    from bot.core.phases.actions import pause

    def flow() -> Flow:
        yield from pause()
        return HostOutcome(HostStatus.SUCCEEDED, "done", UP)

    gen = flow()
    gen.send(None)
    with pytest.raises(TypeError, match="Checkpoint was answered with NoneType, not Tick"):
        gen.send(None)


@pytest.mark.parametrize(
    ("action", "said"),
    [
        ("status", "; vllm ?; serving kimi-k2.5"),
        ("restart", "restarted on ?, healthy"),
        ("redeploy", "vllm 0.16.0rc2.dev313+g662205d34 -> ?, healthy"),
    ],
)
def test_a_version_not_read_is_a_question_mark_never_none(action: str, said: str) -> None:
    """`uv pip show` gets no answer (a connection dropped after the start, a venv uv
    cannot read at a status): the run's words say the version is not known, never
    Python's None ("restarted on None", "vllm None" in the first `status` of a new
    setup). The preflight of a redeploy still needs it, so there it is read."""
    h = Host()
    before_start = action == "redeploy"
    h.lose = lambda a: a[1:3] == ("pip", "show") and (h.health_checks > 0 or not before_start)
    out = run(h, action)
    assert out.status == "succeeded", out.summary
    assert said in out.summary and "None" not in out.summary
    ended = steps_said(h)
    assert ended and not [e for _, e in ended if "None" in e]


def steps_said(h: Host) -> list[tuple[str, str]]:
    return [(n.step, n.summary) for n in h.notices if isinstance(n, EndStep)]
