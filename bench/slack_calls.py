"""Slack API calls per redeploy as the reinstall output grows from 100 to 100,000 lines.

    ./dev python bench/slack_calls.py

The real bolt app and Slack reporter against the fake Slack Web API (which counts
every call), one simulated GPU host over SSH printing N lines during the install.
The count must stay flat: output is coalesced per step, the tail goes in a code
block and the full log in one file.
"""

from __future__ import annotations

import asyncio
import platform
import tempfile
import time
from collections import Counter
from pathlib import Path

from bot.sim.kit import SimKit, fast_config
from tests.slack_harness import BOB, SERVICE, slack_bot

SIZES = (100, 1_000, 10_000, 100_000)
METHODS = ("chat.postMessage", "chat.update", "files.getUploadURLExternal",
           "files.completeUploadExternal")


async def main() -> None:
    rows: list[tuple[int, Counter[str], float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        async with SimKit(Path(tmp) / "host", config=fast_config()) as kit, \
                slack_bot(Path(tmp), kit) as bot:
            for i, lines in enumerate(SIZES):
                kit.update_config(install_output_lines=lines)
                start = len(bot.fake.calls())
                t0 = time.perf_counter()
                version = ("0.16.0", "0.15.1")[i % 2]
                await bot.command(f"redeploy {SERVICE} --version {version}")
                record = await bot.wait_for_run(
                    lambda r: r.message_ts is not None and r.status == "pending_approval",
                    "the card")
                await bot.click("approve", record.id, user=BOB)
                done = await bot.wait_status(record.id, "succeeded", "failed", "rolled_back",
                                             timeout_s=300)
                assert done.status == "succeeded", done.summary
                await bot.front_end.idle()
                calls = bot.fake.calls()[start:]
                rows.append((lines, Counter(c.method for c in calls), time.perf_counter() - t0))
    print(f"machine: {platform.machine()}, CPython {platform.python_version()}, "
          f"{platform.system()}")
    print("| install output lines | " + " | ".join(METHODS) + " | all calls | run s |")
    print("|---" * (len(METHODS) + 3) + "|")
    for lines, counts, secs in rows:
        cells = " | ".join(str(counts[m]) for m in METHODS)
        print(f"| {lines:,} | {cells} | {sum(counts.values())} | {secs:.1f} |")


if __name__ == "__main__":
    asyncio.run(main())
