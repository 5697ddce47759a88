"""The asyncssh transport against real servers on loopback (embedded and OpenSSH)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import asyncssh
import pytest

from bot.errors import HostKeyError, HostUnreachableError
from bot.hosts.base import Stream
from bot.hosts.ssh import SshTransport
from bot.hosts.streams import wrap_with_timeout
from bot.settings import HostSettings
from bot.sim.kit import SimKit


def transport(kit: SimKit, **overrides: object) -> SshTransport:
    return SshTransport(kit.hostname, HostSettings(**{**kit.host_settings(), **overrides}))


def test_commands_are_quoted_argv_never_shell_strings() -> None:
    cmd = wrap_with_timeout(["printf", "%s", "a b; rm -rf / $(id) `x`"], 2.5)
    assert cmd == "timeout --kill-after=10s 3s printf %s 'a b; rm -rf / $(id) `x`'"


async def test_metacharacters_arrive_verbatim(sim_sshd_host: SimKit) -> None:
    t = transport(sim_sshd_host)
    hostile = "a b; touch /tmp/pwned $(id) `id` | & > <"
    try:
        r = await t.run(["printf", "%s", hostile], timeout_s=10)
    finally:
        await t.close()
    assert (r.exit_status, r.stdout) == (0, hostile)
    assert not Path("/tmp/pwned").exists()


async def test_lines_stream_before_the_command_ends(sim_host: SimKit) -> None:
    sim_host.update_config(install_duration_s=1.0)
    t = transport(sim_host)
    seen: list[tuple[Stream, str]] = []
    first_line = asyncio.Event()

    def on_line(stream: Stream, line: str) -> None:
        seen.append((stream, line))
        first_line.set()

    task = asyncio.create_task(
        t.run(
            [
                "uv",
                "pip",
                "install",
                "--python",
                str(sim_host.python),
                "--force-reinstall",
                "vllm==0.31.0",
            ],
            timeout_s=30,
            on_line=on_line,
        )
    )
    await asyncio.wait_for(first_line.wait(), 10)
    assert not task.done()  # the first line arrived while uv was still running
    result = await task
    await t.close()
    assert result.exit_status == 0
    assert seen[0] == ("stderr", seen[0][1]) and seen[0][1].startswith("Resolved ")
    assert ("stderr", " + vllm==0.31.0") in seen


async def test_step_timeout_kills_the_remote_process(sim_sshd_host: SimKit) -> None:
    t = transport(sim_sshd_host)
    pid_line = asyncio.Event()
    pids: list[int] = []

    def on_line(stream: Stream, line: str) -> None:
        pids.append(int(line))
        pid_line.set()

    try:
        r = await t.run(["sh", "-c", "echo $$; exec sleep 300"], timeout_s=1, on_line=on_line)
    finally:
        await t.close()
    assert r.timed_out and r.exit_status == 124 and not r.ok
    # coreutils timeout only exits after its child is gone: the remote sleep is dead.
    assert pids and not Path(f"/proc/{pids[0]}").exists()


async def test_unknown_host_key_is_refused(sim_host: SimKit, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    t = transport(sim_host, known_hosts=str(empty))
    with pytest.raises(HostKeyError) as err:
        await t.run(["true"], timeout_s=5)
    assert "ssh-keyscan" in str(err.value) and str(empty) not in str(err.value)
    assert sim_host.calls() == []


async def test_changed_host_key_is_refused(sim_host: SimKit, tmp_path: Path) -> None:
    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{sim_host.port} {other}\n")
    with pytest.raises(HostKeyError):
        await transport(sim_host, known_hosts=str(kh)).run(["true"], timeout_s=5)


async def test_nothing_listening_is_unreachable(sim_host: SimKit) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(HostUnreachableError) as err:
        await transport(sim_host, port=port).run(["true"], timeout_s=5)
    assert "cannot connect" in str(err.value)


async def test_health_through_the_ssh_connection(sim_sshd_host: SimKit) -> None:
    t = transport(sim_sshd_host)
    try:
        up = await t.http_get(sim_sshd_host.health_url, timeout_s=5)
        assert (up.status, up.ok) == (200, True)
        assert (await t.run(["systemctl", "stop", "vllm-kimi-k25"], timeout_s=10)).ok
        down = await t.http_get(sim_sshd_host.health_url, timeout_s=5)
        assert (down.status, down.error) == (None, "connection refused")
    finally:
        await t.close()


async def test_one_connection_many_channels_under_the_session_cap(sim_sshd_host: SimKit) -> None:
    # sshd allows 10 sessions per connection; 20 concurrent commands must all succeed.
    t = transport(sim_sshd_host, max_sessions=8)
    try:
        results = await asyncio.gather(*(t.run(["echo", str(i)], timeout_s=10) for i in range(20)))
    finally:
        await t.close()
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(20)]
