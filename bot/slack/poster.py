"""The one way text leaves for Slack: ``Poster`` redacts every string (text and
blocks) and paces ``chat.postMessage`` per channel; which Slack errors are worth a retry."""

from __future__ import annotations

import asyncio
import copy
import heapq
import itertools
import logging
import re
import time
from collections.abc import Awaitable, Callable
from enum import IntEnum
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError, SlackRequestError
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack.blocks import Message

log = logging.getLogger(__name__)

Redact = Callable[[str], str]

# Slack errors that a later retry can fix; anything else is a bug in what we sent
# (or a missing permission), so retrying it forever would only block the queue.
_TRANSIENT_ERRORS = frozenset(
    {"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout"}
)
# Redacting a large log takes a while: do it off the event loop.
_THREAD_REDACT_CHARS = 256 * 1024


# What a Slack call can raise when Slack (or the way to it) fails: the API's answer,
# a failed upload, or the connection.
SLACK_ERRORS = (SlackApiError, SlackRequestError, aiohttp.ClientError, OSError, TimeoutError)


# slack_sdk reports a failed POST to the upload URL only in the message of a SlackRequestError.
_UPLOAD_STATUS = re.compile(r"Failed to upload a file \(status: (\d+)")
# What Slack answers when a message or file is too big: a retry sends the same bytes again.
_TOO_LARGE_ERRORS = frozenset({"request_too_large", "file_too_large", "msg_too_long"})


def _http_status(exc: BaseException) -> int | None:
    if isinstance(exc, SlackApiError):
        # An AsyncSlackResponse has status_code; a body that was not JSON leaves aiohttp's own.
        status = getattr(exc.response, "status_code", None) or getattr(exc.response, "status", None)
        return status if isinstance(status, int) else None
    if isinstance(exc, SlackRequestError):
        match = _UPLOAD_STATUS.search(str(exc))
        return int(match[1]) if match else None
    return None


def _api_error(exc: BaseException) -> str | None:
    if isinstance(exc, SlackApiError) and hasattr(exc.response, "get"):
        error = exc.response.get("error")
        return error if isinstance(error, str) else None
    return None


def too_large(exc: BaseException) -> bool:
    """Whether Slack refused what was sent for its size (HTTP 413 or an error saying so)."""
    return _http_status(exc) == 413 or _api_error(exc) in _TOO_LARGE_ERRORS


def is_transient(exc: BaseException) -> bool:
    """Whether a failed Slack call is worth retrying later."""
    if too_large(exc):
        return False
    status = _http_status(exc)
    if isinstance(exc, SlackApiError):
        return status in (408, 429) or (status or 0) >= 500 or _api_error(exc) in _TRANSIENT_ERRORS
    if isinstance(exc, SlackRequestError):
        # A failed upload POST is worth a retry only for the statuses that mean "later";
        # slack_sdk's other request errors are arguments it refused, which a retry repeats.
        return status is not None and (status in (408, 429) or status >= 500)
    # Connection refused/reset, timeouts.
    return isinstance(exc, aiohttp.ClientError | OSError | TimeoutError)


def _redact_blocks(value: Any, redact: Redact) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redact_blocks(v, redact) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_blocks(v, redact) for v in value]
    return value


class Priority(IntEnum):
    """Who goes first when posts queue for a channel's next slot (lower first)."""

    # Approval cards, run thread replies and their files: what people wait on to act.
    RUN = 0
    # Answers to read-only commands (gpus, status, logs, audit): anyone in the channel
    # can ask for them, so a flood of them must never hold a card back.
    ANSWER = 1


class _Lane:
    """One channel's queue: who waits for its next posting slot, and when that is."""

    def __init__(self) -> None:
        self.waiting: list[tuple[int, int]] = []  # a heap of (priority, arrival)
        self.next_slot = 0.0
        self.changed = asyncio.Event()

    def notify(self) -> None:
        # Wake everyone waiting on the current event; later waiters take a fresh one.
        self.changed.set()
        self.changed = asyncio.Event()


class Poster:
    """Redacted, paced Slack Web API calls.

    Posts to a channel go out at most one per ``post_interval_s``; when several wait,
    the slot goes to the most urgent (``Priority``), first come first served within a
    priority.  ``answers()`` is the same poster for read-only answers."""

    def __init__(
        self,
        client: AsyncWebClient,
        redact: Redact,
        *,
        post_interval_s: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.client = client
        self.redact = redact
        self.post_interval_s = post_interval_s
        self.priority = Priority.RUN
        self._clock = clock
        self._sleep = sleep
        self._lanes: dict[str, _Lane] = {}
        self._arrivals = itertools.count()

    def answers(self) -> Poster:
        """This poster (same client, same channel queues) for read-only answers: they
        take a channel's slot only when no card or run update waits for it."""
        view = copy.copy(self)
        view.priority = Priority.ANSWER
        return view

    def waiting(self, channel: str) -> int:
        """How many posts wait for ``channel``'s next slot."""
        lane = self._lanes.get(channel)
        return len(lane.waiting) if lane is not None else 0

    async def _pace(self, channel: str) -> None:
        lane = self._lanes.setdefault(channel, _Lane())
        me = (int(self.priority), next(self._arrivals))
        heapq.heappush(lane.waiting, me)
        try:
            while True:
                changed = lane.changed
                if lane.waiting[0] == me:
                    now = self._clock()
                    if now >= lane.next_slot:
                        lane.next_slot = now + self.post_interval_s
                        return
                    # Checked again after the sleep: a more urgent post may have come.
                    await self._sleep(lane.next_slot - now)
                else:
                    await changed.wait()
        finally:
            # Served, or cancelled while waiting: either way the next one may go.
            lane.waiting.remove(me)
            heapq.heapify(lane.waiting)
            lane.notify()

    def clean(self, msg: Message) -> tuple[str, list[dict[str, Any]]]:
        return self.redact(msg.text), _redact_blocks(msg.blocks, self.redact)

    async def post(self, channel: str, msg: Message, *, thread_ts: str | None = None) -> str:
        text, blocks = self.clean(msg)
        await self._pace(channel)
        resp = await self.client.chat_postMessage(
            channel=channel,
            text=text,
            blocks=blocks,
            thread_ts=thread_ts,
            unfurl_links=False,
            unfurl_media=False,
        )
        return str(resp["ts"])

    async def permalink(self, channel: str, ts: str) -> str | None:
        """A link to a message, or None when Slack cannot give one right now."""
        try:
            resp = await self.client.chat_getPermalink(channel=channel, message_ts=ts)
        except (SlackApiError, aiohttp.ClientError, OSError, TimeoutError):
            return None
        link = resp.get("permalink")
        return str(link) if link else None

    async def update(self, channel: str, ts: str, msg: Message) -> None:
        text, blocks = self.clean(msg)
        await self.client.chat_update(channel=channel, ts=ts, text=text, blocks=blocks)

    async def upload(
        self, channel: str, *, filename: str, content: str, title: str, thread_ts: str | None = None
    ) -> None:
        # The share is a message in the channel too: it takes a posting slot.
        await self._pace(channel)
        # Off the event loop when large: a 16 MiB log takes about a second to redact.
        content = await redact_large(self.redact, content)
        await self.client.files_upload_v2(
            channel=channel,
            thread_ts=thread_ts,
            filename=filename,
            title=self.redact(title),
            content=content,
        )


async def redact_large(redact: Redact, text: str) -> str:
    if len(text) > _THREAD_REDACT_CHARS:
        return await asyncio.to_thread(redact, text)
    return redact(text)
