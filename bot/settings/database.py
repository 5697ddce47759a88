"""Which audit database the bot uses (``CHATOPS_DB``): a SQLite file (the default,
``./chatops.db``) or a PostgreSQL URL (``postgresql://...``, issue 21).

A PostgreSQL URL is held as a secret (its password must never be printed, logged or
stored); people see it through ``shown_url``, with the password and any password-like
query parameter masked. The password may also come from libpq's own places instead
(``PGPASSWORD``, ``~/.pgpass``, a service file: ``postgresql:///?service=chatops``);
libpq reads those, never the bot's TOML file.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from pydantic import BaseModel, BeforeValidator, ConfigDict, SecretStr

SCHEMES = ("postgresql://", "postgres://")
MASK = "***"
# Query parameters of a libpq URL that hold a secret.
_SECRET_PARAMS = frozenset({"password", "sslpassword"})


def shown_url(url: str) -> str:
    """``url`` as a person may see it: the password and password-like parameters
    masked; the user, host, port, database and the other parameters kept."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        who, _, host = netloc.rpartition("@")
        user, colon, _password = who.partition(":")
        netloc = f"{user}:{MASK}@{host}" if colon else f"{user}@{host}"
    query = urlencode(
        [(k, MASK if k in _SECRET_PARAMS else v) for k, v in parse_qsl(parts.query)],
        safe="*/:,=",
        quote_via=quote,
    )
    # Built by hand: urlunsplit drops the "//" of an empty host (postgresql:///db).
    shown = f"{parts.scheme}://{netloc}{parts.path}"
    return f"{shown}?{query}" if query else shown


def url_secrets(url: str) -> list[str]:
    """The secrets inside ``url`` (its password, password-like parameters), for the
    redactor: they are masked wherever they would otherwise be posted or stored."""
    parts = urlsplit(url)
    found: list[str] = []
    for pair in parts.query.split("&"):
        key, eq, raw = pair.partition("=")
        if eq and raw and unquote(key) in _SECRET_PARAMS:
            # As written, and decoded as libpq decodes it: %XX only, a "+" is a "+"
            # (parse_qsl's form decoding would make it a space, a text never said).
            found.extend({raw, unquote(raw)})
    if parts.password:
        # As written in the URL, and decoded (what an error message may repeat).
        found.extend({parts.password, unquote(parts.password)})
    return found


class PostgresUrl(BaseModel):
    """A PostgreSQL audit database: libpq's URL, kept secret."""

    model_config = ConfigDict(frozen=True)

    url: SecretStr

    @property
    def shown(self) -> str:
        return shown_url(self.url.get_secret_value())

    @property
    def tag(self) -> str:
        """A short name for this database that holds no secret (the fallback journal's
        file is named after it)."""
        return hashlib.sha256(self.shown.encode()).hexdigest()[:12]

    def __str__(self) -> str:
        return self.shown


def _parse(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(SCHEMES):
        return PostgresUrl(url=SecretStr(value))
    if isinstance(value, SecretStr) and value.get_secret_value().startswith(SCHEMES):
        return PostgresUrl(url=value)
    return value


def is_postgres(target: Path | PostgresUrl) -> bool:
    return isinstance(target, PostgresUrl)


# ``CHATOPS_DB``: a path, or a ``postgresql://`` URL.
DbTarget = Annotated[Path | PostgresUrl, BeforeValidator(_parse)]
