"""Reading a host's GPU health: what to run and what each answer means, as a generator
the flows and ``/vllm gpus`` drive (``health_reads``), and which source the state was
read with (``GpuStateRead``: NVML or ``nvidia-smi -q``)."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass

from bot.core.gpu import DriverWarning, Gpu
from bot.core.health_query import HEALTH_QUERY_ARGV, parse_health_query
from bot.core.health_types import Finding, GpuReading, HostHealth, Level, XidEvent
from bot.core.health_verdict import judge
from bot.core.health_xid import (
    XID_DMESG_ARGV,
    XID_JOURNAL_ARGV,
    kernel_log_unreadable,
    parse_xid_lines,
)
from bot.core.results import CommandResult
from bot.core.status import HealthSource
from bot.errors import GpuQueryError

# nvidia-smi's exit status when a GPU has fallen off the bus (its man page, RETURN VALUE).
LOST_GPU_EXIT = 15

Reads = Generator[tuple[str, ...], CommandResult, HostHealth]


def _lost(r: CommandResult) -> bool:
    return r.exit_status is None and r.signal is None


def _said(r: CommandResult) -> str:
    if _lost(r):
        return f"no answer ({r.stderr.strip()[:200] or 'the host did not answer'})"
    tail = " ".join((r.stderr.strip() or r.stdout.strip()).split())[:200]
    return f"exit {r.exit_status}" + (f": {tail}" if tail else "")


def state_findings(
    host: str, q: CommandResult
) -> tuple[tuple[GpuReading, ...], tuple[Finding, ...]]:
    """``nvidia-smi -q``'s result as readings, and what a failed or unreadable one says
    about the host (a lost GPU's exit status is critical)."""
    if q.exit_status == 0:
        try:
            return parse_health_query(host, q.stdout), ()
        except GpuQueryError as e:
            return (), (Finding(Level.WARN, f"nvidia-smi -q: {e.reason}", "check the driver"),)
    lost_gpu = q.exit_status == LOST_GPU_EXIT
    return (), (
        Finding(
            Level.CRITICAL if lost_gpu else Level.WARN,
            f"nvidia-smi -q failed ({_said(q)})",
            "reboot the node" if lost_gpu else "check the driver",
        ),
    )


@dataclass(frozen=True, slots=True)
class GpuStateRead:
    """How the GPUs' state was read on a host: NVML's readings, or ``nvidia-smi -q``'s
    result (with why NVML was not used, where the host is the bot's own)."""

    source: HealthSource
    readings: tuple[GpuReading, ...] = ()  # NVML's
    result: CommandResult | None = None  # nvidia-smi -q's
    nvml_error: str | None = None  # NVML failed on the bot's own host: why

    def judged(self, host: str) -> tuple[tuple[GpuReading, ...], tuple[Finding, ...]]:
        """The readings and the host findings, the same whichever source."""
        if self.source == HealthSource.NVML or self.result is None:
            return self.readings, ()
        return state_findings(host, self.result)

    def said(self) -> str:
        """Which source, for the step's output."""
        if self.source == HealthSource.NVML:
            return "GPU health from NVML"
        if self.nvml_error is not None:
            return f"GPU health from nvidia-smi -q (NVML failed: {self.nvml_error})"
        return "GPU health from nvidia-smi -q"


def health_reads(
    host: str,
    gpus: Sequence[Gpu],
    readings: Sequence[GpuReading] | None = None,
    notes: Sequence[Finding] = (),
    warnings: Sequence[DriverWarning] = (),
) -> Reads:
    """What to run on a host to judge its GPUs' health, as a generator: it yields each
    argv and is sent its ``CommandResult``; it returns the verdict. Flows drive it with
    their RunCommand, ``/vllm gpus`` with the transport. ``readings``: the GPUs' state
    read already (NVML on the bot's own machine, or ``GpuStateRead.judged`` with
    ``notes``), so ``nvidia-smi -q`` is not run here. ``warnings``: what the GPU query
    warned about (``GpuSnapshot.warnings``)."""
    found: list[Finding] = list(notes)
    if readings is None:
        q = yield HEALTH_QUERY_ARGV
        readings, said = state_findings(host, q)
        found += said
    xids: tuple[XidEvent, ...] = ()
    j = yield XID_JOURNAL_ARGV
    why = _said(j) if _lost(j) else kernel_log_unreadable(j.stdout, j.stderr, j.exit_status)
    if why is None:
        xids = parse_xid_lines(j.stdout)
    else:
        d = yield XID_DMESG_ARGV
        if d.exit_status == 0:
            xids = parse_xid_lines(d.stdout)
        else:
            found.append(
                Finding(
                    Level.WARN,
                    f"the kernel log cannot be read, so Xid errors are "
                    f"unknown ({why}; dmesg: {_said(d)})",
                    "let the bot's user read the kernel log (group adm or systemd-journal)",
                )
            )
    return judge(host, gpus, readings, xids, notes=found, warnings=warnings)
