"""A scripted host in this process (``bot.hosts.mock``) with the settings a simulated
host would have: for engine tests that judge the bot's own decisions, where a real host
behind SSH only costs time (a refusal that must reach no host, a scripted answer)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh

from bot.engine.runtime import Runtime, open_runtime
from bot.hosts.mock import MockPool, MockTransport
from bot.settings import Settings
from bot.sim.kit import INDEXES, SERVICE, TEST_HOST_SETTINGS, TEST_SERVICE_SETTINGS
from bot.sim.state import HostConfig
from tests.support.host_keys import key_line

# The simulated host's name and unit, so assertions read the same as against one.
HOSTNAME = HostConfig().hostname
UNIT = HostConfig().unit
PORT = 2222  # never dialled: the transport is the scripted one


@dataclass(frozen=True)
class MockHost:
    """The files a host's settings name, and the scripted transport that answers."""

    hostname: str
    port: int
    user: str
    client_key: Path
    known_hosts: Path
    transport: MockTransport

    def untouched(self) -> bool:
        """Nothing, not even a read, reached the host."""
        return not self.transport.commands and not self.transport.requests


def mock_host(root: Path, transport: MockTransport | None = None) -> MockHost:
    """A host whose known_hosts trusts a fresh key (the key file is only a path the
    plan binds: nothing logs in with it)."""
    root.mkdir(parents=True, exist_ok=True)
    key = asyncssh.generate_private_key("ssh-ed25519")
    client_key = root / "client_key"
    client_key.write_bytes(key.export_private_key())
    client_key.chmod(0o600)
    known_hosts = root / "known_hosts"
    known_hosts.write_text(key_line(PORT))
    return MockHost(
        HOSTNAME, PORT, "chatops", client_key, known_hosts, transport or MockTransport(HOSTNAME)
    )


def mock_settings(
    host: MockHost, tmp_path: Path, *, host_overrides: dict[str, Any] | None = None, **service: Any
) -> Settings:
    """As ``tests.support.sim.sim_settings`` gives for a simulated host."""
    cfg = {
        "address": "127.0.0.1",
        "port": host.port,
        "user": host.user,
        "key_file": str(host.client_key),
        "known_hosts": str(host.known_hosts),
        **TEST_HOST_SETTINGS,
        **(host_overrides or {}),
    }
    svc = {
        "hosts": [host.hostname],
        "unit": UNIT,
        "python": "/opt/vllm/bin/python",
        "health_url": "http://127.0.0.1:8000/health",
        "indexes": dict(INDEXES),
        **TEST_SERVICE_SETTINGS,
        **service,
    }
    return Settings(
        hosts={host.hostname: cfg}, services={SERVICE: svc}, db_path=tmp_path / "audit.db"
    )


@asynccontextmanager
async def mock_runtime(settings: Settings, *hosts: MockHost) -> AsyncIterator[Runtime]:
    """``open_runtime`` whose host pool is the scripted hosts'."""
    async with open_runtime(settings) as rt:
        pool = MockPool(settings, {h.hostname: h.transport for h in hosts})
        rt.pool = rt.engine.pool = pool
        try:
            yield rt
        finally:
            await pool.close()
