"""What a router says about one replica, whatever the router's kind."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Rotation(StrEnum):
    # Receives new requests.
    IN = "in"
    # Takes no new requests, finishes the ones it has (haproxy `state drain`).
    DRAINING = "draining"
    # Takes nothing (haproxy `maint`, removed from a vllm-router, the command's `drain`).
    OUT = "out"
    # The router could not tell (unreachable, the server not found, a command kind
    # without a way to read its state).
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class ServerView:
    """One replica as its router sees it."""

    server: str
    rotation: Rotation
    # The router's own health check says it is up; None: the router has no such check
    # or did not say.
    up: bool | None = None
    # Requests the router has open to it now (haproxy `scur`); None: not known.
    sessions: int | None = None
    # The router's words for its state, as printed (haproxy `status`: "UP", "MAINT", ...).
    detail: str = ""
    # The router's own names for it, where they may differ from the config's
    # (vllm-router: each URL GET /workers lists it under, without a data-parallel rank):
    # what a change must send, exactly.
    names: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RouterRead:
    """A read of the router: each configured server's view, or why there is none."""

    servers: dict[str, ServerView]
    error: str | None = None

    def of(self, server: str) -> ServerView:
        return self.servers.get(server, ServerView(server, Rotation.UNKNOWN, detail="not listed"))
