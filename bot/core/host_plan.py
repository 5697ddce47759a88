"""The plan of a host's maintenance (issue 23: ``host reboot``, ``host gpu-reset``): pure,
shown on the approval card like any plan.

A host run names one host and every service the config puts on it. Each service is a
*part*: its own restart plan, narrowed to this host, so its unit, router, request drain
and start are what a restart of it would do, and a change to any of them after the
approval is a changed plan the engine refuses (``Plan.to_json`` holds the parts).
The run's ``service`` is ``host:<name>``: the audit log answers "who rebooted gpu-01"
with ``audit --service host:gpu-01``, and the run holds each service's lock and the
host's (``lock_scopes``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from bot.core import host_ops, remote
from bot.core.deep_query import DCGMI_DIAG_ARGV, DEEP_QUERY_ARGV
from bot.core.plan import Plan, PlannedStep, Step, cmd, host_targets, make_plan
from bot.core.status import Action
from bot.errors import InputError
from bot.settings import HOST_PREFIX as SETTINGS_HOST_PREFIX
from bot.settings import Settings, maintenance_path_problem

# The run's service word for a host: "host:gpu-01" (the settings judge its policy by it).
HOST_PREFIX = SETTINGS_HOST_PREFIX
MAX_GPU_INDEX = 63
# The words of ``host <operation>``, in both front ends.
OPERATIONS = {"reboot": Action.REBOOT, "gpu-reset": Action.GPU_RESET}

_BEFORE = (Step.ROTATION_OUT, Step.REQUESTS, Step.STOP, Step.DRAIN)
_AFTER = (Step.START, Step.HEALTH, Step.READINESS, Step.ROTATION_IN)


def host_service(host: str) -> str:
    return f"{HOST_PREFIX}{host}"


def host_of(service: str) -> str | None:
    """The host a host run's service word names; None for a service's run."""
    return service[len(HOST_PREFIX) :] if service.startswith(HOST_PREFIX) else None


def services_on(settings: Settings, host: str) -> list[str]:
    """The services the config runs on ``host``, in the config's order."""
    return [name for name, svc in settings.services.items() if host in svc.hosts]


def gpu_indexes(words: Sequence[str]) -> tuple[int, ...]:
    """GPU indexes as typed (``0 3`` or ``0,3``): digits only, each at most once."""
    out: list[int] = []
    for word in (w for part in words for w in part.split(",") if w):
        if not word.isdigit() or int(word) > MAX_GPU_INDEX:
            raise InputError(f"'{word[:16]}' is not a GPU index (0 to {MAX_GPU_INDEX})")
        if int(word) in out:
            raise InputError(f"GPU {int(word)} is named twice")
        out.append(int(word))
    return tuple(sorted(out))


def make_host_plan(
    settings: Settings,
    action: Action,
    host: str,
    *,
    gpus: Sequence[int] = (),
    host_keys: Mapping[str, str] | None = None,
    force: bool = False,
) -> Plan:
    """The plan of ``action`` (reboot or gpu_reset) on ``host``; InputError for a host
    not configured or carrying no service, or GPUs named for a reboot."""
    action = Action(action)
    names = _checked(settings, action, host, gpus)
    keys = host_keys or {}
    parts = tuple(
        replace(
            make_plan(settings, Action.RESTART, name, host_keys=keys, force=force),
            hosts=(host,),
            targets=host_targets(settings, (host,), keys),
            batch_size=1,
        )
        for name in names
    )
    m = settings.maintenance
    steps = [
        PlannedStep(
            Step.PREFLIGHT,
            f"{cmd(host_ops.BOOT_ID_ARGV)}; {cmd(remote.gpu_query())}; "
            + "; ".join(f"{cmd(remote.unit_show(settings.services[p.service]))}" for p in parts),
        ),
        *_each(parts, _BEFORE, "if it runs"),
        _maintenance_step(settings, action, tuple(gpus)),
        PlannedStep(
            Step.DEEP_CHECK,
            f"{cmd(DEEP_QUERY_ARGV)}; {cmd(DCGMI_DIAG_ARGV)} where dcgmi exists; the GPU "
            "health check; the GPU count against the count before; where a GPU's NVSwitch "
            f"fabric is still registering, {cmd(DEEP_QUERY_ARGV)} again every "
            f"{m.reboot_poll_s:g}s for up to {m.fabric_wait_s:g}s, then a GPU still "
            "registering fails; a FAIL "
            + (
                "keeps the services stopped"
                if m.on_failed_check == "stop"
                else "starts them again, out of rotation"
            ),
        ),
        *_each(parts, _AFTER, "if it ran before"),
    ]
    first = parts[0]
    return Plan(
        action=action,
        service=host_service(host),
        hosts=(host,),
        unit="",
        package="",
        version=None,
        spec="",
        index_name=None,
        index_url=None,
        steps=tuple(steps),
        targets=first.targets,
        parts=parts,
        gpus=tuple(gpus),
        force=force,
    )


def _checked(settings: Settings, action: Action, host: str, gpus: Sequence[int]) -> list[str]:
    """The services on ``host``, or InputError for what the config does not allow."""
    if not action.host_wide:
        raise InputError(f"{action} is not a host maintenance")
    if host not in settings.hosts:
        known = ", ".join(sorted(settings.hosts)) or "none configured"
        raise InputError(f"unknown host `{host[:64]}`; configured hosts: {known}")
    names = services_on(settings, host)
    if not names:
        raise InputError(
            f"{host} carries no configured service: host maintenance drains and restarts "
            "the services of a GPU host, and this one has none"
        )
    if (why := maintenance_path_problem(settings, host)) is not None:
        raise InputError(why)
    if (why := settings.host_policy(host)[1]) is not None:
        raise InputError(why)
    routing = sorted(n for n, r in settings.routers.items() if r.host == host)
    if routing:
        raise InputError(
            f"{host} is the host of router {', '.join(routing)}: rebooting or resetting it "
            "takes routing down for every replica behind it, which taking this host's "
            "replica out of rotation cannot cover; move the router, or maintain the host by "
            "hand"
        )
    if gpus and action != Action.GPU_RESET:
        raise InputError("GPU indexes only apply to gpu-reset")
    return names


def _each(parts: Sequence[Plan], which: Sequence[Step], when: str) -> list[PlannedStep]:
    """The parts' own steps of ``which``, each named by its service."""
    return [
        PlannedStep(s.step, f"{p.service} ({when}): {s.command}")
        for p in parts
        for s in p.steps
        if s.step in which
    ]


def _maintenance_step(settings: Settings, action: Action, gpus: tuple[int, ...]) -> PlannedStep:
    m = settings.maintenance
    if action == Action.REBOOT:
        return PlannedStep(
            Step.REBOOT,
            f"{cmd(host_ops.reboot_argv(m))}; then {cmd(host_ops.BOOT_ID_ARGV)} every "
            f"{m.reboot_poll_s:g}s until a new boot id, up to {m.reboot_timeout_s:g}s, over "
            "SSH with the same host key (another key is refused as a different host)",
        )
    which = ", ".join(map(str, gpus)) if gpus else "every GPU the host lists"
    off, reset, on = (
        cmd(_any_gpu(host_ops.persistence_argv(m, 0, False))),
        cmd(_any_gpu(host_ops.reset_argv(m, 0))),
        cmd(_any_gpu(host_ops.persistence_argv(m, 0, True))),
    )
    return PlannedStep(
        Step.GPU_RESET,
        f"GPUs {which}: {off} where persistence mode is on; {reset}; {on} where it was on; "
        "a refused reset is never retried: the host needs a reboot",
    )


def _any_gpu(argv: tuple[str, ...]) -> tuple[str, ...]:
    """``argv`` as the card shows it for every GPU: ``-i N``."""
    i = argv.index("-i") + 1
    return (*argv[:i], "N", *argv[i + 1 :])
