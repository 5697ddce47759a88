"""The real routers as operators leave them: a worker a vLLM Router lists under another
spelling than the config's (a trailing `/`) or once per data-parallel rank, a replica
out of rotation by hand (HAProxy MAINT, a worker removed), an HAProxy server of weight 0
or named by its address, and the vLLM Router's `load` under each policy. Each with the
real HAProxy 2.6 (Debian's) or vLLM Router 0.1.17 (PyPI) in front of two simulated
replicas reached through SSH from `lb-1`, most under client load
(tests/support/routers.py), as tests/test_rotation_e2e.py.

What is judged is what the router showed and what the clients saw: the bot never stops
a replica the router still routes to, never puts back one an operator took out, never
counts a server that takes no request as serving, and leaves each worker listed once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

from bot.core.routers import vllm_router
from bot.core.routers.haproxy import parse_show_stat
from bot.core.routers.view import Rotation
from bot.core.status import Action, Decision, RunStatus, Source
from bot.engine.engine import RunResult
from bot.engine.runtime import Runtime, open_runtime
from bot.sim.kit import SERVICE, SimKit
from bot.sim.sshd import free_port
from tests.support import routers
from tests.support.sim import MakeSimHost
from tests.test_rollout import Recorder, redeploy
from tests.test_rotation_e2e import (
    MODEL,
    fleet,
    haproxy_router,
    haproxy_servers,
    roll_under_load,
    rotation_rows,
    settings,
)

# Where one replica serves every request for the whole run: 20 a second, not the 50 of
# tests/test_rotation_e2e.py, so a loaded machine's one simulated server keeps up (a
# stopped replica the router still routes to fails requests at any rate).
ONE_REPLICA_S = 0.05


def urls(kits: list[SimKit]) -> dict[str, str]:
    return {k.hostname: f"http://127.0.0.1:{k.health_port}" for k in kits}


async def listed(vr: routers.VllmRouter) -> list[str]:
    return sorted(url for url, _ in await routers.listed_workers(vr))


async def run_action(rt: Runtime, action: Action, **plan: Any) -> RunResult:
    p = rt.engine.plan(action, SERVICE, **plan)
    record = await rt.lifecycle.request(p, requested_by="U0ALICE", source=Source.CLI)
    await rt.audit.record_decision(record.id, "U0BOB", Decision.APPROVE)
    assert await rt.audit.transition(
        record.id, RunStatus.APPROVED, expect=(RunStatus.PENDING_APPROVAL,)
    )
    return await rt.engine.execute(record.id, Recorder())


# ---- vLLM Router: the URL as the router spells it ---------------------------------------


async def test_vllm_router_worker_added_with_a_trailing_slash_is_taken_out_as_listed(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    """The router was given gpu-node-1 as `http://127.0.0.1:P/`, the config says
    `http://127.0.0.1:P`: the real router ignores a removal under the config's spelling
    (200, "not found, skipping removal"). The bot removes and adds it under the
    router's spelling: no request fails, each replica leaves the router's list exactly
    around its own redeploy, and each is listed once at the end, as it was."""
    kits, lb = await fleet(make_sim_host, tmp_path)
    servers = urls(kits)
    given = [servers["gpu-node-1"] + "/", servers["gpu-node-2"]]
    async with routers.vllm_router(tmp_path / "vr", given, policy="round_robin") as vr:
        router = {"kind": "vllm-router", "admin_url": vr.url}
        s = settings(kits, lb, tmp_path, router, servers)
        view = routers.vllm_router_view(vr, list(servers.values()))
        await roll_under_load(s, vr.port, view, kits, servers)
        assert await listed(vr) == sorted(given)


async def test_vllm_router_data_parallel_ranks_are_one_replica_each(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    """`--intra-node-data-parallel-size 2`: the router lists `http://127.0.0.1:P@0` and
    `@1` for each worker. The configured base URL is listed (else min_serving would
    refuse every roll), and remove/add with it take out and put back every rank."""
    kits, lb = await fleet(make_sim_host, tmp_path)
    servers = urls(kits)
    async with routers.vllm_router(
        tmp_path / "vr", list(servers.values()), policy="power_of_two", dp=2
    ) as vr:
        router = {"kind": "vllm-router", "admin_url": vr.url, "policy": "power_of_two"}
        s = settings(kits, lb, tmp_path, router, servers)
        view = routers.vllm_router_view(vr, list(servers.values()))
        await roll_under_load(s, vr.port, view, kits, servers)
        assert await listed(vr) == sorted(f"{u}@{i}" for u in servers.values() for i in (0, 1))


async def test_vllm_router_worker_removed_by_hand_is_redeployed_and_not_added_back(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    """gpu-node-1's worker removed from the router by hand: the redeploy still updates
    it, sends the router nothing for it and leaves it out; gpu-node-2, then the only
    one serving, is refused (min_serving 1). No client request fails."""
    kits, lb = await fleet(make_sim_host, tmp_path)
    servers = urls(kits)
    async with routers.vllm_router(tmp_path / "vr", list(servers.values())) as vr:
        url = vllm_router.remove_worker_url(vr.url, servers["gpu-node-1"]).split("/", 3)[3]
        status, _ = await routers.http(vr.port, "POST", "/" + url)
        assert status == 200 and await listed(vr) == [servers["gpu-node-2"]]
        router = {"kind": "vllm-router", "admin_url": vr.url}
        s = settings(kits, lb, tmp_path, router, servers)
        async with open_runtime(s) as rt:
            async with routers.Load(vr.port, MODEL, ONE_REPLICA_S).running() as load:
                result, _ = await redeploy(rt, version="0.31.0")
            rows = await rotation_rows(rt, result.run_id)
        assert load.failed == 0, load.failures[:5]
        assert kits[0].installed_version == "0.31.0" and kits[0].unit_state() == "active"
        assert "held out of rotation by hand (not listed); left out" in result.summary
        assert "refused to take gpu-node-2 out of rotation: 0 of 1 others serving" in (
            result.summary
        )
        assert "stop" not in kits[1].changes()
        assert [(r.host, r.change, r.ok) for r in rows] == [("gpu-node-1", "out", True)]
        assert rows[0].detail.startswith("held out of rotation by hand")
        assert await listed(vr) == [servers["gpu-node-2"]]


# ---- HAProxy: out by hand, weight 0, a server named by its address ----------------------


async def test_haproxy_server_in_maint_by_hand_is_redeployed_and_stays_in_maint(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    """node1 in MAINT by the operator's hand: a `state drain` would lift the MAINT and
    the put-back would end it. The redeploy updates gpu-node-1 and leaves node1 in
    MAINT, never in rotation; gpu-node-2 is then the only one serving and refused."""
    kits, lb = await fleet(make_sim_host, tmp_path)
    servers, ports = haproxy_servers(kits)
    async with routers.haproxy(tmp_path / "haproxy", ports) as h:
        assert (await h.say(f"set server {h.backend}/node1 state maint")).strip() == ""
        s = settings(kits, lb, tmp_path, haproxy_router(h), servers)
        watch = routers.Watch(routers.haproxy_view(h))
        async with open_runtime(s) as rt:
            async with (
                watch.running(),
                routers.Load(h.port, MODEL, ONE_REPLICA_S).running() as load,
            ):
                result, _ = await redeploy(rt, version="0.31.0")
            rows = await rotation_rows(rt, result.run_id)
        assert load.failed == 0, load.failures[:5]
        assert kits[0].installed_version == "0.31.0" and kits[0].unit_state() == "active"
        assert "held out of rotation by hand (MAINT); left out" in result.summary
        assert "stop" not in kits[1].changes()
        views = parse_show_stat(await h.say("show stat"), h.backend)
        assert views["node1"].detail == "MAINT" and views["node2"].detail.startswith("UP")
        # out from the first read to the end: never put back, not for a moment
        assert [inside for _, s_, inside in watch.changes if s_ == "node1"] == [False]
        assert [(r.host, r.change, r.ok) for r in rows] == [("gpu-node-1", "out", True)]


async def test_haproxy_server_of_weight_zero_is_not_serving(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    """`set weight vllm_kimi/node2 0`: HAProxy shows node2 `UP` and sends it nothing. It
    must not count toward min_serving, or taking node1 out leaves no server and clients
    get 503s; the bot refuses before any change and no request fails."""
    kits, lb = await fleet(make_sim_host, tmp_path)
    servers, ports = haproxy_servers(kits)
    async with routers.haproxy(tmp_path / "haproxy", ports) as h:
        assert (await h.say(f"set weight {h.backend}/node2 0")).strip() == ""
        s = settings(kits, lb, tmp_path, haproxy_router(h), servers)
        async with open_runtime(s) as rt:
            async with routers.Load(h.port, MODEL, ONE_REPLICA_S).running() as load:
                result, _ = await redeploy(rt, version="0.31.0")
            rows = await rotation_rows(rt, result.run_id)
        assert result.status == "aborted", result.summary
        assert "0 of 1 others serving" in result.summary and "UP, weight 0" in result.summary
        assert load.failed == 0, load.failures[:5]
        assert load.ok > 0
        assert rows == [] and all("stop" not in k.changes() for k in kits)


async def test_haproxy_server_named_by_its_address_is_drained_and_put_back(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    """Servers named `127.0.0.1:PORT`, as HAProxy names one added without a name: the
    real HAProxy takes `set server vllm_kimi/127.0.0.1:PORT state drain` (and maint,
    ready) from the bot's drain and undrain."""
    kits, lb = await fleet(make_sim_host, tmp_path)
    servers = {k.hostname: f"127.0.0.1:{k.health_port}" for k in kits}
    ports = [(servers[k.hostname], k.health_port) for k in kits]
    one = servers["gpu-node-1"]
    async with routers.haproxy(tmp_path / "haproxy", ports) as h:
        s = settings(kits, lb, tmp_path, haproxy_router(h), servers)

        async def state() -> str:
            return parse_show_stat(await h.say("show stat"), h.backend)[one].detail

        async with open_runtime(s) as rt:
            drained = await run_action(rt, Action.DRAIN, host="gpu-node-1")
            assert drained.status == "succeeded", drained.summary
            assert await state() == "MAINT"
            back = await run_action(rt, Action.UNDRAIN, host="gpu-node-1")
            assert back.status == "succeeded", back.summary
            assert (await state()).startswith("UP")


# ---- vLLM Router's `load`, policy by policy --------------------------------------------


@asynccontextmanager
async def held_workers() -> AsyncIterator[tuple[list[int], asyncio.Event, asyncio.Semaphore]]:
    """Two workers that answer /health at once and hold each completion until released
    (the router skips its policy for a single worker, so two): their ports, the
    release, one count per completion they hold."""
    release, held = asyncio.Event(), asyncio.Semaphore(0)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A connection the router opens and drops (its pool) ends here, quietly.
        with suppress(asyncio.IncompleteReadError, ConnectionError):
            await answer(reader, writer)
        writer.close()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.lower().split(b"\r\n")
        size = next((int(ln[15:]) for ln in lines if ln.startswith(b"content-length:")), 0)
        await reader.readexactly(size)
        if head.startswith(b"POST"):
            held.release()
            await release.wait()
        body = json.dumps({"choices": [{"text": "x"}]}).encode()
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()

    ports = [free_port(), free_port()]
    servers = [await asyncio.start_server(serve, "127.0.0.1", p) for p in ports]
    try:
        yield ports, release, held
    finally:
        release.set()
        for server in servers:
            server.close()
            await server.wait_closed()


async def load_read_with_requests_in_flight(tmp_path: Path, policy: str, n: int) -> int:
    """``n`` completions held in flight through the real router of ``policy``: the sum
    of the `load` GET /workers reports for its workers."""
    async with held_workers() as (ports, release, held):
        workers = [f"http://127.0.0.1:{p}" for p in ports]
        async with routers.vllm_router(tmp_path / policy, workers, policy=policy) as vr:
            body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2}).encode()
            sent = [
                asyncio.create_task(routers.http(vr.port, "POST", "/v1/completions", body, 60))
                for _ in range(n)
            ]
            for _ in range(n):  # the worker holds every one of them now
                await asyncio.wait_for(held.acquire(), 60)
            status, reply = await routers.http(vr.port, "GET", "/workers")
            release.set()
            await asyncio.gather(*sent)
    assert status == 200
    read = vllm_router.parse_workers(status, reply.decode(), workers, policy=policy)
    raw = sum(int(w["load"]) for w in json.loads(reply)["workers"])
    assert all(read.of(w).rotation == Rotation.IN for w in workers)
    # what the bot makes of it: the count where the policy keeps one, else not known
    sessions = [read.of(w).sessions for w in workers]
    if policy in vllm_router.COUNTS_LOAD:
        assert sum(n or 0 for n in sessions) == raw
    else:
        assert sessions == [None, None]
    return raw


async def test_vllm_router_load_counts_requests_only_under_some_policies(tmp_path: Path) -> None:
    """Three completions held in flight: `power_of_two` reports load 3, `round_robin`
    reports 0, which the bot must never read as "no session"."""
    assert await load_read_with_requests_in_flight(tmp_path, "power_of_two", 3) == 3
    assert await load_read_with_requests_in_flight(tmp_path, "round_robin", 3) == 0
