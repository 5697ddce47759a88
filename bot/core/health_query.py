"""``nvidia-smi -q``'s health fields, parsed strictly: per GPU, its uncorrectable ECC
counts, retired pages and row remaps, its reset status and the driver's recovery action.
The layout is NVIDIA's documented one (indented ``Key : value`` lines under section
headers, names matched whatever their case)."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence

from bot.core.health_types import GpuReading
from bot.errors import GpuQueryError

# The exact command; kept here so the parser and the command cannot drift apart.
HEALTH_QUERY_ARGV: tuple[str, ...] = ("nvidia-smi", "-q")

_GPU_HEADER = re.compile(r"GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})\.[0-9A-Fa-f]")
_HEX2 = "([0-9A-Fa-f]{2})"
_PCI = re.compile(rf"(?:PCI:)?([0-9A-Fa-f]{{4,8}}):{_HEX2}:{_HEX2}(?:\.[0-9A-Fa-f])?")
# Section and key names are compared case-folded: drivers differ in case ("Retired
# Pages" in one release, "Retired pages" in another) and mean the same section.
_UNCORRECTABLE = re.compile(r"(?:dram|sram) uncorrectable(?: .*)?")

Path = tuple[str, ...]


def normal_pci(text: str) -> str | None:
    """``00000000:3B:00.0`` (nvidia-smi) and ``PCI:0000:3b:00`` (an Xid line) alike
    become ``0000:3b:00``: domain, bus and device, lower case."""
    m = _PCI.fullmatch(text.strip())
    if m is None:
        return None
    domain, bus, device = (int(g, 16) for g in m.groups())
    return f"{domain:04x}:{bus:02x}:{device:02x}"


@functools.lru_cache(maxsize=4096)
def _name(text: str) -> str:
    """A section or key name as compared: case-folded, inner blanks made one space.
    Cached: every GPU of every host repeats the same few hundred names (a 1,000-host
    ``/vllm gpus`` parses 8,000 GPU sections)."""
    return " ".join(text.split()).casefold()


def _fields(lines: Sequence[str]) -> list[tuple[Path, str | None]]:
    """(path of section names + key, value) for every line of one GPU's section; a
    section header is a line without a colon, and its children are indented deeper.
    Names in the path are ``_name``'s (case-folded); values are as printed."""
    out: list[tuple[Path, str | None]] = []
    stack: list[tuple[int, str]] = []
    for raw in lines:
        if not raw.strip():
            continue
        indent = len(raw) - len(raw.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parents = tuple(name for _, name in stack)
        # ``Key : value`` splits at the first colon (a partition, not a regex per line:
        # the same split; with the cached names, 0.74 -> 0.51 ms for an 8-GPU report);
        # no colon, or nothing before it, is a section header.
        key, colon, value = raw.strip().partition(":")
        if not colon or not key:
            stack.append((indent, _name(raw)))
            out.append(((*parents, _name(raw)), None))
        else:
            out.append(((*parents, _name(key)), value.strip()))
    return out


def _count(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def _yes_no(value: str | None) -> bool | None:
    return {"yes": True, "no": False}.get((value or "").strip().lower())


def _sum(values: Iterable[int | None]) -> int | None:
    """The total when every counter is known; when some are not, the known part only if
    it is already above 0 (then the GPU has errors whatever the rest says), else None."""
    given = list(values)
    known = [v for v in given if v is not None]
    if not known or (len(known) < len(given) and sum(known) == 0):
        return None
    return sum(known)


def _uncorrectable(fields: Sequence[tuple[Path, str | None]], kind: str) -> int | None:
    """Uncorrectable ECC errors under ``ECC Errors`` / ``kind``: the DRAM and SRAM
    counters (current drivers), else the ``Double Bit`` / ``Total`` of older ones."""
    current = [
        _count(v)
        for p, v in fields
        if p[-3:-1] == ("ecc errors", kind) and _UNCORRECTABLE.fullmatch(p[-1])
    ]
    if any(v is not None for v in current):
        return _sum(current)
    older = [_count(v) for p, v in fields if p[-4:] == ("ecc errors", kind, "double bit", "total")]
    return _sum(older)


def _value(fields: Sequence[tuple[Path, str | None]], *tail: str) -> str | None:
    """The value of the first key whose path ends in ``tail`` (names as ``_name``)."""
    want = tuple(_name(t) for t in tail)
    return next((v for p, v in fields if p[-len(want) :] == want and v is not None), None)


# What drivers print in place of a reset-status value they do not offer: N/A on older
# GPUs, "Requested functionality has been deprecated" from R570 on (its recovery action
# says it instead). Anything else that is neither Yes nor No is unknown, never "no".
_NOT_OFFERED = (
    "n/a",
    "[n/a]",
    "not supported",
    "[not supported]",
    "requested functionality has been deprecated",
)


def _reset_status(
    fields: Sequence[tuple[Path, str | None]],
) -> tuple[bool | None, bool | None, str | None]:
    """``GPU Reset Status`` / ``Reset Required`` and ``Drain and Reset Recommended``:
    (reset, drain and reset, what an unreadable value said)."""
    read: list[bool | None] = []
    odd: list[str] = []
    for key in ("Reset Required", "Drain and Reset Recommended"):
        value = _value(fields, "GPU Reset Status", key)
        read.append(_yes_no(value))
        if value is not None and read[-1] is None and value.strip().lower() not in _NOT_OFFERED:
            odd.append(f"{key}: {value}")
    return read[0], read[1], "; ".join(odd) or None


def _reading(host: str, bus: str, lines: Sequence[str]) -> GpuReading:
    fields = _fields(lines)
    uuid = _value(fields, "GPU UUID")
    if not uuid or uuid.startswith(("N/A", "[")):
        raise GpuQueryError(
            host,
            f"unexpected nvidia-smi -q output: the section of GPU {bus} has no GPU UUID",
            output="\n".join(lines),
        )
    pending_page = next(
        (
            v
            for p, v in fields
            if len(p) >= 2 and p[-2] == "retired pages" and p[-1].startswith("pending page")
        ),
        None,
    )
    action = _value(fields, "GPU Recovery Action")
    reset, drain, odd = _reset_status(fields)
    return GpuReading(
        uuid=uuid,
        pci=normal_pci(_value(fields, "PCI", "Bus Id") or bus),
        volatile_uncorrectable=_uncorrectable(fields, "volatile"),
        aggregate_uncorrectable=_uncorrectable(fields, "aggregate"),
        retired_pending=_yes_no(pending_page),
        remap_pending=_yes_no(_value(fields, "Remapped Rows", "Pending")),
        remap_failure=_yes_no(_value(fields, "Remapped Rows", "Remapping Failure Occurred")),
        recovery_action=None if action is None or action.lower() in _NOT_OFFERED else action,
        reset_required=reset,
        drain_and_reset=drain,
        reset_unknown=odd,
    )


def parse_health_query(host: str, text: str) -> tuple[GpuReading, ...]:
    """Parse ``nvidia-smi -q``: one reading per ``GPU 00000000:3B:00.0`` section.

    Only the fields health needs are read; the others (hundreds, and they vary by
    driver) are skipped. Section and key names match whatever their case. A section
    without a GPU UUID is an error: it would be a GPU this check cannot name."""
    sections: list[tuple[str, list[str]]] = []
    for raw in text.splitlines():
        header = None if raw[:1].isspace() else _GPU_HEADER.fullmatch(raw.strip())
        if header is not None:
            sections.append((raw.strip()[4:], []))
        elif sections:
            sections[-1][1].append(raw)
    return tuple(_reading(host, bus, lines) for bus, lines in sections)
