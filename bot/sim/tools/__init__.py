"""The simulated host tools, one module each; ``bot/sim/bin`` runs them by name.

Every invocation is appended to the host's call log first, so a test can check
the order of the commands the engine ran.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

from bot.sim.state import StateStore

# tool name -> module; imported lazily so each short-lived tool loads only its own code.
TOOLS = {
    "systemctl": "systemctl",
    "nvidia-smi": "nvidia_smi",
    "uv": "uv",
    "journalctl": "journalctl",
    "pgrep": "pgrep",
    "ps": "ps",
    "kill": "kill",
    "dcgmi": "dcgmi",
    # Only `cat /proc/sys/kernel/random/boot_id` is the simulator's; anything else runs
    # the real /bin/cat (bot/sim/bin/cat execs it without coming here).
    "cat": "cat",
}
# Tools that are no command on PATH: the venv's interpreter (SimKit writes
# <venv>/bin/python to run it).
VENV_TOOLS = {"python": "python", "venv-python": "venv_python", "venv-vllm": "venv_vllm"}
# Where a reboot leaves its mark (bot.sim.power.MARKER), and the check the sshd wrapper
# runs while it is there (bot.sim.power.GATE_TOOL): not a command, never logged.
_REBOOTING = "rebooting"
_GATE = "sim-boot-gate"
_BOOT_ID = "/proc/sys/kernel/random/boot_id"
# A fresh host's first boot (``SimKit.start``), run as a tool so that, through the fork
# server, its model server is a fork of this loaded interpreter as a ``systemctl
# start``'s is (``bot.sim.vllm_server.spawn``): a new interpreter for it was most of a
# kit's start. Not a command either, never logged.
BOOT = "sim-first-boot"


def main(argv: list[str]) -> int:
    modules = {**TOOLS, **VENV_TOOLS}
    if argv[:1] == [_GATE]:
        return _gate()
    if argv[:1] == [BOOT]:
        from bot.sim.tools import unit

        unit.boot(StateStore.from_env())
        return 0
    if not argv or argv[0] not in modules:
        print(f"usage: python -m bot.sim.tools {{{','.join(TOOLS)}}} [ARGS...]", file=sys.stderr)
        return 2
    tool, args = argv[0], argv[1:]
    try:
        store = StateStore.from_env()
    except RuntimeError as e:
        print(f"{tool}: {e}", file=sys.stderr)
        return 127
    if tool != "cat" or args == [_BOOT_ID]:  # any other cat is the real one's, unlogged
        store.log_call(tool, argv)
    if os.path.exists(store.directory / _REBOOTING):
        from bot.sim import power  # a rebooted host comes up at the first look after

        power.settle(store)
    module = importlib.import_module(f"bot.sim.tools.{modules[tool]}")
    run: Callable[[StateStore, list[str]], int] = module.main
    return run(store, args)


def _gate() -> int:
    try:
        store = StateStore.from_env()
    except RuntimeError:
        return 0
    from bot.sim import power

    return power.gate_main(store)
