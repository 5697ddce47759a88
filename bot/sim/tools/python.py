"""The simulated venv's interpreter (``<venv>/bin/python``): a real Python that imports
simulated ``vllm`` and ``torch`` packages reflecting the host's environment.

Each call lays out ``vllm/__init__.py`` (``__version__``) and ``torch`` (``__version__``,
``torch.version.cuda`` of its wheel) in a directory of its own, then runs the real
interpreter on the given arguments with only that directory on its path. A package
that is not installed is absent (``ModuleNotFoundError``), and with the import_error fault
``import vllm`` raises the ImportError a vllm built against another torch raises.
``vllm.__version__`` is what vLLM's own ``_version.py`` says: no ``+cu129`` build label
(``packages.module_version``). The venv's ``.pth`` files run first, as at a real
interpreter's start (``bot.sim.pth``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bot.sim import packages, pth
from bot.sim.state import HostState, StateStore


def _lay_out(site: Path, st: HostState, env: dict[str, str] | None = None) -> None:
    """The packages of ``env`` (default: the host's venv; else a throwaway venv's) as
    importable modules."""
    throwaway = env is not None
    env = packages.environment(st) if env is None else env
    problem = packages.import_problem(st, env, throwaway=throwaway)
    if packages.PACKAGE in env:
        (site / "vllm").mkdir()
        body = (
            f"raise ImportError({problem.split(': ', 1)[1]!r})\n"
            if problem is not None and problem.startswith("ImportError")
            else f"__version__ = {packages.module_version(env[packages.PACKAGE])!r}\n"
        )
        (site / "vllm" / "__init__.py").write_text(body)
    if "torch" in env:
        (site / "torch").mkdir()
        (site / "torch" / "__init__.py").write_text(
            f"__version__ = {env['torch']!r}\nfrom torch import version\n"
        )
        cuda = packages.TORCH_CUDA.get(env["torch"])
        (site / "torch" / "version.py").write_text(f"cuda = {cuda!r}\n")


def main(store: StateStore, args: list[str]) -> int:
    st = store.read()
    pth.run_pth(st.venv)  # what the real interpreter's start-up does (bot.sim.pth)
    return run_over(store, st, None, args)


def run_over(store: StateStore, st: HostState, env: dict[str, str] | None, args: list[str]) -> int:
    """The real interpreter on ``args`` with ``env``'s packages (default: the host's)."""
    site = Path(tempfile.mkdtemp(prefix="site-", dir=store.directory))
    try:
        _lay_out(site, st, env)
        # -S: no site-packages of the test's own interpreter; -I would drop PYTHONPATH.
        return subprocess.run(
            [sys.executable, "-S", *args],
            env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
            check=False,
        ).returncode
    finally:
        shutil.rmtree(site, ignore_errors=True)
