"""Taking a replica out of its router's rotation before its stop, and putting it back
once it is ready (issue 19). Pure phases: the router's commands and HTTP requests run on
its host (``on``), a sibling's readiness is asked from the sibling's host.

The order is every careful peer's: check the others serve, stop new requests to this one,
let what it holds finish (the router's sessions; then the service's own ``/metrics``
drain, which follows in the stop phase), and only after the redeploy's gates put it back
and see the router take it. A replica whose redeploy did not end healthy stays out:
never put back unready."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from bot.core.phases.actions import (
    BeginStep,
    Emit,
    EndStep,
    HostOutcome,
    Phase,
    Progress,
    RotationChange,
    http,
    pause,
    rotation_records,
)
from bot.core.phases.common import HEALTH_REQUEST_TIMEOUT_S
from bot.core.plan import Plan, Step
from bot.core.routers import ops, text
from bot.core.routers.target import RouterTarget
from bot.core.routers.view import Rotation, RouterRead, ServerView
from bot.core.service_state import ServiceState
from bot.core.status import HostStatus
from bot.settings import ServiceSettings


@dataclass(frozen=True, slots=True)
class Serving:
    """Which of the other replicas serve now: the router does not hold them out and their
    health endpoint answers 200."""

    serving: tuple[str, ...]
    not_serving: tuple[tuple[str, str], ...]  # (host, why)

    def describe(self, total: int) -> str:
        why = "; ".join(f"{h}: {w}" for h, w in self.not_serving)
        return f"{len(self.serving)} of {total} others serving" + (f" ({why})" if why else "")


def undrain_hint(plan: Plan, host: str) -> str:
    return (
        f"`/vllm undrain {plan.service} {host}` (or `python -m bot undrain {plan.service} {host}`)"
    )


def stays_out(plan: Plan, host: str) -> str:
    """The sentence every outcome that leaves a replica out of rotation ends with."""
    t = _target(plan)
    return (
        f"{host} stays out of rotation (router {t.name}, server {t.server(host)}); once it is "
        f"ready put it back with {undrain_hint(plan, host)}"
    )


def _target(plan: Plan) -> RouterTarget:
    assert plan.router is not None  # only plans with a router rotate
    return plan.router


def _serving(t: RouterTarget, view: ServerView) -> str | None:
    """Why the router does not send this server requests, or None when it does. UNKNOWN
    counts as serving (if its readiness answers) only for the command kind, which can
    never tell and whose held-out replicas the audit records mark OUT; from a router that
    can tell, a state it did not name is no proof of serving."""
    if view.rotation in (Rotation.OUT, Rotation.DRAINING):
        return f"{view.rotation} of rotation ({view.detail})" if view.detail else str(view.rotation)
    if view.rotation == Rotation.UNKNOWN and t.kind != "command":
        return f"the router's state for it is unknown ({view.detail or 'no detail'})"
    if view.up is False:
        return f"the router's health check says down ({view.detail})"
    return None


def others_serving(
    plan: Plan, svc: ServiceSettings, step: Step, out: Sequence[str], read: RouterRead
) -> Phase[Serving]:
    """The replicas outside ``out`` that serve: in rotation at the router and their own
    health endpoint answering, asked from their hosts."""
    t = _target(plan)
    serving: list[str] = []
    not_serving: list[tuple[str, str]] = []
    for host, server in t.servers:
        if host in out:
            continue
        why = read.error or _serving(t, read.of(server))
        if why is None:
            r = yield from http(svc.health_url, HEALTH_REQUEST_TIMEOUT_S, on=host)
            if r.status != 200:
                why = f"GET {svc.health_url}: {r.error or r.status}"
        if why is None:
            serving.append(host)
        else:
            not_serving.append((host, why))
    return Serving(tuple(serving), tuple(not_serving))


@dataclass(frozen=True, slots=True)
class Taken:
    """A replica out of rotation before its stop, and how: its end undoes only what the
    bot did."""

    # None: the bot took it out. Else how it was out before this run came (by hand:
    # MAINT, DRAIN, weight 0, not listed; or left out by an earlier run, as the audit
    # log's rotations say): it ends as it was found, the router touched at neither end.
    held: str | None = None
    # The router's own names for it before (vllm-router: the URLs GET /workers listed
    # it under), to put it back under the same one.
    names: tuple[str, ...] = ()


# A replica without a router, or one the rotation has nothing to undo for.
NOTHING_TAKEN = Taken()


def held_text(held: str) -> str:
    return f"{held}; left out"


def _why_out(t: RouterTarget, server: str, view: ServerView) -> Phase[str]:
    """How a replica found out of rotation came to be so, for the thread and the audit
    log: by hand, or left out by an earlier run of the bot (a redeploy that ended
    unhealthy, a bot killed mid-roll), which its ``rotations`` rows tell."""
    state = view.detail or str(view.rotation)
    if t.kind == "command":
        # The command kind cannot read the router: the records are why it is OUT.
        return f"out of rotation: {state}"
    rec = yield from rotation_records(t.name, (server,))
    if rec.error is not None:
        return f"out of rotation before this run ({state}; who took it out is unknown: {rec.error})"
    if server in rec.held_out:
        return f"out of rotation ({state}): {rec.held_out[server]}"
    return f"held out of rotation by hand ({state})"


def take_out(plan: Plan, svc: ServiceSettings, host: str, out: Sequence[str]) -> Phase[Taken | str]:
    """Take ``host`` out of rotation and wait until the router holds no session for it.
    ``out``: the hosts going out with it (its batch). How it is out once it is (one held
    out by hand before is left so); else why it was refused, with the replica left in
    rotation (put back where the take-out had begun)."""
    t = _target(plan)
    server = t.server(host)
    yield Emit(BeginStep(Step.ROTATION_OUT, text.shown_out(t, server)))
    read = yield from ops.read(t, Step.ROTATION_OUT, [s for _, s in t.servers], records=True)
    others = yield from others_serving(plan, svc, Step.ROTATION_OUT, out, read)
    total = len(t.servers) - len(out)
    if len(others.serving) < t.min_serving:
        why = (
            f"refused to take {host} out of rotation: {others.describe(total)}, and "
            f"min_serving is {t.min_serving}"
        )
        yield Emit(EndStep(Step.ROTATION_OUT, False, why))
        return why
    own = read.of(server)
    if read.error is None and own.rotation in (Rotation.OUT, Rotation.DRAINING):
        # Out before the bot came: an operator's decision the bot must not undo (a
        # `state drain` would lift a MAINT, a put-back would end it), or an earlier
        # run's, which only a ready replica's undrain ends.
        held = yield from _why_out(t, server, own)
        said = held_text(held)
        yield Emit(RotationChange(t.name, server, "out", True, said, held=True))
        yield Emit(
            EndStep(
                Step.ROTATION_OUT,
                True,
                f"{host} {said}, the router untouched (server {server}); {others.describe(total)}",
            )
        )
        return Taken(held=held)
    failed = yield from ops.take_out(t, Step.ROTATION_OUT, server, own.names)
    if failed is None:
        failed = yield from _still_in(t, server, finished=False)
    yield Emit(RotationChange(t.name, server, "out", failed is None, failed or "draining"))
    if failed is None:
        failed = yield from _wait_idle(plan, t, host, server)
    if failed is None:
        failed = yield from ops.finish_out(t, Step.ROTATION_OUT, server)
    if failed is None:
        failed = yield from _still_in(t, server, finished=True)
    if failed is not None:
        undone = yield from _undo(t, server, own.names)
        why = f"could not take {host} out of rotation: {failed}; {undone}"
        yield Emit(EndStep(Step.ROTATION_OUT, False, why))
        return why
    yield Emit(
        EndStep(
            Step.ROTATION_OUT,
            True,
            f"{host} out of rotation (server {server}); {others.describe(total)}",
        )
    )
    return Taken(names=own.names)


def _still_in(t: RouterTarget, server: str, *, finished: bool) -> Phase[str | None]:
    """After a take-out the router said it took: read it again and require ``server``
    gone or draining (a router may answer "removed" and keep routing to it). None when
    it is; else what the router still shows. A kind that cannot be read passes."""
    wanted = ops.out_states(t, finished=finished)
    if wanted is None:
        return None
    read = yield from ops.read(t, Step.ROTATION_OUT, [server])
    if read.error is not None:
        return f"cannot confirm {server} is out of rotation: {read.error}"
    view = read.of(server)
    if view.rotation in wanted:
        return None
    return f"the router still has {server} {view.rotation} ({view.detail or 'no detail'})"


def _undo(t: RouterTarget, server: str, names: Sequence[str]) -> Phase[str]:
    back = yield from ops.put_back(t, Step.ROTATION_OUT, server, names)
    yield Emit(RotationChange(t.name, server, "in", back is None, back or "undone"))
    return "put back in rotation" if back is None else f"putting it back failed too: {back}"


def _wait_idle(plan: Plan, t: RouterTarget, host: str, server: str) -> Phase[str | None]:
    """``settle_s``, then until the router shows no session for ``server`` (a kind that
    cannot count them leaves it to the service's own /metrics drain). None when idle;
    else why not (``--force``: no wait for the sessions)."""
    start = (yield from pause(t.settle_s)).now - t.settle_s
    while True:
        read = yield from ops.read(t, Step.ROTATION_OUT, [server], counts=True)
        view = read.of(server)
        now = (yield from pause()).now
        if read.error is None and (view.sessions in (None, 0) or plan.force):
            return None
        if now - start >= t.drain_timeout_s:
            left = read.error or f"{view.sessions} session(s) still open"
            return f"{left} after {t.drain_timeout_s:g}s"
        yield Progress(
            Step.ROTATION_OUT,
            f"{host} out of rotation, {read.error or f'{view.sessions} session(s) open'}",
            now - start,
        )
        yield from pause(t.poll_s)


def put_back(
    plan: Plan, svc: ServiceSettings, host: str, names: Sequence[str] = ()
) -> Phase[str | None]:
    """Put a healthy ``host`` back and confirm the router sends it requests. None when it
    serves again; else why it stays out. ``names``: the router's own names for it before
    it was taken out."""
    t = _target(plan)
    server = t.server(host)
    yield Emit(BeginStep(Step.ROTATION_IN, text.shown_in(t, server)))
    r = yield from http(svc.health_url, HEALTH_REQUEST_TIMEOUT_S)
    if r.status != 200:
        why = f"not put back: GET {svc.health_url} answered {r.error or r.status}"
        yield Emit(EndStep(Step.ROTATION_IN, False, why))
        return why
    failed = yield from ops.put_back(t, Step.ROTATION_IN, server, names)
    if failed is None:
        failed = yield from _confirm(t, server)
    yield Emit(RotationChange(t.name, server, "in", failed is None, failed or "serving"))
    if failed is not None:
        yield Emit(EndStep(Step.ROTATION_IN, False, failed))
        return failed
    yield Emit(EndStep(Step.ROTATION_IN, True, f"{host} back in rotation (server {server})"))
    return None


def _confirm(t: RouterTarget, server: str) -> Phase[str | None]:
    """Until the router shows ``server`` in rotation and up (a kind that cannot tell:
    the command's success is all there is)."""
    start = (yield from pause()).now
    while True:
        read = yield from ops.read(t, Step.ROTATION_IN, [server])
        view = read.of(server)
        known = (Rotation.IN, Rotation.UNKNOWN) if t.kind == "command" else (Rotation.IN,)
        if read.error is None and view.rotation in known:
            if view.up is not False:
                return None
        now = (yield from pause()).now
        if now - start >= t.confirm_timeout_s:
            said = read.error or f"{view.rotation}, {view.detail or 'no detail'}"
            return (
                f"the router does not show {server} serving after {t.confirm_timeout_s:g}s ({said})"
            )
        yield from pause(t.poll_s)


def _left_held(plan: Plan, host: str, outcome: HostOutcome, held: str) -> HostOutcome:
    """The end of a replica held out by hand before the run: as it was left, and said."""
    t = _target(plan)
    return replace(
        outcome,
        summary=f"{outcome.summary.rstrip('.')}. {host} was {held_text(held)}, as found "
        f"(router {t.name}, server {t.server(host)}); once it should serve put it back "
        f"with {undrain_hint(plan, host)}",
    )


def rotated_end(
    plan: Plan, svc: ServiceSettings, host: str, outcome: HostOutcome, taken: Taken
) -> Phase[HostOutcome]:
    """After the redeploy of a replica taken out: back in rotation when it ended healthy,
    else it stays out and the outcome says so and how to put it back. One held out by
    hand before stays so, the router untouched."""
    if taken.held is not None:
        return _left_held(plan, host, outcome, taken.held)
    # A cancel that ended with the service healthy again goes back too: it is ready.
    if outcome.state == ServiceState.UP and outcome.status in (
        HostStatus.SUCCEEDED,
        HostStatus.CANCELLED,
    ):
        failed = yield from put_back(plan, svc, host, taken.names)
        if failed is None:
            return outcome
        return HostOutcome(
            HostStatus.FAILED,
            f"{outcome.summary}, but not back in rotation: {failed}. {stays_out(plan, host)}",
            outcome.state,
            outcome.version_before,
            outcome.version_after,
        )
    return HostOutcome(
        outcome.status,
        f"{outcome.summary.rstrip('.')}. {stays_out(plan, host)}",
        outcome.state,
        outcome.version_before,
        outcome.version_after,
    )


def untouched_end(
    plan: Plan, svc: ServiceSettings, host: str, outcome: HostOutcome, taken: Taken
) -> Phase[HostOutcome]:
    """A run that ended before the stop with the replica out of rotation (its requests
    would not drain, a cancel): the service was never touched, so it goes back, unless
    it was held out by hand before."""
    if taken.held is not None:
        return _left_held(plan, host, outcome, taken.held)
    failed = yield from put_back(plan, svc, host, taken.names)
    if failed is None:
        return outcome
    return HostOutcome(
        outcome.status,
        f"{outcome.summary.rstrip('.')}; not back in rotation: {failed}. {stays_out(plan, host)}",
        outcome.state,
        outcome.version_before,
        outcome.version_after,
    )
