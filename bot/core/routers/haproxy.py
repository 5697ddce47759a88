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
from bot.settings.routers import valid_haproxy_server_name

State = Literal["ready", "drain", "maint"]

# Whether a name may be put on the admin socket (letters, digits, `.`, `_`, `-`, `:`;
# never `;`, a space, a newline or `/`): the settings refuse any other, the phase that
# sends a command checks again, and the root script checks the same pattern. Defined
# beside the settings, which may not import the core.
valid_server_name = valid_haproxy_server_name


def parse_answer(text: str) -> str | None:
    """None when HAProxy took the command (it answers an empty line), else what it said."""
    said = text.strip()
    return said or None


def rotation_of(status: str, weight: int | None) -> tuple[Rotation, bool | None]:
    """A server's ``status`` and ``weight`` fields as a rotation and whether its checks
    pass.

    HAProxy prints ``UP``, ``UP 1/3`` (up, failing checks), ``DOWN``, ``DOWN 1/2`` (down,
    passing checks), ``NOLB``, ``DRAIN``, ``DRAIN (agent)``, ``MAINT``, ``MAINT (via
    b/s)``, ``MAINT (resolution)`` and ``no check`` (stats.c, srv_hlt_st). A server
    ``set weight`` to 0 stays ``UP`` and gets no new request: draining, never serving.
    An in-rotation status whose weight cannot be read (None) is UNKNOWN: only a weight
    above 0 is proof that it serves."""
    word = _word(status)
    if word == "UP":
        return _weighed(Rotation.IN, weight), True
    if word == "DOWN":
        # In rotation as far as the admin state goes; its health check keeps it empty.
        return _weighed(Rotation.IN, weight), False
    if word == "NO":  # "no check": in rotation, no health check configured
        return _weighed(Rotation.IN, weight), None
    if word in ("DRAIN", "NOLB"):
        return Rotation.DRAINING, None
    if word == "MAINT":
        return Rotation.OUT, None
    return Rotation.UNKNOWN, None


def _word(status: str) -> str:
    return status.split(" ", 1)[0].upper()


# The status words whose rotation the weight decides.
_WEIGHED = ("UP", "DOWN", "NO")


def _weighed(rotation: Rotation, weight: int | None) -> Rotation:
    if weight is None:
        return Rotation.UNKNOWN
    return Rotation.DRAINING if weight == 0 else rotation


def parse_show_stat(text: str, backend: str) -> dict[str, ServerView]:
    """Each server of ``backend`` in a ``show stat`` reply (FRONTEND/BACKEND rows and
    other proxies skipped). Raises ValueError when the reply is not ``show stat`` CSV
    (HAProxy's error sentence, an empty reply, a header without the needed columns)."""
    lines = text.lstrip("\n").splitlines()
    if not lines or not lines[0].startswith("# "):
        said = text.strip()[:200] or "nothing"
        raise ValueError(f"not a `show stat` reply: {said!r}")
    header = lines[0][2:].split(",")
    need = ("pxname", "svname", "status", "scur", "weight")
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
        status, weight, scur = row[at["status"]], row[at["weight"]], row[at["scur"]]
        w = int(weight) if weight.isdigit() else None
        rotation, up = rotation_of(status, w)
        # The weight is named where it decided: 0 (set by hand) or unreadable.
        weighed = _word(status) in _WEIGHED and not w
        detail = f"{status}, weight {weight or 'unknown'}" if weighed else status
        views[name] = ServerView(name, rotation, up, int(scur) if scur.isdigit() else None, detail)
    return views
