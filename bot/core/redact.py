"""Mask secrets in any text that leaves the bot (Slack, the audit log, logs).

``Redactor`` knows the literal secrets from the settings and a fixed set of
shapes secrets take in command output: Slack/HF/GitHub tokens, credentials in
URLs, Authorization headers, ``KEY=value`` assignments whose key names a
secret, AWS access key IDs and PEM private key blocks.  Masking keeps the key
name and replaces the value with ``***``, so the reader still sees *which*
secret was there.  Applying it twice changes nothing more (idempotent), so text
may be masked at every boundary without care for whether it already was.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

MASK = "***"
# Values only ever turn into MASK, so a fixpoint comes within a few passes.
_MAX_PASSES = 8
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

@dataclass(frozen=True, slots=True)
class _Rule:
    pattern: re.Pattern[str]
    # Replacements keep everything but the value.
    replacement: str
    # The rule only runs when one of these occurs in the text (lower-cased text
    # when ``fold``): a substring test is ~100x cheaper than a regex scan.
    triggers: tuple[str, ...]
    fold: bool = False


_RULES: tuple[_Rule, ...] = (
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
        re.compile(
            rf"(?i)({_SENSITIVE_WORDS}(?![A-Za-z0-9])['\"]?[ \t]*[=:][ \t]*)"
            # A quoted value to its closing quote; else one word (a stray opening
            # quote is kept, so a cut-off value is still masked).
            r"(?:(['\"])[^'\"\r\n]+\2|(['\"]?)(?!(?:None|null)\b)[^\s'\"&,;]+)"
        ),
        rf"\g<1>\g<2>\g<3>{MASK}\g<2>",
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


class Redactor:
    """Callable ``str -> str`` that masks secrets; build once, reuse everywhere."""

    def __init__(self, literals: Iterable[str] = ()) -> None:
        # Longest first, so a secret that contains another is masked whole.
        values = sorted({v for v in literals if len(v) >= MIN_LITERAL_LEN}, key=len, reverse=True)
        self._literals = re.compile("|".join(map(re.escape, values))) if values else None

    def __call__(self, text: str) -> str:
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
