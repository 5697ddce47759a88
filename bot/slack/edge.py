"""The HTTP edge: what a request must pass before bolt sees any of it.

Slack signs every request it sends (``v0=`` HMAC-SHA256 of ``v0:{timestamp}:{raw body}``
under the app's signing secret).  Bolt's own check comes too late and says too much: its
aiohttp adapter parses the body before verifying it (an unsigned ``payload=`` that is not
JSON is a 500 with a traceback), a non-numeric ``X-Slack-Request-Timestamp`` makes
``int()`` raise (another 500), and a request that fails the check is logged at INFO with
its whole body (100 unsigned 1 MiB posts wrote 105 MB of log, and a newline in a body
wrote a line of the sender's choosing).

So the bot verifies here, on the raw bytes, and hands bolt only what Slack signed (the
app is built with bolt's own check off, see ``bot.slack.app.create_app``):

* A body over ``MAX_BODY_BYTES`` is refused with 413 from its ``Content-Length`` before
  a byte of it is read (or as soon as a chunked one passes the bound): no parsing, no
  HMAC over it.
* A missing or malformed timestamp or signature, a timestamp more than five minutes
  away, or a signature that does not match is a 401.
* A refused request costs one short log line: no body, every header value escaped (no
  newline or control character survives) and cut short; at most ``lines_per_minute``
  such lines a minute, then one line saying how many more were not logged.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest

log = logging.getLogger(__name__)
# What aiohttp's server logs through (its errors for requests it cannot parse).
SERVER_LOG = logging.getLogger(f"{__name__}.server")

# The largest request Slack sends this bot is a click: its block_actions payload carries
# the whole message the button is on, as URL-encoded JSON.  The biggest card the card
# builders can make (a running card for 64 hosts, 30 checklist sections of 3,000
# characters, every summary non-ASCII so each character costs 9 bytes once encoded)
# makes a click of about 0.7 MB (tests/test_slack_edge.py builds it); slash commands are
# a few hundred bytes.  1 MiB keeps every click Slack can send us and refuses the rest.
MAX_BODY_BYTES = 1024 * 1024
# Slack's replay window, and bolt's: a request signed longer ago than this is refused.
MAX_AGE_S = 5 * 60
LINES_PER_MINUTE = 10
_WINDOW_S = 60.0
# What a header value may show in a log line (escaped), so a line stays short.
_SHOWN_CHARS = 40
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_SIGNATURE = re.compile(r"v0=[0-9a-f]{64}")

Clock = Callable[[], float]


def printable(text: str, limit: int = _SHOWN_CHARS) -> str:
    """``text`` as it may appear in a log line: at most ``limit`` characters, and every
    newline, control or non-ASCII character written as an escape (``\\n``, ``\\x1b``)."""
    shown = text[:limit].encode("unicode_escape").decode("ascii")
    return shown + ("..." if len(text) > limit else "")


class RejectionLog:
    """One short line per refused request, at most ``per_minute`` lines a minute; the
    first line after a full minute says how many were not logged (so does ``flush``)."""

    def __init__(
        self,
        logger: logging.Logger = log,
        *,
        per_minute: int = LINES_PER_MINUTE,
        clock: Clock = time.monotonic,
    ) -> None:
        self.logger = logger
        self.per_minute = per_minute
        self._clock = clock
        self._window_start: float | None = None
        self._logged = 0
        self.suppressed = 0

    def __call__(self, line: str) -> None:
        now = self._clock()
        if self._window_start is None or now - self._window_start >= _WINDOW_S:
            self.flush()
            self._window_start = now
            self._logged = 0
        if self._logged < self.per_minute:
            self._logged += 1
            self.logger.warning("%s", line)
        else:
            self.suppressed += 1

    def flush(self) -> None:
        if self.suppressed:
            self.logger.warning(
                "%d more refused Slack requests were not logged (at most %d lines a minute)",
                self.suppressed,
                self.per_minute,
            )
            self.suppressed = 0


@dataclass(frozen=True)
class Refusal:
    status: int
    reason: str


class RequestVerifier:
    """Slack's v0 signature check on the raw body, with every input checked for shape
    first: whatever the headers hold, the answer is a ``Refusal`` or ``None``, never an
    exception."""

    def __init__(self, signing_secret: str, *, clock: Clock = time.time) -> None:
        if not signing_secret:
            raise ValueError("the signing secret must not be empty")
        self._secret = signing_secret.encode()
        self._clock = clock

    def check(self, timestamp: str | None, signature: str | None, body: bytes) -> Refusal | None:
        if timestamp is None or signature is None:
            return Refusal(401, "no signature")
        if not _TIMESTAMP.fullmatch(timestamp):
            return Refusal(401, "malformed timestamp")
        if abs(self._clock() - int(timestamp)) > MAX_AGE_S:
            return Refusal(401, "stale timestamp")
        if not _SIGNATURE.fullmatch(signature):
            return Refusal(401, "malformed signature")
        base = b"v0:" + timestamp.encode() + b":" + body
        expected = "v0=" + hmac.new(self._secret, base, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, signature):
            return Refusal(401, "bad signature")
        return None


async def _read_bounded(request: web.Request, limit: int) -> bytes | None:
    """The body, or None as soon as it is longer than ``limit`` (what was read is dropped)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _refused(refusal: Refusal) -> web.Response:
    resp = web.json_response(
        {"error": "invalid request" if refusal.status == 401 else "request body too large"},
        status=refusal.status,
    )
    if refusal.status == 413:
        # The rest of the body is never read: close rather than keep the connection.
        resp.force_close()
    return resp


class SlackEdge:
    """The aiohttp handler in front of ``app``: bounded body, verified signature, then
    bolt with the verified bytes."""

    def __init__(
        self,
        app: AsyncApp,
        verifier: RequestVerifier,
        *,
        max_body: int = MAX_BODY_BYTES,
        rejections: RejectionLog | None = None,
    ) -> None:
        self.app = app
        self.verifier = verifier
        self.max_body = max_body
        self.rejections = rejections if rejections is not None else RejectionLog()

    def _refuse(self, request: web.Request, refusal: Refusal, size: str) -> web.Response:
        timestamp = request.headers.get("X-Slack-Request-Timestamp")
        shown = "none" if timestamp is None else repr(printable(timestamp))
        self.rejections(
            f"refused a request from {printable(request.remote or '?')}: "
            f"{refusal.reason} ({size}, timestamp {shown})"
        )
        return _refused(refusal)

    async def handle(self, request: web.Request) -> web.Response:
        length = request.content_length
        if length is not None and length > self.max_body:
            return self._refuse(request, Refusal(413, "body too large"), f"{length} bytes")
        body = await _read_bounded(request, self.max_body)
        if body is None:
            return self._refuse(
                request, Refusal(413, "body too large"), f"over {self.max_body} bytes"
            )
        refusal = self.verifier.check(
            request.headers.get("X-Slack-Request-Timestamp"),
            request.headers.get("X-Slack-Signature"),
            body,
        )
        if refusal is not None:
            return self._refuse(request, refusal, f"{len(body)} bytes")
        headers: dict[str, str | Sequence[str]] = {
            name: request.headers.getall(name) for name in request.headers
        }
        bolt_req = AsyncBoltRequest(
            body=body.decode("utf-8", errors="replace"), query=request.query_string, headers=headers
        )
        return await to_aiohttp_response(await self.app.async_dispatch(bolt_req))


class _UnparsableRequests(logging.Filter):
    """aiohttp answers 400 to a request it cannot parse (a control character in a
    header, a broken request line) before any handler runs, and logs it at ERROR with a
    traceback quoting the bytes: here that is one rate-limited short line instead."""

    def __init__(self, rejections: RejectionLog) -> None:
        super().__init__()
        self.rejections = rejections

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        peer = str(args[0]) if args else "?"
        what = exc.message.strip().splitlines()[0] if exc.message.strip() else "?"
        self.rejections(
            f"refused a request from {printable(peer)}: "
            f"unparsable HTTP ({exc.code}: {printable(what)})"
        )
        return False


def runner(
    app: AsyncApp,
    *,
    path: str,
    signing_secret: str,
    clock: Clock = time.time,
    max_body: int = MAX_BODY_BYTES,
    rejections: RejectionLog | None = None,
) -> web.AppRunner:
    """An aiohttp runner serving ``app`` at ``path`` behind the edge checks."""
    edge = SlackEdge(
        app, RequestVerifier(signing_secret, clock=clock), max_body=max_body, rejections=rejections
    )
    # aiohttp's own bound on a body read through it; the edge reads the body itself.
    web_app = web.Application(client_max_size=max_body)
    web_app.add_routes([web.post(path, edge.handle)])
    unparsable = _UnparsableRequests(edge.rejections)
    SERVER_LOG.addFilter(unparsable)

    async def cleanup(_: web.Application) -> None:
        SERVER_LOG.removeFilter(unparsable)
        edge.rejections.flush()

    web_app.on_cleanup.append(cleanup)
    return web.AppRunner(web_app, access_log=None, logger=SERVER_LOG)
