"""The install (reinstall or rollback), settling a cut install before anything else
touches the venv, and the import gate between the install and the start."""

from __future__ import annotations

from dataclasses import dataclass

from bot.core import remote
from bot.core.packages import EnvKind, PackageDiff, diff_freezes, parse_freeze
from bot.core.phases.actions import BeginStep, Emit, EndStep, Packages, Phase, pause, run
from bot.core.phases.common import (
    InstallEnd,
    explain,
    failed_msg,
    gate_refusal,
    judge_gate,
    lost,
    read_driver_cuda,
    reason_of,
    tail_of,
)
from bot.core.phases.preflight import Env
from bot.core.plan import Step, cmd
from bot.core.versions import same_release
from bot.settings import ServiceSettings

# After an install's timeout the host's `timeout` sends TERM, then KILL after
# bot.hosts.ssh.KILL_AFTER_S (10 s): past this margin no install we started can still run.
INSTALL_KILL_GRACE_S = 15.0


@dataclass(frozen=True, slots=True)
class _Settled:
    known: bool  # uv is gone and the installed version was read
    installed: str | None  # the version installed afterwards (None: missing or unknown)
    why: str  # when not known: what stood in the way


def _settle_install(svc: ServiceSettings, step: Step, started: float) -> Phase[_Settled]:
    """The result of an install never came back.  uv may still be running on the host
    (OpenSSH does not end a command without a pty when its channel closes; ``timeout``
    only ends it at the install timeout), and installing anything else meanwhile
    would corrupt the venv.  So: reconnect, wait until no install into the venv runs,
    then read what is installed.  Bounded by the time after which ``timeout`` has
    surely ended that install."""
    deadline = started + svc.install_timeout_s + INSTALL_KILL_GRACE_S
    while True:
        p = yield from run(step, remote.installs_query(svc), svc.command_timeout_s, quiet=True)
        if p.exit_status == 1:  # no install running
            r = yield from run(step, remote.package_show(svc), svc.command_timeout_s, quiet=True)
            if not lost(r):
                version = remote.parse_package_version(r.stdout) if r.ok else None
                return _Settled(True, version, "")
            why = reason_of(r)
        elif p.exit_status == 0:
            why = f"uv is still running: {tail_of(p.stdout, 1)}"
        elif lost(p):
            why = reason_of(p)
        else:
            # pgrep's own words (not found, a bad pattern) say why: keep them.
            return _Settled(False, None, f"cannot tell whether uv still runs ({explain(p)})")
        tick = yield from pause(svc.drain_poll_s)
        if tick.now >= deadline:
            return _Settled(False, None, why)


def import_gate(svc: ServiceSettings, env: Env, target: str | None) -> Phase[str | None]:
    """Between install and start: record what the install really changed, then let the
    venv's own interpreter import vllm and torch and compare torch's CUDA build with what
    the driver supports. None when the new environment may start, else which check
    failed and why (the step's output holds the interpreter's words)."""
    yield Emit(
        BeginStep(
            Step.GATE,
            f"{cmd(remote.freeze(svc))}; {cmd(remote.driver_info())}; "
            f"{svc.python} -c 'import vllm, torch'",
        )
    )
    yield from record_change(svc, env, EnvKind.INSTALLED)
    driver_cuda = yield from read_driver_cuda(Step.GATE, svc)
    g = yield from run(Step.GATE, remote.import_gate(svc), svc.gate_timeout_s)
    report, verdict = judge_gate(g, svc, target=target, driver_cuda=driver_cuda)
    if verdict.ok:
        # A warning (torch's CUDA minor newer than the driver's) goes in the output too.
        yield Emit(
            EndStep(
                Step.GATE,
                True,
                verdict.reason,
                g.exit_status,
                f"WARNING: {verdict.warning}" if verdict.warning else "",
            )
        )
        return None
    why = gate_refusal(verdict, report, g)
    yield Emit(EndStep(Step.GATE, False, f"{verdict.check} check failed: {why}", g.exit_status))
    return f"the import gate refused the start ({verdict.check} check failed: {why})"


def record_change(svc: ServiceSettings, env: Env, kind: EnvKind) -> Phase[PackageDiff | None]:
    """The freeze now, compared with the snapshot, recorded as ``kind``; None (and a
    note saying why) when the freeze cannot be read."""
    r = yield from run(
        Step.GATE if kind == EnvKind.INSTALLED else Step.POSTCHECK,
        remote.freeze(svc),
        svc.command_timeout_s,
        quiet=True,
    )
    if not r.ok:
        yield Emit(Packages(kind, None, note=f"`{cmd(remote.freeze(svc))}`: {explain(r)}"))
        return None
    diff = diff_freezes(env.freeze, parse_freeze(r.stdout))
    yield Emit(Packages(kind, diff))
    return diff


def run_install(
    svc: ServiceSettings,
    step: Step,
    argv: tuple[str, ...],
    target: str | None,
    what: str,
    done: str,
    stdin: bytes | None,
) -> Phase[tuple[InstallEnd, str]]:
    """Run an install (the reinstall or the rollback): how it ended, and why.

    A cut connection may leave uv running on the host, and installing anything else
    meanwhile would corrupt the venv: wait until uv has ended, then judge by the
    version that is installed (``target``)."""
    yield Emit(BeginStep(step, cmd(argv)))
    started = (yield from pause(0.0)).now
    r = yield from run(step, argv, svc.install_timeout_s, stdin=stdin)
    if lost(r):
        cut = f"connection lost during the {what} ({reason_of(r)})"
        settled = yield from _settle_install(svc, step, started)
        if not settled.known:
            why = f"{cut}; then {settled.why}"
            yield Emit(EndStep(step, False, why))
            return "unknown", why
        if not same_release(settled.installed, target):
            why = (
                f"{cut}; once uv had ended, {svc.package} was "
                f"{settled.installed or 'missing'}, not {target or 'a known version'}"
            )
            yield Emit(EndStep(step, False, why))
            return "failed", why
        yield Emit(
            EndStep(
                step,
                True,
                f"{cut}; uv finished on the host and {svc.package} "
                f"{settled.installed} is installed",
            )
        )
        return "ok", ""
    if not r.ok:
        why = failed_msg(what, r, svc.install_timeout_s)
        yield Emit(EndStep(step, False, why, r.exit_status))
        return "failed", why
    yield Emit(EndStep(step, True, done, r.exit_status))
    return "ok", ""
