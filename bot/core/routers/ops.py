"""What the rotation phases ask of a router, whatever its kind: read it, take a replica
out, finish taking it out, put it back. Each is a phase that yields commands or HTTP
requests on the router's host (``on``) and returns a plain value; the kinds are an
exhaustive ``match`` over ``RouterTarget.kind``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import assert_never

from bot.core.phases.actions import Phase, http, rotation_records, run
from bot.core.plan import Step
from bot.core.privilege import Command
from bot.core.routers import command, haproxy, haproxy_script, vllm_router
from bot.core.routers.target import RouterTarget
from bot.core.routers.view import Rotation, RouterRead, ServerView

# What a change of rotation returned: None when the router took it, else why not.
Change = str | None


def _failed(what: str, exit_status: int | None, stderr: str, stdout: str = "") -> str:
    said = (stderr.strip() or stdout.strip())[-300:]
    code = "no answer" if exit_status is None else f"exit {exit_status}"
    return f"{what} failed ({code}){': ' + said if said else ''}"


def read(
    t: RouterTarget,
    step: Step,
    servers: Sequence[str],
    *,
    counts: bool = False,
    records: bool = False,
) -> Phase[RouterRead]:
    """Each of ``servers`` as the router sees it now; ``counts``: their sessions too,
    where that costs a command of its own (the command kind's ``in_flight``);
    ``records``: for a kind that cannot say, the audit log's word on which a run left
    out (a replica drained by hand must never count as serving)."""
    match t.kind:
        case "command":
            return (yield from _command_read(t, step, servers, counts, records))
        case "haproxy":
            return (yield from _haproxy_read(t, step, servers))
        case "vllm-router":
            return (yield from _vllm_router_read(t, servers))
        case _:
            assert_never(t.kind)


def take_out(t: RouterTarget, step: Step, server: str, names: Sequence[str] = ()) -> Phase[Change]:
    """Stop new requests to ``server`` (haproxy `state drain`, vllm-router
    `remove_worker`, the command's `drain`). ``names``: the router's own names for it
    as last read (vllm-router: each URL it is listed under), each of which is removed."""
    match t.kind:
        case "command":
            assert t.drain is not None  # settings require it for this kind
            return (yield from _command_change(t, step, command.fill(t.drain, server), "drain"))
        case "haproxy":
            return (yield from _haproxy_set(t, step, server, "drain"))
        case "vllm-router":
            for name in names or (server,):
                failed = yield from _vllm_router_change(t, name, add=False)
                if failed is not None:
                    return failed
            return None
        case _:
            assert_never(t.kind)


def finish_out(t: RouterTarget, step: Step, server: str) -> Phase[Change]:
    """Once ``server`` has no session left: nothing reaches it at all (haproxy `maint`);
    the other kinds took it out wholly already."""
    match t.kind:
        case "command" | "vllm-router":
            return None
        case "haproxy":
            return (yield from _haproxy_set(t, step, server, "maint"))
        case _:
            assert_never(t.kind)
    yield from ()  # a phase, even where it yields nothing


def out_states(t: RouterTarget, *, finished: bool) -> frozenset[Rotation] | None:
    """What a read of the router must show of a replica once its take-out (``finished``:
    and ``finish_out``) went through, before the bot stops it; None: a kind that cannot
    be read (the command kind), whose command's success is all there is."""
    match t.kind:
        case "command":
            return None
        case "haproxy":
            return frozenset({Rotation.OUT} if finished else {Rotation.DRAINING, Rotation.OUT})
        case "vllm-router":
            return frozenset({Rotation.OUT})
        case _:
            assert_never(t.kind)


def put_back(t: RouterTarget, step: Step, server: str, names: Sequence[str] = ()) -> Phase[Change]:
    """Let ``server`` take requests again (haproxy `state ready`, vllm-router
    `add_worker`, the command's `undrain`). ``names``: the router's own names for it
    before it was taken out (vllm-router: it is added back under the first, else under
    the configured URL, and only when the router lists it under none: never twice)."""
    match t.kind:
        case "command":
            assert t.undrain is not None
            argv = command.fill(t.undrain, server)
            return (yield from _command_change(t, step, argv, "undrain"))
        case "haproxy":
            return (yield from _haproxy_set(t, step, server, "ready"))
        case "vllm-router":
            return (yield from _vllm_router_add(t, server, names))
        case _:
            assert_never(t.kind)


# ---- the command kind -------------------------------------------------------------------


def _command_change(t: RouterTarget, step: Step, argv: tuple[str, ...], what: str) -> Phase[Change]:
    r = yield from run(step, argv, t.command_timeout_s, on=t.host)
    return None if r.ok else _failed(f"`{what}` on {t.host}", r.exit_status, r.stderr, r.stdout)


def _command_read(
    t: RouterTarget, step: Step, servers: Sequence[str], counts: bool, records: bool
) -> Phase[RouterRead]:
    """The command kind cannot say whether a server is in rotation (UNKNOWN: the bot
    judges by its own records and readiness); its ``in_flight`` gives the sessions. An
    ``in_flight`` that cannot be read is an error: an unreadable count is not zero."""
    held: dict[str, str] = {}
    if records:
        rec = yield from rotation_records(t.name, tuple(servers))
        if rec.error is not None:
            return RouterRead({}, rec.error)
        held = rec.held_out
    views: dict[str, ServerView] = {}
    unread: list[str] = []
    for server in servers:
        if server in held:
            views[server] = ServerView(server, Rotation.OUT, None, None, held[server])
            continue
        sessions = None
        detail = "no in_flight command configured" if t.in_flight is None else ""
        if t.in_flight is not None and counts:
            r = yield from run(
                step, command.fill(t.in_flight, server), t.command_timeout_s, quiet=True, on=t.host
            )
            sessions = command.parse_in_flight(r.stdout) if r.ok else None
            if sessions is None:
                unread.append(
                    f"{server}: "
                    + (
                        _failed("in_flight", r.exit_status, r.stderr, r.stdout)
                        if not r.ok
                        else f"in_flight printed no count ({r.stdout.strip()[:80]!r})"
                    )
                )
            detail = f"{sessions} in flight" if sessions is not None else "count unreadable"
        views[server] = ServerView(server, Rotation.UNKNOWN, None, sessions, detail)
    return RouterRead(views, "; ".join(unread) if unread else None)


# ---- haproxy ----------------------------------------------------------------------------


def haproxy_argv(t: RouterTarget, words: haproxy_script.Words) -> Command:
    """The bot's fixed HAProxy script sending ``words`` to the admin socket, as root: on a
    host with ``become = "sudo"`` each such command line is one exact rule of
    ``python -m bot sudoers``."""
    assert t.socket is not None and t.backend is not None  # settings require them
    return haproxy_script.runtime_command(t.socat, t.socket, t.backend, words)


def _haproxy_say(
    t: RouterTarget, step: Step, words: haproxy_script.Words
) -> Phase[tuple[str | None, str]]:
    """One Runtime API command: (why it failed to reach HAProxy or None, its reply)."""
    r = yield from run(step, haproxy_argv(t, words), t.command_timeout_s, quiet=True, on=t.host)
    if r.refused is not None:
        return r.refused, ""
    if not r.ok:
        what = f"`{' '.join(words)}` to {t.socket} on {t.host}"
        if said := haproxy_script.refusal(r.stderr):
            # The script's own refusal: nothing reached the socket.
            return f"the bot's HAProxy script refused {what}: {said}", ""
        return _failed(what, r.exit_status, r.stderr, r.stdout), ""
    return None, r.stdout


def _haproxy_read(t: RouterTarget, step: Step, servers: Sequence[str]) -> Phase[RouterRead]:
    assert t.backend is not None
    failed, reply = yield from _haproxy_say(t, step, haproxy_script.SHOW_STAT)
    if failed is not None:
        return RouterRead({}, failed)
    try:
        views = haproxy.parse_show_stat(reply, t.backend)
    except ValueError as e:
        return RouterRead({}, f"show stat: {e}")
    missing = [s for s in servers if s not in views]
    if missing:
        # A configured name HAProxy does not have is a wrong config, never "serving".
        return RouterRead(views, f"backend {t.backend} has no server {', '.join(missing)}")
    return RouterRead(views)


def _haproxy_set(t: RouterTarget, step: Step, server: str, state: haproxy.State) -> Phase[Change]:
    assert t.backend is not None
    if not (haproxy.valid_server_name(t.backend) and haproxy.valid_server_name(server)):
        # The settings refuse such names: nothing but a name reaches the socket.
        return f"not sent: {t.backend!r}/{server!r} is not an HAProxy backend/server name"
    failed, reply = yield from _haproxy_say(
        t, step, haproxy_script.set_state_words(t.backend, server, state)
    )
    if failed is not None:
        return failed
    said = haproxy.parse_answer(reply)
    return None if said is None else f"set server {t.backend}/{server} state {state}: {said}"


# ---- vllm-router ------------------------------------------------------------------------


def _vllm_router_read(t: RouterTarget, servers: Sequence[str]) -> Phase[RouterRead]:
    assert t.admin_url is not None  # settings require it for this kind
    r = yield from http(vllm_router.workers_url(t.admin_url), t.command_timeout_s, on=t.host)
    return vllm_router.parse_workers(r.status, r.body, servers, r.error, policy=t.policy)


def _vllm_router_add(t: RouterTarget, server: str, names: Sequence[str]) -> Phase[Change]:
    """add_worker, only where GET /workers lists ``server`` under no URL: the router
    takes two spellings of one URL for two workers, and would route to both."""
    now = yield from _vllm_router_read(t, [server])
    if now.error is not None:
        return now.error
    if now.of(server).rotation == Rotation.IN:
        return None
    return (yield from _vllm_router_change(t, names[0] if names else server, add=True))


def _vllm_router_change(t: RouterTarget, server: str, *, add: bool) -> Phase[Change]:
    assert t.admin_url is not None
    url = (vllm_router.add_worker_url if add else vllm_router.remove_worker_url)(
        t.admin_url, server
    )
    # add_worker answers only once the router's own health check passed (up to its
    # --worker-startup-timeout-secs): give it the confirm window, not a command's.
    timeout = max(t.command_timeout_s, t.confirm_timeout_s) if add else t.command_timeout_s
    r = yield from http(url, timeout, method="POST", on=t.host)
    said = vllm_router.parse_change(r.status, r.body, r.error, add=add)
    what = "add_worker" if add else "remove_worker"
    return None if said is None else f"POST /{what} on {t.host}: {said}"
