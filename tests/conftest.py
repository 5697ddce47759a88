"""Shared fixtures.

The simulated GPU host (``bot.sim.kit.SimKit``) with sub-second timings:
``sim_host`` over the embedded asyncssh server, ``sim_sshd_host`` over a real
OpenSSH sshd, and ``make_sim_host`` for custom knobs or several hosts at once.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from bot.sim.kit import SimKit, fast_config
from bot.sim.sshd import SSHD

MakeSimHost = Callable[..., Awaitable[SimKit]]


def require_sshd() -> None:
    """Skip without OpenSSH's sshd, except in CI, where its absence is a failure."""
    if SSHD.exists():
        return
    if os.environ.get("CI"):
        pytest.fail(f"{SSHD} is missing and CI is set: install openssh-server")
    pytest.skip(f"{SSHD} is not installed (apt-get install openssh-server)")


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
