"""Maintenance windows and scheduled runs on the terminal (issue 22, item 3): the CLI as a
subprocess against the simulated host over a real sshd, and the claim that makes two
lookers start a scheduled run exactly once.

A subprocess reads the real clock, so its windows are written around the real time:
one that opens two hours from now is closed now, and stays so for the test's seconds.
Where a test needs the start time to have come, it moves the run's ``scheduled_at``
back in the database, as the passing of time would (nothing waits for it)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.audit.store import AuditLog
from bot.core.plan import make_plan
from bot.core.status import Action, RunStatus, Source
from bot.engine.lifecycle import RunLifecycle
from bot.engine.operations import Operations
from bot.engine.schedule import NotStarted, Started
from bot.settings import LOCAL, Settings
from bot.sim.kit import SERVICE, SimKit
from tests.support.cli import cli, write_toml
from tests.support.sim import touched
from tests.support.wall_clock import ManualWallClock


def _hhmm(t: datetime) -> str:
    return f"{t:%H:%M}"


def _env(kit: SimKit, tmp_path: Path, windows: dict[str, Any] | None) -> dict[str, str]:
    data: dict[str, Any] = kit.settings_fragment()
    if windows is not None:
        data = {**data, "policy": {"windows": windows}}
    config = write_toml(tmp_path / "chatops.toml", data)
    return {"CHATOPS_CONFIG": str(config), "CHATOPS_DB": str(tmp_path / "audit.db")}


def _later_window() -> dict[str, Any]:
    """Open from two hours from now to three: closed now."""
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    return {
        "timezone": "UTC",
        "open": [f"daily {_hhmm(now + timedelta(hours=2))}-{_hhmm(now + timedelta(hours=3))}"],
    }


def _due_now(db: Path, run_id: int) -> None:
    """Its time has come: as if the clock had reached ``scheduled_at``."""
    at = (datetime.now(UTC) - timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE runs SET scheduled_at = ? WHERE id = ?", (at, run_id))
    conn.close()


async def test_cli_refuses_outside_the_window_and_schedules_with_at(
    tmp_path: Path, sim_host: SimKit
) -> None:
    env = _env(sim_host, tmp_path, _later_window())
    code, out, err = await cli("restart", SERVICE, "--yes", cwd=tmp_path, env=env)
    assert code == 1, out + err
    assert f"{SERVICE} may restart only inside its maintenance windows" in err
    # Two hours on, less the seconds of this minute already gone.
    assert "The next opens" in err and ("(in 1 h 59 min)" in err or "(in 2 h 00 min)" in err)
    assert touched(sim_host) == []  # and no run recorded: the refusals row says why

    at = _hhmm(datetime.now(UTC) + timedelta(hours=2, minutes=30))
    code, out, err = await cli("restart", SERVICE, "--at", at, "--yes", cwd=tmp_path, env=env)
    assert code == 0, out + err
    assert "scheduled: run #1 starts" in out and f"{at} UTC" in out
    assert touched(sim_host) == []

    code, out, err = await cli("scheduled", "--json", cwd=tmp_path, env=env)
    assert code == 0, err
    [listed] = json.loads(out)
    assert (listed["id"], listed["status"], listed["source"]) == (1, "scheduled", "cli")
    # The operator's confirmation is the approval, as for any terminal change.
    assert listed["approved_by"] and listed["approved_by"][0].startswith("cli:")

    code, out, err = await cli("scheduled", "--cancel", "1", cwd=tmp_path, env=env)
    assert (code, out.strip()) == (0, "Run #1 cancelled before its scheduled start."), err
    code, out, err = await cli("scheduled", "--cancel", "1", cwd=tmp_path, env=env)
    assert code == 1 and "Run #1 is cancelled, not scheduled" in err
    code, out, _ = await cli("scheduled", cwd=tmp_path, env=env)
    assert out.strip() == "no scheduled runs"
    async with AuditLog.open(tmp_path / "audit.db") as audit:
        reasons = [r.reason for r in await audit.refusals()]
    assert any("maintenance windows" in r for r in reasons)
    assert any("is cancelled, not scheduled" in r for r in reasons)


async def test_start_due_runs_a_due_terminal_run_once_and_refuses_a_closed_window(
    tmp_path: Path, sim_host: SimKit
) -> None:
    db = tmp_path / "audit.db"
    env = _env(sim_host, tmp_path, None)  # no windows: --at only defers
    at = _hhmm(datetime.now(UTC) + timedelta(hours=1))
    code, out, err = await cli("restart", SERVICE, "--at", at, "--yes", cwd=tmp_path, env=env)
    assert code == 0, out + err
    code, out, _ = await cli("scheduled", "--start-due", cwd=tmp_path, env=env)
    assert (code, out.strip()) == (0, "nothing is due")
    assert touched(sim_host) == []

    _due_now(db, 1)
    code, out, err = await cli("scheduled", "--start-due", cwd=tmp_path, env=env)
    assert code == 0, out + err
    assert f"run #1 (restart {SERVICE}): starting now" in out
    code, out, _ = await cli("scheduled", "--start-due", cwd=tmp_path, env=env)
    assert out.strip() == "nothing is due"
    async with AuditLog.open(db) as audit:
        run = await audit.get_run(1)
        assert run.status == RunStatus.SUCCEEDED, run.summary
        assert [s.step for s in await audit.steps(1)].count("start") == 1

    # Windows configured since: the next due run finds its window closed at its start.
    env = _env(sim_host, tmp_path, None)
    code, out, err = await cli("restart", SERVICE, "--at", at, "--yes", cwd=tmp_path, env=env)
    assert code == 0, out + err
    _due_now(db, 2)
    env = _env(sim_host, tmp_path, _later_window())
    before = len(touched(sim_host))
    code, out, err = await cli("scheduled", "--start-due", cwd=tmp_path, env=env)
    assert code == 1
    assert "run #2 (restart kimi-k25): not started: its maintenance window is closed" in out
    assert len(touched(sim_host)) == before
    async with AuditLog.open(db) as audit:
        assert (await audit.get_run(2)).status == RunStatus.REFUSED
    # The export says when each was scheduled for, and that neither was an override.
    code, out, err = await cli("audit", "--format", "jsonl", cwd=tmp_path, env=env)
    assert code == 0, err
    exported = [json.loads(line) for line in out.splitlines()]
    assert [(r["id"], r["status"], r["override"]) for r in exported] == [
        (1, "succeeded", False),
        (2, "refused", False),
    ]
    assert all(r["scheduled_at"] for r in exported)


async def test_two_lookers_at_once_start_a_scheduled_run_exactly_once(tmp_path: Path) -> None:
    settings = Settings(
        hosts={"gpu1": {"address": LOCAL}},
        services={"svc": {"hosts": ["gpu1"], "unit": "vllm-svc", "python": "/v/bin/python"}},
        policy={"approvers": ["U0BOB"], "min_approvals": 1},
        db_path=tmp_path / "audit.db",
    )
    clock = ManualWallClock(datetime(2026, 12, 3, 12, 0, tzinfo=UTC))
    # Two bots on one database, each with its own connection and life cycle.
    async with AuditLog.open(settings.db_path) as a, AuditLog.open(settings.db_path) as b:
        bots = [
            Operations(RunLifecycle(settings, audit, clock=clock, owner=owner))
            for owner, audit in ((lambda: "bot-0", a), (lambda: "bot-1", b))
        ]
        life = bots[0].lifecycle
        plan = make_plan(settings, Action.RESTART, "svc")
        for _ in range(5):
            record = await life.request(
                plan,
                requested_by="U0ALICE",
                source=Source.SLACK,
                at=clock() + timedelta(minutes=10),
            )
            assert await life.confirm(record.id, "U0BOB")
        clock.advance(600)
        outcomes = await asyncio.gather(*(o.start_due() for o in bots for _ in range(3)))
        started = [x.record.id for batch in outcomes for x in batch if isinstance(x, Started)]
        assert sorted(started) == [1, 2, 3, 4, 5]
        assert not any(isinstance(x, NotStarted) for batch in outcomes for x in batch)
        for run_id in started:
            run = await a.get_run(run_id)
            assert run.status == RunStatus.APPROVED and run.owner in ("bot-0", "bot-1")


# ---- approvals judged again at the start ---------------------------------------------------


def _settings(tmp_path: Path, **policy: Any) -> Settings:
    return Settings(
        hosts={"gpu1": {"address": LOCAL}},
        services={"svc": {"hosts": ["gpu1"], "unit": "vllm-svc", "python": "/v/bin/python"}},
        policy={"approvers": ["U0BOB"], "min_approvals": 1, **policy},
        db_path=tmp_path / "audit.db",
    )


async def _approved_for_later(
    audit: AuditLog, settings: Settings, clock: ManualWallClock, source: Source, approver: str
) -> int:
    """A restart approved at 12:00 (by ``approver``) for 02:00 the next day."""
    life = RunLifecycle(settings, audit, clock=clock, owner=lambda: "bot-0")
    record = await life.request(
        make_plan(settings, Action.RESTART, "svc"),
        requested_by="U0ALICE",
        source=source,
        at=clock() + timedelta(hours=14),
    )
    assert await life.confirm(record.id, approver)
    assert (await audit.get_run(record.id)).status == RunStatus.SCHEDULED
    return record.id


async def _due(
    audit: AuditLog, settings: Settings, clock: ManualWallClock, **members: Any
) -> list[Started | NotStarted]:
    """The bot, its config as it is now, looks at what is due."""
    ops = Operations(RunLifecycle(settings, audit, clock=clock, owner=lambda: "bot-1"))
    return await ops.start_due(**members)


@pytest.mark.parametrize(
    ("then", "why"),
    [
        # BOB left the approvers list between the approval and 02:00.
        ({"approvers": ["U0CAROL"]}, "0 of the 1 approval it needs count now; U0BOB no longer"),
        # Two approvals are needed now; BOB's is one.
        (
            {"approvers": ["U0BOB", "U0CAROL"], "min_approvals": 2},
            "1 of the 2 approvals it needs count now",
        ),
    ],
)
async def test_a_scheduled_run_whose_approvals_no_longer_suffice_does_not_start(
    tmp_path: Path, then: dict[str, Any], why: str
) -> None:
    before = _settings(tmp_path)
    clock = ManualWallClock(datetime(2026, 12, 3, 12, 0, tzinfo=UTC))
    async with AuditLog.open(before.db_path) as audit:
        run_id = await _approved_for_later(audit, before, clock, Source.SLACK, "U0BOB")
        clock.advance(14 * 3600)  # 02:00
        (outcome,) = await _due(audit, _settings(tmp_path, **then), clock)
        assert isinstance(outcome, NotStarted) and outcome.record.id == run_id
        assert why in outcome.reason and outcome.reason.endswith("request it again")
        run = await audit.get_run(run_id)
        assert run.status == RunStatus.REFUSED and run.owner is None
        assert run.summary == f"not started: {outcome.reason}"
        (row,) = await audit.refusals()
        assert row.user == "U0ALICE" and row.reason == outcome.reason
        # Refused once: a later look starts nothing.
        assert await _due(audit, _settings(tmp_path, **then), clock) == []


async def test_a_scheduled_run_whose_approvals_still_suffice_starts(tmp_path: Path) -> None:
    """The good case: the config changed, but BOB is still an approver and one suffices."""
    before = _settings(tmp_path)
    clock = ManualWallClock(datetime(2026, 12, 3, 12, 0, tzinfo=UTC))
    async with AuditLog.open(before.db_path) as audit:
        run_id = await _approved_for_later(audit, before, clock, Source.SLACK, "U0BOB")
        clock.advance(14 * 3600)
        now = _settings(tmp_path, approvers=["U0CAROL", "U0BOB"])
        (outcome,) = await _due(audit, now, clock)
        assert isinstance(outcome, Started) and outcome.record.id == run_id
        assert (await audit.get_run(run_id)).status == RunStatus.APPROVED


async def test_a_terminal_operators_confirmation_is_not_judged_by_the_approvers(
    tmp_path: Path,
) -> None:
    """A run asked for on a terminal was approved by its operator, whom no approvers list
    judged at the request either: a changed list does not hold it back."""
    before = _settings(tmp_path)
    clock = ManualWallClock(datetime(2026, 12, 3, 12, 0, tzinfo=UTC))
    async with AuditLog.open(before.db_path) as audit:
        run_id = await _approved_for_later(audit, before, clock, Source.CLI, "alice")
        clock.advance(14 * 3600)
        now = _settings(tmp_path, approvers=["U0CAROL"], min_approvals=2)
        (outcome,) = await _due(audit, now, clock)
        assert isinstance(outcome, Started) and outcome.record.id == run_id


@pytest.mark.parametrize("still_in", [True, False])
async def test_a_group_approvers_run_is_judged_on_the_group_as_it_is_at_the_start(
    tmp_path: Path, still_in: bool
) -> None:
    """BOB approved as a member of S0OPS. At the start the group is read again: if it
    cannot be read the run waits for the next look (never judged on no answer); read
    with BOB in it, it starts; without him, it does not."""
    before = _settings(tmp_path, approvers=["S0OPS"])
    clock = ManualWallClock(datetime(2026, 12, 3, 12, 0, tzinfo=UTC))
    asked: list[frozenset[str]] = []

    def reading(answer: dict[str, frozenset[str]] | None) -> Any:
        async def members(groups: frozenset[str]) -> dict[str, frozenset[str]] | None:
            asked.append(groups)
            return answer

        return members

    async with AuditLog.open(before.db_path) as audit:
        run_id = await _approved_for_later(audit, before, clock, Source.SLACK, "U0BOB")
        clock.advance(14 * 3600)
        assert await _due(audit, before, clock, members=reading(None)) == []
        assert (await audit.get_run(run_id)).status == RunStatus.SCHEDULED
        clock.advance(30)  # the next look
        group = frozenset({"U0BOB", "U0CAROL"} if still_in else {"U0CAROL"})
        (outcome,) = await _due(audit, before, clock, members=reading({"S0OPS": group}))
        assert asked == [frozenset({"S0OPS"})] * 2
        if still_in:
            assert isinstance(outcome, Started)
        else:
            assert isinstance(outcome, NotStarted) and "U0BOB no longer counts" in outcome.reason
