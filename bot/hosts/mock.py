"""A scripted host in this process: the ``HostTransport`` contract with no SSH, no
processes and no sockets (like httpx's ``MockTransport``).

    script = Script().on("systemctl", "is-active", reply=Reply("active\\n"))
    host = MockTransport("gpu-node-1", script, http=lambda req: Answer(200, "ok"))
    pool = MockPool(settings, {"gpu-node-1": host})  # for Engine, read_hosts, ...

A test that judges what the engine does with a host's answers (a result, a lost
connection, a timeout, a flood of output) gives the answers here, not a simulated host
behind sshd. What the engine sends is kept (``commands``, ``requests``) for the test to
read. The answers pass the same bounds as over SSH: lines cut at ``MAX_LINE_CHARS`` (to
``on_line`` and in the result), each stream's capture at ``MAX_CAPTURE_CHARS``, an HTTP
body at ``MAX_BODY_BYTES`` through the same response reader. A step timeout ends the
command as the remote ``timeout`` would: exit 124, ``timed_out``. The end-to-end paths
that need a real host (redeploy, rollback, leftovers, recovery, non-root) stay on the
simulator over sshd (``bot.sim``).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from bot.errors import HostError
from bot.hosts.base import CommandResult, HttpResult, LineCallback
from bot.hosts.http import HttpProtocolError, read_response
from bot.hosts.pool import HostPool
from bot.hosts.streams import TIMEOUT_EXIT, Capture, pump
from bot.settings import Settings

__all__ = [
    "Answer",
    "Command",
    "CommandHandler",
    "HttpHandler",
    "MockPool",
    "MockTransport",
    "Reply",
    "Request",
    "Script",
]

# The exit status a shell gives a command it cannot find.
NOT_FOUND_EXIT = 127


@dataclass(frozen=True, slots=True)
class Command:
    """One command the engine ran, as the handler sees it."""

    argv: tuple[str, ...]
    timeout_s: float
    stdin: bytes | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    """What a scripted command prints and how it ends. ``exit_status`` None with a
    ``signal`` (``"signal 9"``, as the transports word it): killed. ``delay_s``: how long
    it runs first (past the step's timeout, it is timed out)."""

    stdout: str = ""
    stderr: str = ""
    exit_status: int | None = 0
    signal: str | None = None
    delay_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Request:
    """One HTTP request the engine made from the host."""

    method: str
    url: str
    timeout_s: float
    body: bytes | None = None
    content_type: str | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """The server's answer: ``status`` None is no answer at all, ``error`` says why
    (as the transports word it: ``"connection refused"``, ``"no response within 5s"``)."""

    status: int | None
    body: str | bytes = b""
    error: str | None = None


# A handler may answer at once or after awaiting (a test's event, a slow host); it may
# raise HostUnreachableError or HostKeyError as a lost host does.
CommandHandler = Callable[[Command], Reply | Awaitable[Reply]]
HttpHandler = Callable[[Request], Answer | Awaitable[Answer]]


_T = TypeVar("_T")


async def _answer(value: _T | Awaitable[_T]) -> _T:
    if inspect.isawaitable(value):
        return await value
    return value


class _TextReader:
    """What the pump reads: the scripted text, in one chunk, then end of stream."""

    def __init__(self, text: str) -> None:
        self._text: str | None = text

    async def read(self, n: int = -1) -> str:
        text, self._text = self._text or "", None
        return text


class _BytesReader:
    def __init__(self, data: bytes) -> None:
        self._data = data

    async def read(self, n: int = -1) -> bytes:
        size = len(self._data) if n < 0 else n
        chunk, self._data = self._data[:size], self._data[size:]
        return chunk


def _not_found(command: Command) -> Reply:
    return Reply(stderr=f"{command.argv[0]}: command not found\n", exit_status=NOT_FOUND_EXIT)


def _no_server(request: Request) -> Answer:
    return Answer(None, error="connection refused")


@dataclass
class Script:
    """A command handler from rules: the first rule whose argv prefix matches answers
    (a fixed ``Reply`` or a function of the command); no match is "command not found"."""

    rules: list[tuple[tuple[str, ...], Reply | CommandHandler]] = field(default_factory=list)

    def on(self, *prefix: str, reply: Reply | CommandHandler) -> Script:
        self.rules.append((prefix, reply))
        return self

    def __call__(self, command: Command) -> Reply | Awaitable[Reply]:
        for prefix, reply in self.rules:
            if command.argv[: len(prefix)] == prefix:
                return reply if isinstance(reply, Reply) else reply(command)
        return _not_found(command)


class MockTransport:
    """One scripted host (see the module's docstring)."""

    def __init__(
        self, name: str, commands: CommandHandler | None = None, *, http: HttpHandler | None = None
    ) -> None:
        self._name = name
        self._commands: CommandHandler = commands if commands is not None else Script()
        self._http: HttpHandler = http if http is not None else _no_server
        self.commands: list[Command] = []
        self.requests: list[Request] = []
        self.closed = False

    @property
    def host(self) -> str:
        return self._name

    def argvs(self) -> list[tuple[str, ...]]:
        """What ran, oldest first."""
        return [c.argv for c in self.commands]

    async def run(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float,
        on_line: LineCallback | None = None,
        stdin: bytes | None = None,
    ) -> CommandResult:
        command = Command(tuple(argv), timeout_s, stdin)
        self.commands.append(command)
        start = time.monotonic()
        try:
            async with asyncio.timeout(timeout_s):
                reply = await _answer(self._commands(command))
                if reply.delay_s > 0:
                    await asyncio.sleep(reply.delay_s)
        except TimeoutError:
            # As the remote `timeout` ends it: TERM, exit 124, nothing more printed.
            return CommandResult(
                argv=command.argv,
                exit_status=TIMEOUT_EXIT,
                stdout="",
                stderr="",
                duration_s=time.monotonic() - start,
                timed_out=True,
            )
        out, err = Capture(), Capture()
        await pump(_TextReader(reply.stdout), "stdout", out, on_line)
        await pump(_TextReader(reply.stderr), "stderr", err, on_line)
        return CommandResult(
            argv=command.argv,
            exit_status=reply.exit_status,
            stdout=out.text(),
            stderr=err.text(),
            duration_s=time.monotonic() - start,
            signal=reply.signal,
            timed_out=reply.exit_status == TIMEOUT_EXIT,
        )

    async def http_get(self, url: str, *, timeout_s: float) -> HttpResult:
        return await self.http_request("GET", url, timeout_s=timeout_s)

    async def http_request(
        self,
        method: str,
        url: str,
        *,
        timeout_s: float,
        body: bytes | None = None,
        content_type: str | None = None,
    ) -> HttpResult:
        request = Request(method, url, timeout_s, body, content_type)
        self.requests.append(request)
        try:
            async with asyncio.timeout(timeout_s):
                answer = await _answer(self._http(request))
        except TimeoutError:
            return HttpResult(url, None, error=f"no response within {timeout_s:g}s")
        if answer.status is None:
            return HttpResult(url, None, error=answer.error or "no response")
        data = answer.body.encode() if isinstance(answer.body, str) else answer.body
        # Read back through the transports' own reader, so the body's bound and its
        # `truncated` are theirs.
        raw = (
            f"HTTP/1.1 {answer.status} Scripted\r\nContent-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        try:
            response = await read_response(_BytesReader(raw), method=method)
        except HttpProtocolError as e:
            return HttpResult(url, None, error=str(e))
        return HttpResult(
            url,
            response.status,
            body=response.body.decode("utf-8", "replace"),
            truncated=response.truncated,
        )

    async def close(self) -> None:
        self.closed = True


class MockPool(HostPool):
    """A ``HostPool`` whose hosts are the given scripted ones (for ``Engine`` and the
    host reads); a host not given is "not a configured host", as in the real pool."""

    def __init__(
        self, settings: Settings, hosts: Mapping[str, MockTransport], *, nvml: Any = None
    ) -> None:
        super().__init__(settings, nvml=nvml)
        self.hosts = dict(hosts)

    def get(self, name: str) -> MockTransport:
        t = super().get(name)  # pooled as the real pool does, so reuse is observable
        assert isinstance(t, MockTransport)
        return t

    def _open(self, name: str) -> MockTransport:
        if name not in self.hosts:
            raise HostError(name, "not a configured host")
        return self.hosts[name]

    async def close(self) -> None:
        await asyncio.gather(*(t.close() for t in self.hosts.values()))
        await super().close()
