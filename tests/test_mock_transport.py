"""The scripted in-process host (``bot.hosts.mock``): the transport contract the engine
relies on (bounded lines and captures, timeouts, HTTP bodies), and the engine's host
reads driven through it, with no SSH."""

from __future__ import annotations

import asyncio

import pytest

from bot.core.results import MAX_LINE_CHARS
from bot.errors import HostError, HostUnreachableError
from bot.hosts.base import HostTransport
from bot.hosts.http import MAX_BODY_BYTES
from bot.hosts.mock import Answer, Command, MockPool, MockTransport, Reply, Request, Script
from bot.hosts.streams import MAX_CAPTURE_CHARS, TIMEOUT_EXIT
from bot.settings import Settings


def _transport(t: HostTransport) -> HostTransport:
    return t  # mypy: the mock is a HostTransport


async def test_a_scripted_command_answers_and_is_recorded() -> None:
    script = (
        Script()
        .on("systemctl", "is-active", reply=Reply("active\n"))
        .on(
            "uv",
            reply=lambda c: Reply(stderr=f"uv got {len(c.stdin or b'')} bytes\n", exit_status=2),
        )
    )
    host = MockTransport("gpu-1", script)
    assert _transport(host).host == "gpu-1"
    lines: list[tuple[str, str]] = []
    r = await host.run(
        ["systemctl", "is-active", "kimi"],
        timeout_s=5,
        on_line=lambda s, line: lines.append((s, line)),
    )
    assert (r.ok, r.stdout, r.argv) == (True, "active\n", ("systemctl", "is-active", "kimi"))
    assert lines == [("stdout", "active")]
    r = await host.run(["uv", "pip", "install"], timeout_s=5, stdin=b"secret")
    assert (r.exit_status, r.stderr) == (2, "uv got 6 bytes\n")
    r = await host.run(["pgrep", "-f", "x"], timeout_s=5)
    assert r.exit_status == 127 and "command not found" in r.stderr
    assert host.argvs() == [
        ("systemctl", "is-active", "kimi"),
        ("uv", "pip", "install"),
        ("pgrep", "-f", "x"),
    ]
    assert host.commands[1] == Command(("uv", "pip", "install"), 5, b"secret")


async def test_lines_and_captures_have_the_real_transports_bounds() -> None:
    endless = "C" * (3 * MAX_LINE_CHARS)
    many = "".join(f"{i}\n" for i in range(300_000))
    host = MockTransport(
        "gpu-1",
        Script().on("flood", reply=Reply(endless + "\nafter\n")).on("many", reply=Reply(many)),
    )
    seen: list[str] = []
    r = await host.run(["flood"], timeout_s=5, on_line=lambda _s, line: seen.append(line))
    line, after = r.stdout.splitlines()
    assert after == "after" and len(line) <= MAX_LINE_CHARS and "line cut" in line
    assert seen[0] == line and len(seen[0]) <= MAX_LINE_CHARS
    r = await host.run(["many"], timeout_s=5)
    assert r.stdout.endswith("299999\n") and len(r.stdout) < MAX_CAPTURE_CHARS
    assert not r.stdout.startswith("0\n")  # the oldest lines went


async def test_a_command_past_its_timeout_is_timed_out_like_the_remote_timeout() -> None:
    started = asyncio.Event()

    async def hang(c: Command) -> Reply:
        started.set()
        await asyncio.Event().wait()
        raise AssertionError("never")

    host = MockTransport(
        "gpu-1", Script().on("slow", reply=Reply("late\n", delay_s=30)).on("hang", reply=hang)
    )
    r = await host.run(["slow"], timeout_s=0.05)
    assert (r.timed_out, r.exit_status, r.ok, r.stdout) == (True, TIMEOUT_EXIT, False, "")
    r = await host.run(["hang"], timeout_s=0.05)
    assert started.is_set() and r.timed_out


async def test_a_signal_and_a_lost_host_come_back_as_from_ssh() -> None:
    def lost(c: Command) -> Reply:
        raise HostUnreachableError("gpu-1", "connection lost")

    host = MockTransport(
        "gpu-1",
        Script()
        .on("killed", reply=Reply(exit_status=None, signal="signal 9"))
        .on("lost", reply=lost),
    )
    r = await host.run(["killed"], timeout_s=5)
    assert (r.exit_status, r.signal, r.ok) == (None, "signal 9", False)
    with pytest.raises(HostUnreachableError):
        await host.run(["lost"], timeout_s=5)


async def test_http_answers_pass_the_body_bound() -> None:
    def server(req: Request) -> Answer:
        if req.url.endswith("/health"):
            return Answer(200, "ok")
        if req.url.endswith("/metrics"):
            return Answer(200, b"x" * (MAX_BODY_BYTES + 10))
        return Answer(None, error="connection refused")

    host = MockTransport("gpu-1", http=server)
    h = await host.http_get("http://127.0.0.1:8000/health", timeout_s=1)
    assert (h.ok, h.body, h.truncated) == (True, "ok", False)
    h = await host.http_get("http://127.0.0.1:8000/metrics", timeout_s=1)
    assert h.status == 200 and h.truncated and len(h.body) == MAX_BODY_BYTES
    h = await host.http_request(
        "POST",
        "http://127.0.0.1:8000/v1/completions",
        timeout_s=1,
        body=b"{}",
        content_type="application/json",
    )
    assert (h.status, h.error) == (None, "connection refused")
    assert host.requests[-1] == Request(
        "POST", "http://127.0.0.1:8000/v1/completions", 1, b"{}", "application/json"
    )

    async def silent(req: Request) -> Answer:
        await asyncio.Event().wait()
        raise AssertionError("never")

    h = await MockTransport("gpu-1", http=silent).http_get("http://x:1/", timeout_s=0.05)
    assert (h.status, h.error) == (None, "no response within 0.05s")


async def test_the_pool_hands_out_the_scripted_hosts_only() -> None:
    host = MockTransport("gpu-1")
    keys = {"known_hosts": "/dev/null"}
    settings = Settings(
        hosts={
            "gpu-1": {"address": "127.0.0.1", **keys},
            "gpu-2": {"address": "127.0.0.2", **keys},
        },
        services={},
    )
    pool = MockPool(settings, {"gpu-1": host})
    assert pool.get("gpu-1") is host and pool.gpu_health("gpu-1") is None
    with pytest.raises(HostError):
        pool.get("gpu-2")
    await pool.close()
    assert host.closed
