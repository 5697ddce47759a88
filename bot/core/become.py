"""How a host runs a command that needs an account: ``become`` puts the sudo prefix in
front of it where the host says ``become = "sudo"``, and ``Become`` explains a refusal by
naming the rule of ``python -m bot sudoers`` the host's drop-in lacks. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from bot.core import privilege, remote
from bot.core.privilege import Privilege, sudo_refusal
from bot.core.routers import haproxy_script
from bot.core.sudoers import alias, rule_for
from bot.core.sudoers_host import host_alias, host_rule_for
from bot.core.sudoers_router import router_alias, router_grants
from bot.core.sudoers_rules import Grant
from bot.settings import (
    HOST_PREFIX,
    HostSettings,
    MaintenanceSettings,
    ServiceSettings,
    Settings,
)

Argv = tuple[str, ...]
_ROOT_PREFIX: Argv = ("sudo", "-n", "--")


def become(argv: Argv, run_as: Privilege, host: HostSettings, svc: ServiceSettings | None) -> Argv:
    """``argv`` as the host must run it: unchanged unless the host says ``become =
    "sudo"`` and the command needs an account (``run_as``).  An install that reads its
    index URL on stdin keeps that wrapper outside sudo: the URL reaches uv through the
    environment, which sudo passes on for these commands only (``env_keep`` in the
    rules); the command under sudo is then exactly the rule's."""
    if host.become != "sudo" or run_as == Privilege.NONE:
        return argv
    if run_as == Privilege.ROOT:
        prefix = _ROOT_PREFIX
    elif svc is not None and svc.venv_user:
        prefix = ("sudo", "-n", "-u", svc.venv_user, "--")
    else:
        return argv  # no venv owner: the login user owns the venv
    n = len(remote.INDEX_FROM_STDIN)
    if argv[:n] == remote.INDEX_FROM_STDIN:
        return (*argv[:n], *prefix, *argv[n:])
    return (*prefix, *argv)


def _account(run_as: Privilege, svc: ServiceSettings | None) -> str:
    if run_as == Privilege.ROOT:
        return "root"
    return svc.venv_user if svc is not None and svc.venv_user else "the login user"


def _shown(argv: Argv) -> str:
    """A command as a refusal names it: the HAProxy script by the command it sends (its
    text is long and the same in every rule), anything else as it runs."""
    words = haproxy_script.words_of(_core(argv))
    if words is not None:
        return f"the bot's HAProxy script sending `{' '.join(words)}`"
    return f"`{remote.shown(argv)}`"


def _core(argv: Argv) -> Argv:
    n = len(remote.INDEX_FROM_STDIN)
    return argv[n:] if argv[:n] == remote.INDEX_FROM_STDIN else argv


@dataclass(frozen=True, slots=True)
class Become:
    """``become`` and the explanation of a refusal for one host and (maybe) service."""

    service: str | None
    host: HostSettings
    svc: ServiceSettings | None
    # ``[maintenance]``: whose rules (host reboot, GPU reset) a refusal may name.
    maintenance: MaintenanceSettings | None = None
    # A host run's (issue 23): the services on the host, each command's own found by the
    # interpreter it names, so a venv's commands run as that venv's owner.
    services: tuple[tuple[str, ServiceSettings], ...] = ()
    # The rules of the haproxy routers on the host (their alias, the rule): what a
    # refusal of the bot's HAProxy script names.
    routers: tuple[tuple[str, Grant], ...] = ()

    def argv(self, argv: Argv, run_as: Privilege) -> Argv:
        return become(argv, run_as, self.host, self._of(argv)[1])

    def question(self, argv: Argv, run_as: Privilege) -> Argv | None:
        """The ``sudo -n -l`` that asks whether sudo would run ``argv`` as ``run_as``
        needs (``privilege.sudo_question``); None where the host runs it as it is."""
        if self.argv(argv, run_as) == argv:
            return None
        svc = self._of(argv)[1]
        owner = svc.venv_user if run_as == Privilege.VENV_OWNER and svc is not None else None
        return privilege.sudo_question(argv, owner)

    def _of(self, argv: Argv) -> tuple[str | None, ServiceSettings | None]:
        """The service ``argv`` is a command of: this one's, else (a host run) the one
        whose interpreter or venv it names, or whose unit it names (its systemctl and
        journalctl lines: a refusal then names that service's rule)."""
        if self.svc is not None or not self.services:
            return self.service, self.svc
        words = " ".join(argv)
        # The interpreter first: one venv's path may begin another's (/opt/v, /opt/v2).
        for name, svc in self.services:
            if svc.python in words:
                return name, svc
        for name, svc in self.services:
            if f"{svc.venv_dir}/" in words:
                return name, svc
        for name, svc in self.services:
            if svc.unit in argv:  # a whole word: vllm-kimi is not vllm-kimi-2
                return name, svc
        return self.service, None

    def refused(
        self, argv: Argv, run_as: Privilege, exit_status: int | None, stderr: str
    ) -> str | None:
        """Why sudo refused ``argv`` (as built, before ``become``), naming the rule the
        host lacks; None when sudo ran it or it did not go through sudo."""
        if self.argv(argv, run_as) == argv:
            return None
        why = sudo_refusal(exit_status, stderr)
        if why is None:
            return None
        return (
            f"sudo refused {_shown(argv)} as {_account(run_as, self._of(argv)[1])}: "
            f"{why}. {self.missing_rule(argv, run_as)}"
        )

    def missing_rule(self, argv: Argv, run_as: Privilege) -> str:
        (service, svc), core = self._of(argv), _core(argv)
        router = next(((a, g) for a, g in self.routers if g.matches(core)), None)
        if router is not None:
            return (
                f"The host's sudoers drop-in lacks the rule of {_shown(core)} (Cmnd_Alias "
                f"{router[0]}, {router[1].why}); install the output of `python -m bot "
                "sudoers` on it (README: non-root hosts)."
            )
        host = host_rule_for(core, self.maintenance) if self.maintenance is not None else None
        if host is not None and run_as == Privilege.ROOT:
            return (
                f"The host's sudoers drop-in lacks the host-maintenance rule `{host.line()}` "
                f"(Cmnd_Alias {host_alias(self.host.user)}, {host.why}); install the output of "
                "`python -m bot sudoers` on it (README: non-root hosts)."
            )
        grant = rule_for(core, svc) if svc is not None else None
        if grant is None or service is None:
            return (
                "No rule in `python -m bot sudoers` covers this command: the bot's "
                "sudoers drop-in must be generated again."
            )
        return (
            f"The host's sudoers drop-in lacks the rule `{grant.line()}` (Cmnd_Alias "
            f"{alias(self.host.user, service, run_as)}, {grant.why}); install the output of "
            f"`python -m bot sudoers` on it (README: non-root hosts)."
        )


def become_for(settings: Settings, host: str, service: str | None = None) -> Become | None:
    """How ``host`` runs ``service``'s commands that need rights; None when it runs them
    as they are (``become = "none"``, or a host not configured)."""
    cfg = settings.hosts.get(host)
    if cfg is None or cfg.become != "sudo":
        return None
    svc = settings.services.get(service) if service else None
    on_host = (
        tuple((n, s) for n, s in settings.services.items() if host in s.hosts)
        if service is not None and service.startswith(HOST_PREFIX)
        else ()
    )
    routers = tuple(
        (router_alias(cfg.user, name), g)
        for name, rules in router_grants(settings, [host])
        for g in rules
    )
    return Become(service, cfg, svc, settings.maintenance, on_host, routers)
