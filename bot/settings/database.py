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


def libpq_reading(url: str) -> dict[str, str] | None:
    """What libpq itself reads from ``url`` (its connection options, decoded), asked of
    the libpq psycopg connects with; None when libpq cannot read it."""
    # Imported here: only a PostgreSQL URL needs libpq, and the settings stay light.
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    try:
        return {k: str(v) for k, v in conninfo_to_dict(url).items() if v is not None}
    except ProgrammingError:
        return None


def _query_param(query: str, name: str) -> str | None:
    """The last value of ``name`` in a URL query, decoded as libpq decodes it (%XX only)."""
    found = None
    for pair in query.split("&"):
        key, eq, raw = pair.partition("=")
        if eq and unquote(key) == name:
            found = unquote(raw)
    return found


def ambiguity(url: str) -> str | None:
    """Why libpq and URL rules read ``url``'s user or password differently, or None.

    libpq ends the user and password at the first "@" before any "/", and takes "?" and
    "#" there as the password's own characters; URL rules (RFC 3986) end them at a "/",
    "?" or "#", and the user and password at the last "@". With any of those in a
    password unencoded, the part the bot would mask is not the part libpq uses:
    ``chatops:pa?ss@db`` showed as ``chatops:pa``, ``chatops:pa/ss@db`` whole (libpq
    reads host ``chatops``, port ``pa``). Such a URL is refused, naming no part of it."""
    rest = url.split("://", 1)[1] if "://" in url else url
    libpq = libpq_reading(url)
    if libpq is None:
        return "libpq cannot read it"
    if "#" in rest:
        return 'it holds a "#", which libpq reads as text and URL rules as its end'
    at, slash = rest.find("@"), rest.find("/")
    if rest.count("@") > 1 or (at >= 0 and 0 <= slash < at):
        return 'it holds an "@" besides the one after the user and password'
    try:
        parts = urlsplit(url)
        user, password = parts.username, parts.password
    except ValueError:
        return "URL rules cannot read it"
    user = _query_param(parts.query, "user") or (unquote(user) if user else None)
    password = _query_param(parts.query, "password") or (unquote(password) if password else None)
    if (libpq.get("user"), libpq.get("password")) != (user, password):
        return 'its password (or user) holds a "/", "?", "#" or "@" unencoded'
    return None


def shown_url(url: str) -> str:
    """``url`` as a person may see it: the password and password-like parameters
    masked; the user, host, port, database and the other parameters kept. A URL whose
    password libpq and URL rules would read differently (``ambiguity``) is not shown."""
    if ambiguity(url) is not None:
        return f"{url.split('://', 1)[0]}://{MASK} (not shown: its password is not encoded)"
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
    redactor: they are masked wherever they would otherwise be posted or stored. The
    password is libpq's reading, and the URL rules' too where they differ; and, for a URL
    the two read differently, all between the user and the last "@"."""
    found: list[str] = []
    libpq = libpq_reading(url)
    found += [libpq[k] for k in sorted(_SECRET_PARAMS) if libpq and libpq.get(k)]
    rest = url.split("://", 1)[1] if "://" in url else url
    if "@" in rest and ":" in rest.rpartition("@")[0]:
        region = rest.rpartition("@")[0].split(":", 1)[1]
        found.extend({region, unquote(region)} if ambiguity(url) else set())
    try:
        parts = urlsplit(url)
        netloc_password = parts.password
    except ValueError:
        return list(dict.fromkeys(v for v in found if v))
    for pair in parts.query.split("&"):
        key, eq, raw = pair.partition("=")
        if eq and raw and unquote(key) in _SECRET_PARAMS:
            # As written, and decoded as libpq decodes it: %XX only, a "+" is a "+"
            # (parse_qsl's form decoding would make it a space, a text never said).
            found.extend({raw, unquote(raw)})
    if netloc_password:
        # As written in the URL, and decoded (what an error message may repeat).
        found.extend({netloc_password, unquote(netloc_password)})
    return list(dict.fromkeys(v for v in found if v))


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
        return _postgres(SecretStr(value))
    if isinstance(value, SecretStr) and value.get_secret_value().startswith(SCHEMES):
        return _postgres(value)
    return value


def _postgres(url: SecretStr) -> PostgresUrl:
    if (why := ambiguity(url.get_secret_value())) is not None:
        raise ValueError(
            f"the PostgreSQL URL is not used (nor shown): {why}, so libpq and the bot "
            "would not agree on which part is the password. Percent-encode the user and "
            "password (/ as %2F, ? as %3F, # as %23, @ as %40), or give the "
            "password in PGPASSWORD or ~/.pgpass"
        )
    return PostgresUrl(url=url)


def is_postgres(target: Path | PostgresUrl) -> bool:
    return isinstance(target, PostgresUrl)


# ``CHATOPS_DB``: a path, or a ``postgresql://`` URL.
DbTarget = Annotated[Path | PostgresUrl, BeforeValidator(_parse)]
