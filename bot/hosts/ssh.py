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
import time
from collections.abc import Sequence

import asyncssh

from bot.errors import HostKeyError, HostUnreachableError
from bot.hosts.base import CommandResult, HttpResult, LineCallback
from bot.hosts.http import exchange
from bot.hosts.streams import (
    KILL_AFTER_S,
    KILLED_EXIT,
    LOCAL_GRACE_S,
    TIMEOUT_EXIT,
    Capture,
    pump,
    reason,
    wrap_with_timeout,
)
from bot.settings import HostSettings


def _host_key_message(cfg: HostSettings) -> str:
    return (
        "host key is unknown or has changed, so the connection was refused. Verify the "
        "host's key out of band, then add it to the bot's known_hosts file, e.g. "
        f"`ssh-keyscan -p {cfg.port} {cfg.address}` (check the fingerprint first)."
    )


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
                self._name, f"SSH authentication as {cfg.user} was refused"
            ) from None
        except TimeoutError:
            raise HostUnreachableError(
                self._name, f"no SSH answer within {cfg.connect_timeout_s:g}s"
            ) from None
        except (OSError, asyncssh.Error) as e:
            raise HostUnreachableError(self._name, f"cannot connect: {reason(e)}") from None

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.abort()
            self._conn = None

    async def run(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float,
        on_line: LineCallback | None = None,
        stdin: bytes | None = None,
    ) -> CommandResult:
        command = wrap_with_timeout(argv, timeout_s)
        conn = await self._connection()
        out, err = Capture(), Capture()
        start = time.monotonic()
        async with self._sessions:
            try:
                proc = await conn.create_process(command, encoding="utf-8", errors="replace")
            except (OSError, asyncssh.Error) as e:
                self._drop()
                raise HostUnreachableError(self._name, f"cannot run command: {reason(e)}") from None
            local_timeout = False
            try:
                if stdin is not None:
                    try:
                        proc.stdin.write(stdin.decode("utf-8", "replace"))
                        proc.stdin.write_eof()
                    except BrokenPipeError:
                        # The command ended before reading its stdin (sudo refusing at
                        # once: "a password is required"): its output and exit status
                        # say why, not a lost connection (asyncssh: "Channel not open
                        # for sending", seen under load in tests/test_rotation_sudo.py).
                        pass
                async with asyncio.timeout(timeout_s + KILL_AFTER_S + LOCAL_GRACE_S):
                    await asyncio.gather(
                        pump(proc.stdout, "stdout", out, on_line),
                        pump(proc.stderr, "stderr", err, on_line),
                    )
                    await proc.wait_closed()
            except TimeoutError:
                # The remote timeout should have fired long ago: the host or link is stuck.
                local_timeout = True
                proc.close()
                self._drop()
            except (OSError, asyncssh.Error) as e:
                self._drop()
                raise HostUnreachableError(
                    self._name, f"connection lost while running `{argv[0]}`: {reason(e)}"
                ) from None
            finally:
                proc.close()
        duration = time.monotonic() - start
        sig = proc.exit_signal
        status = None if (sig is not None or local_timeout) else proc.exit_status
        if status is None and sig is None and not local_timeout and conn.is_closed():
            self._drop()
            raise HostUnreachableError(self._name, f"connection lost while running `{argv[0]}`")
        timed_out = local_timeout or status in (TIMEOUT_EXIT, KILLED_EXIT)
        return CommandResult(
            argv=tuple(argv),
            exit_status=status,
            stdout=out.text(),
            stderr=err.text(),
            duration_s=duration,
            signal=sig[0] if sig else None,
            timed_out=timed_out,
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
        conn = await self._connection()
        async with self._sessions:
            try:
                return await exchange(
                    conn.open_connection,
                    method,
                    url,
                    timeout_s=timeout_s,
                    body=body,
                    content_type=content_type,
                )
            except asyncssh.ChannelOpenError as e:
                # Refused while the model loads is normal; the gate keeps polling.
                refused = e.code == asyncssh.OPEN_CONNECT_FAILED
                return HttpResult(
                    url,
                    None,
                    error="connection refused" if refused else f"channel refused: {e.reason}",
                )
            except (asyncio.IncompleteReadError, ConnectionError, asyncssh.ChannelListenError) as e:
                return HttpResult(url, None, error=f"connection closed: {reason(e)}")
            except (OSError, asyncssh.Error) as e:
                self._drop()
                raise HostUnreachableError(self._name, f"connection lost: {reason(e)}") from None

    async def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            await self._conn.wait_closed()
            self._conn = None
