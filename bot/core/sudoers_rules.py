"""The sudoers rule language as the bot writes and checks it: an argument literal or with a
wildcard (``Wild``), one command line (``Grant``: its rule text, and whether an argv is
one it allows, decided as sudo decides it), the escaping a literal argument needs, and
the names of the Cmnd_Alias groups (``alias_name``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from bot.core.privilege import SH, Privilege

Argv = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Wild:
    """One argument that varies per run: ``head`` and ``tail`` literal, ``glob`` a sudoers
    wildcard pattern (``*``, or ``[1-9]`` for one digit)."""

    head: str
    glob: str
    tail: str = ""

    def sudoers(self) -> str:
        return escape(self.head) + self.glob + escape(self.tail)

    def regex(self) -> str:
        return re.escape(self.head) + _glob_regex(self.glob) + re.escape(self.tail)


Part = str | Wild


@dataclass(frozen=True, slots=True)
class Grant:
    """One command line the bot may run under sudo: ``pattern`` as the sudoers rule
    writes it, ``sample`` a concrete argv it allows (what ``doctor`` asks ``sudo -n -l``
    about), ``why`` the comment above it."""

    run_as: Privilege
    pattern: tuple[Part, ...]
    sample: Argv
    why: str

    def line(self) -> str:
        """The rule's text in sudoers syntax."""
        return " ".join(p.sudoers() if isinstance(p, Wild) else escape(p) for p in self.pattern)

    def matches(self, argv: Sequence[str]) -> bool:
        """Whether ``argv`` is one of the command lines this grant allows, the way sudo
        decides it: the arguments joined by spaces, matched as one string (so a ``*``
        matches across arguments)."""
        if not argv or not _same_tool(argv[0], self.pattern[0]):
            return False
        regex = " ".join(
            p.regex() if isinstance(p, Wild) else re.escape(p) for p in self.pattern[1:]
        )
        return re.fullmatch(regex, " ".join(argv[1:]), re.DOTALL) is not None


def _same_tool(argv0: str, rule0: Part) -> bool:
    # `sh` reaches sudo as itself and sudo resolves it; every other tool is absolute.
    return argv0 == rule0 or (rule0 == SH and argv0 == "sh")


def _glob_regex(pattern: str) -> str:
    """A sudoers (fnmatch) pattern as a regex: ``*`` any text, spaces included."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            end = pattern.index("]", i)
            out.append(pattern[i : end + 1])
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


# In a sudoers command's arguments ",", ":", "=" and "\" must be escaped, "#" too (it
# would start a comment), and so must a wildcard character meant literally (checked
# against Debian 12's sudo 1.9.13p3 with visudo and `sudo -n -l`: `vllm\[x\]\=\=*`
# allows `vllm[x]==1.0`, `a\#b` allows `a#b`).
_SUDOERS_SPECIAL = re.compile(r"([\\,:=*?\[\]!#])")


def escape(text: str) -> str:
    """``text`` as one literal argument of a sudoers rule."""
    return _SUDOERS_SPECIAL.sub(r"\\\1", text)


def _alias_word(text: str) -> str:
    """``text`` as part of an alias name: letters upper-cased, each run of anything else
    one ``_`` (never two in a row, so the ``__`` after the login stays unambiguous)."""
    return re.sub(r"[^A-Z0-9]+", "_", text.upper()).strip("_") or "X"


def alias_name(login: str, *words: str) -> str:
    """The name of one Cmnd_Alias of ``login``'s drop-in: ``CHATOPS__KIMI_K25_ROOT``.

    An alias name is global to everything sudo reads: two drop-ins that define the same
    one (a drop-in per login on one host) get "Alias ... already defined" for the second,
    and sudo binds the second login's rule to the first file's commands (Debian 12's
    sudo 1.9.13p3, tests/samples/sudo_alias_already_defined.txt). So each name starts
    with the login it is for; ``doctor`` fails where sudo still warns of a duplicate."""
    return f"{alias_head(login)}__{'_'.join(_alias_word(w) for w in words)}"


def alias_head(login: str) -> str:
    """What every alias name in ``login``'s drop-in starts with (before ``__``)."""
    head = _alias_word(login)
    return head if head[:1].isalpha() else f"L_{head}"  # a name starts with a capital
