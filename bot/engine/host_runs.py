"""What the engine does differently for a host's maintenance (issue 23): which flow drives
a run's host, and the plan rebuilt from a record of either kind. Kept beside the engine
so ``Engine`` stays one thing: planning and executing any run."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bot.audit.store import RunRecord
from bot.core.become import Become, become_for
from bot.core.flows import FLOWS, Flow
from bot.core.host_flow import host_flow
from bot.core.host_plan import OPERATIONS, gpu_indexes, host_of, host_service, make_host_plan
from bot.core.plan import STEP_TITLES, Plan
from bot.core.status import Action
from bot.engine.executor import Reach
from bot.errors import HostError, InputError
from bot.hosts.base import HostTransport
from bot.hosts.known_hosts import host_keys
from bot.hosts.pool import HostPool
from bot.settings import Settings


def flow_of(settings: Settings, plan: Plan) -> Callable[[str], Flow]:
    """The flow of ``plan`` for one of its hosts."""
    if plan.action.host_wide:
        services = {p.service: settings.services[p.service] for p in plan.parts}
        return lambda host: host_flow(plan, services, settings.maintenance, host)
    flow, svc = FLOWS[plan.action], settings.services[plan.service]
    return lambda host: flow(plan, svc, host)


def keys_of(settings: Settings, service: str) -> dict[str, str]:
    """The known host keys of a run's hosts: a service's, or a host run's one host."""
    host = host_of(service)
    if host is not None:
        return host_keys(settings, [host]) if host in settings.hosts else {}
    svc = settings.services.get(service)
    return host_keys(settings, svc.hosts) if svc is not None else {}


def host_plan_of(settings: Settings, record: RunRecord) -> Plan:
    """A host run's plan rebuilt from the current config (as ``Engine.plan_of``)."""
    host = host_of(record.service) or ""
    gpus = tuple(int(i) for i in record.plan.get("gpus") or ())
    return make_host_plan(
        settings,
        Action(record.action),
        host,
        gpus=gpus,
        host_keys=keys_of(settings, record.service),
        force=bool(record.plan.get("force")),
    )


def reached(plan: Plan) -> set[str]:
    """The hosts a run's actions may name besides its own: every router's host and
    replicas, of the plan and of each of its parts."""
    out: set[str] = set()
    for p in (plan, *plan.parts):
        if p.router is not None:
            out |= {p.router.host, *p.hosts, *(h for h, _ in p.router.servers)}
    return out


def plan_host(
    settings: Settings,
    action: Action,
    host: str,
    gpus: tuple[int, ...] = (),
    force: bool = False,
) -> Plan:
    """A host run's plan for a request, with the host's key as known_hosts holds it now."""
    keys = keys_of(settings, host_service(host))
    return make_host_plan(settings, action, host, gpus=gpus, host_keys=keys, force=force)


def plan_of_words(
    settings: Settings, operation: str, host: str, gpus: Sequence[int], force: bool = False
) -> Plan:
    """The terminal's ``host OPERATION HOST [GPU ...]``, checked as the chat's is."""
    action = OPERATIONS.get(operation)
    if action is None:
        raise InputError(f"`{operation[:32]}` is not a host operation: reboot or gpu-reset")
    if action == Action.REBOOT and gpus:
        raise InputError("a reboot takes no GPU indexes: it reboots the whole host")
    return plan_host(settings, action, host, gpu_indexes([str(g) for g in gpus]), force)


def describe_host_plan(plan: Plan) -> str:
    """A host run's plan as the terminal prints it before asking to confirm."""
    t = plan.targets[0] if plan.targets else None
    lines = [
        f"{plan.action} of host {plan.hosts[0]}"
        + (f" ({t.endpoint}, host key {t.host_key})" if t is not None else ""),
        "services stopped, then started again if they ran and the host passes its deep check: "
        + ", ".join(f"{p.service} (unit {p.unit})" for p in plan.parts),
    ]
    if plan.action == Action.GPU_RESET:
        lines.append(f"GPUs: {', '.join(map(str, plan.gpus)) or 'every GPU the host lists'}")
    lines += [f"  {i}. {STEP_TITLES[s.step]}: {s.command}" for i, s in enumerate(plan.steps, 1)]
    return "\n".join(lines)


def reach_of(settings: Settings, pool: HostPool, plan: Plan) -> Reach | None:
    """The other hosts a run's actions may name (``on``): its router's host and its
    service's hosts (a sibling's readiness), each with its own ``become``; a plan
    without a router names none."""
    # Every replica behind the router, not only the plan's: a drain of one host asks
    # its siblings whether they serve.
    allowed = reached(plan)
    if not allowed:
        return None

    def reach(host: str) -> tuple[HostTransport, Become | None]:
        if host not in allowed:
            raise HostError(host, f"not a host of run {plan.service}'s plan")
        return pool.get(host), become_for(settings, host, plan.service)

    return reach
