"""The GPU check before the stop, the same reads for the approval card
(``gpu_health_flow``), and the re-check after a run (issue 12)."""

from __future__ import annotations

from dataclasses import replace

from bot.core.gpu import DriverWarning, Gpu, select_gpus
from bot.core.health import (
    HEALTH_QUERY_ARGV,
    GpuCheck,
    GpuStateRead,
    HostHealth,
    Level,
    details,
    health_reads,
    judge,
    new_xids,
)
from bot.core.phases.actions import (
    BeginStep,
    Emit,
    EndStep,
    Flow,
    Health,
    HostOutcome,
    Phase,
    RunCommand,
    read_gpu_state,
    run,
)
from bot.core.phases.common import HostLost, read_snapshot
from bot.core.plan import Step, gpu_check_command, gpu_recheck_command
from bot.core.privilege import run_as_of
from bot.core.results import CommandResult
from bot.core.service_state import ServiceState
from bot.core.status import HostStatus
from bot.errors import GpuQueryError
from bot.settings import ServiceSettings


def read_health(
    step: Step,
    svc: ServiceSettings,
    host: str,
    gpus: tuple[Gpu, ...],
    warnings: tuple[DriverWarning, ...] = (),
) -> Phase[tuple[HostHealth, GpuStateRead]]:
    """The GPUs' state (NVML or ``nvidia-smi -q``, as the executor can) and the kernel's
    Xid lines, judged per GPU (bot.core.health): the same verdict whichever source.
    ``warnings``: what the GPU query warned about (a corrupted infoROM)."""
    fallback = RunCommand(
        step, HEALTH_QUERY_ARGV, svc.command_timeout_s, True, run_as=run_as_of(HEALTH_QUERY_ARGV)
    )
    state = yield from read_gpu_state(fallback)
    readings, notes = state.judged(host)
    reads = health_reads(host, gpus, readings, notes, warnings)
    result: CommandResult | None = None
    try:
        while True:
            argv = reads.send(result)  # type: ignore[arg-type]  # None only to start it
            result = yield from run(step, argv, svc.command_timeout_s, quiet=True)
    except StopIteration as stop:
        health: HostHealth = stop.value
        return health, state


def _read_gpu_check(svc: ServiceSettings, host: str) -> Phase[GpuCheck]:
    """The GPU check's reads and verdict, without its step: the host lists every GPU the
    service needs, and none of them is critical. Read-only; the run's check before the
    stop and the approval card's read at the request (``gpu_health_flow``) share it, so
    both judge alike."""
    listed: tuple[Gpu, ...] = ()
    warnings: tuple[DriverWarning, ...] = ()
    failure: str | None = None
    try:
        snap = yield from read_snapshot(Step.GPU_CHECK, svc, host)
        listed, warnings = snap.gpus, snap.warnings
    except HostLost as e:
        return GpuCheck(f"cannot reach {host} to check its GPUs ({e.reason})")
    except GpuQueryError as e:
        failure = f"cannot read the GPUs: {e.reason}"
    selection = select_gpus(listed, svc.gpus)
    scope = selection.uuids if svc.gpus is not None else None
    health, state = yield from read_health(Step.GPU_CHECK, svc, host, listed, warnings)
    critical = health.problems(Level.CRITICAL, scope)
    listing = failure or selection.refusal(host, listed)
    reasons = [listing] if listing else []
    if critical:
        reasons.append(f"not fit to run on: {'; '.join(critical)}")
    return GpuCheck(
        "; ".join(reasons) or None, health, scope, selection.wanted, listing, state.said()
    )


def gpu_check(svc: ServiceSettings, host: str, local: bool) -> Phase[GpuCheck]:
    """Before anything changes: the host lists every GPU the service needs (a host with
    none, or fewer, is never drained) and none of them is critical (ECC, row remap,
    recovery action, Xid errors); warnings go on the card. Refusing leaves the service
    untouched. ``local``: the bot runs on the host, so NVML reads the GPUs' state."""
    yield Emit(BeginStep(Step.GPU_CHECK, gpu_check_command(svc, local)))
    check = yield from _read_gpu_check(svc, host)
    # The verdict as a notice too: the sinks that keep each GPU's state (the metrics) hear
    # it from every run; the card and the terminal show the step instead.
    yield Emit(Health(check))
    health, scope = check.health, check.scope
    if health is None:
        yield Emit(EndStep(Step.GPU_CHECK, False, check.refusal or "not reached"))
        return check
    # The output always says what the state was read with; the findings when any.
    evidence = f"{check.read_with}\n{details(health, scope)}"
    if check.refusal is not None:
        yield Emit(EndStep(Step.GPU_CHECK, False, check.refusal, None, evidence))
        return check
    warned = bool(health.problems(Level.WARN, scope))
    yield Emit(
        EndStep(
            Step.GPU_CHECK,
            True,
            f"{check.wanted} listed; {health.summary(scope)}",
            None,
            evidence if warned else check.read_with,
        )
    )
    return check


def gpu_health_flow(svc: ServiceSettings, host: str) -> Flow:
    """The service's GPUs' health read when a run is requested (before anyone approves),
    for the approval card: the GPU check's own reads and verdict, without its step.
    Changes nothing on the host; the verdict is emitted as a ``Health`` notice."""
    check = yield from _read_gpu_check(svc, host)
    yield Emit(Health(check))
    # It reads the GPUs, not the unit: how the service is, it does not say.
    if check.health is None:
        return HostOutcome(HostStatus.FAILED, check.refusal or "not reached", ServiceState.UNKNOWN)
    return HostOutcome(
        HostStatus.SUCCEEDED,
        check.refusal or check.health.summary(check.scope),
        ServiceState.UNKNOWN,
    )


def gpu_recheck(
    svc: ServiceSettings, host: str, check: GpuCheck, outcome: HostOutcome, local: bool
) -> Flow:
    """After a run that left the service up: the GPU check again, and the Xid errors
    that appeared during the run. They do not undo the run (the service passed its
    gates); they are named in its summary, with NVIDIA's action."""
    if check.health is None or outcome.status not in (HostStatus.SUCCEEDED, HostStatus.ROLLED_BACK):
        return outcome
    yield Emit(BeginStep(Step.GPU_RECHECK, gpu_recheck_command(local)))
    warnings: tuple[DriverWarning, ...] = ()
    try:
        snap = yield from read_snapshot(Step.GPU_RECHECK, svc, host)
        gpus, warnings = snap.gpus, snap.warnings
    except GpuQueryError:
        gpus = ()
    health, state = yield from read_health(Step.GPU_RECHECK, svc, host, gpus, warnings)
    new = new_xids(check.health.xids, health.xids)
    critical = health.problems(Level.CRITICAL, check.scope)
    if not new and not critical:
        yield Emit(
            EndStep(
                Step.GPU_RECHECK,
                True,
                f"no new Xid error during the run; {health.summary(check.scope)}",
                None,
                state.said(),
            )
        )
        return outcome
    judged = judge(host, gpus, health.readings, new)
    news = judged.problems(Level.CRITICAL) + judged.problems(Level.WARN)
    said = (
        f"{len(new)} NEW Xid error(s) during the run: {'; '.join(news)}"
        if new
        else "no new Xid error"
    )
    said += f"; CRITICAL now: {'; '.join(critical)}" if critical else ""
    yield Emit(
        EndStep(
            Step.GPU_RECHECK, False, said, None, f"{state.said()}\n{details(health, check.scope)}"
        )
    )
    # The service stays as the run left it (it passed its gates); only the summary grows.
    return replace(outcome, summary=f"{outcome.summary}; {said}")
