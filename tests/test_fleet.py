"""GPU status across a fleet: simulated hosts over embedded SSH, plus broken ones.

The broken hosts are real network conditions: a port with nothing listening, a
TCP listener that accepts and never speaks (an SSH server that hangs before its
banner), and a simulated host whose driver is gone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.core.gpu import Gpu, GpuProcess, GpuSnapshot
from bot.errors import InputError
from bot.hosts.fleet import (
    MESSAGE_CHARS,
    HostGpus,
    fleet_gpus,
    fleet_message,
    fleet_summary,
    host_lines,
    render_fleet,
    resolve_targets,
)
from bot.hosts.pool import HostPool
from bot.settings import Settings
from bot.sim.kit import SimKit, fast_config
from bot.sim.sshd import free_port
from tests.fakes import validate_blocks
from tests.support.sim import MakeSimHost

TIMEOUT_S = 2.0


@dataclass
class Fleet:
    kits: list[SimKit]  # gpu-node-1..3 healthy, gpu-node-4 without a driver
    settings: Settings
    hung_accepted: list[float]  # when the silent listener accepted each connection


@pytest.fixture
async def fleet(make_sim_host: MakeSimHost, tmp_path: Path) -> AsyncIterator[Fleet]:
    kits = list(
        await asyncio.gather(
            *(make_sim_host(config=fast_config(hostname=f"gpu-node-{i}")) for i in range(1, 5))
        )
    )
    kits[3].set_faults(no_driver=True)
    accepted: list[float] = []
    writers: list[asyncio.StreamWriter] = []

    async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(time.time())
        writers.append(writer)  # held open, never written to

    listener = await asyncio.start_server(silent, "127.0.0.1", 0)
    hung_port = listener.sockets[0].getsockname()[1]
    hosts: dict[str, Any] = {k.hostname: k.host_settings() for k in kits}
    hosts["gpu-closed"] = kits[0].host_settings(port=free_port())
    hosts["gpu-hung"] = kits[0].host_settings(port=hung_port)
    services = {
        "kimi-k25": kits[0].service_settings(["gpu-node-1", "gpu-node-2"]),
        "glm": kits[0].service_settings(["gpu-node-3", "gpu-node-4", "gpu-hung"]),
    }
    yield Fleet(kits, Settings(hosts=hosts, services=services, db_path=tmp_path / "a.db"), accepted)
    listener.close()
    for w in writers:
        w.close()
    await listener.wait_closed()


def smi_calls(kit: SimKit) -> list[float]:
    return [c.ts for c in kit.calls("nvidia-smi")]


async def test_all_hosts_one_row_each_never_a_failed_query(fleet: Fleet) -> None:
    hosts = resolve_targets(fleet.settings, None)
    assert hosts == [
        "gpu-closed",
        "gpu-hung",
        "gpu-node-1",
        "gpu-node-2",
        "gpu-node-3",
        "gpu-node-4",
    ]
    pool = HostPool(fleet.settings)
    try:
        results = await fleet_gpus(fleet.settings, pool, hosts, TIMEOUT_S)
    finally:
        await pool.close()
    rows = {r.host: r for r in results}
    assert [r.host for r in results] == hosts

    for name in ("gpu-node-1", "gpu-node-2", "gpu-node-3"):
        snap = rows[name].snapshot
        assert snap is not None and rows[name].error is None
        assert len(snap.gpus) == 8
        assert {p.name for p in snap.processes} == {f"VLLM::Worker_TP{i}" for i in range(8)}
    closed, hung, no_driver = rows["gpu-closed"], rows["gpu-hung"], rows["gpu-node-4"]
    assert closed.snapshot is None and closed.unreachable
    assert closed.error is not None and closed.error.startswith("cannot connect")
    assert hung.snapshot is None and hung.unreachable
    assert hung.error == f"no answer within {TIMEOUT_S:g}s"
    assert no_driver.snapshot is None and not no_driver.unreachable
    assert no_driver.error is not None and "driver is not loaded" in no_driver.error

    # One concurrent fan-out: the healthy hosts (after gpu-hung in the list) were all
    # asked before the silent host's timeout ran out.
    [accepted] = fleet.hung_accepted
    for kit in fleet.kits[:3]:
        assert smi_calls(kit) and max(smi_calls(kit)) < accepted + TIMEOUT_S

    summary = fleet_summary(results)
    assert summary.startswith("3/6 hosts ok, 2 unreachable, 1 failed; 24 GPUs: 24 busy, 0 idle; ")
    full = render_fleet(results)
    assert "gpu-closed: UNREACHABLE: cannot connect" in full
    assert "gpu-node-4: UNAVAILABLE: nvidia-smi failed with exit status 9" in full
    assert "VLLM::Worker_TP7" in full


async def test_one_host_and_a_service(fleet: Fleet) -> None:
    assert resolve_targets(fleet.settings, "gpu-node-2") == ["gpu-node-2"]
    targets = resolve_targets(fleet.settings, "glm")
    assert targets == ["gpu-node-3", "gpu-node-4", "gpu-hung"]
    with pytest.raises(InputError, match="neither a host"):
        resolve_targets(fleet.settings, "gpu-node-9")
    pool = HostPool(fleet.settings)
    try:
        results = await fleet_gpus(fleet.settings, pool, targets, TIMEOUT_S)
    finally:
        await pool.close()
    assert [(r.host, r.ok, r.unreachable) for r in results] == [
        ("gpu-node-3", True, False),
        ("gpu-node-4", False, False),
        ("gpu-hung", False, True),
    ]
    # Hosts outside the target were not asked.
    assert smi_calls(fleet.kits[0]) == [] and smi_calls(fleet.kits[1]) == []


def client_ports(server_port: int) -> set[int]:
    """Local ports of established TCP connections to ``server_port`` on 127.0.0.1."""
    ports = set()
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            local, remote, state = line.split()[1:4]
            if state == "01" and int(remote.split(":")[1], 16) == server_port:
                ports.add(int(local.split(":")[1], 16))
    return ports


async def test_warm_repeat_reuses_the_pooled_connections(fleet: Fleet) -> None:
    hosts = ["gpu-node-1", "gpu-node-2", "gpu-node-3"]
    pool = HostPool(fleet.settings)
    try:
        first = await fleet_gpus(fleet.settings, pool, hosts, TIMEOUT_S)
        conns = {k.hostname: client_ports(k.port) for k in fleet.kits[:3]}
        second = await fleet_gpus(fleet.settings, pool, hosts, TIMEOUT_S)
        assert all(r.ok for r in first + second)
        for kit in fleet.kits[:3]:
            assert len(conns[kit.hostname]) == 1  # both queries shared one connection
            assert client_ports(kit.port) == conns[kit.hostname]  # and the repeat too
            # Two GPU queries and the health report (nvidia-smi -q) per host, each time.
            assert len(smi_calls(kit)) == 6
    finally:
        await pool.close()


# --------------------------------------------------------------------------- the message


def gpu(host: int, i: int, busy: bool) -> Gpu:
    uuid = f"GPU-{host:04d}{i:04d}-0000-0000-0000-000000000000"
    procs = (GpuProcess(48221 + i, f"VLLM::Worker_TP{i}", 96998, uuid),) if busy else ()
    return Gpu(i, uuid, "NVIDIA H200", 97000 if busy else 0, 143771, 87 if busy else 0, procs)


def synthetic(
    n: int,
    *,
    unreachable: tuple[int, ...] = (),
    failed: tuple[int, ...] = (),
    idle: tuple[int, ...] = (),
) -> list[HostGpus]:
    out = []
    for h in range(1, n + 1):
        name = f"gpu-node-{h:02d}"
        if h in unreachable:
            out.append(
                HostGpus(
                    name,
                    None,
                    "cannot connect: [Errno 113] No route to host '10.1.7.13' " + "x" * 300,
                    2.0,
                    unreachable=True,
                )
            )
        elif h in failed:
            out.append(
                HostGpus(
                    name,
                    None,
                    "nvidia-smi failed with exit status 9: the NVIDIA driver is not loaded",
                    0.2,
                )
            )
        else:
            gpus = tuple(gpu(h, i, h not in idle) for i in range(8))
            out.append(
                HostGpus(
                    name,
                    GpuSnapshot(name, gpus, tuple(p for g in gpus for p in g.processes)),
                    None,
                    0.2,
                )
            )
    return out


def slack_errors(text: str) -> list[str]:
    return validate_blocks(
        [{"type": "section", "text": {"type": "mrkdwn", "text": f"```\n{text}\n```"}}]
    )


def test_64_hosts_fit_slack_with_the_full_table_attached() -> None:
    results = synthetic(64, unreachable=(17, 40), failed=(63,), idle=(5, 6))
    text, attachment = fleet_message(results)
    assert len(text) <= MESSAGE_CHARS and slack_errors(text) == []
    lines = text.splitlines()
    assert lines[0] == fleet_summary(results)
    assert lines[0].startswith(
        "61/64 hosts ok, 2 unreachable, 1 failed; 488 GPUs: 472 busy, 16 idle; "
    )
    assert lines[1].split() == [
        "HOST",
        "GPUS",
        "BUSY",
        "UTIL",
        "USED",
        "MiB",
        "TOTAL",
        "MiB",
        "HEALTH",
        "PROCESSES",
    ]
    # Problem hosts come first, with their reason, cut to the line width.
    assert lines[2].startswith("gpu-node-17") and "UNREACHABLE: cannot connect" in lines[2]
    assert lines[3].startswith("gpu-node-40")
    assert lines[4] == (
        "gpu-node-63  UNAVAILABLE: nvidia-smi failed with exit status 9: the "
        "NVIDIA driver is not loaded"
    )
    assert lines[5].split() == [
        "gpu-node-01",
        "8",
        "8",
        "87%",
        "776,000",
        "1,150,168",
        "?",
        "8:",
        "VLLM::Worker_TP*",
        "x8",
    ]
    assert lines[9].split() == ["gpu-node-05", "8", "0", "0%", "0", "1,150,168", "?", "-"]
    assert all(len(line) <= 100 for line in lines[1:])  # the table rows
    shown = len(lines) - 3
    assert lines[-1] == f"… {64 - shown} more hosts in the attached file"
    assert attachment == render_fleet(results)
    for h in range(1, 65):
        name = f"gpu-node-{h:02d}"
        assert (f"{name}: 8 GPUs" in attachment) != (h in (17, 40, 63))
    assert attachment.count("VLLM::Worker_TP7") == 61 - 2


def test_a_few_hosts_get_the_full_tables_inline() -> None:
    results = synthetic(2, failed=(2,))
    assert fleet_message(results) == (render_fleet(results), None)
    assert "GPU  NAME" in render_fleet(results)


def test_a_dozen_hosts_get_one_line_each() -> None:
    results = synthetic(12, unreachable=(3,))
    text, attachment = fleet_message(results)
    lines = text.splitlines()
    assert len(lines) == 2 + 12 and attachment == render_fleet(results)
    assert [line.split()[0] for line in lines[2:]] == [f"gpu-node-{h:02d}" for h in range(1, 13)]


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 80),
    max_chars=st.integers(400, 6000),
    down=st.sets(st.integers(1, 80), max_size=20),
)
def test_the_message_always_fits(n: int, max_chars: int, down: set[int]) -> None:
    results = synthetic(n, unreachable=tuple(down))
    text, attachment = fleet_message(results, max_chars=max_chars)
    assert len(text) <= max_chars
    assert (attachment is None) == (text == render_fleet(results))
    if attachment is not None:
        assert text.splitlines()[0] == fleet_summary(results)
    with pytest.raises(ValueError):
        fleet_message(results, max_chars=100)


def test_host_line_groups_numbered_process_names() -> None:
    u = "GPU-00000000-0000-0000-0000-000000000000"
    procs = tuple(
        GpuProcess(pid, name, mib, u)
        for pid, name, mib in (
            (1, "VLLM::Worker_TP0", 90000),
            (2, "VLLM::Worker_TP1", 90000),
            (3, "python3", 500),
            (4, "python3", 400),
            (5, "ray::IDLE", 10),
        )
    )
    snap = GpuSnapshot("h1", (Gpu(0, u, "NVIDIA H200", 180910, 143771, None, procs),), procs)
    [_, line] = host_lines([HostGpus("h1", snap, None, 0.1)])
    # "?": this row's health was not read.
    assert line.split(None, 7) == [
        "h1",
        "1",
        "1",
        "n/a",
        "180,910",
        "143,771",
        "?",
        "5: VLLM::Worker_TP* x2, python3 x2, ray::IDLE",
    ]
