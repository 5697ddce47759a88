"""The simulated host's kernel log (``journalctl -k``), as far as GPUs go: Xid lines.

A hardware fault switched on (``SimKit.set_faults``) logs the Xid a real driver logs
for it, stamped then, so a later look sees the same line (and a line that appears
during a run is new to a check that compares two looks). Tests add others with
``SimKit.kernel_message``. Lines follow the kernel's format,
``NVRM: Xid (PCI:0000:61:00): 79, pid=..., GPU has fallen off the bus.``, and on a MIG
GPU the instance inside the parentheses, ``(PCI:0000:61:00 GPU-I:05)`` (krcReportXid in
NVIDIA's open-gpu-kernel-modules, kernel_rc.c); the words after the code are this
simulator's, not copied from a driver.
"""

from __future__ import annotations

import json
import os
import re
import time

from bot.sim.state import Faults, HostConfig, StateStore

FILE = "kernel.jsonl"

# fault -> (Xid code, what follows "pid=..., ", the MIG GPU instance or None).
FAULT_XIDS: dict[str, tuple[int, str, int | None]] = {
    "xid_79": (79, "GPU has fallen off the bus.", None),
    "pending_remap": (
        63,
        "Row remapper: a new row is marked for remapping; reset the GPU to activate it.",
        None,
    ),
    "ecc_uncorrected": (
        48,
        "An uncorrectable double-bit error (DBE) was detected in the framebuffer.",
        None,
    ),
    # A contained error in one MIG instance: the driver names the instance, and says
    # no reset is needed (RST: No, D-RST: No), as its error-containment lines do.
    "mig_xid": (94, "Contained: SM (0x1). RST: No, D-RST: No", 5),
}


def pci(index: int) -> str:
    """The GPU's address as an Xid line names it (the sim's bus ids: 0x01 + 0x20 * i)."""
    return f"0000:{(0x01 + index * 0x20) % 0x100:02x}:00"


def xid_line(index: int, code: int, text: str, instance: int | None = None) -> str:
    where = f"PCI:{pci(index)}" + (f" GPU-I:{instance:02d}" if instance is not None else "")
    return f"NVRM: Xid ({where}): {code}, pid='<unknown>', name=<unknown>, {text}"


def append(store: StateStore, text: str, ts: float | None = None) -> None:
    line = json.dumps({"ts": time.time() if ts is None else ts, "msg": text}) + "\n"
    fd = os.open(store.directory / FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def on_faults(store: StateStore, config: HostConfig, before: Faults, after: Faults) -> None:
    """Log the Xid of each hardware fault that was just switched on."""
    for name, (code, text, instance) in FAULT_XIDS.items():
        if getattr(after, name) and not getattr(before, name):
            append(store, xid_line(config.stuck_gpu, code, text, instance))


def lines(store: StateStore, hostname: str, grep: str | None) -> list[str]:
    """``journalctl -k`` in the default short format, only lines matching ``grep``."""
    path = store.directory / FILE
    if not path.exists():
        return []
    rx = re.compile(grep) if grep else None
    out = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        if not raw.strip():
            continue
        entry = json.loads(raw)
        if rx is not None and not rx.search(entry["msg"]):
            continue
        stamp = time.strftime("%b %d %H:%M:%S", time.localtime(entry["ts"]))
        out.append(f"{stamp} {hostname} kernel: {entry['msg']}")
    return out
