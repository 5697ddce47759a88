"""Issue 22, item 1: the bot's own Prometheus metrics, scraped from the real endpoint
(aiohttp on 127.0.0.1) and read with prometheus_client's own parser, after a rollback, a
redeploy and a refusal driven through the engine against the simulated host behind a
real sshd."""

from __future__ import annotations

import io
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from bot.audit.store import AuditLog
from bot.core.plan import Step
from bot.core.status import Action, RunStatus, Source
from bot.engine.exporter import Exporter
from bot.engine.metrics_http import METRICS_PATH, start_metrics
from bot.engine.run_results import Refused
from bot.engine.runtime import open_runtime
from bot.errors import ConfigError
from bot.settings import load_settings
from bot.sim.kit import SERVICE, SimKit
from tests.support.audit_db import Target
from tests.support.sim import sim_settings
from tests.test_environment_e2e import NEW, Tap, redeploy


async def scrape(port: int) -> tuple[str, list[Sample]]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}{METRICS_PATH}") as resp,
    ):
        assert resp.status == 200
        assert resp.headers["Content-Type"] == CONTENT_TYPE_LATEST
        text = await resp.text()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    return text, samples


def parse(text: bytes) -> list[Sample]:
    return [s for f in text_string_to_metric_families(text.decode()) for s in f.samples]


def value(samples: list[Sample], name: str, **labels: str) -> float | None:
    for s in samples:
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return None


async def test_a_scrape_after_a_rollback_a_redeploy_and_a_refusal(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    kit = sim_sshd_host
    settings = sim_settings(kit, tmp_path, start_timeout_s=1.5)
    async with open_runtime(settings) as rt:
        runner, port = await start_metrics(rt.metrics, rt.audit, rt.writer, "127.0.0.1", 0)
        try:
            _, before = await scrape(port)
            assert value(before, "vllm_chatops_runs_total") is None  # nothing ran yet
            # A build that never turns healthy: rolled back.
            kit.set_faults(health_503=True)
            tap = Tap(io.StringIO())
            tap.on_start[Step.ROLLBACK] = lambda: kit.set_faults(health_503=False)
            bad, out = await redeploy(rt, tap, version=NEW, index="nightly")
            assert bad.status == RunStatus.ROLLED_BACK, out
            good, out = await redeploy(rt, version=NEW, index="nightly")
            assert good.status == RunStatus.SUCCEEDED, out
            # The requester approving their own request: refused (and audited).
            plan = rt.engine.plan(Action.REDEPLOY, SERVICE, version=NEW, index="nightly")
            pending = await rt.lifecycle.request(plan, requested_by="U0ALICE", source=Source.CLI)
            said = await rt.lifecycle.approve(pending.id, user="U0ALICE", membership={})
            assert isinstance(said, Refused)
            text, samples = await scrape(port)
            held = await rt.audit.locks_held()
        finally:
            await runner.cleanup()
    runs = "vllm_chatops_runs_total"
    common = {"action": "redeploy", "service": SERVICE}
    assert value(samples, runs, status="rolled_back", **common) == 1, text
    assert value(samples, runs, status="succeeded", **common) == 1, text
    assert value(samples, "vllm_chatops_rollbacks_total", service=SERVICE) == 1
    assert value(samples, "vllm_chatops_refusals_total", reason=str(said.code)) == 1
    # Both runs stopped the service and brought it back: two outages, each at least the
    # simulated model load, far below a run.
    assert value(samples, "vllm_chatops_outage_seconds_count", service=SERVICE) == 2
    outage = value(samples, "vllm_chatops_outage_seconds_sum", service=SERVICE)
    run = value(samples, "vllm_chatops_run_duration_seconds_sum", action="redeploy")
    assert outage is not None and run is not None and 0 < outage < run
    stop = value(
        samples, "vllm_chatops_step_duration_seconds_count", action="redeploy", step="stop"
    )
    assert stop == 2  # each run's stop (the rollback's own stop is rollback_stop)
    assert value(samples, "vllm_chatops_approval_wait_seconds_count", action="redeploy") == 2
    # From the database: the refused approval left its request pending; no lock is held
    # by a finished run; the last success and what it left.
    assert value(samples, "vllm_chatops_runs_in_flight", status="pending_approval") == 1
    assert value(samples, "vllm_chatops_runs_in_flight", status="running") == 0
    # The pending request's lock scopes (its service and its host), nobody else's.
    assert list(held) == [pending.id]
    assert value(samples, "vllm_chatops_locks_held") == len(held[pending.id]) == 2
    last = value(
        samples, "vllm_chatops_last_successful_redeploy_timestamp_seconds", service=SERVICE
    )
    assert last is not None and last > 1.7e9
    assert value(samples, "vllm_chatops_deployed_info", service=SERVICE, version=NEW) == 1
    assert value(samples, "vllm_chatops_gpu_health_level", host=kit.hostname, gpu="0") == 0
    assert value(samples, "vllm_chatops_audit_database_up") == 1
    assert value(samples, "vllm_chatops_audit_journal_records") == 0
    assert value(samples, "vllm_chatops_build_info") == 1
    # No person is a label.
    assert "U0ALICE" not in text and "U0BOB" not in text


def test_listen_must_be_host_and_port(tmp_path: Path) -> None:
    path = tmp_path / "chatops.toml"
    for bad in ("9464", "localhost:", ":9464", "127.0.0.1:99999"):
        path.write_text(f'[metrics]\nlisten = "{bad}"\n')
        with pytest.raises(ConfigError) as caught:
            load_settings(path)
        assert "is not host:port" in str(caught.value)
    path.write_text('[metrics]\nlisten = "[::1]:9464"\n')
    assert load_settings(path).metrics.address() == ("::1", 9464)


async def test_a_database_that_cannot_be_read_says_so_and_keeps_the_counters(
    audit_target: Target,
) -> None:
    """Issue 21: the scrape reads what every replica shares from the database; when it
    cannot (down, restarting, locked past the busy timeout: here, closed), the gauge says
    so and the process's own counters are still served."""
    exporter = Exporter()
    audit = await AuditLog.open(audit_target)
    up = parse(await exporter.scrape(audit, 0))
    assert value(up, "vllm_chatops_audit_database_up") == 1
    await audit.close()
    down = parse(await exporter.scrape(audit, 3))
    assert value(down, "vllm_chatops_audit_database_up") == 0
    assert value(down, "vllm_chatops_audit_journal_records") == 3
    assert value(down, "vllm_chatops_build_info") == 1
