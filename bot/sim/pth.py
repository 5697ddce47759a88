"""What a real interpreter does with its venv's ``.pth`` files when it starts (``site``):
each line that starts with ``import`` runs, as whoever started the interpreter.

The simulated venv's interpreter (``bot.sim.tools.python``) does it, and so does the
simulated uv wherever real uv starts the interpreter to learn about it (``--python``
of ``pip freeze``, ``show``, ``install``, ``sync`` and ``venv``: real uv caches what it
learns per interpreter, so it starts it on a cache miss; the simulator always does, the
worst case). Nothing happens while no ``.pth`` file is there: the host's venv has none
unless a test plants one.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# site.addsitedir processes the directory's .pth files exactly as start-up does.
_ADD_SITE = "import site, sys; site.addsitedir(sys.argv[1])"


def site_dirs(venv: str) -> list[Path]:
    """The venv's site-packages (``lib/python3.X/site-packages``)."""
    return sorted(Path(venv).glob("lib/python3*/site-packages"))


def run_pth(venv: str) -> None:
    """Run the venv's ``.pth`` files' import lines, as this process's account."""
    for site in site_dirs(venv):
        if any(site.glob("*.pth")):
            subprocess.run(
                [sys.executable, "-S", "-c", _ADD_SITE, str(site)],
                check=False,
                env={"PATH": "/usr/bin:/bin"},
                stdin=subprocess.DEVNULL,
            )
