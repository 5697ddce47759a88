"""The verdict on a host's GPUs: each GPU's findings from its state now, this boot's Xid
lines and nvidia-smi's warnings (``judge``); what the GPU check found for a run or a
request (``GpuCheck``, ``health_note``); and how a table and ``--health`` show it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from bot.core.gpu import DriverWarning, Gpu
from bot.core.health_query import normal_pci
from bot.core.health_types import (
    RESET,
    Finding,
    GpuHealth,
    GpuReading,
    HostHealth,
    Level,
    XidEvent,
)
from bot.core.health_xid import xid_finding

_RECOVERY_ACTIONS: Mapping[str, str] = {
    "reset": RESET,
    "gpu reset": RESET,
    "reboot": "reboot the node",
    "node reboot": "reboot the node",
    "system reboot": "reboot the node",
    "drain p2p": "stop every job using peer-to-peer transfers on this node",
    "drain and reset": "stop every job using peer-to-peer transfers, then reset the GPU",
    "bus reset": "reset the GPU's PCIe bus (or reboot the node)",
}


_DRAIN_AND_RESET = (
    "drain it: stop every job on this GPU and on any GPU it talks to "
    "peer-to-peer, then reset it with nvidia-smi -r, or reboot the node"
)


def _reset_findings(r: GpuReading) -> list[Finding]:
    """What ``GPU Reset Status`` says (drivers 535-560, or NVML's reset fields): a GPU
    the driver wants reset is not fit to start a model on, whatever else it shows."""
    if r.drain_and_reset:
        said = "Reset Required: Yes, " if r.reset_required else ""
        return [
            Finding(
                Level.CRITICAL,
                "the driver recommends a drain and reset (GPU Reset "
                f"Status: {said}Drain and Reset Recommended: Yes)",
                _DRAIN_AND_RESET,
            )
        ]
    if r.reset_required:
        return [
            Finding(
                Level.CRITICAL,
                "the driver says the GPU needs a reset (GPU Reset Status: Reset Required: Yes)",
                RESET,
            )
        ]
    if r.reset_unknown:
        return [
            Finding(
                Level.WARN,
                "the driver's GPU Reset Status cannot be read "
                f"({r.reset_unknown}): the GPU may need a reset",
                "read it with nvidia-smi -q on the host; reset the GPU if it asks",
            )
        ]
    return []


def _reading_findings(r: GpuReading) -> list[Finding]:
    out: list[Finding] = _reset_findings(r)
    action = (r.recovery_action or "").strip()
    if action and action.lower() != "none":
        out.append(
            Finding(
                Level.CRITICAL,
                f"the driver asks for a recovery action: {action}",
                _RECOVERY_ACTIONS.get(action.lower(), "do what the driver asks"),
            )
        )
    if r.remap_failure:
        out.append(
            Finding(
                Level.CRITICAL,
                "a row remap failed (no spare rows left)",
                "the GPU needs replacing (NVIDIA's RMA policy for row remapping)",
            )
        )
    if r.remap_pending:
        out.append(
            Finding(
                Level.CRITICAL,
                "a row remap is pending",
                "reset the GPU (nvidia-smi -r) while it is idle to apply it",
            )
        )
    if r.retired_pending:
        out.append(
            Finding(
                Level.CRITICAL,
                "a retired page is pending",
                "reset the GPU (nvidia-smi -r) or reboot to retire it",
            )
        )
    if r.volatile_uncorrectable:
        out.append(
            Finding(
                Level.CRITICAL,
                f"{r.volatile_uncorrectable} uncorrectable ECC error(s) since the last reset",
                RESET,
            )
        )
    elif r.aggregate_uncorrectable:
        out.append(
            Finding(
                Level.WARN,
                f"{r.aggregate_uncorrectable} uncorrectable ECC "
                "error(s) over the GPU's life, none since the last reset",
                "none now; watch for more",
            )
        )
    return out


def _grouped(xids: Sequence[XidEvent]) -> dict[tuple[str, int], list[XidEvent]]:
    out: dict[tuple[str, int], list[XidEvent]] = {}
    for e in xids:
        out.setdefault((e.pci, e.code), []).append(e)
    return out


_INFOROM_ACTION = (
    "the GPU still runs, but what its infoROM keeps (ECC and retired-page "
    "records, its configuration) cannot be trusted: have NVIDIA or the "
    "vendor reflash or replace it"
)


def _warning_finding(w: DriverWarning) -> Finding:
    return Finding(
        Level.WARN, f"nvidia-smi warns that the infoROM is corrupted ({w.line})", _INFOROM_ACTION
    )


def judge(
    host: str,
    gpus: Sequence[Gpu],
    readings: Sequence[GpuReading],
    xids: Sequence[XidEvent],
    *,
    notes: Sequence[Finding] = (),
    warnings: Sequence[DriverWarning] = (),
) -> HostHealth:
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
            host_findings.append(
                Finding(
                    finding.level,
                    f"PCI {pci} (no GPU answers there now): {finding.what}",
                    finding.action,
                )
            )
    for w in warnings:
        reading = by_pci.get(normal_pci(w.pci) or w.pci)
        finding = _warning_finding(w)
        if reading is not None:
            findings[reading.uuid].append(finding)
        else:  # -q did not name that address (it failed, or NVML did not say)
            host_findings.append(finding)
    return HostHealth(
        host,
        tuple(GpuHealth(index_of.get(u), u, tuple(findings[u])) for u in uuids),
        tuple(host_findings),
        tuple(xids),
        tuple(readings),
    )


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
            out += [
                f"{g.label} {level}: {f.describe()}"
                for g in self.health.scoped(self.scope)
                for f in g.findings
                if f.level == level
            ]
            out += [
                f"{level}: {f.describe()}" for f in self.health.host_findings if f.level == level
            ]
        return out


@dataclass(frozen=True, slots=True)
class HealthNote:
    """One host's GPU health as the approval card and the terminal show it at the request."""

    host: str
    level: Level | None  # WARN or CRITICAL; None: could not be read (unknown, never ok)
    text: str


def health_note(host: str, check: GpuCheck | None, error: str | None = None) -> HealthNote | None:
    """The line for a host whose GPUs are not all ok (None when they are): each finding
    with NVIDIA's action, and when the preflight will refuse, that it will. ``check``
    None: the read itself failed (``error`` says why)."""
    if check is None or check.health is None:
        why = error if check is None else check.refusal
        return HealthNote(
            host,
            None,
            f"{host}: unknown ({why or 'not read'}); the preflight "
            "reads it again before anything changes",
        )
    level = check.level
    if level is None or level == Level.OK:
        return None
    text = f"{host}: {'; '.join(check.findings())}"
    if level == Level.CRITICAL:
        text += (
            f". The preflight will refuse the run on {host} before anything changes "
            "(service untouched)"
        )
    return HealthNote(host, level, text)


def marks(health: HostHealth) -> dict[str, str]:
    """A short mark per GPU uuid for a table's GPU column: ``warn`` or ``CRIT``."""
    return {
        g.uuid: {Level.WARN: "warn", Level.CRITICAL: "CRIT"}[g.level]
        for g in health.gpus
        if g.level != Level.OK
    }


def details(health: HostHealth, uuids: Iterable[str] | None = None) -> str:
    """Every GPU's verdict with its findings and NVIDIA's action, then the host's
    findings and this boot's Xid lines (the last 20): ``/vllm gpus <host> --health``,
    and a GPU check's output."""
    lines = [f"{health.host}: {health.level(uuids)}"]
    for g in health.scoped(uuids):
        lines.append(f"{g.label} {g.uuid}: {g.level}")
        lines += [f"  {f.level}: {f.what}\n    action: {f.action}" for f in g.findings]
    lines += [f"host: {f.level}: {f.what}\n    action: {f.action}" for f in health.host_findings]
    if health.xids:
        shown = health.xids[-20:]
        lines.append(
            f"kernel log, Xid lines of this boot ({len(health.xids)}; the last {len(shown)}):"
        )
        lines += [f"  {e.line}" for e in shown]
    return "\n".join(lines)
