"""The fork server behind the simulated tools: a call through it is indistinguishable from
the tool run by its own interpreter (output, stdin, exit status, signals), and no tool
outlives the process that stands for it."""

from __future__ import annotations

import asyncio
import signal

from bot.sim import forkserver, procfs
from bot.sim.forkclient import SOCKET_ENV
from bot.sim.kit import SimKit
from bot.sim.state import DEFAULT_VERSION
from tests.polling import eventually


async def ran(kit: SimKit, *argv: str, fork: bool, stdin: bytes = b"") -> tuple[int, bytes, bytes]:
    env = kit.env()
    if not fork:
        del env[SOCKET_ENV]  # the client runs the tool in its own process
    proc = await asyncio.create_subprocess_exec(
        *argv,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate(stdin)
    assert proc.returncode is not None
    return proc.returncode, out, err


def untimed(result: tuple[int, bytes, bytes]) -> tuple[int, bytes, bytes]:
    """Without nvidia-smi -q's Timestamp line: the two calls may fall in different seconds."""
    status, out, err = result
    return (
        status,
        b"\n".join(ln for ln in out.split(b"\n") if not ln.startswith(b"Timestamp ")),
        err,
    )


def server_children() -> list[int]:
    pid = forkserver.server_pid()
    assert pid is not None, "no fork server in this process"
    return procfs.descendants(pid)


async def test_calls_through_the_server_match_the_tool_run_by_itself(sim_host: SimKit) -> None:
    nvidia_q = ("nvidia-smi", "-q", "-i", "3")
    usage = ("systemctl", "frobnicate")  # exit 1 and a message on stderr
    # The venv's interpreter (a tool too) reading its stdin.
    echo = (
        str(sim_host.python),
        "-c",
        "import sys, vllm; print(vllm.__version__, sys.stdin.read().upper())",
    )
    for argv, stdin in ((nvidia_q, b""), (usage, b""), (echo, b"from stdin")):
        forked = await ran(sim_host, *argv, fork=True, stdin=stdin)
        alone = await ran(sim_host, *argv, fork=False, stdin=stdin)
        assert untimed(forked) == untimed(alone), argv
    assert (await ran(sim_host, *usage, fork=True))[0] != 0
    _, out, _ = await ran(sim_host, *echo, fork=True, stdin=b"x")
    assert out == f"{DEFAULT_VERSION} X\n".encode()
    # Each call was logged by the tool, whichever way it ran.
    assert sum(c.argv[:2] == ("nvidia-smi", "-q") for c in sim_host.calls()) == 2


async def stalled_install(kit: SimKit) -> asyncio.subprocess.Process:
    kit.set_faults(uv_stalls=True)
    proc = await asyncio.create_subprocess_exec(
        "uv",
        "pip",
        "install",
        "--python",
        str(kit.python),
        "--force-reinstall",
        "vllm==0.31.0",
        env=kit.env(),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    assert (await proc.stderr.readline()).startswith(b"Resolved ")  # the tool runs, stalled
    return proc


async def test_a_signal_to_the_client_ends_the_tool_the_same_way(sim_host: SimKit) -> None:
    proc = await stalled_install(sim_host)
    assert server_children(), "the stalled install runs as the server's child"
    proc.send_signal(signal.SIGTERM)
    assert await proc.wait() == -signal.SIGTERM  # as a tool killed by SIGTERM ends
    await eventually(lambda: server_children() == [], "the tool ended with its client")
    assert sim_host.installed_version != "0.31.0"  # the venv untouched, as uv's would be


async def test_a_client_killed_outright_takes_its_tool_with_it(sim_host: SimKit) -> None:
    proc = await stalled_install(sim_host)
    proc.kill()  # SIGKILL cannot be forwarded: the server sees the connection close
    assert await proc.wait() == -signal.SIGKILL
    # The next call is served at once, whether or not that child was reaped yet.
    assert (await ran(sim_host, "systemctl", "is-active", "vllm-kimi-k25", fork=True))[:2] == (
        0,
        b"active\n",
    )
    await eventually(lambda: server_children() == [], "the tool ended with its client")


async def test_pgrep_lists_the_client_as_the_tool_and_leaves_itself_out(sim_host: SimKit) -> None:
    proc = await stalled_install(sim_host)
    try:
        status, out, _ = await ran(
            sim_host, "pgrep", "-a", "-f", "^(uv pip install|pgrep) ", fork=True
        )
        assert status == 0
        assert out.decode().splitlines() == [
            f"{proc.pid} uv pip install --python {sim_host.python} --force-reinstall vllm==0.31.0"
        ]
    finally:
        proc.kill()
        await proc.wait()
