"""GPU health as values: a finding (what, how bad, NVIDIA's action), what the driver
reports about one GPU now (``GpuReading``), one kernel Xid line (``XidEvent``), and the
verdict per GPU and per host (``GpuHealth``, ``HostHealth``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

# NVIDIA's action for most errors a reset clears (the Xid catalogue, the reset status).
RESET = "reset the GPU (nvidia-smi -r) once no process uses it, or reboot the node"


class Level(StrEnum):
    OK = "ok"
    WARN = "warn"
    CRITICAL = "critical"


_RANK = {Level.OK: 0, Level.WARN: 1, Level.CRITICAL: 2}


def worst(levels: Iterable[Level]) -> Level:
    return max(levels, key=_RANK.__getitem__, default=Level.OK)


@dataclass(frozen=True, slots=True)
class Finding:
    level: Level
    what: str  # what was seen ("a row remap is pending")
    action: str  # NVIDIA's recommended action ("reset the GPU (nvidia-smi -r) ...")

    def describe(self) -> str:
        return f"{self.what} ({self.action})" if self.action else self.what


@dataclass(frozen=True, slots=True)
class GpuReading:
    """What ``nvidia-smi -q`` (or NVML) says about one GPU; None where it says nothing
    (``N/A``, or a field this driver does not print)."""

    uuid: str
    pci: str | None = None  # normalised, as an Xid line names it: "0000:3b:00"
    volatile_uncorrectable: int | None = None
    aggregate_uncorrectable: int | None = None
    retired_pending: bool | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    recovery_action: str | None = None  # "None", "Reset", "Reboot", ... as printed
    # ``GPU Reset Status`` (drivers 535-560; R570 prints "deprecated" there and says it
    # with the recovery action instead): the driver wants the GPU reset, or drained of
    # every job and then reset. NVML: the reset-status fields, or a query answering
    # NVML_ERROR_RESET_REQUIRED.
    reset_required: bool | None = None
    drain_and_reset: bool | None = None
    # A reset-status value this bot cannot read ("Reset Required: Unknown Error"): the
    # GPU may need a reset, so it is never taken as "no".
    reset_unknown: str | None = None


@dataclass(frozen=True, slots=True)
class XidEvent:
    pci: str  # normalised: "0000:3b:00"
    code: int
    text: str  # what follows the code: "pid=..., GPU has fallen off the bus."
    line: str  # the whole line as the kernel log printed it (the evidence)
    # On a MIG GPU, the instance the driver attributes it to: "GPU-I:05" or
    # "GPU-I:05 GPU-CI:02"; empty when the line names the whole GPU.
    instance: str = ""


@dataclass(frozen=True, slots=True)
class GpuHealth:
    index: int | None  # None: -q lists a GPU the GPU query does not (it is in a bad state)
    uuid: str
    findings: tuple[Finding, ...] = ()

    @property
    def level(self) -> Level:
        return worst(f.level for f in self.findings)

    @property
    def label(self) -> str:
        return f"GPU {self.index}" if self.index is not None else f"GPU {self.uuid}"


@dataclass(frozen=True, slots=True)
class HostHealth:
    host: str
    gpus: tuple[GpuHealth, ...]
    # What concerns no GPU we can name: an Xid at an address no GPU answers at (it fell
    # off the bus), a kernel log that could not be read, a health query that failed.
    host_findings: tuple[Finding, ...] = ()
    xids: tuple[XidEvent, ...] = field(default=())
    readings: tuple[GpuReading, ...] = ()  # what the verdict was judged on

    def scoped(self, uuids: Iterable[str] | None) -> tuple[GpuHealth, ...]:
        """The GPUs of a service (by uuid), or every GPU (None)."""
        if uuids is None:
            return self.gpus
        wanted = set(uuids)
        return tuple(g for g in self.gpus if g.uuid in wanted)

    def level(self, uuids: Iterable[str] | None = None) -> Level:
        return worst(
            [*(g.level for g in self.scoped(uuids)), *(f.level for f in self.host_findings)]
        )

    def problems(self, level: Level, uuids: Iterable[str] | None = None) -> list[str]:
        """One sentence per finding at ``level``, GPU first: what, then the action."""
        out = [
            f"{g.label}: {f.describe()}"
            for g in self.scoped(uuids)
            for f in g.findings
            if f.level == level
        ]
        out += [f.describe() for f in self.host_findings if f.level == level]
        return out

    def summary(self, uuids: Iterable[str] | None = None) -> str:
        """``ok``, or the critical problems then the warnings, for a step's summary."""
        critical, warn = self.problems(Level.CRITICAL, uuids), self.problems(Level.WARN, uuids)
        if not critical and not warn:
            n = len(self.scoped(uuids))
            return f"{n} GPU{'s' if n != 1 else ''} healthy"
        parts = [f"CRITICAL: {c}" for c in critical] + [f"warning: {w}" for w in warn]
        return "; ".join(parts)
