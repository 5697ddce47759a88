"""HAProxy's admin socket reached as an ordinary account under real sudo (issue 19): the
router host `lb-1` is logged into as a non-root login (real sshd, `become = "sudo"`), the
socket is root's (mode 600), so only the rules `python -m bot sudoers` prints (the bot's
fixed HAProxy script, one exact line per command) let the bot speak to it. Without a
rule the check names it; as the login itself (`become = "none"`) socat is refused by the
socket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.core.doctor_types import Check, Outcome
from bot.core.routers.haproxy_script import words_of
from bot.core.sudoers import render
from bot.core.sudoers_router import router_grants
from bot.engine.doctor import run_doctor
from bot.engine.runtime import open_runtime
from bot.settings import Settings
from bot.sim.kit import SERVICE, SimKit, fast_config, fleet_fragment
from tests.support import routers
from tests.support.nonroot import (
    NonRootKit,
    accounts,
    copy_sim,
    require_root_and_sudo,
    sudoers_installed,
    usable_python,
    workspace,
)
from tests.support.sim import MakeSimHost


@pytest.fixture
async def lb() -> AsyncIterator[tuple[NonRootKit, Path]]:
    require_root_and_sudo()
    with workspace() as base, accounts(base) as who:
        kit = NonRootKit(
            base / "lb",
            who=who,
            python=usable_python(who.login),
            tree=copy_sim(base / "sim"),
            config=fast_config(hostname="lb-1"),
        )
        try:
            yield await kit.start(), base
        finally:
            await kit.close()


def settings(kits: list[SimKit], lb: NonRootKit, h: routers.HAProxy, **host: Any) -> Settings:
    frag = fleet_fragment(
        kits,
        router="front",
        router_servers={k.hostname: f"node{i}" for i, k in enumerate(kits, 1)},
        min_serving=1,
    )
    frag["hosts"]["lb-1"] = lb.host_settings(**host)
    frag["routers"] = {
        "front": {"kind": "haproxy", "host": "lb-1", "socket": str(h.socket), "backend": h.backend}
    }
    return Settings(**frag, db_path=lb.root / "audit.db")


async def router_check(s: Settings) -> Check:
    async with open_runtime(s) as rt:
        checks = await run_doctor(rt.settings, rt.pool, ["gpu-node-1"], SERVICE)
    [check] = [c for c in checks if c.name == "router"]
    return check


async def test_the_script_rules_are_what_let_a_non_root_login_reach_the_socket(
    make_sim_host: MakeSimHost, lb: tuple[NonRootKit, Path]
) -> None:
    kit, base = lb
    venv = base / "opt-venv"
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
    ports = [(f"node{i}", k.health_port) for i, k in enumerate(kits, 1)]
    async with routers.haproxy(base / "haproxy", ports) as h:
        assert h.socket.stat().st_mode & 0o777 == 0o600  # root's alone
        s = settings(kits, kit, h)
        [(_, rules)] = router_grants(s, ["lb-1"])
        show, drain1 = rules[0], rules[1]
        text = render(s, kit.who.login, ["lb-1"])
        alias = f"{kit.who.login.upper()}__ROUTER_FRONT_ROOT"
        assert f"Cmnd_Alias {alias}" in text and all(g.line() in text for g in rules)
        assert words_of(show.sample) == ("show", "stat")
        assert words_of(drain1.sample) == ("set", "server", "vllm_kimi/node1", "state", "drain")

        with sudoers_installed(text):
            ok = await router_check(s)
        assert ok.outcome == Outcome.OK, ok.detail
        assert "node1 UP" in ok.detail and "node2 UP" in ok.detail

        # the read's rule missing: sudo refuses the script, and the check names it
        with sudoers_installed(render(s, kit.who.login, ["lb-1"], omit=[show.line()])):
            refused = await router_check(s)
        assert refused.outcome == Outcome.FAIL
        assert "sudo refused the bot's HAProxy script sending `show stat`" in refused.detail

        # a change's rule missing: asked of sudo (never run), and named
        with sudoers_installed(render(s, kit.who.login, ["lb-1"], omit=[drain1.line()])):
            lacking = await router_check(s)
        assert lacking.outcome == Outcome.FAIL, lacking.detail
        assert "sudo lacks 1 of 6 rules of its `set server` commands: take node1 out" in (
            lacking.detail
        )

        # the login itself cannot open root's socket: the rules are needed
        denied = await router_check(settings(kits, kit, h, become="none"))
        assert denied.outcome == Outcome.FAIL and "Permission denied" in denied.detail
