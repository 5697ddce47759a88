"""Shared fixtures.

The simulated GPU host (``bot.sim.kit.SimKit``) with sub-second timings:
``sim_host`` over the embedded asyncssh server, ``sim_sshd_host`` over a real
OpenSSH sshd, and ``make_sim_host`` for custom knobs or several hosts at once.
``fake``: the fake Slack Web API on 127.0.0.1. Plain helpers are in tests/support/.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.settings import PostgresUrl
from bot.sim.kit import SimKit, fast_config
from tests.fakes import FakeSlack
from tests.support.postgres import shared_server
from tests.support.sim import MakeSimHost, require_sshd


@pytest.fixture
async def make_sim_host(tmp_path: Path) -> AsyncIterator[MakeSimHost]:
    """``await make_sim_host(config=fast_config(hostname="gpu-node-2"), access="sshd")``:
    SimKit arguments, defaulting to fast timings; every host is closed after the test."""
    kits: list[SimKit] = []

    async def make(**kwargs: Any) -> SimKit:
        if kwargs.get("access") == "sshd":
            require_sshd()
        kwargs.setdefault("config", fast_config())
        kit = SimKit(tmp_path / f"sim-host-{len(kits)}", **kwargs)
        kits.append(kit)
        return await kit.start()

    yield make
    for kit in kits:
        await kit.close()


@pytest.fixture
async def sim_host(make_sim_host: MakeSimHost) -> SimKit:
    return await make_sim_host()


@pytest.fixture
async def sim_sshd_host(make_sim_host: MakeSimHost) -> SimKit:
    return await make_sim_host(access="sshd")


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    """The fake Slack: two channels, one user group, posts paced well above what a test
    needs (a test about pacing sets its own rate and clock)."""
    async with FakeSlack(
        channels=["C0OPS", "C0OTHER"],
        usergroups={"S0OPS": ["U0ALICE", "U0BOB"]},
        post_rate_per_s=50,
        post_burst=4,
    ) as f:
        yield f


@pytest.fixture
def pg_url() -> PostgresUrl:
    """A PostgreSQL database of this test's own (a fresh schema on this process's real
    server, ``tests.support.postgres``), not migrated yet."""
    return shared_server().fresh_url()


@pytest.fixture(params=["sqlite", "postgres"])
async def audit_target(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[Path | PostgresUrl]:
    """The audit database a test runs against, once on each backend (issue 21): a SQLite
    file, or a PostgreSQL schema of its own, migrated (a bot refuses one that is not)
    and empty (emptied and handed to the next test after this one)."""
    if request.param == "sqlite":
        yield tmp_path / "audit.db"
        return
    server = shared_server()
    url = await server.migrated_url()
    yield url
    server.give_back(url)
