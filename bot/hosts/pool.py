"""One transport per configured host, created lazily and reused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from bot.errors import HostError
from bot.hosts.base import HostTransport
from bot.hosts.local import LocalTransport
from bot.hosts.nvml import LocalGpuHealth
from bot.hosts.ssh import SshTransport
from bot.settings import Settings


class HostPool:
    """One transport per configured host, created lazily and reused."""

    def __init__(self, settings: Settings, *, nvml: Any = None) -> None:
        self._settings = settings
        self._transports: dict[str, HostTransport] = {}
        # The NVML module a host the bot runs on reads its GPUs' health with (None: the
        # real pynvml; tests pass a fake at the library boundary).
        self._nvml = nvml

    def get(self, name: str) -> HostTransport:
        t = self._transports.get(name)
        if t is None:
            t = self._open(name)
            self._transports[name] = t
        return t

    def _open(self, name: str) -> HostTransport:
        """A new transport to ``name`` (connecting lazily, on its first command)."""
        if name not in self._settings.hosts:
            raise HostError(name, "not a configured host")
        cfg = self._settings.hosts[name]
        return LocalTransport(name) if cfg.is_local else SshTransport(name, cfg)

    @asynccontextmanager
    async def reading(self, name: str, *, keep: bool) -> AsyncIterator[HostTransport]:
        """The transport for one read of ``name``. ``keep``: pool it (a repeat query is
        warm). Otherwise (a query of more hosts than ``[fleet].max_connections``) a
        transport the pool already holds is used and left open, since a run may be
        using it; else one is opened for this read alone and closed after it, so a
        1,000-host query leaves no 1,000 idle connections behind."""
        pooled = self._transports.get(name)
        if keep or pooled is not None:
            yield self.get(name)
            return
        t = self._open(name)
        try:
            yield t
        finally:
            await t.close()

    @property
    def nvml(self) -> Any:
        """The NVML module for the bot's own GPUs (None: the real ``pynvml``)."""
        return self._nvml

    def gpu_health(self, name: str) -> LocalGpuHealth | None:
        """NVML's health reads where the bot runs on ``name`` (``address = "local"``);
        None for a remote host, whose GPU check runs ``nvidia-smi -q`` over SSH."""
        cfg = self._settings.hosts.get(name)
        return LocalGpuHealth(self._nvml) if cfg is not None and cfg.is_local else None

    async def close(self) -> None:
        transports, self._transports = list(self._transports.values()), {}
        await asyncio.gather(*(t.close() for t in transports), return_exceptions=True)
