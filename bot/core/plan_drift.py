"""What differs between a plan as approved and as the config gives it now (both as the
audit log stores them), for the engine's refusal to run a plan that changed since its
approval (``bot.engine.engine``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_TARGET_FIELDS = ("address", "port", "user", "key_file", "host_key")
# Fields whose old and new values the refusal may quote; others (an index URL may hold
# credentials, commands are long) are named only.
_QUOTED_FIELDS = frozenset(
    {
        "action",
        "service",
        "unit",
        "package",
        "version",
        "spec",
        "index_name",
        "dry_run",
        "batch_size",
        "force",
    }
)


def _shown(value: Any) -> str:
    text = "none" if value is None else str(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def drift(approved: Mapping[str, Any], now: Mapping[str, Any], *, limit: int = 3) -> str:
    """What differs between the plan as approved and as the config gives it now (both as
    stored), for the refusal: "gpu-node-1 port: 2222 → 2223", "gpu-node-1 host key:
    SHA256:… → SHA256:…", "steps". At most ``limit`` items, then how many more."""
    changes: list[str] = []
    before = {t.get("host"): t for t in approved.get("targets") or ()}
    after = {t.get("host"): t for t in now.get("targets") or ()}
    for host in dict.fromkeys([*before, *after]):
        old, new = before.get(host), after.get(host)
        if old is None or new is None:
            changes.append(f"host {host} {'added' if old is None else 'removed'}")
            continue
        changes += [
            f"{host} {name.replace('_', ' ')}: {_shown(old.get(name))} → {_shown(new.get(name))}"
            for name in _TARGET_FIELDS
            if old.get(name) != new.get(name)
        ]
    for key in sorted((set(approved) | set(now)) - {"targets"}):
        old, new = approved.get(key), now.get(key)
        if old == new:
            continue
        if key in _QUOTED_FIELDS:
            changes.append(f"{key.replace('_', ' ')}: {_shown(old)} → {_shown(new)}")
        else:
            changes.append(key.replace("_", " "))
    if not changes:
        return "no difference found"
    more = len(changes) - limit
    return "; ".join(changes[:limit]) + (f"; and {more} more" if more > 0 else "")
