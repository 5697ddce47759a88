"""The same simulated host behind a real OpenSSH sshd (skipped without one, except in CI)."""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path

import asyncssh
import pytest

from bot.sim import packages, procfs
from bot.sim.kit import SimKit
from bot.sim.state import DEFAULT_VERSION, STATE_DIR_ENV

UNIT = "vllm-kimi-k25"


def wrapped(*argv: str, seconds: int = 10) -> str:
    """The command line the engine's SSH layer sends."""
    return shlex.join(("timeout", "--kill-after=10s", f"{seconds}s", *argv))


async def openssh(kit: SimKit, known_hosts: Path, command: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        "ssh",
        "-F",
        "/dev/null",
        "-i",
        str(kit.client_key),
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={known_hosts}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-p",
        str(kit.port),
        f"{kit.user}@127.0.0.1",
        command,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def wrong_known_hosts(kit: SimKit, tmp_path: Path) -> Path:
    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    path = tmp_path / "wrong_known_hosts"
    path.write_text(f"[127.0.0.1]:{kit.port} {other}\n")
    return path


async def test_commands_run_through_force_command(sim_sshd_host: SimKit) -> None:
    async with await sim_sshd_host.connect() as conn:
        r = await conn.run(
            wrapped("systemctl", "show", UNIT, "-p", "LoadState,ActiveState,SubState,MainPID")
        )
        assert (r.exit_status, r.stdout, r.stderr) == (
            0,
            "MainPID=48213\nLoadState=loaded\nActiveState=active\nSubState=running\n",
            "",
        )
        r = await conn.run(wrapped("uv", "pip", "show", "--python", "/nope/bin/python", "vllm"))
        assert r.exit_status == 2 and isinstance(r.stderr, str)
        assert r.stderr.startswith("error: Failed to inspect Python")
        r = await conn.run(wrapped("df", "-P", "-B1M", str(sim_sshd_host.venv_dir)))
        assert r.exit_status == 0
    assert [c.argv[:2] for c in sim_sshd_host.calls()] == [("systemctl", "show"), ("uv", "pip")]


async def test_output_streams_before_the_command_ends(sim_sshd_host: SimKit) -> None:
    sim_sshd_host.update_config(install_duration_s=1.0)
    async with await sim_sshd_host.connect() as conn:
        proc = await conn.create_process(
            wrapped(
                "uv",
                "pip",
                "install",
                "--python",
                str(sim_sshd_host.python),
                "--force-reinstall",
                "vllm==0.31.0",
            )
        )
        # The count is the sim's own resolution of that release (its deps and vllm).
        resolved = len({**packages.deps_of("0.31.0"), packages.PACKAGE: "0.31.0"})
        assert (await proc.stderr.readline()).startswith(f"Resolved {resolved} packages in ")
        assert sim_sshd_host.installed_version == DEFAULT_VERSION
        assert (await proc.wait()).exit_status == 0
    assert sim_sshd_host.installed_version == "0.31.0"


async def test_forwarding_to_health(sim_sshd_host: SimKit) -> None:
    async with await sim_sshd_host.connect() as conn:
        reader, writer = await conn.open_connection("127.0.0.1", sim_sshd_host.service_port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        assert (await reader.read()).startswith(b"HTTP/1.0 200 OK\r\n")
        assert (await conn.run(wrapped("systemctl", "stop", UNIT))).exit_status == 0
        with pytest.raises(asyncssh.ChannelOpenError) as refused:
            await conn.open_connection("127.0.0.1", sim_sshd_host.service_port)
        assert refused.value.code == asyncssh.OPEN_CONNECT_FAILED
        with pytest.raises(asyncssh.ChannelOpenError) as prohibited:
            await conn.open_connection("10.1.230.174", 8000)
        assert prohibited.value.code == asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED


async def test_wrong_host_key_is_refused(sim_sshd_host: SimKit, tmp_path: Path) -> None:
    wrong = wrong_known_hosts(sim_sshd_host, tmp_path)
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        await sim_sshd_host.connect(known_hosts=str(wrong))
    # OpenSSH's own client agrees with the kit's known_hosts file, and refuses the wrong one.
    assert await openssh(
        sim_sshd_host, sim_sshd_host.known_hosts, f"systemctl is-active {UNIT}"
    ) == (0, "active\n", "")
    status, _, err = await openssh(sim_sshd_host, wrong, "true")
    assert status == 255 and "Host key verification failed." in err


async def test_close_stops_sshd_and_its_sessions(sim_sshd_host: SimKit) -> None:
    sim_sshd_host.update_config(install_duration_s=60)
    conn = await sim_sshd_host.connect()
    await conn.create_process(
        wrapped(
            "uv",
            "pip",
            "install",
            "--python",
            str(sim_sshd_host.python),
            "--force-reinstall",
            "vllm",
            seconds=60,
        )
    )
    await sim_sshd_host.close()
    assert procfs.with_env(STATE_DIR_ENV, str(sim_sshd_host.state_dir)) == []
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", sim_sshd_host.port)
    conn.close()
