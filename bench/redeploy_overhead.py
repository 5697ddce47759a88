"""Engine overhead: a redeploy through the engine vs the same remote commands back to back.

    ./dev python bench/redeploy_overhead.py [--runs 10]

Both sides run against the same simulated host over one SSH connection with
host delays set to zero (memory released at once, model "loads" instantly), so
the difference is what the engine adds: the state machine, events, the audit
writes (SQLite, synchronous=FULL) and output streaming.  The baseline replays
the exact command sequence the engine sent, read back from the host's call log.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import platform
import statistics
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import asyncssh

from bot.cli.terminal import TerminalSink
from bot.core.status import Action, Source
from bot.engine.runtime import open_runtime
from bot.hosts.streams import wrap_with_timeout
from bot.settings import Settings
from bot.sim.kit import SERVICE, TEST_SERVICE_SETTINGS, SimKit, fast_config

ZERO_DELAYS = {
    "release_delay_s": 0.0,
    "load_delay_s": 0.0,
    "stop_delay_s": 0.0,
    "install_duration_s": 0.0,
    "fail_delay_s": 0.0,
}


async def engine_redeploy(settings: Settings, version: str) -> float:
    async with open_runtime(settings) as rt:
        plan = rt.engine.plan(Action.REDEPLOY, SERVICE, version=version, index="nightly")
        start = time.perf_counter()
        record = await rt.lifecycle.request(plan, requested_by="bench", source=Source.CLI)
        # As the CLI approves a run on its terminal (the approving process owns it).
        if not await rt.lifecycle.confirm(record.id, "bench-approver"):
            raise RuntimeError(f"run #{record.id} was not pending approval")
        result = await rt.engine.execute(record.id, TerminalSink(io.StringIO()))
        elapsed = time.perf_counter() - start
    assert result.status == "succeeded", result.summary
    return elapsed


async def open_health(
    conn: asyncssh.SSHClientConnection, kit: SimKit
) -> tuple[asyncssh.SSHReader[bytes], asyncssh.SSHWriter[bytes]]:
    # Only answered requests reach the call log: the engine's refused polls while the
    # server was still binding do not.  Poll the same way (refused -> wait one
    # health_poll_s -> again), or the replay races the server's start-up and fails.
    url = urlsplit(kit.health_url)
    while True:
        try:
            return await conn.open_connection(url.hostname, url.port)
        except asyncssh.ChannelOpenError as e:
            if e.code != asyncssh.OPEN_CONNECT_FAILED:
                raise
            await asyncio.sleep(TEST_SERVICE_SETTINGS["health_poll_s"])


async def replay(kit: SimKit, calls: list[tuple[str, tuple[str, ...]]]) -> float:
    async with await kit.connect() as conn:
        start = time.perf_counter()
        for tool, argv in calls:
            if tool == "http":
                reader, writer = await open_health(conn, kit)
                writer.write(
                    f"GET {argv[1]} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
                )
                await reader.read()
                writer.close()
            else:
                # The call log has no stdin: a command that reads one (the prefetch's
                # `uv pip install -r /dev/stdin`) gets an empty one, not a wait for the
                # 60 s timeout on a stdin that never closes.
                await conn.run(wrap_with_timeout(argv, 60), stdin=asyncssh.DEVNULL)
        elapsed = time.perf_counter() - start
    # Outside the `async with`: mypy cannot tell that asyncssh's __aexit__ never
    # swallows an exception, so a return inside it reads as possibly missing.
    return elapsed


async def main(runs: int) -> None:
    engine_times: list[float] = []
    bare_times: list[float] = []
    commands = 0
    with tempfile.TemporaryDirectory() as tmp:
        async with SimKit(Path(tmp) / "host", config=fast_config(**ZERO_DELAYS)) as kit:
            for i in range(runs):
                version = ("0.16.0", "0.15.1")[i % 2]
                settings = Settings(**kit.settings_fragment(), db_path=Path(tmp) / f"a{i}.db")
                before = len(kit.calls())
                engine_times.append(await engine_redeploy(settings, version))
                calls = [(c.tool, c.argv) for c in kit.calls()[before:]]
                commands = len(calls)
                bare_times.append(await replay(kit, calls))
    e, b = statistics.median(engine_times), statistics.median(bare_times)
    print(
        f"machine: {platform.machine()}, {platform.python_implementation()} "
        f"{platform.python_version()}, {platform.system()}"
    )
    print(f"runs: {runs}, remote commands per redeploy: {commands}")
    print("| | median s | min s | max s |")
    print("|---|---|---|---|")
    print(f"| engine redeploy | {e:.3f} | {min(engine_times):.3f} | {max(engine_times):.3f} |")
    print(
        f"| same commands back to back | {b:.3f} | {min(bare_times):.3f} | {max(bare_times):.3f} |"
    )
    print(f"engine overhead: {(e - b) / b * 100:+.1f}% ({(e - b) * 1000:+.0f} ms per redeploy)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=10)
    asyncio.run(main(ap.parse_args().runs))
