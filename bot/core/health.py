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
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from bot.core.gpu import DriverWarning, Gpu
from bot.core.results import CommandResult
from bot.core.status import HealthSource
from bot.errors import GpuQueryError

# The exact commands; kept here so the parsers and the commands cannot drift apart.
HEALTH_QUERY_ARGV: tuple[str, ...] = ("nvidia-smi", "-q")
# The kernel log of this boot, only the Xid lines. No -q: a user outside the adm and
# systemd-journal groups would then get an empty answer with exit 0, which would read
# as "no Xid"; without it journalctl says so on stderr (``kernel_log_unreadable``).
XID_JOURNAL_ARGV: tuple[str, ...] = ("journalctl", "-k", "-b", "--no-pager", "-g",
                                     "NVRM: Xid")
# The fallback where journalctl cannot help (no journal, no pattern support): the ring
# buffer, its exit status kept (a pipe would hide a refused read), the last lines only.
XID_DMESG_SCRIPT = ('out=$(dmesg 2>&1) || { printf "%s\\n" "$out" >&2; exit 1; }; '
                    'printf "%s\\n" "$out" | grep -F "NVRM: Xid" | tail -n 500; exit 0')
XID_DMESG_ARGV: tuple[str, ...] = ("sh", "-c", XID_DMESG_SCRIPT, "sh")
# nvidia-smi's exit status when a GPU has fallen off the bus (its man page, RETURN VALUE).
LOST_GPU_EXIT = 15
# What journalctl prints (stderr) when it cannot show the system's messages.
_UNREADABLE_HINTS = ("not seeing messages from other users", "insufficient permissions",
                     "No journal files were found", "Compiled without pattern matching")


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
        return worst([*(g.level for g in self.scoped(uuids)),
                      *(f.level for f in self.host_findings)])

    def problems(self, level: Level, uuids: Iterable[str] | None = None) -> list[str]:
        """One sentence per finding at ``level``, GPU first: what, then the action."""
        out = [f"{g.label}: {f.describe()}" for g in self.scoped(uuids) for f in g.findings
               if f.level == level]
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


@dataclass(frozen=True, slots=True)
class GpuCheck:
    """What the GPU check found on one host: the run's step before the stop, and the
    same reads at the request, for the approval card (``bot.core.flows``)."""

    refusal: str | None  # why a run must not go on here; None: it may
    health: HostHealth | None = None  # None: the host was not reached (``refusal`` says so)
    scope: frozenset[str] | None = None  # the service's GPU uuids (None: all)
    wanted: str = ""  # what the service's ``gpus`` asks for ("GPUs 0, 1", "all GPUs")
    # Why the service cannot run on these GPUs, health aside: none listed, fewer than it
    # needs, or the GPU query failed (part of ``refusal``).
    listing: str | None = None
    read_with: str = ""  # what the GPUs' state was read with (``GpuStateRead.said``)

    @property
    def level(self) -> Level | None:
        """Critical whenever the run would be refused here; None: unknown (not reached)."""
        if self.health is None:
            return None
        if self.refusal is not None:
            return Level.CRITICAL
        return self.health.level(self.scope)

    def findings(self) -> list[str]:
        """What is not ok, critical first: ``GPU 3 critical: what (NVIDIA's action)``, a
        finding of no GPU's as ``warn: what (action)``."""
        if self.health is None:
            return []
        out = [self.listing] if self.listing else []
        for level in (Level.CRITICAL, Level.WARN):
            out += [f"{g.label} {level}: {f.describe()}" for g in self.health.scoped(self.scope)
                    for f in g.findings if f.level == level]
            out += [f"{level}: {f.describe()}" for f in self.health.host_findings
                    if f.level == level]
        return out


@dataclass(frozen=True, slots=True)
class HealthNote:
    """One host's GPU health as the approval card and the terminal show it at the request."""

    host: str
    level: Level | None  # WARN or CRITICAL; None: could not be read (unknown, never ok)
    text: str


def health_note(host: str, check: GpuCheck | None, error: str | None = None
                ) -> HealthNote | None:
    """The line for a host whose GPUs are not all ok (None when they are): each finding
    with NVIDIA's action, and when the preflight will refuse, that it will. ``check``
    None: the read itself failed (``error`` says why)."""
    if check is None or check.health is None:
        why = error if check is None else check.refusal
        return HealthNote(host, None, f"{host}: unknown ({why or 'not read'}); the preflight "
                          "reads it again before anything changes")
    level = check.level
    if level is None or level == Level.OK:
        return None
    text = f"{host}: {'; '.join(check.findings())}"
    if level == Level.CRITICAL:
        text += (f". The preflight will refuse the run on {host} before anything changes "
                 "(service untouched)")
    return HealthNote(host, level, text)


# --------------------------------------------------------------------------- nvidia-smi -q

_GPU_HEADER = re.compile(r"GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})\.[0-9A-Fa-f]")
_KEY_VALUE = re.compile(r"(?P<key>[^:]+?)\s*:\s*(?P<value>.*)")
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


def _name(text: str) -> str:
    """A section or key name as compared: case-folded, inner blanks made one space."""
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
        m = _KEY_VALUE.fullmatch(raw.strip())
        if m is None:  # a section header
            stack.append((indent, _name(raw)))
            out.append(((*parents, _name(raw)), None))
        else:
            out.append(((*parents, _name(m["key"])), m["value"].strip()))
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
    current = [_count(v) for p, v in fields
               if p[-3:-1] == ("ecc errors", kind) and _UNCORRECTABLE.fullmatch(p[-1])]
    if any(v is not None for v in current):
        return _sum(current)
    older = [_count(v) for p, v in fields if p[-4:] == ("ecc errors", kind, "double bit", "total")]
    return _sum(older)


def _value(fields: Sequence[tuple[Path, str | None]], *tail: str) -> str | None:
    """The value of the first key whose path ends in ``tail`` (names as ``_name``)."""
    want = tuple(_name(t) for t in tail)
    return next((v for p, v in fields if p[-len(want):] == want and v is not None), None)


# What drivers print in place of a reset-status value they do not offer: N/A on older
# GPUs, "Requested functionality has been deprecated" from R570 on (its recovery action
# says it instead). Anything else that is neither Yes nor No is unknown, never "no".
_NOT_OFFERED = ("n/a", "[n/a]", "not supported", "[not supported]",
                "requested functionality has been deprecated")


def _reset_status(fields: Sequence[tuple[Path, str | None]]
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
        raise GpuQueryError(host, f"unexpected nvidia-smi -q output: the section of GPU {bus} "
                            "has no GPU UUID", output="\n".join(lines))
    pending_page = next((v for p, v in fields
                         if len(p) >= 2 and p[-2] == "retired pages"
                         and p[-1].startswith("pending page")), None)
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
        reset_required=reset, drain_and_reset=drain, reset_unknown=odd,
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


# --------------------------------------------------------------------------- Xid lines

# The kernel's Xid line, as NVIDIA's open kernel modules print it (krcReportXid in
# src/nvidia/src/kernel/gpu/rc/kernel_rc.c): "NVRM: Xid (PCI:%04x:%02x:%02x): %d, ...",
# on a MIG GPU with " GPU-I:%02u" and maybe " GPU-CI:%02u" inside the parentheses; older
# drivers print the address without "PCI:" ("NVRM: Xid (0000:03:00): 13, ...").
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})"
    r"(?:\.[0-9A-Fa-f])?(?P<instance>(?:\s+GPU-C?I:\s*[0-9]+)*)\s*\): "
    r"(?P<code>[0-9]+),?\s*(?P<text>.*)")


def parse_xid_lines(text: str) -> tuple[XidEvent, ...]:
    """Every ``NVRM: Xid (PCI:0000:3b:00): 79, ...`` line (also the MIG form with
    ``GPU-I:05``, and the old one without ``PCI:``), whatever precedes it (a journalctl
    or dmesg time stamp, the host name, ``kernel:``); other lines are skipped
    (``-- No entries --``, a journalctl hint)."""
    events: list[XidEvent] = []
    for raw in text.splitlines():
        m = _XID.search(raw)
        if m is None:
            continue
        pci = normal_pci(m["pci"])
        if pci is None:
            continue
        instance = " ".join(m["instance"].split()).replace(": ", ":")
        events.append(XidEvent(pci, int(m["code"]), m["text"].strip(), raw.strip(), instance))
    return tuple(events)


def kernel_log_unreadable(stdout: str, stderr: str, exit_status: int | None) -> str | None:
    """Why journalctl's answer cannot be trusted to hold every Xid line (None: it can).
    A normal user sees only their own messages, with a hint on stderr and exit 0."""
    said = " ".join(stderr.split())
    for hint in _UNREADABLE_HINTS:
        if hint.lower() in said.lower():
            return f"journalctl cannot show the kernel log: {said[:200]}"
    if exit_status == 0:
        return None
    if exit_status == 1 and not stdout.strip() and not said:
        return None  # some journalctl versions exit 1 when --grep matched nothing
    return f"journalctl failed (exit {exit_status}): {said[:200] or stdout.strip()[:200]}"


def new_xids(before: Sequence[XidEvent], after: Sequence[XidEvent]) -> tuple[XidEvent, ...]:
    """The Xid lines in ``after`` that ``before`` did not have (lines are compared whole,
    time stamp included, and counted: the same line twice is two events)."""
    seen = Counter(e.line for e in before)
    out = []
    for e in after:
        if seen[e.line] > 0:
            seen[e.line] -= 1
        else:
            out.append(e)
    return tuple(out)


# --------------------------------------------------------------------------- the catalogue

_RESET = "reset the GPU (nvidia-smi -r) once no process uses it, or reboot the node"
_RESTART_APP = "restart the application (a redeploy or restart does)"


@dataclass(frozen=True, slots=True)
class XidInfo:
    what: str
    level: Level  # while its cause may still be there
    action: str
    # The state that shows whether its cause is gone: "ecc" (volatile uncorrectable
    # count), "remap" (pending/failed remap), "none" (nothing does), "lost" (for the rest
    # of the boot).
    cleared_by: str = "none"


# Paraphrased from NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors).
XID_CATALOGUE: Mapping[int, XidInfo] = {
    13: XidInfo("graphics engine exception", Level.WARN, _RESTART_APP),
    31: XidInfo("GPU memory page fault", Level.WARN, _RESTART_APP),
    43: XidInfo("GPU stopped processing (the application hit an error)", Level.WARN,
                _RESTART_APP),
    48: XidInfo("double-bit ECC error", Level.CRITICAL, _RESET, "ecc"),
    63: XidInfo("ECC page retirement or row remap recorded", Level.WARN,
                "reset the GPU when convenient to apply it", "remap"),
    64: XidInfo("ECC page retirement or row remap failed", Level.CRITICAL, _RESET, "remap"),
    79: XidInfo("GPU has fallen off the bus", Level.CRITICAL,
                "reboot the node (a GPU reset rarely recovers it); if it repeats, check "
                "power, cooling and the PCIe seating", "lost"),
    92: XidInfo("high single-bit ECC error rate", Level.WARN, "none now; watch for more"),
    94: XidInfo("contained ECC error", Level.WARN, _RESTART_APP),
    95: XidInfo("uncontained ECC error", Level.CRITICAL, _RESET, "ecc"),
    119: XidInfo("GSP RPC timeout", Level.CRITICAL, _RESET),
    120: XidInfo("GSP error", Level.CRITICAL, _RESET),
    154: XidInfo("GPU recovery action changed", Level.CRITICAL,
                 "do what the driver asks (see the line)"),
}
_UNLISTED = XidInfo("not in this bot's catalogue", Level.WARN,
                    "look it up in NVIDIA's Xid catalogue")

_RECOVERY_ACTIONS: Mapping[str, str] = {
    "reset": _RESET, "gpu reset": _RESET,
    "reboot": "reboot the node", "node reboot": "reboot the node",
    "system reboot": "reboot the node",
    "drain p2p": "stop every job using peer-to-peer transfers on this node",
    "drain and reset": "stop every job using peer-to-peer transfers, then reset the GPU",
    "bus reset": "reset the GPU's PCIe bus (or reboot the node)",
}


_DRAIN_AND_RESET = ("drain it: stop every job on this GPU and on any GPU it talks to "
                    "peer-to-peer, then reset it with nvidia-smi -r, or reboot the node")


def _reset_findings(r: GpuReading) -> list[Finding]:
    """What ``GPU Reset Status`` says (drivers 535-560, or NVML's reset fields): a GPU
    the driver wants reset is not fit to start a model on, whatever else it shows."""
    if r.drain_and_reset:
        said = "Reset Required: Yes, " if r.reset_required else ""
        return [Finding(Level.CRITICAL, "the driver recommends a drain and reset (GPU Reset "
                        f"Status: {said}Drain and Reset Recommended: Yes)", _DRAIN_AND_RESET)]
    if r.reset_required:
        return [Finding(Level.CRITICAL, "the driver says the GPU needs a reset (GPU Reset "
                        "Status: Reset Required: Yes)", _RESET)]
    if r.reset_unknown:
        return [Finding(Level.WARN, "the driver's GPU Reset Status cannot be read "
                        f"({r.reset_unknown}): the GPU may need a reset",
                        "read it with nvidia-smi -q on the host; reset the GPU if it asks")]
    return []


def _reading_findings(r: GpuReading) -> list[Finding]:
    out: list[Finding] = _reset_findings(r)
    action = (r.recovery_action or "").strip()
    if action and action.lower() != "none":
        out.append(Finding(Level.CRITICAL, f"the driver asks for a recovery action: {action}",
                           _RECOVERY_ACTIONS.get(action.lower(), "do what the driver asks")))
    if r.remap_failure:
        out.append(Finding(Level.CRITICAL, "a row remap failed (no spare rows left)",
                           "the GPU needs replacing (NVIDIA's RMA policy for row remapping)"))
    if r.remap_pending:
        out.append(Finding(Level.CRITICAL, "a row remap is pending",
                           "reset the GPU (nvidia-smi -r) while it is idle to apply it"))
    if r.retired_pending:
        out.append(Finding(Level.CRITICAL, "a retired page is pending",
                           "reset the GPU (nvidia-smi -r) or reboot to retire it"))
    if r.volatile_uncorrectable:
        out.append(Finding(Level.CRITICAL, f"{r.volatile_uncorrectable} uncorrectable ECC "
                           "error(s) since the last reset", _RESET))
    elif r.aggregate_uncorrectable:
        out.append(Finding(Level.WARN, f"{r.aggregate_uncorrectable} uncorrectable ECC "
                           "error(s) over the GPU's life, none since the last reset",
                           "none now; watch for more"))
    return out


def _cleared(info: XidInfo, r: GpuReading | None) -> str | None:
    """Why the current state shows an Xid's cause is gone (the line stays in the log
    after a reset), or None when it may still be there."""
    if info.cleared_by == "lost" or (r is not None and (r.reset_required or r.drain_and_reset)):
        return None
    if r is not None and (r.recovery_action or "").strip().lower() == "none":
        return "the driver asks for no recovery action now"
    if info.cleared_by == "ecc" and r is not None and r.volatile_uncorrectable == 0:
        return "no uncorrectable ECC error since the last reset"
    if (info.cleared_by == "remap" and r is not None and r.remap_pending is False
            and r.remap_failure is False):
        return "no row remap pending or failed now"
    return None


def xid_finding(events: Sequence[XidEvent], reading: GpuReading | None) -> Finding:
    """One finding for the lines of one Xid code on one GPU (a flapping GPU logs
    thousands): how many, and the last line as the evidence."""
    last = events[-1]
    info = XID_CATALOGUE.get(last.code, _UNLISTED)
    times = f" x{len(events)}" if len(events) > 1 else ""
    when = _logged_at(last.line)
    instances = sorted({e.instance for e in events if e.instance})
    mig = f" on MIG instance {', '.join(instances)}" if instances else ""
    what = (f"Xid {last.code}{times} ({info.what}){mig}"
            + (f", last at {when}" if when else ""))
    cleared = _cleared(info, reading) if info.level == Level.CRITICAL else None
    if cleared is not None:
        return Finding(Level.WARN, f"{what}; {cleared}", "none now; it is in this boot's log")
    return Finding(info.level, what, info.action)


def _logged_at(line: str) -> str:
    """When the kernel log says a line was logged: journalctl's ``Nov 30 23:25:16`` or
    dmesg's ``[ 7201.123456]``; empty when the line carries no time stamp."""
    head = line.split("NVRM:", 1)[0].strip()
    if head.startswith("["):
        return head.split("]", 1)[0] + "]"
    words = head.split()
    return " ".join(words[:3]) if len(words) >= 3 else ""


def _grouped(xids: Sequence[XidEvent]) -> dict[tuple[str, int], list[XidEvent]]:
    out: dict[tuple[str, int], list[XidEvent]] = {}
    for e in xids:
        out.setdefault((e.pci, e.code), []).append(e)
    return out


# --------------------------------------------------------------------------- the verdict

_INFOROM_ACTION = ("the GPU still runs, but what its infoROM keeps (ECC and retired-page "
                   "records, its configuration) cannot be trusted: have NVIDIA or the "
                   "vendor reflash or replace it")


def _warning_finding(w: DriverWarning) -> Finding:
    return Finding(Level.WARN, f"nvidia-smi warns that the infoROM is corrupted ({w.line})",
                   _INFOROM_ACTION)


def judge(host: str, gpus: Sequence[Gpu], readings: Sequence[GpuReading],
          xids: Sequence[XidEvent], *, notes: Sequence[Finding] = (),
          warnings: Sequence[DriverWarning] = ()) -> HostHealth:
    """Each GPU's findings: its reading's (state now), its Xid lines' (this boot) and
    the warnings nvidia-smi printed about it (a corrupted infoROM).

    ``gpus``: the GPU query's rows (index and uuid); ``notes``: host findings the caller
    already has (a kernel log it could not read, a health query that failed);
    ``warnings``: the GPU query's known warnings, placed by PCI address like Xid lines."""
    by_uuid = {r.uuid: r for r in readings}
    by_pci = {r.pci: r for r in readings if r.pci is not None}
    index_of = {g.uuid: g.index for g in gpus}
    uuids = [g.uuid for g in gpus] + [r.uuid for r in readings if r.uuid not in index_of]
    findings: dict[str, list[Finding]] = {u: [] for u in uuids}
    for u in uuids:
        reading = by_uuid.get(u)
        if reading is not None:
            findings[u] += _reading_findings(reading)
    host_findings = list(notes)
    for (pci, _code), events in _grouped(xids).items():
        reading = by_pci.get(pci)
        finding = xid_finding(events, reading)
        if reading is not None:
            findings[reading.uuid].append(finding)
        else:
            # No GPU answers at that address (it fell off the bus), or this driver does
            # not say where its GPUs are: it may be any of them.
            host_findings.append(Finding(finding.level, f"PCI {pci} (no GPU answers "
                                         f"there now): {finding.what}", finding.action))
    for w in warnings:
        reading = by_pci.get(normal_pci(w.pci) or w.pci)
        finding = _warning_finding(w)
        if reading is not None:
            findings[reading.uuid].append(finding)
        else:  # -q did not name that address (it failed, or NVML did not say)
            host_findings.append(finding)
    return HostHealth(host, tuple(GpuHealth(index_of.get(u), u, tuple(findings[u]))
                                  for u in uuids), tuple(host_findings), tuple(xids),
                      tuple(readings))


# --------------------------------------------------------------------------- reading a host

Reads = Generator[tuple[str, ...], CommandResult, HostHealth]


def _lost(r: CommandResult) -> bool:
    return r.exit_status is None and r.signal is None


def _said(r: CommandResult) -> str:
    if _lost(r):
        return f"no answer ({r.stderr.strip()[:200] or 'the host did not answer'})"
    tail = " ".join((r.stderr.strip() or r.stdout.strip()).split())[:200]
    return f"exit {r.exit_status}" + (f": {tail}" if tail else "")


def state_findings(host: str, q: CommandResult
                   ) -> tuple[tuple[GpuReading, ...], tuple[Finding, ...]]:
    """``nvidia-smi -q``'s result as readings, and what a failed or unreadable one says
    about the host (a lost GPU's exit status is critical)."""
    if q.exit_status == 0:
        try:
            return parse_health_query(host, q.stdout), ()
        except GpuQueryError as e:
            return (), (Finding(Level.WARN, f"nvidia-smi -q: {e.reason}", "check the driver"),)
    lost_gpu = q.exit_status == LOST_GPU_EXIT
    return (), (Finding(Level.CRITICAL if lost_gpu else Level.WARN,
                        f"nvidia-smi -q failed ({_said(q)})",
                        "reboot the node" if lost_gpu else "check the driver"),)


@dataclass(frozen=True, slots=True)
class GpuStateRead:
    """How the GPUs' state was read on a host: NVML's readings, or ``nvidia-smi -q``'s
    result (with why NVML was not used, where the host is the bot's own)."""

    source: HealthSource
    readings: tuple[GpuReading, ...] = ()  # NVML's
    result: CommandResult | None = None  # nvidia-smi -q's
    nvml_error: str | None = None  # NVML failed on the bot's own host: why

    def judged(self, host: str) -> tuple[tuple[GpuReading, ...], tuple[Finding, ...]]:
        """The readings and the host findings, the same whichever source."""
        if self.source == HealthSource.NVML or self.result is None:
            return self.readings, ()
        return state_findings(host, self.result)

    def said(self) -> str:
        """Which source, for the step's output."""
        if self.source == HealthSource.NVML:
            return "GPU health from NVML"
        if self.nvml_error is not None:
            return f"GPU health from nvidia-smi -q (NVML failed: {self.nvml_error})"
        return "GPU health from nvidia-smi -q"


def health_reads(host: str, gpus: Sequence[Gpu],
                 readings: Sequence[GpuReading] | None = None,
                 notes: Sequence[Finding] = (),
                 warnings: Sequence[DriverWarning] = ()) -> Reads:
    """What to run on a host to judge its GPUs' health, as a generator: it yields each
    argv and is sent its ``CommandResult``; it returns the verdict. Flows drive it with
    their RunCommand, ``/vllm gpus`` with the transport. ``readings``: the GPUs' state
    read already (NVML on the bot's own machine, or ``GpuStateRead.judged`` with
    ``notes``), so ``nvidia-smi -q`` is not run here. ``warnings``: what the GPU query
    warned about (``GpuSnapshot.warnings``)."""
    found: list[Finding] = list(notes)
    if readings is None:
        q = yield HEALTH_QUERY_ARGV
        readings, said = state_findings(host, q)
        found += said
    xids: tuple[XidEvent, ...] = ()
    j = yield XID_JOURNAL_ARGV
    why = _said(j) if _lost(j) else kernel_log_unreadable(j.stdout, j.stderr, j.exit_status)
    if why is None:
        xids = parse_xid_lines(j.stdout)
    else:
        d = yield XID_DMESG_ARGV
        if d.exit_status == 0:
            xids = parse_xid_lines(d.stdout)
        else:
            found.append(Finding(Level.WARN, f"the kernel log cannot be read, so Xid errors are "
                                 f"unknown ({why}; dmesg: {_said(d)})",
                                 "let the bot's user read the kernel log (group adm or "
                                 "systemd-journal)"))
    return judge(host, gpus, readings, xids, notes=found, warnings=warnings)


def marks(health: HostHealth) -> dict[str, str]:
    """A short mark per GPU uuid for a table's GPU column: ``warn`` or ``CRIT``."""
    return {g.uuid: {Level.WARN: "warn", Level.CRITICAL: "CRIT"}[g.level]
            for g in health.gpus if g.level != Level.OK}


def details(health: HostHealth, uuids: Iterable[str] | None = None) -> str:
    """Every GPU's verdict with its findings and NVIDIA's action, then the host's
    findings and this boot's Xid lines (the last 20): ``/vllm gpus <host> --health``,
    and a GPU check's output."""
    lines = [f"{health.host}: {health.level(uuids)}"]
    for g in health.scoped(uuids):
        lines.append(f"{g.label} {g.uuid}: {g.level}")
        lines += [f"  {f.level}: {f.what}\n    action: {f.action}" for f in g.findings]
    lines += [f"host: {f.level}: {f.what}\n    action: {f.action}"
              for f in health.host_findings]
    if health.xids:
        shown = health.xids[-20:]
        lines.append(f"kernel log, Xid lines of this boot ({len(health.xids)}; the last "
                     f"{len(shown)}):")
        lines += [f"  {e.line}" for e in shown]
    return "\n".join(lines)
