"""The real routers in tests (issue 19): Debian's HAProxy with a generated config and an
admin socket in the test's directory, and the vLLM Router from PyPI (`vllm-router`, a dev
dependency), each on loopback ports in front of simulated vLLM servers; and a client
that sends requests through them at a fixed rate and counts what failed.

Each router is started, then waited for by asking it (its socket answers `show stat`,
its admin API lists the workers healthy), never by sleeping."""

from __future__ import annotations

import asyncio
import csv
import json
import os
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from bot.core.routers.haproxy import parse_show_stat
from bot.sim.sshd import free_port

HAPROXY = Path("/usr/sbin/haproxy")
SOCAT = Path("/usr/bin/socat")
# Beside the interpreter of the locked environment (uv installs the launcher there).
VLLM_ROUTER = Path(sys.executable).with_name("vllm-router")
START_TIMEOUT_S = 30.0


def require(*programs: Path) -> None:
    """Skip without the program, except in CI, where its absence is a failure (.ci/run
    installs haproxy and socat; the locked environment has vllm-router)."""
    missing = [str(p) for p in programs if not os.access(p, os.X_OK)]
    if not missing:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{', '.join(missing)} missing and CI is set: see .ci/run")
    pytest.skip(f"not installed: {', '.join(missing)} (apt-get install haproxy socat)")


async def _until(what: str, check: object, timeout_s: float = START_TIMEOUT_S) -> None:
    """Ask ``check`` (an async callable answering True when ready) until it says so."""
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            if await check():  # type: ignore[operator]
                return
        except OSError as e:
            last = e
        await asyncio.sleep(0.05)  # a poll interval between two asks, not a synchronisation
    raise TimeoutError(f"{what} not ready after {timeout_s:g}s ({last})")


# ---- HAProxy ---------------------------------------------------------------------------


@dataclass
class HAProxy:
    socket: Path
    port: int  # the frontend clients use
    backend: str
    log: Path

    async def say(self, line: str) -> str:
        reader, writer = await asyncio.open_unix_connection(str(self.socket))
        writer.write(line.encode() + b"\n")
        await writer.drain()
        data = await reader.read()
        writer.close()
        return data.decode()


def haproxy_config(
    socket: Path,
    port: int,
    backend: str,
    servers: Sequence[tuple[str, int]],
    check: bool = True,
    extra: str = "",
) -> str:
    # The health check every 200 ms, down after 3 failures: HAProxy alone would still send
    # requests to a stopped replica for up to ~0.6 s, and the load loop would see them
    # fail (the control test shows it). No `retries`/`redispatch`: those would hide a
    # replica that was not taken out first.
    lines = [
        "global",
        f"    stats socket {socket} mode 600 level admin",
        "defaults",
        "    mode http",
        "    timeout connect 1s",
        "    timeout client 10s",
        "    timeout server 10s",
        "    retries 0",
        # A check's own timeout is `inter` (200 ms) unless set: on a loaded 2-core machine
        # a healthy replica's answer came later than that, HAProxy marked it DOWN while
        # the other was in maintenance, and clients got 503s the bot did not cause.
        "    timeout check 2s",
        "frontend fe",
        f"    bind 127.0.0.1:{port}",
        f"    default_backend {backend}",
        f"backend {backend}",
        *(["    option httpchk GET /health"] if check else []),
        *(
            f"    server {name} 127.0.0.1:{p}"
            + (" check inter 200ms fall 3 rise 1" if check else "")
            for name, p in servers
        ),
    ]
    return "\n".join(lines) + "\n" + extra


@asynccontextmanager
async def haproxy(
    root: Path,
    servers: Sequence[tuple[str, int]],
    backend: str = "vllm_kimi",
    *,
    check: bool = True,
    extra: str = "",
) -> AsyncIterator[HAProxy]:
    """HAProxy in front of ``servers``; ``check``: health-check them (ready once every
    one is up; without, once every one is listed); ``extra``: more config (a backend)."""
    require(HAPROXY, SOCAT)
    root.mkdir(parents=True, exist_ok=True)
    h = HAProxy(root / "admin.sock", free_port(), backend, root / "haproxy.log")
    cfg = root / "haproxy.cfg"
    cfg.write_text(haproxy_config(h.socket, h.port, backend, servers, check, extra))
    with h.log.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            str(HAPROXY), "-db", "-f", str(cfg), stdout=log, stderr=log
        )
    try:

        async def up() -> bool:
            if proc.returncode is not None:
                raise RuntimeError(f"haproxy exited {proc.returncode}: {h.log.read_text()}")
            views = parse_show_stat(await h.say("show stat"), backend)
            # every server's first health check passed
            return len(views) == len(servers) and (not check or all(v.up for v in views.values()))

        await _until("haproxy", up)
        yield h
    finally:
        with suppress(ProcessLookupError):
            proc.terminate()
        await proc.wait()


# ---- vLLM Router -----------------------------------------------------------------------


@dataclass
class VllmRouter:
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


async def http(
    port: int, method: str, path: str, body: bytes = b"", timeout_s: float = 5.0
) -> tuple[int, bytes]:
    """One HTTP/1.1 request on loopback (Connection: close): status and body."""

    async def go() -> tuple[int, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            head = (
                f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
            data = await reader.read(1 << 20)
        finally:
            writer.close()
        status_line, _, rest = data.partition(b"\r\n")
        parts = status_line.split()
        if len(parts) < 2 or not parts[1].isdigit():
            raise ConnectionError(f"no HTTP answer ({data[:60]!r})")
        return int(parts[1]), rest.partition(b"\r\n\r\n")[2]

    return await asyncio.wait_for(go(), timeout_s)


@asynccontextmanager
async def vllm_router(
    root: Path, workers: Sequence[str], *, policy: str | None = None, dp: int = 1
) -> AsyncIterator[VllmRouter]:
    """The router in front of ``workers`` (as given: a trailing ``/`` is kept);
    ``policy``: its ``--policy`` (its own default, cache_aware, without); ``dp``: its
    ``--intra-node-data-parallel-size`` (each worker then listed once per rank)."""
    require(VLLM_ROUTER)
    root.mkdir(parents=True, exist_ok=True)
    r = VllmRouter(free_port(), root / "vllm-router.log")
    argv = [
        str(VLLM_ROUTER),
        "--worker-urls",
        *workers,
        "--host",
        "127.0.0.1",
        "--port",
        str(r.port),
        "--health-check-interval-secs",
        "1",
        # add_worker waits for the worker's health; the bot only puts back a ready one.
        "--worker-startup-timeout-secs",
        "30",
        # Its metrics exporter binds 29000 by default: two routers at once (xdist
        # workers) collided there and the second one exited ("Address already in use").
        "--prometheus-port",
        str(free_port()),
        *(["--policy", policy] if policy else []),
        *(["--intra-node-data-parallel-size", str(dp)] if dp > 1 else []),
    ]
    with r.log.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=log, stderr=log)
    try:

        async def up() -> bool:
            if proc.returncode is not None:
                raise RuntimeError(f"vllm-router exited {proc.returncode}: {r.log.read_text()}")
            status, body = await http(r.port, "GET", "/workers")
            listed = json.loads(body).get("workers", []) if status == 200 else []
            return len(listed) == len(workers) * dp and all(w.get("is_healthy") for w in listed)

        await _until("vllm-router", up, 60.0)
        yield r
    finally:
        with suppress(ProcessLookupError):
            proc.terminate()
        await proc.wait()


T = TypeVar("T")


@asynccontextmanager
async def _in_background(
    value: T, run: Callable[[], Coroutine[Any, Any, None]], stop: asyncio.Event
) -> AsyncIterator[T]:
    """``run`` as a task while the block runs; then ``stop`` set and the task awaited."""
    task = asyncio.create_task(run())
    try:
        yield value
    finally:
        stop.set()
        await task


# ---- the client ------------------------------------------------------------------------


@dataclass
class Load:
    """Requests through a router at a fixed rate, each on its own connection, until
    stopped. Bounded: counts, the first failures, the last latencies."""

    port: int
    model: str
    interval_s: float = 0.02
    timeout_s: float = 10.0
    sent: int = 0
    ok: int = 0
    failures: list[tuple[float, str]] = field(default_factory=list)
    latencies: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=20_000))
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _inflight: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def failed(self) -> int:
        return self.sent - self.ok

    async def _one(self) -> None:
        at = time.time()
        body = json.dumps({"model": self.model, "prompt": "hi", "max_tokens": 2}).encode()
        try:
            status, answer = await http(self.port, "POST", "/v1/completions", body, self.timeout_s)
            if status == 200 and b'"choices"' in answer:
                self.ok += 1
                self.latencies.append((at, time.time() - at))
                return
            why = f"HTTP {status}: {answer[:80]!r}"
        except (OSError, TimeoutError, ConnectionError) as e:
            why = f"{type(e).__name__}: {e}"
        if len(self.failures) < 200:
            self.failures.append((at, why))

    async def run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.sent += 1
            task = asyncio.create_task(self._one())
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)
            next_at += self.interval_s
            with suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), max(0.0, next_at - time.monotonic()))
        await asyncio.gather(*self._inflight)

    def running(self) -> AbstractAsyncContextManager[Load]:
        return _in_background(self, self.run, self._stop)


@dataclass
class Watch:
    """The router's own view over time: each server's place in rotation, read every
    ``interval_s``, kept as transitions only (bounded whatever the run's length)."""

    read: Callable[[], Awaitable[dict[str, bool]]]  # server -> in rotation
    interval_s: float = 0.02
    changes: list[tuple[float, str, bool]] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        last: dict[str, bool] = {}
        while not self._stop.is_set():
            at = time.time()
            with suppress(OSError, ValueError):
                for server, inside in (await self.read()).items():
                    if last.get(server) != inside:
                        last[server] = inside
                        self.changes.append((at, server, inside))
            with suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.interval_s)

    def out_intervals(self, server: str) -> list[tuple[float, float]]:
        """When ``server`` was out of rotation: (from, to), to = inf if still out."""
        out: list[tuple[float, float]] = []
        start: float | None = None
        for at, s, inside in self.changes:
            if s != server:
                continue
            if not inside and start is None:
                start = at
            elif inside and start is not None:
                out.append((start, at))
                start = None
        if start is not None:
            out.append((start, float("inf")))
        return out

    def running(self) -> AbstractAsyncContextManager[Watch]:
        return _in_background(self, self.run, self._stop)


def haproxy_view(h: HAProxy) -> Callable[[], Awaitable[dict[str, bool]]]:
    """In rotation: HAProxy would send it requests: UP (not DRAIN or MAINT) and a weight
    above 0. (HAProxy's `status` shows a drained server whose check fails as DOWN, so
    its health is part of this view; the test config gives a check 2 s.) Read from the
    CSV here, apart from the bot's parser."""

    async def read() -> dict[str, bool]:
        lines = (await h.say("show stat")).lstrip("\n").splitlines()
        if not lines or not lines[0].startswith("# "):
            raise ValueError("not show stat")
        header = lines[0][2:].split(",")
        at = {n: header.index(n) for n in ("pxname", "svname", "status", "weight")}
        out: dict[str, bool] = {}
        for row in csv.reader(lines[1:]):
            if len(row) <= max(at.values()) or row[at["pxname"]] != h.backend:
                continue
            if row[at["svname"]] in ("FRONTEND", "BACKEND"):
                continue
            status, weight = row[at["status"]], row[at["weight"]]
            out[row[at["svname"]]] = status.split(" ")[0] == "UP" and weight not in ("", "0")
        return out

    return read


async def listed_workers(r: VllmRouter) -> list[tuple[str, bool]]:
    """GET /workers: each URL exactly as the router lists it, and whether it is healthy."""
    status, body = await http(r.port, "GET", "/workers")
    if status != 200:
        raise ValueError(status)
    return [(w["url"], bool(w.get("is_healthy"))) for w in json.loads(body)["workers"]]


def same_worker(listed: str, worker: str) -> bool:
    """The router routes to ``worker`` under ``listed``: the same URL but for a trailing
    ``/`` or a data-parallel rank (``@0``); written here apart from the bot's own rule."""
    base, at, rank = listed.rpartition("@")
    url = base if at and rank.isdigit() else listed
    return url.rstrip("/") == worker.rstrip("/")


def vllm_router_view(
    r: VllmRouter, workers: Sequence[str]
) -> Callable[[], Awaitable[dict[str, bool]]]:
    """In rotation as the bot puts it there or takes it out: listed by GET /workers under
    any spelling or rank. A worker the router's own health check marks unhealthy is still
    listed: on a loaded machine a starved replica's check fails for a moment, which is
    the router's judgement, not the bot's (lost requests are the load's count)."""

    async def read() -> dict[str, bool]:
        listed = await listed_workers(r)
        return {w: any(same_worker(url, w) for url, _ in listed) for w in workers}

    return read
