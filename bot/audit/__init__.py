"""The audit log: every run, decision, step, GPU snapshot, refusal and lock, in SQLite.

Modules: ``store`` (``AuditLog``, what the rest of the bot calls, joined from the parts
``run_store``, ``evidence_store`` and ``coordination_store`` over ``store_base``),
``records`` (the frozen records it returns, the timestamp form), ``db`` (opening the
file, the one transaction helper), one module of plain SQL functions per table
(``runs``, ``steps``, ``decisions``, ``leftover_approvals``, ``snapshots``,
``refusals``, ``locks``, ``sightings``),
``redaction``, ``migrations`` (the schema) and ``view`` (tables and JSON for people and
programs).

Schema (created by ``bot.audit.migrations``; every timestamp is TEXT
``YYYY-MM-DDTHH:MM:SSZ`` in UTC, so string order is time order; every ``run_id`` is a
foreign key to ``runs``, enforced):

``runs``
    id (AUTOINCREMENT, never reused), service, action (``Action``:
    redeploy|restart|status), hosts (JSON array), requested_by, source
    (``Source``: slack|cli|demo), channel, message_ts (the Slack card's ts), plan
    (JSON object), package_spec, index_name, dry_run (0/1), status (``RunStatus``),
    current_step, summary, version_before, version_after, created_at, started_at
    (first entry into ``running``), finished_at (entry into a final status),
    expires_at (end of the approval window), owner (the process driving the run,
    ``host/boot=<boot id>/pidns=<inode>:pid:start-time``, or ``host:pid:start-time``
    from before issue 17, see ``bot.engine.owner``; NULL until a process takes it;
    added by ``0002_run_owner``), lease_until (until when that process vouches for
    the run, by its own wall clock: its heartbeat renews it every few seconds, see
    ``bot.engine.heartbeat``; added by ``0003_run_lease``), recovery_told_at (when
    the Slack thread of a run recovered from a dead driver was told, so it is told
    once, even when a CLI recovered it; added by ``0005_recovery_told``),
    lease_renewals (how many times the heartbeat renewed the lease: what a process
    that cannot see the owner's PIDs watches change on its own monotonic clock;
    0 by default; added by ``0007_lease_renewals``), expires_clock (whose wall clock
    wrote expires_at: the requesting machine's boot id; NULL before
    ``0008_expires_clock``), service_state (how the run left the service,
    ``ServiceState``; NULL when not recorded; added by ``0010_service_state``),
    scheduled_at (UTC start of a run approved for later with ``--at``; NULL: at once),
    override (1: asked for outside its maintenance window with ``--now``; both added by
    ``0012_schedule``), epoch (the fencing token of its ownership: one more at each
    change of owner and at a recovery; each write of its driver checks it, see
    ``bot.audit.fence``), lease_expires (the end of the owner's lease by the
    database's clock, in seconds since the epoch), cancel_requested_by (a cancel asked
    on a replica that does not drive it, for the driver's next heartbeat), expires_db
    (the end of the approval window by the database's clock, what replicas expire a card
    by; all four added by ``0013_replicas``).
    Indexes: (service, id DESC), (status, id DESC), (status, scheduled_at).
``decisions``
    id, run_id, user, decision (``Decision``: approve|deny|cancel|recover|terminate;
    recover: who marked the run of a dead driver interrupted; terminate: the approver who
    let a running run end its leftover processes), at;
    UNIQUE(run_id, user, decision) so a double click counts once.
``leftover_approvals``
    id, run_id, host, question (the id of the question on the card, the nonce in its
    button), user, pids (JSON array: exactly the PIDs that question listed), at: each
    approver's go to terminate the processes that outlived the stop on one host (issue
    17; added by ``0009_leftover_approvals``); UNIQUE(run_id, host, question, user).
    Index: (run_id).
``steps``
    id, run_id, host, step, command (as run, e.g. ``shlex.join(argv)``), status
    (``StepStatus`` less ``pending``: running|ok|failed|skipped|interrupted),
    exit_status, started_at, finished_at, duration_s, output_tail (last
    ``OUTPUT_TAIL_CHARS`` characters, redacted before the cut; '' by default).
    Index: (run_id).
``gpu_snapshots``
    id, run_id (NULL for ad-hoc status queries), host, label, taken_at, data (JSON).
    Index: (run_id).
``environments``
    id, run_id, host, kind (``bot.core.packages.EnvKind``: preview|planned|snapshot|
    installed|restored), taken_at, data (JSON: ``changes`` [{name, before, after}] and
    ``unchanged`` for a change; for a snapshot ``freeze`` {name: version}, ``others``,
    ``sha256`` and ``lock``, the file on the host a rollback syncs to; ``note`` when a
    set could not be read): what each run did to a host's whole Python environment
    (issue 10; added by ``0006_environments``). Index: (run_id).
``host_outcomes``
    id, run_id, host, status, summary, service_state (``ServiceState`` or NULL), at:
    how each host of a run ended (issue 18; added by ``0010_service_state``, which also
    gives ``runs`` its ``service_state``). Index: (run_id).
``rotations``
    id, run_id, host, router, server, change (out|in), ok (1: the router took it),
    detail, at: every change of a replica's place in its router's rotation a run made
    (issue 19; added by ``0011_rotations``); who made it is the run's requester and
    approvers. Indexes: (run_id), (router, server).
``release_switches``
    id, run_id, service, host, from_release (the release the link pointed at; NULL:
    no release), to_release, kind (switch|switch_back: a run's switch to the release
    it deploys, or the switch back after that release failed), at: every switch of a
    side-by-side service's link the bot made, what a rollback by hand goes by
    (``bot.audit.release_switches``; added by ``0014_release_switches``). Indexes:
    (run_id), (service, host, id).
``refusals``
    id, at, user, channel, command (as typed), reason: one row per refused command or
    click.
``locks``
    scope PRIMARY KEY (``service:<name>`` / ``host:<name>``), run_id, acquired_at.
    Index: (run_id). Held across restarts; a run entering a final status drops its
    locks in the same transaction, so a finished run can never keep a service locked.
``journal_applied``
    id (a fallback-journal record's id, PRIMARY KEY), row_id (the row it created: a
    step's id, or NULL), applied_at, rejected (NULL, or the record and why the
    database refused it, as JSON): the records a merge of the fallback journal has
    written, so a journal replayed twice is applied once (``bot.audit.replay``; added
    by ``0004_journal_applied``).
``lease_sightings``
    run_id, clock (a monotonic clock's id, ``bot.engine.clocks``), token (what was
    seen of the run: status, owner, lease and renewals, or a pending card's deadline),
    seen (that clock's reading when the token was first seen); PRIMARY KEY (run_id,
    clock): what each clock's judge saw of the runs in flight, so it can tell how long
    nothing changed (``bot.engine.liveness``; added by ``0007_lease_renewals``; rows
    of finished runs are dropped at the next sighting).
``leases``
    name PRIMARY KEY (``leader``), holder (a replica's owner string), epoch (one
    more at each change of holder), expires (by the database's clock, seconds since
    the epoch): named leases of one replica at a time (issue 21; added by
    ``0013_replicas``; ``bot.engine.leader``).
``leftover_questions``
    question PRIMARY KEY (the id in its button), run_id, host, ask (the text on the
    card), pids (JSON array), asked_at, closed_at (NULL while open), approved_by (who
    made it enough, NULL until then): a driving replica's open question to terminate
    leftover processes, so a press on any replica answers it (issue 21; added by
    ``0013_replicas``). Index: (run_id).
``_migrations``
    name PRIMARY KEY, applied_at: the migrations this file has had (PostgreSQL's
    also keeps seq, the order they were applied in).

Behaviour worth knowing:

* Durability: WAL with ``synchronous=FULL``; every public write is one transaction,
  committed before the call returns, so ``kill -9`` at any moment loses at most the
  call in flight.
* Concurrency: one connection per ``AuditLog``; an ``asyncio.Lock`` serialises its
  transactions, and ``BEGIN IMMEDIATE`` plus a busy timeout serialise writers across
  processes (bot and CLI), which is what makes ``transition`` and ``acquire_locks``
  race-free. Each call runs in its own task shielded from cancellation, so a caller
  cancelled mid-write never leaves the connection inside a half-done transaction
  (``bot.audit.db``).
* Redaction: every free-text value (and every string inside JSON values) passes
  through ``redact`` before it is stored. Enumerated values (status, action, source,
  decision) are checked against the enums of ``bot.core.status`` instead, and lock
  scopes are stored as given because they are keys.
* Enumerations are checked in Python, not by CHECK constraints, so a later status
  needs no table rebuild and an older bot can still open a newer database; a row
  holding a word this bot does not know reads as an ``AuditError`` naming it.
* A database written by a newer bot (migration names this code does not know) opens,
  with a warning logged and the names in ``unknown_migrations``: migrations are kept
  additive precisely so that this is safe.
* Record timestamps are the stored ISO strings; ``parse_ts``/``format_ts`` convert.
"""

from bot.audit.records import (
    EXPIRED_SUMMARY,
    OUTPUT_TAIL_CHARS,
    DecisionRecord,
    Refusal,
    RunRecord,
    SnapshotRecord,
    StepRecord,
    format_ts,
    parse_ts,
)
from bot.audit.store import AuditLog
from bot.core.status import ACTIVE_STATUSES, FINAL_STATUSES

__all__ = [
    "ACTIVE_STATUSES",
    "EXPIRED_SUMMARY",
    "FINAL_STATUSES",
    "OUTPUT_TAIL_CHARS",
    "AuditLog",
    "DecisionRecord",
    "Refusal",
    "RunRecord",
    "SnapshotRecord",
    "StepRecord",
    "format_ts",
    "parse_ts",
]
