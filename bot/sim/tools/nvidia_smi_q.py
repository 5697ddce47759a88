"""Simulated ``nvidia-smi -q``: the fields GPU health reads, in NVIDIA's documented layout.

Written to the layout NVIDIA documents for ``nvidia-smi -q`` (indented ``Key : value``
lines under section headers), not copied from a capture: a ``GPU <bus id>`` section per
GPU with its UUID, PCI bus id, ``GPU Reset Status``, the recovery action, ECC errors
(``Volatile`` and ``Aggregate``, SRAM and DRAM), ``Retired Pages`` and ``Remapped Rows``.
The faults ``ecc_uncorrected``, ``pending_remap`` and ``reset_required`` show on GPU
``stuck_gpu``.

``GPU Reset Status`` is printed as drivers 535-560 print it (Yes/No, before ``PCI``;
public ``nvidia-smi -q`` captures, tests/samples/SOURCES.md). With ``reset_required``
the report is that of such a driver throughout: the stuck GPU says Yes to both keys, the
others No, and no GPU has the ``GPU Recovery Action`` line, which came with R570.
"""

from __future__ import annotations

import time

from bot.sim.state import SimGpu

DRIVER_VERSION = "590.44.01"
CUDA_VERSION = "13.1"
_W = 44  # the key column, as nvidia-smi pads it


def bus_id(index: int) -> str:
    return f"00000000:{(0x01 + index * 0x20) % 0x100:02X}:00.0"


def _kv(depth: int, key: str, value: str) -> str:
    pad = "    " * depth
    return f"{pad}{key:<{_W - len(pad)}}: {value}"


def _head(depth: int, name: str) -> str:
    return "    " * depth + name


def _ecc(kind: str, dram_uncorrectable: int) -> list[str]:
    return [
        _head(2, kind),
        _kv(3, "SRAM Correctable", "0"),
        _kv(3, "SRAM Uncorrectable Parity", "0"),
        _kv(3, "SRAM Uncorrectable SEC-DED", "0"),
        _kv(3, "DRAM Correctable", "0"),
        _kv(3, "DRAM Uncorrectable", str(dram_uncorrectable)),
    ]


def _reset_status(g: SimGpu, legacy: bool) -> list[str]:
    said = "Yes" if g.reset_required else "No"
    lines = [
        _head(1, "GPU Reset Status"),
        _kv(2, "Reset Required", said),
        _kv(2, "Drain and Reset Recommended", said),
    ]
    return lines if legacy else [*lines, _kv(1, "GPU Recovery Action", "None")]


def section(g: SimGpu, legacy: bool = False) -> list[str]:
    """``legacy``: as a 535-560 driver prints it (no ``GPU Recovery Action``)."""
    pending = "Yes" if g.remap_pending else "No"
    return [
        f"GPU {bus_id(g.index)}",
        _kv(1, "Product Name", g.name),
        _kv(1, "Product Brand", "NVIDIA"),
        _kv(1, "Persistence Mode", "Enabled" if g.persistence else "Disabled"),
        _kv(1, "GPU UUID", g.uuid),
        _kv(1, "Minor Number", str(g.index)),
        *_reset_status(g, legacy),
        _head(1, "PCI"),
        _kv(2, "Bus", f"0x{bus_id(g.index)[9:11]}"),
        _kv(2, "Bus Id", bus_id(g.index)),
        _head(1, "ECC Mode"),
        _kv(2, "Current", "Enabled"),
        _kv(2, "Pending", "Enabled"),
        _head(1, "ECC Errors"),
        *_ecc("Volatile", g.ecc_uncorrected),
        *_ecc("Aggregate", g.ecc_uncorrected),
        _head(1, "Retired Pages"),
        _kv(2, "Single Bit ECC", "N/A"),
        _kv(2, "Double Bit ECC", "N/A"),
        _kv(2, "Pending Page Blacklist", "N/A"),
        _head(1, "Remapped Rows"),
        _kv(2, "Correctable Error", "0"),
        _kv(2, "Uncorrectable Error", "1" if g.remap_pending else "0"),
        _kv(2, "Pending", pending),
        _kv(2, "Remapping Failure Occurred", "No"),
        _head(2, "Bank Remap Availability Histogram"),
        _kv(3, "Max", "2560 bank(s)"),
        _kv(3, "High", "0 bank(s)"),
        "",
    ]


def render(gpus: list[SimGpu], attached: int, cuda: str = CUDA_VERSION) -> str:
    """``attached``: every GPU the host has, the lost ones included (the header says so)."""
    out = [
        "",
        "==============NVSMI LOG==============",
        "",
        _kv(0, "Timestamp", time.strftime("%a %b %d %H:%M:%S %Y")),
        _kv(0, "Driver Version", DRIVER_VERSION),
        _kv(0, "CUDA Version", cuda),
        "",
        _kv(0, "Attached GPUs", str(attached)),
    ]
    legacy = any(g.reset_required for g in gpus)
    for g in gpus:
        out += section(g, legacy)
    return "\n".join(out) + "\n"
