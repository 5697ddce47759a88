"""Side-by-side releases (issue 20, item 3): the venv's path is a symlink into
``<venv>.releases``. A redeploy builds the new release there and gates it with its own
interpreter while the old one serves (``build``); after the stop it only switches the
link (``switch_and_start``): no install and no download inside the outage. Every
failure from the start on switches the link back and restarts the previous release
(``switch_back``): no reinstall and no snapshot sync. After a successful run old
releases are pruned, never the live one nor the previous one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from bot.core import remote, remote_releases
from bot.core.cuda import GateVerdict
from bot.core.phases.actions import (
    BeginStep,
    Emit,
    EndStep,
    Flow,
    HostOutcome,
    Phase,
    ReleaseSwitch,
    pause,
    run,
    service_is,
    switch_history,
)
from bot.core.phases.common import (
    InstallEnd,
    explain,
    failed_msg,
    gate_refusal,
    judge_gate,
    lost,
    read_driver_cuda,
    reason_of,
    status_hint,
    tail_of,
)
from bot.core.phases.preflight import Env, pins_of
from bot.core.phases.rollback import stop_for_rollback
from bot.core.phases.start import StartFailed, left_as, postcheck, start_and_gate
from bot.core.phases.watch import watch_window
from bot.core.plan import Plan, Step, cmd
from bot.core.releases import (
    Releases,
    SwitchKind,
    Target,
    layout_refusal,
    parse_releases,
    release_of,
    rollback_target,
    to_prune,
)
from bot.core.results import CommandResult
from bot.core.service_state import ServiceState
from bot.core.status import HostStatus
from bot.core.unit_flags import NOT_READ, FlagVerdict, ServeCommand, step_note, verdict_of
from bot.core.versions import version_text
from bot.settings import ServiceSettings


@dataclass(frozen=True, slots=True)
class Built:
    """The new release, built and gated, and the one live before it (a rollback's way
    back)."""

    name: str
    previous: str


# Why the build ended a run before the stop: the layout is not side-by-side, the build
# itself failed, or the new release's own gate refused it.
BuildFailure = Literal["layout", "build", "gate", "flags"]


def read_releases(step: Step, svc: ServiceSettings) -> Phase[tuple[Releases | None, str]]:
    """The host's listing of the releases, or None and why it cannot be read."""
    argv = remote_releases.releases_list(svc)
    r = yield from run(step, argv, svc.command_timeout_s, quiet=True)
    layout = parse_releases(r.stdout, svc.venv_dir) if r.ok else None
    if layout is None:
        return None, f"`{cmd(argv)}`: {explain(r)}"
    return layout, ""


def rollback_target_of(plan: Plan, svc: ServiceSettings) -> Phase[tuple[str, Target | str]]:
    """A rollback by hand's preflight on the releases: the live release and where the
    rollback goes, with why (``bot.core.releases.rollback_target``, by the audit log's
    switches of this host), or why it cannot go anywhere (a refusal, nothing changed)."""
    layout, why = yield from read_releases(Step.PREFLIGHT, svc)
    refused = layout_refusal(svc, layout, why)
    if refused is not None or layout is None or layout.live is None:
        return "", refused or "no live release"
    history = yield from switch_history(plan.service)
    target = rollback_target(layout, history.switches, history.error or "")
    if isinstance(target, str):
        return layout.live, f"nothing to go back to in {svc.releases_dir}: {target}"
    return layout.live, target


def build(
    plan: Plan,
    svc: ServiceSettings,
    env: Env,
    target: str | None,
    serve: ServeCommand | str = NOT_READ,
) -> Phase[Built | tuple[BuildFailure, str]]:
    """Before the stop, while the old release serves: build the new release from the dry
    run's pinned set (its wheels reach uv's cache too), then let its own interpreter run
    the import and CUDA gate. A refused release is removed (never the live one). The
    built release, else which part ended the run and why (the service is untouched)."""
    layout, why = yield from read_releases(Step.BUILD, svc)
    pins = pins_of(env)
    name = remote_releases.release_name(target, pins)
    driver_cuda = yield from read_driver_cuda(Step.BUILD, svc)
    yield Emit(
        BeginStep(Step.BUILD, remote_releases.build_release_shown(svc, plan.index_url, name))
    )
    refused = layout_refusal(svc, layout, why)
    if refused is not None or layout is None or layout.live is None:
        said = refused or "no live release"
        yield Emit(EndStep(Step.BUILD, False, said))
        return "layout", said
    stdin = (remote.index_input(plan.index_url) or b"") + pins.encode()
    started = (yield from pause(0.0)).now
    r = yield from run(
        Step.BUILD,
        remote_releases.build_release(
            svc, name, plan.index_url, check_flags=isinstance(serve, ServeCommand)
        ),
        svc.install_timeout_s,
        stdin=stdin,
    )
    took = (yield from pause(0.0)).now - started
    lines = r.stdout.splitlines()
    # Cut off after the build (in the gate, or listing the help): a timeout, never a
    # gate's refusal, which would blame the new build for the clock.
    if remote_releases.BUILT_MARK not in lines or lost(r) or r.timed_out:
        failed = (
            "connection lost during the build"
            if lost(r)
            else failed_msg(f"building release {name}", r, svc.install_timeout_s)
        )
        yield Emit(EndStep(Step.BUILD, False, failed, r.exit_status))
        return "build", (
            f"{failed}: {tail_of(r.output, 3)}" if not r.timed_out and not lost(r) else failed
        )
    report, verdict = judge_gate(r, svc, target=target, driver_cuda=driver_cuda)
    how = "reused (already built)" if remote_releases.REUSED_MARK in lines else "built"
    done = f"release {name} {how} in {took:.1f}s"
    if not verdict.ok:
        gate_why = gate_refusal(verdict, report, r)
        refusal = (
            f"the new release's import gate refused it before the stop ({verdict.check} "
            f"check failed: {gate_why})"
        )
        removed = yield from _remove_refused(svc, name, layout.live)
        yield Emit(EndStep(Step.BUILD, False, f"{done}; {refusal}; {removed}", r.exit_status))
        return "gate", f"{refusal}; {removed}"
    flags = verdict_of(r.stdout, serve, svc.package, report.vllm if report else target)
    ended = yield from _end_build(svc, name, layout.live, done, r, verdict, flags)
    if ended is not None:
        return ended
    return Built(name, layout.live)


def _end_build(
    svc: ServiceSettings,
    name: str,
    live: str,
    done: str,
    r: CommandResult,
    verdict: GateVerdict,
    flags: FlagVerdict,
) -> Phase[tuple[BuildFailure, str] | None]:
    """The build step's end once its gate passed: the unit's flags judged against the
    release's own help (a refused release is removed). None when the run goes on."""
    if flags.outcome == "refused":
        refusal = f"the new release refuses the unit's flags: {flags.reason}"
        removed = yield from _remove_refused(svc, name, live)
        yield Emit(EndStep(Step.BUILD, False, f"{done}; {refusal}; {removed}", r.exit_status))
        return "flags", f"{flags.reason}; {removed}"
    note, unchecked = step_note(flags)
    warnings = [w for w in (verdict.warning, unchecked) if w]
    yield Emit(
        EndStep(
            Step.BUILD,
            True,
            f"{done}; it passed the import gate: {verdict.reason}; {note}",
            r.exit_status,
            "\n".join(f"WARNING: {w}" for w in warnings),
        )
    )
    return None


def _remove_refused(svc: ServiceSettings, name: str, live: str) -> Phase[str]:
    """Remove a release its gate refused; never the live one (the script refuses it too)."""
    if name == live:
        return f"release {name} is the live one and stays"
    r = yield from run(
        Step.BUILD, remote_releases.prune_releases(svc, (name,)), svc.command_timeout_s, quiet=True
    )
    if r.ok:
        return f"release {name} removed"
    return f"removing release {name} failed ({explain(r)})"


# Each switch step and what its switch is to the history (``bot.core.releases``).
_SWITCH_KINDS = {Step.SWITCH: SwitchKind.SWITCH, Step.ROLLBACK_SWITCH: SwitchKind.SWITCH_BACK}


def _switch(
    plan: Plan, svc: ServiceSettings, step: Step, name: str
) -> Phase[tuple[InstallEnd, str]]:
    """Point the venv's link at release ``name`` (atomically: a new link, then rename(2)
    over the old one). ``unknown`` when the result never came back. A switch made is an
    audit row, with the release the script saw the link leave."""
    yield Emit(BeginStep(step, remote_releases.switch_shown(svc, name)))
    r = yield from run(step, remote_releases.switch_release(svc, name), svc.command_timeout_s)
    if lost(r):
        why = f"connection lost during the switch ({reason_of(r)})"
        yield Emit(EndStep(step, False, why))
        return "unknown", why
    said = [
        ln[len(remote_releases.SWITCHED_MARK) :].strip()
        for ln in r.stdout.splitlines()
        if ln.startswith(remote_releases.SWITCHED_MARK)
    ]
    if not r.ok or not said:
        why = f"{failed_msg('the switch', r, svc.command_timeout_s)}: {tail_of(r.output, 2)}"
        yield Emit(EndStep(step, False, why, r.exit_status))
        return "failed", why
    # "<old target> -> <new target>": the old one as readlink printed it.
    before = release_of(said[0].rpartition(" -> ")[0], svc.venv_dir)
    yield Emit(EndStep(step, True, f"{svc.venv_dir} -> {svc.releases_dir}/{name}", r.exit_status))
    yield Emit(ReleaseSwitch(plan.service, before, name, _SWITCH_KINDS[step]))
    return "ok", ""


def _live_note(svc: ServiceSettings) -> Phase[str]:
    """Which release is live, as the host's link says now (for the post-check)."""
    layout, why = yield from read_releases(Step.POSTCHECK, svc)
    if layout is None:
        return f"live release unknown ({why})"
    return f"live release {layout.live or '?'} ({svc.venv_dir} -> {layout.target})"


def _by_hand(svc: ServiceSettings, name: str) -> str:
    """What an operator types to go back to release ``name`` by hand."""
    return f"`{remote_releases.switch_shown(svc, name)}` then `{cmd(remote.unit_start(svc))}`"


def switch_and_start(
    plan: Plan, svc: ServiceSettings, host: str, before: str | None, built: Built
) -> Flow:
    """The service is stopped and its GPUs free: switch the link to the new release,
    start, health-gate, watch, post-check, prune. Nothing is installed here."""
    verdict, why = yield from _switch(plan, svc, Step.SWITCH, built.name)
    match verdict:
        case "unknown":
            stopped = ServiceState.STOPPED
            return HostOutcome(
                HostStatus.FAILED,
                f"{why}. Whether {svc.venv_dir} points at {built.name} or still at "
                f"{built.previous} is unknown, and {service_is(stopped, mid=True)}. "
                f"{status_hint(plan.service)} once the host answers.",
                stopped,
                before,
                None,
            )
        case "failed":
            # The rename never happened: the link still points at the previous release.
            return (
                yield from _start_previous(
                    plan, svc, host, before, f"switching to release {built.name} failed: {why}"
                )
            )
        case "ok":
            pass
    err = yield from start_and_gate(svc, Step.START, Step.HEALTH)
    watched = None
    if err is None:
        watched = yield from watch_window(svc)
        if isinstance(watched, StartFailed):
            err = watched
    if err is not None:
        return (yield from switch_back(plan, svc, host, before, err, built))
    note = yield from _live_note(svc)
    after = yield from postcheck(svc, host, note)
    if watched == "cancelled":
        return HostOutcome(
            HostStatus.CANCELLED,
            f"{svc.package} {version_text(before)} -> {version_text(after)}, healthy; "
            "cancelled during the watch window: "
            f"watching stopped, release {built.name} is left live",
            ServiceState.UP,
            before,
            after,
        )
    pruned = yield from prune(svc, built)
    return HostOutcome(
        HostStatus.SUCCEEDED,
        f"{svc.package} {version_text(before)} -> {version_text(after)}, healthy"
        + (f", watched {svc.watch_s:g}s clean" if svc.watch_s > 0 else "")
        + (
            f"; release {built.name} is live, {built.previous} kept to roll back to{pruned}"
            if built.name != built.previous
            else f"; release {built.name} (the same pinned set as before) is live{pruned}"
        ),
        ServiceState.UP,
        before,
        after,
    )


def switch_back(
    plan: Plan, svc: ServiceSettings, host: str, before: str | None, err: StartFailed, built: Built
) -> Flow:
    """The new release never turned healthy (or failed its watch window): stop it, switch
    the link back to the previous release and start that (``rollback_on_unhealthy``, the
    default), or stop there and say how to switch back."""
    if not svc.rollback_on_unhealthy:
        state, left = yield from left_as(svc, Step.HEALTH, err)
        return HostOutcome(
            HostStatus.FAILED,
            f"{err.reason}. Release {built.name} is live and not healthy; "
            f"rollback_on_unhealthy is off, so nothing was switched back. {left} Switch "
            f"back with: {_by_hand(svc, built.previous)}",
            state,
            before,
            None,
        )
    stop_failed = yield from stop_for_rollback(svc, host)
    if stop_failed is not None:
        stopped, state = stop_failed
        return HostOutcome(
            HostStatus.FAILED,
            f"{err.reason}; stopping it to switch back failed: {stopped}. Nothing was "
            f"switched back. Switch back with: {_by_hand(svc, built.previous)}",
            state,
            before,
            None,
        )
    verdict, why = yield from _switch(plan, svc, Step.ROLLBACK_SWITCH, built.previous)
    if verdict != "ok":
        stopped = ServiceState.STOPPED
        return HostOutcome(
            HostStatus.FAILED,
            f"{err.reason}; switching back to release {built.previous} failed: {why}. "
            f"{service_is(stopped)}; switch back with: {_by_hand(svc, built.previous)}",
            stopped,
            before,
            None,
        )
    return (yield from _start_previous(plan, svc, host, before, err.reason))


def _start_previous(
    plan: Plan, svc: ServiceSettings, host: str, before: str | None, cause: str
) -> Flow:
    """The link points at the previous release again (or never left it): start it."""
    err = yield from start_and_gate(svc, Step.ROLLBACK_START, Step.ROLLBACK_HEALTH)
    if err is not None:
        state, left = yield from left_as(svc, Step.ROLLBACK_HEALTH, err)
        return HostOutcome(
            HostStatus.FAILED,
            f"{cause}; back on the previous release but {err.reason}. {left}",
            state,
            before,
            None,
        )
    note = yield from _live_note(svc)
    after = yield from postcheck(svc, host, note)
    return HostOutcome(
        HostStatus.ROLLED_BACK,
        f"{cause}; switched back: {note} serves {svc.package} {version_text(after)}, healthy "
        "(nothing reinstalled)",
        ServiceState.UP,
        before,
        after,
    )


def prune(svc: ServiceSettings, built: Built) -> Phase[str]:
    """Keep ``keep_releases`` releases: never the live one, nor the one this run switched
    away from. What the outcome adds ("" when nothing needed removing)."""
    yield Emit(
        BeginStep(Step.PRUNE, f"{cmd(remote_releases.releases_list(svc))}; remove the oldest")
    )
    layout, why = yield from read_releases(Step.PRUNE, svc)
    if layout is None:
        yield Emit(EndStep(Step.PRUNE, False, f"cannot list the releases: {why}"))
        return f"; pruning skipped: cannot list the releases ({why})"
    doomed = to_prune(layout, svc.keep_releases, (built.previous, built.name))
    if not doomed:
        yield Emit(EndStep(Step.PRUNE, True, f"{len(layout.releases)} releases, none removed"))
        return ""
    r = yield from run(
        Step.PRUNE, remote_releases.prune_releases(svc, doomed), svc.command_timeout_s
    )
    if not r.ok:
        failed = f"{failed_msg('the prune', r, svc.command_timeout_s)}: {tail_of(r.output, 2)}"
        yield Emit(EndStep(Step.PRUNE, False, failed, r.exit_status))
        return f"; {failed}"
    kept = [n for n in layout.names() if n not in doomed]
    yield Emit(
        EndStep(
            Step.PRUNE,
            True,
            f"removed {', '.join(doomed)}; kept {', '.join(kept)}",
            r.exit_status,
        )
    )
    return f"; pruned {len(doomed)} old release{'s' if len(doomed) != 1 else ''}"
