"""Zero downtime behind a router (issue 19): client requests through a real router while
two replicas are redeployed, by hand (the seed's sequence) and by the bot's rolling
redeploy that takes each replica out of rotation first.

    ./dev python bench/zero_downtime.py [--load-s 8] [--rate 20] [--routers haproxy vllm-router]

For each router (Debian's HAProxy 2.6 with `check inter 200ms fall 3 rise 1`,
`timeout check 2s`; PyPI's vllm-router 0.1.17 with `--health-check-interval-secs 1`), two
fresh simulated replicas
(the model loads in ``--load-s``) and a client that sends ``--rate`` completions a second
through the router, each on its own connection (tests/support/routers.py), for:

* manual: on each replica in turn, over SSH, `systemctl stop`, `sleep 2`, `nvidia-smi`,
  `uv pip install --force-reinstall vllm==0.31.0`, `systemctl start`, then /health until
  200 (the seed's sequence; the router is left alone, so only its health check keeps
  requests away from the stopped replica);
* bot: `redeploy` through the engine, one replica at a time, each taken out of rotation
  before its stop and put back once ready.

Reported: requests sent and failed during the redeploy, latency p50/p99 for 5 s before and
during it, and how long each replica was out of rotation as the router itself showed it
(read every 20 ms)."""

from __future__ import annotations

import argparse
import asyncio
import io
import platform
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.cli.terminal import TerminalSink
from bot.core.status import Action, RunStatus, Source
from bot.engine.runtime import open_runtime
from bot.hosts.streams import wrap_with_timeout
from bot.settings import Settings
from bot.sim.kit import READY_SETTINGS, SERVICE, TEST_SERVICE_SETTINGS, SimKit, fleet_fragment
from bot.sim.state import HostConfig
from tests.support import routers

VERSION = "0.31.0"
MODEL = "kimi-k2.5"
BEFORE_S = 5.0


def host_config(hostname: str, load_s: float) -> HostConfig:
    return HostConfig(
        hostname=hostname,
        release_delay_s=1.5,
        load_delay_s=load_s,
        stop_delay_s=0.5,
        install_duration_s=2.0,
        fail_delay_s=1.0,
    )


@dataclass
class Row:
    router: str
    how: str
    sent: int
    failed: int
    before: tuple[float, float]
    during: tuple[float, float]
    out_s: list[float]
    took_s: float


def pcts(latencies: list[float]) -> tuple[float, float]:
    if len(latencies) < 2:
        return (float("nan"), float("nan"))
    q = statistics.quantiles(latencies, n=100)
    return (statistics.median(latencies) * 1000, q[98] * 1000)


@asynccontextmanager
async def replicas(root: Path, load_s: float) -> AsyncIterator[tuple[list[SimKit], SimKit]]:
    async with AsyncExitStack() as stack:
        venv = root / "opt-venv"
        kits = [
            await stack.enter_async_context(
                SimKit(
                    root / f"gpu-{i}",
                    config=host_config(f"gpu-node-{i}", load_s),
                    venv_dir=venv,
                    service_port=8000,
                )
            )
            for i in (1, 2)
        ]
        lb = await stack.enter_async_context(
            SimKit(root / "lb", config=host_config("lb-1", load_s))
        )
        yield kits, lb


async def healthy(kit: SimKit) -> None:
    while True:
        try:
            status, _ = await routers.http(kit.health_port, "GET", "/health", timeout_s=2)
            if status == 200:
                return
        except (OSError, TimeoutError, ConnectionError):
            pass
        await asyncio.sleep(0.5)  # the runbook's own poll, as an operator would repeat it


async def manual(kits: list[SimKit]) -> None:
    for kit in kits:
        install = ("uv", "pip", "install", "--python", str(kit.python), "--force-reinstall")
        async with await kit.connect() as conn:
            await conn.run(wrap_with_timeout(("systemctl", "stop", kit.config.unit), 60))
            await asyncio.sleep(2)  # the seed's `sleep 2`
            await conn.run(wrap_with_timeout(("nvidia-smi",), 60))
            r = await conn.run(wrap_with_timeout((*install, f"vllm=={VERSION}"), 600))
            assert r.exit_status == 0, r.stderr
            await conn.run(wrap_with_timeout(("systemctl", "start", kit.config.unit), 60))
        await healthy(kit)


async def bot(kits: list[SimKit], lb: SimKit, root: Path, router: dict[str, Any]) -> None:
    servers = router.pop("servers")
    frag = fleet_fragment(
        kits,
        max_unavailable=1,
        router="front",
        router_servers=servers,
        min_serving=1,
        **{**TEST_SERVICE_SETTINGS, **READY_SETTINGS, "start_timeout_s": 120.0},
    )
    frag["hosts"]["lb-1"] = lb.host_settings()
    frag["routers"] = {"front": {"host": "lb-1", "settle_s": 1.0, "poll_s": 0.25, **router}}
    async with open_runtime(Settings(**frag, db_path=root / "audit.db")) as rt:
        plan = rt.engine.plan(Action.REDEPLOY, SERVICE, version=VERSION, index="nightly")
        record = await rt.lifecycle.request(plan, requested_by="bench", source=Source.CLI)
        if not await rt.lifecycle.confirm(record.id, "bench-approver"):
            raise RuntimeError(f"run #{record.id} was not pending approval")
        result = await rt.engine.execute(record.id, TerminalSink(io.StringIO()))
    assert result.status == RunStatus.SUCCEEDED, result.summary


async def measure(
    name: str,
    how: str,
    port: int,
    view: Callable[[], Awaitable[dict[str, bool]]],
    servers: list[str],
    redeploy: Callable[[], Awaitable[None]],
    rate: float,
) -> Row:
    load = routers.Load(port, MODEL, interval_s=1 / rate)
    watch = routers.Watch(view)
    async with watch.running(), load.running():
        await asyncio.sleep(BEFORE_S)  # the "before" window of the measurement itself
        sent0, failed0 = load.sent, load.failed
        t0 = time.time()
        await redeploy()
        t1 = time.time()
    lat = list(load.latencies)
    return Row(
        name,
        how,
        load.sent - sent0,
        load.failed - failed0,
        pcts([d for at, d in lat if at < t0]),
        pcts([d for at, d in lat if t0 <= at <= t1]),
        [sum(min(b, t1) - a for a, b in watch.out_intervals(s)) for s in servers],
        t1 - t0,
    )


async def one(name: str, how: str, root: Path, load_s: float, rate: float) -> Row:
    async with replicas(root, load_s) as (kits, lb):
        if name == "haproxy":
            names = {k.hostname: f"node{i}" for i, k in enumerate(kits, 1)}
            ports = [(names[k.hostname], k.health_port) for k in kits]
            async with routers.haproxy(root / "haproxy", ports) as h:
                router = {"kind": "haproxy", "socket": str(h.socket), "backend": h.backend}
                return await measure(
                    name,
                    how,
                    h.port,
                    routers.haproxy_view(h),
                    list(names.values()),
                    (lambda: manual(kits))
                    if how == "manual"
                    else (lambda: bot(kits, lb, root, {**router, "servers": names})),
                    rate,
                )
        urls = {k.hostname: f"http://127.0.0.1:{k.health_port}" for k in kits}
        async with routers.vllm_router(root / "vr", list(urls.values())) as vr:
            router = {"kind": "vllm-router", "admin_url": vr.url}
            return await measure(
                name,
                how,
                vr.port,
                routers.vllm_router_view(vr, list(urls.values())),
                list(urls.values()),
                (lambda: manual(kits))
                if how == "manual"
                else (lambda: bot(kits, lb, root, {**router, "servers": urls})),
                rate,
            )


async def main(load_s: float, rate: float, names: list[str]) -> None:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-zero-") as tmp:
        for name in names:
            for how in ("manual", "bot"):
                rows.append(await one(name, how, Path(tmp) / f"{name}-{how}", load_s, rate))
    print(
        f"# {platform.python_implementation()} {platform.python_version()}, model load "
        f"{load_s:g} s, {rate:g} requests/s through the router"
    )
    print(
        "| router | redeploy | took s | requests | failed | p50/p99 ms before "
        "| p50/p99 ms during | out of rotation s (replica 1, 2) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r.router} | {r.how} | {r.took_s:.1f} | {r.sent} | **{r.failed}** | "
            f"{r.before[0]:.1f} / {r.before[1]:.1f} | {r.during[0]:.1f} / {r.during[1]:.1f} | "
            f"{', '.join(f'{s:.1f}' for s in r.out_s)} |"
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--load-s", type=float, default=8.0)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--routers", nargs="+", default=["haproxy", "vllm-router"])
    args = ap.parse_args()
    asyncio.run(main(args.load_s, args.rate, args.routers))
