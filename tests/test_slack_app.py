"""``serve``: credentials checked at start, and the bot over Socket Mode (the local
websocket fake) with the engine and the simulated host behind it."""

from __future__ import annotations

import asyncio
import io
import socket
from pathlib import Path

import aiohttp

from bot.settings import Settings
from bot.sim.kit import SimKit
from bot.slack.app import serve
from tests.slack_harness import (
    ALICE,
    CHANNEL,
    SERVICE,
    blocks_text,
    buttons,
    make_settings,
    new_fake,
)
from tests.support.sim import touched


async def test_without_any_token_it_explains_the_demo_and_the_setup(tmp_path: Path) -> None:
    err = io.StringIO()
    code = await serve(Settings(db_path=tmp_path / "a.db"), err=err)
    assert code == 2
    assert "python -m bot demo" in err.getvalue()
    assert "SLACK_BOT_TOKEN" in err.getvalue() and "slack-manifest.yml" in err.getvalue()
    assert not (tmp_path / "a.db").exists()


async def test_http_mode_needs_the_signing_secret(tmp_path: Path) -> None:
    err = io.StringIO()
    settings = Settings(slack_bot_token="xoxb-1234", db_path=tmp_path / "a.db")
    assert await serve(settings, err=err) == 2
    assert "SLACK_SIGNING_SECRET" in err.getvalue()


async def test_a_bad_token_fails_at_start_with_a_clear_error(
    tmp_path: Path, sim_host: SimKit
) -> None:
    async with new_fake() as fake:
        settings = make_settings(tmp_path, sim_host, fake, SLACK_BOT_TOKEN="xoxb-wrong-token")
        err = io.StringIO()
        assert await serve(settings, err=err) == 1
        assert "invalid_auth" in err.getvalue() and "xoxb-wrong-token" not in err.getvalue()
        assert [c.method for c in fake.calls()] == ["auth.test"]


async def test_socket_mode_takes_commands_and_clicks(tmp_path: Path, sim_host: SimKit) -> None:
    async with new_fake() as fake:
        settings = make_settings(tmp_path, sim_host, fake, app_token=True)
        stop = asyncio.Event()
        bot = asyncio.create_task(serve(settings, stop=stop))
        try:
            await fake.socket_mode.wait_connected(timeout=10)
            assert len(fake.calls("auth.test")) == 1
            ack = await fake.socket_mode.slash_command(fake.slash_command("help"))
            assert "/vllm redeploy" in ack["payload"]["text"]

            await fake.socket_mode.slash_command(fake.slash_command(f"restart {SERVICE}"))
            card = await fake.wait_for_message(CHANNEL, lambda m: bool(buttons(m)))
            assert "<@U0ALICE>" in blocks_text(card)
            run_id = int(card["blocks"][-1]["elements"][0]["value"])
            click = fake.block_action(
                "deny", str(run_id), channel_id=CHANNEL, message_ts=card["ts"], user_id=ALICE
            )
            await fake.socket_mode.interactive(click)
            await fake.wait_for(
                lambda: "denied" in blocks_text(fake.message(CHANNEL, card["ts"])),
                what="the card to say denied",
            )
        finally:
            stop.set()
            assert await asyncio.wait_for(bot, 10) == 0
        assert touched(sim_host) == []  # the card's read of the load, nothing else


async def test_an_empty_approvers_list_is_refused_at_start(
    tmp_path: Path, sim_host: SimKit
) -> None:
    async with new_fake() as fake:
        settings = make_settings(
            tmp_path, sim_host, fake, policy={"requesters": [], "approvers": []}
        )
        err = io.StringIO()
        assert await serve(settings, err=err) == 2
        assert "[policy].approvers is empty" in err.getvalue()
        assert fake.calls() == []  # refused before anything else


async def test_the_bot_serves_its_metrics_where_configured(
    tmp_path: Path, sim_host: SimKit
) -> None:
    # A free port, taken back just before the bot binds it.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with new_fake() as fake:
        settings = make_settings(
            tmp_path, sim_host, fake, app_token=True, metrics={"listen": f"127.0.0.1:{port}"}
        )
        err = io.StringIO()
        stop = asyncio.Event()
        bot = asyncio.create_task(serve(settings, stop=stop, err=err))
        try:
            await fake.socket_mode.wait_connected(timeout=10)  # metrics start before this
            assert f"serving Prometheus metrics on 127.0.0.1:{port}/metrics" in err.getvalue()
            # A command from a channel the bot does not serve: refused, and counted.
            await fake.socket_mode.slash_command(
                fake.slash_command(f"restart {SERVICE}", channel_id="C0OTHER")
            )
            async with (
                aiohttp.ClientSession() as http,
                http.get(f"http://127.0.0.1:{port}/metrics") as resp,
            ):
                text = await resp.text()
        finally:
            stop.set()
            assert await asyncio.wait_for(bot, 10) == 0
    assert 'vllm_chatops_refusals_total{reason="wrong_channel"} 1.0' in text, text
    assert 'vllm_chatops_runs_in_flight{status="pending_approval"} 0.0' in text
