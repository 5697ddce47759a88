"""The transport for a bot that runs on the GPU host itself (``address = "local"``)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence

from bot.errors import HostUnreachableError
from bot.hosts.base import CommandResult, HttpResult, LineCallback
from bot.hosts.http import exchange
from bot.hosts.streams import KILL_AFTER_S, KILLED_EXIT, TIMEOUT_EXIT, Capture, pump, reason


class LocalTransport:
    """The bot runs on the GPU host itself (``address = "local"``): same contract, no SSH."""

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def host(self) -> str:
        return self._name

    async def run(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float,
        on_line: LineCallback | None = None,
        stdin: bytes | None = None,
    ) -> CommandResult:
        seconds = str(max(1, math.ceil(timeout_s)))
        full = ("timeout", f"--kill-after={KILL_AFTER_S}s", f"{seconds}s", *argv)
        start = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *full,
                stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as e:
            raise HostUnreachableError(self._name, f"cannot run `{argv[0]}`: {reason(e)}") from None
        out, err = Capture(), Capture()
        assert proc.stdout is not None and proc.stderr is not None
        if stdin is not None:
            assert proc.stdin is not None
            proc.stdin.write(stdin)
            proc.stdin.close()  # a few bytes: the pipe takes them without waiting
        await asyncio.gather(
            pump(proc.stdout, "stdout", out, on_line), pump(proc.stderr, "stderr", err, on_line)
        )
        status = await proc.wait()
        return CommandResult(
            argv=tuple(argv),
            exit_status=status if status >= 0 else None,
            stdout=out.text(),
            stderr=err.text(),
            duration_s=time.monotonic() - start,
            signal=f"signal {-status}" if status < 0 else None,
            timed_out=status in (TIMEOUT_EXIT, KILLED_EXIT),
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
        try:
            return await exchange(
                asyncio.open_connection,
                method,
                url,
                timeout_s=timeout_s,
                body=body,
                content_type=content_type,
            )
        except ConnectionRefusedError:
            return HttpResult(url, None, error="connection refused")
        except (OSError, asyncio.IncompleteReadError) as e:
            return HttpResult(url, None, error=f"connection closed: {reason(e)}")

    async def close(self) -> None:
        return None
