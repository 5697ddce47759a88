"""The embedded asyncssh server, driven by a real asyncssh client with strict host keys."""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path

import asyncssh
import pytest

from bot.settings import load_settings
from bot.sim import packages, procfs
from bot.sim.kit import TEST_SERVICE_SETTINGS, SimKit, fast_config, fleet_fragment
from bot.sim.state import DEFAULT_VERSION, STATE_DIR_ENV
from tests.polling import eventually
from tests.support.sim import MakeSimHost

UNIT = "vllm-kimi-k25"


def wrapped(*argv: str, seconds: int = 10) -> str:
    """The command line the engine's SSH layer sends."""
    return shlex.join(("timeout", "--kill-after=10s", f"{seconds}s", *argv))


async def http_get(conn: asyncssh.SSHClientConnection, port: int, path: str) -> str:
    reader, writer = await conn.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
    writer.write_eof()
    response: bytes = await reader.read()
    return response.decode()


async def test_wrapped_command_runs_with_simulated_tools(sim_host: SimKit) -> None:
    async with await sim_host.connect() as conn:
        r = await conn.run(
            wrapped("systemctl", "show", UNIT, "-p", "LoadState,ActiveState,SubState,MainPID")
        )
        assert (r.exit_status, r.stderr) == (0, "")
        assert r.stdout == (
            "MainPID=48213\nLoadState=loaded\nActiveState=active\nSubState=running\n"
        )
        r = await conn.run(wrapped("systemctl", "stop", "nope"))
        assert (r.exit_status, r.stdout, r.stderr) == (
            5,
            "",
            "Failed to stop nope.service: Unit nope.service not loaded.\n",
        )
        # df is the real one: the kit's venv directory exists.
        r = await conn.run(wrapped("df", "-P", "-B1M", str(sim_host.venv_dir)))
        assert r.exit_status == 0 and isinstance(r.stdout, str)
        assert r.stdout.startswith("Filesystem")


async def test_output_streams_before_the_command_ends(sim_host: SimKit) -> None:
    sim_host.update_config(install_duration_s=1.0)
    async with await sim_host.connect() as conn:
        proc = await conn.create_process(
            wrapped(
                "uv",
                "pip",
                "install",
                "--python",
                str(sim_host.python),
                "--force-reinstall",
                "vllm==0.30.0",
            )
        )
        first = await proc.stderr.readline()
        # The count is the sim's own resolution of that release (its deps and vllm).
        resolved = len({**packages.deps_of("0.30.0"), packages.PACKAGE: "0.30.0"})
        assert first.startswith(f"Resolved {resolved} packages in ")
        assert sim_host.installed_version == DEFAULT_VERSION  # still installing
        assert (await proc.wait()).exit_status == 0
    assert sim_host.installed_version == "0.30.0"


async def test_remote_timeout_stops_the_install(sim_host: SimKit) -> None:
    sim_host.update_config(install_duration_s=60)
    async with await sim_host.connect() as conn:
        r = await conn.run(
            wrapped(
                "uv",
                "pip",
                "install",
                "--python",
                str(sim_host.python),
                "--force-reinstall",
                "vllm==0.30.0",
                seconds=1,
            )
        )
    assert r.exit_status == 124  # coreutils timeout's own status
    assert sim_host.installed_version == DEFAULT_VERSION


async def test_closing_the_channel_ends_the_command(sim_host: SimKit) -> None:
    async with await sim_host.connect() as conn:
        # `timeout` moves the command into a process group of its own.
        proc = await conn.create_process(wrapped("sh", "-c", "echo $$; exec sleep 60", seconds=60))
        pid = int(await proc.stdout.readline())
        assert procfs.alive(pid)
        proc.close()
        await eventually(lambda: not procfs.alive(pid), "the command ends with its channel")


async def test_exit_signal_is_reported(sim_host: SimKit) -> None:
    async with await sim_host.connect() as conn:
        r = await conn.run("kill -TERM $$")
    assert r.exit_signal is not None and r.exit_signal[0] == "TERM"


async def test_forwarding_reaches_health_on_loopback_only(sim_host: SimKit) -> None:
    async with await sim_host.connect() as conn:
        reply = await http_get(conn, sim_host.service_port, "/health")
        assert reply.startswith("HTTP/1.0 200 OK\r\n")
        assert reply.endswith("\r\n\r\n")  # empty body, as vLLM's /health
        await conn.run(wrapped("systemctl", "stop", UNIT))
        with pytest.raises(asyncssh.ChannelOpenError) as refused:
            await conn.open_connection("127.0.0.1", sim_host.service_port)
        assert refused.value.code == asyncssh.OPEN_CONNECT_FAILED
        with pytest.raises(asyncssh.ChannelOpenError) as prohibited:
            await conn.open_connection("10.1.230.174", 8000)
        assert prohibited.value.code == asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED


async def test_fleet_hosts_share_a_claimed_port(make_sim_host: MakeSimHost, tmp_path: Path) -> None:
    venv = tmp_path / "opt-venv"
    kits = [
        await make_sim_host(
            config=fast_config(hostname=f"gpu-node-{i}"),
            venv_dir=venv,
            service_port=8000,
            installed_version=version,
        )
        for i, version in enumerate(("0.30.0", "0.31.0"), start=1)
    ]
    for kit, version in zip(kits, ("0.30.0", "0.31.0"), strict=True):
        async with await kit.connect() as conn:
            reply = await http_get(conn, 8000, "/version")
        assert reply.endswith(f'{{"version": "{version}"}}')
    config = tmp_path / "chatops.toml"
    config.write_text("")
    settings = load_settings(config, **fleet_fragment(kits))
    svc = settings.services["kimi-k25"]
    assert svc.hosts == ["gpu-node-1", "gpu-node-2"]
    assert (svc.venv_dir, svc.health_url) == (str(venv), "http://127.0.0.1:8000/health")
    assert {h.port for h in settings.hosts.values()} == {k.port for k in kits}


async def test_settings_fragment_is_valid(sim_host: SimKit, tmp_path: Path) -> None:
    config = tmp_path / "chatops.toml"
    config.write_text("")
    settings = load_settings(config, **sim_host.settings_fragment())
    host = settings.hosts["gpu-node-1"]
    assert (host.port, host.known_hosts, host.key_file) == (
        sim_host.port,
        sim_host.known_hosts,
        sim_host.client_key,
    )
    svc = settings.services["kimi-k25"]
    assert (svc.unit, svc.python, svc.drain_poll_s) == (
        UNIT,
        str(sim_host.python),
        TEST_SERVICE_SETTINGS["drain_poll_s"],
    )
    assert sim_host.known_hosts.read_text().startswith(f"[127.0.0.1]:{sim_host.port} ssh-ed25519 ")


async def test_only_the_kits_key_user_and_host_key_get_in(sim_host: SimKit, tmp_path: Path) -> None:
    other = asyncssh.generate_private_key("ssh-ed25519")
    wrong_hosts = tmp_path / "wrong_known_hosts"
    wrong_hosts.write_text(
        f"[127.0.0.1]:{sim_host.port} {other.export_public_key().decode().strip()}\n"
    )
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        await sim_host.connect(known_hosts=str(wrong_hosts))
    with pytest.raises(asyncssh.PermissionDenied):
        await sim_host.connect(username="nobody")
    with pytest.raises(asyncssh.PermissionDenied):
        await sim_host.connect(client_keys=[other])


async def test_close_leaves_nothing_running(make_sim_host: MakeSimHost) -> None:
    kit = await make_sim_host(config=fast_config(install_duration_s=60))
    conn = await kit.connect()
    await conn.create_process(
        wrapped(
            "uv",
            "pip",
            "install",
            "--python",
            str(kit.python),
            "--force-reinstall",
            "vllm==0.30.0",
            seconds=60,
        )
    )
    # The channel opens before the server has spawned the command: wait until it runs,
    # or close() could find nothing to end and the test pass without checking anything.
    await eventually(
        lambda: any(
            (procfs.tool_argv(procfs.cmdline(p)) or [])[:3] == ["uv", "pip", "install"]
            for p in procfs.with_env(STATE_DIR_ENV, str(kit.state_dir))
        ),
        "the install to run on the host",
    )
    await kit.close()
    assert procfs.with_env(STATE_DIR_ENV, str(kit.state_dir)) == []
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", kit.health_port)
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", kit.port)
    conn.close()
