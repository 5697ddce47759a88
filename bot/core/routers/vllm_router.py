"""vLLM Router's admin API (PyPI ``vllm-router``), as the bot speaks it: ``GET /workers``
to read, ``POST /remove_worker?url=`` and ``POST /add_worker?url=`` to change. Pure: URLs
built here, replies parsed here; the requests go out from the router's host.

Checked against a real vllm-router 0.1.17 (captures in ``tests/samples/routers/``):

- ``/workers`` lists each worker with ``url``, ``is_healthy`` and ``load`` (the requests
  the router has open to it); a removed worker is simply absent.
- ``remove_worker`` answers 200 ``Successfully removed worker: <url>`` even for a URL it
  never had, so a removal is confirmed by reading ``/workers`` again, not by its reply.
- ``add_worker`` waits for the worker to pass the router's health check before it
  answers (up to the router's ``--worker-startup-timeout-secs``, 600 s by default); a URL
  already present answers 400 ``Worker <url> already exists``, which for putting a replica
  back is the state wanted."""

from __future__ import annotations

import json
from collections.abc import Sequence
from urllib.parse import quote

from bot.core.routers.view import Rotation, RouterRead, ServerView


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


def _same(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")


def parse_workers(
    status: int | None, body: str, servers: Sequence[str], error: str | None = None
) -> RouterRead:
    """Each of ``servers`` as ``GET /workers`` shows it: listed is IN (with its health and
    load), absent is OUT. An unreachable router or a reply that is not the worker list is
    an error, with every server UNKNOWN."""
    if status != 200:
        said = error or f"HTTP {status}: {body.strip()[:200]}"
        return RouterRead({}, f"GET /workers: {said}")
    try:
        listed = json.loads(body)["workers"]
        workers = {str(w["url"]): w for w in listed}
    except (ValueError, KeyError, TypeError) as e:
        return RouterRead({}, f"GET /workers: not the worker list ({e.__class__.__name__})")
    views: dict[str, ServerView] = {}
    for server in servers:
        w = next((v for k, v in workers.items() if _same(k, server)), None)
        if w is None:
            views[server] = ServerView(server, Rotation.OUT, None, None, "not listed")
            continue
        healthy = w.get("is_healthy")
        load = w.get("load")
        views[server] = ServerView(
            server,
            Rotation.IN,
            healthy if isinstance(healthy, bool) else None,
            load if isinstance(load, int) and load >= 0 else None,
            "healthy" if healthy is True else "unhealthy" if healthy is False else "listed",
        )
    return RouterRead(views)


def parse_change(status: int | None, body: str, error: str | None, *, add: bool) -> str | None:
    """None when the router took the change (or already had it that way), else why not."""
    if status == 200:
        return None
    said = body.strip()[:300]
    if add and status == 400 and said.endswith("already exists"):
        return None
    if status is None:
        return error or "no answer"
    return f"HTTP {status}: {said}" if said else f"HTTP {status}"
