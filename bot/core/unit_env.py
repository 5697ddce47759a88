"""The unit's environment, and its ExecStart as systemd expands it with that environment.

Pure. ``systemctl show`` prints ExecStart's words as written: ``$VLLM_ARGS`` and
``${HF_HOME}`` unexpanded. systemd expands them when it starts the service, from the
unit's ``Environment=`` and ``EnvironmentFile=`` (files override Environment=, later
files earlier ones) over the service manager's own environment (systemd.service(5),
"Command lines"; systemd.exec(5)). This module reads the first two as ``systemctl show
-p Environment -p EnvironmentFiles`` and the files print them, and expands as systemd
252 does (src/basic/env-util.c ``replace_env_argv``, src/basic/env-file.c, checked
against the real systemd 252 in tests/samples/systemd_env/):

- ``$NAME`` as a whole word: the value split at whitespace, quotes removed, into zero
  or more words (``$HF_HOME/x`` names a variable ``HF_HOME/x``: none, no word);
- ``${NAME}`` anywhere in a word: the value as it is, the word staying one word (an
  empty one when unset); ``${NAME:-x}`` is left as written;
- ``$$``: a literal ``$``; a ``$`` before anything else stays as it is.

A variable the unit does not set may still come from the manager's environment
(``systemctl set-environment``, ``DefaultEnvironment=``) or from systemd itself
(``$HOME``, ``$USER``): its value is not known here, and neither is any value where an
EnvironmentFile could not be read. Such words are said as not checked, never guessed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# systemd's own check (env-util.c, VALID_BASH_ENV_NAME_CHARS): a name is letters,
# digits and `_`, and does not start with a digit.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# `EnvironmentFiles=/etc/default/vllm (ignore_errors=no)`: one line per file
# (systemctl-show.c; systemd/systemd#14723 shows one from systemd 244).
_ENV_FILE = re.compile(r"(?P<path>.+) \(ignore_errors=(?P<ignore>yes|no)\)")
_WHITESPACE = " \t\n\r"


@dataclass(frozen=True, slots=True)
class EnvFile:
    """One ``EnvironmentFile=`` of the unit (``-`` before it: ignore_errors)."""

    path: str
    ignore_errors: bool


def environment_files(show: str) -> tuple[EnvFile, ...]:
    """Every ``EnvironmentFiles=`` line of ``systemctl show``, in the unit's order."""
    files: list[EnvFile] = []
    for line in show.splitlines():
        key, sep, value = line.partition("=")
        match = _ENV_FILE.fullmatch(value.strip()) if sep and key == "EnvironmentFiles" else None
        if match:
            files.append(EnvFile(match["path"], match["ignore"] == "yes"))
    return tuple(files)


def parse_environment(value: str) -> dict[str, str] | None:
    """The assignments of an ``Environment=`` value as ``systemctl show`` prints it (each
    assignment a word, in double quotes with ``\\`` before ``"``, ``\\``, `` ` `` and
    ``$`` where it holds a space or one of those: bus-print-properties.c, systemd 248 on),
    later ones winning; None when a word is no assignment (an older systemctl that
    printed them unquoted, so a value's spaces cannot be told from the separators)."""
    values: dict[str, str] = {}
    for word in split_words(value):
        name, sep, val = word.partition("=")
        if not sep or not _NAME.fullmatch(name):
            return None
        values[name] = val
    return values


def split_words(text: str) -> list[str]:
    """``text`` split as systemd splits a ``$NAME`` value and ``systemctl show``'s
    quoted words (extract-word.c with EXTRACT_UNQUOTE|EXTRACT_RELAX): at whitespace
    outside quotes; ``'`` and ``"`` quote anywhere in a word and are removed; ``\\``
    takes the next character as it is, inside quotes too; an unbalanced quote or a last
    ``\\`` ends the word."""
    words: list[str] = []
    word: list[str] | None = None
    quote = ""
    chars = iter(text)
    for c in chars:
        if c == "\\":
            word = word if word is not None else []
            word.append(next(chars, ""))
        elif quote:
            if c == quote:
                quote = ""
            else:
                word = word if word is not None else []
                word.append(c)
        elif c in "'\"":
            quote, word = c, (word if word is not None else [])
        elif c in _WHITESPACE:
            if word is not None:
                words.append("".join(word))
            word = None
        else:
            word = word if word is not None else []
            word.append(c)
    if word is not None:
        words.append("".join(word))
    return words


def parse_env_file(text: str) -> dict[str, str] | None:
    """An EnvironmentFile's assignments as systemd 252 reads them (env-file.c): lines
    starting ``#`` or ``;`` are comments; ``KEY = value`` with the blanks around both
    trimmed; a value is quoted only where it starts with ``'`` or ``"`` (``\\`` in double
    quotes escapes only ``"\\`$`` and a newline); ``\\`` elsewhere takes the next
    character, a newline too (the line goes on); no expansion; a key that is no valid
    name (``export FOO``) is dropped, as systemd drops it. None where systemd releases
    read the file differently: a comment ending in ``\\`` swallows the next line up to
    systemd 253 and no longer from 254."""
    parser = _EnvFileParser()
    for c in text:
        if not parser.feed(c):
            return None
    parser.end()
    return {k: v for k, v in parser.values.items() if _NAME.fullmatch(k)}


class _EnvFileParser:
    """env-file.c's state machine, one character at a time."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.state = "pre_key"
        self.key: list[str] = []
        self.value: list[str] = []
        self.key_blank: int | None = None  # where the key's trailing blanks start
        self.value_blank: int | None = None  # where the value's trailing blanks start

    def feed(self, c: str) -> bool:
        """Takes ``c``; False where the file means different things to different
        releases."""
        step = getattr(self, f"_{self.state}")
        return step(c) is not False

    def end(self) -> None:
        if self.state not in ("pre_key", "key", "comment", "comment_escape"):
            self._push()

    def _push(self) -> None:
        key = "".join(self.key[: self.key_blank])
        chop = self.value_blank if self.state == "value" else None
        self.values[key] = "".join(self.value[:chop])
        self.state, self.key, self.value = "pre_key", [], []
        self.key_blank = self.value_blank = None

    def _pre_key(self, c: str) -> None:
        if c in "#;":
            self.state = "comment"
        elif c not in _WHITESPACE:
            self.state, self.key, self.key_blank = "key", [c], None

    def _key(self, c: str) -> None:
        if c in "\n\r":
            self.state, self.key = "pre_key", []
        elif c == "=":
            self.state, self.value_blank = "pre_value", None
        else:
            if c not in _WHITESPACE:
                self.key_blank = None
            elif self.key_blank is None:
                self.key_blank = len(self.key)
            self.key.append(c)

    def _pre_value(self, c: str) -> None:
        if c in "\n\r":
            self._push()
        elif c == "'":
            self.state = "single"
        elif c == '"':
            self.state = "double"
        elif c == "\\":
            self.state = "value_escape"
        elif c not in _WHITESPACE:
            self.state = "value"
            self.value.append(c)

    def _value(self, c: str) -> None:
        if c in "\n\r":
            self._push()
        elif c == "\\":
            self.state, self.value_blank = "value_escape", None
        else:
            if c not in _WHITESPACE:
                self.value_blank = None
            elif self.value_blank is None:
                self.value_blank = len(self.value)
            self.value.append(c)

    def _value_escape(self, c: str) -> None:
        self.state = "value"
        if c not in "\n\r":
            self.value.append(c)

    def _single(self, c: str) -> None:
        if c == "'":
            self.state = "pre_value"
        else:
            self.value.append(c)

    def _double(self, c: str) -> None:
        if c == '"':
            self.state = "pre_value"
        elif c == "\\":
            self.state = "double_escape"
        else:
            self.value.append(c)

    def _double_escape(self, c: str) -> None:
        self.state = "double"
        if c in '"\\`$':
            self.value.append(c)
        elif c != "\n":
            self.value += ["\\", c]

    def _comment(self, c: str) -> None:
        if c == "\\":
            self.state = "comment_escape"
        elif c in "\n\r":
            self.state = "pre_key"

    def _comment_escape(self, c: str) -> bool:
        # After `\` and a newline, systemd up to 253 takes the next line as part of the
        # comment; from 254 on it reads it.
        self.state = "comment"
        return c not in "\n\r"


@dataclass(frozen=True, slots=True)
class UnitEnvironment:
    """What the unit's own settings set for its command line: ``Environment=`` with the
    EnvironmentFiles that could be read over it, and why the rest could not be read (any
    variable may then be set there: none is known)."""

    values: Mapping[str, str] = field(default_factory=dict)
    unread: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Expanded:
    """ExecStart's words as systemd passes them. A word whose value is not known here
    stays as written, its index in ``unknown`` with why."""

    words: tuple[str, ...]
    unknown: tuple[tuple[int, str], ...] = ()


class _Unknown(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def expand(argv: Iterable[str], env: UnitEnvironment) -> Expanded:
    """``argv`` (ExecStart's words as ``systemctl show`` prints them) as systemd expands
    it with the unit's environment."""
    words: list[str] = []
    unknown: list[tuple[int, str]] = []
    for word in argv:
        try:
            words.extend(_expand_word(word, env))
        except _Unknown as e:
            unknown.append((len(words), _why_unknown(e.name, env)))
            words.append(word)
    return Expanded(tuple(words), tuple(unknown))


def _why_unknown(name: str, env: UnitEnvironment) -> str:
    if env.unread:
        return "; ".join(env.unread)
    return (
        f"the unit sets no {name} (it may come from the service manager's own "
        "environment, which is not read)"
    )


def _lookup(name: str, env: UnitEnvironment) -> str | None:
    """The value of ``name``; None when it is set nowhere systemd looks (``$HOME/x``
    names no variable: it is no valid name); raises when it cannot be known."""
    if not _NAME.fullmatch(name):
        return None
    if env.unread or name not in env.values:
        raise _Unknown(name)
    return env.values[name]


def _expand_word(word: str, env: UnitEnvironment) -> list[str]:
    if word.startswith("$") and word[1:2] not in ("{", "$"):
        value = _lookup(word[1:], env)
        return split_words(value) if value is not None else []
    return [_replace(word, env)]


# `$$`, or `${NAME}`: what replace_env (flags 0) replaces inside a word.
_REPLACED = re.compile(r"\$\$|\$\{(?P<name>[^}:]*)\}")


def _replace(word: str, env: UnitEnvironment) -> str:
    def one(match: re.Match[str]) -> str:
        if match["name"] is None:
            return "$"
        return _lookup(match["name"], env) or ""

    return _REPLACED.sub(one, word)
