"""Engine overhead: a redeploy through the engine vs the same remote commands back to back.

    ./dev python bench/redeploy_overhead.py [--runs 10]

Both sides run against the same simulated host with host delays set to zero (memory
released at once, model "loads" instantly), so the difference is what the engine adds: the
state machine, events, the audit writes (SQLite, synchronous=FULL) and output streaming.

The baseline replays exactly what the engine sent, recorded at the transport seam
(``HostTransport``): every argv with its stdin and timeout, every HTTP request with its
method, URL and body, in order, over one SSH connection opened inside its timer, as the
engine's is. Until 2026-12-03 the baseline replayed the simulated
host's call log instead; that log records simulated tools only, so the import gate's real
interpreter, `df`, the snapshot save, the index-URL wrapper and the prefetch's script
(70-80 ms of remote work a redeploy really does) were missing from the baseline and counted
as "engine overhead". HTTP requests the engine made while the server was still binding
(refused) are not replayed as such: the replay polls the same way the engine's gate does.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import platform
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import asyncssh

from bot.cli.terminal import TerminalSink
from bot.core.results import CommandResult, HttpResult, LineCallback
from bot.core.status import Action, Source
from bot.engine.runtime import open_runtime
from bot.hosts.base import HostTransport
from bot.hosts.streams import wrap_with_timeout
from bot.settings import Settings
from bot.sim.kit import SERVICE, TEST_SERVICE_SETTINGS, SimKit, fast_config

ZERO_DELAYS = {
    "release_delay_s": 0.0,
    "load_delay_s": 0.0,
    "stop_delay_s": 0.0,
    "install_duration_s": 0.0,
    "fail_delay_s": 0.0,
}


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    timeout_s: float
    stdin: bytes | None


@dataclass(frozen=True)
class Request:
    method: str
    url: str
    body: bytes | None
    content_type: str | None
    answered: bool


Sent = Command | Request


class Recorder:
    """A ``HostTransport`` that passes every call on and keeps what was sent."""

    def __init__(self, inner: HostTransport, sent: list[Sent]) -> None:
        self._inner = inner
        self._sent = sent

    @property
    def host(self) -> str:
        return self._inner.host

    async def run(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float,
        on_line: LineCallback | None = None,
        stdin: bytes | None = None,
    ) -> CommandResult:
        self._sent.append(Command(tuple(argv), timeout_s, stdin))
        return await self._inner.run(argv, timeout_s=timeout_s, on_line=on_line, stdin=stdin)

    async def http_get(self, url: str, *, timeout_s: float) -> HttpResult:
        return await self.http_request("GET", url, timeout_s=timeout_s)

    async def close(self) -> None:
        await self._inner.close()

    async def http_request(
        self,
        method: str,
        url: str,
        *,
        timeout_s: float,
        body: bytes | None = None,
        content_type: str | None = None,
    ) -> HttpResult:
        r = await self._inner.http_request(
            method, url, timeout_s=timeout_s, body=body, content_type=content_type
        )
        self._sent.append(Request(method, url, body, content_type, r.status is not None))
        return r


async def engine_redeploy(settings: Settings, version: str, sent: list[Sent]) -> float:
    async with open_runtime(settings) as rt:
        get = rt.pool.get

        def recording(name: str) -> HostTransport:
            return Recorder(get(name), sent)

        # The bench's own seam: the engine reaches hosts only through the pool.
        rt.pool.get = recording  # type: ignore[method-assign]
        plan = rt.engine.plan(Action.REDEPLOY, SERVICE, version=version, index="nightly")
        start = time.perf_counter()
        record = await rt.lifecycle.request(plan, requested_by="bench", source=Source.CLI)
        # As the CLI approves a run on its terminal (the approving process owns it).
        if not await rt.lifecycle.confirm(record.id, "bench-approver"):
            raise RuntimeError(f"run #{record.id} was not pending approval")
        result = await rt.engine.execute(record.id, TerminalSink(io.StringIO()))
        elapsed = time.perf_counter() - start
    assert result.status == "succeeded", result.summary
    return elapsed


async def open_channel(
    conn: asyncssh.SSHClientConnection, url: str
) -> tuple[asyncssh.SSHReader[bytes], asyncssh.SSHWriter[bytes]]:
    # The engine's refused polls while the server was still binding are not replayed as
    # such: poll the same way (refused -> wait one health_poll_s -> again), or the replay
    # races the server's start-up and fails.
    parts = urlsplit(url)
    while True:
        try:
            return await conn.open_connection(parts.hostname, parts.port)
        except asyncssh.ChannelOpenError as e:
            if e.code != asyncssh.OPEN_CONNECT_FAILED:
                raise
            await asyncio.sleep(TEST_SERVICE_SETTINGS["health_poll_s"])


async def send(conn: asyncssh.SSHClientConnection, r: Request) -> None:
    reader, writer = await open_channel(conn, r.url)
    parts = urlsplit(r.url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    head = f"{r.method} {path or '/'} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n"
    if r.body is not None:
        head += f"Content-Length: {len(r.body)}\r\n"
        if r.content_type is not None:
            head += f"Content-Type: {r.content_type}\r\n"
    writer.write(head.encode() + b"\r\n" + (r.body or b""))
    await reader.read()
    writer.close()


async def replay(kit: SimKit, sent: list[Sent]) -> float:
    # The connect is inside the timer, as the engine's is: both sides open one connection.
    start = time.perf_counter()
    async with await kit.connect() as conn:
        for s in sent:
            match s:
                case Request(answered=False):
                    continue
                case Request():
                    await send(conn, s)
                case Command():
                    command = wrap_with_timeout(s.argv, s.timeout_s)
                    if s.stdin is None:
                        await conn.run(command, stdin=asyncssh.DEVNULL)
                    else:
                        await conn.run(command, input=s.stdin.decode())
        elapsed = time.perf_counter() - start
    # Outside the `async with`: mypy cannot tell that asyncssh's __aexit__ never
    # swallows an exception, so a return inside it reads as possibly missing.
    return elapsed


async def main(runs: int) -> None:
    engine_times: list[float] = []
    bare_times: list[float] = []
    commands = requests = 0
    with tempfile.TemporaryDirectory() as tmp:
        async with SimKit(Path(tmp) / "host", config=fast_config(**ZERO_DELAYS)) as kit:
            for i in range(runs):
                version = ("0.31.0", "0.30.0")[i % 2]
                settings = Settings(**kit.settings_fragment(), db_path=Path(tmp) / f"a{i}.db")
                sent: list[Sent] = []
                engine_times.append(await engine_redeploy(settings, version, sent))
                commands = sum(isinstance(x, Command) for x in sent)
                requests = sum(isinstance(x, Request) and x.answered for x in sent)
                bare_times.append(await replay(kit, sent))
    e, b = statistics.median(engine_times), statistics.median(bare_times)
    print(
        f"machine: {platform.machine()}, {platform.python_implementation()} "
        f"{platform.python_version()}, {platform.system()}"
    )
    print(f"runs: {runs}, per redeploy: {commands} remote commands, {requests} HTTP requests")
    print("| | median s | min s | max s |")
    print("|---|---|---|---|")
    print(f"| engine redeploy | {e:.3f} | {min(engine_times):.3f} | {max(engine_times):.3f} |")
    print(
        f"| same commands back to back | {b:.3f} | {min(bare_times):.3f} | {max(bare_times):.3f} |"
    )
    print(f"engine overhead: {(e - b) / b * 100:+.1f}% ({(e - b) * 1000:+.0f} ms per redeploy)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=10)
    asyncio.run(main(ap.parse_args().runs))
