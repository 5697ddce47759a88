"""The rollback: stop the version that never turned healthy, restore the whole
environment snapshot, start, gate and post-check it."""

from __future__ import annotations

from bot.core import remote
from bot.core.gpu import memory_summary
from bot.core.packages import EnvKind
from bot.core.phases.actions import (
    BeginStep,
    Emit,
    EndStep,
    Flow,
    HostOutcome,
    Phase,
    Sleep,
    Snapshot,
    pause,
    run,
    service_is,
)
from bot.core.phases.common import (
    InstallEnd,
    failed_msg,
    read_installed,
    read_snapshot,
    status_hint,
)
from bot.core.phases.install import record_change, run_install
from bot.core.phases.preflight import Env
from bot.core.phases.start import StartFailed, left_as, start_and_gate
from bot.core.phases.stop import drain_poll
from bot.core.plan import Plan, Step, cmd
from bot.core.service_state import ServiceState
from bot.core.status import HostStatus
from bot.core.versions import version_text
from bot.errors import GpuQueryError
from bot.settings import ServiceSettings


def _restore(
    plan: Plan, svc: ServiceSettings, before: str | None, env: Env
) -> Phase[tuple[InstallEnd, str]]:
    """``uv pip sync`` of the snapshot: from uv's cache first (no network: a build the
    index no longer serves comes back too), then from the index."""
    offline = remote.sync_lock(svc, env.lock, offline=True)
    verdict, why = yield from run_install(
        svc,
        Step.ROLLBACK,
        offline,
        before,
        "rollback from uv's cache",
        f"restored the snapshot from uv's cache ({env.lock})",
        None,
    )
    if verdict != "failed":
        return verdict, why
    online = remote.sync_lock(svc, env.lock, offline=False, index_url=plan.index_url)
    return (
        yield from run_install(
            svc,
            Step.ROLLBACK,
            online,
            before,
            "rollback from the index",
            f"restored the snapshot from the index ({env.lock})",
            remote.index_input(plan.index_url),
        )
    )


def rollback_command(svc: ServiceSettings, lock: str) -> str:
    """What an operator types to restore the snapshot by hand."""
    return (
        f"{cmd(remote.unit_stop(svc))} && {cmd(remote.sync_lock(svc, lock, offline=True))}"
        f" && {cmd(remote.unit_start(svc))}"
    )


def stop_for_rollback(svc: ServiceSettings, host: str) -> Phase[tuple[str, ServiceState] | None]:
    """Stop the new version that never turned healthy and wait for its GPU memory, so
    the snapshot can be restored under a stopped service. None when stopped and free;
    else why not and how the service is (a failed stop: unknown; stopped, its GPU
    memory still held: STOPPED)."""
    argv = remote.unit_stop(svc)
    yield Emit(BeginStep(Step.ROLLBACK_STOP, f"{cmd(argv)}; poll GPU memory until released"))
    r = yield from run(Step.ROLLBACK_STOP, argv, svc.stop_timeout_s)
    if not r.ok:
        msg = failed_msg("systemctl stop", r, svc.stop_timeout_s)
        yield Emit(EndStep(Step.ROLLBACK_STOP, False, msg, r.exit_status))
        return msg, ServiceState.UNKNOWN
    start = (yield from pause(0.0)).now
    why = "no answer yet"
    while (yield from pause(0.0)).now - start < svc.drain_timeout_s:
        try:
            _, verdict = yield from drain_poll(svc, host)
        except GpuQueryError as e:
            why = e.reason
        else:
            if verdict.drained:
                yield Emit(
                    EndStep(Step.ROLLBACK_STOP, True, f"{svc.unit} stopped, GPU memory released")
                )
                return None
            why = verdict.describe()
        yield Sleep(svc.drain_poll_s)
    msg = f"GPU memory still held {svc.drain_timeout_s:g}s after the stop: {why}"
    yield Emit(EndStep(Step.ROLLBACK_STOP, False, msg))
    return msg, ServiceState.STOPPED


def unhealthy(
    plan: Plan, svc: ServiceSettings, host: str, before: str | None, err: StartFailed, env: Env
) -> Flow:
    """The new version started but never turned healthy: roll back (``rollback_on_unhealthy``,
    the default) or stop there with the exact command to roll back."""
    if not svc.rollback_on_unhealthy:
        state, left = yield from left_as(svc, Step.HEALTH, err)
        return HostOutcome(
            HostStatus.FAILED,
            f"{err.reason}. {plan.spec} is installed and not "
            "healthy; rollback_on_unhealthy is off, so nothing was rolled "
            f"back. {left} Roll back with: "
            f"`{rollback_command(svc, env.lock)}`",
            state,
            before,
            None,
        )
    stop_failed = yield from stop_for_rollback(svc, host)
    if stop_failed is not None:
        stopped, state = stop_failed
        return HostOutcome(
            HostStatus.FAILED,
            f"{err.reason}; stopping it to roll back failed: "
            f"{stopped}. Nothing was rolled back. Roll back with: "
            f"`{rollback_command(svc, env.lock)}`",
            state,
            before,
            None,
        )
    return (yield from rollback(plan, svc, host, before, err.reason, env))


def _postcheck_restored(
    svc: ServiceSettings, host: str, env: Env
) -> Phase[tuple[str | None, str | None]]:
    """The post-check after a rollback: the version, the GPUs, and whether the freeze is
    the snapshot again. Returns (version, how it differs from the snapshot or None)."""
    yield Emit(
        BeginStep(
            Step.POSTCHECK,
            f"{cmd(remote.freeze(svc))}; "
            f"{cmd(remote.package_show(svc))}; {cmd(remote.gpu_query())}",
        )
    )
    diff = yield from record_change(svc, env, EnvKind.RESTORED)
    after = yield from read_installed(Step.POSTCHECK, svc)
    if diff is None:
        differs: str | None = (
            "the environment cannot be read, so it is not known to be the snapshot"
        )
    elif diff.changes:
        differs = f"the environment DIFFERS from the snapshot: {diff.headline()}"
    else:
        differs = None
    env_text = differs or f"environment equals the snapshot ({env.freeze.count} packages)"
    try:
        snap = yield from read_snapshot(Step.POSTCHECK, svc, host)
    except GpuQueryError as e:
        gpus = f"GPU table unavailable: {e.reason}"
    else:
        yield Emit(Snapshot("after restart", snap))
        gpus = memory_summary(snap)
    yield Emit(
        EndStep(
            Step.POSTCHECK, differs is None, f"version {version_text(after)}; {env_text}; {gpus}"
        )
    )
    return after, differs


def rollback(
    plan: Plan, svc: ServiceSettings, host: str, before: str | None, cause: str, env: Env
) -> Flow:
    """Restore the whole environment snapshot (every package at its version), start it,
    health-gate it, and check that the freeze is the snapshot again."""
    verdict, why = yield from _restore(plan, svc, before, env)
    by_hand = f"`{cmd(remote.sync_lock(svc, env.lock, offline=True))}`"
    if verdict == "unknown":
        stopped = ServiceState.STOPPED
        return HostOutcome(
            HostStatus.FAILED,
            f"{cause}; {why}. Which packages are installed is unknown, and "
            f"{service_is(stopped, mid=True)}. {status_hint(plan.service)} once the host "
            f"answers; restore the snapshot with {by_hand}.",
            stopped,
            before,
            None,
        )
    if verdict == "failed":
        stopped = ServiceState.STOPPED
        return HostOutcome(
            HostStatus.FAILED,
            f"{cause}; {why}. {service_is(stopped)}; restore the snapshot with {by_hand}.",
            stopped,
            before,
            None,
        )
    err = yield from start_and_gate(svc, Step.ROLLBACK_START, Step.ROLLBACK_HEALTH)
    if err is not None:
        state, left = yield from left_as(svc, Step.ROLLBACK_HEALTH, err)
        return HostOutcome(
            HostStatus.FAILED,
            f"{cause}; rolled back to {version_text(before)} but {err.reason}. {left}",
            state,
            before,
            None,
        )
    after, differs = yield from _postcheck_restored(svc, host, env)
    if differs is not None:
        return HostOutcome(
            HostStatus.FAILED,
            f"{cause}; rolled back and healthy on {version_text(after)}, but {differs}",
            ServiceState.UP,
            before,
            after,
        )
    return HostOutcome(
        HostStatus.ROLLED_BACK,
        f"{cause}; rolled back to {version_text(after)} (the whole "
        f"environment, {env.freeze.count} packages, as before), healthy",
        ServiceState.UP,
        before,
        after,
    )
