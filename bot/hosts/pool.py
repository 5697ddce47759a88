"""One transport per configured host, created lazily and reused."""

from __future__ import annotations

import asyncio

from bot.errors import HostError
from bot.hosts.base import HostTransport
from bot.hosts.local import LocalTransport
from bot.hosts.ssh import SshTransport
from bot.settings import Settings


class HostPool:
    """One transport per configured host, created lazily and reused."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._transports: dict[str, SshTransport | LocalTransport] = {}

    def get(self, name: str) -> HostTransport:
        t = self._transports.get(name)
        if t is None:
            if name not in self._settings.hosts:
                raise HostError(name, "not a configured host")
            cfg = self._settings.hosts[name]
            t = LocalTransport(name) if cfg.is_local else SshTransport(name, cfg)
            self._transports[name] = t
        return t

    async def close(self) -> None:
        transports, self._transports = list(self._transports.values()), {}
        await asyncio.gather(*(t.close() for t in transports), return_exceptions=True)
