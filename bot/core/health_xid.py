"""The kernel's Xid lines: reading them from this boot's log (journalctl, dmesg as the
fallback), parsing them, and what one Xid code means (a paraphrase of NVIDIA's Xid
catalogue), judged against the GPU's state now: an Xid line stays in the log after a
reset, so one whose cause the state would show is critical only while it shows it."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bot.core.health_query import normal_pci
from bot.core.health_types import RESET, Finding, GpuReading, Level, XidEvent

# The kernel log of this boot, only the Xid lines. No -q: a user outside the adm and
# systemd-journal groups would then get an empty answer with exit 0, which would read
# as "no Xid"; without it journalctl says so on stderr (``kernel_log_unreadable``).
XID_JOURNAL_ARGV: tuple[str, ...] = ("journalctl", "-k", "-b", "--no-pager", "-g", "NVRM: Xid")
# The fallback where journalctl cannot help (no journal, no pattern support): the ring
# buffer, its exit status kept (a pipe would hide a refused read), the last lines only.
XID_DMESG_SCRIPT = (
    'out=$(dmesg 2>&1) || { printf "%s\\n" "$out" >&2; exit 1; }; '
    'printf "%s\\n" "$out" | grep -F "NVRM: Xid" | tail -n 500; exit 0'
)
XID_DMESG_ARGV: tuple[str, ...] = ("sh", "-c", XID_DMESG_SCRIPT, "sh")
# What journalctl prints (stderr) when it cannot show the system's messages.
_UNREADABLE_HINTS = (
    "not seeing messages from other users",
    "insufficient permissions",
    "No journal files were found",
    "Compiled without pattern matching",
)

# The kernel's Xid line, as NVIDIA's open kernel modules print it (krcReportXid in
# src/nvidia/src/kernel/gpu/rc/kernel_rc.c): "NVRM: Xid (PCI:%04x:%02x:%02x): %d, ...",
# on a MIG GPU with " GPU-I:%02u" and maybe " GPU-CI:%02u" inside the parentheses; older
# drivers print the address without "PCI:" ("NVRM: Xid (0000:03:00): 13, ...").
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})"
    r"(?:\.[0-9A-Fa-f])?(?P<instance>(?:\s+GPU-C?I:\s*[0-9]+)*)\s*\): "
    r"(?P<code>[0-9]+),?\s*(?P<text>.*)"
)


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
    43: XidInfo("GPU stopped processing (the application hit an error)", Level.WARN, _RESTART_APP),
    48: XidInfo("double-bit ECC error", Level.CRITICAL, RESET, "ecc"),
    63: XidInfo(
        "ECC page retirement or row remap recorded",
        Level.WARN,
        "reset the GPU when convenient to apply it",
        "remap",
    ),
    64: XidInfo("ECC page retirement or row remap failed", Level.CRITICAL, RESET, "remap"),
    79: XidInfo(
        "GPU has fallen off the bus",
        Level.CRITICAL,
        "reboot the node (a GPU reset rarely recovers it); if it repeats, check "
        "power, cooling and the PCIe seating",
        "lost",
    ),
    92: XidInfo("high single-bit ECC error rate", Level.WARN, "none now; watch for more"),
    94: XidInfo("contained ECC error", Level.WARN, _RESTART_APP),
    95: XidInfo("uncontained ECC error", Level.CRITICAL, RESET, "ecc"),
    119: XidInfo("GSP RPC timeout", Level.CRITICAL, RESET),
    120: XidInfo("GSP error", Level.CRITICAL, RESET),
    154: XidInfo(
        "GPU recovery action changed", Level.CRITICAL, "do what the driver asks (see the line)"
    ),
}
_UNLISTED = XidInfo(
    "not in this bot's catalogue", Level.WARN, "look it up in NVIDIA's Xid catalogue"
)


def _cleared(info: XidInfo, r: GpuReading | None) -> str | None:
    """Why the current state shows an Xid's cause is gone (the line stays in the log
    after a reset), or None when it may still be there."""
    if info.cleared_by == "lost" or (r is not None and (r.reset_required or r.drain_and_reset)):
        return None
    if r is not None and (r.recovery_action or "").strip().lower() == "none":
        return "the driver asks for no recovery action now"
    if info.cleared_by == "ecc" and r is not None and r.volatile_uncorrectable == 0:
        return "no uncorrectable ECC error since the last reset"
    if (
        info.cleared_by == "remap"
        and r is not None
        and r.remap_pending is False
        and r.remap_failure is False
    ):
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
    what = f"Xid {last.code}{times} ({info.what}){mig}" + (f", last at {when}" if when else "")
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
