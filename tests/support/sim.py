"""The simulated GPU host in tests: the factory fixture's type, the sshd guard, and the
bot's settings for one simulated host."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from bot.core.gpu import APPS_QUERY_ARGV, GPU_QUERY_ARGV
from bot.core.health import HEALTH_QUERY_ARGV, XID_DMESG_ARGV, XID_JOURNAL_ARGV
from bot.settings import Settings
from bot.sim.kit import SERVICE, SimKit
from bot.sim.sshd import SSHD
from bot.sim.state import Call

# The type of the ``make_sim_host`` fixture: SimKit's keyword arguments in, a started host out.
MakeSimHost = Callable[..., Awaitable[SimKit]]


def require_sshd() -> None:
    """Skip without OpenSSH's sshd, except in CI, where its absence is a failure."""
    if SSHD.exists():
        return
    if os.environ.get("CI"):
        pytest.fail(f"{SSHD} is missing and CI is set: install openssh-server")
    pytest.skip(f"{SSHD} is not installed (apt-get install openssh-server)")


def sim_settings(
    kit: SimKit, tmp_path: Path, *, host: dict[str, Any] | None = None, **service: Any
) -> Settings:
    """One host, the service on it, the audit DB in ``tmp_path``; ``host`` and ``service``
    override the simulated host's own settings."""
    return Settings(
        hosts={kit.hostname: kit.host_settings(**(host or {}))},
        services={SERVICE: kit.service_settings(**service)},
        db_path=tmp_path / "audit.db",
    )


# The GPU check's reads, exactly as the card's GPU health read (``bot.engine.gpu_health``)
# runs them: the GPU and compute-app queries, ``nvidia-smi -q`` and this boot's Xid lines
# of the kernel log (dmesg is its fallback). Every one only reads.
_GPU_HEALTH_READS = {
    GPU_QUERY_ARGV,
    APPS_QUERY_ARGV,
    HEALTH_QUERY_ARGV,
    XID_JOURNAL_ARGV,
    XID_DMESG_ARGV,
}


def touched(kit: SimKit) -> list[Call]:
    """What reached the host beyond the read-only reads an approval card makes: the one
    ``GET /metrics`` that shows the load (``bot.engine.load``), the ``uv pip freeze``
    and install dry run that show the package change (``bot.engine.preview``), and the
    GPU check's reads that show the GPUs' health (``bot.engine.gpu_health``; these
    exact commands only, so a ``nvidia-smi -r`` would still count). Before approval,
    this must be empty."""
    return [
        c
        for c in kit.calls()
        if (c.tool, c.argv) != ("http", ("GET", "/metrics"))
        and c.argv[:3] != ("uv", "pip", "freeze")
        and not (c.argv[:3] == ("uv", "pip", "install") and "--dry-run" in c.argv)
        and c.argv not in _GPU_HEALTH_READS
    ]
