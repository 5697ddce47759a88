"""The maintenance sequences as pure generators: they yield actions and consume outcomes.

No I/O happens here (the httpx ``auth_flow`` pattern): ``bot.executor`` performs
each action and sends the outcome back, and the tests drive these generators
with hand-made outcomes to cover every branch.  A flow handles one host and
returns a ``HostOutcome``; rollouts over several hosts are composed by the caller.

Outcomes sent back per action:
``RunCommand`` -> ``CommandResult``; ``HttpCheck`` -> ``HttpResult``;
``Sleep`` / ``Checkpoint`` -> ``Tick``; ``Emit`` -> ``None``.
"""

from __future__ import annotations

import shlex
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from bot import remote
from bot.errors import GpuQueryError
from bot.gpu import GpuSnapshot, build_snapshot, check_nvidia_smi, drain_verdict, parse_pgrep
from bot.plan import Plan, Step
from bot.settings import ServiceSettings
from bot.transport import CommandResult, HttpResult

# ---- actions ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunCommand:
    step: Step
    argv: tuple[str, ...]
    timeout_s: float
    # Polls are not streamed line by line; the step's summary reports their result.
    quiet: bool = False


@dataclass(frozen=True, slots=True)
class HttpCheck:
    url: str
    timeout_s: float


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A safe point at which a cancel request may take effect."""


@dataclass(frozen=True, slots=True)
class Tick:
    now: float  # monotonic seconds
    cancel_requested: bool = False


# ---- things the flow tells the world (the executor adds run id, host, timing) -----------


@dataclass(frozen=True, slots=True)
class BeginStep:
    step: Step
    command: str


@dataclass(frozen=True, slots=True)
class EndStep:
    step: Step
    ok: bool
    summary: str
    exit_status: int | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Snapshot:
    label: str
    snapshot: GpuSnapshot


@dataclass(frozen=True, slots=True)
class Versions:
    before: str | None
    after: str | None


Notice = BeginStep | EndStep | Snapshot | Versions


@dataclass(frozen=True, slots=True)
class Emit:
    notice: Notice


Action = RunCommand | HttpCheck | Sleep | Checkpoint | Emit


@dataclass(frozen=True, slots=True)
class HostOutcome:
    status: str  # succeeded | failed | rolled_back | aborted | cancelled
    summary: str
    version_before: str | None = None
    version_after: str | None = None


Flow = Generator[Action, Any, HostOutcome]

HEALTH_REQUEST_TIMEOUT_S = 5.0

# ---- small helpers (sub-generators) ----------------------------------------------------


def _cmd(argv: tuple[str, ...]) -> str:
    return shlex.join(argv)


def _why(r: CommandResult) -> str:
    if r.timed_out:
        return "timed out"
    if r.exit_status is None:
        return f"ended by signal {r.signal}" if r.signal else (r.stderr.strip() or "no exit status")
    return f"exit {r.exit_status}"


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _run(step: Step, argv: tuple[str, ...], timeout: float, *, quiet: bool = False
         ) -> Generator[Action, Any, CommandResult]:
    result: CommandResult = yield RunCommand(step, argv, timeout, quiet)
    return result


def _tick(seconds: float | None = None) -> Generator[Action, Any, Tick]:
    tick: Tick = yield (Checkpoint() if seconds is None else Sleep(seconds))
    return tick


def _snapshot(step: Step, svc: ServiceSettings, host: str
              ) -> Generator[Action, Any, GpuSnapshot]:
    """Query GPUs and compute apps; raises GpuQueryError when nvidia-smi fails."""
    gpus = yield from _run(step, remote.gpu_query(), svc.command_timeout_s, quiet=True)
    check_nvidia_smi(host, gpus)
    apps = yield from _run(step, remote.apps_query(), svc.command_timeout_s, quiet=True)
    check_nvidia_smi(host, apps)
    return build_snapshot(host, gpus.stdout, apps.stdout)


def _version(step: Step, svc: ServiceSettings) -> Generator[Action, Any, str | None]:
    r = yield from _run(step, remote.package_show(svc), svc.command_timeout_s, quiet=True)
    return remote.parse_package_version(r.stdout) if r.ok else None


def _unit_state(step: Step, svc: ServiceSettings
                ) -> Generator[Action, Any, tuple[CommandResult, dict[str, str]]]:
    r = yield from _run(step, remote.unit_show(svc), svc.command_timeout_s)
    return r, remote.parse_unit_show(r.stdout)


def _check_unit(svc: ServiceSettings, r: CommandResult, props: dict[str, str]) -> str | None:
    """A reason to refuse, or None when the unit exists."""
    if not r.ok:
        return f"cannot read the state of {svc.unit} ({_why(r)}): {_tail(r.output, 3)}"
    if props.get("LoadState") != "loaded":
        return (f"unit {svc.unit} is not loaded on this host "
                f"(LoadState={props.get('LoadState', '?')})")
    return None


# ---- steps ------------------------------------------------------------------------------


def _stop(svc: ServiceSettings) -> Generator[Action, Any, str | None]:
    argv = remote.unit_stop(svc)
    yield Emit(BeginStep(Step.STOP, _cmd(argv)))
    r = yield from _run(Step.STOP, argv, svc.stop_timeout_s)
    if not r.ok:
        msg = f"systemctl stop failed ({_why(r)})"
        yield Emit(EndStep(Step.STOP, False, msg, r.exit_status, _tail(r.output)))
        return msg
    yield Emit(EndStep(Step.STOP, True, f"{svc.unit} stopped", r.exit_status))
    return None


def _drain(svc: ServiceSettings, host: str) -> Generator[Action, Any, tuple[str, str | None]]:
    """Poll until GPU memory is released. Returns ('ok'|'failed'|'cancelled', reason)."""
    yield Emit(BeginStep(Step.DRAIN, f"poll {_cmd(remote.gpu_query())}, "
                         f"{_cmd(remote.apps_query())}, {_cmd(remote.workers_query())}"))
    start = (yield from _tick(0.0)).now
    polls = 0
    while True:
        polls += 1
        try:
            snap = yield from _snapshot(Step.DRAIN, svc, host)
            w = yield from _run(Step.DRAIN, remote.workers_query(), svc.command_timeout_s,
                                quiet=True)
            # pgrep exits 1 when nothing matches; anything else means we could not tell.
            if w.exit_status not in (0, 1):
                raise GpuQueryError(host, f"cannot list vLLM workers ({_why(w)})",
                                    exit_status=w.exit_status, output=w.output)
            workers = parse_pgrep(w.stdout, host)
        except GpuQueryError as e:
            msg = f"cannot tell whether the GPUs are free: {e.reason}"
            yield Emit(EndStep(Step.DRAIN, False, msg, e.exit_status, _tail(e.output)))
            return "failed", msg
        verdict = drain_verdict(snap, svc.drain_threshold_mib, workers)
        tick = yield from _tick(0.0)
        elapsed = tick.now - start
        if verdict.drained:
            yield Emit(Snapshot("after drain", snap))
            yield Emit(EndStep(Step.DRAIN, True,
                               f"GPU memory released after {elapsed:.1f}s ({polls} polls)"))
            return "ok", None
        if tick.cancel_requested:
            yield Emit(Snapshot("drain cancelled", snap))
            yield Emit(EndStep(Step.DRAIN, False, "cancelled while waiting for GPU memory"))
            return "cancelled", None
        if elapsed >= svc.drain_timeout_s:
            yield Emit(Snapshot("drain timeout", snap))
            msg = (f"GPU memory still held after {svc.drain_timeout_s:g}s: "
                   f"{verdict.describe()}")
            yield Emit(EndStep(Step.DRAIN, False, msg, None, verdict.describe()))
            return "failed", msg
        yield Sleep(svc.drain_poll_s)


def _start_and_gate(svc: ServiceSettings, start_step: Step, health_step: Step
                    ) -> Generator[Action, Any, str | None]:
    """systemctl start, then wait for the unit to stay up and /health to answer 200.
    Returns None when healthy, else the reason (journal tail in the step's detail)."""
    argv = remote.unit_start(svc)
    yield Emit(BeginStep(start_step, _cmd(argv)))
    r = yield from _run(start_step, argv, svc.command_timeout_s)
    if not r.ok:
        msg = f"systemctl start failed ({_why(r)})"
        journal = yield from _journal(start_step, svc)
        yield Emit(EndStep(start_step, False, msg, r.exit_status,
                           _tail(r.output) + "\n" + journal))
        return msg
    yield Emit(EndStep(start_step, True, f"{svc.unit} started", r.exit_status))

    yield Emit(BeginStep(health_step, f"{_cmd(remote.unit_is_active(svc))}; GET {svc.health_url}"))
    start = (yield from _tick(0.0)).now
    last = "no answer yet"
    while True:
        active = yield from _run(health_step, remote.unit_is_active(svc), svc.command_timeout_s,
                                 quiet=True)
        state = active.stdout.strip() or _why(active)
        if state in ("failed", "inactive"):
            msg = f"{svc.unit} is {state} after start"
            journal = yield from _journal(health_step, svc)
            yield Emit(EndStep(health_step, False, msg, active.exit_status, journal))
            return msg
        if active.ok:
            h: HttpResult = yield HttpCheck(svc.health_url, HEALTH_REQUEST_TIMEOUT_S)
            if h.ok:
                now = (yield from _tick(0.0)).now
                yield Emit(EndStep(health_step, True,
                                   f"{svc.health_url} answered 200 after {now - start:.1f}s"))
                return None
            last = f"HTTP {h.status}" if h.status is not None else (h.error or "no response")
        else:
            last = f"unit {state}"
        tick = yield from _tick(svc.health_poll_s)
        if tick.now - start >= svc.start_timeout_s:
            msg = f"not healthy after {svc.start_timeout_s:g}s (last: {last})"
            journal = yield from _journal(health_step, svc)
            yield Emit(EndStep(health_step, False, msg, None, journal))
            return msg


def _journal(step: Step, svc: ServiceSettings) -> Generator[Action, Any, str]:
    r = yield from _run(step, remote.journal_tail(svc), svc.command_timeout_s, quiet=True)
    header = f"$ {_cmd(remote.journal_tail(svc))}"
    return f"{header}\n{r.output.rstrip()}" if r.output.strip() else f"{header}\n({_why(r)})"


def _postcheck(svc: ServiceSettings, host: str) -> Generator[Action, Any, str | None]:
    yield Emit(BeginStep(Step.POSTCHECK, f"{_cmd(remote.package_show(svc))}; "
                         f"{_cmd(remote.gpu_query())}"))
    after = yield from _version(Step.POSTCHECK, svc)
    try:
        snap = yield from _snapshot(Step.POSTCHECK, svc, host)
    except GpuQueryError as e:
        yield Emit(EndStep(Step.POSTCHECK, True,
                           f"version {after}; GPU table unavailable: {e.reason}"))
        return after
    yield Emit(Snapshot("after restart", snap))
    yield Emit(EndStep(Step.POSTCHECK, True,
                       f"version {after}; {snap.used_mib:,} of {snap.total_mib:,} MiB in use"))
    return after


def _recover_after_cancel(svc: ServiceSettings, host: str, before: str | None,
                          what: str) -> Flow:
    """Cancelled once the service is down: bring it back on what is installed."""
    err = yield from _start_and_gate(svc, Step.START, Step.HEALTH)
    if err is not None:
        return HostOutcome("failed", f"cancelled {what}; restarting failed: {err}. "
                           "The service is DOWN.", before, None)
    after = yield from _postcheck(svc, host)
    return HostOutcome("cancelled", f"cancelled {what}; service restarted on {after}",
                       before, after)


# ---- flows ------------------------------------------------------------------------------


def redeploy_flow(plan: Plan, svc: ServiceSettings, host: str) -> Flow:
    """Preflight, stop, drain, reinstall (rollback on failure), start, health, post-check."""
    # Preflight: everything that can refuse does so while the service is untouched.
    yield Emit(BeginStep(Step.PREFLIGHT, next(s.command for s in plan.steps
                                              if s.step == Step.PREFLIGHT)))
    r, props = yield from _unit_state(Step.PREFLIGHT, svc)
    refusal = _check_unit(svc, r, props)
    before: str | None = None
    if refusal is None:
        before = yield from _version(Step.PREFLIGHT, svc)
        if before is None:
            refusal = (f"cannot read the installed {svc.package} version, so a rollback "
                       "would be impossible")
    if refusal is None:
        df = yield from _run(Step.PREFLIGHT, remote.free_disk(svc), svc.command_timeout_s)
        avail = remote.parse_df_avail_mib(df.stdout) if df.ok else None
        if avail is None:
            refusal = f"cannot read free disk space of {svc.venv_dir} ({_why(df)})"
        elif avail < svc.min_free_disk_mib:
            refusal = (f"only {avail:,} MiB free on {svc.venv_dir}; "
                       f"need {svc.min_free_disk_mib:,} MiB")
    if refusal is None:
        dry_argv = remote.install_dry_run(svc, plan.spec, plan.index_url)
        dry = yield from _run(Step.PREFLIGHT, dry_argv, svc.install_timeout_s)
        if not dry.ok:
            refusal = f"install dry run failed ({_why(dry)}): {_tail(dry.output, 4)}"
    if refusal is not None:
        yield Emit(EndStep(Step.PREFLIGHT, False, refusal))
        return HostOutcome("aborted", f"preflight refused; service untouched: {refusal}",
                           before, None)
    yield Emit(Versions(before, None))
    yield Emit(EndStep(Step.PREFLIGHT, True,
                       f"{svc.unit} {props.get('ActiveState', '?')}, {svc.package} {before}, "
                       f"{avail:,} MiB free, {plan.spec} resolves"))
    if plan.dry_run:
        return HostOutcome("succeeded", f"dry run: preflight passed; would install {plan.spec}",
                           before, None)

    if (yield from _tick()).cancel_requested:
        return HostOutcome("cancelled", "cancelled before anything was changed", before, None)

    err = yield from _stop(svc)
    if err is not None:
        return HostOutcome("failed", f"{err}; the service may still be running", before, None)

    drain, reason = yield from _drain(svc, host)
    if drain == "cancelled":
        return (yield from _recover_after_cancel(svc, host, before, "during drain"))
    if drain == "failed":
        return HostOutcome("failed", f"{reason}. The service is STOPPED and nothing was "
                           "reinstalled; free the GPUs, then restart it.", before, None)

    install = remote.install(svc, plan.spec, plan.index_url)
    yield Emit(BeginStep(Step.REINSTALL, _cmd(install)))
    r = yield from _run(Step.REINSTALL, install, svc.install_timeout_s)
    if not r.ok:
        yield Emit(EndStep(Step.REINSTALL, False, f"reinstall failed ({_why(r)})",
                           r.exit_status))
        return (yield from _rollback(plan, svc, host, before, f"reinstall failed ({_why(r)})"))
    yield Emit(EndStep(Step.REINSTALL, True, f"installed {plan.spec}", r.exit_status))

    # A reinstall is never interrupted; a cancel that arrived meanwhile takes effect now.
    if (yield from _tick()).cancel_requested:
        return (yield from _recover_after_cancel(svc, host, before, "after the reinstall"))

    err = yield from _start_and_gate(svc, Step.START, Step.HEALTH)
    if err is not None:
        return HostOutcome("failed", f"{err}. {plan.spec} is installed; roll back with "
                           f"`redeploy {plan.service} --version {before}`.", before, None)
    after = yield from _postcheck(svc, host)
    return HostOutcome("succeeded", f"{svc.package} {before} -> {after}, healthy", before, after)


def _rollback(plan: Plan, svc: ServiceSettings, host: str, before: str | None,
              cause: str) -> Flow:
    assert before is not None  # preflight refuses when the version is unknown
    argv = remote.install_previous(svc, before, plan.index_url)
    yield Emit(BeginStep(Step.ROLLBACK, _cmd(argv)))
    r = yield from _run(Step.ROLLBACK, argv, svc.install_timeout_s)
    if not r.ok:
        yield Emit(EndStep(Step.ROLLBACK, False, f"rollback to {before} failed ({_why(r)})",
                           r.exit_status))
        return HostOutcome("failed", f"{cause}; rollback to {before} failed too ({_why(r)}). "
                           "The service is STOPPED.", before, None)
    yield Emit(EndStep(Step.ROLLBACK, True, f"reinstalled {svc.package}=={before}",
                       r.exit_status))
    err = yield from _start_and_gate(svc, Step.ROLLBACK_START, Step.ROLLBACK_HEALTH)
    if err is not None:
        return HostOutcome("failed", f"{cause}; rolled back to {before} but {err}. "
                           "The service is DOWN.", before, None)
    after = yield from _postcheck(svc, host)
    return HostOutcome("rolled_back", f"{cause}; rolled back to {after}, healthy", before, after)


def restart_flow(plan: Plan, svc: ServiceSettings, host: str) -> Flow:
    """Stop, drain, start, health: the same gates as a redeploy without the reinstall."""
    yield Emit(BeginStep(Step.PREFLIGHT, _cmd(remote.unit_show(svc))))
    r, props = yield from _unit_state(Step.PREFLIGHT, svc)
    refusal = _check_unit(svc, r, props)
    if refusal is not None:
        yield Emit(EndStep(Step.PREFLIGHT, False, refusal))
        return HostOutcome("aborted", f"preflight refused; service untouched: {refusal}")
    before = yield from _version(Step.PREFLIGHT, svc)
    yield Emit(Versions(before, None))
    yield Emit(EndStep(Step.PREFLIGHT, True,
                       f"{svc.unit} {props.get('ActiveState', '?')}, {svc.package} {before}"))
    if (yield from _tick()).cancel_requested:
        return HostOutcome("cancelled", "cancelled before anything was changed", before, None)
    err = yield from _stop(svc)
    if err is not None:
        return HostOutcome("failed", f"{err}; the service may still be running", before, None)
    drain, reason = yield from _drain(svc, host)
    if drain == "failed":
        return HostOutcome("failed", f"{reason}. The service is STOPPED; free the GPUs, "
                           "then restart it.", before, None)
    err = yield from _start_and_gate(svc, Step.START, Step.HEALTH)
    if err is not None:
        return HostOutcome("failed", f"{err}. The service is DOWN.", before, None)
    after = yield from _postcheck(svc, host)
    status = "cancelled" if drain == "cancelled" else "succeeded"
    return HostOutcome(status, f"restarted on {after}, healthy", before, after)


def status_flow(plan: Plan, svc: ServiceSettings, host: str) -> Flow:
    """Unit state, installed version and the GPU table; changes nothing."""
    yield Emit(BeginStep(Step.STATUS, plan.steps[0].command))
    r, props = yield from _unit_state(Step.STATUS, svc)
    version = yield from _version(Step.STATUS, svc)
    yield Emit(Versions(version, None))
    state = (f"{props.get('ActiveState', '?')} ({props.get('SubState', '?')}), "
             f"MainPID {props.get('MainPID', '?')}") if r.ok else f"unknown ({_why(r)})"
    try:
        snap = yield from _snapshot(Step.STATUS, svc, host)
    except GpuQueryError as e:
        summary = f"{svc.unit}: {state}; {svc.package} {version}; GPUs: {e.reason}"
        yield Emit(EndStep(Step.STATUS, False, summary, e.exit_status))
        return HostOutcome("failed", summary, version, version)
    yield Emit(Snapshot("now", snap))
    summary = (f"{svc.unit}: {state}; {svc.package} {version}; "
               f"{snap.used_mib:,} of {snap.total_mib:,} MiB GPU memory in use")
    yield Emit(EndStep(Step.STATUS, True, summary))
    return HostOutcome("succeeded", summary, version, version)


FLOWS = {"redeploy": redeploy_flow, "restart": restart_flow, "status": status_flow}
