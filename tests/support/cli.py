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

from tests.support.cli_zygote import enabled as zygote_enabled
from tests.support.cli_zygote import zygote_start, zygote_wait

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


def _forkable(env: dict[str, str] | None) -> bool:
    """A fork has passed the interpreter's start: a run whose environment sets how an
    interpreter starts (``PYTHONPROFILEIMPORTTIME``, ...) gets a real one."""
    return zygote_enabled() and not any(
        k.startswith("PYTHON") and k != "PYTHONPATH" for k in env or {}
    )


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


async def _forked(
    args: tuple[str, ...], *, cwd: Path, env: dict[str, str] | None, stdin: int
) -> tuple[int, str, str]:
    """``python -m bot *args`` as a fork of an interpreter that has imported the bot
    (tests.support.cli_zygote): the same process but for 0.8 s of imports."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        try:
            conn = zygote_start(
                list(args),
                env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})},
                cwd=cwd,
                stdin=stdin,
                stdout=out_w,
                stderr=err_w,
            )
        finally:
            os.close(out_w)
            os.close(err_w)
        out, err, code = await asyncio.gather(
            asyncio.to_thread(_read_all, out_r),
            asyncio.to_thread(_read_all, err_r),
            zygote_wait(conn),
        )
    finally:
        os.close(out_r)
        os.close(err_r)
    return code, out.decode(), err.decode()


async def cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """``python -m bot *args``: its exit code, stdout and stderr."""
    if _forkable(env):
        with open(os.devnull, "rb") as devnull:
            return await _forked(args, cwd=cwd, env=env, stdin=devnull.fileno())
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot",
        *args,
        cwd=cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})},
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def cli_on_terminal(
    *args: str, answer: str, cwd: Path, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """``python -m bot *args`` with a terminal (a pty) as its stdin, on which ``answer``
    was typed: what an operator at a prompt sees (stdout and stderr stay pipes)."""
    master, slave = pty.openpty()
    try:
        os.write(master, answer.encode())  # kept by the terminal until the prompt reads it
        if _forkable(env):
            return await _forked(args, cwd=cwd, env=env, stdin=slave)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bot",
            *args,
            cwd=cwd,
            stdin=slave,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})},
        )
        out, err = await proc.communicate()
    finally:
        os.close(slave)
        os.close(master)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()
