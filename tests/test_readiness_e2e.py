"""Model-level readiness, the request drain and start-up progress end to end: the
simulated host behind a real OpenSSH sshd, a real audit database, and (for the card)
the real bolt app over the fake Slack."""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bot.core.plan import STEP_TITLES, Step
from bot.core.status import Action, RunStatus
from bot.engine.runtime import open_runtime
from bot.sim.kit import READY_SETTINGS, SERVICE, SimKit, fast_config
from tests.slack_harness import BOB, CHANNEL, SlackBot, blocks_text, slack_bot
from tests.support.runs import run
from tests.support.sim import MakeSimHost, sim_settings

FINAL = ("succeeded", "failed", "rolled_back", "aborted", "cancelled")




async def test_the_wrong_model_never_ends_succeeded(make_sim_host: MakeSimHost,
                                                    tmp_path: Path) -> None:
    kit = await make_sim_host(access="sshd")
    kit.set_faults(wrong_model=True)
    async with open_runtime(sim_settings(kit, tmp_path, **READY_SETTINGS)) as rt:
        result, out = await run(rt, Action.REDEPLOY, version="0.16.0")
        assert result.status != RunStatus.SUCCEEDED, out
        steps = await rt.audit.steps(result.run_id)
    ready = next(s for s in steps if s.step == "readiness")
    assert ready.status == "failed"
    assert "lists Kimi-K2-Instruct, not kimi-k2.5" in ready.output_tail
    assert "FAILED: GET http://127.0.0.1:" in ready.output_tail  # each check, in the audit log
    assert "start-up failed" not in result.summary


async def test_a_failing_smoke_test_never_ends_succeeded(make_sim_host: MakeSimHost,
                                                         tmp_path: Path) -> None:
    kit = await make_sim_host(access="sshd")
    kit.set_faults(smoke_fail=True)
    async with open_runtime(sim_settings(kit, tmp_path, **READY_SETTINGS)) as rt:
        result, out = await run(rt, Action.RESTART)
        assert result.status == RunStatus.FAILED, out
        steps = await rt.audit.steps(result.run_id)
    assert "HTTP 500: EngineCore encountered an issue" in result.summary
    ready = next(s for s in steps if s.step == "readiness")
    # Each check, last in the step's output: the model was right, the completion was not.
    assert ready.output_tail.splitlines()[-2].startswith("ok: GET http://127.0.0.1:")
    assert ready.output_tail.splitlines()[-1].startswith("FAILED: POST http://127.0.0.1:")
    assert "FAILED readiness" in out


async def test_a_ready_server_passes_and_the_checks_are_recorded(make_sim_host: MakeSimHost,
                                                                 tmp_path: Path) -> None:
    kit = await make_sim_host(access="sshd")
    async with open_runtime(sim_settings(kit, tmp_path, **READY_SETTINGS)) as rt:
        result, out = await run(rt, Action.REDEPLOY, version="0.16.0")
        assert result.status == RunStatus.SUCCEEDED, out
        ready = next(s for s in await rt.audit.steps(result.run_id) if s.step == "readiness")
    assert ready.output_tail.splitlines() == [
        f"ok: GET http://127.0.0.1:{kit.service_port}/v1/models lists kimi-k2.5",
        f"ok: POST http://127.0.0.1:{kit.service_port}/v1/completions answered ' Paris. It is "
        "also the largest city in France.', matches 'Paris'",
        f"ok: GET http://127.0.0.1:{kit.service_port}/version reports 0.16.0, the installed "
        "version"]
    assert ("http", ("POST", "/v1/completions")) in [(c.tool, c.argv) for c in kit.calls()]


async def test_an_oom_at_start_fails_within_seconds_of_the_traceback(
        make_sim_host: MakeSimHost, tmp_path: Path) -> None:
    # The process would exit a minute after its traceback; the gate must not wait for it,
    # nor for start_timeout_s.
    kit = await make_sim_host(access="sshd", config=fast_config(load_delay_s=2.0,
                                                                oom_exit_delay_s=60.0))
    kit.set_faults(oom_at_start=True)
    settings = sim_settings(kit, tmp_path, start_timeout_s=300, health_poll_s=0.2,
                            rollback_on_unhealthy=False)
    async with open_runtime(settings) as rt:
        started = time.monotonic()
        result, out = await run(rt, Action.RESTART)
        took = time.monotonic() - started
        health = next(s for s in await rt.audit.steps(result.run_id) if s.step == "health")
    assert result.status == RunStatus.FAILED, out
    assert result.summary.startswith("start-up failed: CUDA out of memory: (EngineCore_DP0 pid=")
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in health.output_tail
    # The traceback comes 0.8 s into the start (oom_at 0.4 of 2 s): seconds, not 300.
    assert health.duration_s is not None and health.duration_s < 10, health.duration_s
    assert took < 60, took
    assert kit.unit_state() == "active"  # the process had not even exited yet


# ---- through Slack ----------------------------------------------------------------------------


def card_line(card: dict[str, Any], step: Step) -> str:
    title = STEP_TITLES[step]
    return next((ln for ln in blocks_text(card).splitlines() if title in ln), "")


async def request_and_approve(bot: SlackBot, command: str) -> tuple[int, str]:
    await bot.command(command)
    record = await bot.wait_for_run(
        lambda r: r.message_ts is not None and r.status == RunStatus.PENDING_APPROVAL, "the card")
    approval_card = blocks_text(await bot.card(record.id))
    await bot.click("approve", record.id, user=BOB)
    return record.id, approval_card


def stop_time(kit: SimKit) -> float:
    return next(c.ts for c in kit.calls() if c.argv[:2] == ("systemctl", "stop"))


async def test_busy_requests_delay_the_stop_and_the_card_shows_their_counts(
        tmp_path: Path, make_sim_host: MakeSimHost) -> None:
    kit = await make_sim_host(access="sshd", config=fast_config(
        busy_running=4, busy_waiting=2, busy_drain_s=6.0))
    kit.set_faults(busy=True)
    async with slack_bot(tmp_path, kit) as bot:
        run_id, approval = await request_and_approve(bot, f"restart {SERVICE}")
        assert re.search(r"Load now: gpu-node-1: \d running, \d waiting requests", approval)
        assert "the stop waits up to 300s" in approval
        done = await bot.wait_status(run_id, *FINAL, timeout_s=60)
        assert done.status == "succeeded", done.summary
        await bot.front_end.idle()
        record = await bot.run(run_id)
        assert record.message_ts is not None
        versions = bot.fake.message_versions(CHANNEL, record.message_ts)
    state = kit.state()
    assert state.busy_since is not None
    # The stop waited until every request had finished.
    assert stop_time(kit) >= state.busy_since + 6.0 - 0.5
    shown = [card_line(v, Step.REQUESTS) for v in versions]
    counts = {m.group(0) for line in shown
              if (m := re.search(r"\d running, \d waiting requests", line))}
    assert len(counts) >= 2, shown  # the counts went down on the card, in place
    assert any("in-flight requests finished after" in line for line in shown)


async def test_force_stops_at_once_and_the_card_said_what_it_interrupts(
        tmp_path: Path, make_sim_host: MakeSimHost) -> None:
    kit = await make_sim_host(access="sshd", config=fast_config(
        busy_running=4, busy_waiting=0, busy_drain_s=120.0))
    kit.set_faults(busy=True)
    async with slack_bot(tmp_path, kit) as bot:
        run_id, approval = await request_and_approve(bot, f"restart {SERVICE} --force")
        assert "--force: will interrupt 4 running requests; the stop does not wait" in approval
        done = await bot.wait_status(run_id, *FINAL, timeout_s=60)
        assert done.status == "succeeded", done.summary
        steps = await bot.runtime.audit.steps(run_id)
    state = kit.state()
    assert state.busy_since is not None
    assert stop_time(kit) < state.busy_since + 60  # long before the requests would end
    requests = next(s for s in steps if s.step == "requests")
    assert requests.status == "ok"
    assert ("--force: stopping with 4 running, 0 waiting requests" in requests.output_tail
            and "which are interrupted" in requests.output_tail), requests.output_tail


async def test_the_card_shows_the_start_up_phases_in_place(tmp_path: Path,
                                                           make_sim_host: MakeSimHost) -> None:
    kit = await make_sim_host(access="sshd", config=fast_config(load_delay_s=4.0))
    async with slack_bot(tmp_path, kit) as bot:
        run_id, _ = await request_and_approve(bot, f"redeploy {SERVICE} --version 0.16.0")
        done = await bot.wait_status(run_id, *FINAL, timeout_s=60)
        assert done.status == "succeeded", done.summary
        await bot.front_end.idle()
        record = await bot.run(run_id)
        assert record.message_ts is not None
        versions = bot.fake.message_versions(CHANNEL, record.message_ts)
    phases = ("loading weights", "weights loaded", "torch.compile", "sizing the KV cache",
              "capturing CUDA graphs", "engine initialised", "starting the API server",
              "API server up", "initialising the engine")
    lines = [card_line(v, Step.HEALTH) for v in versions]
    # How many phases a poll catches depends on the machine's load (the last ones come
    # within half a second); that each phase change is shown is tested on the pure flow
    # (test_flow_gates). Here: the weights load for seconds, so the card shows at least
    # that phase, in place on the same line, between "waiting" and the final result.
    seen = [p for p in phases if any(p in line for line in lines)]
    assert seen, lines
    assert any("elapsed" in line for line in lines)
    assert len(dict.fromkeys(lines)) >= 3, lines
    assert lines[-1].startswith(":white_check_mark:"), lines[-1]


async def test_slack_calls_stay_flat_as_the_start_up_log_grows(tmp_path: Path,
                                                               make_sim_host: MakeSimHost
                                                               ) -> None:
    kit = await make_sim_host(config=fast_config(load_delay_s=1.0))
    counts: list[Counter[str]] = []
    async with slack_bot(tmp_path, kit) as bot:
        for i, lines in enumerate((100, 20_000)):
            kit.update_config(startup_log_lines=lines)
            start = len(bot.fake.calls())
            run_id, _ = await request_and_approve(
                bot, f"redeploy {SERVICE} --version {('0.16.0', '0.15.1')[i]}")
            done = await bot.wait_status(run_id, *FINAL, timeout_s=120)
            assert done.status == "succeeded", done.summary
            await bot.front_end.idle()
            counts.append(Counter(c.method for c in bot.fake.calls()[start:]))
    small, large = counts
    assert small["chat.postMessage"] == large["chat.postMessage"]
    # Card updates follow state changes and time (coalesced every update_interval_s), not
    # lines: 200 times the log costs at most a few more (the slower polls shift them).
    assert large["chat.update"] <= small["chat.update"] + 6, (small, large)
    assert large["chat.update"] <= 40, large


async def test_an_oom_after_more_noise_than_one_journal_read_is_still_found(
        make_sim_host: MakeSimHost, tmp_path: Path) -> None:
    # 1500 lines of noise (more than journal_follow_lines, 1000), then the OOM, logged
    # between two polls (2 s apart, the load takes 1 s), and the process exits 0.3 s after
    # its traceback. journalctl --after-cursor -n 1000 gives the first 1000 after the
    # cursor: a follower that read once a poll would see the unit failed before the OOM,
    # and the run would not say why.
    kit = await make_sim_host(config=fast_config(load_delay_s=1.0, oom_at=0.9,
                                                 oom_exit_delay_s=0.3, startup_log_lines=1500))
    kit.set_faults(oom_at_start=True)
    settings = sim_settings(kit, tmp_path, start_timeout_s=300, health_poll_s=2.0,
                            rollback_on_unhealthy=False)
    async with open_runtime(settings) as rt:
        result, out = await run(rt, Action.RESTART)
    assert result.status == RunStatus.FAILED, out
    assert result.summary.startswith("start-up failed: CUDA out of memory: "), result.summary
    assert sum("cuda graph addresses" in ln for ln in kit.journal()) >= 1500
