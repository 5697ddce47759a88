"""What the audit log's parts share (``bot.audit.store`` assembles them into ``AuditLog``):
the connection and the redaction every free-text value passes through, declared once so
each part type-checks on its own, and ``shielded``, which every public call that opens a
transaction wears."""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

from bot.audit.backend import Backend
from bot.audit.redaction import Redaction

T = TypeVar("T")
P = ParamSpec("P")
S = TypeVar("S", bound="StoreBase")


class StoreBase:
    """The attributes ``AuditLog.__init__`` sets, which the parts' methods use."""

    _db: Backend
    _r: Redaction


def shielded(
    method: Callable[Concatenate[S, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]:
    """Every public call that opens a transaction runs in ``Database.shielded``: a caller
    cancelled mid-write leaves the write to finish by itself."""

    @functools.wraps(method)
    async def call(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._db.shielded(method(self, *args, **kwargs))

    return call
