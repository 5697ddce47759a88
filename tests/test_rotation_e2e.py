"""Zero-downtime redeploys behind real routers (issue 19): a real HAProxy 2.6 (Debian's)
and a real vLLM Router (PyPI `vllm-router`) in front of two simulated vLLM replicas,
reached by the bot through SSH from a third host (`lb-1`), under a constant stream of
client requests through the router (tests/support/routers.py).

What is judged is what the client saw and what the hosts and the audit log recorded:
zero failed requests during the roll, each replica out of rotation around exactly its
own stop and start, and a rotation row for every change. The control test shows the
same client does see the outage when the service has no router."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from bot.audit.rotations import RotationRow
from bot.audit.store import AuditLog
from bot.core import events as ev
from bot.core.doctor_types import Check, Outcome
from bot.core.routers.haproxy import parse_show_stat
from bot.engine.doctor import run_doctor
from bot.engine.recovery import recover
from bot.engine.runtime import Runtime, open_runtime
from bot.settings import Settings
from bot.sim.kit import SERVICE, SimKit, fast_config, fleet_fragment
from tests.polling import eventually
from tests.support import routers
from tests.support.cli import cli, write_toml
from tests.support.sim import MakeSimHost
from tests.test_rollout import Recorder, first_ts, redeploy, stopped_at

MODEL = "kimi-k2.5"  # the simulated server's served_model


async def fleet(make_sim_host: MakeSimHost, tmp_path: Path) -> tuple[list[SimKit], SimKit]:
    venv = tmp_path / "opt-venv"
    kits = list(
        await asyncio.gather(
            *(
                make_sim_host(
                    config=fast_config(hostname=f"gpu-node-{i}"), venv_dir=venv, service_port=8000
                )
                for i in (1, 2)
            )
        )
    )
    lb = await make_sim_host(config=fast_config(hostname="lb-1"))
    return kits, lb


def settings(
    kits: list[SimKit],
    lb: SimKit,
    tmp_path: Path,
    router: dict[str, Any] | None,
    servers: dict[str, str],
    **svc: Any,
) -> Settings:
    return Settings(**fragment(kits, lb, router, servers, **svc), db_path=tmp_path / "audit.db")


def fragment(
    kits: list[SimKit],
    lb: SimKit,
    router: dict[str, Any] | None,
    servers: dict[str, str],
    **svc: Any,
) -> dict[str, Any]:
    frag = fleet_fragment(kits, max_unavailable=1, **svc)
    frag["hosts"]["lb-1"] = lb.host_settings()
    if router is not None:
        frag["services"][SERVICE].update(router="front", router_servers=servers, min_serving=1)
        # Short waits: the simulated replicas finish a request in milliseconds.
        frag["routers"] = {"front": {"host": "lb-1", "settle_s": 0.5, "poll_s": 0.1, **router}}
    return frag


def haproxy_servers(kits: list[SimKit]) -> tuple[dict[str, str], list[tuple[str, int]]]:
    """Each replica's HAProxy server name (``node1``...) and the port it really serves on."""
    servers = {k.hostname: f"node{i}" for i, k in enumerate(kits, 1)}
    return servers, [(servers[k.hostname], k.health_port) for k in kits]


def haproxy_router(h: routers.HAProxy) -> dict[str, Any]:
    return {"kind": "haproxy", "socket": str(h.socket), "backend": h.backend}


def when(row: RotationRow) -> float:
    return datetime.fromisoformat(row.at).timestamp()


def ready_at(kit: SimKit, after: float) -> float:
    """The first health answer of the new server: after its start."""
    return min(c.ts for c in kit.calls() if c.argv[:2] == ("GET", "/health") and c.ts > after)


async def rotation_rows(rt: Runtime, run_id: int) -> list[RotationRow]:
    return (await rt.audit.rotations([run_id])).get(run_id, [])


def assert_out_exactly_around_its_own_redeploy(
    kits: list[SimKit], rows: list[RotationRow], servers: dict[str, str], watch: routers.Watch
) -> None:
    """Each replica left the router's rotation (as the router itself showed it, read every
    20 ms) once, before its stop, and came back only after its new server answered
    health; one at a time; and the audit log has each change."""
    assert [(r.host, r.change, r.ok) for r in rows] == [
        ("gpu-node-1", "out", True),
        ("gpu-node-1", "in", True),
        ("gpu-node-2", "out", True),
        ("gpu-node-2", "in", True),
    ]
    by = {(r.host, r.change): r for r in rows}
    spans = []
    for kit in kits:
        server = servers[kit.hostname]
        assert by[(kit.hostname, "out")].server == by[(kit.hostname, "in")].server == server
        stop = stopped_at(kit)
        start = first_ts(kit, ("systemctl", "start"))
        ready = ready_at(kit, start)
        [(left, back)] = watch.out_intervals(server)
        assert left < stop < start < ready < back
        # the audit rows' times (whole seconds) bracket the same span
        assert when(by[(kit.hostname, "out")]) <= stop
        assert ready < when(by[(kit.hostname, "in")]) + 1
        spans.append((left, back))
    (_, first_back), (second_out, _) = spans
    assert first_back <= second_out


def steps_of(heard: Recorder) -> list[tuple[str, str, str]]:
    """Each host's steps as they ended, for a failure's message."""
    return [(e.host, e.step, e.status) for e in heard.events if isinstance(e, ev.StepFinished)]


async def roll_under_load(
    s: Settings,
    port: int,
    view: Callable[[], Awaitable[dict[str, bool]]],
    kits: list[SimKit],
    servers: dict[str, str],
    log: Path | None = None,
) -> None:
    """A rolling redeploy of both replicas with the client sending through the router at
    ``port`` and a watcher reading the router's own view: it succeeds, no request fails,
    requests really flowed, and each replica was out exactly around its own redeploy.
    ``log``: the router's own log, shown when a request failed."""
    async with open_runtime(s) as rt:
        watch = routers.Watch(view)
        async with watch.running(), routers.Load(port, MODEL).running() as load:
            result, heard = await redeploy(rt, version="0.31.0")
        rows = await rotation_rows(rt, result.run_id)
    assert result.status == "succeeded", result.summary
    # Where a request failed, say when against the run and the router's own view: a
    # failure under a loaded machine must leave more than its count behind.
    assert load.failed == 0, (
        f"{load.failed} of {load.sent} failed; first: {load.failures[:3]}, last: "
        f"{load.failures[-3:]}\nrouter view changes: {watch.changes}\nrotations: "
        f"{[(r.host, r.change, r.at) for r in rows]}\nsteps: {steps_of(heard)}\nrouter log:\n"
        + ("\n".join(log.read_text(errors="replace").splitlines()[-60:]) if log else "")
    )
    assert load.ok > 50  # requests really flowed through the whole roll
    assert_out_exactly_around_its_own_redeploy(kits, rows, servers, watch)


async def test_haproxy_rolling_redeploy_loses_no_request(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    kits, lb = await fleet(make_sim_host, tmp_path)
    servers, ports = haproxy_servers(kits)
    async with routers.haproxy(tmp_path / "haproxy", ports) as h:
        s = settings(kits, lb, tmp_path, haproxy_router(h), servers)
        await roll_under_load(s, h.port, routers.haproxy_view(h), kits, servers)
        stat = await h.say("show stat")
        views = parse_show_stat(stat, h.backend)
        assert {n: (v.detail.split(" ")[0]) for n, v in views.items()} == {
            "node1": "UP",
            "node2": "UP",
        }
        for kit in kits:
            assert kit.installed_version == "0.31.0" and kit.unit_state() == "active"


async def test_without_a_router_the_same_client_sees_the_outage(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    """The control: HAProxy in front, but the service does not name it, so the bot stops
    each replica while HAProxy still sends it requests. If the client could not see an
    outage, the zero above would prove nothing."""
    kits, lb = await fleet(make_sim_host, tmp_path)
    ports = [(f"node{i}", k.health_port) for i, k in enumerate(kits, 1)]
    async with routers.haproxy(tmp_path / "haproxy", ports) as h:
        s = settings(kits, lb, tmp_path, None, {})
        async with open_runtime(s) as rt:
            async with routers.Load(h.port, MODEL).running() as load:
                result, _ = await redeploy(rt, version="0.31.0")
            assert await rotation_rows(rt, result.run_id) == []
        assert result.status == "succeeded", result.summary
        assert load.failed > 0


async def test_haproxy_failed_redeploy_stays_out_and_the_other_serves(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    kits, lb = await fleet(make_sim_host, tmp_path)
    servers, ports = haproxy_servers(kits)
    kits[0].set_faults(uv_fails=True)
    async with routers.haproxy(tmp_path / "haproxy", ports) as h:
        s = settings(kits, lb, tmp_path, haproxy_router(h), servers)
        async with open_runtime(s) as rt:
            async with routers.Load(h.port, MODEL).running() as load:
                result, _ = await redeploy(rt, version="0.31.0")
            rows = await rotation_rows(rt, result.run_id)
        assert result.status != "succeeded"
        assert "gpu-node-1 stays out of rotation (router front, server node1)" in result.summary
        assert load.failed == 0, load.failures[:5]
        views = parse_show_stat(await h.say("show stat"), h.backend)
        assert views["node1"].detail == "MAINT" and views["node2"].detail.startswith("UP")
        # the roll stopped there: the second replica was never touched
        assert "stop" not in kits[1].changes()
        assert [(r.host, r.change, r.ok) for r in rows] == [("gpu-node-1", "out", True)]


async def test_haproxy_min_serving_refuses_to_take_out_the_only_serving_replica(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    kits, lb = await fleet(make_sim_host, tmp_path)
    servers, ports = haproxy_servers(kits)
    async with routers.haproxy(tmp_path / "haproxy", ports) as h:
        # node2 was put in maintenance by hand: node1 is the only one serving
        assert (await h.say(f"set server {h.backend}/node2 state maint")).strip() == ""
        s = settings(kits, lb, tmp_path, haproxy_router(h), servers)
        async with open_runtime(s) as rt:
            result, _ = await redeploy(rt, version="0.31.0")
            rows = await rotation_rows(rt, result.run_id)
        assert result.status == "aborted", result.summary
        assert "refused to take gpu-node-1 out of rotation: 0 of 1 others serving" in (
            result.summary
        )
        assert rows == [] and "stop" not in kits[0].changes()
        views = parse_show_stat(await h.say("show stat"), h.backend)
        assert views["node1"].detail.startswith("UP") and views["node2"].detail == "MAINT"


async def test_vllm_router_rolling_redeploy_loses_no_request(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    kits, lb = await fleet(make_sim_host, tmp_path)
    servers = {k.hostname: f"http://127.0.0.1:{k.health_port}" for k in kits}
    async with routers.vllm_router(tmp_path / "vr", list(servers.values())) as vr:
        router = {"kind": "vllm-router", "admin_url": vr.url}
        s = settings(kits, lb, tmp_path, router, servers)
        view = routers.vllm_router_view(vr, list(servers.values()))
        await roll_under_load(s, vr.port, view, kits, servers, log=vr.log)
        status, body = await routers.http(vr.port, "GET", "/workers")
        assert status == 200 and all(u.encode() in body for u in servers.values())


async def test_a_bot_killed_mid_roll_leaves_the_replica_out_and_recovery_says_so(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    """kill -9 of the CLI while gpu-node-1 reinstalls: HAProxy keeps it in maintenance and
    gpu-node-2 serving (no client request fails), and the restarted bot's recovery names
    the replica out of rotation and the command that puts it back."""
    kits, lb = await fleet(make_sim_host, tmp_path)
    servers, ports = haproxy_servers(kits)
    kits[0].set_faults(uv_stalls=True)  # the reinstall goes on until the kill
    db = tmp_path / "audit.db"
    async with routers.haproxy(tmp_path / "haproxy", ports) as h:
        config = write_toml(
            tmp_path / "chatops.toml", fragment(kits, lb, haproxy_router(h), servers)
        )
        env = {
            **os.environ,
            "CHATOPS_CONFIG": str(config),
            "CHATOPS_DB": str(db),
            "PYTHONPATH": str(Path(__file__).parent.parent),
        }
        argv = [sys.executable, "-m", "bot", "redeploy", SERVICE, "--version", "0.31.0", "--yes"]
        async with routers.Load(h.port, MODEL).running() as load:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=tmp_path,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            try:

                def in_reinstall() -> bool:
                    try:
                        row = _db_row(db, "SELECT status FROM steps WHERE step = 'reinstall'")
                    except sqlite3.OperationalError:  # no database or tables yet
                        return False
                    return row == ("running",)

                await eventually(in_reinstall, "the CLI reached gpu-node-1's reinstall", 60)
                proc.send_signal(signal.SIGKILL)
            finally:
                if proc.returncode is None:
                    proc.kill()
                await proc.wait()
            views = parse_show_stat(await h.say("show stat"), h.backend)
        assert load.failed == 0, load.failures[:5]
        assert views["node1"].detail == "MAINT" and views["node2"].detail.startswith("UP")
        async with AuditLog.open(db) as audit:
            [interrupted] = await recover(audit)
        msg = interrupted.message
        assert "during step `reinstall`" in msg
        assert "gpu-node-1 may be OUT of rotation at router front (server node1" in msg
        assert f"`/vllm undrain {SERVICE} gpu-node-1`" in msg
        assert "gpu-node-2" not in msg  # never touched
        assert "stop" not in kits[1].changes()


def _db_row(db: Path, sql: str) -> tuple[Any, ...] | None:
    if not db.exists():
        raise sqlite3.OperationalError("no database yet")
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
        return conn.execute(sql).fetchone()  # type: ignore[no-any-return]


# ---- doctor against the real routers ----------------------------------------------------


async def router_checks(s: Settings) -> list[Check]:
    async with open_runtime(s) as rt:
        checks = await run_doctor(rt.settings, rt.pool, ["gpu-node-1"], SERVICE)
    return [c for c in checks if c.name == "router"]


async def test_doctor_reads_the_real_haproxy_and_names_a_server_it_lacks(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    kits, lb = await fleet(make_sim_host, tmp_path)
    servers, ports = haproxy_servers(kits)
    async with routers.haproxy(tmp_path / "haproxy", ports) as h:
        [good] = await router_checks(settings(kits, lb, tmp_path, haproxy_router(h), servers))
        assert (good.host, good.outcome) == ("lb-1", Outcome.OK), good.detail
        assert "node1 UP" in good.detail and "node2 UP" in good.detail
        wrong = {**servers, "gpu-node-2": "node7"}
        [bad] = await router_checks(settings(kits, lb, tmp_path, haproxy_router(h), wrong))
        assert bad.outcome == Outcome.FAIL
        assert "backend vllm_kimi has no server node7" in bad.detail
        assert "(it has: node1, node2)" in bad.detail
        other = {**haproxy_router(h), "socket": str(tmp_path / "nowhere.sock")}
        [gone] = await router_checks(settings(kits, lb, tmp_path, other, servers))
        assert gone.outcome == Outcome.FAIL and "No such file or directory" in gone.detail


async def test_doctor_reads_the_real_vllm_router_and_warns_of_a_worker_it_lacks(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    kits, lb = await fleet(make_sim_host, tmp_path)
    servers = {k.hostname: f"http://127.0.0.1:{k.health_port}" for k in kits}
    async with routers.vllm_router(tmp_path / "vr", list(servers.values())) as vr:
        router = {"kind": "vllm-router", "admin_url": vr.url}
        [good] = await router_checks(settings(kits, lb, tmp_path, router, servers))
        assert good.outcome == Outcome.OK, good.detail
        assert good.detail.count("healthy") == 2
        # started with its default policy, but the config does not say so
        assert "its load is not counted (no policy set)" in good.detail
        wrong = {**servers, "gpu-node-2": "http://127.0.0.1:9"}
        [bad] = await router_checks(settings(kits, lb, tmp_path, router, wrong))
        assert bad.outcome == Outcome.WARN
        assert "not among its workers: http://127.0.0.1:9" in bad.detail
        down = {"kind": "vllm-router", "admin_url": "http://127.0.0.1:9"}
        [gone] = await router_checks(settings(kits, lb, tmp_path, down, servers))
        assert gone.outcome == Outcome.FAIL and "GET /workers" in gone.detail


# ---- the command kind, driving the same real HAProxy through the operator's script -----

LB_SCRIPT = """#!/bin/sh
# An operator's own wrapper: out / in / sessions SERVER, on HAProxy's admin socket.
say() {{ echo "$1" | {socat} -t 5 stdio unix-connect:{socket}; }}
case "$1" in
  out) say "set server {backend}/$2 state drain" ;;
  in) say "set server {backend}/$2 state ready" ;;
  sessions) say "show stat" | awk -F, -v s="$2" '$1 == "{backend}" && $2 == s {{ print $5 }}' ;;
  *) echo "usage: lb out|in|sessions SERVER" >&2; exit 2 ;;
esac
"""


async def test_command_kind_rolling_redeploy_loses_no_request(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    kits, lb = await fleet(make_sim_host, tmp_path)
    servers, ports = haproxy_servers(kits)
    async with routers.haproxy(tmp_path / "haproxy", ports) as h:
        script = tmp_path / "lb"
        script.write_text(LB_SCRIPT.format(socat=routers.SOCAT, socket=h.socket, backend=h.backend))
        script.chmod(0o755)
        lb_cmd = str(script)
        router = {
            "kind": "command",
            "drain": [lb_cmd, "out", "{server}"],
            "undrain": [lb_cmd, "in", "{server}"],
            "in_flight": [lb_cmd, "sessions", "{server}"],
        }
        s = settings(kits, lb, tmp_path, router, servers)
        await roll_under_load(s, h.port, routers.haproxy_view(h), kits, servers)


# ---- drain, rotation and undrain by hand, from the terminal -------------------------------


async def test_drain_rotation_undrain_from_the_cli_against_the_real_haproxy(
    make_sim_host: MakeSimHost, tmp_path: Path
) -> None:
    kits, lb = await fleet(make_sim_host, tmp_path)
    servers, ports = haproxy_servers(kits)
    async with routers.haproxy(tmp_path / "haproxy", ports) as h:
        config = write_toml(
            tmp_path / "chatops.toml", fragment(kits, lb, haproxy_router(h), servers)
        )
        env = {"CHATOPS_CONFIG": str(config), "CHATOPS_DB": str(tmp_path / "audit.db")}

        async def bot(*args: str) -> tuple[int, str]:
            code, out, err = await cli(*args, cwd=tmp_path, env=env)
            return code, out + err

        async def states() -> dict[str, str]:
            views = parse_show_stat(await h.say("show stat"), h.backend)
            return {n: v.detail.split(" ")[0] for n, v in views.items()}

        async with routers.Load(h.port, MODEL).running() as load:
            code, out = await bot("drain", SERVICE, "gpu-node-1", "--yes")
            assert code == 0, out
            assert await states() == {"node1": "MAINT", "node2": "UP"}
            code, out = await bot("rotation", SERVICE)
            assert code == 0, out
            assert "gpu-node-1" in out and "OUT of rotation (MAINT" in out
            assert "in rotation (UP" in out
            # the only serving replica stays in
            code, out = await bot("drain", SERVICE, "gpu-node-2", "--yes")
            assert code != 0
            assert "refused to take gpu-node-2 out of rotation: 0 of 1 others serving" in out
            assert await states() == {"node1": "MAINT", "node2": "UP"}
            code, out = await bot("undrain", SERVICE, "gpu-node-1", "--yes")
            assert code == 0, out
            assert await states() == {"node1": "UP", "node2": "UP"}
        assert load.failed == 0, load.failures[:5]
        # nothing was stopped or started by any of them
        for kit in kits:
            assert "stop" not in kit.changes() and "start" not in kit.changes()
        async with AuditLog.open(tmp_path / "audit.db") as audit:
            runs = await audit.list_runs()
            by_action = {(r.action, r.status) for r in runs}
            # The rotation read is no run: only the changes are recorded.
            assert by_action == {
                ("drain", "succeeded"),
                ("drain", "aborted"),
                ("undrain", "succeeded"),
            }
            moved = await audit.rotations([r.id for r in runs])
        changes = sorted(
            (r.run_id, r.host, r.change, r.ok) for rows in moved.values() for r in rows
        )
        assert [c[1:] for c in changes] == [("gpu-node-1", "out", True), ("gpu-node-1", "in", True)]
