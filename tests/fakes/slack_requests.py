"""Requests exactly as Slack POSTs them to an HTTP-mode bolt app, signed with the v0 scheme.

Slack signs `v0:{timestamp}:{raw body}` with HMAC-SHA256 under the app's signing secret and
sends `X-Slack-Signature: v0=<hex>` and `X-Slack-Request-Timestamp`. Bolt rejects (401) a bad
signature and any timestamp more than five minutes away from its clock.

The payload builders are shared with Socket Mode, which carries the same payloads inside
envelopes (slash commands as a flat dict of strings, interactions as the JSON object).
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlencode

import aiohttp

DEFAULT_TEAM_ID = "T0FAKE"
DEFAULT_TEAM_DOMAIN = "fake-team"
DEFAULT_APP_ID = "A0FAKE"
DEFAULT_USER_ID = "U0ALICE"
DEFAULT_USER_NAME = "alice"
DEFAULT_CHANNEL_ID = "C0OPS"
DEFAULT_CHANNEL_NAME = "ops"
# Slack still sends the deprecated verification token in every payload.
VERIFICATION_TOKEN = "fake-verification-token"
# Bolt's limit (slack_sdk.signature.SignatureVerifier): five minutes.
STALE_AFTER_S = 5 * 60

_trigger_ids = itertools.count(1)


def _trigger_id() -> str:
    return f"{next(_trigger_ids)}.{DEFAULT_TEAM_ID}.fake{time.monotonic_ns()}"


def slash_command_payload(
    text: str,
    *,
    response_url: str,
    command: str = "/vllm",
    user_id: str = DEFAULT_USER_ID,
    user_name: str = DEFAULT_USER_NAME,
    channel_id: str = DEFAULT_CHANNEL_ID,
    channel_name: str = DEFAULT_CHANNEL_NAME,
    team_id: str = DEFAULT_TEAM_ID,
    team_domain: str = DEFAULT_TEAM_DOMAIN,
    api_app_id: str = DEFAULT_APP_ID,
    trigger_id: str | None = None,
) -> dict[str, str]:
    """The fields Slack sends for a slash command, all strings as in the form body."""
    return {
        "token": VERIFICATION_TOKEN,
        "team_id": team_id,
        "team_domain": team_domain,
        "channel_id": channel_id,
        "channel_name": channel_name,
        "user_id": user_id,
        "user_name": user_name,
        "command": command,
        "text": text,
        "api_app_id": api_app_id,
        "is_enterprise_install": "false",
        "response_url": response_url,
        "trigger_id": trigger_id or _trigger_id(),
    }


def _find_block_id(message: Mapping[str, Any], action_id: str) -> str | None:
    blocks: Sequence[Mapping[str, Any]] = message.get("blocks") or []
    for block in blocks:
        elements = block.get("elements") or []
        accessory = block.get("accessory")
        if accessory is not None:
            elements = [*elements, accessory]
        if any(e.get("action_id") == action_id for e in elements if isinstance(e, Mapping)):
            block_id = block.get("block_id")
            return str(block_id) if block_id is not None else None
    return None


def block_actions_payload(
    *,
    action_id: str,
    value: str,
    response_url: str,
    message: Mapping[str, Any] | None = None,
    message_ts: str | None = None,
    block_id: str | None = None,
    user_id: str = DEFAULT_USER_ID,
    user_name: str = DEFAULT_USER_NAME,
    channel_id: str = DEFAULT_CHANNEL_ID,
    channel_name: str = DEFAULT_CHANNEL_NAME,
    team_id: str = DEFAULT_TEAM_ID,
    team_domain: str = DEFAULT_TEAM_DOMAIN,
    api_app_id: str = DEFAULT_APP_ID,
    button_text: str = "button",
) -> dict[str, Any]:
    """A button click on a message, as Slack's `block_actions` payload.

    Pass the stored `message` (e.g. `FakeSlack.message(...)`) so the payload carries the real
    blocks and ts the bot posted; the `block_id` is then looked up from them.
    """
    if message is None:
        if message_ts is None:
            raise ValueError("block_actions_payload needs message or message_ts")
        message = {"type": "message", "ts": message_ts, "text": ""}
    ts = str(message["ts"])
    resolved_block_id = block_id or _find_block_id(message, action_id) or "fake-block"
    action_ts = f"{time.time():.6f}"
    return {
        "type": "block_actions",
        "user": {"id": user_id, "username": user_name, "name": user_name, "team_id": team_id},
        "api_app_id": api_app_id,
        "token": VERIFICATION_TOKEN,
        "container": {
            "type": "message",
            "message_ts": ts,
            "channel_id": channel_id,
            "is_ephemeral": False,
        },
        "trigger_id": _trigger_id(),
        "team": {"id": team_id, "domain": team_domain},
        "enterprise": None,
        "is_enterprise_install": False,
        "channel": {"id": channel_id, "name": channel_name},
        "message": dict(message),
        "state": {"values": {}},
        "response_url": response_url,
        "actions": [
            {
                "action_id": action_id,
                "block_id": resolved_block_id,
                "text": {"type": "plain_text", "text": button_text, "emoji": True},
                "value": value,
                "type": "button",
                "action_ts": action_ts,
            }
        ],
    }


def signature(signing_secret: str, timestamp: int, body: str) -> str:
    base = f"v0:{timestamp}:{body}".encode()
    return "v0=" + hmac.new(signing_secret.encode(), base, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class PostResult:
    status: int
    text: str


@dataclass(frozen=True)
class SignedRequest:
    """A form-encoded body plus the headers Slack would send with it."""

    body: str
    headers: Mapping[str, str]

    def with_bad_signature(self) -> SignedRequest:
        sig = self.headers["X-Slack-Signature"]
        # Same length and prefix, one hex digit changed: only the HMAC check can catch it.
        flipped = sig[:-1] + ("0" if sig[-1] != "0" else "1")
        return replace(self, headers={**self.headers, "X-Slack-Signature": flipped})

    async def post(self, url: str) -> PostResult:
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=self.body.encode(), headers=dict(self.headers)) as resp,
        ):
            return PostResult(status=resp.status, text=await resp.text())


class SlackSigner:
    """Builds signed requests for an app configured with `signing_secret`."""

    def __init__(self, signing_secret: str, *, clock: Callable[[], float] = time.time) -> None:
        self.signing_secret = signing_secret
        self._clock = clock

    def sign(self, body: str, *, timestamp: int | None = None) -> SignedRequest:
        ts = int(self._clock()) if timestamp is None else timestamp
        return SignedRequest(
            body=body,
            headers={
                "Content-Type": "application/x-www-form-urlencoded",
                "X-Slack-Request-Timestamp": str(ts),
                "X-Slack-Signature": signature(self.signing_secret, ts, body),
                "User-Agent": "Slackbot 1.0 (+https://api.slack.com/robots)",
            },
        )

    def sign_stale(self, body: str) -> SignedRequest:
        """Correctly signed but with a timestamp older than bolt's five-minute window."""
        return self.sign(body, timestamp=int(self._clock()) - STALE_AFTER_S - 60)

    @staticmethod
    def slash_command_body(payload: Mapping[str, str]) -> str:
        return urlencode(payload)

    @staticmethod
    def interactive_body(payload: Mapping[str, Any]) -> str:
        return urlencode({"payload": json.dumps(payload, separators=(",", ":"))})

    def slash_command(self, payload: Mapping[str, str]) -> SignedRequest:
        return self.sign(self.slash_command_body(payload))

    def interactive(self, payload: Mapping[str, Any]) -> SignedRequest:
        return self.sign(self.interactive_body(payload))
