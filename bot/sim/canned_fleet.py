"""Canned GPU answers for fleet tests and benchmarks: what a healthy 8-GPU vLLM host's
``nvidia-smi`` (the two CSV queries and ``-q``) and ``journalctl -k`` print, as fixed
text, so 1,000 hosts cost no process per command. ``critical``: GPU 3 has a row remap
pending (a critical GPU). Answers by the argv's tool and first option; anything else is
"command not found", as a shell says it.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from bot.sim.state import SimGpu
from bot.sim.tools import nvidia_smi_q

GPUS = 8
NOT_FOUND = 127


def _uuid(i: int) -> str:
    return f"GPU-6f3c0d2a-{i:04d}-4b8e-9d1c-5a7e2f0b{i:04d}"


GPU_CSV = "".join(f"{i}, {_uuid(i)}, NVIDIA H200, 97000, 143771, 87\n" for i in range(GPUS))
APPS_CSV = "".join(f"{48221 + i}, VLLM::Worker_TP{i}, 96998 MiB, {_uuid(i)}\n" for i in range(GPUS))


@cache
def smi_q(critical: bool = False) -> str:
    gpus = [
        SimGpu(i, _uuid(i), "NVIDIA H200", 97000, 143771, 87, remap_pending=critical and i == 3)
        for i in range(GPUS)
    ]
    return nvidia_smi_q.render(gpus, GPUS)


def answer(argv: Sequence[str], *, critical: bool = False) -> tuple[str, str, int]:
    """``(stdout, stderr, exit status)`` for one command of the bot's GPU read."""
    tool, first = (argv[0] if argv else ""), (argv[1] if len(argv) > 1 else "")
    if tool == "nvidia-smi" and first.startswith("--query-gpu="):
        return GPU_CSV, "", 0
    if tool == "nvidia-smi" and first.startswith("--query-compute-apps="):
        return APPS_CSV, "", 0
    if tool == "nvidia-smi" and first == "-q":
        return smi_q(critical), "", 0
    if tool == "journalctl" and "-k" in argv:
        return "-- No entries --\n", "", 0
    return "", f"{tool}: command not found\n", NOT_FOUND
