"""The sudo rule of a router (issue 19): a haproxy router whose host uses sudo needs its
socat to the admin socket as root, exactly that command line. Beside ``sudoers`` (which
prints it) as ``sudoers_host`` is for host maintenance."""

from __future__ import annotations

from collections.abc import Iterable

from bot.core.privilege import Privilege
from bot.core.routers.haproxy import socat_argv as haproxy_socat
from bot.core.sudoers_rules import Grant, alias_name
from bot.settings import Settings

ROUTER_NOTE = """\
# As root: socat to HAProxy's admin socket, exactly this command line; the Runtime API
# command (show stat, set server <backend>/<server> state ready|drain|maint) goes on its
# stdin. Note that whoever may run it can send the socket any Runtime API command, on any
# backend: where the login can join the socket's group instead (stats socket ... mode 660
# group haproxy), set the router host's become = "none" and leave this rule out."""


def router_alias(login: str, router: str) -> str:
    """The Cmnd_Alias of router ``router``'s rules in ``login``'s drop-in."""
    return alias_name(login, "ROUTER", router, "ROOT")


def router_grants(settings: Settings, hosts: Iterable[str] | None) -> list[tuple[str, Grant]]:
    """The rule each haproxy router on ``hosts`` (all when None) needs where its host uses
    sudo: the socat of ``bot.core.routers.haproxy``, as root. The other kinds need none
    (the vllm-router's admin API is HTTP; the command kind's programs are the operator's,
    run as the login)."""
    wanted = set(settings.hosts if hosts is None else hosts)
    out: list[tuple[str, Grant]] = []
    for name, r in settings.routers.items():
        if r.kind != "haproxy" or r.host not in wanted or r.socket is None:
            continue
        if settings.hosts[r.host].become != "sudo":
            continue
        argv = haproxy_socat(r.socat, r.socket)
        why = f"socat to {r.socket}, the Runtime API command on its stdin"
        out.append((name, Grant(Privilege.ROOT, argv, argv, why)))
    return out
