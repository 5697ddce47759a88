"""A big fleet's ``/vllm gpus`` answer in Block Kit (``bot.hosts.fleet_states``): the
counts per state, then a section per state that needs a look naming its hosts (as many
as fit Slack's 3,000 characters a section, at most ``MAX_NAMED``, then "and N more"),
and a line saying the full table is the file in the thread. Pure: data in, message out.
"""

from __future__ import annotations

from collections.abc import Sequence

from bot.hosts.fleet import HostGpus
from bot.hosts.fleet_states import (
    MAX_NAMED,
    NAMED,
    FleetStates,
    HostState,
    counts_line,
    fleet_states,
    short,
)
from bot.slack.block_kit import MAX_SECTION_TEXT, Message, context, escape, message, section

_TITLE = {
    HostState.UNHEALTHY: "Unhealthy",
    HostState.UNREACHABLE: "Unreachable",
    HostState.WARN: "Warnings",
}
# Room kept at a section's end for its "and N more" line.
_TAIL_ROOM = 80


def named_section(states: FleetStates, state: HostState) -> str | None:
    """``*Unhealthy (8)*`` and a line per host, cut to one section; None when none."""
    hosts = states.of(state)
    if not hosts:
        return None
    text = f"*{_TITLE[state]} ({len(hosts):,})*"
    shown = 0
    for j in hosts[:MAX_NAMED]:
        # No backtick from a host's text may open a code span the list cannot close.
        reason = short(j.reason).replace("`", "'")
        line = f"\n• `{escape(short(j.host, 64))}` {escape(reason)}"
        if len(text) + len(line) > MAX_SECTION_TEXT - _TAIL_ROOM:
            break
        text += line
        shown += 1
    if more := len(hosts) - shown:
        text += f"\n… and {more:,} more in the file"
    return text


def fleet_summary_message(title: str, results: Sequence[HostGpus], filename: str) -> Message:
    states = fleet_states(results)
    counts = counts_line(results, states)
    blocks = [section(f"*{escape(title)}*"), section(escape(counts))]
    blocks += [section(t) for t in (named_section(states, s) for s in NAMED) if t]
    blocks.append(context(f"Every host's line and per-GPU table: `{filename}` in the thread."))
    return message(f"{title}: {counts}", blocks)
