"""Preflight: everything that can refuse does so while the service is untouched (the
unit, the installed version, free disk, the install's dry run, the environment snapshot),
then the prefetch of every wheel the install needs (issue 10)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from bot.core import remote
from bot.core.packages import (
    EnvKind,
    Freeze,
    PackageDiff,
    downloaded_bytes,
    parse_freeze,
    parse_install_changes,
    parse_install_set,
    planned_diff,
)
from bot.core.phases.actions import (
    BeginStep,
    Emit,
    EndStep,
    Packages,
    Phase,
    Versions,
    pause,
    run,
)
from bot.core.phases.common import (
    check_unit,
    evidence_of,
    explain,
    failed_msg,
    gate_refusal,
    judge_gate,
    lost,
    read_driver_cuda,
    read_state,
    read_version,
    reason_of,
    tail_of,
    unit_state,
)
from bot.core.plan import Plan, Step, cmd
from bot.core.service_state import ServiceState
from bot.core.unit_env import UnitEnvironment, environment_files, parse_env_file, parse_environment
from bot.core.unit_flags import NOT_READ, ServeCommand, command_of, step_note, verdict_of
from bot.settings import ServiceSettings


class Refused(Exception):
    """A preflight check refuses; raised out of the check so the next ones never run."""

    def __init__(self, reason: str, evidence: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.evidence = evidence  # a quiet query's output that explains the refusal


@dataclass(frozen=True, slots=True)
class _Preflight:
    """What preflight found, for the steps after it."""

    before: str | None  # the installed version: what a rollback reinstalls
    target: str | None  # the version the install should leave (None: not known)
    # How the service is (the unit as preflight read it): how every end before the stop
    # leaves it. UNKNOWN when the unit could not be read, or is not loaded.
    state: ServiceState
    refusal: str | None = None  # why it refused; None when every check passed
    env: Env | None = None  # the environment snapshot a rollback restores
    # The unit's `vllm serve` command (its flags, checked against the new version in the
    # prefetch), or why they cannot be checked.
    serve: ServeCommand | str = NOT_READ


def preflight(plan: Plan, svc: ServiceSettings, host: str) -> Phase[_Preflight]:
    """Everything that can refuse does so while the service is untouched: the unit is
    loaded, the installed version is known (a rollback needs it), the venv's disk has
    room and the install resolves."""
    yield Emit(
        BeginStep(Step.PREFLIGHT, next(s.command for s in plan.steps if s.step == Step.PREFLIGHT))
    )
    before: str | None = None
    state = ServiceState.UNKNOWN
    try:
        props, state = yield from preflight_unit(svc, host)
        serve = yield from _preflight_exec_start(svc)
        before = yield from _preflight_version(svc)
        avail = yield from _preflight_disk(svc)
        target, dry_output = yield from _preflight_dry_run(plan, svc)
        env = yield from _preflight_snapshot(plan, svc, dry_output)
    except Refused as e:
        yield Emit(EndStep(Step.PREFLIGHT, False, e.reason, None, e.evidence))
        return _Preflight(before, None, state, e.reason)
    yield Emit(Versions(before, None))
    yield Emit(
        EndStep(
            Step.PREFLIGHT,
            True,
            f"{svc.unit} {props.get('ActiveState', '?')}, {svc.package} {before}, "
            f"{avail:,} MiB free, {plan.spec} resolves"
            + (f" to {target}" if target and not plan.version else "")
            + f"; changes: {env.planned.headline()}; snapshot of "
            f"{env.freeze.count} packages" + ("" if plan.dry_run else f" kept as {env.lock}"),
        )
    )
    return _Preflight(before, target, state, env=env, serve=serve)


def _preflight_exec_start(svc: ServiceSettings) -> Phase[ServeCommand | str]:
    """The unit's ``vllm serve`` command from its ExecStart, its ``$VAR`` words expanded
    with the unit's environment as systemd does, or why its flags cannot be checked.
    Never a refusal: a unit this cannot read is said as unchecked."""
    r = yield from run(
        Step.PREFLIGHT, remote.unit_exec_start(svc), svc.command_timeout_s, quiet=True
    )
    if not r.ok:
        return f"cannot read the unit's ExecStart ({reason_of(r)})"
    exec_start = remote.parse_unit_show(r.stdout).get("ExecStart", "")
    env = UnitEnvironment()
    if "$" in exec_start:
        env = yield from _unit_environment(svc, r.stdout)
    return command_of(exec_start, env)


def _unit_environment(svc: ServiceSettings, show: str) -> Phase[UnitEnvironment]:
    """What the unit's ``Environment=`` and EnvironmentFiles set (files over it, in the
    unit's order), and why any of it could not be read. The files' text (tokens may be
    in it) stays here: only the values ExecStart names are used, and never shown."""
    environment = parse_environment(remote.parse_unit_show(show).get("Environment", ""))
    if environment is None:
        return UnitEnvironment(unread=("the unit's Environment= could not be read",))
    values, unread = dict(environment), []
    for file in environment_files(show):
        r = yield from run(
            Step.PREFLIGHT, remote.env_file_read(file.path), svc.command_timeout_s, quiet=True
        )
        read = parse_env_file(r.stdout) if r.ok else None
        if read is not None:
            values.update(read)
        elif r.ok:
            unread.append(f"systemd releases read {file.path} differently")
        elif not (file.ignore_errors and "No such file or directory" in r.stderr):
            # (systemd skips a missing file the unit names with `-`)
            said = tail_of(r.stderr, 1)
            unread.append(
                f"{file.path} could not be read ({reason_of(r)}{': ' + said if said else ''})"
            )
    return UnitEnvironment(values, tuple(unread))


def preflight_unit(svc: ServiceSettings, host: str) -> Phase[tuple[dict[str, str], ServiceState]]:
    """The unit's properties and the service's state they say; refuses when the host is
    unreachable or the unit not loaded."""
    r, props = yield from unit_state(Step.PREFLIGHT, svc)
    refusal = (
        f"cannot reach {host} over SSH: {reason_of(r)}" if lost(r) else check_unit(svc, r, props)
    )
    if refusal is not None:
        raise Refused(refusal)
    return props, read_state(r, props)


def _preflight_version(svc: ServiceSettings) -> Phase[str]:
    before, why, evidence = yield from read_version(Step.PREFLIGHT, svc)
    if before is None:
        raise Refused(
            f"cannot read the installed {svc.package} version, so a rollback "
            f"would be impossible ({why})",
            evidence,
        )
    return before


def _preflight_disk(svc: ServiceSettings) -> Phase[int]:
    """Free MiB on the venv's file system; refuses under ``min_free_disk_mib``."""
    df = yield from run(Step.PREFLIGHT, remote.free_disk(svc), svc.command_timeout_s)
    avail = remote.parse_df_avail_mib(df.stdout) if df.ok else None
    if avail is None:
        raise Refused(f"cannot read free disk space of {svc.venv_dir} ({explain(df)})")
    if avail < svc.min_free_disk_mib:
        raise Refused(
            f"only {avail:,} MiB free on {svc.venv_dir}; need {svc.min_free_disk_mib:,} MiB"
        )
    return avail


def _preflight_dry_run(plan: Plan, svc: ServiceSettings) -> Phase[tuple[str | None, str]]:
    """``uv pip install --dry-run``; returns the version the install should leave, and
    uv's report (its `` - ``/`` + ``/`` ~ `` lines, on stderr)."""
    dry_argv = remote.install_dry_run(svc, plan.spec, plan.index_url)
    dry = yield from run(
        Step.PREFLIGHT, dry_argv, svc.install_timeout_s, stdin=remote.index_input(plan.index_url)
    )
    if not dry.ok:
        raise Refused(f"install dry run failed ({reason_of(dry)}): {tail_of(dry.output, 4)}")
    if plan.version is not None:
        return plan.version, dry.output
    # What "latest" means now: after a lost connection, the version to look for.
    return remote.parse_resolved_version(dry.output, svc.package), dry.output


@dataclass(frozen=True, slots=True)
class Env:
    """The environment before anything changed, and what the install should change."""

    freeze: Freeze  # the snapshot (``uv pip freeze``)
    lock: str  # where the snapshot is kept on the host: what a rollback syncs to
    planned: PackageDiff  # the dry run's changes
    # Everything the install installs (the dry run's `+` and `~` lines): what the prefetch
    # puts in uv's cache. Not the whole snapshot: what the install leaves alone (a CUDA 12
    # wheel a CUDA 13 release no longer needs) may be gone from the index already. Name ->
    # its requirement line: `name==version`, or `name @ URL` for a direct-URL wheel.
    installs: Mapping[str, str] = field(default_factory=dict)


def pins_of(env: Env) -> str:
    """The dry run's pinned set, one requirement a line: what a prefetch or a release
    build installs, read on stdin."""
    return "".join(f"{r}\n" for _, r in sorted(env.installs.items()))


def _preflight_snapshot(plan: Plan, svc: ServiceSettings, dry_output: str) -> Phase[Env]:
    """``uv pip freeze`` of the venv, kept on the host next to it (so a rollback never
    depends on the bot) and recorded in the audit log. A snapshot that cannot be taken
    or saved refuses the run: without it no rollback could restore what was there."""
    argv = remote.freeze(svc)
    r = yield from run(Step.PREFLIGHT, argv, svc.command_timeout_s, quiet=True)
    if not r.ok:
        raise Refused(
            f"cannot take the environment snapshot, so a rollback could not "
            f"restore it (`{cmd(argv)}`: {explain(r)})",
            evidence_of(argv, r),
        )
    snapshot = parse_freeze(r.stdout)
    if not snapshot.versions:
        raise Refused(
            f"the environment snapshot is empty (`{cmd(argv)}` listed no "
            "package), so a rollback could not restore it",
            evidence_of(argv, r),
        )
    twice = snapshot.unrestorable()
    if twice is not None:  # `uv pip sync` of it would fail: no rollback could work
        raise Refused(
            f"snapshot not restorable: {twice}; `uv pip sync` cannot require "
            "two versions of one package. Remove the stale `.dist-info` "
            f"directory from {svc.venv_dir}'s site-packages, then ask again",
            evidence_of(argv, r),
        )
    lock = remote.lock_path(svc, snapshot.digest)
    if not plan.dry_run:  # a dry run writes nothing on the host
        save = remote.save_lock(svc, lock)
        s = yield from run(
            Step.PREFLIGHT, save, svc.command_timeout_s, quiet=True, stdin=snapshot.text.encode()
        )
        if not s.ok:
            raise Refused(
                f"cannot save the environment snapshot on the host as {lock} ({explain(s)})",
                evidence_of(save, s),
            )
    changes = parse_install_changes(dry_output)
    env = Env(snapshot, lock, planned_diff(snapshot, changes), parse_install_set(dry_output))
    yield Emit(Packages(EnvKind.SNAPSHOT, None, snapshot.text, None if plan.dry_run else lock))
    yield Emit(Packages(EnvKind.PLANNED, env.planned))
    return env


# How a prefetch ended a run before the stop: the prefetch itself failed (no new
# environment to judge), or the new environment's own gate refused it.
PrefetchEnd = tuple[Literal["prefetch", "gate", "flags"], str] | None


def _size(n: int | None) -> str:
    if n is None:
        return "nothing downloaded"
    return (
        f"{n / 1024**3:.1f} GiB downloaded"
        if n >= 1024**3
        else (f"{n / 1024**2:.1f} MiB downloaded")
    )


def prefetch(
    plan: Plan,
    svc: ServiceSettings,
    env: Env,
    target: str | None = None,
    serve: ServeCommand | str = NOT_READ,
) -> Phase[PrefetchEnd]:
    """Before the stop, fetch every wheel the install needs into uv's cache (what the
    dry run says the install installs, pinned, installed into a throwaway venv), then let
    that venv's own interpreter run the import and CUDA gate (it is the new environment:
    a torch built for a newer CUDA major than the driver's is refused here, before the
    stop), then, when the unit starts ``vllm serve``, judge its flags against that
    version's own ``vllm serve --help`` (a flag it does not accept is refused here), then
    remove the venv (always: the script's trap). None when done, else which part ended it
    and why (the service is untouched)."""
    driver_cuda = yield from read_driver_cuda(Step.PREFETCH, svc)
    argv = remote.prefetch(svc, plan.index_url, check_flags=isinstance(serve, ServeCommand))
    yield Emit(BeginStep(Step.PREFETCH, remote.prefetch_shown(svc, plan.index_url)))
    stdin = (remote.index_input(plan.index_url) or b"") + pins_of(env).encode()
    started = (yield from pause(0.0)).now
    r = yield from run(Step.PREFETCH, argv, svc.install_timeout_s, stdin=stdin)
    took = (yield from pause(0.0)).now - started
    installed = remote.PREFETCHED_MARK in r.stdout.splitlines()
    # Cut off after its install (in the gate, or listing the help): a timeout, never a
    # gate's refusal, which would blame the new build for the clock.
    if not installed or lost(r) or r.timed_out:
        why = (
            "connection lost during the prefetch"
            if lost(r)
            else failed_msg("prefetch", r, svc.install_timeout_s)
        )
        yield Emit(EndStep(Step.PREFETCH, False, why, r.exit_status))
        return (
            "prefetch",
            f"{why}: {tail_of(r.output, 3)}" if not r.timed_out and not lost(r) else why,
        )
    report, verdict = judge_gate(r, svc, target=target, driver_cuda=driver_cuda)
    fetched = (
        f"{len(env.installs)} packages in uv's cache, "
        f"{_size(downloaded_bytes(r.output))} in {took:.1f}s"
    )
    if not verdict.ok:
        gate_why = gate_refusal(verdict, report, r)
        why = "the new environment's import gate refused it before the stop "
        why += f"({verdict.check} check failed: {gate_why})"
        yield Emit(EndStep(Step.PREFETCH, False, f"{fetched}; {why}", r.exit_status))
        return ("gate", why)
    flags = verdict_of(r.stdout, serve, svc.package, report.vllm if report else target)
    if flags.outcome == "refused":
        why = f"the new version refuses the unit's flags: {flags.reason}"
        yield Emit(EndStep(Step.PREFETCH, False, f"{fetched}; {why}", r.exit_status))
        return ("flags", flags.reason)
    note, unchecked = step_note(flags)
    warnings = [w for w in (verdict.warning, unchecked) if w]
    yield Emit(
        EndStep(
            Step.PREFETCH,
            True,
            f"{fetched}; the new environment passed the import gate: {verdict.reason}; {note}",
            r.exit_status,
            "\n".join(f"WARNING: {w}" for w in warnings),
        )
    )
    return None
