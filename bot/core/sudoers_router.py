"""The sudo rules of a router: a haproxy router whose host uses sudo runs the bot's fixed
HAProxy script (``bot.core.routers.haproxy_script``) as root, one exact rule per command
it sends: ``show stat``, and ``set server <backend>/<server> state drain|maint|ready`` for
each server the config puts behind it. Beside ``sudoers`` (which prints them) as
``sudoers_host`` is for host maintenance."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from bot.core.routers import haproxy_script
from bot.core.sudoers_rules import Grant, alias_name
from bot.settings import Settings

ROUTER_NOTE = """\
# As root: the bot's fixed HAProxy script (/bin/sh -c <script>; its text is in each
# rule, so this file installs it), which speaks to the admin socket through socat.
# Each line is exact: the socat, the socket and the backend come first, then the one
# Runtime API command it sends: `show stat`, or `set server <backend>/<server> state
# drain|maint|ready` for a server of the config. No other command, backend or server
# matches a rule; the script refuses anything else again itself (only those two
# commands, names of HAProxy's own characters: no `;`, space, newline or `/`). A server
# added to router_servers needs this file generated again."""


def router_alias(login: str, router: str) -> str:
    """The Cmnd_Alias of router ``router``'s rules in ``login``'s drop-in."""
    return alias_name(login, "ROUTER", router, "ROOT")


def router_servers(settings: Settings, router: str) -> list[str]:
    """Every server the config puts behind ``router``, once each, in the config's order."""
    servers = (
        server
        for svc in settings.services.values()
        if svc.router == router
        for server in svc.router_servers.values()
    )
    return list(dict.fromkeys(servers))


_WHY = {
    "drain": "take {server} out: no new requests (before its host's run)",
    "maint": "{server} out wholly, once it has no session left",
    "ready": "put {server} back once its host ended healthy (and `/vllm undrain`)",
}


def router_rules(settings: Settings, router: str) -> list[Grant]:
    """The rules haproxy router ``router`` needs where its host uses sudo: the script's
    command lines, as root."""
    r = settings.routers[router]
    socket, backend = r.socket, r.backend
    assert socket is not None and backend is not None  # settings require them

    def rule(words: haproxy_script.Words, why: str) -> Grant:
        argv = haproxy_script.runtime_command(r.socat, socket, backend, words)
        return Grant(argv.run_as, argv, argv, why)

    out = [rule(haproxy_script.SHOW_STAT, f"read backend {backend} (show stat)")]
    for server in router_servers(settings, router):
        for state in haproxy_script.STATES:
            words = haproxy_script.set_state_words(backend, server, state)
            out.append(rule(words, _WHY[state].format(server=server)))
    return out


def router_grants(
    settings: Settings, hosts: Iterable[str] | None
) -> list[tuple[str, Sequence[Grant]]]:
    """Each haproxy router on ``hosts`` (all when None) whose host uses sudo, with its
    rules. The other kinds need none (the vllm-router's admin API is HTTP; the command
    kind's programs are the operator's, run as the login)."""
    wanted = set(settings.hosts if hosts is None else hosts)
    return [
        (name, router_rules(settings, name))
        for name, r in settings.routers.items()
        if r.kind == "haproxy" and r.host in wanted and settings.hosts[r.host].become == "sudo"
    ]
