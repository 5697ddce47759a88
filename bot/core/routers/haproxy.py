"""HAProxy's Runtime API, as the bot speaks it: ``show stat`` to read a backend, ``set
server <backend>/<server> state ready|drain|maint`` to change one server. Pure: replies
parsed here; the commands are sent by the bot's fixed script
(``bot.core.routers.haproxy_script``) on the router's host.

Formats are HAProxy's own, checked against a real HAProxy 2.6 (captures in
``tests/samples/routers/``): ``show stat`` is CSV with a ``# pxname,svname,...`` header
whose columns grew over the versions, so fields are found by name, never by position; a
``set server`` that worked answers an empty line, one that did not answers a sentence
(``No such server.``) and socat still exits 0."""

from __future__ import annotations

import csv
import io
from typing import Literal

from bot.core.routers.view import Rotation, ServerView

State = Literal["ready", "drain", "maint"]


def parse_answer(text: str) -> str | None:
    """None when HAProxy took the command (it answers an empty line), else what it said."""
    said = text.strip()
    return said or None


def rotation_of(status: str) -> tuple[Rotation, bool | None]:
    """A server's ``status`` field as a rotation and whether its checks pass.

    HAProxy prints ``UP``, ``UP 1/3`` (up, failing checks), ``DOWN``, ``DOWN 1/2`` (down,
    passing checks), ``NOLB``, ``DRAIN``, ``DRAIN (agent)``, ``MAINT``, ``MAINT (via
    b/s)``, ``MAINT (resolution)`` and ``no check`` (stats.c, srv_hlt_st)."""
    word = status.split(" ", 1)[0].upper()
    if word == "UP":
        return Rotation.IN, True
    if word == "DOWN":
        # In rotation as far as the admin state goes; its health check keeps it empty.
        return Rotation.IN, False
    if word == "NO":  # "no check": in rotation, no health check configured
        return Rotation.IN, None
    if word in ("DRAIN", "NOLB"):
        return Rotation.DRAINING, None
    if word == "MAINT":
        return Rotation.OUT, None
    return Rotation.UNKNOWN, None


def parse_show_stat(text: str, backend: str) -> dict[str, ServerView]:
    """Each server of ``backend`` in a ``show stat`` reply (FRONTEND/BACKEND rows and
    other proxies skipped). Raises ValueError when the reply is not ``show stat`` CSV
    (HAProxy's error sentence, an empty reply, a header without the needed columns)."""
    lines = text.lstrip("\n").splitlines()
    if not lines or not lines[0].startswith("# "):
        said = text.strip()[:200] or "nothing"
        raise ValueError(f"not a `show stat` reply: {said!r}")
    header = lines[0][2:].split(",")
    need = ("pxname", "svname", "status", "scur")
    if any(n not in header for n in need):
        raise ValueError(
            f"`show stat` header lacks {', '.join(n for n in need if n not in header)}"
        )
    at = {n: header.index(n) for n in need}
    views: dict[str, ServerView] = {}
    for row in csv.reader(io.StringIO("\n".join(lines[1:]))):
        if len(row) <= max(at.values()) or row[at["pxname"]] != backend:
            continue
        name = row[at["svname"]]
        if name in ("FRONTEND", "BACKEND"):
            continue
        status = row[at["status"]]
        rotation, up = rotation_of(status)
        scur = row[at["scur"]]
        views[name] = ServerView(name, rotation, up, int(scur) if scur.isdigit() else None, status)
    return views
