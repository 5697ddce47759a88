"""``[policy.windows]`` (and ``[services.NAME.policy.windows]``): when changes may run.

Issue 22, item 3. A window is a weekday/time range in one time zone::

    [policy.windows]
    timezone = "Europe/Berlin"
    open = ["Mon-Fri 01:00-05:00", "Sat,Sun 00:00-24:00", "Tue 22:00-02:00"]
    blackout = ["2026-12-24", "2026-12-31..2027-01-01"]

A range whose end is not after its start runs past midnight into the next day (the
last example: Tuesday 22:00 to Wednesday 02:00). Blackout dates are whole days in the
window's time zone, inclusive. ``open = []`` means always open except the blackout
days. The schedule itself is computed in ``bot.core.windows`` (with dateutil's rrule);
this module only reads and checks what the operator wrote, so a typo fails at start.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, time
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, field_validator

from bot.settings.base import Section

DAY_NAMES = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_DAY = {name.lower(): i for i, name in enumerate(DAY_NAMES)}
_RANGE_RE = re.compile(
    r"(?P<days>[A-Za-z,-]+)\s+(?P<start>\d{2}:\d{2})-(?P<end>\d{2}:\d{2})", re.ASCII
)


@dataclass(frozen=True, slots=True)
class OpenRange:
    """One ``open`` entry: the weekdays it starts on (0 = Monday), its start, and its
    end (``None``: midnight at the end of the day, written ``24:00``)."""

    days: tuple[int, ...]
    start: time
    end: time | None
    text: str

    @property
    def crosses_midnight(self) -> bool:
        return self.end is not None and self.end <= self.start


def _days(text: str) -> tuple[int, ...]:
    if text.lower() in ("daily", "every-day"):
        return tuple(range(7))
    days: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.partition("-")
        try:
            a = _DAY[first.lower()]
            b = _DAY[last.lower()] if dash else a
        except KeyError:
            raise ValueError(
                f"{part!r} is not a weekday or a range of them (Mon, Tue, ... Sun; "
                "Mon-Fri; Sat,Sun; daily)"
            ) from None
        # Fri-Mon wraps over the weekend, as a person reads it.
        days.update((a + i) % 7 for i in range((b - a) % 7 + 1))
    return tuple(sorted(days))


def _clock(text: str, *, end: bool) -> time | None:
    if end and text == "24:00":
        return None
    hours, minutes = int(text[:2]), int(text[3:])
    if hours > 23 or minutes > 59:
        raise ValueError(f"{text!r} is not a time of day (00:00 to 23:59; 24:00 as an end)")
    return time(hours, minutes)


def parse_range(text: str) -> OpenRange:
    m = _RANGE_RE.fullmatch(text.strip())
    if m is None:
        raise ValueError(
            f"{text!r} is not a window: write weekdays and a time range, for example "
            "'Mon-Fri 01:00-05:00' or 'daily 22:00-02:00'"
        )
    start = _clock(m["start"], end=False)
    assert start is not None
    end = _clock(m["end"], end=True)
    if end == start:
        raise ValueError(f"{text!r} starts and ends at the same time; write 00:00-24:00")
    return OpenRange(_days(m["days"]), start, end, text.strip())


def parse_blackout(text: str) -> tuple[date, date]:
    first, dots, last = text.strip().partition("..")
    try:
        a = date.fromisoformat(first)
        b = date.fromisoformat(last) if dots else a
    except ValueError:
        raise ValueError(
            f"{text!r} is not a blackout date: write 2026-12-24 or 2026-12-24..2026-12-26"
        ) from None
    if b < a:
        raise ValueError(f"{text!r} ends before it starts")
    return a, b


class WindowSettings(Section):
    """When this policy's changes (redeploy, restart, rollback) may start."""

    timezone: str = "UTC"
    open: list[str] = Field(default_factory=list)
    blackout: list[str] = Field(default_factory=list)
    # An emergency override (--now) outside a window needs this many approvals more than
    # the policy's min_approvals (0: as many as inside a window).
    override_extra_approvals: int = Field(1, ge=0)
    # How far ahead --at may schedule a run, and how late a scheduled run may still start
    # (a bot that was down at the scheduled time must not run it hours later).
    max_ahead_s: int = Field(7 * 86400, gt=0)
    start_grace_s: int = Field(900, gt=0)

    @field_validator("timezone")
    @classmethod
    def _zone(cls, v: str) -> str:
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"{v!r} is not an IANA time zone (for example UTC or Europe/Berlin)"
            ) from None
        return v

    @field_validator("open")
    @classmethod
    def _open(cls, v: list[str]) -> list[str]:
        for entry in v:
            parse_range(entry)
        return v

    @field_validator("blackout")
    @classmethod
    def _blackout(cls, v: list[str]) -> list[str]:
        for entry in v:
            parse_blackout(entry)
        return v

    def ranges(self) -> tuple[OpenRange, ...]:
        return tuple(parse_range(e) for e in self.open)

    def blackouts(self) -> tuple[tuple[date, date], ...]:
        return tuple(parse_blackout(e) for e in self.blackout)

    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)
