"""The router a plan rotates its replicas through, as approved (issue 19).

Built from the config at request and again at execute, and part of the plan's JSON, so
a router re-pointed between the approval and the run (another socket, backend, admin URL,
command or server name) is a changed plan the engine refuses, as for a host."""

from __future__ import annotations

from dataclasses import dataclass

from bot.settings import RouterKind, Settings


@dataclass(frozen=True, slots=True)
class RouterTarget:
    name: str
    kind: RouterKind
    # The configured host the router's socket or admin API is reached from.
    host: str
    # Each of the service's hosts and its server at the router, in the service's order.
    servers: tuple[tuple[str, str], ...]
    min_serving: int
    settle_s: float
    drain_timeout_s: float
    confirm_timeout_s: float
    poll_s: float
    command_timeout_s: float
    socket: str | None = None
    backend: str | None = None
    socat: str = "/usr/bin/socat"
    admin_url: str | None = None
    drain: tuple[str, ...] | None = None
    undrain: tuple[str, ...] | None = None
    in_flight: tuple[str, ...] | None = None
    # vllm-router: its `--policy`, where the config says (None: not known).
    policy: str | None = None

    def server(self, host: str) -> str:
        return dict(self.servers)[host]

    def host_of(self, server: str) -> str | None:
        return next((h for h, s in self.servers if s == server), None)


def router_target(settings: Settings, service: str) -> RouterTarget | None:
    """The router in front of ``service``, or None when it has none."""
    svc = settings.services.get(service)
    if svc is None or svc.router is None:
        return None
    r = settings.routers[svc.router]  # settings check that it exists
    return RouterTarget(
        name=svc.router,
        kind=r.kind,
        host=r.host,
        servers=tuple((h, svc.router_servers[h]) for h in svc.hosts),
        min_serving=svc.min_serving,
        settle_s=r.settle_s,
        drain_timeout_s=r.drain_timeout_s,
        confirm_timeout_s=r.confirm_timeout_s,
        poll_s=r.poll_s,
        command_timeout_s=r.command_timeout_s,
        socket=r.socket,
        backend=r.backend,
        socat=r.socat,
        admin_url=r.admin_url,
        drain=tuple(r.drain) if r.drain is not None else None,
        undrain=tuple(r.undrain) if r.undrain is not None else None,
        in_flight=tuple(r.in_flight) if r.in_flight is not None else None,
        policy=r.policy,
    )
