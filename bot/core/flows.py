"""The maintenance sequences as pure generators: they yield actions and consume replies.

No I/O happens here (the httpx ``auth_flow`` pattern): ``bot.engine.executor`` performs
each action and sends the reply back, and the tests drive these generators
with hand-made replies to cover every branch.  A flow handles one host and
returns a ``HostOutcome``; rollouts over several hosts are composed by the caller.

This module composes the phases of ``bot.core.phases`` (preflight, GPU check, stop and
drain, leftovers, install and gate, start and readiness, rollback) into the redeploy and
the restart, and re-exports the names the rest of the bot imports from here.  The
actions, replies and outcomes are ``bot.core.phases.actions``.

Replies sent back per action:
``RunCommand`` -> ``CommandResult``; ``HttpCheck`` -> ``HttpResult``;
``ReadGpuState`` -> ``GpuStateRead``; ``AskApproval`` -> ``Approval``;
``Sleep`` / ``Checkpoint`` -> ``Tick``; ``Emit`` / ``Progress`` -> ``None``.

A ``CommandResult`` with neither an exit status nor a signal means the result
never came back: the host could not be reached, the connection died (keepalive
lost, link cut) or stopped answering past the local deadline.  What the command
did on the host is then unknown (``lost``), and each step decides what that
means for it; see docs/reliability.md for the whole fault matrix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import assert_never

from bot.core import remote
from bot.core.packages import EnvKind
from bot.core.phases import rotation
from bot.core.phases.actions import (
    Action,
    BeginStep,
    Checkpoint,
    Emit,
    EndStep,
    Flow,
    Health,
    HostOutcome,
    HttpCheck,
    Notice,
    Packages,
    Phase,
    Progress,
    ReadGpuState,
    Reply,
    RotationChange,
    RunCommand,
    Sleep,
    Snapshot,
    Tick,
    Versions,
    pause,
    service_is,
)
from bot.core.phases.common import (
    HEALTH_REQUEST_TIMEOUT_S,
    DrainEnd,
    InstallEnd,
    lost,
    read_installed,
    status_hint,
)
from bot.core.phases.gpu_check import gpu_check, gpu_health_flow, gpu_recheck
from bot.core.phases.install import INSTALL_KILL_GRACE_S, import_gate, record_change, run_install
from bot.core.phases.preflight import Env, Refused, prefetch, preflight, preflight_unit
from bot.core.phases.read_only import preview_flow, status_flow
from bot.core.phases.releases import (
    Built,
    build,
    rollback_target_of,
    switch_and_start,
)
from bot.core.phases.rollback import rollback, rollback_command, unhealthy
from bot.core.phases.rotation_ops import drain_flow, rotation_flow, undrain_flow
from bot.core.phases.start import (
    FOLLOW_FAILED_READS,
    STARTUP_FAILED,
    StartFailed,
    left_as,
    postcheck,
    recover_after_cancel,
    start_and_gate,
)
from bot.core.phases.stop import UNKNOWN_LOAD_READS, cancelled_before_change, quiesce_and_stop
from bot.core.phases.terminate import drain_clean
from bot.core.phases.watch import watch_window
from bot.core.plan import Plan, Step, cmd
from bot.core.service_state import ServiceState
from bot.core.status import Action as RunAction  # `Action` here is what a flow yields
from bot.core.status import HostStatus
from bot.core.unit_flags import ServeCommand
from bot.core.versions import version_text
from bot.settings import ServiceSettings

# What the rest of the bot imports from here (the executor, the engine, the tests).
__all__ = [
    "FLOWS",
    "FOLLOW_FAILED_READS",
    "HEALTH_REQUEST_TIMEOUT_S",
    "INSTALL_KILL_GRACE_S",
    "STARTUP_FAILED",
    "UNKNOWN_LOAD_READS",
    "Action",
    "BeginStep",
    "Checkpoint",
    "DrainEnd",
    "Emit",
    "EndStep",
    "Flow",
    "Health",
    "HostOutcome",
    "HttpCheck",
    "InstallEnd",
    "Notice",
    "Packages",
    "Progress",
    "ReadGpuState",
    "Reply",
    "RotationChange",
    "RunCommand",
    "Sleep",
    "Snapshot",
    "Tick",
    "Versions",
    "gpu_health_flow",
    "lost",
    "preview_flow",
    "redeploy_flow",
    "release_rollback_flow",
    "restart_flow",
    "rollback_command",
    "status_flow",
]


def _refused_before(why: str, untouched: ServiceState, before: str | None = None) -> HostOutcome:
    """A run that ends in preflight (or its GPU check): nothing on the host changed."""
    return HostOutcome(
        HostStatus.ABORTED, f"preflight refused; service untouched: {why}", untouched, before, None
    )


def redeploy_flow(plan: Plan, svc: ServiceSettings, host: str) -> Flow:
    """Preflight, stop, drain, reinstall (rollback on failure), start, health, post-check."""
    pre = yield from preflight(plan, svc, host)
    # Until the stop, every end leaves the service as preflight read it.
    before, untouched = pre.before, pre.state
    if pre.refusal is not None:
        return _refused_before(pre.refusal, untouched, before)
    assert pre.env is not None  # preflight refuses without a snapshot
    check = yield from gpu_check(svc, host, plan.is_local(host))
    if check.refusal is not None:
        return _refused_before(check.refusal, untouched, before)
    if plan.dry_run:
        return HostOutcome(
            HostStatus.SUCCEEDED,
            f"dry run: preflight passed; would install "
            f"{plan.spec}, changing {pre.env.planned.headline()}",
            untouched,
            before,
            None,
        )

    # A cancel that came during the preflight takes effect before the prefetch's downloads.
    if (ended := (yield from cancelled_before_change(before, untouched))) is not None:
        return ended
    built, said = yield from _before_the_stop(plan, svc, pre.env, pre.target, pre.serve)
    if said is not None:
        return HostOutcome(HostStatus.ABORTED, said, untouched, before, None)

    taken = yield from out_and_stop(plan, svc, host, before, untouched)
    if isinstance(taken, HostOutcome):
        return taken

    drain, reason = yield from drain_clean(svc, host)
    if drain == "cancelled":
        ended = yield from recover_after_cancel(svc, host, before, "during drain")
        return (yield from back_in(plan, svc, host, ended, taken))
    if drain == "failed":
        stopped = ServiceState.STOPPED
        failed = HostOutcome(
            HostStatus.FAILED,
            f"{reason}. {service_is(stopped)} and nothing "
            "was reinstalled; free the GPUs, then restart it.",
            stopped,
            before,
            None,
        )
        return (yield from back_in(plan, svc, host, failed, taken))
    if built is None:
        outcome = yield from _reinstall_and_start(plan, svc, host, before, pre.target, pre.env)
    else:
        outcome = yield from switch_and_start(plan, svc, host, before, built)
    outcome = yield from gpu_recheck(svc, host, check, outcome, plan.is_local(host))
    return (yield from back_in(plan, svc, host, outcome, taken))


def _before_the_stop(
    plan: Plan, svc: ServiceSettings, env: Env, target: str | None, serve: ServeCommand | str
) -> Phase[tuple[Built | None, str | None]]:
    """The new environment fetched and gated while the old one serves (in place: in a
    throwaway venv; side by side: the new release itself, kept). The built release (side
    by side), and why the run ends here (None: it goes on to the stop)."""
    built: Built | None = None
    said: str | None = None
    match svc.strategy:
        case "in_place":
            fetch_ended = yield from prefetch(plan, svc, env, target, serve)
            match fetch_ended:
                case None:
                    pass
                case ("prefetch", why):
                    said = f"prefetch failed; service untouched: {why}"
                case ("gate" | "flags", why):
                    said = f"refused before the stop; service untouched: {why}"
        case "side_by_side":
            release = yield from build(plan, svc, env, target, serve)
            match release:
                case Built():
                    built = release
                case ("layout", why):
                    said = f"preflight refused; service untouched: {why}"
                case ("build", why):
                    said = f"building the new release failed; service untouched: {why}"
                case ("gate" | "flags", why):
                    said = f"refused before the stop; service untouched: {why}"
        case _:
            assert_never(svc.strategy)
    return built, said


def out_and_stop(
    plan: Plan, svc: ServiceSettings, host: str, before: str | None, untouched: ServiceState
) -> Phase[HostOutcome | rotation.Taken]:
    """Behind a router: out of rotation first (bot.core.phases.rotation), then the
    request drain and the stop. How it left rotation once stopped (``Taken()`` without a
    router); else the run's end, the service untouched and, where the bot took it out,
    back in rotation."""
    taken = rotation.NOTHING_TAKEN
    if plan.router is not None:
        out = yield from rotation.take_out(plan, svc, host, _batch_of(plan, host))
        if isinstance(out, str):
            return HostOutcome(
                HostStatus.ABORTED, f"{out}; service untouched", untouched, before, None
            )
        taken = out
    ended = yield from cancelled_before_change(before, untouched)
    if ended is None:
        ended = yield from quiesce_and_stop(plan, svc, before, untouched)
    if ended is not None and plan.router is not None and ended.state == untouched:
        return (yield from rotation.untouched_end(plan, svc, host, ended, taken))
    if ended is not None and plan.router is not None:
        return HostOutcome(
            ended.status,
            f"{ended.summary.rstrip('.')}. {rotation.stays_out(plan, host)}",
            ended.state,
            ended.version_before,
            ended.version_after,
        )
    return taken if ended is None else ended


def back_in(
    plan: Plan, svc: ServiceSettings, host: str, outcome: HostOutcome, taken: rotation.Taken
) -> Flow:
    """The end of a change that stopped the service: behind a router, back in rotation
    when it ended healthy (and the bot took it out), else out of it and the outcome says
    how to put it back."""
    if plan.router is None:
        return outcome
    return (yield from rotation.rotated_end(plan, svc, host, outcome, taken))


def _batch_of(plan: Plan, host: str) -> tuple[str, ...]:
    """The hosts out of rotation together with ``host`` (its batch of the rollout)."""
    return next(b for b in plan.batches() if host in b)


def _reinstall_and_start(
    plan: Plan, svc: ServiceSettings, host: str, before: str | None, target: str | None, env: Env
) -> Flow:
    """The service is stopped and its GPUs free: reinstall, import-gate, start,
    health-gate and post-check; a failed reinstall, gate or health gate restores the
    environment snapshot."""
    install = remote.install(svc, plan.spec, plan.index_url)
    verdict, why = yield from run_install(
        svc,
        Step.REINSTALL,
        install,
        target,
        "reinstall",
        f"installed {plan.spec}",
        remote.index_input(plan.index_url),
    )
    if verdict == "unknown":
        stopped = ServiceState.STOPPED
        return HostOutcome(
            HostStatus.FAILED,
            f"{why}. Whether {plan.spec} was installed is unknown, and "
            f"{service_is(stopped, mid=True)}. {status_hint(plan.service)} once the host "
            "answers.",
            stopped,
            before,
            None,
        )
    if verdict == "failed":
        yield from record_change(svc, env, EnvKind.INSTALLED)  # what the failure left
        return (yield from rollback(plan, svc, host, before, why, env))

    refused = yield from import_gate(svc, env, target)
    if refused is not None:
        return (yield from rollback(plan, svc, host, before, refused, env))

    # A reinstall is never interrupted; a cancel that arrived meanwhile takes effect now.
    if (yield from pause()).cancel_requested:
        return (yield from recover_after_cancel(svc, host, before, "after the reinstall"))

    err = yield from start_and_gate(svc, Step.START, Step.HEALTH)
    if err is not None:
        return (yield from unhealthy(plan, svc, host, before, err, env))
    # The watch window (watch_s > 0): a failure in it rolls back as a failed readiness; a
    # cancel in it stops watching and leaves the new version running (README).
    watched = yield from watch_window(svc)
    if isinstance(watched, StartFailed):
        return (yield from unhealthy(plan, svc, host, before, watched, env))
    after = yield from postcheck(svc, host)
    if watched == "cancelled":
        return HostOutcome(
            HostStatus.CANCELLED,
            f"{svc.package} {version_text(before)} -> {version_text(after)}, healthy; "
            "cancelled during the watch window: "
            "watching stopped, the new version is left running",
            ServiceState.UP,
            before,
            after,
        )
    return HostOutcome(
        HostStatus.SUCCEEDED,
        f"{svc.package} {version_text(before)} -> {version_text(after)}, healthy"
        + (f", watched {svc.watch_s:g}s clean" if svc.watch_s > 0 else ""),
        ServiceState.UP,
        before,
        after,
    )


def restart_flow(plan: Plan, svc: ServiceSettings, host: str) -> Flow:
    """Stop, drain, start, health: the same gates as a redeploy without the reinstall."""
    yield Emit(BeginStep(Step.PREFLIGHT, cmd(remote.unit_show(svc))))
    try:
        props, untouched = yield from preflight_unit(svc, host)
    except Refused as e:
        yield Emit(EndStep(Step.PREFLIGHT, False, e.reason))
        return _refused_before(e.reason, ServiceState.UNKNOWN)
    before = yield from read_installed(Step.PREFLIGHT, svc)
    yield Emit(Versions(before, None))
    yield Emit(
        EndStep(
            Step.PREFLIGHT,
            True,
            f"{svc.unit} {props.get('ActiveState', '?')}, {svc.package} {version_text(before)}",
        )
    )
    check = yield from gpu_check(svc, host, plan.is_local(host))
    if check.refusal is not None:
        return _refused_before(check.refusal, untouched, before)
    taken = yield from out_and_stop(plan, svc, host, before, untouched)
    if isinstance(taken, HostOutcome):
        return taken
    drain, reason = yield from drain_clean(svc, host)
    if drain == "failed":
        stopped = ServiceState.STOPPED
        return (
            yield from back_in(
                plan,
                svc,
                host,
                HostOutcome(
                    HostStatus.FAILED,
                    f"{reason}. {service_is(stopped)}; free the GPUs, then restart it.",
                    stopped,
                    before,
                    None,
                ),
                taken,
            )
        )
    err = yield from start_and_gate(svc, Step.START, Step.HEALTH)
    if err is not None:
        state, left = yield from left_as(svc, Step.HEALTH, err)
        failed = HostOutcome(HostStatus.FAILED, f"{err.reason}. {left}", state, before, None)
        return (yield from back_in(plan, svc, host, failed, taken))
    after = yield from postcheck(svc, host)
    status = HostStatus.CANCELLED if drain == "cancelled" else HostStatus.SUCCEEDED
    outcome = yield from gpu_recheck(
        svc,
        host,
        check,
        HostOutcome(
            status, f"restarted on {version_text(after)}, healthy", ServiceState.UP, before, after
        ),
        plan.is_local(host),
    )
    return (yield from back_in(plan, svc, host, outcome, taken))


def release_rollback_flow(plan: Plan, svc: ServiceSettings, host: str) -> Flow:
    """A rollback by hand of a side-by-side service: stop, switch the link to the release
    live before the live one (by the audit log's switches; else the newest built before
    it: ``bot.core.releases.rollback_target``), start and gate it; a failed start
    switches back to the release that was live (``switch_and_start``). Nothing is
    installed."""
    yield Emit(BeginStep(Step.PREFLIGHT, f"{cmd(remote.unit_show(svc))}; the releases"))
    try:
        _, untouched = yield from preflight_unit(svc, host)
    except Refused as e:
        yield Emit(EndStep(Step.PREFLIGHT, False, e.reason))
        return _refused_before(e.reason, ServiceState.UNKNOWN)
    before = yield from read_installed(Step.PREFLIGHT, svc)
    live, target = yield from rollback_target_of(plan, svc)
    if isinstance(target, str):
        yield Emit(EndStep(Step.PREFLIGHT, False, target))
        return _refused_before(target, untouched, before)
    yield Emit(Versions(before, None))
    yield Emit(
        EndStep(
            Step.PREFLIGHT,
            True,
            f"live release {live}; switching to {target.name}: {target.why}",
        )
    )
    check = yield from gpu_check(svc, host, plan.is_local(host))
    if check.refusal is not None:
        return _refused_before(check.refusal, untouched, before)
    taken = yield from out_and_stop(plan, svc, host, before, untouched)
    if isinstance(taken, HostOutcome):
        return taken
    drain, reason = yield from drain_clean(svc, host)
    if drain == "cancelled":
        ended = yield from recover_after_cancel(svc, host, before, "during drain")
        return (yield from back_in(plan, svc, host, ended, taken))
    if drain == "failed":
        stopped = ServiceState.STOPPED
        failed = HostOutcome(
            HostStatus.FAILED,
            f"{reason}. {service_is(stopped)} and nothing was switched; free the GPUs, then "
            "restart it.",
            stopped,
            before,
            None,
        )
        return (yield from back_in(plan, svc, host, failed, taken))
    outcome = yield from switch_and_start(plan, svc, host, before, Built(target.name, live))
    outcome = yield from gpu_recheck(svc, host, check, outcome, plan.is_local(host))
    return (yield from back_in(plan, svc, host, outcome, taken))


FLOWS: dict[RunAction, Callable[[Plan, ServiceSettings, str], Flow]] = {
    RunAction.REDEPLOY: redeploy_flow,
    RunAction.RESTART: restart_flow,
    RunAction.ROLLBACK: release_rollback_flow,
    RunAction.STATUS: status_flow,
    RunAction.ROTATION: rotation_flow,
    RunAction.DRAIN: drain_flow,
    RunAction.UNDRAIN: undrain_flow,
}
