"""``doctor``'s vocabulary: a probe (what to ask a host), the answer the edge brings
back, and the check it is judged into; with the few helpers every judge shares.

Pure: ``bot.core.doctor_probes`` lists the probes, ``bot.core.doctor_judges`` judges the
answers, ``bot.engine.doctor`` performs them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from bot.core.privilege import Privilege
from bot.core.results import CommandResult, HttpResult

Argv = tuple[str, ...]
HOST_TIMEOUT_S = 10.0
SUDOERS_FIX = (
    "install the output of `python -m bot sudoers --user {user}` on the host as "
    "/etc/sudoers.d/vllm-chatops-{user} (README: non-root hosts)"
)


class Outcome(StrEnum):
    OK = "ok"
    WARN = "warn"  # works, but the setup gives more than the bot needs
    FAIL = "fail"
    SKIP = "skip"  # not checked: a check it depends on failed


class Kind(StrEnum):
    CONFIG = "config"  # judged from the settings alone
    TCP = "tcp"
    HOST_KEY = "host key"
    COMMANDS = "commands"  # run ``commands`` on the host, in order
    HTTP = "http"


@dataclass(frozen=True, slots=True)
class Probe:
    host: str
    service: str | None
    name: str
    kind: Kind
    # (argv, the account it needs): run through the host's sudo prefix like the flows'.
    commands: tuple[tuple[Argv, Privilege], ...] = ()
    url: str = ""
    timeout_s: float = HOST_TIMEOUT_S
    # A failure here leaves the host's later checks unchecked (SKIP).
    gate: bool = False
    # What to run next, from what ``commands`` answered (pure; none: nothing more).
    then: Callable[[tuple[CommandResult, ...]], tuple[tuple[Argv, Privilege], ...]] | None = None
    # What each of ``commands`` reads on stdin (a router's Runtime API command).
    stdin: bytes | None = None
    # The router a probe checks (issue 19), a ``[routers.*]`` name.
    router: str | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """What the edge found. ``error``: it could not ask at all (the reason)."""

    error: str | None = None
    results: tuple[CommandResult, ...] = ()
    http: HttpResult | None = None
    key: str | None = None  # the SHA256 fingerprint the server presented
    trusted: str = ""  # what known_hosts trusts for the host (bot.hosts.known_hosts)


@dataclass(frozen=True, slots=True)
class Check:
    host: str
    service: str | None
    name: str
    outcome: Outcome
    detail: str
    fix: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "service": self.service,
            "check": self.name,
            "result": str(self.outcome),
            "detail": self.detail,
            "fix": self.fix,
        }


def skipped(probe: Probe, because: str) -> Check:
    return Check(probe.host, probe.service, probe.name, Outcome.SKIP, f"not checked: {because}")


def judged(p: Probe, outcome: Outcome, detail: str, fix: str = "") -> Check:
    return Check(p.host, p.service, p.name, outcome, detail, fix)


def reply(r: CommandResult) -> str:
    if r.refused:
        return r.refused
    text = " ".join(r.output.strip().splitlines()[-2:])
    status = "no exit status" if r.exit_status is None else f"exit {r.exit_status}"
    return f"{status}: {text}" if text else status


def failed(p: Probe, a: Answer) -> CommandResult | None:
    return next((r for r in a.results if not r.ok), None)
