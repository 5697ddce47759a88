"""vLLM Router's admin API (PyPI ``vllm-router``), as the bot speaks it: ``GET /workers``
to read, ``POST /remove_worker?url=`` and ``POST /add_worker?url=`` to change. Pure: URLs
built here, replies parsed here; the requests go out from the router's host.

Checked against a real vllm-router 0.1.17 (captures in ``tests/samples/routers/``):

- ``/workers`` lists each worker with ``url``, ``is_healthy`` and ``load``; a removed
  worker is simply absent.
- The router keeps a worker's URL as it was given, and two spellings are two workers:
  ``http://h:8000/`` and ``http://h:8000`` can both be listed, and
  ``remove_worker?url=http://h:8000`` leaves ``http://h:8000/`` routed to (it logs "not
  found, skipping removal" and still answers 200 ``Successfully removed worker``). So the
  bot finds its worker under any spelling that differs by a trailing ``/``, sends each
  change with the URL exactly as listed, and confirms a removal by reading ``/workers``
  again, never by the reply.
- A router started with ``--intra-node-data-parallel-size N`` lists each worker once per
  rank, ``http://h:8000@0`` ... ``@N-1``; ``remove_worker``/``add_worker`` with the base
  URL (as given, rank cut off) remove or add every rank, and with a rank URL do nothing.
- ``load`` counts the requests the router has open to a worker only under the policies
  that route by it (``cache_aware``, ``power_of_two``, ``kv_aware``); under the others
  (``round_robin``, ``random``, ...) it stays 0 with requests in flight.
- ``add_worker`` waits for the worker to pass the router's health check before it
  answers (up to the router's ``--worker-startup-timeout-secs``, 600 s by default); a URL
  already present answers 400 ``Worker <url> already exists`` (``No worker added for
  <url>`` with data-parallel ranks), which for putting a replica back is the state
  wanted."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from bot.core.routers.view import Rotation, RouterRead, ServerView

# The policies under which GET /workers' `load` counts the requests in flight.
COUNTS_LOAD = frozenset({"cache_aware", "power_of_two", "kv_aware"})
# A data-parallel rank the router appends to a worker's URL: `http://h:8000@1`.
_RANK = re.compile(r"@[0-9]+\Z")


def _base(admin_url: str) -> str:
    return admin_url.rstrip("/")


def workers_url(admin_url: str) -> str:
    return f"{_base(admin_url)}/workers"


def remove_worker_url(admin_url: str, server: str) -> str:
    # The worker URL is a config value (an http URL); quoted whole, so its own `?`, `&`
    # or `#` cannot become parameters of the admin request.
    return f"{_base(admin_url)}/remove_worker?url={quote(server, safe='')}"


def add_worker_url(admin_url: str, server: str) -> str:
    return f"{_base(admin_url)}/add_worker?url={quote(server, safe='')}"


def base_of(url: str) -> str:
    """A listed worker URL without its data-parallel rank (``http://h:8000@1`` ->
    ``http://h:8000``): what remove_worker and add_worker take for all its ranks."""
    return _RANK.sub("", url)


def _same(listed: str, server: str) -> bool:
    """Whether a URL the router lists is the configured worker ``server``: the same but
    for a trailing ``/`` or a data-parallel rank."""
    return base_of(listed).rstrip("/") == server.rstrip("/")


def parse_workers(
    status: int | None,
    body: str,
    servers: Sequence[str],
    error: str | None = None,
    *,
    policy: str | None = None,
) -> RouterRead:
    """Each of ``servers`` as ``GET /workers`` shows it: listed is IN (with its health
    and, where ``policy`` counts it, its load), absent is OUT. An unreachable router or a
    reply that is not the worker list is an error, with every server UNKNOWN."""
    if status != 200:
        said = error or f"HTTP {status}: {body.strip()[:200]}"
        return RouterRead({}, f"GET /workers: {said}")
    try:
        listed = [(str(w["url"]), w) for w in json.loads(body)["workers"]]
    except (ValueError, KeyError, TypeError) as e:
        return RouterRead({}, f"GET /workers: not the worker list ({e.__class__.__name__})")
    counts = policy in COUNTS_LOAD
    views: dict[str, ServerView] = {}
    for server in servers:
        mine = [(url, w) for url, w in listed if _same(url, server)]
        views[server] = (
            _view(server, mine, counts)
            if mine
            else ServerView(server, Rotation.OUT, None, None, "not listed")
        )
    return RouterRead(views)


def _view(server: str, mine: Sequence[tuple[str, Mapping[str, Any]]], counts: bool) -> ServerView:
    """One configured worker from its entries in the list: one, one per data-parallel
    rank, or (a router given two spellings of it) more. Up only when every entry is
    healthy; its load is their sum, where the policy counts it."""
    health = [w.get("is_healthy") for _, w in mine]
    up = False if False in health else True if all(h is True for h in health) else None
    loads = [w.get("load") for _, w in mine]
    load = (
        sum(x for x in loads if isinstance(x, int))
        if counts and all(isinstance(x, int) and x >= 0 for x in loads)
        else None
    )
    names = tuple(dict.fromkeys(base_of(url) for url, _ in mine))
    said = "healthy" if up is True else "unhealthy" if up is False else "listed"
    ranks = len(mine) // len(names)
    if ranks > 1:
        said += f", {ranks} ranks"
    if names != (server,):
        said += f", as {' and '.join(names)}"
    return ServerView(server, Rotation.IN, up, load, said, names)


def parse_change(status: int | None, body: str, error: str | None, *, add: bool) -> str | None:
    """None when the router took the change (or already had it that way), else why not."""
    if status == 200:
        return None
    said = body.strip()[:300]
    # Already there (every rank, with data-parallel ranks): the state wanted; the read
    # that follows every change is what confirms it.
    if (
        add
        and status == 400
        and (said.endswith("already exists") or said.startswith("No worker added for"))
    ):
        return None
    if status is None:
        return error or "no answer"
    return f"HTTP {status}: {said}" if said else f"HTTP {status}"
