"""What the deep GPU check reads, parsed: ``nvidia-smi -q -x`` per GPU (PCIe link,
clock event reasons, persistence mode, fabric state), ``nvidia-smi nvlink -s`` (each
NVLink link's state), nvidia-smi's driver/library version mismatch, and ``dcgmi diag
-r 1``'s table.

Why the XML form (``-q -x``) and not the text ``-q`` the health check reads: every
value this check needs sits under a fixed tag (``pci_gpu_link_info/pcie_gen/
current_link_gen``), so nothing depends on the text form's indentation, and a tag a
driver does not print is simply absent. The one rename between drivers is handled:
``clocks_throttle_reasons/clocks_throttle_reason_*`` (drivers before 535) became
``clocks_event_reasons/clocks_event_reason_*``.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from bot.errors import GpuQueryError

# The exact commands; kept here so the parsers and the commands cannot drift apart.
DEEP_QUERY_ARGV: tuple[str, ...] = ("nvidia-smi", "-q", "-x")
# Level 1 is the quick one (seconds: deployment checks only); it needs no root, as it
# talks to the host's nv-hostengine. No probe first: every remote command runs under
# coreutils `timeout`, which exits 127 when the command is not found (as a shell does),
# so that status is "dcgmi is not installed".
DCGMI_DIAG_ARGV: tuple[str, ...] = ("dcgmi", "diag", "-r", "1")
# Each GPU's NVLink links: a rate where the link is up, ``<inactive>`` where it is down.
NVLINK_ARGV: tuple[str, ...] = ("nvidia-smi", "nvlink", "-s")
NOT_FOUND_EXIT = 127

# nvidia-smi's exit status for "Driver/library version mismatch" (mozilla/translations
# issue #1167: "nvidia-smi failed with return code 18" beside that message).
MISMATCH_EXIT = 18
_MISMATCH = re.compile(r"Driver/library version mismatch", re.IGNORECASE)
_LIBRARY = re.compile(r"NVML library version:\s*(\S+)")

# The clock event reasons that are findings, by their tag's tail, with NVIDIA's name.
# gpu_idle, applications_clocks_setting, sw_power_cap, sync_boost and
# display_clocks_setting are the GPU doing what it was told or has nothing to do.
THROTTLE_REASONS: dict[str, str] = {
    "hw_slowdown": "HW slowdown",
    "hw_thermal_slowdown": "HW thermal slowdown",
    "hw_power_brake_slowdown": "HW power brake slowdown",
    "sw_thermal_slowdown": "SW thermal slowdown",
}
_NOTHING = frozenset(("", "N/A", "[N/A]", "Not Supported", "[Not Supported]"))
_REASON_PREFIXES = (
    ("clocks_event_reasons", "clocks_event_reason_"),
    ("clocks_throttle_reasons", "clocks_throttle_reason_"),
)


@dataclass(frozen=True, slots=True)
class NvLinks:
    """One GPU's NVLink links by number, as ``nvidia-smi nvlink -s`` or NVML's
    ``nvmlDeviceGetNvLinkState`` says them."""

    up: tuple[int, ...] = ()
    down: tuple[int, ...] = ()
    # nvidia-smi's "Unable to retrieve NVLink information as all links are inActive":
    # NVLink is there and no link is up (no numbers printed).
    all_down: bool = False


@dataclass(frozen=True, slots=True)
class DeepReading:
    """One GPU as ``nvidia-smi -q -x`` (or NVML) reports it; None where it says nothing."""

    uuid: str
    pci: str  # as printed: "00000000:01:00.0"
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    # The throttle reasons (names from THROTTLE_REASONS) the driver says are active.
    throttle: tuple[str, ...] = ()
    gpu_idle: bool | None = None  # the gpu_idle reason: the GPU has no work
    persistence: bool | None = None
    # Fabric Manager's view on NVSwitch systems (``fabric/state``, ``fabric/status``);
    # None where the GPU has none (``N/A``).
    fabric_state: str | None = None
    fabric_status: str | None = None
    # None: no NVLink (a PCIe card), or not read (the read says why).
    nvlink: NvLinks | None = None


@dataclass(frozen=True, slots=True)
class DeepQuery:
    driver_version: str | None
    attached: int | None  # ``attached_gpus``
    gpus: tuple[DeepReading, ...]


def _root(host: str, text: str) -> ET.Element:
    # nvidia-smi's own XML, over our SSH channel whose output is bounded; ElementTree
    # never fetches the DOCTYPE's external DTD and expat (2.4.1+) refuses entity
    # amplification, which is what defusedxml would add here.
    try:
        return ET.fromstring(text)  # noqa: S314
    except ET.ParseError as e:
        raise GpuQueryError(host, f"nvidia-smi -q -x printed no readable XML ({e})") from None


def _text(node: ET.Element, path: str) -> str | None:
    found = node.find(path)
    if found is None or found.text is None:
        return None
    value = " ".join(found.text.split())
    # Only the words for "nothing to say": a fabric state "Not Started" is a value.
    return None if value in _NOTHING else value


def _int(value: str | None) -> int | None:
    """``4``, ``16x``: the number; anything else None."""
    if value is None:
        return None
    m = re.fullmatch(r"(\d+)x?", value)
    return int(m.group(1)) if m else None


def _enabled(value: str | None) -> bool | None:
    if value is None:
        return None
    return {"enabled": True, "disabled": False}.get(value.casefold())


def _reasons(gpu: ET.Element) -> tuple[tuple[str, ...], bool | None]:
    for section, prefix in _REASON_PREFIXES:
        node = gpu.find(section)
        if node is None:
            continue
        active = {
            child.tag.removeprefix(prefix)
            for child in node
            if (child.text or "").strip().casefold() == "active"
        }
        idle_node = node.find(prefix + "gpu_idle")
        idle = None if idle_node is None else "gpu_idle" in active
        return tuple(r for r in THROTTLE_REASONS if r in active), idle
    return (), None


def _reading(gpu: ET.Element) -> DeepReading:
    link = "pci/pci_gpu_link_info/"
    throttle, idle = _reasons(gpu)
    return DeepReading(
        uuid=_text(gpu, "uuid") or gpu.get("id") or "?",
        pci=gpu.get("id") or "?",
        pcie_gen=_int(_text(gpu, link + "pcie_gen/current_link_gen")),
        pcie_gen_max=_int(_text(gpu, link + "pcie_gen/max_link_gen")),
        pcie_width=_int(_text(gpu, link + "link_widths/current_link_width")),
        pcie_width_max=_int(_text(gpu, link + "link_widths/max_link_width")),
        throttle=throttle,
        gpu_idle=idle,
        persistence=_enabled(_text(gpu, "persistence_mode")),
        fabric_state=_text(gpu, "fabric/state"),
        fabric_status=_text(gpu, "fabric/status"),
    )


def parse_deep_query(host: str, text: str) -> DeepQuery:
    root = _root(host, text)
    if root.tag != "nvidia_smi_log":
        raise GpuQueryError(host, f"nvidia-smi -q -x printed <{root.tag}>, not nvidia_smi_log")
    return DeepQuery(
        driver_version=_text(root, "driver_version"),
        attached=_int(_text(root, "attached_gpus")),
        gpus=tuple(_reading(g) for g in root.findall("gpu")),
    )


@dataclass(frozen=True, slots=True)
class Mismatch:
    """nvidia-smi refused to start: the user-space library is not the loaded kernel
    module's version (an upgrade that replaced the library under a running module)."""

    library: str | None  # "550.144", as nvidia-smi prints it, where it does


def mismatch_of(exit_status: int | None, stdout: str, stderr: str) -> Mismatch | None:
    """The mismatch, from any nvidia-smi call's result; nvidia-smi prints it on stdout."""
    said = f"{stdout}\n{stderr}"
    if exit_status == MISMATCH_EXIT or _MISMATCH.search(said):
        if exit_status == 0:
            return None  # a process name or a path that happens to contain the words
        m = _LIBRARY.search(said)
        return Mismatch(m.group(1) if m else None)
    return None


# ``nvidia-smi nvlink -s``: "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)", then per link
# "\t Link 0: 26.562 GB/s" or "\t Link 3: <inactive>" (Azure/azhpc-diagnostics#73), or
# the one line NVML prints for a GPU whose links are all down (leptonai/gpud#1085).
_NVLINK_GPU = re.compile(r"^GPU (\d+): .*\(UUID: (\S+)\)\s*$")
_NVLINK_LINK = re.compile(r"^\s*Link (\d+): (.*?)\s*$")
_NVLINK_ALL_DOWN = re.compile(r"all links are inactive", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class NvLinkGpu:
    index: int
    uuid: str  # as printed: "GPU-..." (a capture may have it elided)
    links: NvLinks


def parse_nvlink(text: str) -> tuple[NvLinkGpu, ...]:
    """Each GPU ``nvidia-smi nvlink -s`` lists, with its links; a GPU without NVLink is
    not listed, or listed with no link line (nothing printed is no NVLink at all)."""
    out: list[NvLinkGpu] = []
    for line in text.splitlines():
        if m := _NVLINK_GPU.match(line):
            out.append(NvLinkGpu(int(m.group(1)), m.group(2), NvLinks()))
            continue
        if not out:
            continue
        gpu, links = out[-1], out[-1].links
        if m := _NVLINK_LINK.match(line):
            n, up = int(m.group(1)), "inactive" not in m.group(2).casefold()
            links = NvLinks(
                links.up + ((n,) if up else ()),
                links.down + (() if up else (n,)),
                links.all_down,
            )
        elif _NVLINK_ALL_DOWN.search(line):
            links = NvLinks(links.up, links.down, all_down=True)
        out[-1] = NvLinkGpu(gpu.index, gpu.uuid, links)
    return tuple(g for g in out if g.links.up or g.links.down or g.links.all_down)
