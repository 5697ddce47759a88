"""The flows that change nothing on the host: status, and the preview of a redeploy
read at the request."""

from __future__ import annotations

from bot.core import remote
from bot.core.gpu import memory_summary
from bot.core.packages import EnvKind, parse_freeze, parse_install_changes, planned_diff
from bot.core.phases.actions import (
    BeginStep,
    Emit,
    EndStep,
    Flow,
    HostOutcome,
    Packages,
    Phase,
    Snapshot,
    Versions,
    http,
    run,
)
from bot.core.phases.common import (
    HEALTH_REQUEST_TIMEOUT_S,
    explain,
    http_why,
    read_installed,
    read_snapshot,
    read_state,
    reason_of,
    tail_of,
    unit_state,
)
from bot.core.phases.stop import read_load
from bot.core.plan import Plan, Step, cmd
from bot.core.readiness import api_base, model_ids
from bot.core.service_state import ServiceState
from bot.core.status import HostStatus
from bot.core.versions import version_text
from bot.errors import GpuQueryError
from bot.settings import ServiceSettings


def _serving(svc: ServiceSettings, props: dict[str, str]) -> Phase[str]:
    """For status: the model(s) served and the load, from the API (when the unit runs)."""
    if props.get("ActiveState") != "active":
        return "API: unit not active"
    url = f"{api_base(svc)}/v1/models"
    h = yield from http(url, HEALTH_REQUEST_TIMEOUT_S)
    ids = model_ids(h.body) if h.ok else None
    models = (
        f"serving {', '.join(ids) or 'no model'}"
        if ids is not None
        else f"models unknown ({http_why(h) if not h.ok else 'not a model list'})"
    )
    load, why = yield from read_load(svc)
    return f"{models}; {load.describe() if load is not None else f'load unknown: {why}'}"


def preview_flow(plan: Plan, svc: ServiceSettings, host: str) -> Flow:
    """What a redeploy would change, read when it is requested (before anyone approves):
    the freeze and the install's dry run, compared. Changes nothing on the host; the
    change is emitted as a ``Packages(PREVIEW)`` notice, and the outcome says why not
    when it cannot be read."""
    frozen = yield from run(Step.PREFLIGHT, remote.freeze(svc), svc.command_timeout_s, quiet=True)
    if not frozen.ok:
        return HostOutcome(
            HostStatus.FAILED,
            f"cannot read the environment (`{cmd(remote.freeze(svc))}`: {explain(frozen)})",
            _NOT_READ,
        )
    dry = yield from run(
        Step.PREFLIGHT,
        remote.install_dry_run(svc, plan.spec, plan.index_url),
        svc.install_timeout_s,
        quiet=True,
        stdin=remote.index_input(plan.index_url),
    )
    if not dry.ok:
        return HostOutcome(
            HostStatus.FAILED,
            f"install dry run failed ({reason_of(dry)}): {tail_of(dry.output, 3)}",
            _NOT_READ,
        )
    diff = planned_diff(parse_freeze(frozen.stdout), parse_install_changes(dry.output))
    yield Emit(Packages(EnvKind.PREVIEW, diff))
    return HostOutcome(HostStatus.SUCCEEDED, diff.headline(), _NOT_READ)


# The preview reads the environment, not the unit: how the service is, it does not say.
_NOT_READ = ServiceState.UNKNOWN


def status_flow(plan: Plan, svc: ServiceSettings, host: str) -> Flow:
    """Unit state, installed version and the GPU table; changes nothing."""
    yield Emit(BeginStep(Step.STATUS, plan.steps[0].command))
    r, props = yield from unit_state(Step.STATUS, svc)
    version = yield from read_installed(Step.STATUS, svc)
    yield Emit(Versions(version, None))
    state = (
        (
            f"{props.get('ActiveState', '?')} ({props.get('SubState', '?')}), "
            f"MainPID {props.get('MainPID', '?')}"
        )
        if r.ok
        else f"unknown ({reason_of(r)})"
    )
    api = yield from _serving(svc, props)
    left = read_state(r, props)
    try:
        snap = yield from read_snapshot(Step.STATUS, svc, host)
    except GpuQueryError as e:
        summary = (
            f"{svc.unit}: {state}; {svc.package} {version_text(version)}; {api}; GPUs: {e.reason}"
        )
        yield Emit(EndStep(Step.STATUS, False, summary, e.exit_status))
        return HostOutcome(HostStatus.FAILED, summary, left, version, version)
    yield Emit(Snapshot("now", snap))
    summary = (
        f"{svc.unit}: {state}; {svc.package} {version_text(version)}; {api}; "
        f"{memory_summary(snap, 'GPU memory')}"
    )
    yield Emit(EndStep(Step.STATUS, True, summary))
    return HostOutcome(HostStatus.SUCCEEDED, summary, left, version, version)
