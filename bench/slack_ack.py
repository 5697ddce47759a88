"""Ack latency of `/vllm` slash commands in HTTP mode under 50 concurrent requests.

    ./dev python bench/slack_ack.py [--requests 50] [--rounds 3]

The real bolt app (HTTP mode, signature verification on) over the real engine,
with Slack faked at its HTTP boundary and one simulated GPU host over SSH.
Each request is a signed `/vllm gpus` (acked at once, answered in the
background by an SSH fan-out) mixed with `/vllm help` (answered in the ack)
and a refused bad input (parsed, refused, audited, then acked).  Latency is
measured from sending the request to reading the HTTP response: what Slack
measures against its 3-second limit.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from bot.sim.kit import SimKit, fast_config
from tests.slack_harness import slack_bot

TEXTS = ("gpus", "help", "redeploy kimi-k25 --version 1.0;id")


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


async def main(requests: int, rounds: int) -> None:
    latencies: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        async with (
            SimKit(Path(tmp) / "host", config=fast_config()) as kit,
            slack_bot(Path(tmp), kit) as bot,
            aiohttp.ClientSession() as session,
        ):
            for _ in range(rounds):
                signed = [
                    bot.signer.slash_command(bot.fake.slash_command(TEXTS[i % 3]))
                    for i in range(requests)
                ]

                async def one(req: object) -> float:
                    start = time.perf_counter()
                    async with session.post(
                        bot.url,
                        data=req.body.encode(),  # type: ignore[attr-defined]
                        headers=dict(req.headers),  # type: ignore[attr-defined]
                    ) as resp:
                        await resp.read()
                        assert resp.status == 200, resp.status
                    return time.perf_counter() - start

                latencies += await asyncio.gather(*(one(r) for r in signed))
                await bot.front_end.idle()
    ms = [x * 1000 for x in latencies]
    print(
        f"machine: {platform.machine()}, CPython {platform.python_version()}, {platform.system()}"
    )
    print(
        f"{requests} concurrent requests x {rounds} rounds ({len(ms)} acks), "
        f"mix: {', '.join(TEXTS)}"
    )
    print("| p50 ms | p90 ms | p99 ms | max ms | mean ms |")
    print("|---|---|---|---|---|")
    print(
        f"| {percentile(ms, 50):.1f} | {percentile(ms, 90):.1f} | {percentile(ms, 99):.1f} | "
        f"{max(ms):.1f} | {statistics.mean(ms):.1f} |"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    asyncio.run(main(a.requests, a.rounds))
