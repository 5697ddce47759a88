"""A faulty network link: a TCP proxy in front of a simulated host's SSH server.

Connection faults are faults of the path, not of the host, so they are made
here and work the same in front of the embedded server and a real sshd:

* ``drop()``       every open connection is cut at once (both sides see it closed);
                   new connections go through again.
* ``blackhole()``  bytes are swallowed in both directions on open and new
                   connections, whose sockets stay open: the peer hears nothing,
                   as after a pulled cable.  Only SSH keepalives can notice.
* ``refuse()``     new connections are closed as soon as they are accepted and
                   open ones are cut: the host is unreachable.
* ``heal()``       back to forwarding; connections that lost bytes in a black
                   hole are cut, since their streams can never be in sync again.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Literal

Mode = Literal["pass", "blackhole", "refuse"]
CHUNK = 65536


class _Pair:
    """One client connection and its connection to the server."""

    def __init__(self, client: asyncio.StreamWriter, server: asyncio.StreamWriter) -> None:
        self.client = client
        self.server = server
        self.lost_bytes = False

    def abort(self) -> None:
        for writer in (self.client, self.server):
            writer.transport.abort()


class FaultyLink:
    """Start with ``await FaultyLink.start(target_port)``; stop with ``await close()``."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.mode: Mode = "pass"
        self.port = 0
        self.accepted = 0  # connections accepted so far, whatever happened to them
        self._server: asyncio.Server | None = None
        self._pairs: set[_Pair] = set()

    @classmethod
    async def start(cls, target_port: int) -> FaultyLink:
        link = cls(target_port)
        link._server = await asyncio.start_server(link._accept, "127.0.0.1", 0)
        link.port = link._server.sockets[0].getsockname()[1]
        return link

    # --- faults ------------------------------------------------------------------------

    def drop(self) -> None:
        for pair in list(self._pairs):
            pair.abort()

    def blackhole(self) -> None:
        self.mode = "blackhole"

    def refuse(self) -> None:
        self.mode = "refuse"
        self.drop()

    def heal(self) -> None:
        self.mode = "pass"
        for pair in list(self._pairs):
            if pair.lost_bytes:
                pair.abort()

    @property
    def open_connections(self) -> int:
        return len(self._pairs)

    # --- forwarding ----------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.mode == "refuse":
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        pair = _Pair(writer, up_writer)
        self._pairs.add(pair)
        try:
            await asyncio.gather(
                self._pump(reader, up_writer, pair), self._pump(up_reader, writer, pair)
            )
        finally:
            self._pairs.discard(pair)
            pair.abort()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pair: _Pair
    ) -> None:
        try:
            while chunk := await reader.read(CHUNK):
                if self.mode != "pass":
                    pair.lost_bytes = True
                    continue
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        # One side ended: the other must see it too, as with a real TCP path.
        pair.abort()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self.drop()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
