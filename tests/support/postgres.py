"""A real PostgreSQL server for the tests (issue 21): Debian's ``postgresql`` package,
started in a temporary directory with ``initdb``/``pg_ctl`` as an unprivileged account
(``postgres`` when the tests run as root: initdb refuses root), listening on a loopback
port with password (SCRAM) authentication, as a production server would.

One server per test process (xdist worker), started the first time a test asks for
one and stopped when the process ends. Each test gets a schema of its own
(``fresh_url``): the URL carries ``options=-csearch_path=<schema>``, so the bot's
tables, its advisory lock (keyed by the schema) and everything else of one test never
meet another's. Restarting or stopping the server (``restart``, ``stop``, ``start``) is
for the tests of a database that goes away mid-run; they take a server of their own
(``PostgresServer.start_new``) so no other test sees it go.

Without PostgreSQL's programs the tests skip, except under CI (``CI`` set), where they
fail: ``.ci/run`` installs the package.
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import psycopg
import pytest
from pydantic import SecretStr

from bot.audit.store import AuditLog
from bot.settings import PostgresUrl

PASSWORD_BYTES = 12
USER = "chatops"
DATABASE = "chatops"


def pg_bin() -> Path | None:
    """The newest installed PostgreSQL's programs (Debian keeps them per version)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parent.parent.name),
    )
    return Path(found[-1]).parent if found else None


def require_postgres() -> Path:
    where = pg_bin()
    if where is None:
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL is missing and CI is set: install postgresql (.ci/run)")
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.fail("running as root needs the postgres account (Debian's package makes it)")
    return where


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PostgresServer:
    bin: Path
    base: Path
    port: int
    password: str
    account: str | None  # the account the server runs as (None: this one)
    _schemas: int = field(default=0)
    _admin: psycopg.Connection[tuple[Any, ...]] | None = field(default=None)
    _spare: list[PostgresUrl] = field(default_factory=list)

    @property
    def data(self) -> Path:
        return self.base / "data"

    @classmethod
    def start_new(cls) -> PostgresServer:
        """initdb and start a server in a fresh directory; stopped at exit."""
        where = require_postgres()
        base = Path(tempfile.mkdtemp(prefix="chatops-pg-"))
        account = "postgres" if os.geteuid() == 0 else None
        server = cls(where, base, _free_port(), secrets.token_urlsafe(PASSWORD_BYTES), account)
        pwfile = base / "pw"
        pwfile.write_text(server.password + "\n")
        if account is not None:
            info = pwd.getpwnam(account)
            os.chown(base, info.pw_uid, info.pw_gid)
            os.chown(pwfile, info.pw_uid, info.pw_gid)
        server._as(
            "initdb",
            "-D",
            str(server.data),
            "-U",
            USER,
            f"--pwfile={pwfile}",
            "--auth=scram-sha-256",
            "-E",
            "UTF8",
            "--locale=C.UTF-8",
            "-N",  # no fsync of the new cluster's files: it is a test's
        )
        pwfile.unlink()
        server.start()
        server._psql("postgres", f"CREATE DATABASE {DATABASE} OWNER {USER}")
        atexit.register(server.destroy)
        return server

    def _as(self, program: str, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [str(self.bin / program), *args]
        if self.account is not None:
            argv = ["runuser", "-u", self.account, "--", *argv]
        result = subprocess.run(
            argv, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL
        )
        if result.returncode != 0:
            log = self.base / "log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(
                f"{program} failed ({result.returncode}): {result.stderr.strip()}\n{tail}"
            )
        return result

    def start(self) -> None:
        # No fsync: nothing here outlives the machine, and a test server's disk flushes were
        # most of what a test's schema cost (13 migrations, each its own commit). A crash
        # of the server process itself loses nothing (the kernel still has the pages), and
        # the restart tests stop it cleanly.
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.base} "
            "-c shared_buffers=16MB -c max_connections=200 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off"
        )
        self._as(
            "pg_ctl",
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.base / "log"),
            "-w",
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self._as("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self) -> None:
        self.stop()
        self.start()

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        except RuntimeError:
            pass
        shutil.rmtree(self.base, ignore_errors=True)

    def _psql(self, database: str, sql: str) -> str:
        env = {**os.environ, "PGPASSWORD": self.password}
        result = subprocess.run(
            [str(self.bin / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER,
             "-d", database, "-v", "ON_ERROR_STOP=1", "-Atc", sql],
            capture_output=True, text=True, check=False, env=env, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"psql failed: {result.stderr.strip()}")
        return result.stdout

    def sql(self, sql: str, *, schema: str | None = None) -> str:
        """Run ``sql`` with psql (in ``schema`` when given); its output, unaligned."""
        prefix = f"SET search_path = {schema}; " if schema else ""
        return self._psql(DATABASE, prefix + sql)

    def admin(self) -> psycopg.Connection[tuple[Any, ...]]:
        """This process's own session on the test database (autocommit): quicker than a
        psql per statement for the schemas every test makes."""
        if self._admin is None or self._admin.closed:
            self._admin = psycopg.connect(self.url(), autocommit=True)
        return self._admin

    def url(self, schema: str | None = None, *, password: bool = True) -> str:
        who = f"{USER}:{quote(self.password, safe='')}" if password else USER
        url = f"postgresql://{who}@127.0.0.1:{self.port}/{DATABASE}"
        if schema is not None:
            url += f"?options={quote(f'-csearch_path={schema}', safe='')}"
        return url

    def fresh_schema(self) -> str:
        self._schemas += 1
        name = f"t{os.getpid()}_{self._schemas}_{secrets.token_hex(3)}"
        self.admin().execute(f"CREATE SCHEMA {name} AUTHORIZATION {USER}".encode())
        return name

    def fresh_url(self) -> PostgresUrl:
        """A database of one's own: a new schema, the URL that uses it."""
        return PostgresUrl(url=SecretStr(self.url(self.fresh_schema())))

    async def migrated_url(self) -> PostgresUrl:
        """A migrated schema with no rows: one a finished test gave back (``give_back``),
        else a new one migrated now. Migrating costs about 13 transactions of DDL; emptying
        a used schema, one TRUNCATE."""
        if self._spare:
            return self._spare.pop()
        url = self.fresh_url()
        await migrate_pg(url)
        return url

    def give_back(self, url: PostgresUrl) -> None:
        """Empty ``url``'s schema (every table but ``_migrations``, ids from 1 again) for
        the next test's ``migrated_url``."""
        schema = parse_qs(urlsplit(url.url.get_secret_value()).query)["options"][0]
        name = schema.removeprefix("-csearch_path=")
        conn = self.admin()
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename != %s",
                (name, "_migrations"),
            ).fetchall()
        ]
        listed = ", ".join(f'{name}."{t}"' for t in tables)
        conn.execute(f"TRUNCATE {listed} RESTART IDENTITY CASCADE".encode())
        self._spare.append(url)


_shared: PostgresServer | None = None


def shared_server() -> PostgresServer:
    """This test process's server, started on first use."""
    global _shared
    if _shared is None:
        _shared = PostgresServer.start_new()
    return _shared


async def migrate_pg(url: PostgresUrl) -> None:
    """Apply the bot's migrations to ``url``'s schema (as ``python -m bot migrate``)."""
    async with AuditLog.open(url, migrate=True):
        pass
