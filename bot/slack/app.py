"""The Slack app: ``make_front_end`` puts the Slack front end over a runtime,
``create_app`` wires bolt's listeners to it, ``serve`` runs the bot.

Modes: with ``SLACK_APP_TOKEN`` the bot connects out over Socket Mode (no public
URL; the default for on-prem); without it, it serves HTTP on ``PORT`` at
``/slack/events`` and verifies every request with ``SLACK_SIGNING_SECRET``.
``SLACK_API_URL`` points the Web API client somewhere else (a proxy, a test fake).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

import aiohttp
from aiohttp import web
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp, AsyncBoltContext
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient

from bot.engine.metrics_http import METRICS_PATH, start_metrics
from bot.engine.runtime import Runtime, open_runtime
from bot.settings import Settings
from bot.settings.database import is_postgres
from bot.slack import edge, handlers
from bot.slack.expiry import Sleep
from bot.slack.front_end import SlackFrontEnd
from bot.slack.handlers.common import CONTEXT_KEY
from bot.slack.limits import LIMIT_KEY, UserRateLimit
from bot.slack.membership import MembershipCache
from bot.slack.poster import Poster

EVENTS_PATH = "/slack/events"
DEFAULT_API_URL = "https://slack.com/api/"
EXIT_CONFIG = 2
EXIT_SLACK = 1

NO_TOKENS_HELP = """\
error: no Slack credentials (SLACK_BOT_TOKEN is not set).

To try the bot without Slack:   python -m bot demo
To run it in Slack:
  1. create an app from deploy/slack-manifest.yml (api.slack.com/apps -> From a manifest)
  2. install it to the workspace and set SLACK_BOT_TOKEN (xoxb-...)
  3. Socket Mode (no public URL): set SLACK_APP_TOKEN (xapp-..., scope connections:write)
     HTTP mode: set SLACK_SIGNING_SECRET and expose PORT (default 3000) at /slack/events
"""


def make_client(settings: Settings) -> AsyncWebClient:
    """The Web API client: retries 429s (after Retry-After), connection errors and 5xx."""
    token = settings.slack_bot_token.get_secret_value() if settings.slack_bot_token else None
    base_url = settings.slack_api_url or DEFAULT_API_URL
    # slack_sdk joins base_url and the method name with urljoin: it must end with '/'.
    base_url = base_url if base_url.endswith("/") else base_url + "/"
    return AsyncWebClient(
        token=token,
        base_url=base_url,
        retry_handlers=[
            AsyncRateLimitErrorRetryHandler(max_retry_count=3),
            AsyncConnectionErrorRetryHandler(max_retry_count=3),
            AsyncServerErrorRetryHandler(max_retry_count=2),
        ],
    )


def make_front_end(
    runtime: Runtime, *, client: AsyncWebClient | None = None, sleep: Sleep = asyncio.sleep
) -> SlackFrontEnd:
    """The Slack front end over ``runtime``'s engine (``sleep``: what its expiry timers
    wait with; tests pass their manual clock's)."""
    settings = runtime.settings
    client = client if client is not None else make_client(settings)
    poster = Poster(client, runtime.redact, post_interval_s=settings.slack.post_interval_s)
    return SlackFrontEnd(
        runtime, poster, MembershipCache(client, settings.policy.usergroup_cache_ttl_s), sleep=sleep
    )


def create_app(
    front_end: SlackFrontEnd, *, rate_clock: Callable[[], float] = time.monotonic
) -> AsyncApp:
    """The bolt app with every listener registered, handing its work to ``front_end``
    (``rate_clock``: what refills each person's allowance of read-only commands; tests
    pass a manual clock)."""
    read_only_limit = UserRateLimit(clock=rate_clock)
    secret = front_end.runtime.settings.slack_signing_secret
    # Every handler acks first and hands slow work to a task, so bolt may answer as soon
    # as the handler returns instead of polling for the ack every 10 ms.
    # Bolt's own signature check is off: in HTTP mode ``start_http``'s edge has verified
    # the raw bytes before bolt parses them (bolt's check logs refused bodies whole and
    # raises on a non-numeric timestamp); Socket Mode needs none.
    app = AsyncApp(
        client=front_end.poster.client,
        signing_secret=secret.get_secret_value() if secret is not None else "",
        name="vllm-chatops",
        process_before_response=True,
        request_verification_enabled=False,
    )

    async def attach(context: AsyncBoltContext, next: Callable[[], Awaitable[None]]) -> None:
        # bolt passes middleware arguments by name: it must be called `next`.
        context[CONTEXT_KEY] = front_end
        context[LIMIT_KEY] = read_only_limit
        await next()

    app.middleware(attach)
    handlers.register(app)
    return app


async def start_http(
    app: AsyncApp, *, port: int, signing_secret: str, host: str = "0.0.0.0"
) -> web.AppRunner:
    """Serve ``app`` at ``EVENTS_PATH`` behind the edge (``bot.slack.edge``: bounded
    body, signature verified on the raw bytes, short rate-limited log lines for refused
    requests); ``runner.addresses`` tells the bound port."""
    runner = edge.runner(app, path=EVENTS_PATH, signing_secret=signing_secret)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


def _check_credentials(settings: Settings, err: TextIO) -> bool:
    if settings.slack_bot_token is None:
        if settings.slack_app_token is None and settings.slack_signing_secret is None:
            err.write(NO_TOKENS_HELP)
        else:
            err.write("error: SLACK_BOT_TOKEN (xoxb-...) is required to run the Slack bot\n")
        return False
    open_to_all = [name for name in settings.services if not settings.policy_for(name).approvers]
    if open_to_all:
        # An empty list would let anyone in the workspace approve stopping a GPU service;
        # a service with its own approvers needs none from [policy].
        err.write(
            "error: [policy].approvers is empty: name the Slack users or user groups "
            "who may approve redeploys and restarts (or give each service its own, "
            f"[services.NAME.policy]; none for: {', '.join(open_to_all)})\n"
        )
        return False
    if settings.slack_app_token is None and settings.slack_signing_secret is None:
        err.write(
            "error: HTTP mode needs SLACK_SIGNING_SECRET to verify requests "
            "(or set SLACK_APP_TOKEN for Socket Mode)\n"
        )
        return False
    return True


async def _auth_test(client: AsyncWebClient, err: TextIO) -> dict[str, Any] | None:
    try:
        resp = await client.auth_test()
    except SlackApiError as exc:
        error = exc.response.get("error") if hasattr(exc.response, "get") else exc
        err.write(
            f"error: Slack refused SLACK_BOT_TOKEN ({error}); copy the Bot User "
            "OAuth Token (xoxb-...) from the app's OAuth & Permissions page\n"
        )
        return None
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        err.write(f"error: cannot reach the Slack API at {client.base_url}: {exc}\n")
        return None
    return dict(resp.data) if isinstance(resp.data, dict) else {}


async def serve(
    settings: Settings, *, stop: asyncio.Event | None = None, err: TextIO | None = None
) -> int:
    """Run the bot until SIGINT/SIGTERM (or ``stop`` is set). Returns the exit code."""
    err = err or sys.stderr
    if not _check_credentials(settings, err):
        return EXIT_CONFIG
    client = make_client(settings)
    identity = await _auth_test(client, err)
    if identity is None:
        return EXIT_SLACK
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    async with open_runtime(settings) as runtime:
        front_end = make_front_end(runtime, client=client)
        app = create_app(front_end)
        await front_end.resume()
        await front_end.start_leader()
        front_end.start_sweep(
            every_s=settings.replicas.sweep_s(postgres=is_postgres(settings.db_path))
        )
        front_end.start_scheduler()
        who = f"{identity.get('user', '?')} in {identity.get('team', '?')}"
        metrics = None
        try:
            if (address := settings.metrics.address()) is not None:
                metrics, port = await start_metrics(
                    runtime.metrics, runtime.audit, runtime.writer, *address
                )
                err.write(f"serving Prometheus metrics on {address[0]}:{port}{METRICS_PATH}\n")
            if settings.slack_app_token is not None:
                handler = AsyncSocketModeHandler(
                    app, settings.slack_app_token.get_secret_value(), web_client=client
                )
                await handler.connect_async()  # type: ignore[no-untyped-call]
                err.write(f"connected to Slack as {who} (Socket Mode)\n")
                try:
                    await stop.wait()
                finally:
                    await handler.close_async()  # type: ignore[no-untyped-call]
            else:
                assert settings.slack_signing_secret is not None  # _check_credentials
                runner = await start_http(
                    app,
                    port=settings.port,
                    signing_secret=settings.slack_signing_secret.get_secret_value(),
                )
                err.write(
                    f"serving Slack events for {who} on :{settings.port}{EVENTS_PATH} "
                    f"(pid {os.getpid()})\n"
                )
                try:
                    await stop.wait()
                finally:
                    await runner.cleanup()
        finally:
            if metrics is not None:
                await metrics.cleanup()
            await front_end.aclose()
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(sig)
    return 0
