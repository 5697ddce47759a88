"""``doctor``: what to check on each host and service (pure). ``probes`` lists the checks,
host by host, each host's own checks first; every probe only reads."""

from __future__ import annotations

from collections.abc import Sequence

from bot.core import remote, remote_releases
from bot.core.doctor_keys import SSHD_KEYS_SCRIPT, check_key_files
from bot.core.doctor_sudo import HOST_RULES
from bot.core.doctor_types import Argv, Kind, Probe
from bot.core.leftovers import unit_user_query
from bot.core.privilege import SH, Privilege, sudo_question
from bot.core.routers.doctor import router_probes
from bot.core.sudoers import grants
from bot.core.sudoers_host import host_grants
from bot.core.sudoers_rules import Grant
from bot.settings import HostSettings, MaintenanceSettings, ServiceSettings, Settings


def _host_probes(
    name: str, cfg: HostSettings, gpus: bool = True, maint: MaintenanceSettings | None = None
) -> list[Probe]:
    """``gpus``: the host serves a service (a router's host alone has none to list).
    ``maint``: whose host-maintenance rules a sudo host that serves one is checked for."""
    out = [Probe(name, None, "login account", Kind.CONFIG)]
    if not cfg.is_local:
        out += [
            Probe(name, None, "tcp", Kind.TCP, timeout_s=cfg.connect_timeout_s, gate=True),
            Probe(
                name, None, "host key", Kind.HOST_KEY, timeout_s=cfg.connect_timeout_s, gate=True
            ),
        ]
    out.append(
        Probe(name, None, "ssh login", Kind.COMMANDS, ((("id", "-un"), Privilege.NONE),), gate=True)
    )
    if cfg.become == "sudo":
        out.append(
            Probe(name, None, "sudo -l", Kind.COMMANDS, ((("sudo", "-n", "-l"), Privilege.NONE),))
        )
        out.append(
            Probe(name, None, "sudo PATH", Kind.COMMANDS, ((("sudo", "-n", "-l"), Privilege.NONE),))
        )
    if not cfg.is_local and cfg.user != "root":
        out.append(
            Probe(
                name,
                None,
                "authorized_keys",
                Kind.COMMANDS,
                (((SH, "-c", SSHD_KEYS_SCRIPT, "sh", cfg.sshd_config), Privilege.NONE),),
                then=check_key_files,
            )
        )
    if gpus:
        out.append(
            Probe(name, None, "nvidia-smi", Kind.COMMANDS, ((remote.gpu_query(), Privilege.NONE),))
        )
    if gpus and cfg.become == "sudo" and maint is not None:
        asks = tuple((sudo_question(g.sample), Privilege.NONE) for g in host_grants(maint))
        out.append(Probe(name, None, HOST_RULES, Kind.COMMANDS, asks))
    return out


def _sudo_check(g: Grant, svc: ServiceSettings) -> Argv:
    owner = g.run_as == Privilege.VENV_OWNER and svc.venv_user
    return sudo_question(g.sample, svc.venv_user if owner else None)


def _owners(svc: ServiceSettings) -> Argv:
    """Who owns the venv and the bot's directory beside it (``<owner> <path>`` lines; a
    directory not made yet is left out, stat exits 1)."""
    return ("stat", "-c", "%U %n", "--", svc.venv_dir, remote.state_dir(svc))


def _service_probes(host: str, cfg: HostSettings, name: str, svc: ServiceSettings) -> list[Probe]:
    t = svc.command_timeout_s
    out = []
    if cfg.become == "sudo":
        out.append(
            Probe(
                host,
                name,
                "sudo rules",
                Kind.COMMANDS,
                tuple((_sudo_check(g, svc), Privilege.NONE) for g in grants(svc)),
                timeout_s=t,
            )
        )
    out += [
        Probe(
            host, name, "uv", Kind.COMMANDS, (((svc.uv, "--version"), Privilege.NONE),), timeout_s=t
        ),
        Probe(
            host,
            name,
            "unit",
            Kind.COMMANDS,
            (
                (remote.unit_show(svc), Privilege.ROOT),
                (unit_user_query(svc.unit, svc.systemctl), Privilege.NONE),
            ),
            timeout_s=t,
        ),
        Probe(
            host,
            name,
            "unit command",
            Kind.COMMANDS,
            ((remote.unit_exec_start(svc), Privilege.NONE),),
            timeout_s=t,
        ),
        Probe(
            host,
            name,
            "venv",
            Kind.COMMANDS,
            (
                (("test", "-x", svc.python), Privilege.NONE),
                (remote.package_show(svc), Privilege.VENV_OWNER),
                (_owners(svc), Privilege.NONE),
            ),
            timeout_s=t,
        ),
        *(
            (
                Probe(
                    host,
                    name,
                    "releases",
                    Kind.COMMANDS,
                    ((remote_releases.releases_list(svc), Privilege.VENV_OWNER),),
                    timeout_s=t,
                ),
            )
            if svc.strategy == "side_by_side"
            else ()
        ),
        Probe(host, name, "health", Kind.HTTP, url=svc.health_url, timeout_s=t),
        Probe(
            host,
            name,
            "disk",
            Kind.COMMANDS,
            ((remote.free_disk(svc), Privilege.NONE),),
            timeout_s=t,
        ),
    ]
    return out


def probes(settings: Settings, hosts: Sequence[str], service: str | None = None) -> list[Probe]:
    """The checks for ``hosts`` and the services on them (only ``service`` when given),
    host by host, each host's own checks first."""
    out: list[Probe] = []
    serving = {h for svc in settings.services.values() for h in svc.hosts}
    for host in hosts:
        cfg = settings.hosts[host]
        out += _host_probes(host, cfg, gpus=host in serving, maint=settings.maintenance)
        for name, svc in settings.services.items():
            if host in svc.hosts and service in (None, name):
                out += _service_probes(host, cfg, name, svc)
    # Each router in front of a service checked, or on a host checked (issue 19); its
    # host's own checks first when that host was not asked for.
    for rname, router in settings.routers.items():
        fronted = [
            n
            for n, svc in settings.services.items()
            if svc.router == rname and (service in (None, n)) and set(svc.hosts) & set(hosts)
        ]
        if router.host not in hosts and not fronted:
            continue
        if router.host not in hosts and not any(p.host == router.host for p in out):
            out += _host_probes(
                router.host,
                settings.hosts[router.host],
                router.host in serving,
                maint=settings.maintenance,
            )
        out += router_probes(settings, rname)
    return out
