"""HostTransport over asyncssh: one reused connection per host, strict host keys.

Why these choices:
- Host keys are always checked against the configured known_hosts; an unknown or
  changed key is refused with a message saying how to add it.  There is no
  switch to turn this off.
- Every remote command runs under coreutils ``timeout`` on the host, so a step
  timeout stops the remote process group too (a local timeout alone would leave
  ``uv`` running on the host).  A local deadline a little later is the backstop
  for a host that stops answering.
- Commands are argv lists joined with ``shlex.join``; nothing is ever formatted
  into a shell string.
- The health check is an HTTP GET through a direct-tcpip channel, so the model
  server's port is never exposed to the bot's network.
"""

from __future__ import annotations

import asyncio
import math
import shlex
import time
from collections import deque
from collections.abc import Sequence
from urllib.parse import urlsplit

import asyncssh

from bot.errors import HostError, HostKeyError, HostUnreachableError
from bot.settings import HostSettings, Settings
from bot.transport import CommandResult, HostTransport, HttpResult, LineCallback, Stream

# Seconds between the remote TERM and KILL, and the extra local grace on top of it.
KILL_AFTER_S = 10
LOCAL_GRACE_S = 15
# Keep at most this much of each stream in the result; the full text is streamed.
MAX_CAPTURE_CHARS = 1_000_000
TIMEOUT_EXIT = 124  # coreutils timeout: the command timed out
KILLED_EXIT = 137  # coreutils timeout: it had to KILL


def wrap_with_timeout(argv: Sequence[str], timeout_s: float) -> str:
    seconds = max(1, math.ceil(timeout_s))
    return shlex.join(("timeout", f"--kill-after={KILL_AFTER_S}s", f"{seconds}s", *argv))


class _Capture:
    def __init__(self) -> None:
        self.parts: deque[str] = deque()
        self.size = 0

    def add(self, line: str) -> None:
        self.parts.append(line)
        self.size += len(line)
        while self.size > MAX_CAPTURE_CHARS and len(self.parts) > 1:
            self.size -= len(self.parts.popleft())

    def text(self) -> str:
        return "".join(self.parts)


async def _pump(reader: asyncssh.SSHReader[str] | asyncio.StreamReader, stream: Stream,
                capture: _Capture, on_line: LineCallback | None) -> None:
    while True:
        raw = await reader.readline()
        if not raw:
            return
        line = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
        capture.add(line)
        if on_line is not None:
            on_line(stream, line.rstrip("\n"))


def _host_key_message(cfg: HostSettings) -> str:
    return ("host key is unknown or has changed, so the connection was refused. Verify the "
            "host's key out of band, then add it to the bot's known_hosts file, e.g. "
            f"`ssh-keyscan -p {cfg.port} {cfg.address}` (check the fingerprint first).")


class SshTransport:
    """One host reached over SSH. Safe to share between concurrent tasks."""

    def __init__(self, name: str, cfg: HostSettings) -> None:
        self._name = name
        self._cfg = cfg
        self._conn: asyncssh.SSHClientConnection | None = None
        self._lock = asyncio.Lock()
        # sshd's MaxSessions (10 by default) caps channels per connection.
        self._sessions = asyncio.Semaphore(cfg.max_sessions)

    @property
    def host(self) -> str:
        return self._name

    async def _connection(self) -> asyncssh.SSHClientConnection:
        async with self._lock:
            conn = self._conn
            if conn is not None and not conn.is_closed():
                return conn
            self._conn = await self._connect()
            return self._conn

    async def _connect(self) -> asyncssh.SSHClientConnection:
        cfg = self._cfg
        assert cfg.known_hosts is not None  # settings require it for remote hosts
        try:
            return await asyncssh.connect(
                cfg.address,
                cfg.port,
                username=cfg.user,
                known_hosts=str(cfg.known_hosts),
                client_keys=[str(cfg.key_file)] if cfg.key_file else (),
                agent_path=None,
                config=None,
                connect_timeout=cfg.connect_timeout_s,
                login_timeout=cfg.connect_timeout_s,
                keepalive_interval=cfg.keepalive_interval_s,
                keepalive_count_max=cfg.keepalive_count_max,
            )
        except asyncssh.HostKeyNotVerifiable:
            raise HostKeyError(self._name, _host_key_message(cfg)) from None
        except asyncssh.PermissionDenied:
            raise HostUnreachableError(
                self._name, f"SSH authentication as {cfg.user} was refused") from None
        except TimeoutError:
            raise HostUnreachableError(
                self._name, f"no SSH answer within {cfg.connect_timeout_s:g}s") from None
        except (OSError, asyncssh.Error) as e:
            raise HostUnreachableError(self._name, f"cannot connect: {_reason(e)}") from None

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.abort()
            self._conn = None

    async def run(self, argv: Sequence[str], *, timeout_s: float,
                  on_line: LineCallback | None = None) -> CommandResult:
        command = wrap_with_timeout(argv, timeout_s)
        conn = await self._connection()
        out, err = _Capture(), _Capture()
        start = time.monotonic()
        async with self._sessions:
            try:
                proc = await conn.create_process(command, encoding="utf-8", errors="replace")
            except (OSError, asyncssh.Error) as e:
                self._drop()
                raise HostUnreachableError(self._name, f"cannot run command: {_reason(e)}"
                                           ) from None
            local_timeout = False
            try:
                async with asyncio.timeout(timeout_s + KILL_AFTER_S + LOCAL_GRACE_S):
                    await asyncio.gather(_pump(proc.stdout, "stdout", out, on_line),
                                         _pump(proc.stderr, "stderr", err, on_line))
                    await proc.wait_closed()
            except TimeoutError:
                # The remote timeout should have fired long ago: the host or link is stuck.
                local_timeout = True
                proc.close()
                self._drop()
            except (OSError, asyncssh.Error) as e:
                self._drop()
                raise HostUnreachableError(
                    self._name, f"connection lost while running `{argv[0]}`: {_reason(e)}"
                ) from None
            finally:
                proc.close()
        duration = time.monotonic() - start
        sig = proc.exit_signal
        status = None if (sig is not None or local_timeout) else proc.exit_status
        if status is None and sig is None and not local_timeout and conn.is_closed():
            self._drop()
            raise HostUnreachableError(
                self._name, f"connection lost while running `{argv[0]}`")
        timed_out = local_timeout or status in (TIMEOUT_EXIT, KILLED_EXIT)
        return CommandResult(argv=tuple(argv), exit_status=status, stdout=out.text(),
                             stderr=err.text(), duration_s=duration,
                             signal=sig[0] if sig else None, timed_out=timed_out)

    async def http_get(self, url: str, *, timeout_s: float) -> HttpResult:
        parts = urlsplit(url)
        host = parts.hostname or "127.0.0.1"
        port = parts.port or 80
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        conn = await self._connection()
        async with self._sessions:
            try:
                async with asyncio.timeout(timeout_s):
                    reader, writer = await conn.open_connection(host, port)
                    try:
                        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                                     "Connection: close\r\nUser-Agent: vllm-chatops\r\n\r\n"
                                     .encode())
                        head = await reader.readuntil(b"\r\n\r\n")
                        body = await reader.read(4096)
                    finally:
                        writer.close()
            except asyncssh.ChannelOpenError as e:
                # Refused while the model loads is normal; the gate keeps polling.
                refused = e.code == asyncssh.OPEN_CONNECT_FAILED
                return HttpResult(url, None, error="connection refused" if refused
                                  else f"channel refused: {e.reason}")
            except TimeoutError:
                return HttpResult(url, None, error=f"no response within {timeout_s:g}s")
            except (asyncio.IncompleteReadError, ConnectionError, asyncssh.ChannelListenError
                    ) as e:
                return HttpResult(url, None, error=f"connection closed: {_reason(e)}")
            except (OSError, asyncssh.Error) as e:
                self._drop()
                raise HostUnreachableError(self._name, f"connection lost: {_reason(e)}"
                                           ) from None
        status_line = head.decode("latin-1").split("\r\n", 1)[0].split()
        try:
            code = int(status_line[1])
        except (IndexError, ValueError):
            return HttpResult(url, None, error=f"not an HTTP response: {status_line[:3]}")
        return HttpResult(url, code, body=body.decode("utf-8", "replace"))

    async def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            await self._conn.wait_closed()
            self._conn = None


class LocalTransport:
    """The bot runs on the GPU host itself (``address = "local"``): same contract, no SSH."""

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def host(self) -> str:
        return self._name

    async def run(self, argv: Sequence[str], *, timeout_s: float,
                  on_line: LineCallback | None = None) -> CommandResult:
        seconds = str(max(1, math.ceil(timeout_s)))
        full = ("timeout", f"--kill-after={KILL_AFTER_S}s", f"{seconds}s", *argv)
        start = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *full, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE)
        except OSError as e:
            raise HostUnreachableError(self._name, f"cannot run `{argv[0]}`: {_reason(e)}"
                                       ) from None
        out, err = _Capture(), _Capture()
        assert proc.stdout is not None and proc.stderr is not None
        await asyncio.gather(_pump(proc.stdout, "stdout", out, on_line),
                             _pump(proc.stderr, "stderr", err, on_line))
        status = await proc.wait()
        return CommandResult(argv=tuple(argv), exit_status=status if status >= 0 else None,
                             stdout=out.text(), stderr=err.text(),
                             duration_s=time.monotonic() - start,
                             signal=f"signal {-status}" if status < 0 else None,
                             timed_out=status in (TIMEOUT_EXIT, KILLED_EXIT))

    async def http_get(self, url: str, *, timeout_s: float) -> HttpResult:
        parts = urlsplit(url)
        try:
            async with asyncio.timeout(timeout_s):
                reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
                try:
                    writer.write(f"GET {parts.path or '/'} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
                                 "Connection: close\r\n\r\n".encode())
                    head = await reader.readuntil(b"\r\n\r\n")
                finally:
                    writer.close()
        except ConnectionRefusedError:
            return HttpResult(url, None, error="connection refused")
        except TimeoutError:
            return HttpResult(url, None, error=f"no response within {timeout_s:g}s")
        except (OSError, asyncio.IncompleteReadError) as e:
            return HttpResult(url, None, error=f"connection closed: {_reason(e)}")
        try:
            return HttpResult(url, int(head.split(b"\r\n", 1)[0].split()[1]))
        except (IndexError, ValueError):
            return HttpResult(url, None, error="not an HTTP response")

    async def close(self) -> None:
        return None


def _reason(e: BaseException) -> str:
    text = getattr(e, "reason", None) or str(e) or type(e).__name__
    return str(text).strip()


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
