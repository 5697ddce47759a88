"""The commands of host maintenance (issue 23: ``host reboot`` and ``host gpu-reset``)
and what their output means: pure, so the flow, ``sudoers`` and ``doctor`` share them.

Every argv is fixed but for a GPU index the config-checked plan names (an ``int``,
never user text). Samples of real output this module reads, and where they came from,
are in ``tests/samples/host/``:

* ``nvidia-smi -r -i N`` refused while persistence mode holds the GPU (exit 255, "In
  use by another client": NVIDIA/NVSentinel#1690) or while a process does ("is
  currently in use by another process": NVIDIA/gpu-operator#118; on older drivers
  "Unable to reset this GPU because it's being used by some other process"); succeeded,
  "GPU 00000000:1A:00.0 was successfully reset." (exit 0, NVSentinel#1692).
* ``nvidia-smi -pm 0 -i N`` prints "All done." (NVSentinel#1692).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from bot.core.gpu_query import data_lines
from bot.core.privilege import Command, Privilege
from bot.core.results import CommandResult
from bot.settings import MaintenanceSettings

Argv = tuple[str, ...]

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
# Read with the login's own rights: the file is world-readable on every Linux.
BOOT_ID_ARGV: Argv = ("cat", BOOT_ID_PATH)
# Each GPU's index, bus id and persistence mode, for a reset: which GPUs to turn it off on
# and back on after.
PERSISTENCE_QUERY_ARGV: Argv = (
    "nvidia-smi",
    "--query-gpu=index,pci.bus_id,persistence_mode",
    "--format=csv,noheader",
)

_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def reboot_argv(m: MaintenanceSettings) -> Argv:
    return Command((m.systemctl, "reboot"), Privilege.ROOT)


def persistence_argv(m: MaintenanceSettings, index: int, on: bool) -> Argv:
    return Command((m.nvidia_smi, "-i", str(int(index)), "-pm", "1" if on else "0"), Privilege.ROOT)


def reset_argv(m: MaintenanceSettings, index: int) -> Argv:
    return Command((m.nvidia_smi, "-r", "-i", str(int(index))), Privilege.ROOT)


def root_commands(m: MaintenanceSettings, reboot: bool, gpus: Sequence[int]) -> list[Argv]:
    """Every command a host run runs as root: the reboot, or for each of ``gpus`` its
    persistence mode off, its reset and its persistence mode back on (the run turns it
    off only where it is on: the rules allow all three)."""
    if reboot:
        return [reboot_argv(m)]
    return [
        argv
        for i in gpus
        for argv in (persistence_argv(m, i, False), reset_argv(m, i), persistence_argv(m, i, True))
    ]


def parse_boot_id(stdout: str) -> str | None:
    """The boot id ``cat`` printed (a UUID), or None for anything else."""
    text = stdout.strip().lower()
    return text if _UUID_RE.fullmatch(text) else None


@dataclass(frozen=True, slots=True)
class GpuPersistence:
    index: int
    bus_id: str
    enabled: bool


def parse_persistence(stdout: str) -> list[GpuPersistence]:
    """``PERSISTENCE_QUERY_ARGV``'s rows; a row that is not ``index, bus, Enabled|Disabled``
    raises ValueError (a GPU whose state is unknown is never reset on a guess). The
    warnings nvidia-smi prints among good rows (a corrupted infoROM) are set aside as the
    GPU query sets them aside."""
    out: list[GpuPersistence] = []
    for line in data_lines(stdout):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not parts[0].isdigit() or parts[2] not in ("Enabled", "Disabled"):
            raise ValueError(f"unexpected persistence row {line[:120]!r}")
        out.append(GpuPersistence(int(parts[0]), parts[1], parts[2] == "Enabled"))
    return out


class ResetEnd(StrEnum):
    DONE = "done"
    IN_USE = "in_use"  # a client (persistence daemon, Fabric Manager, a process) holds it
    NOT_SUPPORTED = "not_supported"
    FAILED = "failed"  # any other refusal or failure
    LOST = "lost"  # no answer: what the reset did is unknown


# nvidia-smi's words for a GPU something still holds, in today's drivers and in older ones
# (418: "Unable to reset this GPU because it's being used by some other process").
_IN_USE = ("in use by another client", "in use by another process", "used by some other process")


@dataclass(frozen=True, slots=True)
class ResetVerdict:
    end: ResetEnd
    why: str

    @property
    def ok(self) -> bool:
        return self.end == ResetEnd.DONE


def _said(r: CommandResult) -> str:
    text = " ".join(r.output.split())
    return text[:300] or f"exit {r.exit_status}"


def reset_verdict(r: CommandResult) -> ResetVerdict:
    """What one ``nvidia-smi -r -i N`` came to. Only exit 0 with nvidia-smi's own
    "successfully reset" is a reset: an exit 0 without it is not trusted."""
    out = r.output
    if r.exit_status is None:
        return ResetVerdict(ResetEnd.LOST, r.stderr.strip()[:300] or "no answer from the host")
    if r.exit_status == 0 and "successfully reset" in out:
        return ResetVerdict(ResetEnd.DONE, "reset")
    low = out.lower()
    if any(words in low for words in _IN_USE):
        return ResetVerdict(ResetEnd.IN_USE, _said(r))
    if "not supported" in low:
        return ResetVerdict(ResetEnd.NOT_SUPPORTED, _said(r))
    return ResetVerdict(ResetEnd.FAILED, f"exit {r.exit_status}: {_said(r)}")
