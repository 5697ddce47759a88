"""What the rotation phases ask of a router, whatever its kind: read it, take a replica
out, finish taking it out, put it back. Each is a phase that yields commands or HTTP
requests on the router's host (``on``) and returns a plain value; the kinds are an
exhaustive ``match`` over ``RouterTarget.kind``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import assert_never

from bot.core.phases.actions import Phase, run
from bot.core.plan import Step
from bot.core.routers import command
from bot.core.routers.target import RouterTarget
from bot.core.routers.view import Rotation, RouterRead, ServerView

# What a change of rotation returned: None when the router took it, else why not.
Change = str | None


def _failed(what: str, exit_status: int | None, stderr: str, stdout: str = "") -> str:
    said = (stderr.strip() or stdout.strip())[-300:]
    code = "no answer" if exit_status is None else f"exit {exit_status}"
    return f"{what} failed ({code}){': ' + said if said else ''}"


def read(
    t: RouterTarget, step: Step, servers: Sequence[str], *, counts: bool = False
) -> Phase[RouterRead]:
    """Each of ``servers`` as the router sees it now; ``counts``: their sessions too,
    where that costs a command of its own (the command kind's ``in_flight``)."""
    match t.kind:
        case "command":
            return (yield from _command_read(t, step, servers, counts))
        case "haproxy" | "vllm-router":
            raise NotImplementedError(t.kind)
        case _:
            assert_never(t.kind)


def take_out(t: RouterTarget, step: Step, server: str) -> Phase[Change]:
    """Stop new requests to ``server`` (haproxy `state drain`, vllm-router
    `remove_worker`, the command's `drain`)."""
    match t.kind:
        case "command":
            assert t.drain is not None  # settings require it for this kind
            return (yield from _command_change(t, step, command.fill(t.drain, server), "drain"))
        case "haproxy" | "vllm-router":
            raise NotImplementedError(t.kind)
        case _:
            assert_never(t.kind)


def finish_out(t: RouterTarget, step: Step, server: str) -> Phase[Change]:
    """Once ``server`` has no session left: nothing reaches it at all (haproxy `maint`);
    the other kinds took it out wholly already."""
    match t.kind:
        case "command" | "vllm-router":
            return None
        case "haproxy":
            raise NotImplementedError(t.kind)
        case _:
            assert_never(t.kind)
    yield from ()  # a phase, even where it yields nothing


def put_back(t: RouterTarget, step: Step, server: str) -> Phase[Change]:
    """Let ``server`` take requests again (haproxy `state ready`, vllm-router
    `add_worker`, the command's `undrain`)."""
    match t.kind:
        case "command":
            assert t.undrain is not None
            argv = command.fill(t.undrain, server)
            return (yield from _command_change(t, step, argv, "undrain"))
        case "haproxy" | "vllm-router":
            raise NotImplementedError(t.kind)
        case _:
            assert_never(t.kind)


# ---- the command kind -------------------------------------------------------------------


def _command_change(t: RouterTarget, step: Step, argv: tuple[str, ...], what: str) -> Phase[Change]:
    r = yield from run(step, argv, t.command_timeout_s, on=t.host)
    return None if r.ok else _failed(f"`{what}` on {t.host}", r.exit_status, r.stderr, r.stdout)


def _command_read(
    t: RouterTarget, step: Step, servers: Sequence[str], counts: bool
) -> Phase[RouterRead]:
    """The command kind cannot say whether a server is in rotation (UNKNOWN: the bot
    judges by its own records and readiness); its ``in_flight`` gives the sessions."""
    views: dict[str, ServerView] = {}
    for server in servers:
        sessions = None
        detail = "no in_flight command configured" if t.in_flight is None else ""
        if t.in_flight is not None and counts:
            r = yield from run(
                step, command.fill(t.in_flight, server), t.command_timeout_s, quiet=True, on=t.host
            )
            sessions = command.parse_in_flight(r.stdout) if r.ok else None
            detail = (
                f"{sessions} in flight"
                if sessions is not None
                else _failed("in_flight", r.exit_status, r.stderr, r.stdout)
            )
        views[server] = ServerView(server, Rotation.UNKNOWN, None, sessions, detail)
    return RouterRead(views)
