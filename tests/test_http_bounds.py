"""HTTP requests made from the host's side: every answer is read with bounds.

A model server (or whatever answers on its port) may send a header or a body without
end; the bot reads at most ``MAX_HEAD_BYTES`` of head and ``MAX_BODY_BYTES`` of body
and closes the connection. The pure reader is fed real ``asyncio.StreamReader``s; the
end-to-end tests go through a real OpenSSH sshd's direct-tcpip channel to a server
that never stops sending."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from bot.hosts.http import (
    MAX_BODY_BYTES,
    MAX_HEAD_BYTES,
    ByteReader,
    ByteWriter,
    HttpProtocolError,
    exchange,
    read_response,
    request_bytes,
)
from bot.hosts.local import LocalTransport
from bot.hosts.ssh import SshTransport
from bot.settings import HostSettings
from bot.sim.kit import SimKit
from tests.polling import eventually


def reader_of(*parts: bytes) -> asyncio.StreamReader:
    r = asyncio.StreamReader()
    for p in parts:
        r.feed_data(p)
    r.feed_eof()
    return r


async def test_content_length_chunked_and_close_delimited_bodies() -> None:
    r = await read_response(reader_of(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloEXTRA"))
    assert (r.status, r.body, r.truncated) == (200, b"hello", False)
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"4;ext=1\r\nvllm\r\n3\r\n:ok\r\n0\r\n\r\n"
    )
    r = await read_response(reader_of(chunked))
    assert (r.body, r.truncated) == (b"vllm:ok", False)
    r = await read_response(reader_of(b"HTTP/1.0 503 Service Unavailable\r\n\r\n", b"down"))
    assert (r.status, r.body) == (503, b"down")
    r = await read_response(
        reader_of(b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 204 No Content\r\n\r\n")
    )
    assert (r.status, r.body) == (204, b"")


async def test_a_body_past_the_bound_is_cut_and_marked() -> None:
    big = b"x" * (MAX_BODY_BYTES + 10)
    r = await read_response(
        reader_of(
            b"HTTP/1.1 200 OK\r\nContent-Length: " + str(len(big)).encode() + b"\r\n\r\n", big
        )
    )
    assert (len(r.body), r.truncated) == (MAX_BODY_BYTES, True)
    r = await read_response(reader_of(b"HTTP/1.1 200 OK\r\n\r\n", big))
    assert (len(r.body), r.truncated) == (MAX_BODY_BYTES, True)
    chunk = hex(len(big))[2:].encode()
    r = await read_response(
        reader_of(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", chunk + b"\r\n", big)
    )
    assert (len(r.body), r.truncated) == (MAX_BODY_BYTES, True)
    r = await read_response(
        reader_of(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n", big), max_body=4
    )
    assert (r.body, r.truncated) == (b"xxxx", True)


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"H" * (MAX_HEAD_BYTES + 1), "response head longer than"),
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "not an HTTP response"),
        (b"HTTP/1.1 200 OK\r\nContent-Le", "closed inside the response head"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
    ],
)
async def test_answers_that_are_not_http_are_errors(data: bytes, says: str) -> None:
    with pytest.raises(HttpProtocolError, match=says):
        await read_response(reader_of(data))


def test_the_request_names_its_body() -> None:
    req = request_bytes(
        "POST",
        "127.0.0.1",
        8000,
        "/v1/completions",
        body=b'{"a":1}',
        content_type="application/json",
    )
    head, _, body = req.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] == b"POST /v1/completions HTTP/1.1"
    assert b"Content-Length: 7" in head and b"Content-Type: application/json" in head
    assert b"Connection: close" in head and body == b'{"a":1}'


class Wire:
    """A stream ``exchange`` opens: it answers with ``answer`` (or never, for None),
    and keeps what was sent and whether it was closed."""

    def __init__(self, answer: bytes | None) -> None:
        self.answer = answer
        self.sent = b""
        self.closed = False
        self.opened: tuple[str, int] | None = None

    async def open(self, host: str, port: int) -> tuple[ByteReader, ByteWriter]:
        self.opened = (host, port)
        reader = asyncio.StreamReader()
        if self.answer is not None:
            reader.feed_data(self.answer)
            reader.feed_eof()
        return reader, self

    def write(self, data: bytes) -> None:
        self.sent += data

    def close(self) -> None:
        self.closed = True


async def test_one_exchange_for_both_transports() -> None:
    wire = Wire(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    r = await exchange(
        wire.open,
        "POST",
        "http://10.0.0.5:8000/v1/x?y=1",
        timeout_s=5,
        body=b"{}",
        content_type="application/json",
    )
    assert (r.url, r.status, r.body, r.error, r.truncated) == (
        "http://10.0.0.5:8000/v1/x?y=1",
        200,
        "ok",
        None,
        False,
    )
    assert wire.opened == ("10.0.0.5", 8000) and wire.closed
    assert wire.sent.startswith(b"POST /v1/x?y=1 HTTP/1.1\r\nHost: 10.0.0.5:8000\r\n")
    assert wire.sent.endswith(b"\r\n\r\n{}")
    # No answer in time, and an answer that is not HTTP: errors, the stream closed.
    silent = Wire(None)
    r = await exchange(silent.open, "GET", "http://h/", timeout_s=0.01)
    assert (r.status, r.error, silent.closed) == (None, "no response within 0.01s", True)
    junk = Wire(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
    r = await exchange(junk.open, "GET", "http://h/", timeout_s=5)
    assert r.status is None and "not an HTTP response" in (r.error or "") and junk.closed


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[tuple[int, list[int]]]:
    """A real TCP server on loopback; yields its port and a list that collects how many
    bytes each connection managed to send before the client went away."""
    sent: list[int] = []

    async def wrapped(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.readuntil(b"\r\n\r\n")
        try:
            await handler(r, w)
        except (ConnectionError, OSError):
            pass
        finally:
            sent.append(getattr(w, "sent", 0))
            w.close()

    server = await asyncio.start_server(wrapped, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield port, sent
    finally:
        server.close()
        await server.wait_closed()


async def endless_body(_: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
    block = b"vllm:num_requests_running 1.0\n" * 4096
    total = 0
    while True:  # until the client closes
        w.write(block)
        total += len(block)
        w.sent = total  # type: ignore[attr-defined]
        await w.drain()


async def endless_header(_: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    w.write(b"HTTP/1.1 200 OK\r\n")
    total = 0
    while True:
        w.write(b"X-Junk: " + b"j" * 1000 + b"\r\n")
        total += 1010
        w.sent = total  # type: ignore[attr-defined]
        await w.drain()


def ssh_transport(kit: SimKit) -> SshTransport:
    return SshTransport(kit.hostname, HostSettings(**kit.host_settings()))


async def test_an_endless_body_through_sshd_is_cut_at_the_bound(sim_sshd_host: SimKit) -> None:
    t = ssh_transport(sim_sshd_host)
    async with serving(endless_body) as (port, sent):
        try:
            tracemalloc.start()
            r = await t.http_request("GET", f"http://127.0.0.1:{port}/metrics", timeout_s=20)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            assert (r.status, r.truncated) == (200, True)
            assert len(r.body) == MAX_BODY_BYTES
            # The body string, its bytes and the buffers: a few copies of the bound.
            assert peak < 12 * MAX_BODY_BYTES, peak
            await eventually(lambda: bool(sent), "the server to see the client go", 10)
            assert sent[0] >= MAX_BODY_BYTES  # the server did send past the bound
        finally:
            await t.close()


async def test_an_endless_header_is_an_error_not_a_growing_buffer(sim_sshd_host: SimKit) -> None:
    t = ssh_transport(sim_sshd_host)
    async with serving(endless_header) as (port, _sent):
        try:
            r = await t.http_request("GET", f"http://127.0.0.1:{port}/v1/models", timeout_s=20)
        finally:
            await t.close()
    assert r.status is None and r.error is not None
    assert "response head longer than" in r.error


async def test_the_local_transport_reads_with_the_same_bounds() -> None:
    async with serving(endless_body) as (port, _sent):
        r = await LocalTransport("here").http_request(
            "GET", f"http://127.0.0.1:{port}/metrics", timeout_s=20
        )
    assert (r.status, r.truncated, len(r.body)) == (200, True, MAX_BODY_BYTES)
