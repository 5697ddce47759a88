"""Rotation around a redeploy (issue 19), driven by hand-made outcomes (no I/O): the
flow's host is tests/test_sequence.py's ``Host``; a ``Router`` answers what runs on the
router's host and each sibling's health check. The command kind here; the real routers
are tests/test_rotation_e2e.py's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bot.core.flows import EndStep, HttpCheck, RotationChange, RunCommand, redeploy_flow
from bot.core.plan import Step, make_plan
from bot.core.service_state import ServiceState
from bot.hosts.base import CommandResult, HttpResult
from bot.settings import Settings
from tests.test_sequence import Host, drive, ok, steps, verbs

LB = ["/usr/local/bin/lb"]


def settings(
    hosts: tuple[str, ...] = ("h1", "h2"), router: dict[str, Any] | None = None, **svc: Any
) -> Settings:
    base: dict[str, Any] = {
        "hosts": list(hosts),
        "unit": "vllm-kimi-k25",
        "python": "/opt/venvs/vllm/bin/python",
        "drain_timeout_s": 10,
        "drain_poll_s": 1,
        "start_timeout_s": 30,
        "health_poll_s": 2,
        "min_free_disk_mib": 1000,
        "router": "front",
        "router_servers": {h: f"node{i}" for i, h in enumerate(hosts, 1)},
    }
    base.update(svc)
    return Settings(
        hosts={
            h: {"address": f"10.0.0.{i}", "known_hosts": "/tmp/kh"}
            for i, h in enumerate((*hosts, "lb-1"), 1)
        },
        routers={
            "front": {
                "kind": "command",
                "host": "lb-1",
                "drain": [*LB, "out", "{server}"],
                "undrain": [*LB, "in", "{server}"],
                "in_flight": [*LB, "sessions", "{server}"],
                "settle_s": 2,
                "poll_s": 1,
                "drain_timeout_s": 10,
                **(router or {}),
            }
        },
        services={"kimi": base},
    )


@dataclass
class Router:
    """The router's host and the siblings, as the flow's actions reach them (``on``)."""

    sessions: list[int] = field(default_factory=lambda: [2, 1, 0])
    drain_exit: int = 0
    undrain_exit: int = 0
    sibling_health: int = 200
    out: set[str] = field(default_factory=set)
    calls: list[tuple[str, ...]] = field(default_factory=list)
    # (the flow host's clock, the change) for each change that reached the router
    changes: list[tuple[float, str]] = field(default_factory=list)


@dataclass
class RoutedHost(Host):
    router: Router = field(default_factory=Router)

    def respond(self, action: Any) -> Any:
        if isinstance(action, RunCommand) and action.on == "lb-1":
            return self.lb(action.argv)
        if isinstance(action, HttpCheck) and action.on is not None and action.on != "h1":
            return HttpResult(action.url, self.router.sibling_health)
        return super().respond(action)

    def lb(self, a: tuple[str, ...]) -> CommandResult:
        r = self.router
        r.calls.append(a)
        verb, server = a[1], a[2]
        if verb == "sessions":
            n = r.sessions.pop(0) if len(r.sessions) > 1 else r.sessions[0]
            return ok(a, f"{n}\n")
        code = r.drain_exit if verb == "out" else r.undrain_exit
        if code == 0:
            (r.out.add if verb == "out" else r.out.discard)(server)
            r.changes.append((self.now, f"{verb} {server}"))
        return ok(a, stderr="" if code == 0 else "lb: backend refused", status=code)


def run(h: RoutedHost, hosts: tuple[str, ...] = ("h1", "h2"), **svc: Any) -> Any:
    s = settings(hosts, **svc)
    plan = make_plan(s, "redeploy", "kimi", version="0.16.0")  # type: ignore[arg-type]
    return drive(redeploy_flow(plan, s.services["kimi"], "h1"), h)


def rotations(h: Host) -> list[tuple[str, str, bool]]:
    return [(n.change, n.server, n.ok) for n in h.notices if isinstance(n, RotationChange)]


def test_out_of_rotation_before_the_drain_and_back_only_once_healthy() -> None:
    h = RoutedHost()
    out = run(h)
    assert out.status == "succeeded", out.summary
    names = [s for s, _ in steps(h)]
    # Out after the preflight's reads (they touch nothing), before the request drain and
    # the stop; back in after every post-check.
    assert names.index("prefetch") < names.index("rotation_out") < names.index("requests")
    assert names[-1] == "rotation_in" and all(ok for _, ok in steps(h))
    assert rotations(h) == [("out", "node1", True), ("in", "node1", True)]
    assert h.router.calls[0] == (*LB, "out", "node1")
    # settle, then polled until the router counted no session for it
    assert [c[1] for c in h.router.calls].count("sessions") == 3
    assert h.router.calls[-1] == (*LB, "in", "node1")
    assert h.router.out == set()
    assert verbs(h) == ["stop", "install", "start"]


def test_a_failed_redeploy_leaves_it_out_and_says_how_to_put_it_back() -> None:
    h = RoutedHost(install_fails=9)
    out = run(h)
    assert out.status in ("rolled_back", "failed"), out.summary
    assert out.state == ServiceState.UP  # the snapshot restored and started
    assert rotations(h) == [("out", "node1", True)]
    assert h.router.out == {"node1"}
    assert "h1 stays out of rotation (router front, server node1)" in out.summary
    assert "`/vllm undrain kimi h1`" in out.summary
    assert "rotation_in" not in [s for s, _ in steps(h)]


def test_min_serving_refuses_before_anything_changes() -> None:
    h = RoutedHost(router=Router(sibling_health=503))
    out = run(h)
    assert out.status == "aborted"
    assert "refused to take h1 out of rotation: 0 of 1 others serving" in out.summary
    assert "min_serving is 1" in out.summary and "service untouched" in out.summary
    assert h.router.calls == [] and verbs(h) == []
    assert rotations(h) == []
    end = next(n for n in h.notices if isinstance(n, EndStep) and n.step == Step.ROTATION_OUT)
    assert not end.ok


def test_min_serving_zero_lets_the_only_replica_go() -> None:
    h = RoutedHost()
    out = run(h, hosts=("h1",), min_serving=0)
    assert out.status == "succeeded", out.summary
    assert rotations(h) == [("out", "node1", True), ("in", "node1", True)]


def test_a_router_that_refuses_the_drain_leaves_the_service_untouched() -> None:
    h = RoutedHost(router=Router(drain_exit=3))
    out = run(h)
    assert out.status == "aborted"
    assert "could not take h1 out of rotation: `drain` on lb-1 failed (exit 3)" in out.summary
    assert "lb: backend refused" in out.summary
    assert verbs(h) == []
    # the attempt and its undo are both recorded
    assert rotations(h) == [("out", "node1", False), ("in", "node1", True)]


def test_sessions_that_never_end_put_it_back_untouched() -> None:
    h = RoutedHost(router=Router(sessions=[4]))
    out = run(h)
    assert out.status == "aborted"
    assert "4 session(s) still open after 10s" in out.summary
    assert verbs(h) == [] and h.router.out == set()


def test_force_does_not_wait_for_the_router_sessions() -> None:
    h = RoutedHost(router=Router(sessions=[4]))
    s = settings()
    plan = make_plan(s, "redeploy", "kimi", version="0.16.0", force=True)  # type: ignore[arg-type]
    out = drive(redeploy_flow(plan, s.services["kimi"], "h1"), h)
    assert out.status == "succeeded", out.summary
    assert [c[1] for c in h.router.calls].count("sessions") == 1


def test_a_put_back_the_router_refuses_fails_the_host_with_the_service_up() -> None:
    h = RoutedHost(router=Router(undrain_exit=1))
    out = run(h)
    assert out.status == "failed"
    assert out.state == ServiceState.UP
    assert "but not back in rotation: `undrain` on lb-1 failed (exit 1)" in out.summary
    assert rotations(h)[-1] == ("in", "node1", False)


def test_the_plan_lists_the_router_commands_exactly() -> None:
    plan = make_plan(settings(), "redeploy", "kimi", version="0.16.0")  # type: ignore[arg-type]
    shown = {s.step: s.command for s in plan.steps}
    assert "on lb-1: /usr/local/bin/lb out '{server}'" in shown[Step.ROTATION_OUT]
    assert "h1 = node1, h2 = node2" in shown[Step.ROTATION_OUT]
    assert "/usr/local/bin/lb in '{server}'" in shown[Step.ROTATION_IN]
    # The approval covers the router too: a re-pointed one is a changed plan.
    assert plan.to_json()["router"]["servers"] == (("h1", "node1"), ("h2", "node2"))
    moved = settings(router={"undrain": [*LB, "enable", "{server}"]})
    again = make_plan(moved, "redeploy", "kimi", version="0.16.0")  # type: ignore[arg-type]
    assert again.to_json() != plan.to_json()


# ---- found by the review (cutting wires) ----------------------------------------


def test_a_replica_the_records_hold_out_does_not_count_as_serving() -> None:
    """The command kind cannot read its router: a sibling drained by hand (its unit still
    running, its health 200) is out by the audit log's last change, so min_serving keeps
    the only replica in rotation instead of taking both out."""
    h = RoutedHost(held_out={"node2": "run #7 took it out"})
    out = run(h)
    assert out.status == "aborted", out.summary
    assert "refused to take h1 out of rotation: 0 of 1 others serving" in out.summary
    assert "run #7 took it out" in out.summary
    assert h.router.calls == [] and verbs(h) == []


def test_an_unreadable_session_count_is_not_zero() -> None:
    """`in_flight` printing no number: the wait goes on until drain_timeout_s, then the
    take-out is undone and the service is left untouched (never stopped on a guess)."""

    class Garbled(RoutedHost):
        def lb(self, a: tuple[str, ...]) -> CommandResult:
            if a[1] == "sessions":
                self.router.calls.append(a)
                return ok(a, "sessions: unknown\n")
            return super().lb(a)

    h = Garbled()
    out = run(h)
    assert out.status == "aborted", out.summary
    assert "in_flight printed no count" in out.summary and "after 10s" in out.summary
    assert "stop" not in verbs(h)
    assert rotations(h) == [("out", "node1", True), ("in", "node1", True)]


def test_a_replica_the_records_hold_out_is_redeployed_and_left_out() -> None:
    """h1 itself held out (the audit log's last change for node1 is an `out`): the
    redeploy goes on, but neither `drain` nor `undrain` runs for it, and it ends out, as
    the operator left it, with the decision recorded."""
    h = RoutedHost(held_out={"node1": "run #7 took it out"})
    out = run(h)
    assert out.status == "succeeded", out.summary
    assert h.router.calls == []  # the router untouched at both ends
    assert verbs(h) == ["stop", "install", "start"]
    # Left out by the bot's own earlier run, and said so: not "by hand".
    assert "out of rotation: run #7 took it out; left out" in out.summary
    assert "by hand" not in out.summary
    assert "`/vllm undrain kimi h1`" in out.summary
    [change] = [n for n in h.notices if isinstance(n, RotationChange)]
    assert (change.change, change.server, change.ok, change.held) == ("out", "node1", True, True)
    assert "rotation_in" not in [s for s, _ in steps(h)]
