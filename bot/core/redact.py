"""Mask secrets in any text that leaves the bot (Slack, the audit log, logs).

``Redactor`` knows the literal secrets from the settings and a fixed set of
shapes secrets take in command output: Slack/HF/GitHub tokens, credentials in
URLs, Authorization headers, ``KEY=value`` assignments whose key names a
secret, AWS access key IDs and private keys: whole PEM/OpenSSH blocks, and the
key lines of a block whose BEGIN line was cut off (a log tail that starts
mid-key).  Masking keeps the key name and replaces the value with ``***``, so
the reader still sees *which* secret was there.  Applying it twice changes
nothing more (idempotent), so text may be masked at every boundary without care
for whether it already was.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from bot.settings import Settings

MASK = "***"
# Values only ever turn into MASK, so a fixpoint comes within a few passes.
_MAX_PASSES = 8
# Short texts repeat: a redeploy stores the same package names, versions and paths in its
# snapshot, planned, installed and versions records, and the bench measured redaction as
# the audit sink's largest cost (~10 ms of a redeploy). Masking is a pure function of the
# text for one Redactor, so those are remembered; the bound keeps memory bounded
# (at most _CACHED entries of at most _CACHED_CHARS characters: under 2 MB).
_CACHED = 8192
_CACHED_CHARS = 200
# Shorter literals would mask ordinary words (and "***" itself).
MIN_LITERAL_LEN = 4


# A key that names a secret: FOO_TOKEN, token, client_secret, DB_PASSWORD,
# api_key / apikey / x-api-key, AWS_SECRET_ACCESS_KEY, any *_KEY.  Matched at
# the end of the key only: the text before it is kept as it is.
_SENSITIVE_WORDS = r"(?:token|secret|passw(?:or)?d|api[_-]?key|access[_-]?key|_key)"

_PRIVATE_KEY = re.compile(
    r"(-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----)"
    # Up to the matching footer, or to the end when the output was cut off mid-key.
    r".*?"
    r"(-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)",
    re.DOTALL,
)

# Key material without its BEGIN line.  Every line of a key's body is one base64
# token (after a log prefix such as journald's "Nov 30 13:12:01 h1 python3[42]: "):
# 70 characters in OpenSSH's format, 64 in PEM's, the last line shorter.
_KEY_END = re.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY-----")
BASE64_TOKEN = re.compile(r"[A-Za-z0-9+/]+={0,2}")
_FULL_KEY_LINE = re.compile(r"[A-Za-z0-9+/]{64}(?:[A-Za-z0-9+/]{6})?")
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/]+")
_NOT_A_SECRET_BLOCK = re.compile(r"-----BEGIN (?![A-Z0-9 ]*PRIVATE)[A-Z0-9 ]+-----")


def split_token(line: str) -> tuple[str, str]:
    """(log prefix, last token): a base64 token holds no blank and no colon."""
    body = line.rstrip("\r")
    cut = max(body.rfind(" "), body.rfind("\t"), body.rfind(":")) + 1
    return body[:cut], body[cut:]


def token_shape(prefix: str) -> str:
    # Log prefixes of neighbouring lines differ only in their numbers (time, PID).
    return re.sub(r"[0-9]", "0", prefix)


def _full_key_token(token: str) -> bool:
    # Base64 of that length mixes upper and lower case; a hex digest does not.  (Not
    # every key line holds a digit: OpenSSH's have long runs of "A".)
    return (
        _FULL_KEY_LINE.fullmatch(token) is not None
        and token.lower() != token
        and token.upper() != token
    )


def random_looking(token: str) -> bool:
    """A piece of base64 rather than a word ("after", "Started") next to key lines."""
    if any(c in "0123456789+/=" for c in token):
        return True
    return any(c.isupper() for c in token[1:]) and any(c.islower() for c in token)


def ends_in_full_key_token(line: str) -> bool:
    # A plain loop with this quick test first is several times faster than a regex
    # scan of the whole text: most text has no 64 base64 characters at a line's end.
    body = line.rstrip("\r")
    if len(body) < 64 or _BASE64_RUN.fullmatch(body, len(body) - 64) is None:
        return False
    return _full_key_token(split_token(body)[1])


def _headless_keys(text: str) -> str:
    """Mask the lines of private keys whose BEGIN line is not in ``text``: those before
    an END line, and runs of full-length key lines (a tail cut at both ends, or one
    line at a time).  Each run of key lines becomes one line: its log prefix, then MASK."""
    headless_end = "-----END" in text and _KEY_END.search(text) is not None
    lines = text.split("\n")
    full = [ends_in_full_key_token(line) for line in lines]
    if not headless_end and not any(full):
        return text
    found = _KeyLines(lines, full)
    if headless_end:
        found.before_ends()
    found.runs()
    return found.masked_text(text)


class _KeyLines:
    """Which lines of a text are key material (see ``_headless_keys``)."""

    def __init__(self, lines: list[str], full: list[bool]) -> None:
        self.lines = lines
        self.full = full
        self.parts = [split_token(line) for line in lines]
        self.masked = [False] * len(lines)

    def key_line(self, i: int, shape: str, *, first: bool = False, sure: bool = False) -> bool:
        """Line i holds a piece of key after a prefix of the given shape.  The first
        (topmost) line may start anywhere in its prefix: the text was cut there.
        Unless ``sure`` (the lines above an END line), a short piece must look random."""
        if self.masked[i]:
            return False
        prefix, token = self.parts[i]
        if not (
            self.full[i] or (BASE64_TOKEN.fullmatch(token) and (sure or random_looking(token)))
        ):
            return False
        own = token_shape(prefix)
        return own == shape or (first and shape.endswith(own))

    def before_ends(self) -> None:
        """The lines above each END line, as far up as they are key lines."""
        for i, line in enumerate(self.lines):
            end = _KEY_END.search(line)
            if end is None:
                continue
            shape = token_shape(line[: end.start()])
            j = i - 1
            while j >= 0 and self.key_line(j, shape, sure=True):
                self.masked[j] = True
                j -= 1
            if j >= 0 and self.key_line(j, shape, first=True, sure=True):
                self.masked[j] = True

    def runs(self) -> None:
        """Runs of full-length key lines, with a cut first and a short last line."""
        n, i = len(self.lines), 0
        while i < n:
            if self.masked[i] or not self.full[i]:
                i += 1
                continue
            shape = token_shape(self.parts[i][0])
            start = i
            while i < n and self.full[i] and token_shape(self.parts[i][0]) == shape:
                i += 1
            if start > 0 and self.key_line(start - 1, shape, first=True):
                start -= 1
            if i < n and self.key_line(i, shape):
                i += 1
            if start > 0 and _NOT_A_SECRET_BLOCK.search(self.lines[start - 1]):
                continue  # the body of a certificate or a public key
            self.masked[start:i] = [True] * (i - start)

    def masked_text(self, text: str) -> str:
        if not any(self.masked):
            return text
        out: list[str] = []
        for i, line in enumerate(self.lines):
            if not self.masked[i]:
                out.append(line)
            elif i == 0 or not self.masked[i - 1]:
                out.append(self.parts[i][0] + MASK)
        return "\n".join(out)


@dataclass(frozen=True, slots=True)
class _Rule:
    pattern: re.Pattern[str]
    # Replacements keep everything but the value.
    replacement: str | Callable[[re.Match[str]], str]
    # The rule only runs when one of these occurs in the text (lower-cased text
    # when ``fold``): a substring test is ~100x cheaper than a regex scan.
    triggers: tuple[str, ...]
    fold: bool = False


_ASSIGNMENT = re.compile(
    # "==" is a pin, not an assignment: tiktoken==0.12.0 in a package list stays.
    rf"(?i)({_SENSITIVE_WORDS}(?![A-Za-z0-9])['\"]?[ \t]*(?:=(?!=)|:)[ \t]*)"
    # A quoted value to its closing quote; else one word (a stray opening
    # quote is kept, so a cut-off value is still masked).
    r"(?:(['\"])[^'\"\r\n]+\2|(['\"]?)(?!(?:None|null)\b)([^\s'\"]+))"
)
# Characters of a parameter name, and what separates parameters in a URL query
# (or a connection string: "Server=db;Password=x;Database=y").
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
_PARAM_SEPARATORS = "&,;#"


def _assignment(m: re.Match[str]) -> str:
    """A secret's value masked whole: up to the blank or closing quote that ends it
    (``DB_PASSWORD=hunter2;rest`` holds ``;rest`` too), except in a URL query or a
    connection string, where ``&``/``;`` start the next parameter."""
    head, quote, stray, value = m.group(1), m.group(2), m.group(3), m.group(4)
    if quote:
        return f"{head}{quote}{MASK}{quote}"
    rest = ""
    i = m.start()
    while i > 0 and m.string[i - 1] in _NAME_CHARS:
        i -= 1
    if i > 0 and m.string[i - 1] in "?&;":
        cut = min((value.find(c) for c in _PARAM_SEPARATORS if c in value), default=-1)
        if cut > 0:
            # The next parameters may hold secrets of their own.
            rest = _ASSIGNMENT.sub(_assignment, value[cut:])
    return f"{head}{stray}{MASK}{rest}"


# Passwords that say the user part is the credential: GitHub's token as the user with
# `x-oauth-basic` (or `x`) as the password, Gemfury's `TOKEN:@` with none, and what uv
# prints for either (it masks the password as `****`, and keeps the user).
_PLACEHOLDER_PASSWORDS = ("x-oauth-basic", "x", "")
_STAND_IN_RE = r"(x-oauth-basic|x|\*{4,}|)"  # a placeholder, or uv's mask of one

_RULES: tuple[_Rule, ...] = (
    # scheme://TOKEN:@host, scheme://TOKEN:x-oauth-basic@host, scheme://TOKEN:****@host
    # -> scheme://***:<as it was>@host (issue 17 F6). Before the next rule, which would
    # mask the placeholder and keep the token.
    _Rule(re.compile(rf"(?i)://[^\s/@:]+:{_STAND_IN_RE}@"), rf"://{MASK}:\g<1>@", ("://",)),
    # scheme://user:password@host (any scheme) -> scheme://user:***@host
    _Rule(re.compile(r"://([^\s/@:]+):[^\s/@]+@"), rf"://\g<1>:{MASK}@", ("://",)),
    # http(s)://token@host -> http(s)://***@host; ssh://root@host keeps its user name.
    _Rule(
        re.compile(r"(?i)://(?:(?<=http://)|(?<=https://)|(?<=ws://)|(?<=wss://))[^\s/@:]+@"),
        rf"://{MASK}@",
        ("://",),
    ),
    # Authorization: Bearer xyz / Proxy-Authorization: Basic xyz / authorization=xyz
    _Rule(
        re.compile(
            r"(?i)\b((?:proxy-)?authorization['\"]?[ \t]*[:=][ \t]*['\"]?"
            r"(?:(?:bearer|basic|token|digest|negotiate)[ \t]+)?)[^\s'\",;]+"
        ),
        rf"\g<1>{MASK}",
        ("authorization",),
        fold=True,
    ),
    # A bare "Bearer <token>" (curl -H lines, error messages).
    _Rule(re.compile(r"\b(Bearer[ \t]+)[A-Za-z0-9._~+/=-]{8,}"), rf"\g<1>{MASK}", ("Bearer",)),
    # KEY=value, key: value, "key": "value", 'key': 'value' where the key names a secret.
    # None/null are left alone: vLLM prints every unset argument that way.
    _Rule(
        _ASSIGNMENT,
        lambda m: _assignment(m),
        ("token", "secret", "passw", "api", "access", "_key"),
        fold=True,
    ),
    # --hf-token xyz / --api-key xyz on command lines (the = form is the rule above).
    _Rule(
        re.compile(
            r"(--(?:[A-Za-z0-9]+-)*(?:token|secret|password|passwd|api-key|access-key))"
            r"(?![A-Za-z0-9-])([ \t]+)(?!--)[^\s'\"]+"
        ),
        rf"\g<1>\g<2>{MASK}",
        ("--",),
    ),
    # Slack tokens: xoxb-, xoxp-, xoxa-, xoxr-, xoxs-, xoxo-, xoxe-, xoxe.xoxp-, xapp-
    _Rule(
        re.compile(r"(?<![A-Za-z0-9])(xox(?:[abposr]|e(?:\.xox[bp])?)-|xapp-)[A-Za-z0-9-]{6,}"),
        rf"\g<1>{MASK}",
        ("xox", "xapp-"),
    ),
    # Hugging Face, GitHub and OpenAI-style API keys.
    _Rule(
        re.compile(r"(?<![A-Za-z0-9_])(hf_|gh[pousr]_)[A-Za-z0-9]{30,}"),
        rf"\g<1>{MASK}",
        ("hf_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
    ),
    _Rule(
        re.compile(r"(?<![A-Za-z0-9_])(github_pat_)[A-Za-z0-9_]{30,}"),
        rf"\g<1>{MASK}",
        ("github_pat_",),
    ),
    _Rule(re.compile(r"(?<![A-Za-z0-9_-])(sk-)[A-Za-z0-9_-]{20,}"), rf"\g<1>{MASK}", ("sk-",)),
    # AWS access key IDs (the secret key is caught by the *_KEY rule).
    _Rule(
        re.compile(r"(?<![A-Z0-9])(A(?:KIA|SIA|GPA|IDA|ROA|IPA|NPA|NVA))[A-Z0-9]{16}(?![A-Z0-9])"),
        rf"\g<1>{MASK}",
        ("AKIA", "ASIA", "AGPA", "AIDA", "AROA", "AIPA", "ANPA", "ANVA"),
    ),
)


def _private_key(match: re.Match[str]) -> str:
    header, footer = match.group(1), match.group(2)
    return f"{header}\n{MASK}\n{footer}" if footer else f"{header}\n{MASK}"


# ---- index URLs (issue 17 F6) ----------------------------------------------------------
#
# A package index's credential is not always a URL's password: Cloudsmith puts it in the
# path (https://dl.cloudsmith.io/TOKEN/acme/repo/python/simple/), Gemfury and GitHub in the
# user part (https://TOKEN:@pypi.fury.io/acme/, https://<40 hex>:x-oauth-basic@...), some
# in the query. uv prints the index's URLs in its errors (`Failed to fetch:
# http://host/TOKEN/.../six/`, and at -v `realm TOKEN@http://host`), so the parts of each
# configured index URL that may be secret are masked as literals wherever they appear.

_TOKEN_CHARS = re.compile(r"[A-Za-z0-9._~+=-]+")


def looks_like_token(part: str) -> bool:
    """A URL part that reads as a credential rather than a word: 12 or more characters
    of a token's alphabet mixing letters and digits (``cs7Hq2Lm9Xw4Rt8V``, a 40-hex
    GitHub token) or upper and lower case (``KqPzWmXvTrNb``), or 24 or more of them at
    all. ``simple``, ``cu128``, ``torch2.8``, ``pypi-remote`` are words, and so is a path
    to a public index (https://flashinfer.ai/whl/cu124/torch2.6), masked nowhere."""
    if len(part) < 12 or not _TOKEN_CHARS.fullmatch(part):
        return False
    digit, alpha = any(c.isdigit() for c in part), any(c.isalpha() for c in part)
    mixed_case = any(c.isupper() for c in part) and any(c.islower() for c in part)
    return len(part) >= 24 or (digit and alpha) or mixed_case


def index_url_literals(url: str) -> list[str]:
    """The parts of a configured index URL to mask as literals, each also as uv may print
    it (percent-decoded): the password (not a placeholder), the user when it is the
    credential (the password is empty or a placeholder) or looks like a token; each path
    segment that looks like a token (only that segment: wherever uv prints it, in the
    index's URL or a package page below it, the reader still sees which repository);
    every query value, and the whole query."""
    try:
        parts = urlsplit(url)
        user, password = parts.username, parts.password
    except ValueError:
        return []
    out: list[str] = []
    if password is not None and password not in _PLACEHOLDER_PASSWORDS:
        out.append(password)
    if user and (
        password is None or password in _PLACEHOLDER_PASSWORDS or looks_like_token(unquote(user))
    ):
        out.append(user)
    segments = [s for s in parts.path.split("/") if s]
    out += [s for s in segments if looks_like_token(unquote(s))]
    if parts.query:
        out += [parts.query, *(v for _, v in parse_qsl(parts.query, keep_blank_values=True))]
    both = out + [unquote(v) for v in out]
    return list(dict.fromkeys(v for v in both if len(v) >= MIN_LITERAL_LEN))


def settings_literals(settings: Settings) -> list[str]:
    """Every literal secret the settings hold: ``Settings.secret_values`` and the secret
    parts of every service's index URLs."""
    urls = {u for svc in settings.services.values() for u in svc.indexes.values()}
    return [*settings.secret_values(), *(v for u in sorted(urls) for v in index_url_literals(u))]


class Redactor:
    """Callable ``str -> str`` that masks secrets; build once, reuse everywhere."""

    @classmethod
    def for_settings(cls, settings: Settings) -> Redactor:
        """The redactor of everything that leaves the bot run with ``settings``."""
        return cls(settings_literals(settings))

    def __init__(self, literals: Iterable[str] = ()) -> None:
        # Longest first, so a secret that contains another is masked whole.
        values = sorted({v for v in literals if len(v) >= MIN_LITERAL_LEN}, key=len, reverse=True)
        self._literals = re.compile("|".join(map(re.escape, values))) if values else None
        self._short = functools.lru_cache(maxsize=_CACHED)(self.uncached)

    def __call__(self, text: str) -> str:
        return self._short(text) if len(text) <= _CACHED_CHARS else self.uncached(text)

    def uncached(self, text: str) -> str:
        """What ``__call__`` returns, computed afresh (the cache's reference)."""
        # Rules interact (a masked value can complete another rule's pattern,
        # e.g. a URL's password), so apply them until nothing changes: that is
        # what makes masking idempotent.  Text without secrets takes one pass.
        for _ in range(_MAX_PASSES):
            masked = self._pass(text)
            if masked == text:
                break
            text = masked
        return text

    def _pass(self, text: str) -> str:
        if "PRIVATE KEY-----" in text:
            text = _PRIVATE_KEY.sub(_private_key, text)
        text = _headless_keys(text)
        if self._literals is not None:
            text = self._literals.sub(MASK, text)
        lowered = text.lower()
        for rule in _RULES:
            haystack = lowered if rule.fold else text
            if any(t in haystack for t in rule.triggers):
                # ``lowered`` is not refreshed: rules only take text away, so a
                # stale copy can cause a needless run but never a missed one.
                text = rule.pattern.sub(rule.replacement, text)
        return text


def masked_json(value: Any, redact: Callable[[str], str]) -> Any:
    """``value`` (what ``json.dumps`` takes) with every string in it, keys included,
    passed through ``redact``: mask before serializing. Masking the serialized text
    would let a value's end (``token=``) take the quotes and commas after it and break
    the JSON, and would miss a secret the dump escaped (one with a quote in it)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {masked_json(k, redact): masked_json(v, redact) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [masked_json(v, redact) for v in value]
    return value
