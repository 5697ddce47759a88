"""Socket Mode at its websocket boundary, for the real `slack_sdk` aiohttp SocketModeClient.

What the installed client relies on (slack_sdk/socket_mode/aiohttp, async_client.py):
- it gets the websocket URL from `apps.connections.open` (served by `FakeSlack`) and
  connects with `autoping=False` plus an aiohttp heartbeat, so the server must answer pings
  (aiohttp's server does that with `autoping=True`);
- it does not wait for `hello`, but Slack sends one first, so the fake does too;
- every TEXT frame is parsed as an envelope; `{"type": "disconnect"}` makes it reconnect by
  calling `apps.connections.open` again;
- acks come back as `{"envelope_id": ..., "payload"?: {...}}` text frames.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

LINK_PATH = "/link/"


class ChangeSignal:
    """Lets tests wait on a condition over fake state without sleeping.

    Every state change calls `notify()`; waiters re-check their predicate after each one.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait_for(
        self, predicate: Callable[[], bool], *, timeout: float = 5.0, what: str = "condition"
    ) -> None:
        try:
            async with asyncio.timeout(timeout):
                while True:
                    # Taken before the check so a notify() between check and wait is not lost.
                    event = self._event
                    if predicate():
                        return
                    await event.wait()
        except TimeoutError:
            raise TimeoutError(
                f"fake Slack: timed out after {timeout}s waiting for {what}"
            ) from None


@dataclass
class SocketConnection:
    """One app connection to the fake Socket Mode endpoint."""

    ws: web.WebSocketResponse
    ticket: str
    received: list[dict[str, Any]] = field(default_factory=list)

    @property
    def open(self) -> bool:
        return not self.ws.closed


class FakeSocketMode:
    """The websocket half of Socket Mode; mounted on the FakeSlack server at `LINK_PATH`."""

    def __init__(self, *, app_id: str, signal: ChangeSignal) -> None:
        self.app_id = app_id
        self._signal = signal
        self._tickets: set[str] = set()
        self._envelope_ids = itertools.count(1)
        self.connections: list[SocketConnection] = []
        # Every frame received from any app, in order (acks and anything else).
        self.received: list[dict[str, Any]] = []
        self.acks: dict[str, dict[str, Any]] = {}
        self.hello_count = 0

    def issue_url(self, ws_base: str) -> str:
        """A fresh connection URL, as `apps.connections.open` returns it."""
        ticket = uuid.uuid4().hex
        self._tickets.add(ticket)
        return f"{ws_base}{LINK_PATH}?ticket={ticket}&app_id={self.app_id}"

    @property
    def open_connections(self) -> list[SocketConnection]:
        return [c for c in self.connections if c.open]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        ticket = request.query.get("ticket", "")
        # Tickets stay valid after use: slack_sdk's connect() retries with the same URL.
        if ticket not in self._tickets:
            return web.Response(status=401, text="invalid ticket")
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        conn = SocketConnection(ws=ws, ticket=ticket)
        self.connections.append(conn)
        await ws.send_json(
            {
                "type": "hello",
                "num_connections": len(self.open_connections),
                "debug_info": {
                    "host": "applink-fake",
                    "build_number": 1,
                    "approximate_connection_time": 18060,
                },
                "connection_info": {"app_id": self.app_id},
            }
        )
        self.hello_count += 1
        self._signal.notify()
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                data = json.loads(msg.data)
                conn.received.append(data)
                self.received.append(data)
                envelope_id = data.get("envelope_id")
                if isinstance(envelope_id, str):
                    self.acks[envelope_id] = data
                self._signal.notify()
        finally:
            self._signal.notify()
        return ws

    async def wait_connected(self, *, count: int = 1, timeout: float = 5.0) -> SocketConnection:
        """Wait until at least `count` connections have been made; returns the newest open one."""
        await self._signal.wait_for(
            lambda: len(self.connections) >= count and bool(self.open_connections),
            timeout=timeout,
            what=f"{count} socket mode connection(s)",
        )
        return self.open_connections[-1]

    async def push(
        self,
        type_: str,
        payload: Mapping[str, Any],
        *,
        accepts_response_payload: bool | None = None,
        envelope_id: str | None = None,
        connection: int = -1,
    ) -> str:
        """Send an envelope to the newest open connection (or the ``connection``-th open
        one: with several apps connected, Slack picks one per event); returns its
        envelope_id."""
        conns = self.open_connections
        if not conns:
            raise RuntimeError("fake Slack: no open Socket Mode connection")
        eid = envelope_id or f"env-{next(self._envelope_ids)}-{uuid.uuid4().hex[:8]}"
        if accepts_response_payload is None:
            # Slack lets slash commands answer through the ack; block_actions cannot.
            accepts_response_payload = type_ == "slash_commands"
        envelope = {
            "envelope_id": eid,
            "type": type_,
            "payload": dict(payload),
            "accepts_response_payload": accepts_response_payload,
        }
        await conns[connection].ws.send_json(envelope)
        return eid

    async def wait_ack(self, envelope_id: str, *, timeout: float = 5.0) -> dict[str, Any]:
        await self._signal.wait_for(
            lambda: envelope_id in self.acks, timeout=timeout, what=f"ack of {envelope_id}"
        )
        return self.acks[envelope_id]

    async def request(
        self,
        type_: str,
        payload: Mapping[str, Any],
        *,
        timeout: float = 5.0,
        connection: int = -1,
    ) -> dict[str, Any]:
        """Push an envelope and wait for the app's ack frame."""
        eid = await self.push(type_, payload, connection=connection)
        return await self.wait_ack(eid, timeout=timeout)

    async def slash_command(
        self, payload: Mapping[str, str], *, timeout: float = 5.0, connection: int = -1
    ) -> dict[str, Any]:
        return await self.request("slash_commands", payload, timeout=timeout, connection=connection)

    async def interactive(
        self, payload: Mapping[str, Any], *, timeout: float = 5.0, connection: int = -1
    ) -> dict[str, Any]:
        return await self.request("interactive", payload, timeout=timeout, connection=connection)

    async def send_disconnect(self, reason: str = "refresh_requested") -> None:
        """What Slack sends before rotating a connection; the client reconnects."""
        for conn in self.open_connections:
            await conn.ws.send_json(
                {"type": "disconnect", "reason": reason, "debug_info": {"host": "applink-fake"}}
            )

    async def close_all(self) -> None:
        for conn in self.open_connections:
            await conn.ws.close()
