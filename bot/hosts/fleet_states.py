"""A big fleet's GPU answer as counts per state, with the hosts that need a look named.

Past ``SUMMARY_OVER_HOSTS`` hosts a line per host no longer fits one chat message, and a
message that shows the first 25 of 1,000 hosts hides which ones are down. So a big
fleet's answer is the count of hosts in each state, the unhealthy, unreachable and warn
hosts named (each list bounded, "and N more"), and the full table as a file.

A host's state is one of four, judged from its row, never guessed:

- ``unreachable``: no answer at all (connect refused, host key refused, the timeout);
- ``unhealthy``: it answered but its GPUs could not be read (no driver, a bad
  nvidia-smi), or a GPU is critical (a pending row remap, an Xid that needs a reset);
- ``warn``: a GPU has a warning, or the GPUs' health could not be read (unknown is
  never healthy; the count says how many of these are unknown);
- ``healthy``: GPUs read, every one of them ok.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from bot.core.health import Level
from bot.hosts.fleet import HostGpus, fleet_counts, host_lines, render_fleet

# Fleets of more hosts than this get the per-state summary and the file; smaller ones
# keep the per-host answer (the full tables, or a line per host, problem hosts first).
SUMMARY_OVER_HOSTS = 100
# A named host's reason is cut to this; the list shows at most MAX_NAMED per state.
REASON_CHARS = 80
MAX_NAMED = 20


class HostState(StrEnum):
    HEALTHY = "healthy"
    WARN = "warn"
    UNHEALTHY = "unhealthy"
    UNREACHABLE = "unreachable"


# The order states are counted and named in: worst first.
NAMED = (HostState.UNHEALTHY, HostState.UNREACHABLE, HostState.WARN)


@dataclass(frozen=True, slots=True)
class Judged:
    host: str
    state: HostState
    reason: str  # why it is not healthy ("" for a healthy host)
    health_unknown: bool = False


def judge_host(r: HostGpus) -> Judged:
    if r.snapshot is None:
        state = HostState.UNREACHABLE if r.unreachable else HostState.UNHEALTHY
        return Judged(r.host, state, r.error or "no answer")
    if r.health is None:
        return Judged(
            r.host, HostState.WARN, f"health unknown: {r.health_error or 'not read'}", True
        )
    level = r.health.level()
    if level == Level.OK:
        return Judged(r.host, HostState.HEALTHY, "")
    state = HostState.UNHEALTHY if level == Level.CRITICAL else HostState.WARN
    # The summary names the GPUs and what is wrong with them.
    return Judged(r.host, state, r.health.summary())


@dataclass(frozen=True, slots=True)
class FleetStates:
    judged: tuple[Judged, ...]

    def of(self, state: HostState) -> list[Judged]:
        return [j for j in self.judged if j.state == state]

    def count(self, state: HostState) -> int:
        return sum(1 for j in self.judged if j.state == state)

    @property
    def health_unknown(self) -> int:
        return sum(1 for j in self.judged if j.health_unknown)


def fleet_states(results: Sequence[HostGpus]) -> FleetStates:
    return FleetStates(tuple(map(judge_host, results)))


def counts_line(results: Sequence[HostGpus], states: FleetStates) -> str:
    """``1,000 hosts: 962 healthy, 20 warn (4 health unknown), 8 unhealthy, 10
    unreachable; 7,824 GPUs: 7,800 busy, 24 idle``"""
    c = fleet_counts(results)
    parts = []
    for state in (HostState.HEALTHY, HostState.WARN, HostState.UNHEALTHY, HostState.UNREACHABLE):
        part = f"{states.count(state):,} {state}"
        if state == HostState.WARN and states.health_unknown:
            part += f" ({states.health_unknown:,} health unknown)"
        parts.append(part)
    return (
        f"{len(results):,} hosts: {', '.join(parts)}; "
        f"{c.gpus:,} GPUs: {c.busy:,} busy, {c.idle:,} idle"
    )


def short(text: str, width: int = REASON_CHARS) -> str:
    """One line of at most ``width`` characters: host text ends up in chat and terminals."""
    text = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def named(states: FleetStates, state: HostState, limit: int = MAX_NAMED) -> tuple[list[str], int]:
    """The first ``limit`` hosts in ``state`` as ``host: reason`` lines, and how many
    more there are."""
    hosts = states.of(state)
    return [f"{short(j.host, 64)}: {short(j.reason)}" for j in hosts[:limit]], max(
        len(hosts) - limit, 0
    )


def summary_text(results: Sequence[HostGpus], *, limit: int = MAX_NAMED) -> str:
    """The plain-text summary (the CLI's, and the top of the file)."""
    states = fleet_states(results)
    lines = [counts_line(results, states)]
    for state in NAMED:
        shown, more = named(states, state, limit)
        if not shown:
            continue
        lines.append(f"\n{state.upper()} ({states.count(state):,}):")
        lines += [f"  {line}" for line in shown]
        if more:
            lines.append(f"  and {more:,} more (see the table)")
    return "\n".join(lines)


def host_table(results: Sequence[HostGpus]) -> str:
    """A line per host, in the order given."""
    return "\n".join(host_lines(results))


def fleet_file(results: Sequence[HostGpus]) -> str:
    """What a big fleet's answer uploads: the summary with every problem host named, a
    line per host, then every host's per-GPU table."""
    every = max(len(results), 1)
    return "\n\n".join(
        [summary_text(results, limit=every), host_table(results), render_fleet(results)]
    )


def is_big(results: Sequence[HostGpus]) -> bool:
    return len(results) > SUMMARY_OVER_HOSTS
