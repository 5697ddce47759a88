"""``doctor`` for a router (issue 19): reachable from its host, the backend and servers
the config names exist there, and the sudo rule its socket needs. Pure: the probes and
their judges; ``bot.engine.doctor`` performs them with everything else."""

from __future__ import annotations

from collections.abc import Callable
from typing import assert_never

from bot.core.doctor_types import (
    SUDOERS_FIX,
    Answer,
    Check,
    Kind,
    Outcome,
    Probe,
    judged,
    reply,
)
from bot.core.privilege import Privilege, sudo_question
from bot.core.routers import haproxy, haproxy_script, vllm_router
from bot.core.routers.view import Rotation
from bot.core.sudoers_router import router_rules
from bot.core.sudoers_rules import Grant
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
        case "haproxy":
            assert r.socket is not None and r.backend is not None  # settings require them
            # The same command and account a rotation reads with: a missing sudo rule or
            # a socket the login cannot open shows here, not mid-roll. The rules of the
            # changes are asked of sudo (`sudo -n -l`), never run.
            read = haproxy_script.runtime_command(
                r.socat, r.socket, r.backend, haproxy_script.SHOW_STAT
            )
            asks = (
                tuple(
                    (sudo_question(g.sample), Privilege.NONE) for g in _change_rules(settings, name)
                )
                if settings.hosts[r.host].become == "sudo"
                else ()
            )
            return [
                Probe(
                    r.host,
                    None,
                    ROUTER,
                    Kind.COMMANDS,
                    ((read, Privilege.ROOT), *asks),
                    timeout_s=t,
                    router=name,
                )
            ]
        case "vllm-router":
            assert r.admin_url is not None
            url = vllm_router.workers_url(r.admin_url)
            return [Probe(r.host, None, ROUTER, Kind.HTTP, url=url, timeout_s=t, router=name)]
        case _:
            assert_never(r.kind)


def _change_rules(settings: Settings, name: str) -> list[Grant]:
    """The sudo rules of router ``name``'s `set server` commands (all but `show stat`)."""
    return [
        g
        for g in router_rules(settings, name)
        if haproxy_script.words_of(g.sample) != haproxy_script.SHOW_STAT
    ]


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


def _states(views: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in views.items())


def _haproxy(p: Probe, a: Answer, r: RouterSettings, s: Settings) -> Check:
    assert r.backend is not None
    if a.error or not a.results:
        return judged(p, Outcome.FAIL, f"router {p.router}: {a.error or 'nothing ran'}")
    res = a.results[0]
    if not res.ok:
        return judged(
            p,
            Outcome.FAIL,
            f"router {p.router}: `show stat` to {r.socket} on {p.host}: {reply(res)}",
            "the socket needs `stats socket <path> mode 660 level admin` in haproxy.cfg, "
            "and the login (or root through the sudo rules of `python -m bot sudoers`) "
            "must be able to open it",
        )
    try:
        views = haproxy.parse_show_stat(res.stdout, r.backend)
    except ValueError as e:
        return judged(p, Outcome.FAIL, f"router {p.router}: {e}")
    rules = _change_rules(s, str(p.router))
    missing = [g.why for g, ans in zip(rules, a.results[1:], strict=False) if not ans.ok]
    if missing:
        return judged(
            p,
            Outcome.FAIL,
            f"router {p.router}: sudo lacks {len(missing)} of {len(rules)} rules of its "
            f"`set server` commands: {'; '.join(missing)}",
            SUDOERS_FIX.format(user=s.hosts[p.host].user),
        )
    wanted = _servers(s, str(p.router))
    missing = [f"{server} ({svc})" for svc, server in wanted if server not in views]
    if missing:
        return judged(
            p,
            Outcome.FAIL,
            f"router {p.router}: backend {r.backend} has no server {', '.join(missing)} "
            f"(it has: {', '.join(views) or 'none'})",
            "router_servers must name the backend's `server` lines",
        )
    states = {srv: views[srv].detail for _, srv in wanted}
    return judged(p, Outcome.OK, f"router {p.router} (haproxy {r.backend}): {_states(states)}")


def _vllm_router(p: Probe, a: Answer, r: RouterSettings, s: Settings) -> Check:
    if a.error or a.http is None:
        return judged(p, Outcome.FAIL, f"router {p.router}: {a.error or 'no answer'}")
    wanted = _servers(s, str(p.router))
    read = vllm_router.parse_workers(
        a.http.status, a.http.body, [w for _, w in wanted], a.http.error, policy=r.policy
    )
    if read.error is not None:
        return judged(p, Outcome.FAIL, f"router {p.router}: {read.error} (from {p.host})")
    absent = [f"{w} ({svc})" for svc, w in wanted if read.of(w).rotation == Rotation.OUT]
    states = {w: read.of(w).detail for _, w in wanted}
    if absent:
        # A vllm-router forgets a removed worker: a replica drained by hand and a
        # mistyped URL look the same, so this warns rather than fails.
        return judged(
            p,
            Outcome.WARN,
            f"router {p.router}: not among its workers: {', '.join(absent)}",
            "a replica out of rotation comes back with `undrain`; otherwise router_servers "
            "must be the worker URLs exactly as the router lists them (GET /workers)",
        )
    note = (
        ""
        if r.policy in vllm_router.COUNTS_LOAD
        else f"; its load is not counted ({f'policy {r.policy}' if r.policy else 'no policy set'}):"
        " the service's /metrics decide"
    )
    return judged(p, Outcome.OK, f"router {p.router} (vllm-router): {_states(states)}{note}")


def _router(p: Probe, a: Answer, s: Settings) -> Check:
    assert p.router is not None
    r = s.routers[p.router]
    match r.kind:
        case "command":
            return _command(p, a, r)
        case "haproxy":
            return _haproxy(p, a, r, s)
        case "vllm-router":
            return _vllm_router(p, a, r, s)
        case _:
            assert_never(r.kind)


JUDGES: dict[str, Callable[[Probe, Answer, Settings], Check]] = {ROUTER: _router}
