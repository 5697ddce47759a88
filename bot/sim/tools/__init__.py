"""The simulated host tools, one module each; ``bot/sim/bin`` runs them by name.

Every invocation is appended to the host's call log first, so a test can check
the order of the commands the engine ran.
"""

from __future__ import annotations

import importlib
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
}
# Tools that are no command on PATH: the venv's interpreter (SimKit writes
# <venv>/bin/python to run it).
VENV_TOOLS = {"python": "python", "venv-python": "venv_python", "venv-vllm": "venv_vllm"}


def main(argv: list[str]) -> int:
    modules = {**TOOLS, **VENV_TOOLS}
    if not argv or argv[0] not in modules:
        print(f"usage: python -m bot.sim.tools {{{','.join(TOOLS)}}} [ARGS...]", file=sys.stderr)
        return 2
    tool, args = argv[0], argv[1:]
    try:
        store = StateStore.from_env()
    except RuntimeError as e:
        print(f"{tool}: {e}", file=sys.stderr)
        return 127
    store.log_call(tool, argv)
    module = importlib.import_module(f"bot.sim.tools.{modules[tool]}")
    run: Callable[[StateStore, list[str]], int] = module.main
    return run(store, args)
