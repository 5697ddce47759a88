"""The fallback journal: audit records the database could not take, kept on disk until
it can.

When the audit database cannot be written (locked by another process past the
retries, disk full), the records of a run in progress are appended here instead and
merged into the database later (``bot.audit.replay``, driven by
``bot.audit.resilient.AuditWriter``): nothing the bot did goes unrecorded because the
database was away.

Format: JSON lines, one record per line, each appended with one ``write`` and
fsynced before the append returns, already redacted and cut exactly as the database
would store it::

    {"v": 1, "id": "host:pid:start/7", "proc": "host:pid:start", "seq": 7,
     "at": "2026-11-30T13:12:01Z", "op": "step_finished", "step_ref": "host:pid:start/5",
     "status": "ok", ...}

* ``id`` is unique (the writing process and its counter): replay records each id it
  applied in the database, in the same transaction, so a record replayed twice (a crash
  between the commit and the clean-up of the file) is applied once.
* ``at`` is when it happened: replayed rows keep their own time, not the replay's.
* A step started while the database was away has no row id yet; later records name it
  by the id of its ``step_started`` record (``step_ref``), resolved at replay.
* A last line without its newline is a record whose append never returned (a crash,
  a full disk mid-write): it is ignored, and the next append starts on a new line.

Files: ``<db>.fallback.jsonl`` next to the database; when that cannot be written (the
database's disk is full, which is when the journal is needed most), a second file in a
fallback directory (``[audit].journal_fallback_dir``, default the temporary
directory) named after the database's path. Replay reads both. Appends and clean-ups
take an exclusive ``flock``, so a bot and a CLI sharing one database can share the
files; a clean-up that replaces or removes a file makes a writer waiting on the old
one open the new one.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bot.audit.writes import AuditRecord, from_fields, to_fields

log = logging.getLogger(__name__)

FORMAT_VERSION = 1

_COMMON = ("v", "id", "proc", "seq", "at", "op")


class JournalFormatError(ValueError):
    """A line that is not a journal record this code can apply."""


@dataclass(frozen=True, slots=True)
class JournalRecord:
    """One write (``bot.audit.writes``) the database could not take (or, on the direct
    path, is about to), with when and by whom it was made."""

    id: str
    proc: str
    seq: int
    at: str
    write: AuditRecord

    @property
    def op(self) -> str:
        return self.write.OP

    @property
    def run_id(self) -> int | None:
        return getattr(self.write, "run_id", None)

    def to_json(self) -> dict[str, Any]:
        # The same form as before the records were types (format 1): a journal written
        # by an older bot still merges.
        return {
            "v": FORMAT_VERSION,
            "id": self.id,
            "proc": self.proc,
            "seq": self.seq,
            "at": self.at,
            "op": self.op,
            **to_fields(self.write),
        }

    def to_line(self) -> bytes:
        # ensure_ascii: one line whatever the text holds (no raw U+2028 and the like).
        return json.dumps(self.to_json(), separators=(",", ":")).encode() + b"\n"

    @classmethod
    def from_json(cls, obj: Any) -> JournalRecord:
        """Checked whole, so a damaged line is reported, not half-applied."""
        if not isinstance(obj, dict):
            raise JournalFormatError("not a JSON object")
        missing = [k for k in _COMMON if k not in obj]
        if missing:
            raise JournalFormatError(f"missing {', '.join(missing)}")
        if obj["v"] != FORMAT_VERSION:
            raise JournalFormatError(
                f"format version {obj['v']!r} (this bot reads {FORMAT_VERSION})"
            )
        if not isinstance(obj["seq"], int) or not isinstance(obj["id"], str):
            raise JournalFormatError("bad id or seq")
        try:
            write = from_fields(str(obj["op"]), {k: v for k, v in obj.items() if k not in _COMMON})
        except (TypeError, ValueError) as exc:
            raise JournalFormatError(str(exc)) from exc
        return cls(
            id=obj["id"], proc=str(obj["proc"]), seq=obj["seq"], at=str(obj["at"]), write=write
        )


def parse_lines(data: bytes, source: str = "journal") -> list[JournalRecord]:
    """The records in a journal file's bytes, in file order. The part after the last
    newline (an append cut short) is ignored; so is, with a warning, any other line
    that is not a record (a cut append that a later one put a newline after)."""
    records: list[JournalRecord] = []
    *complete, _torn = data.split(b"\n")
    for number, line in enumerate(complete, 1):
        if not line.strip():
            continue
        try:
            records.append(JournalRecord.from_json(json.loads(line)))
        except (ValueError, UnicodeDecodeError) as exc:
            log.warning("%s line %d is not a journal record, skipped: %s", source, number, exc)
    return records


def ordered(records: Iterable[JournalRecord]) -> list[JournalRecord]:
    """Replay order: each process's records in the order it wrote them (``seq``; the
    two files may interleave them), processes by their first record. A run is only
    ever driven by one process, so this keeps every run's records in order."""
    first: dict[str, tuple[str, int]] = {}
    unique: dict[str, JournalRecord] = {}
    for i, r in enumerate(records):
        unique.setdefault(r.id, r)
        first.setdefault(r.proc, (r.at, i))
        first[r.proc] = min(first[r.proc], (r.at, i))
    return sorted(unique.values(), key=lambda r: (first[r.proc], r.proc, r.seq))


def journal_paths(db_path: Path, fallback_dir: Path | None = None) -> tuple[Path, Path]:
    """The journal next to the database, and its fallback elsewhere (named after the
    database's absolute path, so two databases never share one)."""
    db = Path(os.path.abspath(db_path))
    primary = db.with_name(db.name + ".fallback.jsonl")
    tag = hashlib.sha256(str(db).encode()).hexdigest()[:12]
    where = fallback_dir if fallback_dir is not None else Path(tempfile.gettempdir())
    return primary, where / f"chatops-audit-{db.stem}-{tag}.fallback.jsonl"


# ---- the files ----------------------------------------------------------------------------


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (a clean-up may have
    replaced or removed it while we waited for the lock)."""
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        log.debug("fsync of directory %s failed", path, exc_info=True)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def append_to(path: Path, data: bytes) -> None:
    """Append ``data`` (whole lines) to ``path`` and fsync it; on failure the file is cut
    back to where it was, so no half record is left behind. Raises ``OSError``."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            # The fallback directory is made on first use (only the login user reads it).
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if not _same_file(fd, path):
                continue  # replaced or removed by a clean-up meanwhile: open the new one
            size = os.fstat(fd).st_size
            # A previous append cut short left no newline: start on a line of our own.
            prefix = b"\n" if size and os.pread(fd, 1, size - 1) != b"\n" else b""
            try:
                _write_all(fd, prefix + data)
                os.fsync(fd)
            except OSError:
                try:
                    os.ftruncate(fd, size)
                except OSError:
                    log.debug("cannot cut %s back after a failed append", path, exc_info=True)
                raise
            if size == 0:
                _fsync_dir(path.parent)  # the file's name is durable too
            return
        finally:
            os.close(fd)  # also releases the lock


def read_file(path: Path) -> list[JournalRecord]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return []
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        chunks: list[bytes] = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return parse_lines(b"".join(chunks), str(path))


def drop_from(path: Path, ids: Iterable[str]) -> None:
    """Remove the records ``ids`` from ``path`` (they are in the database now): the file
    is rewritten with the others, or removed when none is left."""
    gone = set(ids)
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if not _same_file(fd, path):
                continue
            data = b""
            while chunk := os.pread(fd, 1 << 20, len(data)):
                data += chunk
            keep = [r for r in parse_lines(data, str(path)) if r.id not in gone]
            if not keep:
                os.unlink(path)
            else:
                tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                tmp.write_bytes(b"".join(r.to_line() for r in keep))
                with open(tmp, "rb") as f:
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            _fsync_dir(path.parent)
            return
        finally:
            os.close(fd)


@dataclass
class Journal:
    """The journal's files: ``append`` a record, ``read`` them all, ``drop`` the merged."""

    primary: Path
    fallback: Path | None = None
    # The files whose last append failed: their failure is logged once, not per record.
    _failing: set[Path] = field(default_factory=set, repr=False)

    @classmethod
    def for_db(cls, db_path: Path, fallback_dir: Path | None = None) -> Journal:
        primary, fallback = journal_paths(db_path, fallback_dir)
        return cls(primary, fallback)

    @property
    def paths(self) -> tuple[Path, ...]:
        return (self.primary,) if self.fallback is None else (self.primary, self.fallback)

    def append(self, records: Iterable[JournalRecord]) -> Path:
        """Append the records, in order, to the first file that takes them; returns it.
        Raises ``OSError`` (of the last file tried) when none can."""
        data = b"".join(r.to_line() for r in records)
        error: OSError | None = None
        for path in self.paths:
            try:
                append_to(path, data)
            except OSError as exc:
                # Whatever the reason (full, read-only, gone, not a directory), the next
                # place may take it; the caller holds the records when none does.
                if path not in self._failing:
                    self._failing.add(path)
                    log.warning("cannot append to the audit journal %s: %s", path, exc)
                error = exc
                continue
            if path in self._failing:
                self._failing.discard(path)
                log.warning("the audit journal %s takes records again", path)
            return path
        assert error is not None
        raise error

    def read(self) -> list[JournalRecord]:
        """Every record in every file, in replay order (see ``ordered``)."""
        return ordered(r for path in self.paths for r in read_file(path))

    def drop(self, ids: Iterable[str]) -> None:
        done = list(ids)
        for path in self.paths:
            drop_from(path, done)
