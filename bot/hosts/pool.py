"""One transport per configured host, created lazily and reused."""

from __future__ import annotations

import asyncio
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
        self._transports: dict[str, SshTransport | LocalTransport] = {}
        # The NVML module a host the bot runs on reads its GPUs' health with (None: the
        # real pynvml; tests pass a fake at the library boundary).
        self._nvml = nvml

    def get(self, name: str) -> HostTransport:
        t = self._transports.get(name)
        if t is None:
            if name not in self._settings.hosts:
                raise HostError(name, "not a configured host")
            cfg = self._settings.hosts[name]
            t = LocalTransport(name) if cfg.is_local else SshTransport(name, cfg)
            self._transports[name] = t
        return t

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
