"""The HTTP edge (``bot.slack.edge``) through the real bolt app: unsigned and oversize
requests, hostile headers, and what they cost in the log.

Before the edge, bolt verified requests itself: 100 unsigned 1 MiB posts wrote
104,872,000 bytes of log (each body whole, at INFO) and 300 lines (a body with two
newlines wrote three, two of them of the sender's choosing); a non-numeric timestamp
was a 500 with a traceback.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import aiohttp
import pytest

from bot.core.plan import Plan, PlannedStep, Step
from bot.core.status import Action, RunStatus, StepStatus
from bot.logging_setup import FORMAT
from bot.sim.kit import SimKit
from bot.slack.blocks import CardView, StepLine, run_card
from bot.slack.edge import (
    LINES_PER_MINUTE,
    MAX_AGE_S,
    MAX_BODY_BYTES,
    RejectionLog,
    RequestVerifier,
    printable,
)
from tests.fakes.slack_requests import signature
from tests.slack_harness import CHANNEL, SERVICE, SIGNING_SECRET, SlackBot, slack_bot
from tests.support.clock import ManualClock

FORGED = "2025-01-01 12:00:00,000 INFO bot.slack.front_end: run #1 approved by U0BOB"


class LogBytes(io.StringIO):
    """What the bot's stderr handler would write, counted."""

    @property
    def size(self) -> int:
        return len(self.getvalue().encode())

    @property
    def lines(self) -> list[str]:
        return self.getvalue().splitlines()


@pytest.fixture
def log() -> Iterator[LogBytes]:
    """The production log format on the root logger at INFO, as ``python -m bot`` logs."""
    stream = LogBytes()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


@pytest.fixture
async def bot(tmp_path: Path, sim_host: SimKit) -> AsyncIterator[SlackBot]:
    async with slack_bot(tmp_path, sim_host) as b:
        yield b


def unsigned_headers(**extra: str) -> dict[str, str]:
    return {
        "Content-Type": "application/x-www-form-urlencoded",
        "X-Slack-Request-Timestamp": str(int(time.time())),
        "X-Slack-Signature": "v0=" + "0" * 64,
        **extra,
    }


async def post(url: str, body: bytes, headers: dict[str, str]) -> int:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=body, headers=headers) as resp,
    ):
        await resp.read()
        return resp.status


async def raw_post(url: str, body: bytes, headers: dict[str, str]) -> int:
    """POST with the header bytes exactly as given (UTF-8), for what clients refuse."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        writer.write(
            f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n{head}"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 10)
    finally:
        writer.close()
    return int(status_line.split()[1])


async def test_an_unsigned_flood_costs_a_few_short_lines_and_forges_none(
    bot: SlackBot, log: LogBytes
) -> None:
    # A slash command body with a log line of the sender's inside, padded to 1 MiB.
    head = f"command=/vllm&text=help\n{FORGED}\n".encode()
    body = head + b"A" * (1024 * 1024 - len(head))
    assert len(body) == MAX_BODY_BYTES  # the largest body the edge reads at all

    async def sender(n: int) -> list[int]:
        return [await post(bot.url, body, unsigned_headers()) for _ in range(n)]

    statuses = await asyncio.gather(*(sender(10) for _ in range(10)))
    assert [s for batch in statuses for s in batch] == [401] * 100
    # Every line is short, escaped and the edge's own; none is the sender's.
    assert log.size < 4096, log.size  # was 104,872,000 bytes
    assert len(log.lines) == LINES_PER_MINUTE, log.lines  # was 300
    for line in log.lines:
        assert len(line) < 250 and "bad signature (1048576 bytes" in line, line
        assert "forged" not in line and "approved by" not in line
    # Nothing got past the edge: no command ran, nothing was recorded.
    assert await bot.runtime.audit.refusals() == []
    # A request Slack signed still works.
    res = await bot.command("help")
    assert res.status == 200 and "/vllm redeploy" in res.text


async def test_the_lines_not_logged_are_counted_at_the_end(
    tmp_path: Path, sim_host: SimKit, log: LogBytes
) -> None:
    async with slack_bot(tmp_path, sim_host) as bot:
        for _ in range(LINES_PER_MINUTE + 5):
            assert await post(bot.url, b"x=1", unsigned_headers()) == 401
    assert len(log.lines) == LINES_PER_MINUTE + 1
    assert "5 more refused Slack requests were not logged" in log.lines[-1]


async def test_an_oversize_body_is_refused_before_it_is_read(bot: SlackBot, log: LogBytes) -> None:
    # Signed by the real secret: size is checked before the signature, so it is a 413.
    body = b"x" * (MAX_BODY_BYTES + 1)
    ts = str(int(time.time()))
    signed = {
        **unsigned_headers(),
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": signature(SIGNING_SECRET, int(ts), body.decode()),
    }
    assert await post(bot.url, body, signed) == 413

    # A 100 MiB Content-Length with 5 bytes sent: the answer comes without the rest.
    url = urlsplit(bot.url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        writer.write(
            f"POST {url.path} HTTP/1.1\r\nHost: {url.netloc}\r\n"
            "Content-Type: application/x-www-form-urlencoded\r\n"
            f"Content-Length: {100 * 1024 * 1024}\r\n\r\nx=123".encode()
        )
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 10)
    finally:
        writer.close()
    assert status_line.startswith(b"HTTP/1.1 413"), status_line

    # Without a Content-Length (chunked), it stops reading at the bound.
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(MAX_BODY_BYTES // 65536 + 2):
            yield b"y" * 65536

    assert await post(bot.url, chunks(), unsigned_headers()) == 413  # type: ignore[arg-type]
    assert len(log.lines) == 3
    assert all("body too large" in line for line in log.lines), log.lines
    assert f"{100 * 1024 * 1024} bytes" in log.lines[1]


@pytest.mark.parametrize(
    "timestamp",
    [
        "abc",  # int() raised in bolt: a 500 and a traceback
        "",
        "1e9",
        "-5",
        "+1700000000",  # int() takes the sign
        "\uff11\uff12\uff13",  # fullwidth digits: int() takes them
        "9" * 5000,  # int() refuses more than 4,300 digits
        "12\xe9",  # a header byte over 127
    ],
)
async def test_a_malformed_timestamp_is_a_401_with_one_short_line(
    bot: SlackBot, log: LogBytes, timestamp: str
) -> None:
    # Raw bytes on the socket: aiohttp's client refuses to send control characters.
    headers = unsigned_headers(**{"X-Slack-Request-Timestamp": timestamp})
    status = await raw_post(bot.url, b"command=/vllm&text=help", headers)
    assert status == 401
    [line] = log.lines
    assert "malformed timestamp" in line and len(line) < 250
    assert "Traceback" not in log.getvalue() and "\x1b" not in line


async def test_a_control_character_in_a_header_is_a_400_with_one_short_line(
    bot: SlackBot, log: LogBytes
) -> None:
    # aiohttp's parser refuses it before any handler runs (and logged a traceback).
    headers = unsigned_headers(**{"X-Slack-Request-Timestamp": "12\x1b[31m\x7f"})
    assert await raw_post(bot.url, b"x=1", headers) == 400
    [line] = log.lines
    assert "unparsable HTTP (400: Invalid header value char" in line, line
    assert "Traceback" not in log.getvalue() and "\x1b" not in log.getvalue()


@pytest.mark.parametrize(
    "sig", ["", "v0=", "v0=" + "é" * 64, "v1=" + "0" * 64, "v0=" + "0" * 63, "v0=" + "G" * 64]
)
async def test_a_malformed_signature_is_a_401_with_one_short_line(
    bot: SlackBot, log: LogBytes, sig: str
) -> None:
    assert await post(bot.url, b"x=1", unsigned_headers(**{"X-Slack-Signature": sig})) == 401
    [line] = log.lines
    assert "malformed signature" in line and "Traceback" not in log.getvalue()


async def test_the_largest_card_a_click_can_carry_is_accepted(bot: SlackBot) -> None:
    """The bound is no smaller than Slack's own clicks: a running card for 64 hosts with
    every checklist section full of non-ASCII step summaries (9 bytes a character once
    URL-encoded), clicked, reaches the app."""
    hosts = tuple(f"gpu-node-{i:02d}.dc1.example.internal" for i in range(1, 65))
    steps = tuple(PlannedStep(step, f"command for {step}") for step in list(Step)[:8])
    plan = Plan(
        action=Action.REDEPLOY,
        service=SERVICE,
        hosts=hosts,
        unit="vllm-kimi-k25",
        package="vllm",
        version="0.31.0",
        spec="vllm==0.31.0",
        index_name=None,
        index_url=None,
        steps=steps,
        dry_run=False,
        batch_size=1,
    )
    summary = "\u663e" * 400  # a host's message in Chinese
    card = run_card(
        CardView(
            run_id=1,
            plan=plan,
            requested_by="U0ALICE",
            status=RunStatus.RUNNING,
            summary=summary,
            steps=tuple(
                StepLine(h, s.step, StepStatus.FAILED, 1.0, summary) for h in hosts for s in steps
            ),
        )
    )
    # Posted for real, so the fake checks it is a message Slack takes; the click carries
    # it back as Slack's would.
    ts = await bot.front_end.poster.post(CHANNEL, card)
    payload = bot.fake.block_action("cancel", "1", channel_id=CHANNEL, message_ts=ts)
    # JSON with non-ASCII escaped (\uXXXX) or sent as UTF-8: the larger of the two.
    escaped = bot.signer.interactive_body(payload)
    utf8 = urlencode({"payload": json.dumps(payload, separators=(",", ":"), ensure_ascii=False)})
    largest = max(escaped, utf8, key=lambda body: len(body.encode()))
    assert 600_000 < len(largest.encode()) < MAX_BODY_BYTES
    res = await bot.signer.sign(largest).post(bot.url)
    assert res.status == 200


def test_rejection_log_lines_per_minute_then_a_count() -> None:
    clock = ManualClock()
    logger = logging.getLogger("test.edge.rejections")
    stream = LogBytes()
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        rejections = RejectionLog(logger, per_minute=3, clock=clock)
        for i in range(7):
            rejections(f"line {i}")
        assert stream.lines == ["line 0", "line 1", "line 2"]
        clock.advance(59)
        rejections("line 7")  # still the same minute
        clock.advance(1)
        rejections("line 8")
        assert stream.lines[3:] == [
            "5 more refused Slack requests were not logged (at most 3 lines a minute)",
            "line 8",
        ]
        rejections.flush()  # nothing held back: no line
        assert len(stream.lines) == 5
    finally:
        logger.removeHandler(handler)


def test_printable_escapes_and_cuts() -> None:
    assert printable("1700000000") == "1700000000"
    assert printable("a\nb\r\x1b[31m\x00") == "a\\nb\\r\\x1b[31m\\x00"
    assert printable("\u2028\u663e") == "\\u2028\\u663e"
    assert printable("x" * 100, 10) == "x" * 10 + "..."


def test_verifier_answers_every_shape_without_raising() -> None:
    now = 1_700_000_000
    verifier = RequestVerifier(SIGNING_SECRET, clock=lambda: float(now))
    body = b"command=/vllm&text=help"
    good = signature(SIGNING_SECRET, now, body.decode())
    assert verifier.check(str(now), good, body) is None
    old = now - MAX_AGE_S - 1
    cases = {
        (None, good): "no signature",
        (str(now), None): "no signature",
        ("12x", good): "malformed timestamp",
        (str(old), signature(SIGNING_SECRET, old, body.decode())): "stale timestamp",
        (str(now + MAX_AGE_S + 1), good): "stale timestamp",
        (str(now), good.upper()): "malformed signature",
        (str(now), signature("another-secret", now, body.decode())): "bad signature",
        (str(now - 1), good): "bad signature",
    }
    for (ts, sig), reason in cases.items():
        refusal = verifier.check(ts, sig, body)
        assert refusal is not None and (refusal.status, refusal.reason) == (401, reason)
    assert verifier.check(str(now), good, body + b"&x=1") is not None
    with pytest.raises(ValueError, match="signing secret"):
        RequestVerifier("")
