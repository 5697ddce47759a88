"""A small HTTP/1.1 client over any byte stream, with bounded reads: what the
transports use for requests made from the host's side (an SSH direct-tcpip channel,
or a local socket). ``exchange`` is the whole request for both; each transport only
opens its stream and says what its own connection errors mean.

Why not a library: the stream is an asyncssh channel, not a socket an HTTP library
opens itself, and every byte the model server sends must be bounded.  A server that
sends an endless header or body (a broken proxy, a runaway stream) must not grow the
bot's memory, so the head is read up to ``MAX_HEAD_BYTES`` and the body up to
``max_body`` bytes (``MAX_BODY_BYTES`` by default); past that the response is cut,
marked ``truncated``, and the connection closed without reading the rest.
Bodies may come with ``Content-Length``, chunked, or delimited by the connection's end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from bot.core.results import HttpResult

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 1024 * 1024
# A chunk-size line is a hex number and optional extensions: a few bytes.
_MAX_CHUNK_LINE = 1024
_READ = 64 * 1024
USER_AGENT = "vllm-chatops"


class HttpProtocolError(Exception):
    """The server's answer is not an HTTP response we can read (the message says why)."""


class ByteReader(Protocol):
    async def read(self, n: int = -1) -> bytes: ...


class ByteWriter(Protocol):
    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...


# Opens a byte stream to (host, port) as the transport reaches it.
OpenStream = Callable[[str, int], Awaitable[tuple[ByteReader, ByteWriter]]]


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    body: bytes
    truncated: bool = False  # the body went on past the bound and was cut there


def split_url(url: str) -> tuple[str, int, str]:
    """(host, port, path with query) of an http:// URL."""
    parts = urlsplit(url)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return parts.hostname or "127.0.0.1", parts.port or 80, path


def request_bytes(
    method: str,
    host: str,
    port: int,
    path: str,
    *,
    body: bytes | None = None,
    content_type: str | None = None,
) -> bytes:
    """One request with ``Connection: close``: the server ends the stream after it."""
    lines = [
        f"{method} {path} HTTP/1.1",
        f"Host: {host}:{port}",
        "Connection: close",
        f"User-Agent: {USER_AGENT}",
        "Accept: */*",
    ]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
        if content_type:
            lines.append(f"Content-Type: {content_type}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + (body or b"")


class _Buffered:
    """Reads from the stream into a buffer that never holds more than asked for plus
    one read."""

    def __init__(self, reader: ByteReader) -> None:
        self.reader = reader
        self.buf = bytearray()
        self.eof = False

    async def fill(self) -> bool:
        """One more read; False at the end of the stream."""
        if self.eof:
            return False
        data = await self.reader.read(_READ)
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    async def until(self, sep: bytes, limit: int, what: str) -> bytes:
        """Everything up to ``sep`` (removed from the buffer, ``sep`` too); at most
        ``limit`` bytes are ever looked at."""
        while True:
            at = self.buf.find(sep)
            if at >= 0:
                out = bytes(self.buf[:at])
                del self.buf[: at + len(sep)]
                return out
            if len(self.buf) > limit:
                raise HttpProtocolError(f"{what} longer than {limit:,} bytes")
            if not await self.fill():
                raise HttpProtocolError(f"the connection closed inside the {what}")

    async def take(self, n: int) -> bytes:
        """Up to ``n`` bytes (fewer only at the end of the stream)."""
        while len(self.buf) < n and await self.fill():
            pass
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out


def parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    """The status code and headers of a response head (without its blank line)."""
    text = head.decode("latin-1")
    status_line, _, rest = text.partition("\r\n")
    parts = status_line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise HttpProtocolError(f"not an HTTP response: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    for line in rest.split("\r\n"):
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


async def _chunked(buf: _Buffered, max_body: int) -> tuple[bytes, bool]:
    body = bytearray()
    while True:
        line = await buf.until(b"\r\n", _MAX_CHUNK_LINE, "chunk size line")
        size_text = line.split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise HttpProtocolError(f"bad chunk size {size_text[:20]!r}") from None
        if size == 0:
            return bytes(body), False
        room = max_body - len(body)
        body += await buf.take(min(size, room))
        if size > room:
            return bytes(body), True
        await buf.take(2)  # the CRLF after the chunk


async def _body(buf: _Buffered, headers: dict[str, str], max_body: int) -> tuple[bytes, bool]:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return await _chunked(buf, max_body)
    length = headers.get("content-length")
    if length is not None and length.strip().isdigit():
        n = int(length)
        return await buf.take(min(n, max_body)), n > max_body
    # Delimited by the end of the connection: read one byte past the bound to tell.
    data = await buf.take(max_body + 1)
    return data[:max_body], len(data) > max_body


async def read_response(
    reader: ByteReader,
    *,
    method: str = "GET",
    max_body: int = MAX_BODY_BYTES,
    max_head: int = MAX_HEAD_BYTES,
) -> Response:
    """Read one response, bounded (see the module doc); raises HttpProtocolError for
    an answer that is not HTTP, a head past ``max_head`` or a stream cut inside it."""
    buf = _Buffered(reader)
    while True:
        head = await buf.until(b"\r\n\r\n", max_head, "response head")
        status, headers = parse_head(head)
        if not 100 <= status < 200:
            break  # a 1xx interim answer is followed by the real one
    if method == "HEAD" or status in (204, 304):
        return Response(status, headers, b"")
    body, truncated = await _body(buf, headers, max_body)
    return Response(status, headers, body, truncated)


async def exchange(
    open_stream: OpenStream,
    method: str,
    url: str,
    *,
    timeout_s: float,
    body: bytes | None = None,
    content_type: str | None = None,
) -> HttpResult:
    """One request over a stream ``open_stream`` opens, the answer read with the bounds
    above, all within ``timeout_s``. No answer in time, or one that is not HTTP, is an
    ``HttpResult`` with its error; what opening or reading the stream raises otherwise
    (refused, closed, the connection lost) is for the transport to name."""
    host, port, path = split_url(url)
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await open_stream(host, port)
            try:
                writer.write(
                    request_bytes(method, host, port, path, body=body, content_type=content_type)
                )
                # What is left unread goes when the stream closes.
                response = await read_response(reader, method=method)
            finally:
                writer.close()
    except TimeoutError:
        return HttpResult(url, None, error=f"no response within {timeout_s:g}s")
    except HttpProtocolError as e:
        return HttpResult(url, None, error=str(e))
    return HttpResult(
        url,
        response.status,
        body=response.body.decode("utf-8", "replace"),
        truncated=response.truncated,
    )
