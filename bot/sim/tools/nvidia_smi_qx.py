"""Simulated ``nvidia-smi -q -x``: the elements the deep GPU check reads, in the XML
layout of real captures (tests/samples/deep/nvidia_smi_qx_l4_555.xml: ``nvsmi_device_v12``,
``pci/pci_gpu_link_info``, ``clocks_event_reasons``, ``persistence_mode``, ``fabric``).

An idle GPU reports ``gpu_idle`` Active and its link at gen1, as real GPUs save power;
a busy one gen5. The faults ``pcie_degraded`` (x8 of x16) and ``hw_slowdown`` show on
GPU ``stuck_gpu``. The GPUs are an HGX board's (NVSwitch): their fabric is "Completed",
"Success", as a real one's with Fabric Manager running; with ``fabric_stuck``, "In
Progress" and no status (the words of NVIDIA/gpu-operator#2511's capture).
"""

from __future__ import annotations

import time
from xml.sax.saxutils import escape

from bot.sim.state import SimGpu
from bot.sim.tools.nvidia_smi_q import CUDA_VERSION, DRIVER_VERSION, bus_id

_REASONS = (
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "display_clocks_setting",
)


def _active(g: SimGpu, reason: str) -> str:
    on = (reason == "gpu_idle" and g.util_pct == 0) or (reason == "hw_slowdown" and g.hw_slowdown)
    return "Active" if on else "Not Active"


def _gpu(g: SimGpu) -> list[str]:
    gen = "1" if g.util_pct == 0 else "5"
    reasons = [
        f"\t\t\t<clocks_event_reason_{r}>{_active(g, r)}</clocks_event_reason_{r}>"
        for r in _REASONS
    ]
    return [
        f'\t<gpu id="{bus_id(g.index)}">',
        f"\t\t<product_name>{escape(g.name)}</product_name>",
        f"\t\t<persistence_mode>{'Enabled' if g.persistence else 'Disabled'}</persistence_mode>",
        f"\t\t<uuid>{g.uuid}</uuid>",
        f"\t\t<minor_number>{g.index}</minor_number>",
        "\t\t<pci>",
        f"\t\t\t<pci_bus_id>{bus_id(g.index)}</pci_bus_id>",
        "\t\t\t<pci_gpu_link_info>",
        "\t\t\t\t<pcie_gen>",
        "\t\t\t\t\t<max_link_gen>5</max_link_gen>",
        f"\t\t\t\t\t<current_link_gen>{gen}</current_link_gen>",
        "\t\t\t\t</pcie_gen>",
        "\t\t\t\t<link_widths>",
        "\t\t\t\t\t<max_link_width>16x</max_link_width>",
        f"\t\t\t\t\t<current_link_width>{g.pcie_width}x</current_link_width>",
        "\t\t\t\t</link_widths>",
        "\t\t\t</pci_gpu_link_info>",
        "\t\t</pci>",
        "\t\t<clocks_event_reasons>",
        *reasons,
        "\t\t</clocks_event_reasons>",
        "\t\t<gpu_recovery_action>None</gpu_recovery_action>",
        "\t\t<fabric>",
        f"\t\t\t<state>{'Completed' if g.fabric_registered else 'In Progress'}</state>",
        f"\t\t\t<status>{'Success' if g.fabric_registered else 'N/A'}</status>",
        "\t\t</fabric>",
        "\t</gpu>",
    ]


def render(gpus: list[SimGpu], attached: int, cuda: str = CUDA_VERSION) -> str:
    out = [
        '<?xml version="1.0" ?>',
        '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">',
        "<nvidia_smi_log>",
        f"\t<timestamp>{time.strftime('%a %b %d %H:%M:%S %Y')}</timestamp>",
        f"\t<driver_version>{DRIVER_VERSION}</driver_version>",
        f"\t<cuda_version>{cuda}</cuda_version>",
        f"\t<attached_gpus>{attached}</attached_gpus>",
    ]
    for g in gpus:
        out += _gpu(g)
    out.append("</nvidia_smi_log>")
    return "\n".join(out) + "\n"
