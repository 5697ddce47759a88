"""Whether the new vLLM accepts every flag the unit starts it with (issue 20, item 2).

Pure. Flags removed between vLLM releases (``--task``; ``--model`` deprecated for the
positional model tag: vllm-project/vllm#18538, #27347) make the new server exit at once
with ``error: unrecognized arguments``: after the stop, so an outage plus a rollback. The
unit's command line comes from ``systemctl show -p ExecStart``; what the new version
accepts from its own ``vllm serve --help=all`` (``--help`` on releases before the
grouped help), run from the prefetch's throwaway venv before the stop.

``systemctl show`` prints ``ExecStart={ path=/x ; argv[]=/x serve m --flag v ;
ignore_errors=no ; start_time=[n/a] ; ... }`` (systemd/systemd#16051): the arguments
joined by single spaces, unquoted, so an argument holding a space reads as two. Only
words shaped like a flag are judged, so a split value (``'{"a": -1}'``) is never taken
for one.

ExecStart's ``$VLLM_ARGS`` and ``${HF_HOME}`` are expanded first, as systemd does, with
the unit's Environment= and EnvironmentFiles (``bot.core.unit_env``); a word whose value
is not known is said as not checked, never as accepted.

vLLM's parser (``FlexibleArgumentParser``, an ``argparse.ArgumentParser``) also takes
``--max_model_len`` for ``--max-model-len``, ``--flag=value``, ``--json-arg.key value``,
a short option with its value attached (``-qfp8``) and, as argparse does unless told not
to, a unique prefix of a long option (``--tensor-parallel`` for
``--tensor-parallel-size``). Each is accepted here as the parser would, so a good unit
is never refused. ``-O3`` follows the release (vllm/utils/argparse_utils.py): where its
help lists ``-O`` (``--compilation-config``'s alias, up to 0.11) it is that option with
its value attached; where it lists ``--optimization-level`` and no ``-O``, the parser
rewrites ``-O3``, ``-O=3`` and ``-O`` before a level 0 to 3 into ``--optimization-level
3`` before argparse sees them, and a lone ``-O`` before anything else stays an unknown
option.

Values too (a value removed between releases fails only at the start): argparse prints
an option's choices as ``{a,b,c}`` and refuses any other value, so a value outside them
is refused here. vLLM prints ``['a', 'b']`` (or ``{a,b} or name registered in ...``)
where it also takes other strings and only the engine, after the start, says whether it
knows them (vLLM 0.33.0 takes ``--tokenizer-mode kimi_audio``, which it does not list):
a value outside that list is said as not checked. An option whose help lists no values
has its value unchecked.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Literal

from bot.core.unit_env import UnitEnvironment, expand

# What the prefetch script prints around the new version's option lines.
HELP_BEGIN = "chatops-serve-help"
HELP_END = "chatops-serve-help-end"
HELP_FAILED = "chatops-serve-help-failed"

_ARGV = re.compile(r"argv\[\]=(?P<argv>.*?) ; ")
# A word that is a flag: `-x`, `-tp`, `--name`, with `=value` or `.key` after it. Not a
# negative number, nor a lone `-` or `--`.
_FLAG = re.compile(r"(?P<name>--?[A-Za-z][A-Za-z0-9_-]*)(?P<rest>[=.+].*)?")
# An option's names at the start of its help line: `--api-server-count N, -asc N`.
_OPTION_NAME = re.compile(r"(?:^|,\s)(--?[A-Za-z0-9][A-Za-z0-9_-]*)")
# Every vLLM release's `vllm serve` has it: a help without it listed no options (the
# grouped help's summary, a wrapper's own help).
_SENTINEL = "--port"


def parse_exec_start(value: str) -> tuple[str, ...] | None:
    """The first command of an ``ExecStart=`` value as ``systemctl show`` prints it;
    None when it holds none (no ExecStart, or a format this does not know)."""
    match = _ARGV.search(value + " ")
    if match is None:
        return None
    words = tuple(match["argv"].split())
    return words or None


# What a run knows of the unit's command before preflight has read it.
NOT_READ = "the unit's ExecStart was not read"
# Why a `$` word's value is not known where the unit's environment was not read.
ENV_NOT_READ = "the unit's Environment= and EnvironmentFiles were not read"


@dataclass(frozen=True, slots=True)
class ServeCommand:
    """The unit's ``vllm serve`` command: its vllm executable and the words it passes
    after ``serve``, as vLLM gets them (variables expanded)."""

    executable: str
    args: tuple[str, ...]  # as written: `--tensor-parallel-size`, `8`, `--port=8000`, `-O3`
    # The words (their index in args) whose value is not known, and why: a `$VLLM_ARGS`
    # from a file this login cannot read. They stay in args as written.
    unknown: tuple[tuple[int, str], ...] = ()

    @property
    def flags(self) -> tuple[str, ...]:
        """The words shaped like a flag, up to a ``--`` (argparse: what follows it is
        positional)."""
        flags: list[str] = []
        for word in self.args:
            if word == "--":
                break
            if _FLAG.fullmatch(word):
                flags.append(word)
        return tuple(flags)


def serve_command(
    argv: tuple[str, ...], unknown: tuple[tuple[int, str], ...] = ()
) -> ServeCommand | str:
    """The unit's ``vllm serve`` command, or why its flags cannot be checked (it starts
    something else: a wrapper script, a shell, another entry point). ``unknown``: the
    words of ``argv`` (by index) whose value is not known."""
    start = 0
    if argv and PurePosixPath(argv[0]).name == "env":
        # `/usr/bin/env VAR=value ... vllm serve ...`: the command after env's own words.
        start = 1
        while start < len(argv) and ("=" in argv[start] or argv[start].startswith("-")):
            start += 1
    words = argv[start:]
    unread = dict(unknown)
    head = [unread[i] for i in range(start, start + 2) if i in unread]
    if head:
        return f"the unit's command is not known ({head[0]})"
    if len(words) < 2 or PurePosixPath(words[0]).name != "vllm" or words[1] != "serve":
        shown = " ".join(argv[:3]) + (" ..." if len(argv) > 3 else "")
        return f"the unit does not start `vllm serve` directly (ExecStart: {shown})"
    first = start + 2
    kept = tuple((i - first, why) for i, why in unknown if i >= first)
    return ServeCommand(words[0], tuple(words[2:]), kept)


def command_of(exec_start: str, env: UnitEnvironment | None = None) -> ServeCommand | str:
    """The unit's ``vllm serve`` command from its ``ExecStart=`` value (as ``systemctl
    show`` prints it), its variables expanded with ``env`` (none is known without it),
    or why its flags cannot be checked."""
    argv = parse_exec_start(exec_start)
    if argv is None:
        return "the unit's ExecStart names no command"
    expanded = expand(argv, env if env is not None else UnitEnvironment(unread=(ENV_NOT_READ,)))
    return serve_command(expanded.words, expanded.unknown)


@dataclass(frozen=True, slots=True)
class Choices:
    """The values a help lists for an option."""

    values: tuple[str, ...]
    # argparse's own `{a,b}`: it refuses any other value when the server starts. Else
    # vLLM's `['a', 'b']`: its parser takes any string, the engine may know more.
    closed: bool
    many: bool = False  # `{a,b} [{a,b} ...]`: one or more values


@dataclass(frozen=True, slots=True)
class ServeHelp:
    """What a ``vllm serve`` help says: its options, and the values it lists for some."""

    options: frozenset[str]
    choices: Mapping[str, Choices] = field(default_factory=dict)  # by each option name
    # The options that take a value (a metavar that is not `[OPTIONAL]`): argparse refuses
    # one with none after it ("expected one argument").
    valued: frozenset[str] = frozenset()


# An option's names at the start of its line, each with its metavar: split where a name
# follows (`--quantization QUANTIZATION, -q QUANTIZATION`; a value list has no ", -").
_NAME_SPLIT = re.compile(r", (?=-)")
_CLOSED = re.compile(r"\[?\{(?P<values>[^{}]*)\}(?P<many> \[\{[^{}]*\} \.\.\.\])?\]?")
_OPEN_LIST = re.compile(r"\[(?P<values>'[^']*'(?:, '[^']*')*)\](?P<many> .*\.\.\.\])?")
_OPEN_BRACES = re.compile(r"\{(?P<values>[^{}]*)\} .+")


def parse_help(lines: Iterable[str]) -> ServeHelp:
    """Every option a ``vllm serve`` help lists, and the values it lists for some, from
    its option lines: argparse indents an option's names by two spaces (``  --api-key
    API_KEY     If provided ...``), its wrapped description by many more. Works on the
    flat help (vllm-project/vllm#10017) and on ``--help=all``'s groups alike."""
    names: set[str] = set()
    choices: dict[str, Choices] = {}
    valued: set[str] = set()
    for line in lines:
        if not line.startswith("  -") or line.startswith("   "):
            continue
        head = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        found = _OPTION_NAME.findall(head)
        names.update(found)
        metavar = _NAME_SPLIT.split(head)[0].partition(" ")[2]
        if (metavar and not metavar.startswith("[")) or _OPEN_LIST.fullmatch(metavar):
            valued.update(found)
        listed = _choices(metavar)
        if listed is not None:
            choices.update(dict.fromkeys(found, listed))
    return ServeHelp(frozenset(names), choices, frozenset(valued))


def _choices(metavar: str) -> Choices | None:
    if match := _CLOSED.fullmatch(metavar):
        return Choices(tuple(match["values"].split(",")), True, match["many"] is not None)
    if match := _OPEN_LIST.fullmatch(metavar):
        values = tuple(re.findall(r"'([^']*)'", match["values"]))
        return Choices(values, False, match["many"] is not None)
    if match := _OPEN_BRACES.fullmatch(metavar):
        return Choices(tuple(match["values"].split(",")), False)
    return None


def parse_help_options(lines: Iterable[str]) -> frozenset[str]:
    """Every option a ``vllm serve`` help lists (``parse_help``'s names)."""
    return parse_help(lines).options


def _name(flag: str) -> str:
    match = _FLAG.fullmatch(flag)
    name = match["name"] if match else flag
    # FlexibleArgumentParser: underscores in a long option's name read as dashes.
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


# `-O <n>`: the levels the parser rewrites a lone `-O` before (argparse_utils.py).
_LEVELS = frozenset({"0", "1", "2", "3"})
_OPT_LEVEL = "--optimization-level"


@dataclass(frozen=True, slots=True)
class _Option:
    """A flag as the parser reads it: the option it is (None: none), and its value when
    the flag carries one (`--dtype=half`, `-qfp8`, `-O3`)."""

    option: str | None
    value: str | None = None


def _option(flag: str, after: str | None, options: frozenset[str]) -> _Option:
    """The option ``flag`` is to the parser (``after``: the word after it)."""
    match = _FLAG.fullmatch(flag)
    assert match is not None
    if flag.startswith("-O") and "-O" not in options and _OPT_LEVEL in options:
        return _optimization_level(flag, after)
    name, rest = _name(flag), match["rest"] or ""
    value = rest[1:] if rest.startswith("=") else None
    if name in options:
        return _Option(name, value)
    if name.startswith("--"):
        # argparse's abbreviations: a prefix of exactly one long option.
        hits = [a for a in options if a.startswith("--") and a.startswith(name)]
        return _Option(hits[0], value) if len(hits) == 1 else _Option(None)
    # A short option with its value attached: `-qfp8` is `-q fp8`.
    return _Option(name[:2], flag[2:]) if name[:2] in options else _Option(None)


def _optimization_level(flag: str, after: str | None) -> _Option:
    """``-O...`` on a release whose parser rewrites it into ``--optimization-level``:
    ``-O3``, ``-O=3``, ``-O 3``. A lone ``-O`` before anything but a level stays ``-O``,
    which that parser does not know; ``-O.key`` is ``-O``'s JSON keys to one release and
    a level of ``.key`` to the next: neither starts."""
    if flag == "-O":
        return _Option(_OPT_LEVEL) if after in _LEVELS else _Option(None)
    if flag.startswith("-O."):
        return _Option(None)
    return _Option(_OPT_LEVEL, flag[3:] if flag[2] == "=" else flag[2:])


def _keyed(flag: str) -> bool:
    """``--json-arg.key`` or ``--json-arg.key+``: a key of a JSON option."""
    match = _FLAG.fullmatch(flag)
    return match is not None and (match["rest"] or "")[:1] in (".", "+")


def _listed(value: str, choices: Choices) -> bool:
    if value in choices.values:
        return True
    # argparse compares after the option's type: `08` is the int choice 8.
    try:
        return all(re.fullmatch(r"-?\d+", c) for c in choices.values) and int(value) in {
            int(c) for c in choices.values
        }
    except ValueError:
        return False


def _few(values: tuple[str, ...], most: int = 8) -> str:
    shown = ", ".join(values[:most])
    return shown + (f", ... ({len(values)} in all)" if len(values) > most else "")


@dataclass
class _Reading:
    """What judging the unit's words found."""

    refused: list[tuple[str, str]] = field(default_factory=list)  # (shown, why or "")
    unknown: list[str] = field(default_factory=list)
    values: int = 0  # values checked against listed choices


class _Judge:
    """The unit's words read one by one as vLLM's parser reads them."""

    def __init__(self, command: ServeCommand, help_: ServeHelp, who: str) -> None:
        self.args = command.args
        self.unread = dict(command.unknown)
        self.help, self.who = help_, who
        self.found = _Reading()
        self.values: set[int] = set()  # the words read as a listed option's values

    def read(self) -> _Reading:
        for i, word in enumerate(self.args):
            if word == "--" and i not in self.unread:
                break
            if i in self.values:
                continue
            if i in self.unread:
                if word.startswith(("$", "-")):  # it may hold flags
                    self.found.unknown.append(f"`{word}`: {self.unread[i]}")
            elif _FLAG.fullmatch(word):
                self._flag(i, word)
        return self.found

    def _word(self, i: int) -> str | None:
        return self.args[i] if i < len(self.args) else None

    def _flag(self, i: int, flag: str) -> None:
        after = self._word(i + 1)
        read = _option(flag, after, self.help.options)
        if read.option is None:
            self.found.refused.append((f"`{_name(flag)}`", ""))
            return
        if _keyed(flag):
            return  # `--json-arg.key value`: the parser builds the option's value
        bare = read.value is None and (after is None or bool(_FLAG.fullmatch(after)))
        if bare and read.option in self.help.valued and i + 1 not in self.unread:
            self.found.refused.append((f"`{_name(flag)}`", "with no value after it"))
            return
        choices = self.help.choices.get(read.option)
        if choices is None:
            return
        if read.value is not None:
            self._value(flag, read.value, choices)
            return
        for j in range(i + 1, len(self.args)):
            word = self.args[j]
            if j in self.unread:
                self.found.unknown.append(f"`{_name(flag)} {word}`: {self.unread[j]}")
            elif _FLAG.fullmatch(word) or word == "--":
                return
            else:
                self._value(flag, word, choices)
            self.values.add(j)
            if not choices.many:
                return

    def _value(self, flag: str, value: str, choices: Choices) -> None:
        shown = f"`{_name(flag)} {value}`"
        if _listed(value, choices):
            self.found.values += 1
        elif choices.closed:
            self.found.refused.append((shown, f"it takes {_few(choices.values)}"))
        else:
            self.found.unknown.append(
                f"{shown}: {self.who} lists {_few(choices.values)} and takes other values "
                "only where something registers them"
            )


FlagOutcome = Literal["accepted", "refused", "unchecked"]


@dataclass(frozen=True, slots=True)
class FlagVerdict:
    outcome: FlagOutcome
    reason: str
    refused: tuple[str, ...] = ()


def judge_flags(
    command: ServeCommand,
    accepted: ServeHelp | frozenset[str],
    package: str,
    version: str | None,
) -> FlagVerdict:
    """Whether the new version accepts every flag of the unit's command and every value
    among the choices its help lists. A help that lists no options (no ``--port``) is
    unchecked, never a pass or a refusal; so is a word whose value is not known."""
    who = f"{package} {version}" if version else f"the new {package}"
    help_ = accepted if isinstance(accepted, ServeHelp) else ServeHelp(accepted)
    if _SENTINEL not in help_.options:
        return FlagVerdict(
            "unchecked", f"{who}'s `vllm serve --help` listed no options, so flags not checked"
        )
    found = _Judge(command, help_, who).read()
    refused = list(dict.fromkeys(found.refused))
    if refused:
        return _refusal(refused, who)
    n = len(command.flags)
    if found.unknown:
        return FlagVerdict(
            "unchecked",
            "; ".join(found.unknown) + f"; every flag read ({n}) is accepted by {who}",
        )
    reason = f"every flag of the unit's ExecStart ({n}) is accepted by {who}" + (
        f", and {found.values} of their values among the choices its help lists"
        if found.values
        else ""
    )
    # Values are known only where the help lists choices: say so, never imply more.
    reason += "; values it lists no choices for are not checked"
    if any(_name(f) == "--config" for f in command.flags):
        reason += "; the options inside its --config file are not checked"
    return FlagVerdict("accepted", reason)


def _refusal(refused: list[tuple[str, str]], who: str) -> FlagVerdict:
    one = len(refused) == 1
    names = ", ".join(shown + (f" ({why})" if why else "") for shown, why in refused)
    return FlagVerdict(
        "refused",
        f"{names} {'is' if one else 'are'} not accepted by {who} (the unit's ExecStart "
        f"passes {'it' if one else 'them'}; change the unit first)",
        tuple(shown.strip("`") for shown, _ in refused),
    )


def help_section(stdout: str) -> tuple[list[str], str | None] | None:
    """The option lines the prefetch printed between its marks, and why the help could
    not be read (its failure line), or None when the script printed no help section (it
    was not asked to, or it ended before)."""
    lines = stdout.splitlines()
    try:
        start = lines.index(HELP_BEGIN)
    except ValueError:
        return None
    body: list[str] = []
    for line in lines[start + 1 :]:
        if line == HELP_END:
            return body, None
        if line.startswith(HELP_FAILED):
            return body, line[len(HELP_FAILED) :].strip() or "failed"
        body.append(line)
    return None


def verdict_of(
    stdout: str, serve: ServeCommand | str, package: str, version: str | None
) -> FlagVerdict:
    """The unit's flags against the option lines a prefetch or a build printed:
    unchecked (never a pass) when the unit does not start ``vllm serve`` or the help
    could not be read."""
    if isinstance(serve, str):
        return FlagVerdict("unchecked", serve)
    section = help_section(stdout)
    if section is None:
        return FlagVerdict(
            "unchecked", "the new version's `vllm serve --help` did not come back whole"
        )
    lines, failed = section
    if failed is not None:
        return FlagVerdict("unchecked", f"`vllm serve --help` of the new version failed ({failed})")
    return judge_flags(serve, parse_help(lines), package, version)


def step_note(flags: FlagVerdict) -> tuple[str, str | None]:
    """What a step's line says of the unit's flags (a verdict that did not refuse), and
    the warning an unchecked one adds: unchecked is said as such, never as a pass."""
    if flags.outcome == "accepted":
        return flags.reason, None
    said = f"the unit's flags were not checked: {flags.reason}"
    return said, said
