"""What a host's GPUs are doing: the GPUs, their processes and the warnings nvidia-smi
printed with them (``GpuSnapshot``), and which of them a service uses (``Selection``).

Pure values; ``bot.core.gpu_query`` builds them from nvidia-smi's output.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    name: str
    used_mib: int | None  # None when the driver reports [N/A] / [Not Supported]
    gpu_uuid: str


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_used_mib: int | None
    memory_total_mib: int | None
    utilization_pct: int | None
    processes: tuple[GpuProcess, ...] = ()
    # What nvidia-smi printed for memory.used when it gave no number ("[N/A]" on a
    # unified-memory GPU such as GB10, "[Unknown Error]" on a GPU in trouble).
    memory_note: str = ""

    @property
    def memory_not_reported(self) -> bool:
        """The GPU reports no memory figure by design (unified memory: the driver prints
        ``[N/A]`` or ``[Not Supported]``), as opposed to one it failed to read."""
        return self.memory_used_mib is None and self.memory_note in _NOT_REPORTED


# What nvidia-smi prints for a value a GPU does not have, as opposed to an error reading it.
_NOT_REPORTED = frozenset({"[N/A]", "N/A", "[Not Supported]"})


@dataclass(frozen=True, slots=True)
class DriverWarning:
    """A warning nvidia-smi prints among its rows, one it is known to print (the rows
    around it are still good): ``WARNING: infoROM is corrupted at gpu 0000:67:00.0``."""

    kind: Literal["inforom_corrupted"]
    pci: str  # the GPU's address as printed: "0000:67:00.0"
    line: str  # the line as printed (the evidence)


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    host: str
    gpus: tuple[Gpu, ...]
    processes: tuple[GpuProcess, ...] = field(default=())
    # The uuids of the GPUs a service uses (its ``gpus`` setting); None: all of them.
    # The drain, the totals and the health verdict look at those only; the others are
    # shown, and what runs on them never blocks the drain.
    scope: frozenset[str] | None = None
    # The known warnings nvidia-smi printed with the rows (the GPU check reports them).
    warnings: tuple[DriverWarning, ...] = ()

    def in_scope(self, gpu: Gpu) -> bool:
        return self.scope is None or gpu.uuid in self.scope

    @property
    def scoped_gpus(self) -> tuple[Gpu, ...]:
        return tuple(g for g in self.gpus if self.in_scope(g))

    @property
    def used_mib(self) -> int | None:
        """Memory in use on the GPUs in scope; None when any of them does not say (a sum
        that leaves a GPU out would read as that GPU being empty)."""
        return _total(g.memory_used_mib for g in self.scoped_gpus)

    @property
    def total_mib(self) -> int | None:
        return _total(g.memory_total_mib for g in self.scoped_gpus)


def _total(values: Iterable[int | None]) -> int | None:
    known = list(values)
    if not known or any(v is None for v in known):
        return None
    return sum(v for v in known if v is not None)


def memory_summary(snapshot: GpuSnapshot, noun: str = "") -> str:
    """``12,345 of 783,000 MiB [noun ]in use``, or why there is no such figure (never 0)."""
    used, total = snapshot.used_mib, snapshot.total_mib
    if not snapshot.scoped_gpus:
        return "no GPU listed"
    if used is not None and total is not None:
        return f"{used:,} of {total:,} MiB {noun + ' ' if noun else ''}in use"
    if all(g.memory_not_reported for g in snapshot.scoped_gpus):
        return "GPU memory not reported (unified memory): n/a"
    return "GPU memory in use: n/a (not every GPU reports it)"


@dataclass(frozen=True, slots=True)
class Selection:
    """The GPUs of a service on one host, from its ``gpus`` setting."""

    gpus: tuple[Gpu, ...]  # found, in the host's order
    missing: tuple[str, ...]  # wanted but not listed ("GPU 5", "GPU-3f…")
    wanted: str  # what the setting asks for, for messages ("GPUs 0, 1, 2, 3", "all GPUs")

    @property
    def uuids(self) -> frozenset[str]:
        return frozenset(g.uuid for g in self.gpus)

    def refusal(self, host: str, listed: Sequence[Gpu]) -> str | None:
        """Why a run must not go on here (None: every wanted GPU is listed). A host that
        lists fewer GPUs than the service needs, or none, is never drained: a drain over
        no GPU would pass at once."""
        if not listed:
            return (
                f"nvidia-smi on {host} lists no GPU (it printed no row), but the service "
                f"needs {self.wanted}: the driver may have lost them"
            )
        if self.missing:
            found = ", ".join(str(g.index) for g in listed)
            return (
                f"the service needs {self.wanted}, but {host} lists {len(listed)} GPU"
                f"{'s' if len(listed) != 1 else ''} ({found}): {', '.join(self.missing)} "
                "missing"
            )
        return None


def select_gpus(gpus: Sequence[Gpu], wanted: Sequence[int | str] | None) -> Selection:
    """The GPUs ``wanted`` names (indexes or uuids; None: all the host lists)."""
    if wanted is None:
        return Selection(tuple(gpus), () if gpus else ("any GPU",), "all GPUs")
    found: list[Gpu] = []
    missing: list[str] = []
    for w in wanted:
        gpu = next((g for g in gpus if (g.index == w if isinstance(w, int) else g.uuid == w)), None)
        if gpu is None:
            missing.append(f"GPU {w}")
        elif gpu not in found:
            found.append(gpu)
    found.sort(key=lambda g: g.index)
    label = ", ".join(str(w) for w in wanted)
    return Selection(tuple(found), tuple(missing), f"GPU{'s' if len(wanted) != 1 else ''} {label}")


def scoped(snapshot: GpuSnapshot, selection: Selection | None) -> GpuSnapshot:
    """The snapshot with its scope set to a service's GPUs (None: all, as built)."""
    if selection is None:
        return snapshot
    return replace(snapshot, scope=selection.uuids)


def all_processes(snapshot: GpuSnapshot) -> tuple[GpuProcess, ...]:
    """snapshot.processes, plus any attached to a GPU but missing there (hand-built snapshots)."""
    seen = set(snapshot.processes)
    extra = tuple(p for g in snapshot.gpus for p in g.processes if p not in seen)
    return snapshot.processes + extra
