"""The fake Slack, checked through the real slack_sdk and slack_bolt clients."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.async_handler import AsyncRetryHandler
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
)
from slack_sdk.http_retry.builtin_interval_calculators import FixedValueRetryIntervalCalculator
from slack_sdk.http_retry.request import HttpRequest
from slack_sdk.http_retry.response import HttpResponse
from slack_sdk.http_retry.state import RetryState
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.webhook.async_client import AsyncWebhookClient

from tests.support.clock import ManualClock

from .slack_api import FakeSlack
from .slack_requests import SlackSigner

SIGNING_SECRET = "fake-signing-secret"
CHANNEL = "C0OPS"


def client_for(fake: FakeSlack, **kwargs: Any) -> AsyncWebClient:
    return AsyncWebClient(token=fake.bot_token, base_url=fake.base_url, **kwargs)


async def test_ok_envelope_and_call_recording(fake: FakeSlack) -> None:
    client = client_for(fake)
    auth = await client.auth_test()
    assert auth["ok"] is True
    assert auth["user_id"] == fake.bot_user_id
    assert auth["bot_id"] == fake.bot_id
    assert auth.headers["X-Slack-Req-Id"]

    posted = await client.chat_postMessage(channel=CHANNEL, text="hello")
    assert posted["channel"] == CHANNEL
    assert posted["message"]["text"] == "hello"
    call = fake.calls("chat.postMessage")[0]
    assert call.json is not None and call.json["text"] == "hello"
    assert call.token == fake.bot_token

    group = await client.usergroups_users_list(usergroup="S0OPS")
    assert group["users"] == ["U0ALICE", "U0BOB"]
    assert fake.calls("usergroups.users.list")[0].params["usergroup"] == "S0OPS"


async def test_auth_and_lookup_errors_raise(fake: FakeSlack) -> None:
    bad = AsyncWebClient(token="xoxb-wrong", base_url=fake.base_url)
    with pytest.raises(SlackApiError) as exc:
        await bad.auth_test()
    assert exc.value.response["error"] == "invalid_auth"

    anonymous = AsyncWebClient(base_url=fake.base_url)
    with pytest.raises(SlackApiError) as exc:
        await anonymous.auth_test()
    assert exc.value.response["error"] == "not_authed"

    client = client_for(fake)
    with pytest.raises(SlackApiError) as exc:
        await client.api_call("chat.nope")
    assert exc.value.response["error"] == "unknown_method"
    with pytest.raises(SlackApiError) as exc:
        await client.chat_postMessage(channel="C0NOWHERE", text="x")
    assert exc.value.response["error"] == "channel_not_found"
    with pytest.raises(SlackApiError) as exc:
        await client.usergroups_users_list(usergroup="S0NONE")
    assert exc.value.response["error"] == "no_such_subteam"
    with pytest.raises(SlackApiError) as exc:
        await client.chat_update(channel=CHANNEL, ts="1.000001", text="x")
    assert exc.value.response["error"] == "message_not_found"
    human_ts = fake.add_message(CHANNEL, "typed by a person")
    with pytest.raises(SlackApiError) as exc:
        await client.chat_update(channel=CHANNEL, ts=human_ts, text="x")
    assert exc.value.response["error"] == "cant_update_message"
    # The bot token cannot open Socket Mode connections.
    with pytest.raises(SlackApiError) as exc:
        await client.apps_connections_open(app_token=fake.bot_token)
    assert exc.value.response["error"] == "not_allowed_token_type"


async def test_message_limits(fake: FakeSlack) -> None:
    fake.post_rate_per_s = None  # this test posts many messages at once
    client = client_for(fake, retry_handlers=[])
    section = {"type": "section", "text": {"type": "mrkdwn", "text": "x"}}

    with pytest.raises(SlackApiError) as exc:
        await client.chat_postMessage(channel=CHANNEL, text="t", blocks=[section] * 51)
    assert exc.value.response["error"] == "invalid_blocks"

    long_section = {"type": "section", "text": {"type": "mrkdwn", "text": "x" * 3001}}
    with pytest.raises(SlackApiError) as exc:
        await client.chat_postMessage(channel=CHANNEL, text="t", blocks=[long_section])
    assert exc.value.response["error"] == "invalid_blocks"
    assert "/blocks/0/text/text" in exc.value.response["errors"][0]

    header = {"type": "header", "text": {"type": "plain_text", "text": "h" * 151}}
    with pytest.raises(SlackApiError) as exc:
        await client.chat_postMessage(channel=CHANNEL, text="t", blocks=[header])
    assert exc.value.response["error"] == "invalid_blocks"

    with pytest.raises(SlackApiError) as exc, pytest.warns(UserWarning, match="text"):
        await client.chat_postMessage(channel=CHANNEL, text="")
    assert exc.value.response["error"] == "no_text"

    # At the limits exactly, Slack accepts.
    ok_blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "x" * 3000}}] * 3
    ok = await client.chat_postMessage(channel=CHANNEL, text="fits", blocks=ok_blocks)
    assert len(fake.message(CHANNEL, ok["ts"])["blocks"]) == 3

    # Over 40,000 characters of text is truncated with a warning, not refused.
    huge = await client.chat_postMessage(channel=CHANNEL, text="y" * 40_001)
    assert huge["response_metadata"]["warnings"] == ["message_truncated"]
    assert len(fake.message(CHANNEL, huge["ts"])["text"]) == 40_000
    with pytest.raises(SlackApiError) as exc:
        await client.chat_update(channel=CHANNEL, ts=ok["ts"], text="z" * 40_001)
    assert exc.value.response["error"] == "msg_too_long"


async def test_threads_updates_ephemerals_and_permalinks(fake: FakeSlack) -> None:
    client = client_for(fake)
    parent = await client.chat_postMessage(channel=CHANNEL, text="redeploy kimi-k25")
    r1 = await client.chat_postMessage(channel=CHANNEL, thread_ts=parent["ts"], text="stopping")
    r2 = await client.chat_postMessage(channel=CHANNEL, thread_ts=parent["ts"], text="starting")
    assert float(parent["ts"]) < float(r1["ts"]) < float(r2["ts"])

    await client.chat_update(channel=CHANNEL, ts=parent["ts"], text="redeploy kimi-k25: done")
    thread = fake.thread(CHANNEL, parent["ts"])
    assert [m["text"] for m in thread] == ["redeploy kimi-k25: done", "stopping", "starting"]
    assert thread[0]["reply_count"] == 2
    versions = fake.message_versions(CHANNEL, parent["ts"])
    assert [v["text"] for v in versions] == ["redeploy kimi-k25", "redeploy kimi-k25: done"]
    assert [m["ts"] for m in fake.top_level(CHANNEL)] == [parent["ts"]]

    await client.chat_postEphemeral(channel=CHANNEL, user="U0ALICE", text="only you")
    assert [e["text"] for e in fake.ephemerals(user="U0ALICE")] == ["only you"]
    assert fake.messages(CHANNEL)[-1]["text"] == "starting"  # ephemerals are not in the channel

    link = await client.chat_getPermalink(channel=CHANNEL, message_ts=r1["ts"])
    assert f"thread_ts={parent['ts']}" in link["permalink"]


async def test_per_channel_pacing(fake: FakeSlack) -> None:
    clock = ManualClock()
    fake.clock = clock
    fake.post_rate_per_s = 1.0
    fake.post_burst = 2
    client = client_for(fake, retry_handlers=[])
    await client.chat_postMessage(channel=CHANNEL, text="1")
    await client.chat_postMessage(channel=CHANNEL, text="2")  # the burst
    with pytest.raises(SlackApiError) as exc:
        await client.chat_postMessage(channel=CHANNEL, text="too soon")
    assert exc.value.response.status_code == 429
    assert exc.value.response["error"] == "ratelimited"
    assert exc.value.response.headers["Retry-After"] == "1"
    # Pacing is per channel.
    await client.chat_postMessage(channel="C0OTHER", text="elsewhere")
    clock.now += 1.0
    await client.chat_postMessage(channel=CHANNEL, text="after a second")
    assert [m["text"] for m in fake.messages(CHANNEL)] == ["1", "2", "after a second"]


async def test_rate_limited_then_retried_by_the_sdk_handler(fake: FakeSlack) -> None:
    fake.fail_next("chat.postMessage", "ratelimited", status=429, retry_after=1)
    client = client_for(fake, retry_handlers=[AsyncRateLimitErrorRetryHandler(max_retry_count=1)])
    posted = await client.chat_postMessage(channel=CHANNEL, text="paced")
    assert posted["message"]["text"] == "paced"
    assert [c.status for c in fake.calls("chat.postMessage")] == [429, 200]
    assert fake.calls("chat.postMessage")[0].error == "ratelimited"


async def test_fault_switches(fake: FakeSlack) -> None:
    client = client_for(fake, retry_handlers=[])
    fake.rate_limit_all(seconds=60)
    with pytest.raises(SlackApiError) as exc:
        await client.auth_test()
    assert exc.value.response.status_code == 429

    fake.rate_limit_all(seconds=0)
    fake.fail_next("chat.postMessage", "fatal_error", status=500)
    with pytest.raises(SlackApiError) as exc:
        await client.chat_postMessage(channel=CHANNEL, text="x")
    assert exc.value.response.status_code == 500
    assert (await client.chat_postMessage(channel=CHANNEL, text="x"))["ok"] is True


class _BringBackUp(AsyncRetryHandler):
    """Retries connection errors once, restoring the fake in between (no timing involved)."""

    def __init__(self, fake: FakeSlack) -> None:
        super().__init__(
            max_retry_count=1, interval_calculator=FixedValueRetryIntervalCalculator(0)
        )
        self.fake = fake
        self.inner = AsyncConnectionErrorRetryHandler()
        self.errors: list[Exception] = []

    async def _can_retry_async(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> bool:
        if error is not None:
            self.errors.append(error)
        return await self.inner._can_retry_async(
            state=state, request=request, response=response, error=error
        )

    async def prepare_for_next_attempt_async(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> None:
        await self.fake.up()
        await super().prepare_for_next_attempt_async(
            state=state, request=request, response=response, error=error
        )


async def test_down_and_up_on_the_same_port(fake: FakeSlack) -> None:
    port = fake.port
    await fake.down()
    no_retry = client_for(fake, retry_handlers=[])
    with pytest.raises(OSError):  # aiohttp's ClientConnectorError is an OSError
        await no_retry.auth_test()

    handler = _BringBackUp(fake)
    resilient = client_for(fake, retry_handlers=[handler])
    assert (await resilient.auth_test())["ok"] is True
    assert len(handler.errors) == 1
    assert fake.port == port and fake.is_up


async def test_file_upload_v2_round_trip(fake: FakeSlack) -> None:
    client = client_for(fake)
    parent = await client.chat_postMessage(channel=CHANNEL, text="run 7")
    log = "line 1\n" * 5000
    result = await client.files_upload_v2(
        channel=CHANNEL,
        thread_ts=parent["ts"],
        content=log,
        filename="run-7.log",
        title="run 7 log",
        initial_comment="full log",
    )
    uploaded = fake.file(result["file"]["id"])
    assert uploaded.text == log
    assert uploaded.title == "run 7 log"
    thread = fake.thread(CHANNEL, parent["ts"])
    assert thread[-1]["files"][0]["id"] == uploaded.id
    assert thread[-1]["text"] == "full log"


async def test_response_urls_behave_like_slacks(fake: FakeSlack) -> None:
    posted = await client_for(fake).chat_postMessage(channel=CHANNEL, text="approve?")
    click = fake.block_action("approve", "run-1", channel_id=CHANNEL, message_ts=posted["ts"])
    hook = AsyncWebhookClient(click["response_url"])

    assert (await hook.send(text="only for you")).status_code == 200
    assert fake.ephemerals(user="U0ALICE")[0]["text"] == "only for you"
    await hook.send(text="approved by alice", replace_original=True)
    assert fake.message(CHANNEL, posted["ts"])["text"] == "approved by alice"
    await hook.send(text="everyone sees this", response_type="in_channel")
    assert fake.messages(CHANNEL)[-1]["text"] == "everyone sees this"
    await hook.send(delete_original=True)
    assert posted["ts"] not in [m["ts"] for m in fake.messages(CHANNEL)]
    assert len(fake.responses) == 4


@pytest.fixture
async def http_app(fake: FakeSlack) -> AsyncIterator[str]:
    app = AsyncApp(client=client_for(fake), signing_secret=SIGNING_SECRET)

    @app.command("/vllm")
    async def vllm(ack: Any, respond: Any, command: dict[str, str]) -> None:
        await ack()
        await respond(f"heard: {command['text']}")

    @app.action("approve")
    async def approve(ack: Any, respond: Any, action: dict[str, str]) -> None:
        await ack()
        await respond(text=f"approved {action['value']}", replace_original=True)

    runner = web.AppRunner(app.web_app(path="/slack/events"), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/slack/events"
    finally:
        await runner.cleanup()


async def test_bolt_http_app_verifies_signed_slash_commands(fake: FakeSlack, http_app: str) -> None:
    signer = SlackSigner(SIGNING_SECRET)
    body = signer.slash_command_body(fake.slash_command("status kimi-k25"))

    assert (await signer.sign(body).with_bad_signature().post(http_app)).status == 401
    assert (await signer.sign_stale(body).post(http_app)).status == 401
    assert (await SlackSigner("another-secret").sign(body).post(http_app)).status == 401
    assert fake.calls("auth.test") == []  # rejected before any listener ran

    assert (await signer.sign(body).post(http_app)).status == 200
    response = await fake.wait_for_response()
    assert response.body["text"] == "heard: status kimi-k25"
    assert fake.ephemerals(user="U0ALICE")[0]["text"] == "heard: status kimi-k25"
    assert len(fake.calls("auth.test")) == 1


async def test_bolt_http_app_receives_signed_block_actions(fake: FakeSlack, http_app: str) -> None:
    signer = SlackSigner(SIGNING_SECRET)
    posted = await client_for(fake).chat_postMessage(channel=CHANNEL, text="approve run-1?")
    click = fake.block_action("approve", "run-1", channel_id=CHANNEL, message_ts=posted["ts"])
    body = signer.interactive_body(click)

    assert (await signer.sign(body).with_bad_signature().post(http_app)).status == 401
    assert (await signer.sign(body).post(http_app)).status == 200
    await fake.wait_for_response()
    assert fake.message(CHANNEL, posted["ts"])["text"] == "approved run-1"


async def test_bolt_socket_mode_app_acks_envelopes(fake: FakeSlack) -> None:
    app = AsyncApp(client=client_for(fake))

    @app.command("/vllm")
    async def vllm(ack: Any, command: dict[str, str]) -> None:
        await ack(f"queued: {command['text']}")

    @app.action("approve")
    async def approve(ack: Any, body: dict[str, Any], client: AsyncWebClient) -> None:
        await ack()
        await client.chat_update(
            channel=body["channel"]["id"], ts=body["message"]["ts"], text="approved"
        )

    handler = AsyncSocketModeHandler(app, app_token=fake.app_token)
    await handler.connect_async()  # type: ignore[no-untyped-call]
    try:
        await fake.socket_mode.wait_connected()
        assert fake.calls("apps.connections.open")[0].token == fake.app_token

        ack = await fake.socket_mode.slash_command(fake.slash_command("redeploy kimi-k25"))
        assert ack["payload"] == {"text": "queued: redeploy kimi-k25"}

        posted = await client_for(fake).chat_postMessage(
            channel=CHANNEL,
            text="approve?",
            blocks=[
                {
                    "type": "actions",
                    "block_id": "approval",
                    "elements": [
                        {
                            "type": "button",
                            "action_id": "approve",
                            "text": {"type": "plain_text", "text": "Approve"},
                            "value": "run-1",
                        }
                    ],
                }
            ],
        )
        click = fake.block_action("approve", "run-1", channel_id=CHANNEL, message_ts=posted["ts"])
        assert click["actions"][0]["block_id"] == "approval"
        ack = await fake.socket_mode.interactive(click)
        assert "payload" not in ack
        await fake.wait_for(lambda: fake.message(CHANNEL, posted["ts"])["text"] == "approved")

        # Slack rotates connections with a `disconnect` message; the client reconnects.
        await fake.socket_mode.send_disconnect()
        await fake.socket_mode.wait_connected(count=2)
        ack = await fake.socket_mode.slash_command(fake.slash_command("status"))
        assert ack["payload"] == {"text": "queued: status"}
        assert len(fake.calls("apps.connections.open")) == 2
    finally:
        await handler.close_async()  # type: ignore[no-untyped-call]
