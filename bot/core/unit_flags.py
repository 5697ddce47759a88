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

vLLM's parser (``FlexibleArgumentParser``, an ``argparse.ArgumentParser``) also takes
``--max_model_len`` for ``--max-model-len``, ``--flag=value``, ``--json-arg.key value``,
a short option with its value attached (``-O3``) and, as argparse does unless told not
to, a unique prefix of a long option (``--tensor-parallel`` for
``--tensor-parallel-size``). Each is accepted here as the parser would, so a good unit
is never refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Literal

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


@dataclass(frozen=True, slots=True)
class ServeCommand:
    """The unit's ``vllm serve`` command: its vllm executable and the flags it passes."""

    executable: str
    flags: tuple[str, ...]  # as written: `--tensor-parallel-size`, `--port=8000`, `-O3`


def serve_command(argv: tuple[str, ...]) -> ServeCommand | str:
    """The unit's ``vllm serve`` command, or why its flags cannot be checked (it starts
    something else: a wrapper script, a shell, another entry point)."""
    words = list(argv)
    if words and PurePosixPath(words[0]).name == "env":
        # `/usr/bin/env VAR=value ... vllm serve ...`: the command after env's own words.
        words = words[1:]
        while words and ("=" in words[0] or words[0].startswith("-")):
            words = words[1:]
    if len(words) < 2 or PurePosixPath(words[0]).name != "vllm" or words[1] != "serve":
        shown = " ".join(argv[:3]) + (" ..." if len(argv) > 3 else "")
        return f"the unit does not start `vllm serve` directly (ExecStart: {shown})"
    flags: list[str] = []
    for word in words[2:]:
        if word == "--":
            break  # argparse: what follows is positional
        if _FLAG.fullmatch(word):
            flags.append(word)
    return ServeCommand(words[0], tuple(flags))


def command_of(exec_start: str) -> ServeCommand | str:
    """The unit's ``vllm serve`` command from its ``ExecStart=`` value (as ``systemctl
    show`` prints it), or why its flags cannot be checked."""
    argv = parse_exec_start(exec_start)
    if argv is None:
        return "the unit's ExecStart names no command"
    return serve_command(argv)


def parse_help_options(lines: Iterable[str]) -> frozenset[str]:
    """Every option a ``vllm serve`` help lists, from its option lines: argparse indents
    an option's names by two spaces (``  --api-key API_KEY     If provided ...``), its
    wrapped description by many more. Works on the flat help (vllm-project/vllm#10017)
    and on ``--help=all``'s groups alike."""
    names: set[str] = set()
    for line in lines:
        if not line.startswith("  -") or line.startswith("   "):
            continue
        head = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        names.update(_OPTION_NAME.findall(head))
    return frozenset(names)


def _name(flag: str) -> str:
    match = _FLAG.fullmatch(flag)
    name = match["name"] if match else flag
    # FlexibleArgumentParser: underscores in a long option's name read as dashes.
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def _accepts(flag: str, accepted: frozenset[str]) -> bool:
    name = _name(flag)
    if name in accepted:
        return True
    if name.startswith("--"):
        # argparse's abbreviations: a prefix of exactly one long option.
        return len([a for a in accepted if a.startswith("--") and a.startswith(name)]) == 1
    # A short option with its value attached: `-O3` is `-O 3`.
    return name[:2] in accepted


FlagOutcome = Literal["accepted", "refused", "unchecked"]


@dataclass(frozen=True, slots=True)
class FlagVerdict:
    outcome: FlagOutcome
    reason: str
    refused: tuple[str, ...] = ()


def judge_flags(
    command: ServeCommand, accepted: frozenset[str], package: str, version: str | None
) -> FlagVerdict:
    """Whether the new version accepts every flag of the unit's command. A help that lists
    no options (no ``--port``) is unchecked, never a pass or a refusal."""
    who = f"{package} {version}" if version else f"the new {package}"
    if _SENTINEL not in accepted:
        return FlagVerdict(
            "unchecked", f"{who}'s `vllm serve --help` listed no options, so flags not checked"
        )
    refused = tuple(dict.fromkeys(f for f in command.flags if not _accepts(f, accepted)))
    if refused:
        names = ", ".join(f"`{_name(f)}`" for f in refused)
        verb = "is" if len(refused) == 1 else "are"
        return FlagVerdict(
            "refused",
            f"{names} {verb} not accepted by {who} (the unit's ExecStart passes "
            f"{'it' if len(refused) == 1 else 'them'}; change the unit first)",
            refused,
        )
    reason = f"every flag of the unit's ExecStart ({len(command.flags)}) is accepted by {who}"
    if any(_name(f) == "--config" for f in command.flags):
        reason += "; the options inside its --config file are not checked"
    return FlagVerdict("accepted", reason)


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
    return judge_flags(serve, parse_help_options(lines), package, version)


def step_note(flags: FlagVerdict) -> tuple[str, str | None]:
    """What a step's line says of the unit's flags (a verdict that did not refuse), and
    the warning an unchecked one adds: unchecked is said as such, never as a pass."""
    if flags.outcome == "accepted":
        return flags.reason, None
    said = f"the unit's flags were not checked: {flags.reason}"
    return said, said
