"""The command line as an operator runs it: a TOML config file and ``python -m bot`` in a
subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent.parent


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return json.dumps(str(v))


def write_toml(path: Path, data: dict[str, Any]) -> Path:
    """``{"hosts": {...}, "services": {...}}`` as the config file ``load_settings`` reads."""
    lines: list[str] = []

    def table(prefix: str, d: dict[str, Any]) -> None:
        scalars = {k: v for k, v in d.items() if not isinstance(v, dict)}
        lines.append(f"[{prefix}]")
        lines.extend(f"{k} = {toml_value(v)}" for k, v in scalars.items())
        for k, v in d.items():
            if isinstance(v, dict):
                table(f"{prefix}.{k}", v)

    for section, body in data.items():
        for name, values in body.items():
            table(f"{section}.{name}", values)
    path.write_text("\n".join(lines) + "\n")
    return path


async def cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """``python -m bot *args``: its exit code, stdout and stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", *args, cwd=cwd, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})})
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def cli_on_terminal(*args: str, answer: str, cwd: Path,
                          env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """``python -m bot *args`` with a terminal (a pty) as its stdin, on which ``answer``
    was typed: what an operator at a prompt sees (stdout and stderr stay pipes)."""
    master, slave = pty.openpty()
    try:
        os.write(master, answer.encode())  # kept by the terminal until the prompt reads it
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot", *args, cwd=cwd, stdin=slave,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})})
        out, err = await proc.communicate()
    finally:
        os.close(slave)
        os.close(master)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()
