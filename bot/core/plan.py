"""What a run will do, decided before anything is touched: pure, shown on the approval card."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from packaging.version import InvalidVersion, Version

from bot.core import remote
from bot.core.status import Action
from bot.errors import InputError
from bot.settings import ServiceSettings, Settings

# Approval decisions the bot records itself carry this prefix: dry runs and status queries change
# nothing and need nobody's approval, and the audit log must not credit a person with one.
SYSTEM_PREFIX = "system:"
DRY_RUN_APPROVER = f"{SYSTEM_PREFIX}dry-run"
READ_ONLY_APPROVER = f"{SYSTEM_PREFIX}read-only"


class Step(StrEnum):
    PREFLIGHT = "preflight"
    STOP = "stop"
    DRAIN = "drain"
    REINSTALL = "reinstall"
    START = "start"
    HEALTH = "health"
    POSTCHECK = "postcheck"
    ROLLBACK = "rollback"
    ROLLBACK_START = "rollback_start"
    ROLLBACK_HEALTH = "rollback_health"
    STATUS = "status"


STEP_TITLES: dict[Step, str] = {
    Step.PREFLIGHT: "Preflight (unit, version, disk, install dry run)",
    Step.STOP: "Stop service",
    Step.DRAIN: "Verify GPU memory drained",
    Step.REINSTALL: "Reinstall package",
    Step.START: "Start service",
    Step.HEALTH: "Health gate",
    Step.POSTCHECK: "Post-check (version, GPUs)",
    Step.ROLLBACK: "Rollback: reinstall previous version",
    Step.ROLLBACK_START: "Rollback: start service",
    Step.ROLLBACK_HEALTH: "Rollback: health gate",
    Step.STATUS: "Status",
}


@dataclass(frozen=True, slots=True)
class PlannedStep:
    step: Step
    command: str  # what an operator would type, shown on the card and in the audit log


@dataclass(frozen=True, slots=True)
class Plan:
    action: Action
    service: str
    hosts: tuple[str, ...]
    unit: str
    package: str
    version: str | None
    spec: str
    index_name: str | None
    index_url: str | None
    steps: tuple[PlannedStep, ...]
    dry_run: bool = False
    batch_size: int = 1

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["hosts"] = list(self.hosts)
        d["steps"] = [{"step": str(s.step), "command": s.command} for s in self.steps]
        return d

    @property
    def system_approver(self) -> str | None:
        """Who approves a run that changes nothing, or None when people must."""
        if self.action == Action.STATUS:
            return READ_ONLY_APPROVER
        return DRY_RUN_APPROVER if self.dry_run else None

    def batches(self) -> list[tuple[str, ...]]:
        n = self.batch_size
        return [self.hosts[i:i + n] for i in range(0, len(self.hosts), n)]


def canonical_version(text: str) -> str:
    """A PEP 440 version in canonical form, or InputError."""
    try:
        v = Version(text)
    except InvalidVersion:
        raise InputError(
            f"`{text[:80]}` is not a PEP 440 version (e.g. 0.16.0 or 0.16.0rc2.dev313+g662205d34)"
        ) from None
    return str(v)


def cmd(argv: tuple[str, ...]) -> str:
    """What an operator would type: the argv, quoted (shared with bot.core.flows); an
    index URL is never part of it (``remote.shown``)."""
    return remote.shown(argv)


def redeploy_steps(svc: ServiceSettings, spec: str, index_url: str | None
                   ) -> tuple[PlannedStep, ...]:
    return (
        PlannedStep(Step.PREFLIGHT, "; ".join(cmd(a) for a in (
            remote.unit_show(svc), remote.package_show(svc), remote.free_disk(svc),
            remote.install_dry_run(svc, spec, index_url)))),
        PlannedStep(Step.STOP, cmd(remote.unit_stop(svc))),
        PlannedStep(Step.DRAIN, f"poll every {svc.drain_poll_s:g}s up to {svc.drain_timeout_s:g}s: "
                    f"{cmd(remote.gpu_query())}; {cmd(remote.apps_query())}; "
                    f"{cmd(remote.workers_query())}"),
        PlannedStep(Step.REINSTALL, cmd(remote.install(svc, spec, index_url))),
        PlannedStep(Step.START, cmd(remote.unit_start(svc))),
        PlannedStep(Step.HEALTH, f"up to {svc.start_timeout_s:g}s: "
                    f"{cmd(remote.unit_is_active(svc))}; GET {svc.health_url} (through SSH) "
                    "until 200"),
        PlannedStep(Step.POSTCHECK,
                    f"{cmd(remote.package_show(svc))}; {cmd(remote.gpu_query())}"),
    )


def restart_steps(svc: ServiceSettings) -> tuple[PlannedStep, ...]:
    full = redeploy_steps(svc, svc.package, None)
    keep = {Step.STOP, Step.DRAIN, Step.START, Step.HEALTH, Step.POSTCHECK}
    return (PlannedStep(Step.PREFLIGHT, cmd(remote.unit_show(svc))),
            *(s for s in full if s.step in keep))


def make_plan(
    settings: Settings,
    action: Action,
    service: str,
    *,
    version: str | None = None,
    index: str | None = None,
    dry_run: bool = False,
    batch: int | None = None,
) -> Plan:
    """Build the plan from config and validated input; raise InputError for anything else."""
    if service not in settings.services:
        known = ", ".join(sorted(settings.services)) or "none configured"
        raise InputError(f"unknown service `{service[:64]}`; configured services: {known}")
    svc = settings.services[service]
    action = Action(action)  # the enum even when a caller passed its plain word
    if action != Action.REDEPLOY and (version is not None or index is not None):
        raise InputError("--version and --index only apply to redeploy")
    version = None if version is None else canonical_version(version)
    index_url: str | None = None
    if index is not None:
        if index not in svc.indexes:
            names = ", ".join(sorted(svc.indexes)) or "none configured"
            raise InputError(f"unknown index `{index[:64]}` for {service}; configured: {names}")
        index_url = svc.indexes[index]
    spec = remote.package_spec(svc, version)
    if batch is not None and batch < 1:
        raise InputError("--batch must be at least 1")
    if action == Action.REDEPLOY:
        steps = redeploy_steps(svc, spec, index_url)
    elif action == Action.RESTART:
        steps = restart_steps(svc)
    else:
        steps = (PlannedStep(Step.STATUS, f"{cmd(remote.unit_show(svc))}; "
                             f"{cmd(remote.package_show(svc))}; {cmd(remote.gpu_query())}"),)
    return Plan(
        action=action, service=service, hosts=tuple(svc.hosts), unit=svc.unit,
        package=svc.package, version=version, spec=spec, index_name=index,
        index_url=index_url, steps=steps, dry_run=dry_run,
        batch_size=batch if batch is not None else svc.max_unavailable,
    )
