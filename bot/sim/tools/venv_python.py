"""The interpreter of a throwaway venv ``uv venv`` made (the bot's prefetch):
``venv-python VENV ARGS...``. It imports what was installed into that venv (the set
bot.sim.tools.uv recorded there), not the host's venv, so the gate the prefetch runs
with it sees the new build: its vllm, its torch and torch's CUDA build."""

from __future__ import annotations

import sys
from pathlib import Path

from bot.sim.state import StateStore
from bot.sim.tools.python import run_over
from bot.sim.tools.uv import throwaway_set


def main(store: StateStore, args: list[str]) -> int:
    if not args:
        print("venv-python: no venv named", file=sys.stderr)
        return 2
    venv, rest = Path(args[0]), args[1:]
    # Nothing installed into it yet: it imports nothing.
    return run_over(store, store.read(), throwaway_set(venv), rest)
