"""Model-level readiness, the request drain and start-up progress end to end: the
simulated host behind a real OpenSSH sshd, a real audit database, and (for the card)
the real bolt app over the fake Slack."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bot.core.events import Event, EventSink, StepProgress
from bot.core.plan import STEP_TITLES, Step
from bot.core.startup import PHASE_LABELS, StartupWatch
from bot.core.status import Action, RunStatus
from bot.engine.runtime import open_runtime
from bot.sim.kit import READY_SETTINGS, SERVICE, SimKit, fast_config
from tests.slack_harness import BOB, CHANNEL, SlackBot, blocks_text, slack_bot
from tests.support.runs import run
from tests.support.sim import MakeSimHost, sim_settings

FINAL = ("succeeded", "failed", "rolled_back", "aborted", "cancelled")


async def test_the_wrong_model_never_ends_succeeded(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    kit = await make_sim_host(access="sshd")
    kit.set_faults(wrong_model=True)
    async with open_runtime(sim_settings(kit, tmp_path, **READY_SETTINGS)) as rt:
        result, out = await run(rt, Action.REDEPLOY, version="0.31.0")
        assert result.status != RunStatus.SUCCEEDED, out
        steps = await rt.audit.steps(result.run_id)
    ready = next(s for s in steps if s.step == "readiness")
    assert ready.status == "failed"
    assert "lists Kimi-K2-Instruct, not kimi-k2.5" in ready.output_tail
    assert "FAILED: GET http://127.0.0.1:" in ready.output_tail  # each check, in the audit log
    assert "start-up failed" not in result.summary


async def test_a_failing_smoke_test_never_ends_succeeded(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
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


async def test_a_ready_server_passes_and_the_checks_are_recorded(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    kit = await make_sim_host(access="sshd")
    async with open_runtime(sim_settings(kit, tmp_path, **READY_SETTINGS)) as rt:
        result, out = await run(rt, Action.REDEPLOY, version="0.31.0")
        assert result.status == RunStatus.SUCCEEDED, out
        ready = next(s for s in await rt.audit.steps(result.run_id) if s.step == "readiness")
    assert ready.output_tail.splitlines() == [
        f"ok: GET http://127.0.0.1:{kit.service_port}/v1/models lists kimi-k2.5",
        f"ok: POST http://127.0.0.1:{kit.service_port}/v1/completions answered ' Paris. It is "
        "also the largest city in France.', matches 'Paris'",
        f"ok: GET http://127.0.0.1:{kit.service_port}/version reports 0.31.0, the installed "
        "version",
    ]
    assert ("http", ("POST", "/v1/completions")) in [(c.tool, c.argv) for c in kit.calls()]


async def test_an_oom_at_start_fails_within_seconds_of_the_traceback(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    # The process would exit a minute after its traceback; the gate must not wait for it,
    # nor for start_timeout_s.
    kit = await make_sim_host(
        access="sshd", config=fast_config(load_delay_s=2.0, oom_exit_delay_s=60.0)
    )
    kit.set_faults(oom_at_start=True)
    settings = sim_settings(
        kit, tmp_path, start_timeout_s=300, health_poll_s=0.2, rollback_on_unhealthy=False
    )
    async with open_runtime(settings) as rt:
        result, out = await run(rt, Action.RESTART)
        health = next(s for s in await rt.audit.steps(result.run_id) if s.step == "health")
    assert result.status == RunStatus.FAILED, out
    # The journal line ended the wait: not the unit failing ("is failed after start"), nor
    # start_timeout_s ("not healthy after 300s").
    assert result.summary.startswith("start-up failed: CUDA out of memory: (EngineCore_DP0 pid=")
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in health.output_tail
    # The run is over and the process has not exited yet: the gate ended before the exit
    # (60 s after the traceback), so long before start_timeout_s (300 s).
    assert kit.unit_state() == "active"


# ---- through Slack ----------------------------------------------------------------------------


def card_line(card: dict[str, Any], step: Step) -> str:
    title = STEP_TITLES[step]
    return next((ln for ln in blocks_text(card).splitlines() if title in ln), "")


async def request_and_approve(bot: SlackBot, command: str) -> tuple[int, str]:
    await bot.command(command)
    record = await bot.wait_for_run(
        lambda r: r.message_ts is not None and r.status == RunStatus.PENDING_APPROVAL, "the card"
    )
    approval_card = blocks_text(await bot.card(record.id))
    await bot.click("approve", record.id, user=BOB)
    return record.id, approval_card


def stop_time(kit: SimKit) -> float:
    return next(c.ts for c in kit.calls() if c.argv[:2] == ("systemctl", "stop"))


async def test_busy_requests_delay_the_stop_and_the_card_shows_their_counts(
    tmp_path: Path, make_sim_host: MakeSimHost
) -> None:
    kit = await make_sim_host(
        access="sshd", config=fast_config(busy_running=4, busy_waiting=2, busy_drain_s=6.0)
    )
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
    counts = {
        m.group(0) for line in shown if (m := re.search(r"\d running, \d waiting requests", line))
    }
    assert len(counts) >= 2, shown  # the counts went down on the card, in place
    assert any("in-flight requests finished after" in line for line in shown)


async def test_force_stops_at_once_and_the_card_said_what_it_interrupts(
    tmp_path: Path, make_sim_host: MakeSimHost
) -> None:
    kit = await make_sim_host(
        access="sshd", config=fast_config(busy_running=4, busy_waiting=0, busy_drain_s=120.0)
    )
    kit.set_faults(busy=True)
    async with slack_bot(tmp_path, kit) as bot:
        run_id, approval = await request_and_approve(bot, f"restart {SERVICE} --force")
        assert "--force: will interrupt 4 running requests; the stop does not wait" in approval
        done = await bot.wait_status(run_id, *FINAL, timeout_s=60)
        assert done.status == "succeeded", done.summary
        steps = await bot.runtime.audit.steps(run_id)
    # It stopped while all 4 requests still ran (they would have run for 120 s).
    requests = next(s for s in steps if s.step == "requests")
    assert requests.status == "ok"
    assert (
        "--force: stopping with 4 running, 0 waiting requests" in requests.output_tail
        and "which are interrupted" in requests.output_tail
    ), requests.output_tail


async def test_the_card_shows_the_start_up_phases_in_place(
    tmp_path: Path, make_sim_host: MakeSimHost
) -> None:
    # The gate sends only the phase it reads at each poll, and the card shows only the
    # latest progress at each update (every 0.2 s): a phase shorter than a poll cycle over
    # sshd on a loaded machine (CI runs 6 workers on 2 cores) may be sent or shown never.
    # So each phase must outlast both, which is what this test checks ("the status card
    # shows at least three distinct start-up phases during a start"): rendering the texts
    # the flow sent would not do, as the flow itself skips a phase its poll missed. The
    # simulated vLLM logs "process started" for 4 s, initialises the engine for 4 s
    # (startup_phase_min_s), then loads weights for 5.2 s (0.65 of load_delay_s): a
    # 14.4 s start. The later phases come within a second and a slow poll may skip them.
    kit = await make_sim_host(
        access="sshd", config=fast_config(load_delay_s=8.0, startup_phase_min_s=4.0)
    )
    services = {SERVICE: kit.service_settings(start_timeout_s=120)}
    async with slack_bot(tmp_path, kit, services=services) as bot:
        run_id, _ = await request_and_approve(bot, f"restart {SERVICE}")
        done = await bot.wait_status(run_id, *FINAL, timeout_s=120)
        assert done.status == "succeeded", done.summary
        await bot.front_end.idle()
        record = await bot.run(run_id)
        assert record.message_ts is not None
        versions = bot.fake.message_versions(CHANNEL, record.message_ts)
    lines = [card_line(v, Step.HEALTH) for v in versions]
    # The running step's lines only (the final one names the last phase too).
    running = [line for line in lines if "elapsed" in line]
    seen = [label for label in PHASE_LABELS.values() if any(label in line for line in running)]
    assert len(seen) >= 3, lines
    # In place: the one card's health line, the result replacing the phases at the end.
    assert lines[-1].startswith(":white_check_mark:"), lines[-1]


class HealthProgress:
    """Passes every event on to the card's sink, keeping the health gate's progress
    texts: what the flow sent, before the card coalesced anything."""

    def __init__(self, sink: EventSink, texts: list[str]) -> None:
        self.sink, self.texts = sink, texts

    async def handle(self, event: Event) -> None:
        if isinstance(event, StepProgress) and event.step == Step.HEALTH:
            self.texts.append(event.text)
        await self.sink.handle(event)


async def test_slack_calls_stay_flat_as_the_start_up_log_grows(
    tmp_path: Path, make_sim_host: MakeSimHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 3 s load: the gate reads the journal several times in each phase.
    kit = await make_sim_host(config=fast_config(load_delay_s=3.0))
    # The elapsed time alone is re-sent every progress_interval_s (tested on the pure flow,
    # test_flow_gates): beyond these runs, so every progress sent here is a phase change.
    services = {SERVICE: kit.service_settings(progress_interval_s=600)}
    counts: list[Counter[str]] = []
    sent: list[list[str]] = []
    async with slack_bot(tmp_path, kit, services=services) as bot:
        execute = bot.runtime.engine.execute

        async def tapped(run_id: int, sink: EventSink, gate: Any = None) -> Any:
            sent.append([])
            return await execute(run_id, HealthProgress(sink, sent[-1]), gate=gate)

        monkeypatch.setattr(bot.runtime.engine, "execute", tapped)
        for i, lines in enumerate((100, 20_000)):
            kit.update_config(startup_log_lines=lines)
            start = len(bot.fake.calls())
            run_id, _ = await request_and_approve(
                bot, f"redeploy {SERVICE} --version {('0.31.0', '0.30.0')[i]}"
            )
            done = await bot.wait_status(run_id, *FINAL, timeout_s=120)
            assert done.status == "succeeded", done.summary
            await bot.front_end.idle()
            counts.append(Counter(c.method for c in bot.fake.calls()[start:]))
    small, large = counts
    assert small["chat.postMessage"] == large["chat.postMessage"]
    # 20,000 lines take 20 or more journal reads (journal_follow_lines = 1000): the
    # progress follows the phases, never the reads or the lines. Each run sends each of
    # the phase texts its journal holds at most once, so the card (which shows what is
    # sent, coalesced) changes no more often however long the log.
    shown = phase_texts(kit.journal())
    for texts in sent:
        assert texts and set(texts) <= shown, (texts, shown)
        assert len(texts) == len(set(texts)), texts


def phase_texts(journal: list[str]) -> set[str]:
    """Every phase text the journal's lines give, read one by one."""
    watch = StartupWatch()
    texts = {watch.text()}
    for line in journal:
        watch.feed([line])
        texts.add(watch.text())
    return texts


async def test_an_oom_after_more_noise_than_one_journal_read_is_still_found(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    # 1500 lines of noise (more than journal_follow_lines, 1000), then the OOM, logged
    # between two polls (2 s apart, the load takes 1 s), and the process exits 0.3 s after
    # its traceback. journalctl --after-cursor -n 1000 gives the first 1000 after the
    # cursor: a follower that read once a poll would see the unit failed before the OOM,
    # and the run would not say why.
    kit = await make_sim_host(
        config=fast_config(
            load_delay_s=1.0, oom_at=0.9, oom_exit_delay_s=0.3, startup_log_lines=1500
        )
    )
    kit.set_faults(oom_at_start=True)
    settings = sim_settings(
        kit, tmp_path, start_timeout_s=300, health_poll_s=2.0, rollback_on_unhealthy=False
    )
    async with open_runtime(settings) as rt:
        result, out = await run(rt, Action.RESTART)
    assert result.status == RunStatus.FAILED, out
    assert result.summary.startswith("start-up failed: CUDA out of memory: "), result.summary
    assert sum("cuda graph addresses" in ln for ln in kit.journal()) >= 1500


async def test_an_empty_smoke_completion_never_ends_succeeded(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    # 200 with an empty text (the end-of-sequence token first). Without smoke_expect any
    # non-empty text passes, so the empty one must fail on its own.
    kit = await make_sim_host()
    kit.set_faults(smoke_empty=True)
    settings = sim_settings(
        kit, tmp_path, served_model="kimi-k2.5", smoke_prompt="Hello", rollback_on_unhealthy=False
    )
    async with open_runtime(settings) as rt:
        result, out = await run(rt, Action.RESTART)
    assert result.status == RunStatus.FAILED, out
    assert "/v1/completions answered an empty completion" in result.summary, result.summary
    assert result.summary.endswith("The service is UP but NOT READY (unit active)."), result.summary


# ---- issue 17: a load that cannot be read (D5), a thread's exception at start (D4) ----------


async def test_a_server_without_vllm_gauges_is_not_stopped_unless_forced(
    tmp_path: Path, make_sim_host: MakeSimHost
) -> None:
    # /metrics answers 200 with prometheus_client's families only, as a vLLM started with
    # --disable-log-stats does: the load is unknown, which is not idle.
    kit = await make_sim_host(access="sshd")
    kit.set_faults(metrics_no_vllm=True)
    async with slack_bot(tmp_path, kit) as bot:
        run_id, approval = await request_and_approve(bot, f"redeploy {SERVICE} --version 0.31.0")
        assert (
            "Load now: unknown on gpu-node-1 (/metrics has no vllm:num_requests_running or "
            "vllm:num_requests_waiting): unknown is not idle"
        ) in approval, approval
        done = await bot.wait_status(run_id, *FINAL, timeout_s=60)
        assert done.status == "aborted" and done.summary is not None, done.summary
        assert "the load is unknown: http://127.0.0.1:" in done.summary
        assert (
            "has no vllm:num_requests_running or vllm:num_requests_waiting, and "
            "vllm-kimi-k25 is active; pass --force to stop anyway. Service untouched."
        ) in done.summary
        assert not any(c.argv[:2] == ("systemctl", "stop") for c in kit.calls())
        assert kit.unit_state() == "active"
        assert kit.state().installed_version != "0.31.0"
        requests = next(s for s in await bot.runtime.audit.steps(run_id) if s.step == "requests")
        assert requests.status == "failed"
        # With --force the same redeploy goes on, and its card said what that means.
        run_id, approval = await request_and_approve(
            bot, f"redeploy {SERVICE} --version 0.31.0 --force"
        )
        assert "--force stops it anyway, interrupting whatever runs there" in approval
        done = await bot.wait_status(run_id, *FINAL, timeout_s=90)
        assert done.status == "succeeded", done.summary
        requests = next(s for s in await bot.runtime.audit.steps(run_id) if s.step == "requests")
    assert requests.status == "ok"
    assert "--force: stopping with the load unknown" in requests.output_tail
    assert any(c.argv[:2] == ("systemctl", "stop") for c in kit.calls())
    assert kit.state().installed_version == "0.31.0"


async def test_a_start_whose_usage_stats_thread_dies_still_succeeds(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    # vLLM's usage-stats thread cannot write ~/.config/vllm (ProtectHome=) and dies with a
    # traceback while the server comes up: the start must succeed, with the warning.
    kit = await make_sim_host(access="sshd")
    kit.set_faults(usage_thread_exception=True)
    async with open_runtime(sim_settings(kit, tmp_path, **READY_SETTINGS)) as rt:
        result, out = await run(rt, Action.RESTART)
        assert result.status == RunStatus.SUCCEEDED, out
        health = next(s for s in await rt.audit.steps(result.run_id) if s.step == "health")
    assert any("Exception in thread Thread-3 (_report_usage_worker):" in ln for ln in kit.journal())
    assert (
        "warning: thread Thread-3 (_report_usage_worker) died: PermissionError: [Errno 13] "
        "Permission denied: '/home/vllm'"
    ) in out, out
    assert "Exception in thread Thread-3 (_report_usage_worker):" in health.output_tail
    assert health.output_tail.rstrip().endswith(
        "PermissionError: [Errno 13] Permission denied: '/home/vllm'"
    )


async def test_a_server_under_the_old_metric_names_is_drained_by_them(
    tmp_path: Path, make_sim_host: MakeSimHost
) -> None:
    """A vLLM before the renames (V0's help texts, no engine label, the KV cache as
    vllm:gpu_cache_usage_perc, since hidden and removed): its request gauges are read and
    the stop waits for them, as for the current names (the test above)."""
    kit = await make_sim_host(
        access="sshd", config=fast_config(busy_running=2, busy_waiting=1, busy_drain_s=3.0)
    )
    kit.set_faults(busy=True, metrics_old_names=True)
    async with open_runtime(sim_settings(kit, tmp_path)) as rt:
        result, out = await run(rt, Action.RESTART)
        steps = {s.step: s for s in await rt.audit.steps(result.run_id)}
    assert result.status == RunStatus.SUCCEEDED, out
    requests = steps["requests"].output_tail
    assert "in-flight requests finished after" in requests, requests
    assert "running" in requests and "KV cache" in requests  # the old KV name was read too
    state = kit.state()
    assert state.busy_since is not None and stop_time(kit) >= state.busy_since + 3.0 - 0.5
