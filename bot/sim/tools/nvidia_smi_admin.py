"""Simulated ``nvidia-smi -pm 0|1`` and ``nvidia-smi -r`` (issue 23), on the GPUs ``-i``
names (all of them without it). Their words are public captures (tests/samples/host/):

* ``-pm``: ``Enabled persistence mode for GPU 00000000:61:00.0.`` (or ``Disabled``) per
  GPU, then ``All done.`` (NVIDIA's driver persistence guide; NVSentinel#1692 shows the
  ``All done.``); exit 0. Persistence mode is per GPU in the state and a reboot sets it
  back to ``persistence_at_boot``.
* ``-r`` refused while a process holds the GPU (NVIDIA/gpu-operator#118), or while
  persistence mode (or, with the reset_refused fault, another client such as Fabric
  Manager) holds it (NVIDIA/NVSentinel#1690): exit 255. Succeeded: one line per GPU,
  ``GPU ... was successfully reset.``, after ``gpu_reset_s``; exit 0. No ``All done.``
  follows it in either public capture (NVSentinel#1692, gpu-operator#118; the latter
  shows it after another command of the same session), so none is printed.
  A reset clears what a reset clears on that GPU (a pending row remap, a required reset)
  and leaves persistence mode as it was.

The sim does not tell root from another caller (the real tool's "Insufficient
Permissions", exit 4): a test of that puts a guard in front, as tests/support/nonroot.py
does for systemctl.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

from bot.sim.state import HostState, SimGpu, StateStore, host_view, persistence_of

IN_USE_EXIT = 255
# What the real tool prints after the refusal lines (the two sources word the "e.g."
# differently; each refusal is printed as its source has it).
_CLIENTS_1690 = (
    "{n} is currently being used by one or more other processes (e.g. Fabric Manager, "
    "CUDA application, graphics application such as an X server, or a monitoring "
    "application such as another instance of nvidia-smi). Please first kill all processes "
    "using this device and all compute applications running in the system."
)
_CLIENTS_118 = _CLIENTS_1690.replace("(e.g. ", "(e.g., ")
NO_DEVICES = "No devices were found"
NO_DEVICES_EXIT = 6


def bus_id(index: int) -> str:
    return f"00000000:{(0x01 + index * 0x20) % 0x100:02X}:00.0"


def _devices(n: int) -> str:
    return "1 device" if n == 1 else f"{n} devices"


LOST_EXIT = 15


def _targets(gpus: list[SimGpu], ids: set[int] | None) -> list[SimGpu] | None:
    if ids is None:
        return gpus
    if not ids <= {g.index for g in gpus}:
        return None
    return [g for g in gpus if g.index in ids]


def _unreachable(targets: list[SimGpu] | None) -> tuple[str, int] | None:
    """No such GPU, or one fallen off the bus (nvidia_smi's words for it)."""
    if targets is None:
        return NO_DEVICES + "\n", NO_DEVICES_EXIT
    lost = [g for g in targets if g.lost]
    if lost:
        lines = [
            f"Unable to determine the device handle for GPU{bus_id(g.index)[4:]}: Unknown Error"
            for g in lost
        ]
        return "".join(line + "\n" for line in lines), LOST_EXIT
    return None


def persistence(store: StateStore, ids: set[int] | None, on: bool) -> tuple[str, int]:
    with store.transaction() as tx:
        st = tx.state
        targets = _targets(host_view(st, time.time())[0], ids)
        if (why := _unreachable(targets)) is not None or targets is None:
            return why or ("", 1)
        modes = [persistence_of(st, i) for i in range(st.config.gpus)]
        for g in targets:
            modes[g.index] = on
        tx.state = replace(st, persistence=tuple(modes))
    word = "Enabled" if on else "Disabled"
    lines = [f"{word} persistence mode for GPU {bus_id(g.index)}." for g in targets]
    return "".join(line + "\n" for line in [*lines, "All done."]), 0


def _refusal(st: HostState, targets: list[SimGpu], held_by: set[int]) -> str | None:
    """What the reset is refused with, or None: a process on a GPU first, then another
    client (persistence mode, or the reset_refused fault)."""
    busy = [g for g in targets if g.index in held_by]
    if busy:
        lines = [f"GPU {bus_id(g.index)} is currently in use by another process." for g in busy]
        return "\n".join(lines) + "\n\n" + _CLIENTS_118.format(n=_devices(len(busy))) + "\n"
    clients = [g for g in targets if g.persistence or st.faults.reset_refused]
    if clients:
        lines = [f"  GPU {bus_id(g.index)}: In use by another client" for g in clients]
        return (
            "The following GPUs could not be reset:\n"
            + "\n".join(lines)
            + "\n\n"
            + _CLIENTS_1690.format(n=_devices(len(clients)))
            + "\n"
        )
    return None


def reset(store: StateStore, ids: set[int] | None) -> tuple[str, int]:
    st = store.read()
    gpus, procs = host_view(st, time.time())
    targets = _targets(gpus, ids)
    if (why := _unreachable(targets)) is not None or targets is None:
        return why or ("", 1)
    held_by = {p.gpu for p in procs if p.gpu is not None}
    refused = _refusal(st, targets, held_by)
    if refused is not None:
        return refused, IN_USE_EXIT
    time.sleep(st.config.gpu_reset_s)
    done = [g.index for g in targets]
    with store.transaction() as tx:
        st = tx.state
        faults = st.faults
        if st.config.stuck_gpu in done:
            faults = replace(faults, pending_remap=False, reset_required=False)
        tx.state = replace(st, faults=faults, resets=(*st.resets, *done))
    return "".join(f"GPU {bus_id(i)} was successfully reset.\n" for i in done), 0


def run(store: StateStore, ids: set[int] | None, pm: bool | None, do_reset: bool) -> int:
    out, code = reset(store, ids) if do_reset else persistence(store, ids, bool(pm))
    sys.stdout.write(out)
    return code
