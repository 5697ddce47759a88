"""The simulated vLLM server's API and start-up journal: what the readiness gate, the
request drain and the start-up progress read (through the SSH connection, as the
engine reads them)."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from bot.core.metrics import Load, parse_load
from bot.core.readiness import completion_body, completion_text, model_ids, reported_version
from bot.core.startup import StartupWatch, new_lines
from bot.hosts.ssh import SshTransport
from bot.settings import HostSettings
from bot.sim.kit import SimKit, fast_config
from bot.sim.state import DEFAULT_VERSION, StateStore
from bot.sim.vllm_server import metrics_text
from tests.polling import eventually
from tests.support.sim import MakeSimHost


def transport(kit: SimKit) -> SshTransport:
    return SshTransport(kit.hostname, HostSettings(**kit.host_settings()))


def api(kit: SimKit, path: str) -> str:
    return f"http://127.0.0.1:{kit.service_port}{path}"


async def test_models_completions_version_and_metrics(sim_host: SimKit) -> None:
    t = transport(sim_host)
    try:
        models = await t.http_request("GET", api(sim_host, "/v1/models"), timeout_s=5)
        assert model_ids(models.body) == ["kimi-k2.5"]
        assert json.loads(models.body)["data"][0]["owned_by"] == "vllm"
        version = await t.http_request("GET", api(sim_host, "/version"), timeout_s=5)
        assert reported_version(version.body) == DEFAULT_VERSION
        done = await t.http_request(
            "POST",
            api(sim_host, "/v1/completions"),
            timeout_s=5,
            body=completion_body("kimi-k2.5", "The capital of France is", 2),
            content_type="application/json",
        )
        assert done.status == 200 and completion_text(done.body) == " Paris. It"
        wrong = await t.http_request(
            "POST",
            api(sim_host, "/v1/completions"),
            timeout_s=5,
            body=completion_body("llama", "x", 2),
        )
        assert wrong.status == 404 and "does not exist" in wrong.body
        metrics = await t.http_request("GET", api(sim_host, "/metrics"), timeout_s=5)
        load = parse_load(metrics.body)
        assert (load.running, load.waiting, load.idle) == (0, 0, True)
    finally:
        await t.close()
    # Each request is in the server's access log, as uvicorn writes it.
    assert any('"POST /v1/completions HTTP/1.1" 200 OK' in ln for ln in sim_host.journal())


async def test_faults_wrong_model_smoke_fail_and_busy(sim_host: SimKit) -> None:
    sim_host.update_config(busy_drain_s=1.0, busy_running=3, busy_waiting=1)
    sim_host.set_faults(wrong_model=True, smoke_fail=True, busy=True)
    t = transport(sim_host)
    try:
        models = await t.http_request("GET", api(sim_host, "/v1/models"), timeout_s=5)
        assert model_ids(models.body) == ["Kimi-K2-Instruct"]
        smoke = await t.http_request(
            "POST",
            api(sim_host, "/v1/completions"),
            timeout_s=5,
            body=completion_body("Kimi-K2-Instruct", "x", 2),
        )
        assert smoke.status == 500 and "EngineCore" in smoke.body
        first = parse_load(
            (await t.http_request("GET", api(sim_host, "/metrics"), timeout_s=5)).body
        )
        assert first.running == 3 and first.waiting in (0, 1)

        async def idle() -> bool:
            r = await t.http_request("GET", api(sim_host, "/metrics"), timeout_s=5)
            return parse_load(r.body).idle

        await eventually(idle, "the busy requests to finish", 10)
    finally:
        await t.close()


async def test_a_start_logs_its_phases_and_the_journal_follows_by_cursor(
    make_sim_host: MakeSimHost,
) -> None:
    kit = await make_sim_host(config=fast_config(load_delay_s=1.0))
    t = transport(kit)
    unit = kit.config.unit
    try:
        before = await t.run(
            ["journalctl", "-u", unit, "-n", "1", "--show-cursor", "-o", "cat", "-q"], timeout_s=10
        )
        cursor = new_lines(before.stdout)[1]
        assert cursor is not None
        await t.run(["systemctl", "stop", unit], timeout_s=10)
        await t.run(["systemctl", "start", unit], timeout_s=10)
        watch = StartupWatch()
        phases: list[str] = []

        async def ready() -> bool:
            nonlocal cursor
            r = await t.run(
                [
                    "journalctl",
                    "-u",
                    unit,
                    f"--after-cursor={cursor}",
                    "-n",
                    "1000",
                    "--show-cursor",
                    "-o",
                    "cat",
                    "-q",
                ],
                timeout_s=10,
            )
            lines, cursor = new_lines(r.stdout)[0], new_lines(r.stdout)[1] or cursor
            for line in lines:  # line by line: every phase counts, however late the poll
                watch.feed([line])
                phases.append(watch.text())
            return watch.text() == "API server up"

        await eventually(ready, "the start-up to end", 15)
    finally:
        await t.close()
    assert watch.failure is None  # the stop's lines before the start were skipped
    assert len(dict.fromkeys(phases)) >= 3, phases


async def test_oom_at_start_logs_a_traceback_then_exits_later(make_sim_host: MakeSimHost) -> None:
    kit = await make_sim_host(config=fast_config(load_delay_s=1.0, oom_exit_delay_s=3.0))
    kit.set_faults(oom_at_start=True)
    t = transport(kit)
    unit = kit.config.unit
    try:
        await t.run(["systemctl", "stop", unit], timeout_s=10)
        await t.run(["systemctl", "start", unit], timeout_s=10)
        await eventually(
            lambda: any("CUDA out of memory" in ln for ln in kit.journal()), "the OOM traceback", 10
        )
        await eventually(lambda: kit.unit_state() == "failed", "the exit", 15)
        health = await t.http_request("GET", kit.health_url, timeout_s=5)
        assert health.status is None  # it never served
    finally:
        await t.close()
    # When it happened, as the host recorded it (not when this test looked): the process
    # exited oom_exit_delay_s after its traceback, and systemd said so.
    run = kit.state().run
    assert run.started_at is not None
    entries = [e for e in kit.store.journal() if e.ts >= run.started_at]
    oom = next(e for e in entries if "CUDA out of memory" in e.msg)
    exited = next(e for e in entries if "Main process exited" in e.msg)
    assert exited.ts - oom.ts == pytest.approx(3.0)
    assert run.fail_at == exited.ts


async def test_metrics_under_current_and_old_names_read_the_same_load(sim_host: SimKit) -> None:
    """The server's /metrics as vLLM 0.3x writes it (engine labels, the waiting requests by
    reason, vllm:kv_cache_usage_perc) and, with metrics_old_names, as a vLLM before the
    renames did (no engine label, vllm:gpu_cache_usage_perc): one load either way."""
    sim_host.update_config(busy_drain_s=3600.0, busy_running=3, busy_waiting=2)
    sim_host.set_faults(busy=True)
    now = time.time()
    current = metrics_text(sim_host.state(), now)
    assert 'vllm:num_requests_running{engine="0",model_name="kimi-k2.5"} 3.0' in current
    assert 'reason="capacity"} 2.0' in current and "vllm:gpu_cache_usage_perc" not in current
    sim_host.set_faults(metrics_old_names=True)
    old = metrics_text(sim_host.state(), now)
    assert 'vllm:gpu_cache_usage_perc{model_name="kimi-k2.5"}' in old
    assert "engine=" not in old and "vllm:kv_cache_usage_perc" not in old
    assert parse_load(current) == parse_load(old) == Load(3, 2, 0.25)


async def test_a_fault_set_while_the_server_answers_is_seen_by_the_next_request(
    sim_host: SimKit,
) -> None:
    """The server keeps the host's state between requests (parsing it for each one made
    it the bottleneck under a router's load): a change must still reach the next answer."""
    t = transport(sim_host)
    try:

        async def served() -> list[str] | None:
            r = await t.http_request("GET", api(sim_host, "/v1/models"), timeout_s=5)
            return model_ids(r.body)

        assert await served() == ["kimi-k2.5"]
        sim_host.set_faults(wrong_model=True)
        assert await served() == ["Kimi-K2-Instruct"]
        sim_host.set_faults(wrong_model=False)
        assert await served() == ["kimi-k2.5"]
    finally:
        await t.close()


def test_the_cached_state_is_parsed_again_only_when_the_file_was_replaced(
    sim_host: SimKit,
) -> None:
    store = StateStore(sim_host.state_dir)
    first = store.read_cached()
    assert store.read_cached() is first  # unchanged: no second parse
    with store.transaction() as tx:
        tx.state = replace(tx.state, faults=replace(tx.state.faults, busy=True))
    again = store.read_cached()
    assert again is not first and again.faults.busy and not first.faults.busy
