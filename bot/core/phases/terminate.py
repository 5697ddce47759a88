"""Leftover workers that outlive the stop (issue 12): whose they are, an approver's go,
then SIGTERM and SIGKILL to exactly the service's own, and the drain resumes."""

from __future__ import annotations

from typing import Literal

from bot.core.gpu import DrainVerdict
from bot.core.leftovers import (
    Leftover,
    Owner,
    ProcFacts,
    candidates,
    classify,
    facts_query,
    memory_without_process,
    parse_facts,
    parse_signalled,
    prompt,
    service_name,
    shown_signal,
    signal_command,
    unit_user_query,
)
from bot.core.phases.actions import BeginStep, Emit, EndStep, Phase, ask, pause, run
from bot.core.phases.common import DrainEnd, explain
from bot.core.phases.stop import drain_gpus, drain_poll
from bot.core.plan import Step
from bot.errors import GpuQueryError
from bot.settings import ServiceSettings

LeftoverEnd = Literal["cleaned", "failed", "cancelled"]


def drain_clean(svc: ServiceSettings, host: str) -> Phase[tuple[DrainEnd, str | None]]:
    """The drain; when it times out on processes of the service itself (workers that
    outlived the unit), an approver may have them terminated, and the drain resumes."""
    end, reason = yield from drain_gpus(svc, host)
    if end != "failed":
        return end, reason
    try:
        _, verdict = yield from drain_poll(svc, host)
    except GpuQueryError:
        return end, reason  # the host did not answer or nvidia-smi failed: nothing to judge
    if not verdict.drained:
        cleaned, why = yield from _leftovers(svc, host, verdict, reason or "")
        if cleaned == "cancelled":
            return "cancelled", None
        if cleaned == "failed":
            return "failed", why
    return (yield from drain_gpus(svc, host))  # terminated, or released meanwhile


def _leftovers(
    svc: ServiceSettings, host: str, verdict: DrainVerdict, timed_out: str
) -> Phase[tuple[LeftoverEnd, str]]:
    """Whose processes still hold the service's GPUs; only when every one is the
    service's own, an approver's go, then SIGTERM and SIGKILL to exactly those."""
    found = candidates(verdict)
    if found.missing or not (found.processes or found.memory_only):
        return "failed", timed_out
    if not found.processes:
        return "failed", (
            f"{timed_out}. It needs a GPU reset or a reboot: "
            f"{memory_without_process(host, found.memory_only)}"
        )
    pids = [p for p, *_ in found.processes]
    r = yield from run(Step.DRAIN, facts_query(pids), svc.command_timeout_s, quiet=True)
    u = yield from run(
        Step.DRAIN, unit_user_query(svc.unit, svc.systemctl), svc.command_timeout_s, quiet=True
    )
    if r.exit_status not in (0, 1) or not u.ok:
        bad = r if r.exit_status not in (0, 1) else u
        return "failed", f"{timed_out}; whose processes they are is unknown ({explain(bad)})"
    # A unit with no User= runs as root, but a root VLLM:: process outside every unit
    # may be anyone's (a `vllm serve` in an admin's session): only the unit's cgroup
    # makes it the service's then. The host's signal script judges the same way.
    leftovers = classify(found, parse_facts(r.stdout), svc.unit, u.stdout.strip())
    others = [x.describe() for x in leftovers if x.owner == Owner.OTHER]
    if others:
        return "failed", (
            f"{timed_out}. Processes that are not {svc.unit}'s hold its GPUs; "
            f"they were not signalled: {'; '.join(others)}"
        )
    ours = [x for x in leftovers if x.owner == Owner.SERVICE]
    stuck = [x for x in ours if x.facts is not None and x.facts.uninterruptible]
    if stuck:
        return "failed", (
            f"{timed_out}. It needs a GPU reset or a reboot: "
            + "; ".join(
                f"{x.describe()}, in uninterruptible sleep (state "
                f"{x.facts.state if x.facts else '?'}): no signal "
                "reaches it"
                for x in stuck
            )
        )
    if not ours:
        return "cleaned", ""  # they all exited meanwhile
    answer = yield from ask(prompt(host, svc.unit, ours), tuple(x.pid for x in ours))
    if (yield from pause()).cancel_requested:
        return "cancelled", ""
    if answer.approved_by is None:
        return "failed", (
            f"{timed_out}. The leftover processes were not terminated: {answer.reason}"
        )
    return (yield from _terminate(svc, host, ours, answer.approved_by, timed_out))


def _terminate(
    svc: ServiceSettings, host: str, ours: list[Leftover], approved_by: str, timed_out: str
) -> Phase[tuple[LeftoverEnd, str]]:
    """SIGTERM, wait, SIGKILL to those that remain, wait: each signal only to a PID whose
    start time is unchanged. One that survives SIGKILL needs a GPU reset or a reboot."""
    targets = [x.facts for x in ours if x.facts is not None]
    yield Emit(
        BeginStep(
            Step.LEFTOVERS,
            f"approved by {approved_by}: "
            f"{shown_signal('TERM', targets)}; after up to {svc.kill_grace_s:g}s "
            "SIGKILL to any that remain",
        )
    )
    remaining = targets
    for sig in ("TERM", "KILL"):
        if not remaining:
            break
        r = yield from run(
            Step.LEFTOVERS,
            signal_command(sig, remaining, svc.unit, svc.systemctl, ps=svc.ps, kill=svc.kill),
            svc.command_timeout_s,
        )
        refused = sorted(p for p, what in parse_signalled(r.stdout).items() if what == "refused")
        if refused:
            # The host's own check disagreed with ours (the process changed owner since
            # the approver saw it): nothing more is signalled.
            msg = (
                f"the host refused to signal PID(s) {', '.join(map(str, refused))}: not in "
                f"{service_name(svc.unit)}'s cgroup, nor a VLLM:: process of its user"
            )
            yield Emit(EndStep(Step.LEFTOVERS, False, msg))
            return "failed", f"{timed_out}. {msg}"
        remaining = yield from _still_running(svc, host, remaining)
    if remaining:
        states = "; ".join(f"PID {t.pid} state {t.state}" for t in remaining)
        msg = (
            f"{len(remaining)} process(es) survived SIGKILL ({states}): it needs a GPU reset "
            "or a reboot"
        )
        yield Emit(EndStep(Step.LEFTOVERS, False, msg))
        return "failed", f"{timed_out}. {msg}"
    yield Emit(
        EndStep(
            Step.LEFTOVERS,
            True,
            f"{len(targets)} leftover process(es) ended "
            f"({', '.join(str(t.pid) for t in targets)}), approved by {approved_by}",
        )
    )
    return "cleaned", ""


def _still_running(
    svc: ServiceSettings, host: str, targets: list[ProcFacts]
) -> Phase[list[ProcFacts]]:
    """Poll until every target has exited (or is a zombie, holding nothing), at most
    ``kill_grace_s``; the targets still running then, with their state now."""
    start = (yield from pause(0.0)).now
    remaining = targets
    while True:
        r = yield from run(
            Step.LEFTOVERS, facts_query(t.pid for t in remaining), svc.command_timeout_s, quiet=True
        )
        if r.exit_status in (0, 1):
            now = parse_facts(r.stdout)
            remaining = [
                now[t.pid]
                for t in remaining
                if t.pid in now and now[t.pid].started == t.started and not now[t.pid].zombie
            ]
        if not remaining:
            return []
        tick = yield from pause(svc.drain_poll_s)
        if tick.now - start >= svc.kill_grace_s:
            return remaining
