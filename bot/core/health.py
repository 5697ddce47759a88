"""GPU hardware health: what the driver says about each GPU, the kernel's Xid errors, and
a verdict per GPU (ok / warn / critical) with NVIDIA's recommended action.

Pure parsing and judging; the I/O (``nvidia-smi -q`` and the kernel log over SSH, or
NVML on the bot's own machine) happens in the callers.

Two sources, and what each can tell:

* ``nvidia-smi -q`` (or NVML): the GPU's state *now*: uncorrectable ECC errors since
  the last reset (volatile) and over its life (aggregate), a retired page or a row
  remap waiting for the next reset, a failed row remap, whether the driver wants the
  GPU reset (``GPU Reset Status``, drivers 535-560), and where the driver reports it
  the recovery action it asks for (``GPU Recovery Action``, R570 on).
* The kernel log of this boot (``NVRM: Xid (PCI:0000:3b:00): 79, ...``, on a MIG GPU
  ``(PCI:0000:3b:00 GPU-I:05)``, on old drivers ``(0000:3b:00)``): what happened
  since the machine started. An Xid line stays there after the GPU was reset, so an Xid
  whose cause the current state would show (an ECC or remap error) is critical only
  while that state still shows it, or while the driver asks for a recovery action;
  an Xid 79 (the GPU fell off the bus) is critical for the rest of the boot.

The layout parsed is NVIDIA's documented ``nvidia-smi -q`` layout (indented
``Key : value`` lines under section headers such as ``ECC Errors`` / ``Volatile`` /
``DRAM Uncorrectable``, ``Retired Pages`` / ``Pending Page Blacklist``,
``Remapped Rows`` / ``Pending`` / ``Remapping Failure Occurred``, ``GPU Reset Status`` /
``Reset Required`` / ``Drain and Reset Recommended``; names matched whatever their case)
and the kernel's Xid line format; the catalogue paraphrases NVIDIA's Xid catalogue. The
GPU query's known warnings (a corrupted infoROM) are findings too.

The pieces: ``health_types`` (the values), ``health_query`` (the ``nvidia-smi -q``
parser), ``health_xid`` (the Xid lines and their catalogue), ``health_verdict`` (the
verdict, the GPU check, the table marks and details) and ``health_reads`` (reading a
host). This module names them all, as callers import them.
"""

from __future__ import annotations

from bot.core.health_query import HEALTH_QUERY_ARGV, normal_pci, parse_health_query
from bot.core.health_reads import LOST_GPU_EXIT, GpuStateRead, Reads, health_reads, state_findings
from bot.core.health_types import Finding, GpuHealth, GpuReading, HostHealth, Level, XidEvent, worst
from bot.core.health_verdict import GpuCheck, HealthNote, details, health_note, judge, marks
from bot.core.health_xid import (
    XID_CATALOGUE,
    XID_DMESG_ARGV,
    XID_DMESG_SCRIPT,
    XID_JOURNAL_ARGV,
    XidInfo,
    kernel_log_unreadable,
    new_xids,
    parse_xid_lines,
    xid_finding,
)

__all__ = [
    "HEALTH_QUERY_ARGV",
    "LOST_GPU_EXIT",
    "XID_CATALOGUE",
    "XID_DMESG_ARGV",
    "XID_DMESG_SCRIPT",
    "XID_JOURNAL_ARGV",
    "Finding",
    "GpuCheck",
    "GpuHealth",
    "GpuReading",
    "GpuStateRead",
    "HealthNote",
    "HostHealth",
    "Level",
    "Reads",
    "XidEvent",
    "XidInfo",
    "details",
    "health_note",
    "health_reads",
    "judge",
    "kernel_log_unreadable",
    "marks",
    "new_xids",
    "normal_pci",
    "parse_health_query",
    "parse_xid_lines",
    "state_findings",
    "worst",
    "xid_finding",
]
