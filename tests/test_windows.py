"""Maintenance windows (issue 22 item 3): the schedule itself, pure, judged at given
instants (no clock read anywhere), both ways: a change inside a window is let through,
one outside it is held back, and each boundary is exact."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from bot.audit.records import RunRecord
from bot.core.plan import Plan, make_plan
from bot.core.policy import run_policy
from bot.core.status import Action, RunStatus, Source
from bot.core.windows import Windows, countdown, parse_at, when
from bot.engine.run_results import Refusal
from bot.engine.schedule import NotNow, RunAt, Timing, judge_request, start_refusal
from bot.errors import ConfigError
from bot.settings import PolicySettings, Settings, WindowSettings, load_settings

BERLIN = ZoneInfo("Europe/Berlin")


def utc(y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0) -> datetime:
    return datetime(y, mo, d, h, mi, s, tzinfo=UTC)


def berlin(y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0) -> datetime:
    return datetime(y, mo, d, h, mi, s, tzinfo=BERLIN).astimezone(UTC)


def windows(**kw: object) -> Windows:
    return Windows.of(WindowSettings.model_validate(kw))


WEEKNIGHTS = windows(timezone="Europe/Berlin", open=["Mon-Fri 01:00-05:00"])


# ---- open or not -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("t", "is_open"),
    [
        (berlin(2026, 12, 3, 0, 59), False),  # Thursday, a minute early
        (berlin(2026, 12, 3, 1, 0), True),  # the first instant belongs to the window
        (berlin(2026, 12, 3, 4, 59, 59), True),
        (berlin(2026, 12, 3, 5, 0), False),  # the end does not
        (berlin(2026, 12, 5, 2, 0), False),  # Saturday
        (berlin(2026, 12, 7, 2, 0), True),  # Monday
    ],
)
def test_a_weekday_range_is_open_from_its_start_to_just_before_its_end(
    t: datetime, is_open: bool
) -> None:
    assert WEEKNIGHTS.is_open(t) is is_open


def test_a_range_past_midnight_ends_the_next_day() -> None:
    w = windows(open=["Tue 22:00-02:00"])
    assert w.is_open(utc(2026, 12, 1, 23, 0))  # Tuesday night
    assert w.is_open(utc(2026, 12, 2, 1, 59))  # Wednesday, before 02:00
    assert not w.is_open(utc(2026, 12, 2, 2, 0))
    assert not w.is_open(utc(2026, 12, 2, 23, 0))  # Wednesday night is not Tuesday's
    # Adjacent ranges are one stretch: Tuesday night into the Wednesday morning window.
    both = windows(open=["Tue 22:00-02:00", "Wed 01:00-05:00"])
    assert both.closes_after(utc(2026, 12, 1, 23, 0)) == utc(2026, 12, 2, 5, 0)


def test_the_window_follows_the_local_clock_across_daylight_saving_time() -> None:
    # Berlin goes from CET (+1) to CEST (+2) at 02:00 on 29 March 2026, a Sunday; the
    # window is 01:00-05:00 local every day, so in UTC it moves an hour earlier.
    daily = windows(timezone="Europe/Berlin", open=["daily 01:00-05:00"])
    assert daily.is_open(utc(2026, 3, 28, 0, 0))  # 01:00 CET
    assert not daily.is_open(utc(2026, 3, 28, 4, 0))  # 05:00 CET
    assert daily.is_open(utc(2026, 3, 30, 2, 30))  # 04:30 CEST
    assert not daily.is_open(utc(2026, 3, 30, 3, 0))  # 05:00 CEST
    # The night of the change: 01:00 CET to 05:00 CEST is three real hours.
    assert daily.closes_after(utc(2026, 3, 29, 0, 0)) == utc(2026, 3, 29, 3, 0)


def test_blackout_days_close_a_window_that_would_be_open() -> None:
    w = windows(
        timezone="Europe/Berlin", open=["daily 00:00-24:00"], blackout=["2026-12-24..2026-12-26"]
    )
    assert w.is_open(berlin(2026, 12, 23, 23, 59))
    assert not w.is_open(berlin(2026, 12, 24, 0, 0))
    assert not w.is_open(berlin(2026, 12, 26, 23, 59))
    assert w.next_open(berlin(2026, 12, 24, 12, 0)) == berlin(2026, 12, 27, 0, 0)
    # No ranges: always open but for the blackouts.
    only = windows(blackout=["2026-12-24"])
    assert only.is_open(utc(2026, 12, 23, 12, 0))
    assert not only.is_open(utc(2026, 12, 24, 12, 0))
    assert only.closes_after(utc(2026, 12, 23, 12, 0)) == utc(2026, 12, 24, 0, 0)


def test_the_next_window_is_the_first_instant_that_is_open() -> None:
    thursday_noon = berlin(2026, 12, 3, 12, 0)
    assert WEEKNIGHTS.next_open(thursday_noon) == berlin(2026, 12, 4, 1, 0)
    saturday = berlin(2026, 12, 5, 12, 0)
    assert WEEKNIGHTS.next_open(saturday) == berlin(2026, 12, 7, 1, 0)
    inside = berlin(2026, 12, 3, 2, 0)
    assert WEEKNIGHTS.next_open(inside) == inside
    # A window whose every day is blacked out for over a year: none to name.
    never = windows(open=["Mon 01:00-02:00"], blackout=["2026-01-01..2029-01-01"])
    assert never.next_open(utc(2026, 12, 3)) is None


def test_when_and_countdown_read_as_a_person_says_them() -> None:
    assert when(berlin(2026, 12, 4, 1, 0), BERLIN) == "Fri 2026-12-04 01:00 CET"
    assert countdown(30) == "under a minute"
    assert countdown(12 * 60 + 59) == "12 min"
    assert countdown(3 * 3600 + 5 * 60) == "3 h 05 min"
    assert countdown(2 * 86400 + 3 * 3600) == "2 d 3 h"


# ---- --at ----------------------------------------------------------------------------------


def test_at_reads_a_time_of_day_as_the_next_one_in_the_window_zone() -> None:
    now = berlin(2026, 12, 3, 14, 0)
    assert parse_at("02:00", now=now, zone=BERLIN) == berlin(2026, 12, 4, 2, 0)
    assert parse_at("15:30", now=now, zone=BERLIN) == berlin(2026, 12, 3, 15, 30)
    assert parse_at("2026-12-05T03:00", now=now, zone=BERLIN) == berlin(2026, 12, 5, 3, 0)
    # An offset of its own wins over the window's zone.
    assert parse_at("2026-12-05T01:00Z", now=now, zone=BERLIN) == utc(2026, 12, 5, 1, 0)
    with pytest.raises(ValueError, match="not a time"):
        parse_at("25:00", now=now, zone=BERLIN)


# ---- the request's judgement -----------------------------------------------------------------


def _plan(action: Action = Action.REDEPLOY, *, dry_run: bool = False) -> Plan:
    settings = Settings(
        hosts={"h": {"address": "local"}},
        services={"svc": {"hosts": ["h"], "unit": "svc", "python": "/v/bin/python"}},
    )
    return make_plan(settings, action, "svc", dry_run=dry_run)


POLICY = PolicySettings(
    approvers=["U0BOB"],
    min_approvals=2,
    windows=WindowSettings(timezone="Europe/Berlin", open=["Mon-Fri 01:00-05:00"]),
)
NOON = berlin(2026, 12, 3, 12, 0)  # Thursday: closed until Friday 01:00


def test_outside_the_window_a_change_is_refused_with_the_next_opening_and_the_ways_out() -> None:
    judged = judge_request(_plan(), Timing(), POLICY, now=NOON)
    assert isinstance(judged, NotNow) and judged.code is Refusal.OUTSIDE_WINDOW
    assert "svc may redeploy only inside its maintenance windows" in judged.reason
    assert "The next opens Fri 2026-12-04 01:00 CET (in 13 h 00 min)" in judged.reason
    assert "`--at HH:MM`" in judged.reason and "`--now` (it needs 3 approvals)" in judged.reason


def test_inside_the_window_or_for_what_changes_nothing_there_is_no_refusal() -> None:
    inside = berlin(2026, 12, 4, 2, 0)
    assert judge_request(_plan(), Timing(), POLICY, now=inside) == RunAt()
    # --now inside a window is no override: nothing to record as one.
    assert judge_request(_plan(), Timing(now=True), POLICY, now=inside) == RunAt()
    for plan in (_plan(dry_run=True), _plan(Action.STATUS)):
        assert judge_request(plan, Timing(), POLICY, now=NOON) == RunAt()


def test_at_inside_a_window_schedules_and_now_outside_one_overrides() -> None:
    at = judge_request(_plan(), Timing(at="02:00"), POLICY, now=NOON)
    assert at == RunAt(at=berlin(2026, 12, 4, 2, 0))
    now = judge_request(_plan(), Timing(now=True), POLICY, now=NOON)
    assert now == RunAt(override=True)
    # The override's rule: min_approvals + override_extra_approvals.
    assert run_policy(POLICY, override=True).min_approvals == 3
    assert run_policy(POLICY, override=False).min_approvals == 2


@pytest.mark.parametrize(
    ("timing", "code", "said"),
    [
        (Timing(at="13:00"), Refusal.OUTSIDE_WINDOW, "outside svc's maintenance windows"),
        (Timing(at="2026-12-03T11:00"), Refusal.BAD_TIME, "is in the past"),
        (Timing(at="2026-12-21T02:00"), Refusal.BAD_TIME, "more than 7 days ahead"),
        (Timing(at="02:00", now=True), Refusal.BAD_TIME, "contradict"),
        (Timing(at="tomorrow"), Refusal.BAD_TIME, "is not a time"),
    ],
)
def test_an_at_that_makes_no_sense_is_refused(timing: Timing, code: Refusal, said: str) -> None:
    judged = judge_request(_plan(), timing, POLICY, now=NOON)
    assert isinstance(judged, NotNow) and judged.code is code and said in judged.reason


def test_at_on_a_dry_run_is_refused_rather_than_ignored() -> None:
    judged = judge_request(_plan(dry_run=True), Timing(at="02:00"), POLICY, now=NOON)
    assert isinstance(judged, NotNow) and "not to a dry run" in judged.reason


# ---- judged again at its start ---------------------------------------------------------------


def _scheduled(at: datetime, *, override: bool = False) -> RunRecord:
    return RunRecord(
        id=7,
        service="svc",
        action=Action.REDEPLOY,
        hosts=["h"],
        requested_by="U0ALICE",
        source=Source.SLACK,
        status=RunStatus.SCHEDULED,
        current_step=None,
        summary=None,
        version_before=None,
        version_after=None,
        created_at="2026-12-03T12:00:00Z",
        started_at=None,
        finished_at=None,
        expires_at=None,
        channel=None,
        message_ts=None,
        plan={},
        package_spec=None,
        index_name=None,
        dry_run=False,
        approved_by=["U0BOB"],
        denied_by=[],
        scheduled_at=at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        override=override,
    )


def test_a_scheduled_run_starts_on_time_inside_its_window() -> None:
    at = berlin(2026, 12, 4, 2, 0)
    assert start_refusal(_scheduled(at), POLICY, now=at) is None
    assert start_refusal(_scheduled(at), POLICY, now=at + timedelta(seconds=900)) is None


def test_a_scheduled_run_too_late_or_whose_window_closed_is_refused_at_its_start() -> None:
    at = berlin(2026, 12, 4, 2, 0)
    late = start_refusal(_scheduled(at), POLICY, now=at + timedelta(seconds=901))
    assert late is not None and "start_grace_s" in late and "15 min late" in late
    # The window was changed after the approval: a freeze over that day.
    frozen = POLICY.model_copy(
        update={
            "windows": WindowSettings(
                timezone="Europe/Berlin", open=["Mon-Fri 01:00-05:00"], blackout=["2026-12-04"]
            )
        }
    )
    closed = start_refusal(_scheduled(at), frozen, now=at)
    assert closed is not None and "its maintenance window is closed at its start" in closed
    assert "the next opens Mon 2026-12-07 01:00 CET" in closed


# ---- the config ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('open = ["Mon-Fri 1:00-5:00"]', "is not a window"),
        ('open = ["Mox 01:00-05:00"]', "'Mox' is not a weekday"),
        ('open = ["Mon 01:00-01:00"]', "starts and ends at the same time"),
        ('open = ["Mon 24:00-01:00"]', "is not a time of day"),
        ('blackout = ["2026-12-31..2026-12-01"]', "ends before it starts"),
        ('timezone = "Mars/Olympus"', "is not an IANA time zone"),
        ("start_grace_s = 0", "start_grace_s"),
    ],
)
def test_a_bad_window_fails_at_start_naming_the_key(
    tmp_path: Path, body: str, message: str
) -> None:
    path = tmp_path / "chatops.toml"
    path.write_text(f"[policy.windows]\n{body}\n")
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    assert "policy.windows" in str(err.value) and message in str(err.value)


def test_a_services_windows_replace_the_global_ones_whole(tmp_path: Path) -> None:
    path = tmp_path / "chatops.toml"
    path.write_text(
        '[policy.windows]\nopen = ["daily 01:00-05:00"]\nblackout = ["2026-12-24"]\n'
        '[hosts.h]\naddress = "local"\n'
        '[services.a]\nhosts = ["h"]\nunit = "a"\npython = "/v/bin/python"\n'
        '[services.a.policy.windows]\ntimezone = "Asia/Tokyo"\nopen = ["Sat 00:00-24:00"]\n'
        '[services.b]\nhosts = ["h"]\nunit = "b"\npython = "/v/bin/python"\n'
    )
    s = load_settings(path)
    own = s.policy_for("a").windows
    assert own is not None and own.timezone == "Asia/Tokyo" and own.blackout == []
    assert isinstance(own, WindowSettings)  # a model, not a dict copied over
    assert s.policy_for("b").windows == s.policy.windows
