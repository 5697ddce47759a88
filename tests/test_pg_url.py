"""A PostgreSQL URL whose password holds "/", "?", "#" or "@" unencoded: libpq's own
reading (psycopg's ``conninfo_to_dict``, the libpq psycopg connects with) decides what the
password is, and where it and URL rules disagree, the URL is refused naming no part of it.

libpq ends the user and password at the first "@" before any "/", and keeps "?" and "#"
in the password; URL rules end the password at "/", "?" or "#". So ``shown_url`` used to
print ``postgresql://chatops:Kx7`` for ``chatops:Kx7?Qm2@db`` (the start of the password)
and the redactor knew no secret in it; ``chatops:Kx7/Qm2@db`` was shown whole (libpq reads
it as host ``chatops``, port ``Kx7`` and database ``Qm2@db/chatops``)."""

from __future__ import annotations

import io
from contextlib import redirect_stderr
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from bot.cli.main import main
from bot.errors import ConfigError
from bot.settings import PostgresUrl, load_settings, shown_url
from bot.settings.database import url_secrets


def empty_config(tmp_path: Path) -> Path:
    path = tmp_path / "chatops.toml"
    path.write_text("")
    return path


# (URL, what libpq reads as the password, the password meant, the pieces of it that
# must never be shown)
AMBIGUOUS = [
    ("postgresql://chatops:Kx7?Qm2@db/chatops", "Kx7?Qm2", "Kx7?Qm2", ("Kx7", "Qm2")),
    ("postgresql://chatops:Kx7#Qm2@db/chatops", "Kx7#Qm2", "Kx7#Qm2", ("Kx7", "Qm2")),
    ("postgresql://chatops:Kx7/Qm2@db/chatops", None, "Kx7/Qm2", ("Kx7", "Qm2")),
    ("postgresql://chatops:Kx7@Qm2@db/chatops", "Kx7", "Kx7@Qm2", ("Kx7", "Qm2")),
    ("postgresql://chatops:Kx7@Q/m2?z#w@db:5432/chatops", "error", "Kx7@Q/m2?z#w", ("Kx7",)),
]


@pytest.mark.parametrize(("url", "libpq", "meant", "pieces"), AMBIGUOUS)
def test_a_password_libpq_and_url_rules_read_differently_is_refused_and_never_shown(
    url: str, libpq: str | None, meant: str, pieces: tuple[str, ...], tmp_path: Path
) -> None:
    # What libpq itself makes of it: not the password meant (or, for "?" and "#", what
    # URL rules would not call the password).
    if libpq == "error":
        with pytest.raises(Exception, match="URI query parameter"):
            conninfo_to_dict(url)
    else:
        assert conninfo_to_dict(url).get("password") == libpq
    shown = shown_url(url)
    assert not any(p in shown for p in pieces), shown
    assert shown == "postgresql://*** (not shown: its password is not encoded)"
    # Whatever libpq would use, and all that could be the password, is masked anywhere.
    secrets = url_secrets(url)
    assert meant in secrets and (libpq in (None, "error") or libpq in secrets)

    with pytest.raises(ConfigError) as refused:
        load_settings(empty_config(tmp_path), CHATOPS_DB=url)
    said = str(refused.value)
    assert "CHATOPS_DB" in said and "Percent-encode the user and password" in said
    assert not any(p in said for p in pieces), said


def test_the_command_line_refuses_such_a_url_as_one_with_a_password(tmp_path: Path) -> None:
    # `--db` with a password is refused (every user reads a command line): the check
    # asked url_secrets, which found none in `chatops:Kx7?Qm2@db` before.
    err = io.StringIO()
    with redirect_stderr(err):
        code = main(["migrate", "--db", "postgresql://chatops:Kx7?Qm2@db/chatops"])
    assert code == 2 and "--db carries the database's password" in err.getvalue()
    assert "Kx7" not in err.getvalue() and "Qm2" not in err.getvalue()


# Good but unusual: each read the same by libpq and URL rules, so used and shown masked.
UNUSUAL = [
    ("postgresql://chatops:Kx7%2FQm2%3F%23%40@db/chatops", "Kx7/Qm2?#@"),
    ("postgresql://chatops:Kx7%3AQm2@[::1]:5432/chatops", "Kx7:Qm2"),
    ("postgresql://chatops:Kx7:Qm2@db/chatops", "Kx7:Qm2"),
    ("postgres://chatops:Kx7+Qm2@db/chatops", "Kx7+Qm2"),
    (
        "postgresql://chatops:Kx7Qm2@h1:5432,h2:5433/chatops?target_session_attrs=read-write",
        "Kx7Qm2",
    ),
    ("postgresql://chatops@db/chatops?password=Kx7/Qm2?z", "Kx7/Qm2?z"),
    ("postgresql://chatops:Kx7Qm2@/chatops?host=/var/run/postgresql", "Kx7Qm2"),
    ("postgresql://chatops:Kx7Qm2@db/chat%40ops", "Kx7Qm2"),
]


@pytest.mark.parametrize(("url", "password"), UNUSUAL)
def test_an_encoded_or_unusual_url_is_used_and_its_password_masked(
    url: str, password: str, tmp_path: Path
) -> None:
    assert conninfo_to_dict(url)["password"] == password  # libpq reads what was meant
    settings = load_settings(empty_config(tmp_path), CHATOPS_DB=url)
    assert isinstance(settings.db_path, PostgresUrl)
    shown = str(settings.db_path)
    assert "Kx7" not in shown and "Qm2" not in shown and "***" in shown
    assert password in settings.secret_values()


def test_a_url_without_a_password_is_shown_whole() -> None:
    for url in ("postgresql:///chatops?service=chatops", "postgresql://chatops@db/chatops"):
        assert shown_url(url) == url and url_secrets(url) == []
