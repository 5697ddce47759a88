"""How many completions a second the simulated vLLM API server answers (the test harness's
own capacity, not the bot's): the rolling tests drive it at 50 a second through a router,
and on a starved machine a slower server queued requests past the client's timeout.

    ./dev python bench/sim_api.py [--seconds 5] [--concurrency 8]

One simulated host, its server up; ``--concurrency`` clients each send completions back to
back on a fresh connection (as tests/support/routers.py's client does) for ``--seconds``.
Reported: answered per second, and latency p50/p99."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from bot.sim.kit import SimKit
from bot.sim.state import HostConfig
from tests.support.routers import http


async def main(seconds: float, concurrency: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config = HostConfig(hostname="gpu-node-1", load_delay_s=0.2, release_delay_s=0.2)
        async with SimKit(Path(tmp) / "h", config=config) as kit:
            while True:
                try:
                    if (await http(kit.health_port, "GET", "/health", timeout_s=2))[0] == 200:
                        break
                except (OSError, TimeoutError):
                    await asyncio.sleep(0.1)  # still loading: the bench's own poll
            body = json.dumps({"model": config.served_model, "prompt": "hi", "max_tokens": 2})
            latencies: list[float] = []
            end = time.monotonic() + seconds

            async def client() -> None:
                while time.monotonic() < end:
                    at = time.monotonic()
                    status, _ = await http(
                        kit.health_port, "POST", "/v1/completions", body.encode(), 10.0
                    )
                    if status == 200:
                        latencies.append(time.monotonic() - at)

            await asyncio.gather(*(client() for _ in range(concurrency)))
    q = statistics.quantiles(latencies, n=100)
    print(
        f"{len(latencies) / seconds:.0f} completions/s, "
        f"p50 {statistics.median(latencies) * 1000:.1f} ms, p99 {q[98] * 1000:.1f} ms "
        f"({concurrency} clients, {seconds:.0f} s)"
    )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--concurrency", type=int, default=8)
    a = p.parse_args()
    asyncio.run(main(a.seconds, a.concurrency))
