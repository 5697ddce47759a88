"""``doctor``'s judgement of the configuration file itself: a doctor that found nothing
to check must not say "all checks passed" (a first run with the file in the wrong
directory, or a ``CHATOPS_CONFIG`` not exported, checks nothing at all). Pure."""

from __future__ import annotations

from bot.core.doctor_types import Check, Outcome

HOST = "(configuration)"
_FIX = (
    "copy deploy/chatops.example.toml to ./chatops.toml (or name your file with --config "
    "or CHATOPS_CONFIG) and describe your GPU hosts under [hosts.<name>] and what runs on "
    "them under [services.<name>]"
)


def judge_config(source: str, exists: bool, hosts: int, services: int) -> Check:
    """The configuration read from ``source`` (``exists``: the file was there; settings
    may also come from elsewhere): a failure when it names no host (nothing else can be
    checked), a warning when it names hosts but no service (``gpus`` and host maintenance
    work, nothing can be redeployed)."""
    if hosts == 0:
        why = f"{source} configures no host" if exists else f"{source} does not exist"
        return Check(HOST, None, "file", Outcome.FAIL, why, _FIX)
    counts = f"{hosts} host(s), {services} service(s)"
    detail = f"{source}: {counts}" if exists else counts
    if services == 0:
        return Check(HOST, None, "file", Outcome.WARN, f"{detail}: nothing to redeploy", _FIX)
    return Check(HOST, None, "file", Outcome.OK, detail)
