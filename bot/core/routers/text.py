"""The router commands as the card and the thread show them: exactly what runs, on which
host. Pure strings, so the plan (bot.core.plan) can list them without the phases."""

from __future__ import annotations

from typing import assert_never

from bot.core import remote
from bot.core.routers import command, haproxy, haproxy_script, vllm_router
from bot.core.routers.target import RouterTarget

# How the plan's steps name "each replica's server" before a host is picked.
EACH = "{server}"


def shown_out(t: RouterTarget, server: str) -> str:
    """The commands that take ``server`` out, as the card lists them."""
    match t.kind:
        case "command":
            assert t.drain is not None  # settings require it for this kind
            tail = (
                f"; {remote.shown(command.fill(t.in_flight, server))} until 0"
                if t.in_flight is not None
                else ""
            )
            return f"on {t.host}: {remote.shown(command.fill(t.drain, server))}{tail}"
        case "haproxy":
            return (
                f"on {t.host} ({_through(t)}): {_haproxy(t, server, 'drain')}; `show stat` "
                f"until its scur is 0; {_haproxy(t, server, 'maint')}"
            )
        case "vllm-router":
            assert t.admin_url is not None
            return f"from {t.host}: POST {vllm_router.remove_worker_url(t.admin_url, server)}"
        case _:
            assert_never(t.kind)


def shown_in(t: RouterTarget, server: str) -> str:
    """The command that puts ``server`` back, as the card lists it."""
    match t.kind:
        case "command":
            assert t.undrain is not None
            return f"on {t.host}: {remote.shown(command.fill(t.undrain, server))}"
        case "haproxy":
            return f"on {t.host} ({_through(t)}): {_haproxy(t, server, 'ready')}"
        case "vllm-router":
            assert t.admin_url is not None
            return f"from {t.host}: POST {vllm_router.add_worker_url(t.admin_url, server)}"
        case _:
            assert_never(t.kind)


def _through(t: RouterTarget) -> str:
    """How the commands reach HAProxy: the bot's fixed script, through socat."""
    return f"the bot's HAProxy script, {t.socat} to {t.socket}"


def _haproxy(t: RouterTarget, server: str, state: haproxy.State) -> str:
    """The Runtime API command, as the bot's fixed HAProxy script sends it."""
    assert t.backend is not None  # settings require it
    words = haproxy_script.set_state_words(t.backend, server, state)
    return f"`{' '.join(words)}`"


def _servers(t: RouterTarget) -> str:
    return ", ".join(f"{h} = {s}" for h, s in t.servers)


def rotation_out_command(t: RouterTarget) -> str:
    return (
        f"router {t.name} ({t.kind}), per replica ({_servers(t)}): refuse unless at least "
        f"{t.min_serving} other replica(s) serve (in rotation, GET health 200 from their "
        f"host); {shown_out(t, EACH)}; wait {t.settle_s:g}s, then up to "
        f"{t.drain_timeout_s:g}s until the router shows no session for it"
    )


def rotation_in_command(t: RouterTarget) -> str:
    return (
        f"only a replica that ended healthy: GET health 200, then {shown_in(t, EACH)}; up to "
        f"{t.confirm_timeout_s:g}s until the router shows it serving; a replica that did "
        "not end healthy stays out"
    )
