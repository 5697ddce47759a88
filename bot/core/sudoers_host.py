"""The sudo rules of host maintenance (issue 23: ``host reboot`` and ``host gpu-reset``):
built from ``bot.core.host_ops``'s own argv, so the rules ``python -m bot sudoers`` prints
are the command lines the flow runs, and ``doctor`` checks each with ``sudo -n -l``.

All are root's and have no ``*``: the GPU index is matched digit by digit (``[0-9]``,
``[1-9][0-9]``: GPUs 0 to 99), so no rule lets an extra argument through (``-r -i 0 -q``
or ``-i 0 --anything`` match none). Which hosts get them: those with ``become = "sudo"``
that serve a service (the GPU hosts; a router's host alone has no GPU to reset).

The tools' paths: ``[maintenance]`` must name them absolutely for such a host, as a
service's ``systemctl`` must be: a sudoers rule names a command by its absolute path, and
the bot runs exactly that path. A bare name still loads (a sudo deployment that never
reboots from chat keeps working), but a host maintenance on that host is refused naming
the key, and ``sudoers`` prints no rule for it (``maintenance_path_problem``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from bot.core.host_ops import persistence_argv, reboot_argv, reset_argv
from bot.core.privilege import Privilege
from bot.core.sudoers_rules import Grant, Part, Wild, alias_name
from bot.settings import MaintenanceSettings, Settings

Argv = tuple[str, ...]


def host_alias(login: str) -> str:
    """The Cmnd_Alias of the host-maintenance rules in ``login``'s drop-in."""
    return alias_name(login, "HOST_MAINT", "ROOT")


# One GPU index per rule: one digit, or two without a leading zero (what str(int) writes).
_INDEX_GLOBS = (("[0-9]", 0), ("[1-9][0-9]", 10))


def _with_index(argv: Argv, glob: str, why: str) -> Grant:
    """``argv`` with the index after ``-i`` matched by ``glob``, the rest literal."""
    at = argv.index("-i") + 1
    pattern: tuple[Part, ...] = (*argv[:at], Wild("", glob), *argv[at + 1 :])
    return Grant(Privilege.ROOT, pattern, argv, why)


def host_grants(m: MaintenanceSettings) -> list[Grant]:
    """Every command line host maintenance runs under sudo, as root."""
    reboot = reboot_argv(m)
    out = [Grant(Privilege.ROOT, reboot, reboot, "reboot the host (/vllm host reboot)")]
    for on, said in ((False, "off before"), (True, "back on after")):
        for glob, sample in _INDEX_GLOBS:
            out.append(
                _with_index(
                    persistence_argv(m, sample, on),
                    glob,
                    f"a GPU's persistence mode {said} its reset (/vllm host gpu-reset), "
                    f"{glob.count('[')}-digit GPU index",
                )
            )
    for glob, sample in _INDEX_GLOBS:
        out.append(
            _with_index(
                reset_argv(m, sample),
                glob,
                f"reset one GPU (/vllm host gpu-reset), {glob.count('[')}-digit GPU index",
            )
        )
    return out


def host_rule_for(argv: Sequence[str], m: MaintenanceSettings) -> Grant | None:
    """The host-maintenance grant that allows ``argv`` (as ``host_ops`` built it)."""
    return next((g for g in host_grants(m) if g.matches(tuple(argv))), None)


def maintained_hosts(settings: Settings, hosts: Iterable[str] | None = None) -> list[str]:
    """The hosts among ``hosts`` (all when None) that need the host-maintenance rules:
    ``become = "sudo"`` and a service on them."""
    serving = {h for svc in settings.services.values() for h in svc.hosts}
    names = settings.hosts if hosts is None else hosts
    return sorted(
        h
        for h in names
        if h in settings.hosts and settings.hosts[h].become == "sudo" and h in serving
    )


HOST_NOTE = """\
# As root: reboot the host, and reset one GPU with its persistence mode turned off
# before and back on after (nvidia-smi refuses to reset a GPU persistence mode holds).
# Each line is exact but for the GPU index, matched digit by digit ([0-9] is one digit,
# as sudoers has no number ranges): no *, so no rule takes another argument or option."""
