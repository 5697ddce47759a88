"""``doctor`` for a router (issue 19): reachable from its host, the backend and servers
the config names exist there, and the sudo rule its socket needs. Pure: the probes and
their judges; ``bot.engine.doctor`` performs them with everything else."""

from __future__ import annotations

from collections.abc import Callable
from typing import assert_never

from bot.core.doctor_types import Answer, Check, Kind, Outcome, Probe, judged
from bot.core.privilege import Privilege
from bot.settings import RouterSettings, Settings

ROUTER = "router"


def _servers(settings: Settings, name: str) -> list[tuple[str, str]]:
    """Every (service, server) the config puts behind router ``name``."""
    return [
        (svc_name, server)
        for svc_name, svc in settings.services.items()
        if svc.router == name
        for server in svc.router_servers.values()
    ]


def router_probes(settings: Settings, name: str) -> list[Probe]:
    r = settings.routers[name]
    t = r.command_timeout_s
    match r.kind:
        case "command":
            programs = dict.fromkeys(
                argv[0] for argv in (r.drain, r.undrain, r.in_flight) if argv is not None
            )
            commands = tuple((("test", "-x", p), Privilege.NONE) for p in programs)
            return [Probe(r.host, None, ROUTER, Kind.COMMANDS, commands, timeout_s=t, router=name)]
        case "haproxy" | "vllm-router":
            raise NotImplementedError(r.kind)
        case _:
            assert_never(r.kind)


def _command(p: Probe, a: Answer, r: RouterSettings) -> Check:
    missing = [res.argv[-1] for res in a.results if not res.ok]
    if a.error:
        return judged(p, Outcome.FAIL, f"router {p.router}: {a.error}")
    if missing:
        return judged(
            p,
            Outcome.FAIL,
            f"router {p.router}: not an executable program on {p.host}: {', '.join(missing)}",
            "install it, or point drain/undrain/in_flight at the right path",
        )
    named = ", ".join(str(res.argv[-1]) for res in a.results)
    note = "" if r.in_flight is not None else "; no in_flight: the service's /metrics decide"
    return judged(p, Outcome.OK, f"router {p.router} (command): {named} present{note}")


def _router(p: Probe, a: Answer, s: Settings) -> Check:
    assert p.router is not None
    r = s.routers[p.router]
    match r.kind:
        case "command":
            return _command(p, a, r)
        case "haproxy" | "vllm-router":
            raise NotImplementedError(r.kind)
        case _:
            assert_never(r.kind)


JUDGES: dict[str, Callable[[Probe, Answer, Settings], Check]] = {ROUTER: _router}
