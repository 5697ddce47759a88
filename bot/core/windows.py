"""Maintenance windows: is a change allowed now, when is the next chance, and what time
``--at`` names. Pure: every function takes the instant it judges.

The occurrences of each weekday range come from dateutil's ``rrule`` (a kept calendar
library, not calendar code of ours). Wall times are read in the window's time zone and
compared as UTC instants, so daylight saving time moves a window with the local clock:
a 02:00-04:00 window on the night clocks go forward is one hour long, and on the night
they go back two wall hours are three real ones. A start that falls in the skipped hour
is the instant that wall time would have been (zoneinfo's ``fold=0``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from dateutil.rrule import DAILY, rrule

from bot.settings.windows import DAY_NAMES, OpenRange, WindowSettings

# How far ahead the next window is looked for: past a year there is none worth naming.
HORIZON = timedelta(days=400)


@dataclass(frozen=True, slots=True)
class Windows:
    """One policy's windows, ready to judge instants."""

    zone: ZoneInfo
    ranges: tuple[OpenRange, ...]
    blackouts: tuple[tuple[date, date], ...]
    text: str

    @classmethod
    def of(cls, settings: WindowSettings) -> Windows:
        return cls(settings.zone(), settings.ranges(), settings.blackouts(), describe(settings))

    # ---- judging ----------------------------------------------------------------------

    def is_open(self, t: datetime) -> bool:
        return not self._blacked_out(t) and self._in_range(t)

    def next_open(self, t: datetime) -> datetime | None:
        """``t`` itself when open, else the first instant after it that is (None: none
        within a year: every day blacked out, say)."""
        if self.is_open(t):
            return t
        best: datetime | None = None
        for start, end in self._periods(t):
            if best is not None and start >= best:
                break
            c = max(start, t)
            while c < end and self._blacked_out(c):
                c = self._next_midnight(c)
            if c < end and (best is None or c < best):
                best = c
        return best

    def closes_after(self, t: datetime) -> datetime | None:
        """When the open stretch holding ``t`` ends (adjacent or overlapping ranges are
        one stretch, a blackout day cuts it); None when ``t`` is not open, or when it
        stays open for as far as this looks (1,000 stretches)."""
        if not self.is_open(t):
            return None
        end = t
        for _ in range(1000):
            nxt = self._stretch_end(end)
            if nxt is None or nxt <= end:
                return end
            midnight = self._next_midnight(end)
            while midnight < nxt:
                if self._blacked_out(midnight):
                    return midnight
                midnight = self._next_midnight(midnight)
            end = nxt
            if not self.is_open(end):
                return end
        return None

    # ---- the parts --------------------------------------------------------------------

    def _local(self, t: datetime) -> datetime:
        return t.astimezone(self.zone)

    def _blacked_out(self, t: datetime) -> bool:
        day = self._local(t).date()
        return any(a <= day <= b for a, b in self.blackouts)

    def _next_midnight(self, t: datetime) -> datetime:
        day = self._local(t).date() + timedelta(days=1)
        return datetime.combine(day, time(0), self.zone).astimezone(UTC)

    def _in_range(self, t: datetime) -> bool:
        if not self.ranges:
            return True
        return any(start <= t < end for start, end in self._periods(t - timedelta(days=2), t))

    def _stretch_end(self, t: datetime) -> datetime | None:
        """The latest end of a period (or blackout-free day, with no ranges) holding ``t``."""
        if not self.ranges:
            return self._next_midnight(t)
        ends = [end for start, end in self._periods(t - timedelta(days=2), t) if start <= t < end]
        return max(ends) if ends else None

    def _periods(
        self, since: datetime, until: datetime | None = None
    ) -> Iterator[tuple[datetime, datetime]]:
        """Every range's occurrences (UTC start, end) that end after ``since``, in order of
        start, up to ``until`` (default: a year on)."""
        if not self.ranges:
            # Always open but for blackouts: one period from the start of the day on.
            start = datetime.combine(self._local(since).date(), time(0), self.zone)
            yield start.astimezone(UTC), (start + HORIZON).astimezone(UTC)
            return
        last = (until if until is not None else since + HORIZON).astimezone(self.zone)
        first = self._local(since) - timedelta(days=2)
        rules = [
            (
                r,
                rrule(
                    DAILY,
                    byweekday=r.days,
                    byhour=r.start.hour,
                    byminute=r.start.minute,
                    bysecond=0,
                    dtstart=first.replace(tzinfo=None, second=0, microsecond=0),
                    until=last.replace(tzinfo=None),
                ),
            )
            for r in self.ranges
        ]
        found: list[tuple[datetime, datetime]] = []
        for r, rule in rules:
            for naive in rule:
                start = naive.replace(tzinfo=self.zone)
                end_day = naive.date() + timedelta(
                    days=1 if r.end is None or r.crosses_midnight else 0
                )
                end = datetime.combine(end_day, r.end or time(0), self.zone)
                s, e = start.astimezone(UTC), end.astimezone(UTC)
                if e > since:
                    found.append((s, e))
        yield from sorted(found)


def describe(settings: WindowSettings) -> str:
    """How a card or a refusal names the windows: ``Mon-Fri 01:00-05:00 (Europe/Berlin);
    blackout 2026-12-24``."""
    opened = ", ".join(settings.open) if settings.open else "always"
    text = f"{opened} ({settings.timezone})"
    if settings.blackout:
        text += "; blackout " + ", ".join(settings.blackout)
    return text


def when(t: datetime, zone: ZoneInfo) -> str:
    """``Fri 2026-12-04 02:00 CET``: an instant as the window's readers think of it."""
    local = t.astimezone(zone)
    return f"{DAY_NAMES[local.weekday()]} {local:%Y-%m-%d %H:%M} {local.tzname()}"


def countdown(seconds: float) -> str:
    """``3 h 05 min``, ``12 min``, ``under a minute``: the card's countdown."""
    if seconds < 60:
        return "under a minute"
    minutes = int(seconds // 60)
    days, minutes = divmod(minutes, 1440)
    hours, minutes = divmod(minutes, 60)
    if days:
        return f"{days} d {hours} h"
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min"


def parse_at(text: str, *, now: datetime, zone: ZoneInfo) -> datetime:
    """What ``--at`` names, as a UTC instant: ``02:00`` (the next 02:00 in ``zone``),
    ``2026-12-04T02:00`` (in ``zone``), or an ISO 8601 time with its own offset
    (``2026-12-04T01:00Z``). Raises ValueError with a sentence for the person."""
    raw = text.strip()
    try:
        if len(raw) == 5 and raw[2] == ":":
            clock = time.fromisoformat(raw)
            local_now = now.astimezone(zone)
            at = datetime.combine(local_now.date(), clock, zone)
            if at <= local_now:
                at = datetime.combine(local_now.date() + timedelta(days=1), clock, zone)
            return at.astimezone(UTC)
        parsed = datetime.fromisoformat(raw.replace("z", "Z"))
    except ValueError:
        raise ValueError(
            f"--at {text!r} is not a time: write 02:00, 2026-12-04T02:00 or 2026-12-04T01:00Z"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=zone)
    return parsed.astimezone(UTC)
