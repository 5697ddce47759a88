"""Reading a host for the deep GPU check, as a generator like ``health_reads``: it
yields each fixed argv (``nvidia-smi -q -x``, then ``dcgmi diag -r 1``)
and is sent its ``CommandResult``; it returns what was read (``DeepRead``), which
``deep_report`` judges with the health check's verdict and the last known GPU count.
NVML's readings (the bot's own host) replace the ``nvidia-smi -q -x`` step."""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass

from bot.core import deep_check as dc
from bot.core.dcgm import DiagReport, parse_diag
from bot.core.deep_query import (
    DCGMI_DIAG_ARGV,
    DEEP_QUERY_ARGV,
    NOT_FOUND_EXIT,
    DeepReading,
    Mismatch,
    mismatch_of,
    parse_deep_query,
)
from bot.core.health_reads import LOST_GPU_EXIT
from bot.core.health_types import HostHealth, Level
from bot.core.results import CommandResult
from bot.errors import GpuQueryError


@dataclass(frozen=True, slots=True)
class DeepRead:
    readings: tuple[DeepReading, ...] = ()
    count: int | None = None  # GPUs the driver lists now (None: not read)
    mismatch: Mismatch | None = None
    query_error: str | None = None  # nvidia-smi -q -x failed otherwise: why
    dcgm: DiagReport | None = None
    dcgm_error: str | None = None  # dcgmi is there but gave no result: why
    driver_version: str | None = None


_END = "</nvidia_smi_log>"

DeepReads = Generator[tuple[str, ...], CommandResult, DeepRead]


def _said(r: CommandResult) -> str:
    if r.exit_status is None:
        return r.stderr.strip()[:200] or "no answer"
    tail = " ".join((r.stderr.strip() or r.stdout.strip()).split())[:200]
    return f"exit {r.exit_status}" + (f": {tail}" if tail else "")


def deep_reads(host: str, nvml: Sequence[DeepReading] | None = None) -> DeepReads:
    read = DeepRead(readings=tuple(nvml or ()), count=None if nvml is None else len(nvml))
    if nvml is None:
        q = yield DEEP_QUERY_ARGV
        if (m := mismatch_of(q.exit_status, q.stdout, q.stderr)) is not None:
            read = DeepRead(mismatch=m)
        elif q.exit_status not in (0, LOST_GPU_EXIT):
            read = DeepRead(query_error=f"nvidia-smi -q -x failed ({_said(q)})")
        else:
            try:
                # A GPU fallen off the bus (exit 15): the others' report, then its
                # "Unable to determine the device handle" line; the count tells of it.
                xml = q.stdout.split(_END)[0] + _END
                parsed = parse_deep_query(host, xml)
            except GpuQueryError as e:
                read = DeepRead(query_error=e.reason)
            else:
                read = DeepRead(
                    parsed.gpus, len(parsed.gpus), None, None, None, None, parsed.driver_version
                )
    d = yield DCGMI_DIAG_ARGV
    if d.exit_status == NOT_FOUND_EXIT:
        return read  # no dcgmi: the diagnostics are skipped, and the report says so
    report = parse_diag(d.stdout)
    return _with_dcgm(read, report, None if report.ran else _said(d))


def _with_dcgm(read: DeepRead, report: DiagReport, error: str | None) -> DeepRead:
    return DeepRead(
        read.readings,
        read.count,
        read.mismatch,
        read.query_error,
        report,
        error,
        read.driver_version,
    )


def deep_report(
    host: str,
    read: DeepRead,
    health: HostHealth | None,
    health_error: str | None,
    last_count: int | None,
    labels: Mapping[str, str] | None = None,
) -> dc.DeepReport:
    """Everything judged, host findings first, then each GPU's."""
    findings = [dc.judge_driver(read.mismatch)]
    if read.query_error is not None:
        findings.append(
            dc.DeepFinding(dc.Check.PCIE, Level.WARN, read.query_error, "check the driver")
        )
    findings.append(dc.judge_count(read.count, last_count))
    findings += dc.judge_dcgm(read.dcgm, read.dcgm_error)
    findings += dc.judge_health(health, health_error)
    findings += dc.judge_gpus(read.readings, labels)
    return dc.DeepReport(host, tuple(findings))
