"""Policies and checks that read the whole settings for one host (issue 23): the policy of
a host's maintenance, which stops every service on the host, and whether its tools can
run through sudo there."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.settings.base import SUDO_PATH_RE

if TYPE_CHECKING:
    from bot.settings import PolicySettings, Settings

# A host run's service word ("host:gpu-01", ``bot.core.host_plan``), and who is named
# where the services on a host share no approver: no Slack id is this.
HOST_PREFIX = "host:"
NOBODY = "U0NOBODY0"
_WHO = ("approvers", "requesters")


def _common(lists: list[list[str]]) -> list[str] | None:
    """The entries every list names, an empty list naming anyone: [] when all are empty
    (anyone), None when the named ones share none (no one)."""
    named = [set(x) for x in lists if x]
    if not named:
        return []
    first = next(x for x in lists if x)
    both = [e for e in first if all(e in n for n in named)]
    return both or None


def host_policy(settings: Settings, host: str) -> tuple[PolicySettings, str | None]:
    """The policy of a host's maintenance (issue 23), which stops every service on
    the host: no weaker than any of theirs. An approver (and a requester) must be one
    every service's policy names (an empty list names anyone), at least the most
    approvals any of them needs, and their windows must be the same. When no one
    fits, the reason, and a policy that no click satisfies."""
    policies = [settings.policy_for(n) for n, svc in settings.services.items() if host in svc.hosts]
    if not policies:
        return settings.policy, None
    approvers, requesters = (_common([getattr(p, k) for p in policies]) for k in _WHO)
    windows = {p.windows.model_dump_json() if p.windows else "" for p in policies}
    why = None
    if approvers is None:
        why = f"the services on {host} have no approver in common in their policies"
    elif requesters is None:
        why = f"the services on {host} have no requester in common in their policies"
    elif len(windows) > 1:
        why = (
            f"the services on {host} keep different maintenance windows; a host run "
            "stops them all, so give them the same windows"
        )
    combined = settings.policy.model_copy(
        update={
            "approvers": approvers if approvers is not None else [NOBODY],
            "requesters": requesters if requesters is not None else [NOBODY],
            "min_approvals": max(p.min_approvals for p in policies),
            "windows": policies[0].windows,
        }
    )
    return combined, why


def maintenance_path_problem(settings: Settings, host: str) -> str | None:
    """Why ``[maintenance]``'s tools cannot run as root through sudo on ``host`` (one with
    ``become = "sudo"``): a bare name there would be whatever sudo's PATH finds, and no
    rule names it (``bot.core.sudoers_host``). None when they can, or the host runs them
    as its own root. Asked when a host maintenance is requested and by ``sudoers``, not at
    load: a sudo deployment that never reboots from chat keeps starting as it did."""
    cfg = settings.hosts.get(host)
    if cfg is None or cfg.become != "sudo":
        return None
    for key, tool in (("systemctl", "systemctl"), ("nvidia_smi", "nvidia-smi")):
        value = getattr(settings.maintenance, key)
        if not SUDO_PATH_RE.fullmatch(value):
            return (
                f'[maintenance] {key} = {value!r}: host {host} uses become = "sudo", so it '
                "must be an absolute path (the sudoers rules of host reboot and GPU reset "
                f"name it; find it with `command -v {tool}` on the host)"
            )
    return None
