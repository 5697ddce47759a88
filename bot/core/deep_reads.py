"""Reading a host for the deep GPU check, as a generator like ``health_reads``: it
yields each fixed argv (``nvidia-smi -q -x``, ``nvidia-smi nvlink -s`` where it listed
GPUs, then ``dcgmi diag -r 1``) and is sent its ``CommandResult``; it returns what was
read (``DeepRead``), which ``deep_report`` judges with the health check's verdict and
the last known GPU count. NVML's readings (the bot's own host, NVLink included) replace
the two nvidia-smi steps; where NVML failed, they run and the report says why."""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, replace

from bot.core import deep_check as dc
from bot.core.dcgm import DiagReport, parse_diag
from bot.core.deep_query import (
    DCGMI_DIAG_ARGV,
    DEEP_QUERY_ARGV,
    NOT_FOUND_EXIT,
    NVLINK_ARGV,
    DeepReading,
    Mismatch,
    mismatch_of,
    parse_deep_query,
    parse_nvlink,
)
from bot.core.health_reads import LOST_GPU_EXIT
from bot.core.health_types import HostHealth
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
    nvlink_error: str | None = None  # nvidia-smi nvlink -s gave no answer: why (a skip)
    nvml: bool = False  # the readings are NVML's (the bot's own host)
    nvml_error: str | None = None  # NVML failed on the bot's own host: why


_END = "</nvidia_smi_log>"

DeepReads = Generator[tuple[str, ...], CommandResult, DeepRead]


def _said(r: CommandResult) -> str:
    if r.exit_status is None:
        return r.stderr.strip()[:200] or "no answer"
    tail = " ".join((r.stderr.strip() or r.stdout.strip()).split())[:200]
    return f"exit {r.exit_status}" + (f": {tail}" if tail else "")


def deep_reads(
    host: str,
    nvml: Sequence[DeepReading] | None = None,
    *,
    driver: str | None = None,
    nvml_error: str | None = None,
) -> DeepReads:
    """``nvml``: the GPUs' readings from NVML (``driver``: its driver version), which
    replace ``nvidia-smi -q -x`` and ``nvidia-smi nvlink -s``. ``nvml_error``: why NVML
    could not be used on the bot's own host, said in the report."""
    if nvml is not None:
        read = DeepRead(tuple(nvml), len(nvml), driver_version=driver, nvml=True)
    else:
        q = yield DEEP_QUERY_ARGV
        read = replace(read_query(host, q), nvml_error=nvml_error)
        if read.readings:
            n = yield NVLINK_ARGV
            read = _with_nvlink(read, n)
    d = yield DCGMI_DIAG_ARGV
    if d.exit_status == NOT_FOUND_EXIT:
        return read  # no dcgmi: the diagnostics are skipped, and the report says so
    report = parse_diag(d.stdout)
    return replace(read, dcgm=report, dcgm_error=None if report.ran else _said(d))


def read_query(host: str, q: CommandResult) -> DeepRead:
    """What one ``nvidia-smi -q -x`` read (its GPUs, or the mismatch, or why not)."""
    if (m := mismatch_of(q.exit_status, q.stdout, q.stderr)) is not None:
        return DeepRead(mismatch=m)
    if q.exit_status not in (0, LOST_GPU_EXIT):
        return DeepRead(query_error=f"nvidia-smi -q -x failed ({_said(q)})")
    try:
        # A GPU fallen off the bus (exit 15): the others' report, then its "Unable to
        # determine the device handle" line; the count tells of it.
        parsed = parse_deep_query(host, q.stdout.split(_END)[0] + _END)
    except GpuQueryError as e:
        return DeepRead(query_error=e.reason)
    return DeepRead(parsed.gpus, len(parsed.gpus), driver_version=parsed.driver_version)


def _with_nvlink(read: DeepRead, n: CommandResult) -> DeepRead:
    """Each GPU's links, by uuid (else by its place in the list, as both list by
    index); a command that fails or is unsupported is a skip, said, never a failure."""
    if n.exit_status != 0:
        return replace(read, nvlink_error=f"nvidia-smi nvlink -s: {_said(n)}")
    listed = parse_nvlink(n.stdout)
    by_uuid = {g.uuid: g.links for g in listed}
    by_index = {g.index: g.links for g in listed}
    matched = any(r.uuid in by_uuid for r in read.readings)
    readings = tuple(
        replace(r, nvlink=by_uuid.get(r.uuid) if matched else by_index.get(i))
        for i, r in enumerate(read.readings)
    )
    return replace(read, readings=readings)


def deep_report(
    host: str,
    read: DeepRead,
    health: HostHealth | None,
    health_error: str | None,
    last_count: int | None,
    labels: Mapping[str, str] | None = None,
    fabric_waited: float | None = None,
) -> dc.DeepReport:
    """Everything judged, host findings first, then each GPU's. GPUs nvidia-smi could not
    read at all fail: an unknown is never a pass (nor a driver said to match).
    ``fabric_waited``: how long a host run waited for the NVSwitch fabric after its
    maintenance (None: a stand-alone check; ``deep_check._fabric``)."""
    if read.query_error is not None:
        findings = [dc.judge_unread(read.query_error)]
    else:
        findings = [dc.judge_driver(read.mismatch)]
    findings += dc.judge_source(read.nvml, read.nvml_error)
    findings.append(dc.judge_count(read.count, last_count))
    findings += dc.judge_dcgm(read.dcgm, read.dcgm_error)
    findings += dc.judge_health(health, health_error)
    findings += dc.judge_gpus(read.readings, labels, fabric_waited)
    if read.readings:
        findings += dc.judge_nvlink(read.readings, read.nvlink_error, labels, fabric_waited)
    return dc.DeepReport(host, tuple(findings))
