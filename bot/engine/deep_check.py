"""The deep GPU check of a host (issue 23): ``gpus --deep`` on the terminal and
``/vllm gpus --deep`` in Slack, read-only.

It runs the same reads as ``gpus`` (``bot.hosts.fleet.query_host``: the GPU query and
the health check), then the deep reads (``bot.core.deep_reads``: ``nvidia-smi -q -x``
and ``dcgmi diag -r 1``) over the same pooled transport, and judges them with the
host's last known GPU count. On the bot's own host (``address = "local"``) NVML reads
the GPUs instead of the two nvidia-smi steps (``bot.hosts.nvml_deep``); where NVML
fails (no driver, the driver/library mismatch) nvidia-smi reads them and the report
says why. That count is the previous deep check's: each check
records what it read as a run-less GPU snapshot labelled ``deep_check`` (the audit log's
typed ``Snapshot`` record), so a GPU that stops being listed is seen the next time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from bot.audit.store import AuditLog
from bot.core.dcgm import DCGM_TIMEOUT_S
from bot.core.deep_check import Check, DeepFinding, DeepReport
from bot.core.deep_reads import DeepRead, DeepReads, deep_reads, deep_report
from bot.core.health_types import Level, worst
from bot.errors import AuditError, ChatOpsError, GpuQueryError, HostError
from bot.hosts.base import CommandResult, HostTransport
from bot.hosts.fleet import DEFAULT_HOST_TIMEOUT_S, query_host
from bot.hosts.nvml_deep import probe_local_deep
from bot.hosts.pool import HostPool
from bot.settings import Settings

log = logging.getLogger(__name__)

LABEL = "deep_check"


async def _drive(transport: HostTransport, reads: DeepReads, timeout_s: float) -> DeepRead:
    result: CommandResult | None = None
    try:
        while True:
            argv = reads.send(result)  # type: ignore[arg-type]  # None only to start it
            try:
                result = await transport.run(argv, timeout_s=max(timeout_s, DCGM_TIMEOUT_S))
            except HostError as e:
                result = CommandResult(
                    argv=argv, exit_status=None, stdout="", stderr=e.reason, duration_s=0.0
                )
    except StopIteration as stop:
        read: DeepRead = stop.value
        return read


async def _last_count(audit: AuditLog, host: str) -> int | None:
    snap = await audit.last_snapshot(host, LABEL)
    count = None if snap is None else snap.data.get("gpus")
    return count if isinstance(count, int) else None


async def _local_reads(settings: Settings, pool: HostPool, host: str) -> DeepReads:
    """The deep reads of ``host``: NVML's readings where the bot runs on it, else (and
    where NVML fails, saying why) the nvidia-smi commands."""
    cfg = settings.hosts.get(host)
    if cfg is None or not cfg.is_local:
        return deep_reads(host)
    try:
        nvml = await asyncio.to_thread(probe_local_deep, pool.nvml)
    except GpuQueryError as e:
        log.warning("NVML deep read failed on %s, reading nvidia-smi: %s", host, e.reason)
        return deep_reads(host, nvml_error=e.reason)
    return deep_reads(host, nvml.readings, driver=nvml.driver_version)


async def check_host(
    settings: Settings, pool: HostPool, audit: AuditLog, host: str, timeout_s: float
) -> DeepReport:
    row = await query_host(settings, pool, host, timeout_s)
    if row.unreachable:
        what = f"no answer ({row.error})"
        return DeepReport(
            host, (DeepFinding(Check.HEALTH, Level.CRITICAL, what, "check the host"),)
        )
    read = await _drive(pool.get(host), await _local_reads(settings, pool, host), timeout_s)
    # The audit log failing (locked, full) must not take the reads' findings with it.
    unrecorded: str | None = None
    try:
        last = await _last_count(audit, host)
        if read.count is not None:
            uuids = [r.uuid for r in read.readings]
            data = {"gpus": read.count, "uuids": uuids, "driver": read.driver_version}
            await audit.add_snapshot(None, host, LABEL, data)
    except AuditError as e:
        last, unrecorded = None, str(e)
    labels = {g.uuid: f"GPU {g.index}" for g in (row.snapshot.gpus if row.snapshot else ())}
    health_error = row.health_error or (row.error if row.snapshot is None else None)
    report = deep_report(host, read, row.health, health_error, last, labels)
    return report if unrecorded is None else _count_unrecorded(report, unrecorded)


def _count_unrecorded(report: DeepReport, why: str) -> DeepReport:
    """``report`` with its GPU count's finding said not compared: the audit log failed."""
    what = f"GPU count not compared with the last check, nor recorded (audit log: {why})"
    action = "check the bot's audit database"
    findings = tuple(
        DeepFinding(Check.GPU_COUNT, worst([f.level, Level.WARN]), what, action)
        if f.check == Check.GPU_COUNT
        else f
        for f in report.findings
    )
    return DeepReport(report.host, findings)


async def deep_check(
    settings: Settings,
    pool: HostPool,
    audit: AuditLog,
    hosts: Sequence[str],
    timeout_s: float = DEFAULT_HOST_TIMEOUT_S,
) -> list[DeepReport]:
    """Every host at once, in the order of ``hosts``; a host that fails says why."""

    async def one(host: str) -> DeepReport:
        try:
            return await check_host(settings, pool, audit, host, timeout_s)
        except ChatOpsError as e:
            # Not judged at all: an unknown, so a FAIL (as a host that does not answer).
            what = f"not read ({e}): nothing says its GPUs are fit"
            finding = DeepFinding(Check.HEALTH, Level.CRITICAL, what, "check the host")
            return DeepReport(host, (finding,))

    return list(await asyncio.gather(*(one(h) for h in hosts)))


def deep_text(reports: Sequence[DeepReport]) -> str:
    return "\n\n".join(r.text() for r in reports)


_FIRST = {Level.CRITICAL: 0, Level.WARN: 1, Level.OK: 2}


def deep_summary(reports: Sequence[DeepReport]) -> str:
    """Each host's verdict with only its findings that need a look, failing hosts first:
    for an answer where ``deep_text`` does not fit (a host's ok lines would push another
    host's failure past the cut; the full text goes beside it)."""
    ordered = sorted(reports, key=lambda r: _FIRST[r.level])
    return "\n".join(r.summary() for r in ordered)
