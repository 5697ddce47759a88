"""What a run will do, decided before anything is touched: pure, shown on the approval card."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, assert_never

from packaging.version import InvalidVersion, Version

from bot.core import remote, remote_releases
from bot.core.health import HEALTH_QUERY_ARGV, XID_JOURNAL_ARGV
from bot.core.plan_steps import STEP_TITLES as STEP_TITLES
from bot.core.plan_steps import PlannedStep as PlannedStep
from bot.core.plan_steps import Step as Step
from bot.core.readiness import api_base, metrics_url
from bot.core.remote_releases import switch_shown
from bot.core.routers.target import RouterTarget, router_target
from bot.core.routers.text import rotation_in_command, rotation_out_command, shown_in, shown_out
from bot.core.status import Action
from bot.errors import InputError
from bot.settings import LOCAL, ServiceSettings, Settings

# The host key of a host whose known_hosts file has no entry for it (or cannot be read):
# bound as such, so adding the key later is a change the approvers must see too.
UNKNOWN_HOST_KEY = "unknown"
# A host the bot runs commands on directly (``address = "local"``) has no host key.
LOCAL_HOST_KEY = "none (local)"

# Approval decisions the bot records itself carry this prefix: dry runs and status queries change
# nothing and need nobody's approval, and the audit log must not credit a person with one.
SYSTEM_PREFIX = "system:"
DRY_RUN_APPROVER = f"{SYSTEM_PREFIX}dry-run"


@dataclass(frozen=True, slots=True)
class HostTarget:
    """Where one host's commands go, as approved: the approval covers this machine, not
    only its name. The engine rebuilds it from the config at execute and refuses the run
    when any of it changed (re-pointed address, port, user or key, or another host key)."""

    host: str
    address: str
    port: int
    user: str
    key_file: str | None
    # SHA256 fingerprint(s) of the host's key in the configured known_hosts file, as
    # ``ssh-keygen -lf`` prints them (comma-separated when several), or UNKNOWN_HOST_KEY.
    host_key: str

    @property
    def endpoint(self) -> str:
        """``user@address:port`` (or ``local``), as the card shows it."""
        return LOCAL if self.address == LOCAL else f"{self.user}@{self.address}:{self.port}"

    @property
    def local(self) -> bool:
        """The bot runs on this host: NVML reads its GPUs' state."""
        return self.address == LOCAL


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
    # One per host, in ``hosts`` order (empty only for plans built without config).
    targets: tuple[HostTarget, ...] = ()
    # --force: stop without waiting for in-flight requests (the card says how many).
    force: bool = False
    # Issue 19: the router each replica is taken out of before its stop, as approved.
    router: RouterTarget | None = None
    # Issue 23, a host-wide run (``Action.host_wide``): each service on the host as its
    # own restart plan of that host (its unit, router, drain and start, as approved), and
    # the GPUs a reset names (empty: every GPU the host lists).
    parts: tuple[Plan, ...] = ()
    gpus: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["hosts"] = list(self.hosts)
        d["steps"] = [{"step": str(s.step), "command": s.command} for s in self.steps]
        d["targets"] = [asdict(t) for t in self.targets]
        if not self.force:
            del d["force"]  # so plans stored before --force existed still compare equal
        if self.router is None:
            del d["router"]  # likewise for plans of services without a router
        elif self.router.policy is None:
            del d["router"]["policy"]  # and for routers stored before it was a setting
        if self.parts:
            d["parts"] = [p.to_json() for p in self.parts]
        else:
            del d["parts"]  # and for every run that is not a host's maintenance
        if self.gpus:
            d["gpus"] = list(self.gpus)
        else:
            del d["gpus"]
        return d

    def is_local(self, host: str) -> bool:
        """Whether the bot runs on ``host`` (``address = "local"``), as approved."""
        return any(t.host == host and t.local for t in self.targets)

    @property
    def system_approver(self) -> str | None:
        """Who approves a run that changes nothing (a dry run), or None when people must.
        A read (status, rotation) is no run at all (``bot.engine.status_query``)."""
        return DRY_RUN_APPROVER if self.dry_run else None

    def batches(self) -> list[tuple[str, ...]]:
        n = self.batch_size
        return [self.hosts[i : i + n] for i in range(0, len(self.hosts), n)]


def canonical_version(text: str) -> str:
    """A PEP 440 version in canonical form, or InputError."""
    try:
        v = Version(text)
    except InvalidVersion:
        raise InputError(
            f"`{text[:80]}` is not a PEP 440 version (e.g. 0.31.0 or 0.31.0rc2.dev313+g662205d34)"
        ) from None
    return str(v)


def cmd(argv: tuple[str, ...]) -> str:
    """What an operator would type: the argv, quoted (shared with bot.core.flows); an
    index URL is never part of it (``remote.shown``)."""
    return remote.shown(argv)


def redeploy_steps(
    svc: ServiceSettings, spec: str, index_url: str | None, local: bool | None = False
) -> tuple[PlannedStep, ...]:
    """``local``: the bot runs on the hosts (None: on some), so NVML reads their GPUs."""
    steps = _in_place_steps(svc, spec, index_url, local)
    match svc.strategy:
        case "in_place":
            return steps
        case "side_by_side":
            return _side_by_side(svc, index_url, steps)
        case _:
            assert_never(svc.strategy)


def _side_by_side(
    svc: ServiceSettings, index_url: str | None, steps: tuple[PlannedStep, ...]
) -> tuple[PlannedStep, ...]:
    """The redeploy of a side-by-side service: the build (and its gate) where the prefetch
    was, the switch where the reinstall and its gate were, the prune at the end."""
    name = "<version>-<sha of the pinned set>"
    out: list[PlannedStep] = []
    for s in steps:
        if s.step == Step.PREFETCH:
            out.append(
                PlannedStep(Step.BUILD, remote_releases.build_release_shown(svc, index_url, name))
            )
        elif s.step == Step.REINSTALL:
            out.append(
                PlannedStep(
                    Step.SWITCH,
                    f"ln -s {svc.releases_dir}/{name} {svc.venv_dir}.new.<pid> && "
                    f"mv -T {svc.venv_dir}.new.<pid> {svc.venv_dir} (no install after the "
                    "stop; any failure from here: switch back and start the previous release)",
                )
            )
        elif s.step != Step.GATE:
            out.append(s)
        if s.step == Step.POSTCHECK:
            out.append(
                PlannedStep(
                    Step.PRUNE,
                    f"{cmd(remote_releases.releases_list(svc))}; keep the newest "
                    f"{svc.keep_releases} releases, never removing the live or the previous "
                    "one",
                )
            )
    return tuple(out)


def _in_place_steps(
    svc: ServiceSettings, spec: str, index_url: str | None, local: bool | None
) -> tuple[PlannedStep, ...]:
    return (
        PlannedStep(
            Step.PREFLIGHT,
            "; ".join(
                cmd(a)
                for a in (
                    remote.unit_show(svc),
                    remote.package_show(svc),
                    remote.free_disk(svc),
                    remote.install_dry_run(svc, spec, index_url),
                    remote.freeze(svc),
                )
            )
            + f"; save the freeze as {remote.lock_path(svc, '<sha256>')}",
        ),
        PlannedStep(Step.GPU_CHECK, gpu_check_command(svc, local)),
        PlannedStep(Step.PREFETCH, remote.prefetch_shown(svc, index_url)),
        PlannedStep(Step.REQUESTS, requests_command(svc)),
        PlannedStep(Step.STOP, cmd(remote.unit_stop(svc))),
        PlannedStep(
            Step.DRAIN,
            f"poll every {svc.drain_poll_s:g}s up to {svc.drain_timeout_s:g}s: "
            f"{cmd(remote.gpu_query())}; {cmd(remote.apps_query())}; "
            f"{cmd(remote.workers_query())}",
        ),
        PlannedStep(Step.REINSTALL, cmd(remote.install(svc, spec, index_url))),
        PlannedStep(
            Step.GATE,
            f"{cmd(remote.freeze(svc))}; {cmd(remote.driver_info())}; "
            f"{shlex.quote(svc.python)} -c 'import vllm, torch' (print their versions "
            "and torch.version.cuda); any failure: restore the snapshot, start the "
            "old environment",
        ),
        PlannedStep(Step.START, cmd(remote.unit_start(svc))),
        PlannedStep(
            Step.HEALTH,
            f"up to {svc.start_timeout_s:g}s: "
            f"{cmd(remote.unit_is_active(svc))}; GET {svc.health_url} (through SSH) "
            "until 200",
        ),
        PlannedStep(Step.READINESS, readiness_command(svc)),
        *((PlannedStep(Step.WATCH, watch_command(svc)),) if svc.watch_s > 0 else ()),
        PlannedStep(Step.POSTCHECK, f"{cmd(remote.package_show(svc))}; {cmd(remote.gpu_query())}"),
        PlannedStep(
            Step.GPU_RECHECK,
            f"{gpu_recheck_command(local)}: report Xid errors that appeared during the run",
        ),
    )


def gpu_state_read(local: bool | None) -> str:
    """What the GPUs' state is read with: NVML where the bot runs on the host (``local``
    True; None: on some of the plan's hosts), ``nvidia-smi -q`` elsewhere and where NVML
    fails."""
    smi = cmd(HEALTH_QUERY_ARGV)
    if local is False:
        return smi
    nvml = f"NVML (else {smi})"
    return nvml if local else f"{nvml} on the host the bot runs on, {smi} on the others"


def gpu_check_command(svc: ServiceSettings, local: bool | None = False) -> str:
    """The GPU check before the stop (bot.core.health): the service's GPUs are listed,
    none is critical."""
    which = "all GPUs" if svc.gpus is None else "GPUs " + ", ".join(str(g) for g in svc.gpus)
    return (
        f"{cmd(remote.gpu_query())}; {cmd(remote.apps_query())}: {which} listed; "
        f"{gpu_state_read(local)}; {cmd(XID_JOURNAL_ARGV)} (else dmesg): refuse on a "
        "critical GPU"
    )


def gpu_recheck_command(local: bool | None = False) -> str:
    """The GPU check after the run (the GPU query's reads are not shown, as before)."""
    return f"{gpu_state_read(local)}; {cmd(XID_JOURNAL_ARGV)}"


def requests_command(svc: ServiceSettings) -> str:
    if svc.request_drain_timeout_s == 0:
        return f"GET {metrics_url(svc)} once (request_drain_timeout_s = 0: no wait)"
    return (
        f"GET {metrics_url(svc)} every {svc.drain_poll_s:g}s up to "
        f"{svc.request_drain_timeout_s:g}s, until no request runs or waits; a load "
        "it cannot read refuses the stop while the unit runs (--force: no wait)"
    )


def readiness_command(svc: ServiceSettings) -> str:
    base = api_base(svc)
    checks = []
    if svc.served_model:
        checks.append(f"GET {base}/v1/models lists {svc.served_model}")
    if svc.smoke_prompt:
        expect = f"matching {svc.smoke_expect!r}" if svc.smoke_expect else "non-empty"
        checks.append(
            f"POST {base}/v1/completions (temperature 0, {svc.smoke_max_tokens} "
            f"tokens) answers 200 with text {expect}"
        )
    checks.append(f"GET {base}/version equals the installed version (when offered)")
    return "; ".join(checks)


def watch_command(svc: ServiceSettings) -> str:
    """The watch window as the card, the plan and the approval state it."""
    checks = f"{cmd(remote.unit_show(svc))}; new journal lines against the known failure lines"
    checks += f"; GET {svc.health_url} is 200"
    if svc.smoke_prompt:
        checks += f"; POST {api_base(svc)}/v1/completions (the smoke prompt)"
    return (
        f"watching for {_span(svc.watch_s)} after the start, every "
        f"{_span(svc.watch_interval_s)}: {checks}; any failure rolls back"
    )


def _span(seconds: float) -> str:
    s = round(seconds)
    if s >= 60 and s % 60 == 0:
        return f"{s // 60} min"
    return f"{seconds:g}s"


def restart_steps(svc: ServiceSettings, local: bool | None = False) -> tuple[PlannedStep, ...]:
    full = redeploy_steps(svc, svc.package, None, local)
    keep = {
        Step.REQUESTS,
        Step.STOP,
        Step.DRAIN,
        Step.START,
        Step.HEALTH,
        Step.READINESS,
        Step.POSTCHECK,
        Step.GPU_CHECK,
        Step.GPU_RECHECK,
    }
    return (
        PlannedStep(Step.PREFLIGHT, cmd(remote.unit_show(svc))),
        *(s for s in full if s.step in keep),
    )


def _switch_back_steps(
    service: str, svc: ServiceSettings, local: bool | None
) -> tuple[PlannedStep, ...]:
    """A rollback by hand (side by side): a restart with the switch to the release live
    before the live one (``bot.core.releases.rollback_target``) between the drain and the
    start."""
    if svc.strategy != "side_by_side":
        raise InputError(f"rollback switches side-by-side releases; {service} is in_place")
    prev = "<the release live before the live one>"
    switch = PlannedStep(
        Step.SWITCH,
        f"{switch_shown(svc, prev)} (the last recorded switch to the live release came from "
        "it; with none, the newest release built before the live one); a failed start "
        "switches back to the release live now",
    )
    steps = restart_steps(svc, local)
    return tuple(x for s in steps for x in ((switch, s) if s.step == Step.START else (s,)))


def host_targets(
    settings: Settings, hosts: tuple[str, ...], host_keys: Mapping[str, str]
) -> tuple[HostTarget, ...]:
    """What each host name stands for in the config now. ``host_keys``: each host's key
    fingerprint(s) as read from its known_hosts file (``bot.hosts.known_hosts``);
    a host missing from it binds UNKNOWN_HOST_KEY."""
    out = []
    for name in hosts:
        cfg = settings.hosts.get(name)
        if cfg is None:
            # Settings refuse a service on an unconfigured host; bind that it was none.
            out.append(HostTarget(name, "", 0, "", None, UNKNOWN_HOST_KEY))
            continue
        key = LOCAL_HOST_KEY if cfg.is_local else host_keys.get(name, UNKNOWN_HOST_KEY)
        out.append(
            HostTarget(
                name,
                cfg.address,
                cfg.port,
                cfg.user,
                str(cfg.key_file) if cfg.key_file is not None else None,
                key,
            )
        )
    return tuple(out)


def make_plan(
    settings: Settings,
    action: Action,
    service: str,
    *,
    version: str | None = None,
    index: str | None = None,
    dry_run: bool = False,
    batch: int | None = None,
    host_keys: Mapping[str, str] | None = None,
    force: bool = False,
    host: str | None = None,
) -> Plan:
    """Build the plan from config and validated input; raise InputError for anything else.

    ``host_keys``: each host's key fingerprint(s), read by the caller (this module does
    no I/O); without them every remote host binds UNKNOWN_HOST_KEY, which a plan built
    with them differs from, so the engine builds both its plans with them."""
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
    if force and (action not in (Action.REDEPLOY, Action.RESTART) or dry_run):
        raise InputError("--force only applies to a redeploy or restart that stops the service")
    if dry_run and action not in (Action.REDEPLOY, Action.RESTART):
        raise InputError("--dry-run only applies to a redeploy or restart")
    hosts = _hosts_of(settings, action, service, host)
    targets = host_targets(settings, hosts, host_keys or {})
    # True: the bot runs on every host, so NVML reads their GPUs; None: on some of them.
    kinds = {t.local for t in targets}
    local = None if len(kinds) > 1 else kinds == {True}
    router = router_target(settings, service) if action != Action.STATUS else None
    if action == Action.REDEPLOY:
        steps = with_rotation(redeploy_steps(svc, spec, index_url, local), router)
    elif action == Action.RESTART:
        steps = with_rotation(restart_steps(svc, local), router)
    elif action == Action.ROLLBACK:
        steps = with_rotation(_switch_back_steps(service, svc, local), router)
    elif action in (Action.ROTATION, Action.DRAIN, Action.UNDRAIN):
        assert router is not None  # _hosts_of refused a service without one
        steps = rotation_steps(action, router, svc, hosts)
    else:
        steps = (
            PlannedStep(
                Step.STATUS,
                f"{cmd(remote.unit_show(svc))}; "
                f"{cmd(remote.package_show(svc))}; GET {api_base(svc)}/v1/models, "
                f"{metrics_url(svc)}; {cmd(remote.gpu_query())}",
            ),
        )
    return Plan(
        action=action,
        service=service,
        hosts=hosts,
        unit=svc.unit,
        package=svc.package,
        version=version,
        spec=spec,
        index_name=index,
        index_url=index_url,
        steps=steps,
        dry_run=dry_run,
        batch_size=batch if batch is not None else svc.max_unavailable,
        targets=targets,
        force=force,
        router=router,
    )


def _hosts_of(
    settings: Settings, action: Action, service: str, host: str | None
) -> tuple[str, ...]:
    """The hosts a run works on: the service's, or the one a drain/undrain names (it
    must be one of them, from the config). Rotation commands need a router."""
    svc = settings.services[service]
    if action in (Action.ROTATION, Action.DRAIN, Action.UNDRAIN) and svc.router is None:
        raise InputError(
            f"{service} has no router configured (`router` in [services.{service}]): "
            f"there is no rotation to {'read' if action == Action.ROTATION else str(action)}"
        )
    if not action.one_host:
        if host is not None:
            raise InputError(f"a host only applies to drain and undrain, not {action}")
        return tuple(svc.hosts)
    if host is None:
        raise InputError(f"{action} needs the host: one of {', '.join(svc.hosts)}")
    if host not in svc.hosts:
        raise InputError(
            f"`{host[:64]}` is not a host of {service}; its hosts: {', '.join(svc.hosts)}"
        )
    return (host,)


def rotation_steps(
    action: Action, router: RouterTarget, svc: ServiceSettings, hosts: tuple[str, ...]
) -> tuple[PlannedStep, ...]:
    """The steps of a rotation command, with the router commands exactly."""
    match action:
        case Action.ROTATION:
            return (
                PlannedStep(
                    Step.ROTATION,
                    f"router {router.name} ({router.kind}) read from {router.host}; "
                    f"GET {svc.health_url} from each host",
                ),
            )
        case Action.DRAIN:
            t, server = router, router.server(hosts[0])
            return (
                PlannedStep(
                    Step.ROTATION_OUT,
                    f"router {t.name} ({t.kind}): refuse unless at least {t.min_serving} "
                    f"other replica(s) serve; {shown_out(t, server)}; wait {t.settle_s:g}s, "
                    f"then up to {t.drain_timeout_s:g}s until the router shows no session "
                    f"for it; {svc.unit} on {hosts[0]} keeps running",
                ),
            )
        case Action.UNDRAIN:
            return (
                PlannedStep(
                    Step.READINESS,
                    f"GET {svc.health_url}, then the readiness checks (model, smoke test, "
                    "version) from the host; an unready replica is refused",
                ),
                PlannedStep(
                    Step.ROTATION_IN,
                    f"{shown_in(router, router.server(hosts[0]))}; up to "
                    f"{router.confirm_timeout_s:g}s until the router shows it serving",
                ),
            )
        case _:
            raise AssertionError(action)


def with_rotation(
    steps: tuple[PlannedStep, ...], router: RouterTarget | None
) -> tuple[PlannedStep, ...]:
    """A change behind a router: each replica out of rotation before its stop's request
    drain, back in after its post-checks (bot.core.phases.rotation)."""
    if router is None:
        return steps
    out = PlannedStep(Step.ROTATION_OUT, rotation_out_command(router))
    back = PlannedStep(Step.ROTATION_IN, rotation_in_command(router))
    i = next((i for i, s in enumerate(steps) if s.step == Step.REQUESTS), len(steps))
    before = list(steps[:i])
    return (*before, out, *steps[i:], back)
