"""``/vllm gpus`` over 200 canned hosts: the fan-out's bound, the per-state summary, the
hosts named within Slack's limits, and the whole table as a file.

The hosts come from the config; each answers through the scripted transport at the
seam (``bot.hosts.mock``) with canned GPU output (``bot.sim.canned_fleet``). The pool
counts the transports open at once: a transport is open from the pool's ``_open`` until
its ``close``. Every host's read suspends (its two queries are gathered), so an
unbounded fan-out would hold all 200 open at once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from bot.cli.main import gpus_text
from bot.core import remote
from bot.errors import HostUnreachableError
from bot.hosts.fleet import fleet_gpus
from bot.hosts.fleet_states import MAX_NAMED, HostState, fleet_states, summary_text
from bot.hosts.mock import Command, MockPool, MockTransport, Reply
from bot.settings import FleetSettings, Settings
from bot.sim import canned_fleet
from bot.sim.kit import SimKit
from bot.slack.block_kit import MAX_BLOCKS, MAX_SECTION_TEXT
from tests.fakes import validate_blocks
from tests.polling import eventually
from tests.slack_harness import CHANNEL, SERVICE, blocks_text, slack_bot

N = 200
UNREACHABLE = set(range(10, 35))  # 25: more than one list names
NO_DRIVER = {50, 51, 52}
CRITICAL = {60, 61}
HEALTH_FAILS = {70, 71, 72, 73}


def name(i: int) -> str:
    return f"gpu-node-{i}"


def reply(i: int, command: Command) -> Reply:
    if i in UNREACHABLE:
        raise HostUnreachableError(name(i), "cannot connect: [Errno 111] Connection refused")
    argv = command.argv
    if i in NO_DRIVER and argv[0] == "nvidia-smi":
        return Reply(stdout="NVIDIA-SMI has failed: the NVIDIA driver is not loaded", exit_status=9)
    if i in HEALTH_FAILS and argv[:2] == ("nvidia-smi", "-q"):
        return Reply(stderr="nvidia-smi: Permission denied", exit_status=1)
    out, err, status = canned_fleet.answer(argv, critical=i in CRITICAL)
    return Reply(stdout=out, stderr=err, exit_status=status)


class CountingPool(MockPool):
    """Each ``_open`` is a new scripted transport; counts those open at once."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings, {})
        self.open = self.max_open = self.opened = 0

    def _open(self, host: str) -> MockTransport:
        if host not in self._settings.hosts:
            return super()._open(host)
        i = int(host.rsplit("-", 1)[1])
        pool = self

        class Counted(MockTransport):
            async def close(self) -> None:
                if not self.closed:
                    pool.open -= 1
                await super().close()

        self.open += 1
        self.opened += 1
        self.max_open = max(self.max_open, self.open)
        return Counted(host, lambda c: reply(i, c))


def host_settings(template: dict[str, Any]) -> dict[str, Any]:
    return {name(i): template for i in range(1, N + 1)}


def fleet_settings(tmp_path: Path, limit: int) -> Settings:
    (tmp_path / "kh").write_text("")  # never read: no host is dialled
    cfg = {"address": "127.0.0.1", "known_hosts": str(tmp_path / "kh")}
    return Settings(
        hosts=host_settings(cfg), fleet={"max_connections": limit}, db_path=tmp_path / "a.db"
    )


async def test_200_hosts_never_more_than_the_limit_open_and_none_left(tmp_path: Path) -> None:
    settings = fleet_settings(tmp_path, 16)
    pool = CountingPool(settings)
    hosts = sorted(settings.hosts)
    results = await fleet_gpus(settings, pool, hosts, 5.0)
    assert [r.host for r in results] == hosts
    # The bound is reached (the fan-out is concurrent) and never passed.
    assert pool.max_open == 16
    # More hosts than the limit: every connection it opened is closed, none pooled.
    assert pool.opened == N and pool.open == 0 and not pool._transports

    states = fleet_states(results)
    assert {s: states.count(s) for s in HostState} == {
        HostState.HEALTHY: N - 25 - 3 - 2 - 4,
        HostState.WARN: 4,
        HostState.UNHEALTHY: 3 + 2,
        HostState.UNREACHABLE: 25,
    }
    assert {j.host for j in states.of(HostState.UNHEALTHY)} == {
        name(i) for i in NO_DRIVER | CRITICAL
    }
    critical = [j for j in states.of(HostState.UNHEALTHY) if j.host == name(60)]
    assert "GPU 3" in critical[0].reason and "remap" in critical[0].reason

    text = summary_text(results)
    assert text.splitlines()[0].startswith(
        "200 hosts: 166 healthy, 4 warn, 5 unhealthy, 25 unreachable; 1,376 GPUs: "
    )
    assert f"  and {25 - MAX_NAMED} more (see the table)" in text
    # The CLI: the summary then a line per host; --summary the summary alone.
    printed = gpus_text(results, health=False, summary=False)
    assert printed.startswith(text) and printed.count("\ngpu-node-") == N
    assert "GPU  NAME" not in printed  # no 1,600 per-GPU rows
    assert gpus_text(results, health=False, summary=True) == text
    await pool.close()


async def test_a_fleet_within_the_limit_keeps_its_connections(tmp_path: Path) -> None:
    settings = fleet_settings(tmp_path, N)
    pool = CountingPool(settings)
    hosts = sorted(settings.hosts)
    await fleet_gpus(settings, pool, hosts, 5.0)
    assert pool.opened == N and pool.open == N  # pooled: a repeat is warm
    await fleet_gpus(settings, pool, hosts, 5.0)
    assert pool.opened == N
    await pool.close()
    assert pool.open == 0


class HangingPool(CountingPool):
    """``hung`` hosts accept the connection, answer the commands in ``answered`` and
    never answer any other."""

    def __init__(
        self, settings: Settings, hung: set[str], answered: tuple[tuple[str, ...], ...] = ()
    ) -> None:
        super().__init__(settings)
        self.hung, self.answered, self.entered = hung, answered, set[str]()

    def _open(self, host: str) -> MockTransport:
        t = super()._open(host)
        if host in self.hung:
            pool, i = self, int(host.rsplit("-", 1)[1])

            async def hangs(command: Command) -> Reply:
                if command.argv in pool.answered:
                    return reply(i, command)
                pool.entered.add(host)
                await asyncio.Event().wait()
                raise AssertionError("unreachable")

            t._commands = hangs
        return t


async def test_the_querys_deadline_cuts_off_hung_hosts_and_keeps_the_answers(
    tmp_path: Path,
) -> None:
    # Two at once: gpu-node-1 answers, 2 and 3 hang holding both slots, so 4 never gets
    # its turn. The deadline is injected: it passes once both hung hosts are being read.
    settings = fleet_settings(tmp_path, 2)
    hosts = [name(i) for i in (1, 2, 3, 4)]
    pool = HangingPool(settings, {name(2), name(3)})
    passed = asyncio.Event()
    query = asyncio.create_task(fleet_gpus(settings, pool, hosts, 3600.0, deadline=passed.wait))
    await eventually(lambda: len(pool.entered) == 2, "both hung hosts to be read")
    assert not query.done()
    passed.set()
    async with asyncio.timeout(30):  # fail, not hang, if the deadline is ignored
        results = await query
    assert [r.host for r in results] == hosts
    assert results[0].ok and results[0].error is None
    assert [(r.ok, r.unreachable) for r in results[1:]] == [(False, True)] * 3
    deadline = "the query's deadline of 60s"
    assert results[1].error == results[2].error == f"no answer within {deadline}"
    assert results[3].error == (f"not read: {deadline} passed before its turn (2 hosts at once)")
    # The cut-off reads closed their connections; host 4 never opened one.
    assert pool.open == 0 and pool.opened == 3
    text = summary_text(results)
    assert text.startswith("4 hosts: 1 healthy, 0 warn, 0 unhealthy, 3 unreachable;")
    assert f"{name(4)}: not read: {deadline} passed before its turn" in text


async def test_the_deadline_comes_from_the_settings(tmp_path: Path) -> None:
    settings = fleet_settings(tmp_path, 2)
    settings = settings.model_copy(update={"fleet": FleetSettings(deadline_s=0.05)})
    pool = HangingPool(settings, {name(1)})
    # A hung host and a per-host timeout of an hour: only the deadline can end it.
    async with asyncio.timeout(30):
        [row] = await fleet_gpus(settings, pool, [name(1)], 3600.0)
    assert row.error == "no answer within the query's deadline of 0.05s"
    await pool.close()


async def test_a_host_whose_health_read_is_cut_off_keeps_its_gpus(tmp_path: Path) -> None:
    # Its GPUs were read before the deadline: only the health mark is lost, not the row.
    settings = fleet_settings(tmp_path, 2)
    # Host 2 answers its GPU queries, then never answers a health read.
    pool = HangingPool(settings, {name(2)}, answered=(remote.gpu_query(), remote.apps_query()))
    passed = asyncio.Event()
    hosts = [name(1), name(2)]
    query = asyncio.create_task(fleet_gpus(settings, pool, hosts, 3600.0, deadline=passed.wait))
    await eventually(lambda: pool.entered == {name(2)}, "the health read to hang")
    passed.set()
    async with asyncio.timeout(30):
        first, second = await query
    assert first.ok and first.health is not None and first.health_error is None
    assert second.ok and second.error is None and not second.unreachable
    assert second.snapshot is not None and second.snapshot.gpus
    assert second.health is None
    assert second.health_error == "no answer within the query's deadline of 60s"
    await pool.close()


async def test_a_cancelled_query_cancels_its_reads_and_closes_their_connections(
    tmp_path: Path,
) -> None:
    # The asker gone (the bot stopping, a CLI's Ctrl-C): no read goes on without it.
    settings = fleet_settings(tmp_path, 2)
    hosts = [name(i) for i in (1, 2, 3)]
    pool = HangingPool(settings, set(hosts))
    query = asyncio.create_task(
        fleet_gpus(settings, pool, hosts, 3600.0, deadline=asyncio.Event().wait)
    )
    await eventually(lambda: len(pool.entered) == 2, "two hung hosts to be read")
    query.cancel()
    with pytest.raises(asyncio.CancelledError):
        await query
    assert pool.open == 0 and pool.opened == 2


def section_texts(msg: dict[str, Any]) -> list[str]:
    return [b["text"]["text"] for b in msg["blocks"] if b["type"] == "section"]


@pytest.mark.parametrize("limit", [64])
async def test_slack_answer_summarises_names_and_uploads_the_table(
    tmp_path: Path, sim_host: SimKit, limit: int
) -> None:
    hosts = host_settings(sim_host.host_settings())
    services = {SERVICE: sim_host.service_settings([name(1)])}
    async with slack_bot(tmp_path, sim_host, hosts=hosts, services=services) as bot:
        pool = CountingPool(bot.runtime.settings)
        bot.runtime.pool = bot.runtime.engine.pool = pool
        await bot.command("gpus")
        msg = await bot.fake.wait_for_message(CHANNEL, lambda m: "GPUs" in m.get("text", ""))
        await bot.front_end.idle()
    assert pool.max_open == limit and pool.open == 0
    assert validate_blocks(msg["blocks"]) == [] and len(msg["blocks"]) <= MAX_BLOCKS
    assert all(len(t) <= MAX_SECTION_TEXT for t in section_texts(msg))
    text = blocks_text(msg)
    assert "200 hosts: 166 healthy, 4 warn, 5 unhealthy, 25 unreachable" in text
    unhealthy, unreachable, warn = section_texts(msg)[2:5]
    assert unhealthy.startswith("*Unhealthy (5)*")
    for i in NO_DRIVER | CRITICAL:
        assert f"`{name(i)}`" in unhealthy
    assert unreachable.startswith("*Unreachable (25)*")
    assert unreachable.count("\n• ") == MAX_NAMED
    assert unreachable.endswith(f"… and {25 - MAX_NAMED} more in the file")
    assert warn.startswith("*Warnings (4)*")
    # A healthy host is named nowhere in the message.
    assert f"`{name(100)}`" not in text
    [upload] = [f for f in bot.fake.files if f.filename == "gpus.txt"]
    body = upload.text
    assert body.startswith("200 hosts: 166 healthy")
    for i in range(1, N + 1):  # every host has its line, and every unreachable one is named
        assert f"\n{name(i)} " in body
    for i in UNREACHABLE:
        assert f"  {name(i)}: cannot connect" in body
    assert upload.shares and upload.shares[0][1] == msg["ts"]  # in the answer's thread
