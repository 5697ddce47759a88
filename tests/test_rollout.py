"""Rolling redeploy end to end over several simulated hosts (embedded SSH servers).

Order is read from each host's own call log (timestamps written by the simulated
tools and the fake vLLM server), so these tests check what really reached the
hosts and when, not what the engine meant to do.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from bot.core import events as ev
from bot.core.status import Action, Decision, RunStatus, Source
from bot.engine.engine import NOT_STARTED, RunResult
from bot.engine.runtime import Runtime, open_runtime
from bot.settings import Settings
from bot.sim.kit import SERVICE, SimKit, fast_config, fleet_fragment
from bot.sim.state import DEFAULT_VERSION
from tests.support.cli import cli, write_toml
from tests.support.sim import MakeSimHost


class Recorder:
    def __init__(self) -> None:
        self.events: list[ev.Event] = []

    async def handle(self, event: ev.Event) -> None:
        self.events.append(event)

    def host_finished(self) -> list[tuple[str, str]]:
        return [(e.host, e.status) for e in self.events if isinstance(e, ev.HostFinished)]


async def make_fleet(make_sim_host: MakeSimHost, tmp_path: Path, n: int) -> list[SimKit]:
    # One service over all of them: the same venv path and the same claimed port.
    venv = tmp_path / "opt-venv"
    return list(
        await asyncio.gather(
            *(
                make_sim_host(
                    config=fast_config(hostname=f"gpu-node-{i}"), venv_dir=venv, service_port=8000
                )
                for i in range(1, n + 1)
            )
        )
    )


def fleet_settings(kits: list[SimKit], tmp_path: Path, **service: Any) -> Settings:
    return Settings(**fleet_fragment(kits, **service), db_path=tmp_path / "audit.db")


async def redeploy(rt: Runtime, **plan: Any) -> tuple[RunResult, Recorder]:
    p = rt.engine.plan(Action.REDEPLOY, SERVICE, **plan)
    record = await rt.lifecycle.request(p, requested_by="U0ALICE", source=Source.CLI)
    # One approval for the whole rollout, whatever the number of hosts.
    await rt.audit.record_decision(record.id, "U0BOB", Decision.APPROVE)
    assert await rt.audit.transition(
        record.id, RunStatus.APPROVED, expect=(RunStatus.PENDING_APPROVAL,)
    )
    sink = Recorder()
    return await rt.engine.execute(record.id, sink), sink


def first_ts(kit: SimKit, argv_prefix: tuple[str, ...]) -> float:
    return min(c.ts for c in kit.calls() if c.argv[: len(argv_prefix)] == argv_prefix)


def stopped_at(kit: SimKit) -> float:
    return first_ts(kit, ("systemctl", "stop"))


def healthy_at(kit: SimKit) -> float:
    # The fake server logs a request after answering it, and only a loaded server
    # answers; without health_503 every answer is a 200.
    return first_ts(kit, ("GET", "/health"))


async def test_rolling_redeploy_goes_batch_by_batch(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    kits = await make_fleet(make_sim_host, tmp_path, 4)
    names = [k.hostname for k in kits]
    async with open_runtime(fleet_settings(kits, tmp_path, max_unavailable=2)) as rt:
        plan = rt.engine.plan(Action.REDEPLOY, SERVICE, version="0.31.0")
        assert plan.hosts == tuple(names)
        assert plan.batches() == [tuple(names[:2]), tuple(names[2:])]
        result, sink = await redeploy(rt, version="0.31.0")
        assert result.status == "succeeded", result.summary
        assert result.host_status == dict.fromkeys(names, "succeeded")
        assert list(result.host_status) == names  # plan order, for the card

        for kit in kits:
            assert kit.changes() == ["dry-run", "prefetch", "stop", "install", "start"]
            assert kit.installed_version == "0.31.0" and kit.unit_state() == "active"
        first, second = kits[:2], kits[2:]
        # The next batch starts only when every host of the previous one is healthy...
        assert min(stopped_at(k) for k in second) > max(healthy_at(k) for k in first)
        # ...and the hosts of one batch go together: each was stopped before the other
        # one's health gate passed, which one-at-a-time could never do.
        for batch in (first, second):
            a, b = batch
            assert stopped_at(a) < healthy_at(b) and stopped_at(b) < healthy_at(a)

        finished = sink.host_finished()
        assert sorted(finished[:2]) == [(n, "succeeded") for n in names[:2]]
        assert sorted(finished[2:]) == [(n, "succeeded") for n in names[2:]]

        record = await rt.audit.get_run(result.run_id)
        assert record.status == "succeeded"
        assert record.hosts == names and record.plan["hosts"] == names
        assert record.plan["batch_size"] == 2
        assert record.approved_by == ["U0BOB"]
        assert [d.decision for d in await rt.audit.decisions(result.run_id)] == ["approve"]
        assert (record.version_before, record.version_after) == (DEFAULT_VERSION, "0.31.0")
        steps = await rt.audit.steps(result.run_id)
        for name in names:
            assert [(s.step, s.status) for s in steps if s.host == name] == [
                (n, "ok")
                for n in (
                    "preflight",
                    "gpu_check",
                    "prefetch",
                    "requests",
                    "stop",
                    "drain",
                    "reinstall",
                    "gate",
                    "start",
                    "health",
                    "readiness",
                    "postcheck",
                    "gpu_recheck",
                )
            ]
        assert record.summary == (
            f"succeeded (vllm {DEFAULT_VERSION} -> 0.31.0, healthy): " + ", ".join(names)
        )
        assert await rt.audit.lock_holder(f"host:{names[3]}") is None


async def test_first_failure_stops_the_rollout(make_sim_host: MakeSimHost, tmp_path: Path) -> None:
    kits = await make_fleet(make_sim_host, tmp_path, 3)
    names = [k.hostname for k in kits]
    kits[1].set_faults(uv_fails=True)
    # max_unavailable says 2; the request's batch=1 wins.
    async with open_runtime(fleet_settings(kits, tmp_path, max_unavailable=2)) as rt:
        result, sink = await redeploy(rt, version="0.31.0", batch=1)
        assert result.status == "rolled_back", result.summary
        assert result.host_status == {
            names[0]: "succeeded",
            names[1]: "rolled_back",
            names[2]: NOT_STARTED,
        }
        assert set(result.outcomes) == set(names[:2])
        assert kits[0].changes() == ["dry-run", "prefetch", "stop", "install", "start"]
        assert kits[1].changes() == ["dry-run", "prefetch", "stop", "install", "rollback", "start"]
        assert kits[1].installed_version == DEFAULT_VERSION
        # Untouched: not even a read reached the third host.
        assert kits[2].calls() == []
        assert kits[2].installed_version == DEFAULT_VERSION
        assert kits[2].unit_state() == "active"
        assert stopped_at(kits[1]) > healthy_at(kits[0])

        assert sink.host_finished() == [
            (names[0], "succeeded"),
            (names[1], "rolled_back"),
            (names[2], NOT_STARTED),
        ]
        assert isinstance(sink.events[-1], ev.RunFinished)
        record = await rt.audit.get_run(result.run_id)
        assert record.status == "rolled_back"
        assert record.plan["batch_size"] == 1
        # The problem first, then who succeeded, then who was never touched.
        assert record.summary is not None
        assert record.summary.startswith(f"{names[1]}: rolled_back (")
        assert record.summary.endswith(
            f"; succeeded (vllm {DEFAULT_VERSION} -> 0.31.0, "
            f"healthy): {names[0]}; not started: {names[2]}"
        )
        assert {s.host for s in await rt.audit.steps(result.run_id)} == set(names[:2])
        assert await rt.audit.lock_holder(f"host:{names[2]}") is None


async def test_a_failed_batch_finishes_its_siblings_and_stops(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    kits = await make_fleet(make_sim_host, tmp_path, 4)
    names = [k.hostname for k in kits]
    kits[1].set_faults(start_fails=True)
    async with open_runtime(fleet_settings(kits, tmp_path, max_unavailable=2)) as rt:
        result, sink = await redeploy(rt)
    assert result.status == "failed"
    assert result.host_status == {
        names[0]: "succeeded",
        names[1]: "failed",
        names[2]: NOT_STARTED,
        names[3]: NOT_STARTED,
    }
    # Its new version never came up; the snapshot was restored, and the old one fails
    # to start too (start_fails stays set): DOWN, and said so.
    failed = result.outcomes[names[1]].summary
    assert "rolled back to" in failed and "The service is DOWN" in failed
    # The sibling in the failing batch was not cut off half way.
    assert kits[0].unit_state() == "active" and kits[0].installed_version == "0.31.0"
    assert kits[2].calls() == [] and kits[3].calls() == []
    assert sorted(sink.host_finished()[2:]) == [(n, NOT_STARTED) for n in names[2:]]


async def test_status_asks_every_host_even_when_one_fails(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    kits = await make_fleet(make_sim_host, tmp_path, 3)
    kits[0].set_faults(no_driver=True)  # its GPU query fails: a failed status there
    async with open_runtime(fleet_settings(kits, tmp_path)) as rt:
        p = rt.engine.plan(Action.STATUS, SERVICE)
        record = await rt.lifecycle.request(p, requested_by="U0ALICE", source=Source.CLI)
        assert await rt.audit.transition(
            record.id, RunStatus.APPROVED, expect=(RunStatus.PENDING_APPROVAL,)
        )
        result = await rt.engine.execute(record.id, Recorder())
    assert result.host_status[kits[0].hostname] == "failed"
    assert [result.host_status[k.hostname] for k in kits[1:]] == ["succeeded", "succeeded"]
    for kit in kits:
        assert any(c.argv[:2] == ("systemctl", "show") for c in kit.calls())


async def test_cli_rollout_with_batch_flag(make_sim_host: MakeSimHost, tmp_path: Path) -> None:
    kits = await make_fleet(make_sim_host, tmp_path, 2)
    names = [k.hostname for k in kits]
    config = write_toml(tmp_path / "chatops.toml", fleet_fragment(kits, max_unavailable=2))
    env = {"CHATOPS_CONFIG": str(config), "CHATOPS_DB": str(tmp_path / "audit.db")}
    code, out, err = await cli(
        "redeploy", SERVICE, "--version", "0.30.0", "--batch", "1", "--yes", cwd=tmp_path, env=env
    )
    assert code == 0, err + out
    assert f"in batches of 1: {names[0]} | {names[1]}" in out
    assert healthy_at(kits[0]) < stopped_at(kits[1])
    code, out, _ = await cli("audit", "--json", cwd=tmp_path, env=env)
    [run] = json.loads(out)
    assert (run["hosts"], run["status"], run["version_after"]) == (names, "succeeded", "0.30.0")
