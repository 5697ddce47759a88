"""A router in front of a service's replicas (issue 19): its section of the settings."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from bot.settings.base import SUDO_PATH_RE, HealthUrl, Name, Section

RouterKind = Literal["haproxy", "vllm-router", "command"]
# A backend or server name HAProxy's admin socket may be sent: HAProxy's own characters
# for names (letters, digits, "." "_" ":" "-"; a server may be named "10.0.0.5:8000"),
# starting with a letter or digit. Never ";" (the Runtime API's command separator), a
# space, a newline or "/". The one pattern: the settings check router_servers with it,
# and bot.core.routers.haproxy_script's root script checks the same (a test holds them
# equal), matched whole (fullmatch).
HAPROXY_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,62}")
# The one argument of a router command the bot fills in: the replica's server name.
SERVER_FIELD = "{server}"
# vLLM Router's `--policy` choices (vllm-router 0.1.17).
VllmRouterPolicy = Literal[
    "random",
    "round_robin",
    "cache_aware",
    "kv_aware",
    "power_of_two",
    "consistent_hash",
    "sticky_least_loaded",
]


def valid_haproxy_server_name(name: str) -> bool:
    """Whether ``name`` may be sent on the admin socket as a backend or server name
    (``HAPROXY_NAME_RE``, whole): ``bot.core.routers.haproxy.valid_server_name`` is this
    function (the settings may not import the core)."""
    return HAPROXY_NAME_RE.fullmatch(name) is not None


def _argv(key: str, v: list[str] | None) -> list[str] | None:
    if v is None:
        return None
    if not v or not SUDO_PATH_RE.fullmatch(v[0]):
        raise ValueError(f"{key}: the first element must be an absolute path to the program")
    for arg in v:
        if SERVER_FIELD in arg and arg != SERVER_FIELD:
            # One whole argument, never spliced into another: the value never meets a shell.
            raise ValueError(f"{key}: {SERVER_FIELD} must be an argument of its own")
    return v


class RouterSettings(Section):
    """A router in front of a service's replicas (issue 19), reached through SSH from
    ``host`` like everything else: nothing on the bot's side listens."""

    kind: RouterKind
    host: Name
    # haproxy: the Runtime API socket (`stats socket ... level admin`) and the backend.
    socket: str | None = None
    backend: Name | None = None
    # haproxy: what speaks to the socket on `host`, the command on its stdin.
    socat: str = "/usr/bin/socat"
    # vllm-router: its admin API as seen from `host`.
    admin_url: HealthUrl | None = None
    # vllm-router: its `--policy`. Only some policies count the requests in flight that
    # GET /workers reports as `load` (cache_aware, power_of_two, kv_aware: checked
    # against vllm-router 0.1.17); under the others it stays 0 however busy a worker is.
    # Unset: not known, and the bot does not read `load` as sessions (the service's own
    # /metrics drain decides).
    policy: VllmRouterPolicy | None = None
    # command: argv lists; "{server}" is one argument, the replica's server.
    drain: list[str] | None = None
    undrain: list[str] | None = None
    in_flight: list[str] | None = None
    # After taking a replica out, before judging its in-flight requests: a router that
    # balances by connection may still hand it a request it had already picked.
    settle_s: float = Field(5.0, ge=0)
    # How long the router may take to show no session for a replica taken out, and to
    # show one put back as up.
    drain_timeout_s: float = Field(300.0, gt=0)
    confirm_timeout_s: float = Field(60.0, gt=0)
    poll_s: float = Field(1.0, gt=0)
    command_timeout_s: float = Field(30.0, gt=0)

    @field_validator("socket", "socat")
    @classmethod
    def _abs(cls, v: str | None) -> str | None:
        if v is not None and not SUDO_PATH_RE.fullmatch(v):
            raise ValueError(f"{v!r} must be an absolute path")
        return v

    @field_validator("drain", "undrain", "in_flight")
    @classmethod
    def _argvs(cls, v: list[str] | None, info: ValidationInfo) -> list[str] | None:
        return _argv(str(info.field_name), v)

    @model_validator(mode="after")
    def _kind_keys(self) -> RouterSettings:
        need: dict[str, tuple[str, ...]] = {
            "haproxy": ("socket", "backend"),
            "vllm-router": ("admin_url",),
            "command": ("drain", "undrain"),
        }
        missing = [k for k in need[self.kind] if getattr(self, k) is None]
        if missing:
            raise ValueError(f'kind = "{self.kind}" needs {", ".join(missing)}')
        optional = {"command": {"in_flight"}, "vllm-router": {"policy"}, "haproxy": set()}
        foreign = {"socket", "backend", "admin_url", "drain", "undrain", "in_flight", "policy"}
        foreign -= set(need[self.kind]) | optional[self.kind]
        extra = sorted(k for k in foreign if getattr(self, k) is not None)
        if extra:
            raise ValueError(f'kind = "{self.kind}" takes no {", ".join(extra)}')
        return self
