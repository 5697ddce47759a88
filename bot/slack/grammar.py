"""The closed grammar of the ``/vllm`` command text.

``parse_command`` turns the text after ``/vllm`` into one frozen command object
or raises ``InputError`` with a sentence for the person who typed it.  Nothing
here quotes or unquotes: the text is split on spaces only, every token must be
made of a small set of plain ASCII characters, and every name is checked
against the configuration, so whatever comes out is safe to put in an argv.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NoReturn

from packaging.version import InvalidVersion, Version

from bot.core.commands import Front, Kind, commands_of
from bot.core.host_plan import OPERATIONS, gpu_indexes
from bot.core.status import Action
from bot.errors import InputError
from bot.settings import Settings
from bot.slack.blocks import escape

PREFIX = "/vllm"
MAX_TEXT_LEN = 500
LOGS_DEFAULT, LOGS_MAX = 50, 1000
AUDIT_DEFAULT, AUDIT_MAX = 20, 200
# Run ids are SQLite INTEGER PRIMARY KEYs.
MAX_RUN_ID = 2**63 - 1
MAX_VERSION_LEN = 100

# The commands, their options and usage lines come from the one command table that the
# terminal's parser is built from too (bot.core.commands).
_CHAT = {c.name: c for c in commands_of(Front.CHAT)}
COMMANDS: tuple[str, ...] = tuple(_CHAT)
USAGE: dict[str, str] = {name: c.chat_usage() for name, c in _CHAT.items()}


def _flags(name: str) -> dict[str, bool]:
    """The options of a command: each flag and whether it takes a value."""
    return {
        a.name: a.kind is not Kind.FLAG for a in _CHAT[name].args_of(Front.CHAT) if not a.positional
    }


# Split on spaces and tabs only; newlines and every other control character are
# rejected below rather than silently treated as separators.
_SEPARATORS = re.compile(r"[ \t]+")
# Everything the grammar needs: names, PEP 440 versions, numbers, "--flag=value", "#12",
# and a time of day for --at ("02:00").
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9._+=#:-]")
_TOKEN = re.compile(r"[A-Za-z0-9._+=#:-]+")
# A value quoted as the help shows it (--at "02:00"), in straight or a client's curly
# quotes: the quotes go, the rest is checked as any word.
_QUOTED = re.compile(r'^["\u201c\u201d](.*)["\u201c\u201d]$')
_AT_VALUE = re.compile(
    r"[0-9]{2}:[0-9]{2}|[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{5,8}(Z|[+-][0-9:]{2,5})?"
)
_DIGITS = re.compile(r"[0-9]+")
_SHOW_MAX = 60


@dataclass(frozen=True, slots=True)
class Help:
    pass


@dataclass(frozen=True, slots=True)
class When:
    """``--at TIME`` (as typed; the engine reads it in the window's time zone) and
    ``--now`` (an emergency override outside the window), issue 22."""

    at: str | None = None
    now: bool = False


AT_ONCE = When()


@dataclass(frozen=True, slots=True)
class Redeploy:
    service: str
    version: str | None = None
    index: str | None = None
    dry_run: bool = False
    force: bool = False  # stop without waiting for in-flight requests
    when: When = AT_ONCE


@dataclass(frozen=True, slots=True)
class Restart:
    service: str
    force: bool = False
    when: When = AT_ONCE


@dataclass(frozen=True, slots=True)
class Status:
    service: str | None = None


@dataclass(frozen=True, slots=True)
class Rotation:
    service: str


@dataclass(frozen=True, slots=True)
class Drain:
    service: str
    host: str


@dataclass(frozen=True, slots=True)
class Undrain:
    service: str
    host: str


@dataclass(frozen=True, slots=True)
class Gpus:
    target: str | None = None
    kind: Literal["host", "service"] | None = None
    health: bool = False  # --health: each GPU's health verdict, findings and Xid lines
    deep: bool = False  # --deep: the deep GPU check (bot.engine.deep_check)


@dataclass(frozen=True, slots=True)
class Logs:
    service: str
    lines: int = LOGS_DEFAULT


@dataclass(frozen=True, slots=True)
class Rollback:
    service: str
    when: When = AT_ONCE


@dataclass(frozen=True, slots=True)
class Releases:
    service: str


@dataclass(frozen=True, slots=True)
class Audit:
    service: str | None = None
    limit: int = AUDIT_DEFAULT
    run_id: int | None = None  # one run: its steps and its package changes


@dataclass(frozen=True, slots=True)
class Cancel:
    run_id: int


@dataclass(frozen=True, slots=True)
class Host:
    """``host reboot|gpu-reset <host> [GPU ...]`` (issue 23)."""

    action: Action  # REBOOT or GPU_RESET
    host: str
    gpus: tuple[int, ...] = ()
    when: When = AT_ONCE
    force: bool = False  # stop each service without waiting for in-flight requests


@dataclass(frozen=True, slots=True)
class Doctor:
    target: str | None = None
    kind: Literal["host", "service"] | None = None


Command = (
    Help
    | Redeploy
    | Restart
    | Rollback
    | Status
    | Rotation
    | Drain
    | Undrain
    | Gpus
    | Logs
    | Releases
    | Audit
    | Cancel
    | Doctor
    | Host
)


def usage(name: str) -> str:
    """The full usage line of one subcommand, as a person types it."""
    return f"{PREFIX} {USAGE[name]}"


def _show(text: str) -> str:
    """Quote user text for an error message, which Slack shows as mrkdwn: control and
    non-ASCII characters escaped (so they cannot corrupt the reply), ``& < >`` escaped
    (so ``<!channel>`` or ``<https://evil|click>`` stays text, never a mention or a
    link), long text cut short."""
    shown = text if len(text) <= _SHOW_MAX else text[:_SHOW_MAX] + "..."
    return escape("'" + shown.encode("unicode_escape").decode("ascii").replace("'", "\\'") + "'")


def _check_chars(token: str, position: int) -> None:
    if _TOKEN.fullmatch(token):
        return
    bad = sorted({c for c in token if not _TOKEN_CHARS.match(c)})
    listed = ", ".join(_show(c) for c in bad)
    hint = ""
    if any(c in "\u2013\u2014" for c in bad):
        hint = " (your client may have turned '--' into a dash; type two hyphens)"
    raise InputError(
        f"Word {position} {_show(token)} contains characters that are not allowed: "
        f"{listed}{hint}. Use only letters, digits and . _ + - "
        "(plus = in --flag=value, # before a run id and : in a time)."
    )


def _unquoted(token: str) -> str:
    m = _QUOTED.match(token)
    return m[1] if m and m[1] else token


def _tokenize(text: str) -> list[str]:
    if len(text) > MAX_TEXT_LEN:
        raise InputError(
            f"That command is {len(text)} characters long; the limit is {MAX_TEXT_LEN}. "
            f"Type `{PREFIX} help` for the commands."
        )
    # A trailing newline from a client is noise; one inside the text is rejected below.
    tokens = [_unquoted(t) for t in _SEPARATORS.split(text.strip(" \t\r\n")) if t]
    for i, tok in enumerate(tokens, start=1):
        _check_chars(tok, i)
    return tokens


class _Args:
    """The words after the subcommand: flags (in either --flag V or --flag=V
    form) pulled out by name, positionals left in order."""

    def __init__(self, name: str, words: list[str], flags: dict[str, bool]) -> None:
        # flags maps each accepted flag to whether it takes a value.
        self.name = name
        self.values: dict[str, str | None] = {}
        self.positionals: list[str] = []
        i = 0
        while i < len(words):
            word = words[i]
            i += 1
            if not word.startswith("-"):
                self.positionals.append(word)
                continue
            flag, eq, inline = word.partition("=")
            if flag not in flags:
                accepted = ", ".join(flags) or "none"
                self.fail(f"Unknown option {_show(flag)} for {name} (options: {accepted}).")
            if flag in self.values:
                self.fail(f"Option {flag} is given more than once.")
            if not flags[flag]:
                if eq:
                    self.fail(f"Option {flag} takes no value.")
                self.values[flag] = None
                continue
            if eq:
                value = inline
            elif i < len(words) and words[i].partition("=")[0] not in flags:
                value = words[i]
                i += 1
            else:
                value = ""
            if not value:
                self.fail(f"Option {flag} needs a value.")
            self.values[flag] = value

    def fail(self, message: str) -> NoReturn:
        raise InputError(f"{message} Usage: `{escape(usage(self.name))}`")

    def positional(self) -> str | None:
        """The single optional positional word; more than one is an error."""
        if len(self.positionals) > 1:
            extra = " ".join(_show(w) for w in self.positionals[1:])
            self.fail(f"Unexpected extra words: {extra}.")
        return self.positionals[0] if self.positionals else None

    def required(self, what: str) -> str:
        value = self.positional()
        if value is None:
            self.fail(f"Missing the {what}.")
        return value

    def integer(self, flag: str, default: int, maximum: int) -> int:
        raw = self.values.get(flag)
        if raw is None:
            return default
        value = int(raw) if _DIGITS.fullmatch(raw) and len(raw) <= 10 else None
        if value is None or not 1 <= value <= maximum:
            self.fail(f"{flag} must be a whole number from 1 to {maximum}, not {_show(raw)}.")
        return value


def _known(kind: str, names: list[str]) -> str:
    return ", ".join(sorted(names)) if names else f"no {kind} configured"


def _service(name: str, settings: Settings) -> str:
    if name not in settings.services:
        raise InputError(
            f"Unknown service {_show(name)}. "
            f"Configured services: {_known('services', list(settings.services))}."
        )
    return name


def _index(service: str, name: str, settings: Settings) -> str:
    indexes = settings.services[service].indexes
    if name not in indexes:
        raise InputError(
            f"Unknown package index {_show(name)} for {service}. "
            f"Configured indexes for {service}: {_known('indexes', list(indexes))}."
        )
    return name


def _version(raw: str) -> str:
    try:
        if len(raw) > MAX_VERSION_LEN:
            raise InvalidVersion(raw)
        parsed = Version(raw)
    except InvalidVersion:
        raise InputError(
            f"{_show(raw)} is not a valid PEP 440 version "
            "(for example 0.31.0, 0.31.0rc2 or 0.31.0rc2.dev313+g662205d34)."
        ) from None
    # Canonical form: what pip/uv would install and what the audit log records.
    return str(parsed)


def _parse_redeploy(args: _Args, settings: Settings) -> Redeploy:
    service = _service(args.required("service name"), settings)
    version = args.values.get("--version")
    index = args.values.get("--index")
    return Redeploy(
        service=service,
        version=None if version is None else _version(version),
        index=None if index is None else _index(service, index, settings),
        dry_run="--dry-run" in args.values,
        force="--force" in args.values,
        when=_when(args),
    )


def _when(args: _Args) -> When:
    at = args.values.get("--at")
    if at is not None and not _AT_VALUE.fullmatch(at):
        args.fail(
            f"--at {_show(at)} is not a time: write 02:00, 2026-12-04T02:00 or 2026-12-04T01:00Z."
        )
    return When(at=at, now="--now" in args.values)


def _parse_gpus(args: _Args, settings: Settings) -> Gpus:
    target = args.positional()
    health, deep = "--health" in args.values, "--deep" in args.values
    if target is None:
        return Gpus(health=health, deep=deep)
    # A name that is both a host and a service means the host: the narrower view.
    if target in settings.hosts:
        return Gpus(target=target, kind="host", health=health, deep=deep)
    if target in settings.services:
        return Gpus(target=target, kind="service", health=health, deep=deep)
    raise InputError(
        f"Unknown host or service {_show(target)}. "
        f"Hosts: {_known('hosts', list(settings.hosts))}. "
        f"Services: {_known('services', list(settings.services))}."
    )


def run_id_of(text: str) -> int | None:
    """The run id ``text`` names (a button's value, or what follows "#"), or None.

    ASCII digits only (``str.isdigit`` also takes "١٢" and "²"), and within what
    SQLite can store: a larger number made the query raise OverflowError.  The
    length is checked before ``int()`` so a huge value costs nothing."""
    if len(text) > len(str(MAX_RUN_ID)) or not _DIGITS.fullmatch(text):
        return None
    run_id = int(text)
    return run_id if 1 <= run_id <= MAX_RUN_ID else None


def _parse_cancel(args: _Args) -> Cancel:
    raw = args.required("run id (for example #12)")
    run_id = run_id_of(raw.removeprefix("#"))
    if run_id is None:
        args.fail(f"{_show(raw)} is not a run id; a run id is a positive number like 12 or #12.")
    return Cancel(run_id=run_id)


def _parse_help(args: _Args, settings: Settings) -> Help:
    if args.positionals:
        args.fail("help takes no arguments.")
    return Help()


def _parse_audit(args: _Args, settings: Settings) -> Audit:
    """``audit [service|run-id]``: ``#12`` is a run; so is ``12`` unless a service has
    that name."""
    limit = args.integer("--limit", AUDIT_DEFAULT, AUDIT_MAX)
    name = args.positional()
    if name is None:
        return Audit(None, limit)
    run_id = run_id_of(name.removeprefix("#"))
    if run_id is not None and (name.startswith("#") or name not in settings.services):
        return Audit(None, limit, run_id)
    return Audit(_service(name, settings), limit)


def _routed(name: str, settings: Settings) -> str:
    """A configured service with a router: the rotation commands have nothing else."""
    service = _service(name, settings)
    if settings.services[service].router is None:
        raise InputError(f"{service} has no router configured: it has no rotation.")
    return service


def _side_by_side(name: str, settings: Settings) -> str:
    """A configured side-by-side service: only it has releases to switch back to."""
    service = _service(name, settings)
    if settings.services[service].strategy != "side_by_side":
        raise InputError(f"rollback switches side-by-side releases; {service} is in_place")
    return service


def _replica(args: _Args, settings: Settings) -> tuple[str, str]:
    """``<service> <host>``: a service with a router and one of its configured hosts."""
    if len(args.positionals) != 2:
        args.fail("Give the service and one of its hosts.")
    service = _routed(args.positionals[0], settings)
    host = args.positionals[1]
    hosts = settings.services[service].hosts
    if host not in hosts:
        raise InputError(
            f"{_show(host)} is not a host of {service}. Its hosts: {', '.join(hosts)}."
        )
    return service, host


def _optional_service(args: _Args, settings: Settings) -> str | None:
    name = args.positional()
    return None if name is None else _service(name, settings)


def _parse_host(args: _Args, settings: Settings) -> Host:
    words = args.positionals
    if len(words) < 2 or words[0].lower() not in OPERATIONS:
        args.fail(
            "say what to do and to which host: host reboot HOST, or host gpu-reset HOST [GPU ...]."
        )
    action = OPERATIONS[words[0].lower()]
    host = words[1]
    if host not in settings.hosts:
        args.fail(f"Unknown host {_show(host)}. {_known('hosts', sorted(settings.hosts))}")
    if action == Action.REBOOT and len(words) > 2:
        args.fail("a reboot takes no GPU indexes: it reboots the whole host.")
    try:
        gpus = gpu_indexes(words[2:])
    except InputError as e:
        args.fail(f"{e}.")
    return Host(action, host, gpus, _when(args), "--force" in args.values)


# Each subcommand's builder; the flags it accepts come from the table (``_flags``).
_Parser = Callable[[_Args, Settings], Command]
_BUILDERS: dict[str, _Parser] = {
    "help": _parse_help,
    "redeploy": _parse_redeploy,
    "restart": lambda a, s: Restart(
        _service(a.required("service name"), s), force="--force" in a.values, when=_when(a)
    ),
    "rollback": lambda a, s: Rollback(_side_by_side(a.required("service name"), s), _when(a)),
    "status": lambda a, s: Status(_optional_service(a, s)),
    "rotation": lambda a, s: Rotation(_routed(a.required("service name"), s)),
    "drain": lambda a, s: Drain(*_replica(a, s)),
    "undrain": lambda a, s: Undrain(*_replica(a, s)),
    "gpus": _parse_gpus,
    "logs": lambda a, s: Logs(
        _service(a.required("service name"), s), a.integer("-n", LOGS_DEFAULT, LOGS_MAX)
    ),
    "releases": lambda a, s: Releases(_service(a.required("service name"), s)),
    "host": _parse_host,
    "audit": lambda a, s: _parse_audit(a, s),
    "cancel": lambda a, s: _parse_cancel(a),
    # The same targets as gpus: everything, a host, or a service's hosts.
    "doctor": lambda a, s: Doctor(*_target(_parse_gpus(a, s))),
}
_PARSERS: dict[str, tuple[dict[str, bool], _Parser]] = {
    name: (_flags(name), _BUILDERS[name]) for name in COMMANDS
}


def _target(g: Gpus) -> tuple[str | None, Literal["host", "service"] | None]:
    return g.target, g.kind


def parse_command(text: str, settings: Settings) -> Command:
    """Parse the text after ``/vllm``; raise ``InputError`` saying what is valid."""
    tokens = _tokenize(text)
    if not tokens:
        return Help()
    # Phones capitalise the first word; subcommands are case-insensitive, names are not.
    name = tokens[0].lower()
    if name not in _PARSERS:
        raise InputError(
            f"Unknown command {_show(tokens[0])}. Valid commands: {', '.join(COMMANDS)}. "
            f"Type `{PREFIX} help` for usage."
        )
    flags, build = _PARSERS[name]
    return build(_Args(name, tokens[1:], flags), settings)
