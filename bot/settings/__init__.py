"""One validated settings object, built once at start and passed down.

Sources, highest priority first: environment variables (only the documented
ones: secrets and paths), then the TOML file named by ``CHATOPS_CONFIG``
(default ``./chatops.toml``).  Every rule an operator can break is checked here,
so a bad file fails at start with the key and the problem, not mid-redeploy.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from bot.errors import ConfigError
from bot.settings.base import (
    GPU_UUID_RE,
    NAME_RE,
    PACKAGE_RE,
    SUDO_PATH_RE,
    UNIT_RE,
    HealthUrl,
    HttpUrlStr,
    Name,
    Section,
    environment_only,
    expand,
    http_url,
)
from bot.settings.base import LOCAL as LOCAL
from bot.settings.base import USER_RE as USER_RE
from bot.settings.database import DbTarget, url_secrets
from bot.settings.database import PostgresUrl as PostgresUrl
from bot.settings.database import shown_url as shown_url
from bot.settings.host_policy import HOST_PREFIX as HOST_PREFIX
from bot.settings.host_policy import host_policy
from bot.settings.host_policy import maintenance_path_problem as maintenance_path_problem
from bot.settings.maintenance import MaintenanceSettings as MaintenanceSettings
from bot.settings.policy import PolicySettings as PolicySettings
from bot.settings.policy import ServicePolicySettings as ServicePolicySettings
from bot.settings.replicas import COMMAND_START_S, lease_margin_for
from bot.settings.replicas import ReplicaSettings as ReplicaSettings
from bot.settings.routers import HAPROXY_NAME_RE as HAPROXY_NAME_RE
from bot.settings.routers import SERVER_FIELD as SERVER_FIELD
from bot.settings.routers import RouterKind as RouterKind
from bot.settings.routers import RouterSettings as RouterSettings
from bot.settings.routers import valid_haproxy_server_name
from bot.settings.sections import AuditSettings as AuditSettings
from bot.settings.sections import SecuritySettings as SecuritySettings
from bot.settings.windows import WindowSettings as WindowSettings

Strategy = Literal["in_place", "side_by_side"]


class MetricsSettings(Section):
    # Where the bot serves Prometheus' /metrics ("127.0.0.1:9464"); None: not served.
    listen: str | None = None

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str | None) -> str | None:
        if v is None:
            return v
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"{v!r} is not host:port (for example 127.0.0.1:9464)")
        return v

    def address(self) -> tuple[str, int] | None:
        if self.listen is None:
            return None
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]"), int(port)


class SlackSettings(Section):
    channels: list[str] = Field(default_factory=list)
    post_interval_s: float = Field(1.0, ge=0)
    update_interval_s: float = Field(1.0, ge=0)


class FleetSettings(Section):
    """How ``/vllm gpus`` reaches many hosts at once (README: "Big fleets")."""

    # At most this many hosts are read at once, so at most this many SSH connections are
    # opened at once: 1,000 handshakes at the same moment would time each other out on
    # the bot's CPU and hold 1,000 sockets. A query of more hosts than this closes each
    # connection it opened after that host's read, so none is left idle for ever.
    max_connections: int = Field(64, ge=1, le=1024)
    # The whole query answers within this. Each hung host holds a slot for its own
    # timeout (10 s), so 1,000 hung hosts at 64 at once would take 160 s; past this the
    # hosts not read yet are rows saying so, and the ones read keep theirs.
    deadline_s: float = Field(60.0, gt=0)


class HostSettings(Section):
    address: str
    port: int = Field(22, ge=1, le=65535)
    user: str = "root"
    key_file: Path | None = None
    known_hosts: Path | None = None
    connect_timeout_s: float = Field(10.0, gt=0)
    keepalive_interval_s: float = Field(5.0, gt=0)
    keepalive_count_max: int = Field(3, ge=1)
    max_sessions: int = Field(8, ge=1, le=64)
    # "sudo": `user` is an ordinary account, and what needs rights runs as
    # `sudo -n <exact argv>` (bot.core.sudoers; print the rules with `python -m bot
    # sudoers`). "none": every command runs as `user` itself (root, or an account that
    # owns the unit and the venv).
    become: Literal["none", "sudo"] = "none"
    # Where the host's sshd reads its configuration: `doctor` reads its AuthorizedKeysFile
    # there to tell whether the login could change its own key's restrictions.
    sshd_config: str = "/etc/ssh/sshd_config"

    @field_validator("key_file", "known_hosts")
    @classmethod
    def _expand_user(cls, v: Path | None) -> Path | None:
        return None if v is None else expand(v)

    @model_validator(mode="after")
    def _strict_host_keys(self) -> HostSettings:
        if self.address != LOCAL and self.known_hosts is None:
            raise ValueError("known_hosts is required: host keys are always checked strictly")
        return self

    @property
    def is_local(self) -> bool:
        return self.address == LOCAL


class ServiceSettings(Section):
    hosts: list[Name] = Field(min_length=1)
    unit: str
    python: str
    package: str = "vllm"
    uv: str = "uv"
    # Under `become = "sudo"` these must be absolute: the sudoers rules name them.
    systemctl: str = "systemctl"
    journalctl: str = "journalctl"
    # What the leftover-worker script (run as root) reads processes with and signals
    # them with: absolute, as root must never find a tool through a PATH someone else
    # set (issue 17, F1); where Debian 12, Ubuntu and RHEL put them.
    ps: str = "/usr/bin/ps"
    kill: str = "/usr/bin/kill"
    # The account that owns the venv: installs run as `sudo -n -u <venv_user>` on hosts
    # with `become = "sudo"`. None: the login user installs (it owns the venv).
    venv_user: str | None = None
    health_url: HealthUrl = "http://127.0.0.1:8000/health"
    indexes: dict[Name, HttpUrlStr] = Field(default_factory=dict)
    drain_threshold_mib: int = Field(1024, ge=0)
    drain_timeout_s: float = Field(120, gt=0)
    drain_poll_s: float = Field(1.0, gt=0)
    start_timeout_s: float = Field(1800, gt=0)
    health_poll_s: float = Field(2.0, gt=0)
    stop_timeout_s: float = Field(300, gt=0)
    install_timeout_s: float = Field(3600, gt=0)
    command_timeout_s: float = Field(60, gt=0)
    min_free_disk_mib: int = Field(10240, ge=0)
    journal_lines: int = Field(50, ge=1, le=10000)
    max_unavailable: int = Field(1, ge=1)
    # The GPUs this service runs on (indexes as nvidia-smi numbers them, or UUIDs); unset:
    # every GPU of the host. The drain, the GPU tables and the health check consider only
    # these; what runs on the others is shown and never blocks.
    gpus: list[int | str] | None = None
    # Leftover processes an approver lets the bot terminate: how long each of SIGTERM and
    # SIGKILL is given to end them before the next step (then: a GPU reset or reboot).
    kill_grace_s: float = Field(10.0, gt=0)
    # Model-level readiness after /health (bot.core.readiness): the model id /v1/models
    # must list, and a smoke completion whose text must match smoke_expect (a regex;
    # any non-empty text when unset). The API is health_url's scheme://host:port
    # unless api_url is set.
    served_model: str | None = Field(None, min_length=1, max_length=500)
    smoke_prompt: str | None = Field(None, min_length=1, max_length=4000)
    smoke_expect: str | None = Field(None, min_length=1, max_length=500)
    smoke_max_tokens: int = Field(16, ge=1, le=4096)
    smoke_timeout_s: float = Field(60, gt=0)
    api_url: HealthUrl | None = None
    # Before the stop, wait this long for running and waiting requests to finish
    # (0: do not wait); past it the run ends with the service untouched, unless --force.
    request_drain_timeout_s: float = Field(300, ge=0)
    # While the server starts: the journal lines read per poll at most, and how often
    # the status card's elapsed time is refreshed when the phase does not change.
    journal_follow_lines: int = Field(1000, ge=10, le=100000)
    progress_interval_s: float = Field(10.0, gt=0)
    # A new version that starts but never turns healthy: restore the environment snapshot
    # and start the old one (true), or stop there and say how to roll back (false).
    rollback_on_unhealthy: bool = True
    # Issue 20: the watch window after a redeploy's start (bot.core.phases.watch): for
    # watch_s after readiness (0: off), every watch_interval_s, the unit's state, the
    # journal's failure lines, /health and the smoke completion; a failure rolls back.
    watch_s: float = Field(0, ge=0, le=86400)
    watch_interval_s: float = Field(30, ge=1, le=3600)
    # The import gate (`python -c "import vllm, torch"`): importing a large vLLM takes a
    # while on a cold page cache.
    gate_timeout_s: float = Field(300, gt=0)
    # Issue 19: the router in front of this service's replicas ([routers.*]), each host's
    # server there (haproxy server name, vllm-router worker URL, the command's {server}),
    # and how many other replicas must be serving before one is taken out.
    router: Name | None = None
    router_servers: dict[Name, str] = Field(default_factory=dict)
    min_serving: int = Field(1, ge=0)
    # Issue 20, item 3: how a redeploy changes the environment. "in_place" reinstalls the
    # venv while the service is stopped (the snapshot restores it on failure);
    # "side_by_side" builds each version in its own directory under <venv_dir>.releases
    # while the old one serves, and `venv_dir` is a symlink switched between them, so the
    # outage holds no install and a rollback is a switch back and a restart (README).
    strategy: Strategy = "in_place"
    # Release directories kept after a successful side-by-side run; never fewer than 2,
    # the live one and the one a rollback goes back to.
    keep_releases: int = Field(3, ge=2, le=100)
    # Issue 22: who may request and approve this service's runs, over [policy].
    policy: ServicePolicySettings = ServicePolicySettings()

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: list[int | str] | None) -> list[int | str] | None:
        if v is None:
            return None
        if not v:
            raise ValueError("name at least one GPU, or leave gpus unset for all of them")
        for g in v:
            if isinstance(g, int) and g < 0:
                raise ValueError(f"{g} is not a GPU index")
            if isinstance(g, str) and not GPU_UUID_RE.fullmatch(g):
                raise ValueError(f"{g!r} is neither a GPU index nor a GPU UUID (GPU-...)")
        if len(set(v)) != len(v):
            raise ValueError("a GPU is listed twice")
        return v

    @model_validator(mode="after")
    def _watch(self) -> ServiceSettings:
        # A window shorter than its interval would check once, at its end: not a watch.
        if self.watch_s and self.watch_interval_s > self.watch_s:
            raise ValueError(
                f"watch_interval_s ({self.watch_interval_s:g}) is longer than watch_s "
                f"({self.watch_s:g}): the window would check once at most; shorten "
                "watch_interval_s"
            )
        return self

    @field_validator("unit")
    @classmethod
    def _unit(cls, v: str) -> str:
        if not UNIT_RE.fullmatch(v):
            raise ValueError(f"{v!r} is not a systemd unit name")
        if v.startswith("-"):
            # systemctl and journalctl would read it as an option.
            raise ValueError(
                f"unit {v!r} starts with '-': name the service's own unit (e.g. vllm-kimi.service)"
            )
        return v

    @field_validator("venv_user")
    @classmethod
    def _user(cls, v: str | None) -> str | None:
        if v is not None and not USER_RE.fullmatch(v):
            raise ValueError(f"{v!r} is not an account name")
        return v

    @field_validator("python", "uv", "systemctl", "journalctl")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v or any(c.isspace() for c in v) or v.startswith("-"):
            raise ValueError(f"{v!r} is not a usable path")
        return v

    @field_validator("ps", "kill")
    @classmethod
    def _root_tool(cls, v: str) -> str:
        if not SUDO_PATH_RE.fullmatch(v):
            raise ValueError(
                f"{v!r}: must be an absolute path (root runs it; find it with "
                "`command -v` on the host)"
            )
        return v

    @field_validator("python")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError("must be an absolute path to the venv's interpreter")
        return v

    @field_validator("package")
    @classmethod
    def _package(cls, v: str) -> str:
        if not PACKAGE_RE.fullmatch(v):
            raise ValueError(f"{v!r} is not a package name (pin versions per run)")
        return v

    @field_validator("smoke_expect")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as e:
                raise ValueError(f"{v!r} is not a regular expression: {e}") from None
        return v

    @property
    def venv_dir(self) -> str:
        # /opt/venvs/vllm/bin/python -> /opt/venvs/vllm
        return str(Path(self.python).parent.parent)

    @property
    def releases_dir(self) -> str:
        """Where side-by-side releases live: beside the venv's link (/opt/venvs/vllm ->
        /opt/venvs/vllm.releases/<version>-<sha>)."""
        return f"{self.venv_dir}.releases"


class Settings(BaseSettings):
    """Everything the bot is configured with. Immutable once loaded."""

    model_config = SettingsConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    policy: PolicySettings = PolicySettings()
    slack: SlackSettings = SlackSettings()
    metrics: MetricsSettings = MetricsSettings()
    security: SecuritySettings = SecuritySettings()
    audit: AuditSettings = AuditSettings()
    fleet: FleetSettings = FleetSettings()
    maintenance: MaintenanceSettings = MaintenanceSettings()
    replicas: ReplicaSettings = ReplicaSettings()
    hosts: dict[Name, HostSettings] = Field(default_factory=dict)
    services: dict[Name, ServiceSettings] = Field(default_factory=dict)
    routers: dict[Name, RouterSettings] = Field(default_factory=dict)

    # Environment-only values: secrets and deployment paths never live in the TOML file.
    # A SQLite file, or a ``postgresql://`` URL (bot.settings.database).
    db_path: DbTarget = Field(Path("chatops.db"), validation_alias="CHATOPS_DB")
    slack_bot_token: SecretStr | None = Field(None, validation_alias="SLACK_BOT_TOKEN")
    slack_app_token: SecretStr | None = Field(None, validation_alias="SLACK_APP_TOKEN")
    slack_signing_secret: SecretStr | None = Field(None, validation_alias="SLACK_SIGNING_SECRET")
    slack_api_url: str | None = Field(None, validation_alias="SLACK_API_URL")
    port: int = Field(3000, ge=1, le=65535, validation_alias="PORT")

    @model_validator(mode="after")
    def _references(self) -> Settings:
        for name, svc in self.services.items():
            for h in svc.hosts:
                if h not in self.hosts:
                    known = ", ".join(sorted(self.hosts)) or "none configured"
                    raise ValueError(
                        f"services.{name}.hosts names unknown host {h!r} (hosts: {known})"
                    )
                if self.hosts[h].become == "sudo":
                    _check_sudo_paths(name, svc, h)
            _check_router(self, name, svc)
        _check_sudo_maintenance(self)
        for name, r in self.routers.items():
            if r.host not in self.hosts:
                raise ValueError(f"routers.{name}.host names unknown host {r.host!r}")
        return self

    @model_validator(mode="after")
    def _lease_outlasts_its_margin(self) -> Settings:
        """A driver asks its lease before each action on a host; the command reaches the
        host an SSH connect and a command's start later. A lease no longer than that
        could end in between, with another replica taking the run over meanwhile."""
        slowest = self._slowest_connect()
        if slowest is None:
            return self  # no host: no action on one to fence
        name, connect_s = slowest
        margin = lease_margin_for(connect_s)
        if self.replicas.lease_s <= margin:
            raise ValueError(
                f"replicas.lease_s ({self.replicas.lease_s:g}) must exceed the lease margin "
                f"({margin:g} s: hosts.{name}.connect_timeout_s = {connect_s:g} plus "
                f"{COMMAND_START_S:g} s for a command's start): a driver that finds its "
                "lease still running could reach the host after it ran out and another "
                "replica took the run; raise replicas.lease_s or lower the connect timeout"
            )
        return self

    def _slowest_connect(self) -> tuple[str, float] | None:
        """The host whose SSH connect may take longest, and its timeout (a local host
        connects in no time); None with no host configured."""
        if not self.hosts:
            return None
        waits = [(0.0 if h.is_local else h.connect_timeout_s, n) for n, h in self.hosts.items()]
        connect_s, name = max(waits)
        return name, connect_s

    def lease_margin_s(self) -> float:
        """How much sooner than the database a driver counts its run's lease as over
        (``bot.engine.heartbeat``): the longest SSH connect timeout of the hosts plus a
        command's start."""
        slowest = self._slowest_connect()
        return lease_margin_for(0.0 if slowest is None else slowest[1])

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The TOML file is read by load_settings and passed as init kwargs, so
        # the path can come from CHATOPS_CONFIG at call time.
        return (env_settings, init_settings)

    def journal_base(self) -> Path:
        """What the audit fallback journal's files are named after (bot.audit.journal):
        the SQLite file; for PostgreSQL, a name of the database (no secret in it) in
        ``[audit] journal_dir`` or the working directory."""
        target = self.db_path
        if isinstance(target, PostgresUrl):
            return (self.audit.journal_dir or Path.cwd()) / f"chatops-pg-{target.tag}"
        if self.audit.journal_dir is None:
            return target
        return self.audit.journal_dir / target.name

    def policy_for(self, service: str) -> PolicySettings:
        """The policy every decision on ``service``'s runs is judged by: ``[policy]``
        with what ``[services.NAME.policy]`` overrides. A service no longer configured
        (a run recorded before its removal) is judged by ``[policy]`` alone."""
        if service.startswith(HOST_PREFIX):
            return self.host_policy(service[len(HOST_PREFIX) :])[0]
        svc = self.services.get(service)
        if svc is None:
            return self.policy
        # The set fields themselves, not a dump: a dump would turn [windows] into a dict
        # that model_copy (which does not validate) would keep as one.
        own = {
            k: getattr(svc.policy, k)
            for k in svc.policy.model_fields_set
            if getattr(svc.policy, k) is not None
        }
        return self.policy.model_copy(update=own) if own else self.policy

    def host_policy(self, host: str) -> tuple[PolicySettings, str | None]:
        """The policy of a host's maintenance, and why no one can ask or approve it
        (``bot.settings.host_policy``)."""
        return host_policy(self, host)

    def policies(self) -> list[PolicySettings]:
        """``[policy]`` and every service's effective one: whose groups to resolve."""
        return [self.policy, *(self.policy_for(name) for name in self.services)]

    def secret_values(self) -> list[str]:
        """Literal secrets to mask in anything posted, stored or logged."""
        out = [s.get_secret_value() for s in self.security.redact]
        for s in (self.slack_bot_token, self.slack_app_token, self.slack_signing_secret):
            if s is not None:
                out.append(s.get_secret_value())
        if isinstance(self.db_path, PostgresUrl):
            # The database's password, also as it reads percent-encoded in its URL.
            out.extend(url_secrets(self.db_path.url.get_secret_value()))
            # Or where the README says to put it instead: libpq reads it from here.
            if password := os.environ.get("PGPASSWORD"):
                out.append(password)
        return [v for v in out if len(v) >= 4]


def _check_router(settings: Settings, name: str, svc: ServiceSettings) -> None:
    """A service behind a router names each of its hosts' server there, and nothing else."""
    if svc.router is None:
        if svc.router_servers:
            raise ValueError(f"services.{name}.router_servers is set but router is not")
        return
    router = settings.routers.get(svc.router)
    if router is None:
        known = ", ".join(sorted(settings.routers)) or "none configured"
        raise ValueError(f"services.{name}.router names unknown router {svc.router!r} ({known})")
    missing = [h for h in svc.hosts if h not in svc.router_servers]
    stray = [h for h in svc.router_servers if h not in svc.hosts]
    if missing or stray:
        raise ValueError(
            f"services.{name}.router_servers must name a server for each of its hosts "
            f"(missing: {', '.join(missing) or 'none'}; not a host of it: "
            f"{', '.join(stray) or 'none'})"
        )
    servers = list(svc.router_servers.values())
    if len(set(servers)) != len(servers):
        raise ValueError(f"services.{name}.router_servers names one server twice")
    for h, server in svc.router_servers.items():
        if router.kind == "vllm-router":
            http_url(server)
        elif router.kind == "haproxy" and not valid_haproxy_server_name(server):
            raise ValueError(
                f"services.{name}.router_servers.{h} = {server!r} is not an HAProxy server "
                "name (letters, digits, '.', '_', '-', ':')"
            )
        elif router.kind == "command" and not NAME_RE.fullmatch(server):
            raise ValueError(f"services.{name}.router_servers.{h} = {server!r} is not a name")
    if svc.min_serving >= len(svc.hosts):
        raise ValueError(
            f"services.{name}.min_serving = {svc.min_serving} would never let one of its "
            f"{len(svc.hosts)} replicas out (at most {len(svc.hosts) - 1})"
        )


def _check_sudo_paths(name: str, svc: ServiceSettings, host: str) -> None:
    """A sudoers rule names a command by its absolute path, and the bot must run exactly
    that path (sudo's own search path is not ours to rely on)."""
    for key in ("uv", "systemctl", "journalctl", "python"):
        value = getattr(svc, key)
        if not SUDO_PATH_RE.fullmatch(value):
            raise ValueError(
                f'services.{name}.{key} = {value!r}: host {host} uses become = "sudo", so '
                "it must be an absolute path of letters, digits and . _ + - / @ "
                f"(the sudoers rules name it exactly; find it with `command -v {key}`)"
            )


def _check_sudo_maintenance(settings: Settings) -> None:
    """A ``[maintenance]`` tool given as a path must be one a sudoers rule can name (an
    absolute path of letters, digits and . _ + - / @): a typo there fails at load."""
    for key in ("systemctl", "nvidia_smi"):
        value = getattr(settings.maintenance, key)
        if "/" in value and not SUDO_PATH_RE.fullmatch(value):
            raise ValueError(
                f"maintenance.{key} = {value!r} must be an absolute path of letters, digits "
                "and . _ + - / @ (a sudoers rule names it)"
            )


def config_path(env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ) if env is None else env
    return Path(env.get("CHATOPS_CONFIG", "chatops.toml"))


def _format_validation(err: ValidationError, source: str) -> str:
    lines = [f"invalid configuration in {source}:"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling against deploy/chatops.example.toml)"
        elif e["type"] == "missing":
            msg = "required key is missing"
        lines.append(f"  {loc}: {msg}")
    return "\n".join(lines)


def load_settings(path: Path | None = None, **overrides: Any) -> Settings:
    """Read and validate the configuration; raise ConfigError naming the key on failure.

    ``path`` defaults to ``$CHATOPS_CONFIG`` or ``./chatops.toml``.  A missing
    default file means an empty configuration; a missing named file is an error.
    """
    explicit = path is not None or "CHATOPS_CONFIG" in os.environ
    path = path if path is not None else config_path()
    data: dict[str, Any] = {}
    if path.exists():
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"invalid TOML in {path}: {e}") from e
        except OSError as e:
            raise ConfigError(f"cannot read {path}: {e.strerror}") from e
    elif explicit:
        raise ConfigError(f"configuration file {path} does not exist (CHATOPS_CONFIG)")
    environment_only(data, path, Settings.model_fields)
    data.update(overrides)
    try:
        return Settings(**data)
    except ValidationError as e:
        raise ConfigError(_format_validation(e, str(path))) from e
