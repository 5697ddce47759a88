"""GPU snapshots: parse nvidia-smi, judge a drain, render a fixed-width table.

Pure parsing and rendering; the I/O (running nvidia-smi over SSH, calling NVML)
happens in the callers.  The pieces: ``gpu_snapshot`` (the values: GPUs, processes,
a service's selection), ``gpu_query`` (the strict nvidia-smi and pgrep parsers),
``gpu_drain`` (the drain verdict) and ``gpu_table`` (the table). This module names
them all, as callers import them.
"""

from __future__ import annotations

from bot.core.gpu_drain import DrainVerdict, Holder, HolderKind, drain_verdict
from bot.core.gpu_query import (
    APPS_QUERY_ARGV,
    GPU_QUERY_ARGV,
    INFOROM_EXIT,
    NVIDIA_SMI_EXIT_CODES,
    build_snapshot,
    check_nvidia_smi,
    driver_warnings,
    parse_apps_csv,
    parse_gpu_csv,
    parse_pgrep,
)
from bot.core.gpu_snapshot import (
    DriverWarning,
    Gpu,
    GpuProcess,
    GpuSnapshot,
    Selection,
    memory_summary,
    scoped,
    select_gpus,
)
from bot.core.gpu_table import LINE_LIMIT, render_table, short_gpu_name

__all__ = [
    "APPS_QUERY_ARGV",
    "GPU_QUERY_ARGV",
    "INFOROM_EXIT",
    "LINE_LIMIT",
    "NVIDIA_SMI_EXIT_CODES",
    "DrainVerdict",
    "DriverWarning",
    "Gpu",
    "GpuProcess",
    "GpuSnapshot",
    "Holder",
    "HolderKind",
    "Selection",
    "build_snapshot",
    "check_nvidia_smi",
    "drain_verdict",
    "driver_warnings",
    "memory_summary",
    "parse_apps_csv",
    "parse_gpu_csv",
    "parse_pgrep",
    "render_table",
    "scoped",
    "select_gpus",
    "short_gpu_name",
]
