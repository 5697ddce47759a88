"""The audit log: every run, decision, step, GPU snapshot, refusal and lock, in SQLite.

Schema (created by ``bot.audit.migrations``; every timestamp is TEXT ``YYYY-MM-DDTHH:MM:SSZ``
in UTC, so string order is time order):

``runs``
    id (AUTOINCREMENT, never reused), service, action (redeploy|restart|status),
    hosts (JSON array), requested_by, source (slack|cli|demo), channel, message_ts
    (the Slack card's ts), plan (JSON object), package_spec, index_name, dry_run (0/1),
    status (see ``STATUSES``), current_step, summary, version_before, version_after,
    created_at, started_at (first entry into ``running``), finished_at (entry into a
    final status), expires_at (end of the approval window).
    Indexes: (service, id DESC), (status, id DESC).
``decisions``
    run_id -> runs, user, decision (approve|deny|cancel), at;
    UNIQUE(run_id, user, decision) so a double click counts once.
``steps``
    run_id -> runs, host, step, command (as run, e.g. ``shlex.join(argv)``), status
    (running|ok|failed|skipped|interrupted), exit_status, started_at, finished_at,
    duration_s, output_tail (last ``OUTPUT_TAIL_CHARS`` characters). Index: (run_id).
``gpu_snapshots``
    run_id -> runs (NULL for ad-hoc status queries), host, label, taken_at, data (JSON).
``refusals``
    at, user, channel, command (as typed), reason: one row per refused command or click.
``locks``
    scope PRIMARY KEY (``service:<name>`` / ``host:<name>``), run_id -> runs, acquired_at.
    Held across restarts; a run entering a final status drops its locks in the same
    transaction, so a finished run can never keep a service locked.

Behaviour worth knowing:

* Durability: WAL with ``synchronous=FULL``; every public write is one transaction,
  committed before the call returns, so ``kill -9`` at any moment loses at most the
  call in flight.
* Concurrency: one connection per ``AuditLog``; an ``asyncio.Lock`` serialises its
  transactions, and ``BEGIN IMMEDIATE`` plus a busy timeout serialise writers across
  processes (bot and CLI), which is what makes ``transition`` and ``acquire_locks``
  race-free. Each call runs in its own task shielded from cancellation, so a caller
  cancelled mid-write never leaves the connection inside a half-done transaction.
* Redaction: every free-text value (and every string inside JSON values) passes
  through ``redact`` before it is stored. Enumerated values (status, action, source,
  decision) are checked against their sets instead, and lock scopes are stored as
  given because they are keys.
* Enumerations are checked in Python, not by CHECK constraints, so a later status
  needs no table rebuild and an older bot can still open a newer database.
* A database written by a newer bot (migration names this code does not know) opens,
  with a warning logged and the names in ``unknown_migrations``: migrations are kept
  additive precisely so that this is safe.
* Record timestamps are the stored ISO strings; ``parse_ts``/``format_ts`` convert.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable, Collection, Coroutine, Generator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import aiosqlite

from bot.audit.migrations import MIGRATIONS, Migration, MigrationError, apply_migrations
from bot.errors import AuditError, LockHeldError, RunNotFoundError

log = logging.getLogger(__name__)

T = TypeVar("T")
Redactor = Callable[[str], str]

ACTIONS = frozenset({"redeploy", "restart", "status"})
SOURCES = frozenset({"slack", "cli", "demo"})
DECISIONS = frozenset({"approve", "deny", "cancel"})
ACTIVE_STATUSES = frozenset({"pending_approval", "approved", "running"})
FINAL_STATUSES = frozenset(
    {
        "succeeded",
        "failed",
        "rolled_back",
        "aborted",
        "cancelled",
        "interrupted",
        "denied",
        "expired",
        "refused",
    }
)
STATUSES = ACTIVE_STATUSES | FINAL_STATUSES
STEP_STATUSES = frozenset({"running", "ok", "failed", "skipped", "interrupted"})
OUTPUT_TAIL_CHARS = 4000
TS_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def format_ts(moment: datetime) -> str:
    """An aware datetime as the stored form, e.g. ``2026-11-30T13:12:01Z``."""
    if moment.tzinfo is None:
        raise ValueError("naive datetime: pass an aware (UTC) datetime")
    return moment.astimezone(UTC).strftime(TS_FORMAT)


def parse_ts(text: str) -> datetime:
    return datetime.strptime(text, TS_FORMAT).replace(tzinfo=UTC)


def _now() -> str:
    return format_ts(datetime.now(UTC))


def _identity(text: str) -> str:
    return text


@dataclass(frozen=True, slots=True)
class Decision:
    user: str
    decision: str
    at: str


@dataclass(frozen=True, slots=True)
class RunRecord:
    id: int
    service: str
    action: str
    hosts: list[str]
    requested_by: str
    source: str
    status: str
    current_step: str | None
    summary: str | None
    version_before: str | None
    version_after: str | None
    created_at: str
    started_at: str | None
    finished_at: str | None
    expires_at: str | None
    channel: str | None
    message_ts: str | None
    plan: dict[str, Any]
    package_spec: str | None
    index_name: str | None
    dry_run: bool
    approved_by: list[str]
    denied_by: list[str]

    @property
    def is_final(self) -> bool:
        return self.status in FINAL_STATUSES

    def to_json(self) -> dict[str, Any]:
        # The fields people scan for first lead; the rest follow.
        return {
            "id": self.id,
            "service": self.service,
            "action": self.action,
            "requested_by": self.requested_by,
            "approved_by": list(self.approved_by),
            "status": self.status,
            "version_before": self.version_before,
            "version_after": self.version_after,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "denied_by": list(self.denied_by),
            "hosts": list(self.hosts),
            "source": self.source,
            "channel": self.channel,
            "message_ts": self.message_ts,
            "current_step": self.current_step,
            "summary": self.summary,
            "package_spec": self.package_spec,
            "index_name": self.index_name,
            "dry_run": self.dry_run,
            "plan": self.plan,
        }


@dataclass(frozen=True, slots=True)
class StepRecord:
    id: int
    run_id: int
    host: str
    step: str
    command: str
    status: str
    exit_status: int | None
    started_at: str
    finished_at: str | None
    duration_s: float | None
    output_tail: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    id: int
    run_id: int | None
    host: str
    label: str
    taken_at: str
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Refusal:
    id: int
    at: str
    user: str
    channel: str | None
    command: str
    reason: str


_RUN_COLUMNS = (
    "id, service, action, hosts, requested_by, source, status, current_step, summary, "
    "version_before, version_after, created_at, started_at, finished_at, expires_at, "
    "channel, message_ts, plan, package_spec, index_name, dry_run"
)
_STEP_COLUMNS = (
    "id, run_id, host, step, command, status, exit_status, started_at, finished_at, "
    "duration_s, output_tail"
)


def runs_query(
    *, service: str | None, statuses: Collection[str] | None, limit: int
) -> tuple[str, list[Any]]:
    """The SQL behind ``list_runs``; public so a test can check its plan uses an index."""
    where: list[str] = []
    params: list[Any] = []
    if service is not None:
        where.append("service = ?")
        params.append(service)
    if statuses is not None:
        where.append(f"status IN ({', '.join('?' * len(statuses))})")
        params.extend(statuses)
    sql = f"SELECT {_RUN_COLUMNS} FROM runs"  # noqa: S608 - only our column names; values bound
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY id DESC LIMIT ?"
    params.append(limit)
    return sql, params


def _problem(path: Path, exc: BaseException) -> str:
    text = str(exc)
    low = text.lower()
    if "not a database" in low or "malformed" in low:
        reason = "not a database, or the file is corrupt"
    elif "readonly" in low or "read-only" in low:
        reason = "read-only: the bot cannot write to it (check file and directory permissions)"
    elif "unable to open" in low:
        reason = "cannot open or create the file (does the directory exist and is it writable?)"
    elif "locked" in low or "busy" in low:
        reason = "locked by another process for longer than the busy timeout"
    else:
        reason = text
    return f"audit database {path}: {reason}"


def _check_path(path: Path) -> None:
    if path.is_dir():
        raise AuditError(f"audit database {path}: is a directory")
    parent = path.parent
    if not parent.exists():
        raise AuditError(f"audit database {path}: directory {parent} does not exist")
    if not parent.is_dir():
        raise AuditError(f"audit database {path}: {parent} is not a directory")


def _check(value: str, allowed: Collection[str], what: str) -> None:
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; expected one of {sorted(allowed)}")


def _qmarks(values: Collection[Any]) -> str:
    return ", ".join("?" * len(values))


async def _exec(conn: aiosqlite.Connection, sql: str, params: Sequence[Any] = ()) -> int:
    """Run one statement; returns the number of rows it changed."""
    async with conn.execute(sql, params) as cur:
        return cur.rowcount


async def _insert(conn: aiosqlite.Connection, sql: str, params: Sequence[Any]) -> int:
    async with conn.execute(sql, params) as cur:
        rowid = cur.lastrowid
    if rowid is None:
        raise AuditError(f"insert returned no row id: {sql}")
    return rowid


async def _rows(
    conn: aiosqlite.Connection, sql: str, params: Sequence[Any] = ()
) -> list[sqlite3.Row]:
    async with conn.execute(sql, params) as cur:
        return list(await cur.fetchall())


async def _enable_wal(conn: aiosqlite.Connection, timeout_s: float) -> str:
    """Switch a database to WAL (persistent: done once per file) and return the mode.

    Changing the journal mode needs an exclusive lock, and SQLite answers "database
    is locked" at once, without its busy handler, when another process is opening the
    same fresh file: retry until the busy timeout, as every other statement waits."""
    deadline = time.monotonic() + timeout_s
    while True:
        (mode,) = (await _rows(conn, "PRAGMA journal_mode"))[0]
        if str(mode).lower() == "wal":
            return str(mode)
        try:
            (mode,) = (await _rows(conn, "PRAGMA journal_mode = WAL"))[0]
            return str(mode)
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        await asyncio.sleep(0.01)


async def _probe_write(conn: aiosqlite.Connection) -> None:
    # SQLite opens a read-only file without complaint; find out now, not at the first write.
    await conn.execute("BEGIN IMMEDIATE")
    try:
        await conn.execute("INSERT INTO _migrations (name, applied_at) VALUES ('probe', '')")
    finally:
        await conn.execute("ROLLBACK")


def _not_found(run_id: int) -> RunNotFoundError:
    return RunNotFoundError(f"there is no run #{run_id} in the audit log")


class _Opening:
    """What ``AuditLog.open`` returns: await it, or use it with ``async with``."""

    def __init__(self, start: Callable[[], Coroutine[Any, Any, AuditLog]]) -> None:
        self._start = start
        self._log: AuditLog | None = None

    def __await__(self) -> Generator[Any, None, AuditLog]:
        return self._start().__await__()

    async def __aenter__(self) -> AuditLog:
        self._log = await self._start()
        return self._log

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._log is not None:
            await self._log.close()


class AuditLog:
    """The audit store. Create with ``await AuditLog.open(path)``."""

    def __init__(
        self,
        conn: aiosqlite.Connection,
        path: Path,
        redact: Redactor,
        unknown_migrations: tuple[str, ...],
    ) -> None:
        self._conn = conn
        self._path = path
        self._redact = redact
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False
        self.unknown_migrations = unknown_migrations

    @classmethod
    def open(
        cls,
        path: Path,
        *,
        redact: Redactor = _identity,
        migrations: Sequence[Migration] = MIGRATIONS,
        busy_timeout_s: float = 10.0,
    ) -> _Opening:
        """Open (creating if needed) and migrate the database at ``path``.

        ``migrations`` exists so tests can play an older or newer bot.
        Raises ``AuditError`` naming the path and the problem.
        """
        return _Opening(lambda: cls._open(Path(path), redact, migrations, busy_timeout_s))

    @classmethod
    async def _open(
        cls,
        path: Path,
        redact: Redactor,
        migrations: Sequence[Migration],
        busy_timeout_s: float,
    ) -> AuditLog:
        _check_path(path)
        try:
            conn = await aiosqlite.connect(path, isolation_level=None, timeout=busy_timeout_s)
        except sqlite3.Error as exc:
            raise AuditError(_problem(path, exc)) from exc
        try:
            conn.row_factory = sqlite3.Row
            mode = await _enable_wal(conn, busy_timeout_s)
            if str(mode).lower() != "wal":
                raise AuditError(
                    f"audit database {path}: cannot use WAL journal mode (got {mode!r}); "
                    "is it on a network file system?"
                )
            await conn.execute("PRAGMA synchronous = FULL")
            await conn.execute("PRAGMA foreign_keys = ON")
            result = await apply_migrations(conn, migrations)
            await _probe_write(conn)
        except BaseException as exc:
            try:
                await conn.close()
            except sqlite3.Error:
                log.debug("closing %s after a failed open also failed", path, exc_info=True)
            if isinstance(exc, sqlite3.Error | MigrationError):
                raise AuditError(_problem(path, exc)) from exc
            raise
        if result.unknown:
            log.warning(
                "audit database %s was written by a newer bot (unknown migrations: %s); "
                "opening it anyway",
                path,
                ", ".join(result.unknown),
            )
        return cls(conn, path, redact, tuple(result.unknown))

    @property
    def path(self) -> Path:
        return self._path

    async def pragmas(self) -> dict[str, Any]:
        """The durability settings of this connection, for tests and a health check."""

        async def body(conn: aiosqlite.Connection) -> dict[str, Any]:
            return {
                name: (await _rows(conn, f"PRAGMA {name}"))[0][0]
                for name in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
            }

        return await self._tx(body, write=False)

    async def close(self) -> None:
        if self._closed:
            return
        # Let writes already started (maybe by a caller that was cancelled) finish.
        await asyncio.gather(*self._tasks, return_exceptions=True)
        async with self._lock:
            self._closed = True
            try:
                await self._conn.close()
            except sqlite3.Error as exc:
                raise AuditError(_problem(self._path, exc)) from exc

    async def __aenter__(self) -> AuditLog:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- transaction machinery -------------------------------------------------

    async def _tx(
        self,
        body: Callable[[aiosqlite.Connection], Awaitable[T]],
        *,
        write: bool = True,
    ) -> T:
        task = asyncio.create_task(self._locked(body, write))
        self._tasks.add(task)
        task.add_done_callback(self._forget)
        # If our caller is cancelled the task still commits or rolls back on its own.
        return await asyncio.shield(task)

    def _forget(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved here so a cancelled caller's error is not logged twice

    async def _locked(
        self, body: Callable[[aiosqlite.Connection], Awaitable[T]], write: bool
    ) -> T:
        async with self._lock:
            if self._closed:
                raise AuditError(f"audit database {self._path}: already closed")
            conn = self._conn
            try:
                # IMMEDIATE takes the write lock up front: a read-then-write (CAS, locks)
                # can then never be overtaken by another process between the two.
                await conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                result = await body(conn)
                await conn.execute("COMMIT")
            except BaseException as exc:
                if conn.in_transaction:
                    try:
                        await conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        log.warning("rollback failed on %s", self._path, exc_info=True)
                if isinstance(exc, sqlite3.Error):
                    raise AuditError(_problem(self._path, exc)) from exc
                raise
            return result

    # -- redaction ---------------------------------------------------------------

    def _r(self, text: str) -> str:
        return self._redact(text)

    def _r_opt(self, text: str | None) -> str | None:
        return None if text is None else self._redact(text)

    def _clean(self, value: Any) -> Any:
        # Redact the strings inside the structure, not the dumped JSON: a secret with a
        # quote or backslash in it would be escaped in the dump and slip past.
        if isinstance(value, str):
            return self._redact(value)
        if isinstance(value, Mapping):
            return {self._clean(k): self._clean(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._clean(v) for v in value]
        return value

    def _json(self, value: Any) -> str:
        return json.dumps(self._clean(value), ensure_ascii=False)

    def as_stored(self, value: Any) -> Any:
        """``value`` as it reads back after being stored (redacted, JSON types), so a
        fresh object can be compared with a stored one."""
        return json.loads(self._json(value))

    # -- runs --------------------------------------------------------------------

    async def create_run(
        self,
        *,
        service: str,
        action: str,
        hosts: Sequence[str],
        requested_by: str,
        source: str,
        plan: Mapping[str, Any],
        package_spec: str | None,
        index_name: str | None = None,
        dry_run: bool = False,
        status: str = "pending_approval",
        channel: str | None = None,
        expires_at: datetime | None = None,
    ) -> int:
        _check(action, ACTIONS, "action")
        _check(source, SOURCES, "source")
        _check(status, STATUSES, "status")
        now = _now()
        params = (
            self._r(service),
            action,
            self._json(list(hosts)),
            self._r(requested_by),
            source,
            self._r_opt(channel),
            self._json(plan),
            self._r_opt(package_spec),
            self._r_opt(index_name),
            int(dry_run),
            status,
            now,
            now if status == "running" else None,
            now if status in FINAL_STATUSES else None,
            None if expires_at is None else format_ts(expires_at),
        )

        async def body(conn: aiosqlite.Connection) -> int:
            return await _insert(
                conn,
                "INSERT INTO runs (service, action, hosts, requested_by, source, channel, plan, "
                "package_spec, index_name, dry_run, status, created_at, started_at, "
                "finished_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                params,
            )

        return await self._tx(body)

    async def _update_run(self, run_id: int, sets: Mapping[str, Any]) -> None:
        assignments = ", ".join(f"{column} = ?" for column in sets)

        async def body(conn: aiosqlite.Connection) -> None:
            changed = await _exec(
                conn,
                f"UPDATE runs SET {assignments} WHERE id = ?",  # noqa: S608 - our column names
                [*sets.values(), run_id],
            )
            if not changed:
                raise _not_found(run_id)

        await self._tx(body)

    async def set_message(self, run_id: int, channel: str, ts: str) -> None:
        await self._update_run(run_id, {"channel": self._r(channel), "message_ts": self._r(ts)})

    async def set_step(self, run_id: int, step: str | None) -> None:
        await self._update_run(run_id, {"current_step": self._r_opt(step)})

    async def set_versions(
        self, run_id: int, *, before: str | None = None, after: str | None = None
    ) -> None:
        """Record installed versions; only the ones given are overwritten."""
        sets: dict[str, Any] = {}
        if before is not None:
            sets["version_before"] = self._r(before)
        if after is not None:
            sets["version_after"] = self._r(after)
        if sets:
            await self._update_run(run_id, sets)

    async def transition(
        self,
        run_id: int,
        to: str,
        *,
        expect: Collection[str] | None = None,
        summary: str | None = None,
        owner: str | None = None,
    ) -> bool:
        """Compare-and-set the status: False (nothing changed) if it is not in ``expect``.

        ``owner`` records the process that drives the run from here on.

        Entering ``running`` stamps started_at (first time only); entering a final
        status stamps finished_at and releases the run's locks.
        """
        _check(to, STATUSES, "status")
        if isinstance(expect, str):
            raise TypeError("expect must be a collection of statuses, not one string")
        for status in expect or ():
            _check(status, STATUSES, "status")
        now = _now()
        sets = ["status = ?"]
        params: list[Any] = [to]
        if to == "running":
            sets.append("started_at = COALESCE(started_at, ?)")
            params.append(now)
        if to in FINAL_STATUSES:
            sets.append("finished_at = ?")
            params.append(now)
        if summary is not None:
            sets.append("summary = ?")
            params.append(self._r(summary))
        if owner is not None:
            sets.append("owner = ?")
            params.append(owner)
        sql = f"UPDATE runs SET {', '.join(sets)} WHERE id = ?"  # noqa: S608 - values bound
        params.append(run_id)
        if expect is not None:
            sql += f" AND status IN ({_qmarks(expect)})"
            params.extend(expect)

        async def body(conn: aiosqlite.Connection) -> bool:
            if not await _exec(conn, sql, params):
                if not await _rows(conn, "SELECT 1 FROM runs WHERE id = ?", (run_id,)):
                    raise _not_found(run_id)
                return False
            if to in FINAL_STATUSES:
                await _exec(conn, "DELETE FROM locks WHERE run_id = ?", (run_id,))
            return True

        return await self._tx(body)

    async def get_run(self, run_id: int) -> RunRecord:
        async def body(conn: aiosqlite.Connection) -> RunRecord:
            return await self._run(conn, run_id)

        return await self._tx(body, write=False)

    async def list_runs(
        self,
        *,
        service: str | None = None,
        limit: int = 20,
        statuses: Collection[str] | None = None,
    ) -> list[RunRecord]:
        """Newest first."""
        if limit < 0:
            raise ValueError("limit must be >= 0")
        if isinstance(statuses, str):
            raise TypeError("statuses must be a collection of statuses, not one string")
        sql, params = runs_query(
            service=None if service is None else self._r(service),
            statuses=None if statuses is None else list(statuses),
            limit=limit,
        )

        async def body(conn: aiosqlite.Connection) -> list[RunRecord]:
            return await self._records(conn, await _rows(conn, sql, params))

        return await self._tx(body, write=False)

    async def _run(self, conn: aiosqlite.Connection, run_id: int) -> RunRecord:
        sql = f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = ?"  # noqa: S608 - constant columns
        rows = await _rows(conn, sql, (run_id,))
        if not rows:
            raise _not_found(run_id)
        return (await self._records(conn, rows))[0]

    async def _records(
        self, conn: aiosqlite.Connection, rows: Sequence[sqlite3.Row]
    ) -> list[RunRecord]:
        approved: dict[int, list[str]] = {}
        denied: dict[int, list[str]] = {}
        if rows:
            decisions = await _rows(
                conn,
                "SELECT run_id, user, decision FROM decisions "
                "WHERE run_id IN (SELECT value FROM json_each(?)) "
                "AND decision IN ('approve', 'deny') ORDER BY id",
                (json.dumps([row["id"] for row in rows]),),
            )
            for d in decisions:
                target = approved if d["decision"] == "approve" else denied
                target.setdefault(d["run_id"], []).append(d["user"])
        return [
            RunRecord(
                id=row["id"],
                service=row["service"],
                action=row["action"],
                hosts=json.loads(row["hosts"]),
                requested_by=row["requested_by"],
                source=row["source"],
                status=row["status"],
                current_step=row["current_step"],
                summary=row["summary"],
                version_before=row["version_before"],
                version_after=row["version_after"],
                created_at=row["created_at"],
                started_at=row["started_at"],
                finished_at=row["finished_at"],
                expires_at=row["expires_at"],
                channel=row["channel"],
                message_ts=row["message_ts"],
                plan=json.loads(row["plan"]),
                package_spec=row["package_spec"],
                index_name=row["index_name"],
                dry_run=bool(row["dry_run"]),
                approved_by=approved.get(row["id"], []),
                denied_by=denied.get(row["id"], []),
            )
            for row in rows
        ]

    # -- decisions ---------------------------------------------------------------

    async def record_decision(self, run_id: int, user: str, decision: str) -> bool:
        """False when this user already made this decision on this run (a double click)."""
        _check(decision, DECISIONS, "decision")
        params = (run_id, self._r(user), decision, _now())

        async def body(conn: aiosqlite.Connection) -> bool:
            try:
                changed = await _exec(
                    conn,
                    "INSERT INTO decisions (run_id, user, decision, at) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (run_id, user, decision) DO NOTHING",
                    params,
                )
            except sqlite3.IntegrityError as exc:  # the foreign key: no such run
                raise _not_found(run_id) from exc
            return changed == 1

        return await self._tx(body)

    async def decisions(self, run_id: int) -> list[Decision]:
        async def body(conn: aiosqlite.Connection) -> list[Decision]:
            rows = await _rows(
                conn,
                "SELECT user, decision, at FROM decisions WHERE run_id = ? ORDER BY id",
                (run_id,),
            )
            return [Decision(r["user"], r["decision"], r["at"]) for r in rows]

        return await self._tx(body, write=False)

    # -- steps and snapshots -----------------------------------------------------

    async def step_started(self, run_id: int, host: str, step: str, command: str) -> int:
        """Record a step as running and make it the run's current step, in one
        transaction: one fsync before each remote action instead of two."""
        params = (run_id, self._r(host), self._r(step), self._r(command), "running", _now())

        async def body(conn: aiosqlite.Connection) -> int:
            try:
                step_id = await _insert(
                    conn,
                    "INSERT INTO steps (run_id, host, step, command, status, started_at) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    params,
                )
            except sqlite3.IntegrityError as exc:
                raise _not_found(run_id) from exc
            await _exec(conn, "UPDATE runs SET current_step = ? WHERE id = ?",
                        (self._r(step), run_id))
            return step_id

        return await self._tx(body)

    async def step_finished(
        self,
        step_id: int,
        *,
        status: str,
        exit_status: int | None = None,
        duration_s: float | None = None,
        output_tail: str = "",
    ) -> None:
        _check(status, STEP_STATUSES - {"running"}, "step status")
        # Redact before cutting: cutting first could leave half a secret unrecognised.
        tail = self._r(output_tail)[-OUTPUT_TAIL_CHARS:]
        params = (status, exit_status, _now(), duration_s, tail, step_id)

        async def body(conn: aiosqlite.Connection) -> None:
            changed = await _exec(
                conn,
                "UPDATE steps SET status = ?, exit_status = ?, finished_at = ?, "
                "duration_s = ?, output_tail = ? WHERE id = ?",
                params,
            )
            if not changed:
                raise ValueError(f"there is no step #{step_id} in the audit log")

        await self._tx(body)

    async def steps(self, run_id: int) -> list[StepRecord]:
        async def body(conn: aiosqlite.Connection) -> list[StepRecord]:
            rows = await _rows(
                conn,
                f"SELECT {_STEP_COLUMNS} FROM steps WHERE run_id = ? ORDER BY id",  # noqa: S608
                (run_id,),
            )
            return [StepRecord(*row) for row in rows]

        return await self._tx(body, write=False)

    async def add_snapshot(
        self, run_id: int | None, host: str, label: str, data: Mapping[str, Any]
    ) -> int:
        params = (run_id, self._r(host), self._r(label), _now(), self._json(data))

        async def body(conn: aiosqlite.Connection) -> int:
            try:
                return await _insert(
                    conn,
                    "INSERT INTO gpu_snapshots (run_id, host, label, taken_at, data) "
                    "VALUES (?, ?, ?, ?, ?)",
                    params,
                )
            except sqlite3.IntegrityError as exc:
                raise _not_found(run_id or 0) from exc

        return await self._tx(body)

    async def snapshots(self, run_id: int) -> list[SnapshotRecord]:
        async def body(conn: aiosqlite.Connection) -> list[SnapshotRecord]:
            rows = await _rows(
                conn,
                "SELECT id, run_id, host, label, taken_at, data FROM gpu_snapshots "
                "WHERE run_id = ? ORDER BY id",
                (run_id,),
            )
            return [
                SnapshotRecord(r["id"], r["run_id"], r["host"], r["label"], r["taken_at"],
                               json.loads(r["data"]))
                for r in rows
            ]

        return await self._tx(body, write=False)

    # -- refusals ----------------------------------------------------------------

    async def record_refusal(
        self, *, user: str, channel: str | None, command: str, reason: str
    ) -> int:
        params = (_now(), self._r(user), self._r_opt(channel), self._r(command), self._r(reason))

        async def body(conn: aiosqlite.Connection) -> int:
            return await _insert(
                conn,
                "INSERT INTO refusals (at, user, channel, command, reason) VALUES (?, ?, ?, ?, ?)",
                params,
            )

        return await self._tx(body)

    async def refusals(self, limit: int = 50) -> list[Refusal]:
        """Newest first."""
        if limit < 0:
            raise ValueError("limit must be >= 0")

        async def body(conn: aiosqlite.Connection) -> list[Refusal]:
            rows = await _rows(
                conn,
                "SELECT id, at, user, channel, command, reason FROM refusals "
                "ORDER BY id DESC LIMIT ?",
                (limit,),
            )
            return [Refusal(*row) for row in rows]

        return await self._tx(body, write=False)

    # -- locks -------------------------------------------------------------------

    async def acquire_locks(self, run_id: int, scopes: Sequence[str]) -> None:
        """Take every scope for ``run_id`` or none of them.

        Scopes this run already holds are fine (idempotent). Raises ``LockHeldError``
        naming the holder when another run holds any of them.
        """
        if isinstance(scopes, str):
            raise TypeError("scopes must be a sequence of scopes, not one string")
        wanted = list(dict.fromkeys(scopes))
        now = _now()

        async def body(conn: aiosqlite.Connection) -> None:
            held = {
                row["scope"]: row["run_id"]
                for row in await _rows(
                    conn,
                    f"SELECT scope, run_id FROM locks WHERE scope IN ({_qmarks(wanted)})",  # noqa: S608
                    wanted,
                )
            }
            for scope in wanted:
                holder_id = held.get(scope)
                if holder_id is not None and holder_id != run_id:
                    holder = await self._run(conn, holder_id)
                    raise LockHeldError(
                        f"{scope} is locked by run #{holder.id} ({holder.action} "
                        f"{holder.service}, requested by {holder.requested_by}, "
                        f"{holder.status})",
                        run_id=holder.id,
                        requested_by=holder.requested_by,
                    )
            try:
                for scope in wanted:
                    if scope not in held:
                        await _exec(
                            conn,
                            "INSERT INTO locks (scope, run_id, acquired_at) VALUES (?, ?, ?)",
                            (scope, run_id, now),
                        )
            except sqlite3.IntegrityError as exc:
                raise _not_found(run_id) from exc

        await self._tx(body)

    async def release_locks(self, run_id: int) -> None:
        async def body(conn: aiosqlite.Connection) -> None:
            await _exec(conn, "DELETE FROM locks WHERE run_id = ?", (run_id,))

        await self._tx(body)

    async def lock_holder(self, scope: str) -> RunRecord | None:
        async def body(conn: aiosqlite.Connection) -> RunRecord | None:
            rows = await _rows(conn, "SELECT run_id FROM locks WHERE scope = ?", (scope,))
            return await self._run(conn, rows[0]["run_id"]) if rows else None

        return await self._tx(body, write=False)

    # -- start-up housekeeping -----------------------------------------------------

    async def recover_interrupted(
        self, alive: Callable[[str | None], bool] | None = None
    ) -> list[RunRecord]:
        """After a restart: runs the old process was driving become 'interrupted'.

        ``alive(owner)`` says whether the owning process still runs (another bot or
        CLI on the same DB); such runs are left alone.

        That is every 'running' run, and every 'approved' one too: nothing in a fresh
        process will ever start it, and it may hold locks. Their 'running' steps become
        'interrupted' and their locks are released. Returns the runs, for Slack.
        """
        now = _now()

        async def body(conn: aiosqlite.Connection) -> list[RunRecord]:
            rows = await _rows(
                conn,
                "SELECT id, status, current_step, owner FROM runs "
                "WHERE status IN ('running', 'approved') ORDER BY id",
            )
            if alive is not None:
                rows = [row for row in rows if not alive(row["owner"])]
            for row in rows:
                if row["status"] == "approved":
                    summary = "interrupted: the bot restarted after approval, before the run began"
                elif row["current_step"]:
                    summary = (
                        f"interrupted: the bot stopped during step {row['current_step']!r}; "
                        "check the hosts before retrying"
                    )
                else:
                    summary = "interrupted: the bot stopped before the first step"
                await self._interrupt(conn, row["id"], summary, now)
            return [await self._run(conn, row["id"]) for row in rows]

        return await self._tx(body)

    async def interrupt(self, run_id: int, summary: str) -> bool:
        """A run whose driver stopped (cancelled at shutdown, or broken) becomes
        'interrupted', with its running steps, and releases its locks: it must never
        look as if something still drives it. False if it was not 'running'."""
        now = _now()

        async def body(conn: aiosqlite.Connection) -> bool:
            rows = await _rows(conn, "SELECT 1 FROM runs WHERE id = ? AND status = 'running'",
                               (run_id,))
            if rows:
                await self._interrupt(conn, run_id, summary, now)
            return bool(rows)

        return await self._tx(body)

    async def _interrupt(self, conn: aiosqlite.Connection, run_id: int, summary: str,
                         now: str) -> None:
        await _exec(
            conn,
            "UPDATE runs SET status = 'interrupted', finished_at = ?, summary = ? WHERE id = ?",
            (now, self._r(summary), run_id),
        )
        await _exec(
            conn,
            "UPDATE steps SET status = 'interrupted', finished_at = ? "
            "WHERE run_id = ? AND status = 'running'",
            (now, run_id),
        )
        await _exec(conn, "DELETE FROM locks WHERE run_id = ?", (run_id,))

    async def expire_pending(self, now: datetime) -> list[RunRecord]:
        """Runs still awaiting approval at their ``expires_at`` become 'expired'."""
        stamp = format_ts(now)

        async def body(conn: aiosqlite.Connection) -> list[RunRecord]:
            rows = await _rows(
                conn,
                "SELECT id FROM runs WHERE status = 'pending_approval' "
                "AND expires_at IS NOT NULL AND expires_at <= ? ORDER BY id",
                (stamp,),
            )
            for row in rows:
                await _exec(
                    conn,
                    "UPDATE runs SET status = 'expired', finished_at = ?, "
                    "summary = 'approval window expired' WHERE id = ?",
                    (stamp, row["id"]),
                )
                await _exec(conn, "DELETE FROM locks WHERE run_id = ?", (row["id"],))
            return [await self._run(conn, row["id"]) for row in rows]

        return await self._tx(body)
