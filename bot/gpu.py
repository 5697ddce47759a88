"""GPU snapshots: parse nvidia-smi, probe NVML locally, render a fixed-width table.

Pure parsing and rendering; the I/O (running nvidia-smi over SSH, calling NVML)
happens in the callers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The exact argv the engine runs; kept here so parsers and commands cannot drift apart.
GPU_QUERY_ARGV: tuple[str, ...] = (
    "nvidia-smi",
    "--query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu",
    "--format=csv,noheader,nounits",
)
APPS_QUERY_ARGV: tuple[str, ...] = (
    "nvidia-smi",
    "--query-compute-apps=pid,process_name,used_memory,gpu_uuid",
    "--format=csv,noheader",
)


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


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    host: str
    gpus: tuple[Gpu, ...]
    processes: tuple[GpuProcess, ...] = field(default=())

    @property
    def used_mib(self) -> int:
        return sum(g.memory_used_mib or 0 for g in self.gpus)

    @property
    def total_mib(self) -> int:
        return sum(g.memory_total_mib or 0 for g in self.gpus)
