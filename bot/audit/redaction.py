"""What the audit log does to every free-text value before it is stored: redact it.

Enumerated values (status, action, source, decision) are checked against their enums
instead, and lock scopes are stored as given because they are keys.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from bot.core.redact import masked_json

Redactor = Callable[[str], str]


def identity(text: str) -> str:
    return text


# What a NUL byte in a stored text reads back as.
NUL_STORED = "\ufffd"


class Redaction:
    """``redaction(text)`` redacts one string; ``opt`` and ``json`` the other shapes."""

    def __init__(self, redact: Redactor) -> None:
        self._redacts = redact

    def _redact(self, text: str) -> str:
        # A NUL byte (binary junk in a tool's output) becomes U+FFFD: PostgreSQL's text
        # refuses it, and both backends keep the same records (issue 21).
        return self._redacts(text).replace("\x00", NUL_STORED)

    def __call__(self, text: str) -> str:
        return self._redact(text)

    def opt(self, text: str | None) -> str | None:
        return None if text is None else self._redact(text)

    def json(self, value: Any) -> str:
        """``value`` as stored JSON text, every string inside it redacted."""
        return json.dumps(self._clean(value), ensure_ascii=False)

    def as_stored(self, value: Any) -> Any:
        """``value`` as it reads back after being stored (redacted, JSON types)."""
        return json.loads(self.json(value))

    def _clean(self, value: Any) -> Any:
        # Redact the strings inside the structure, not the dumped JSON: a secret with a
        # quote or backslash in it would be escaped in the dump and slip past.
        return masked_json(value, self._redact)
