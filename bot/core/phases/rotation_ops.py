"""The rotation commands (issue 19, item 4), as flows on one replica's host: ``rotation``
reads where each replica stands (read-only), ``drain`` takes one out by hand and
``undrain`` puts one back, only once it is ready. The service itself is never stopped,
started or changed; the router's commands are the rolling redeploy's own
(``bot.core.phases.rotation``), so they are audited the same way (``RotationChange``)."""

from __future__ import annotations

from bot.core.phases.actions import BeginStep, Emit, EndStep, Flow, HostOutcome, Phase, http
from bot.core.phases.common import HEALTH_REQUEST_TIMEOUT_S
from bot.core.phases.ready import readiness_checks
from bot.core.phases.rotation import held_text, put_back, stays_out, take_out
from bot.core.plan import Plan, Step
from bot.core.routers import ops
from bot.core.routers.target import RouterTarget
from bot.core.routers.view import Rotation, ServerView
from bot.core.service_state import ServiceState
from bot.core.status import HostStatus
from bot.settings import ServiceSettings


def _router(plan: Plan) -> RouterTarget:
    assert plan.router is not None  # make_plan refuses these commands without a router
    return plan.router


def _health(svc: ServiceSettings) -> Phase[tuple[bool, str]]:
    r = yield from http(svc.health_url, HEALTH_REQUEST_TIMEOUT_S)
    if r.status == 200:
        return True, "health 200"
    return False, f"health {r.error or r.status}"


def describe(view: ServerView) -> str:
    """One replica as the router sees it: "in rotation (UP, 0 sessions)"."""
    where = {
        Rotation.IN: "in rotation",
        Rotation.DRAINING: "draining (no new requests)",
        Rotation.OUT: "OUT of rotation",
        Rotation.UNKNOWN: "rotation unknown",
    }[view.rotation]
    said = [view.detail] if view.detail else []
    if view.up is False and "down" not in view.detail.lower():
        said.append("router's check: down")
    if view.sessions is not None:
        said.append(f"{view.sessions} session(s)")
    elif view.rotation in (Rotation.IN, Rotation.DRAINING):
        # A router that cannot count them (vllm-router under most policies): never 0.
        said.append("sessions not known")
    return f"{where} ({', '.join(said)})" if said else where


def rotation_flow(plan: Plan, svc: ServiceSettings, host: str) -> Flow:
    """Read-only: this replica's place in rotation, its sessions, and its own health."""
    t = _router(plan)
    server = t.server(host)
    yield Emit(BeginStep(Step.ROTATION, plan.steps[0].command))
    read = yield from ops.read(t, Step.ROTATION, [server], counts=True, records=True)
    healthy, health = yield from _health(svc)
    state = ServiceState.UP if healthy else ServiceState.UNKNOWN
    if read.error is not None:
        summary = f"server {server} at router {t.name}: {read.error}; {health}"
        yield Emit(EndStep(Step.ROTATION, False, summary))
        return HostOutcome(HostStatus.FAILED, summary, state)
    summary = f"{describe(read.of(server))} at router {t.name} (server {server}); {health}"
    yield Emit(EndStep(Step.ROTATION, True, summary))
    return HostOutcome(HostStatus.SUCCEEDED, summary, state)


def drain_flow(plan: Plan, svc: ServiceSettings, host: str) -> Flow:
    """Take ``host`` out of rotation by hand; the service keeps running. Refused (and
    left in rotation) when fewer than ``min_serving`` others serve."""
    t = _router(plan)
    taken = yield from take_out(plan, svc, host, [host])
    healthy, _ = yield from _health(svc)
    state = ServiceState.UP if healthy else ServiceState.UNKNOWN
    if isinstance(taken, str):
        return HostOutcome(HostStatus.ABORTED, f"{taken}; service untouched", state)
    if taken.held is not None:
        return HostOutcome(
            HostStatus.SUCCEEDED,
            f"{host} was already {held_text(taken.held)} at router {t.name} "
            f"(server {t.server(host)}), the router untouched; {svc.unit} still runs there",
            state,
        )
    return HostOutcome(
        HostStatus.SUCCEEDED,
        f"{host} is out of rotation at router {t.name} (server {t.server(host)}); "
        f"{svc.unit} still runs there. {stays_out(plan, host)}",
        state,
    )


def undrain_flow(plan: Plan, svc: ServiceSettings, host: str) -> Flow:
    """Put ``host`` back once it is ready: health, then the readiness checks (model,
    smoke test, version); an unready replica is refused and stays out."""
    t = _router(plan)
    healthy, health = yield from _health(svc)
    if not healthy:
        why = f"refused to put {host} back in rotation: GET {svc.health_url} answered {health}"
        yield Emit(BeginStep(Step.READINESS, plan.steps[0].command))
        yield Emit(EndStep(Step.READINESS, False, why))
        return HostOutcome(HostStatus.ABORTED, f"{why}. It stays out.", ServiceState.UNKNOWN)
    not_ready = yield from readiness_checks(svc, Step.READINESS)
    if not_ready is not None:
        return HostOutcome(
            HostStatus.ABORTED,
            f"refused to put {host} back in rotation: {not_ready}. It stays out.",
            ServiceState.UP_NOT_READY,
        )
    failed = yield from put_back(plan, svc, host)
    if failed is not None:
        return HostOutcome(HostStatus.FAILED, f"{failed}. {stays_out(plan, host)}", ServiceState.UP)
    return HostOutcome(
        HostStatus.SUCCEEDED,
        f"{host} is back in rotation at router {t.name} (server {t.server(host)}), ready",
        ServiceState.UP,
    )
