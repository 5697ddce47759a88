"""Simulated ``dcgmi``: only ``diag -r 1``, printed in DCGM 3's table layout
(tests/samples/deep/dcgmi_diag_r1_persistence_fail.txt).

Without the ``dcgmi_present`` (or ``dcgmi_fails``) fault the host has no DCGM: the
command is not found, as a shell says it, exit 127. With ``dcgmi_fails`` the Deployment
test ``Persistence Mode`` fails with DCGM's message, and dcgmi exits 226
(DCGM_ST_NVVS_ERROR's -30 as an exit status byte).
"""

from __future__ import annotations

import sys

from bot.sim.state import StateStore

NOT_FOUND_EXIT = 127
FAILED_EXIT = 226
_TESTS = (
    "Denylist",
    "NVML Library",
    "CUDA Main Library",
    "Permissions and OS Blocks",
    "Persistence Mode",
    "Environment Variables",
    "Page Retirement/Row Remap",
    "Graphics Processes",
    "Inforom",
)
_RULE = "+---------------------------+------------------------------------------------+"


def _row(name: str, value: str) -> str:
    return f"| {name:<25} | {value:<46} |"


def report(fails: bool) -> str:
    out = [
        "Successfully ran diagnostic for group.",
        _RULE,
        _row("Diagnostic", "Result"),
        "+===========================+================================================+",
        "|-----  Metadata  ----------+------------------------------------------------|",
        _row("DCGM Version", "3.3.8"),
        "|-----  Deployment  --------+------------------------------------------------|",
    ]
    for name in _TESTS:
        failed = fails and name == "Persistence Mode"
        out.append(_row(name, "Fail" if failed else "Pass"))
        if failed:
            out.append(_row("Error", "Persistence mode for GPU 0 is currently disab"))
            out.append(_row("", 'led. Enable persistence mode by running "nvid'))
            out.append(_row("", 'ia-smi -i <gpuId> -pm 1 " as root.'))
    out.append(_RULE)
    return "\n".join(out) + "\n"


def main(store: StateStore, args: list[str]) -> int:
    f = store.read().faults
    if not (f.dcgmi_present or f.dcgmi_fails):
        print("sh: 1: dcgmi: not found", file=sys.stderr)
        return NOT_FOUND_EXIT
    if args[:3] != ["diag", "-r", "1"]:
        print("dcgmi: only `diag -r 1` is simulated", file=sys.stderr)
        return 2
    sys.stdout.write(report(f.dcgmi_fails))
    return FAILED_EXIT if f.dcgmi_fails else 0
