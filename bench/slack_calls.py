"""Slack API calls per redeploy as the reinstall output grows from 100 to 100,000 lines,
and during a 10-minute start as its log grows.

    ./dev python bench/slack_calls.py

The real bolt app and Slack reporter against the fake Slack Web API (which counts
every call), one simulated GPU host over SSH printing N lines during the install.
The count must stay flat: output is coalesced per step, the tail goes in a code
block and the full log in one file.

The second table is a start that takes 10 minutes (a 1T-parameter model over 8 GPUs),
compressed 100 times: the simulated host loads for 6 s, and every interval of the bot
that decides how often it looks or posts is divided by 100 with it (health polls every
0.02 s for 2 s, the card's elapsed time every 0.1 s for 10 s, card updates at most every
0.01 s for 1 s). So the calls counted are those of a real 10-minute start; what varies
is how many lines the server logs meanwhile.
"""

from __future__ import annotations

import asyncio
import platform
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bot.core.plan import STEP_TITLES, Step
from bot.sim.kit import SimKit, fast_config
from tests.slack_harness import (
    BOB,
    BOT_POST_INTERVAL_S,
    CHANNEL,
    SERVICE,
    blocks_text,
    slack_bot,
)

SIZES = (100, 1_000, 10_000, 100_000)
METHODS = (
    "chat.postMessage",
    "chat.update",
    "files.getUploadURLExternal",
    "files.completeUploadExternal",
)


async def main() -> None:
    rows: list[tuple[int, Counter[str], float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        async with (
            SimKit(Path(tmp) / "host", config=fast_config()) as kit,
            slack_bot(Path(tmp), kit) as bot,
        ):
            for i, lines in enumerate(SIZES):
                kit.update_config(install_output_lines=lines)
                start = len(bot.fake.calls())
                t0 = time.perf_counter()
                version = ("0.31.0", "0.30.0")[i % 2]
                await bot.command(f"redeploy {SERVICE} --version {version}")
                record = await bot.wait_for_run(
                    lambda r: r.message_ts is not None and r.status == "pending_approval",
                    "the card",
                )
                await bot.click("approve", record.id, user=BOB)
                done = await bot.wait_status(
                    record.id, "succeeded", "failed", "rolled_back", timeout_s=300
                )
                assert done.status == "succeeded", done.summary
                await bot.front_end.idle()
                calls = bot.fake.calls()[start:]
                rows.append((lines, Counter(c.method for c in calls), time.perf_counter() - t0))
    print(
        f"machine: {platform.machine()}, CPython {platform.python_version()}, {platform.system()}"
    )
    print("| install output lines | " + " | ".join(METHODS) + " | all calls | run s |")
    print("|---" * (len(METHODS) + 3) + "|")
    for lines, counts, secs in rows:
        cells = " | ".join(str(counts[m]) for m in METHODS)
        print(f"| {lines:,} | {cells} | {sum(counts.values())} | {secs:.1f} |")


# A 10-minute start compressed 100 times (see the module doc).
COMPRESSION = 100
START_S = 600.0
START_LOG_LINES = (100, 10_000, 50_000)


async def long_start() -> None:
    rows: list[tuple[int, Counter[str], float, int]] = []
    scaled: dict[str, Any] = {
        "health_poll_s": 2.0 / COMPRESSION,
        "progress_interval_s": 10.0 / COMPRESSION,
        "start_timeout_s": 1800.0 / COMPRESSION * 10,
        "drain_poll_s": 1.0 / COMPRESSION,
    }
    with tempfile.TemporaryDirectory() as tmp:
        config = fast_config(load_delay_s=START_S / COMPRESSION)
        async with SimKit(Path(tmp) / "host", config=config) as kit:
            services = {SERVICE: kit.service_settings(**scaled)}
            slack = {
                "channels": [CHANNEL],
                "post_interval_s": BOT_POST_INTERVAL_S,
                "update_interval_s": 1.0 / COMPRESSION,
            }
            async with slack_bot(Path(tmp), kit, services=services, slack=slack) as bot:
                for lines in START_LOG_LINES:
                    kit.update_config(startup_log_lines=lines)
                    start = len(bot.fake.calls())
                    t0 = time.perf_counter()
                    await bot.command(f"restart {SERVICE}")
                    record = await bot.wait_for_run(
                        lambda r: r.message_ts is not None and r.status == "pending_approval",
                        "the card",
                    )
                    await bot.click("approve", record.id, user=BOB)
                    done = await bot.wait_status(
                        record.id, "succeeded", "failed", "rolled_back", timeout_s=600
                    )
                    assert done.status == "succeeded", done.summary
                    await bot.front_end.idle()
                    calls = bot.fake.calls()[start:]
                    assert record.message_ts is not None
                    cards = bot.fake.message_versions(CHANNEL, record.message_ts)
                    health = {
                        ln
                        for card in cards
                        for ln in blocks_text(card).splitlines()
                        if STEP_TITLES[Step.HEALTH] in ln and "·" in ln
                    }
                    rows.append(
                        (
                            lines,
                            Counter(c.method for c in calls),
                            time.perf_counter() - t0,
                            len(health),
                        )
                    )
    print(f"\nA {START_S / 60:.0f}-minute start (compressed {COMPRESSION}x), one restart per row")
    print(
        "| start-up log lines | "
        + " | ".join(METHODS[:2])
        + " | all calls | progress lines shown | run s |"
    )
    print("|---" * 6 + "|")
    for lines, counts, secs, shown in rows:
        cells = " | ".join(str(counts[m]) for m in METHODS[:2])
        print(f"| {lines:,} | {cells} | {sum(counts.values())} | {shown} | {secs:.1f} |")


if __name__ == "__main__":
    asyncio.run(main())
    asyncio.run(long_start())
