"""The watch window after a start (issue 20, item 4): ``/health`` can answer 200 while
vLLM's engine is dead or hung (vllm-project/vllm#39863, #36960), so "ready once" is not
"works". For ``watch_s`` after readiness, every ``watch_interval_s``: the unit's state
(``systemctl show``), ``/health``, the journal's new lines against the known failure
lines (``bot.core.startup.failure_of``) and, when a smoke prompt is configured, the
smoke completion. Time is the flow's clock (``pause``); one step holds every round's
result (bounded), so the thread gets one updated step, not a message per check."""

from __future__ import annotations

from typing import Literal

from bot.core import remote
from bot.core.phases.actions import BeginStep, Emit, EndStep, Phase, Progress, http, pause, run
from bot.core.phases.common import HEALTH_REQUEST_TIMEOUT_S, http_why, reason_of, unit_state
from bot.core.phases.ready import serves
from bot.core.phases.start import StartFailed
from bot.core.plan import Step, watch_command
from bot.core.startup import clean, duration, failure_of, new_lines
from bot.settings import ServiceSettings

# The rounds kept in the step's output: the first and the latest (bounded output).
_ROUNDS_KEPT = 20

WatchEnd = StartFailed | Literal["cancelled"] | None


def watch_window(svc: ServiceSettings) -> Phase[WatchEnd]:
    """None when the window ended clean; ``"cancelled"`` when a cancel came during it
    (watching stops, the new version is left running); else why it failed, with when in
    the window, handled like a failed readiness."""
    if svc.watch_s <= 0:
        return None
    step = Step.WATCH
    yield Emit(BeginStep(step, watch_command(svc)))
    c = yield from run(step, remote.journal_cursor(svc), svc.command_timeout_s, quiet=True)
    cursor = new_lines(c.stdout)[1] if c.ok else None
    start = (yield from pause()).now
    rounds: list[str] = []
    n = 0
    while True:
        tick = yield from pause(svc.watch_interval_s)
        elapsed = tick.now - start
        if tick.cancel_requested:
            rounds.append(f"cancelled at {duration(elapsed)}: watching stopped")
            yield Emit(EndStep(step, True, _summary(n, elapsed, "cancelled"), None, _out(rounds)))
            return "cancelled"
        n += 1
        at = f"at {duration(elapsed)} of {duration(svc.watch_s)}"
        why, cursor = yield from _round(svc, cursor)
        if why is not None:
            reason = f"watch window: {why} ({at})"
            rounds.append(f"FAILED {at}: {why}")
            yield Emit(EndStep(step, False, reason, None, _out(rounds)))
            return StartFailed(reason, in_journal=why.startswith("journal:"))
        rounds.append(f"ok {at}")
        if elapsed < svc.watch_s:
            # In place on the card: a window of minutes must not look like a hang.
            yield Progress(step, f"{n} round(s) clean, {at}", elapsed)
        if elapsed >= svc.watch_s:
            yield Emit(EndStep(step, True, _summary(n, elapsed, "clean"), None, _out(rounds)))
            return None


def _round(svc: ServiceSettings, cursor: str | None) -> Phase[tuple[str | None, str | None]]:
    """One round of checks: why the service is failing, or None; and the journal cursor."""
    # The journal first: when the unit died, its lines say why.
    cause, cursor = yield from _journal_failure(svc, cursor)
    if cause is not None:
        return cause, cursor
    r, props = yield from unit_state(Step.WATCH, svc)
    if not r.ok:
        return f"systemctl show failed: {reason_of(r)}", cursor
    active = props.get("ActiveState", "?")
    if active != "active":
        # It may have died between the two reads: its last lines, read once more.
        cause, cursor = yield from _journal_failure(svc, cursor)
        dead = f"{svc.unit} is {active} ({props.get('SubState', '?')})"
        return (f"{cause}; {dead}" if cause else dead), cursor
    h = yield from http(svc.health_url, HEALTH_REQUEST_TIMEOUT_S)
    if h.status != 200:
        return f"GET {svc.health_url}: {http_why(h)}", cursor
    if svc.smoke_prompt is not None:
        return (yield from serves(svc)), cursor
    return None, cursor


def _journal_failure(
    svc: ServiceSettings, cursor: str | None
) -> Phase[tuple[str | None, str | None]]:
    """The first known failure line among the journal's new lines, and the new cursor."""
    j = yield from run(
        Step.WATCH, remote.journal_follow(svc, cursor), svc.command_timeout_s, quiet=True
    )
    if not j.ok:
        return None, cursor
    lines, newer = new_lines(j.stdout)
    for line in lines:
        if (why := failure_of(line)) is not None:
            return f"journal: {why}: {clean(line)[:300]}", newer or cursor
    return None, newer or cursor


def _summary(n: int, elapsed: float, how: str) -> str:
    return f"{n} round(s) of checks over {duration(elapsed)}, {how}"


def _out(rounds: list[str]) -> str:
    if len(rounds) <= _ROUNDS_KEPT:
        return "\n".join(rounds)
    half = _ROUNDS_KEPT // 2
    skipped = len(rounds) - 2 * half
    return "\n".join([*rounds[:half], f"... {skipped} round(s) ...", *rounds[-half:]])
