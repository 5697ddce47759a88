"""A host reboot through the engine (issue 23): what the bot adds to the boot itself.

    ./dev python bench/host_maintenance.py [--runs 5] [--boot-s 3] [--load-s 2] [--poll-s 1]

Each run: a fresh simulated host behind a real OpenSSH sshd whose reboot takes
``--boot-s`` and whose model takes ``--load-s`` to load; ``host reboot`` through the engine
(request, the terminal's confirmation, execute), polling the boot id every ``--poll-s``.

* *outage*: the stop's start until the service's readiness passed (what its clients see);
* *floor*: what no reboot can avoid: the stop until the GPUs are free, the boot, and the
  start until healthy (the simulated model load);
* *overhead*: outage - floor: the request drain, the wait past the boot (at most one poll
  interval plus a login), the deep GPU check and the readiness checks;
* *lag*: from the host being up again (the simulator's own boot end) to the bot seeing
  the new boot id.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bot.cli.terminal import TerminalSink
from bot.core import events as ev
from bot.core.plan import Step
from bot.core.status import Action, RunStatus, Source
from bot.engine.host_runs import plan_host
from bot.engine.runtime import open_runtime
from bot.settings import Settings
from bot.sim.kit import SERVICE, SimKit, fast_config
from bot.sim.state import booted_at


class Clock:
    """Each step's first start and last end, from the engine's own events (monotonic)."""

    def __init__(self) -> None:
        self.began: dict[Step, float] = {}
        self.ended: dict[Step, float] = {}
        self.wall_ended: dict[Step, float] = {}

    async def handle(self, event: ev.Event) -> None:
        if isinstance(event, ev.StepStarted):
            self.began.setdefault(event.step, time.monotonic())
        elif isinstance(event, ev.StepFinished):
            self.ended[event.step] = time.monotonic()
            self.wall_ended[event.step] = time.time()


class Both:
    def __init__(self, *sinks: ev.EventSink) -> None:
        self.sinks = sinks

    async def handle(self, event: ev.Event) -> None:
        for s in self.sinks:
            await s.handle(event)


@dataclass
class Run:
    outage_s: float
    floor_s: float
    lag_s: float
    deep_s: float
    total_s: float


async def one(root: Path, boot_s: float, load_s: float, poll_s: float) -> Run:
    config = fast_config(reboot_delay_s=boot_s, load_delay_s=load_s)
    async with SimKit(root, config=config, access="sshd") as kit:
        settings = Settings(
            hosts={kit.hostname: kit.host_settings()},
            services={SERVICE: kit.service_settings()},
            maintenance={"reboot_timeout_s": 120, "reboot_poll_s": poll_s},
            db_path=root / "audit.db",
        )
        async with open_runtime(settings) as rt:
            clock = Clock()
            plan = plan_host(settings, Action.REBOOT, kit.hostname)
            t0 = time.monotonic()
            record = await rt.lifecycle.request(plan, requested_by="bench", source=Source.CLI)
            if not await rt.lifecycle.confirm(record.id, "bench-approver"):
                raise RuntimeError(f"run #{record.id} was not pending approval")
            result = await rt.engine.execute(record.id, Both(TerminalSink(io.StringIO()), clock))
            total = time.monotonic() - t0
        up = booted_at(kit.state())
    assert result.status == RunStatus.SUCCEEDED, result.summary
    assert up is not None
    b, e = clock.began, clock.ended
    outage = e[Step.READINESS] - b[Step.STOP]
    floor = (e[Step.DRAIN] - b[Step.STOP]) + boot_s + load_s
    return Run(
        outage,
        floor,
        clock.wall_ended[Step.REBOOT] - up,
        e[Step.DEEP_CHECK] - b[Step.DEEP_CHECK],
        total,
    )


def _row(name: str, values: list[float]) -> str:
    return f"| {name} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |"


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--boot-s", type=float, default=3.0)
    p.add_argument("--load-s", type=float, default=2.0)
    p.add_argument("--poll-s", type=float, default=1.0)
    a = p.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.runs):
            runs.append(await one(Path(tmp) / f"r{i}", a.boot_s, a.load_s, a.poll_s))
    print(
        f"host reboot, {a.runs} runs, boot {a.boot_s:g}s, model load {a.load_s:g}s, "
        f"poll {a.poll_s:g}s; CPython {platform.python_version()}"
    )
    print("| | median s | min s | max s |\n|---|---|---|---|")
    print(_row("outage (stop -> ready)", [r.outage_s for r in runs]))
    print(_row("floor (drain + boot + load)", [r.floor_s for r in runs]))
    print(_row("overhead (outage - floor)", [r.outage_s - r.floor_s for r in runs]))
    print(_row("lag (host up -> bot sees it)", [r.lag_s for r in runs]))
    print(_row("deep GPU check", [r.deep_s for r in runs]))
    print(_row("whole run", [r.total_s for r in runs]))


if __name__ == "__main__":
    asyncio.run(main())
