"""``python -m bot audit --format jsonl`` (issue 22 item 2): every run with its decisions,
steps, package changes and snapshot digests, a JSON object a line; streamed a page at a
time (the same memory peak for 1,000 and 5,000 runs, measured with tracemalloc),
``--follow`` driven by an injected sleep (no test waits), and the CLI as a subprocess
after a real redeploy."""

from __future__ import annotations

import json
import sqlite3
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.audit.export import ExportFilter
from bot.audit.store import AuditLog
from bot.cli import setup_commands
from bot.cli.audit_export import export_filter, export_jsonl, export_line
from bot.core.doctor_types import Check, Outcome
from bot.core.redact import MASK, Redactor
from bot.errors import InputError
from bot.settings import Settings
from bot.sim.kit import SERVICE, SimKit
from bot.sim.state import DEFAULT_VERSION
from tests.support.audit_db import Target, raw_many, raw_rows
from tests.support.cli import cli, write_toml

TAIL = "x" * 300


def insert_runs(
    db: Target, count: int, *, start: int = 1, status: str = "succeeded", service: str = "svc"
) -> None:
    """``count`` runs written straight into the tables, each with two decisions, three
    steps, a snapshot and an install's change: what a real run leaves, without running."""
    ids = range(start, start + count)
    raw_many(
        db,
        "INSERT INTO runs (id, service, action, hosts, requested_by, source, plan, "
        "status, created_at, version_before, version_after) "
        "VALUES (?, ?, 'redeploy', '[\"h1\"]', 'U0ALICE', 'slack', '{}', ?, ?, "
        "'0.30.0', '0.31.0')",
        [(i, service, status, f"2026-11-{1 + i % 28:02d}T10:00:00Z") for i in ids],
    )
    raw_many(
        db,
        "INSERT INTO decisions (run_id, \"user\", decision, at) VALUES (?, ?, 'approve', ?)",
        [(i, u, "2026-11-01T10:00:01Z") for i in ids for u in ("U0BOB", "U0CAROL")],
    )
    raw_many(
        db,
        "INSERT INTO steps (run_id, host, step, command, status, exit_status, "
        "started_at, finished_at, duration_s, output_tail) "
        "VALUES (?, 'h1', ?, 'cmd', 'ok', 0, 't0', 't1', 1.5, ?)",
        [(i, step, TAIL) for i in ids for step in ("preflight", "stop", "install")],
    )
    freeze = json.dumps({"freeze": {f"pkg{n}": "1.0" for n in range(200)}, "sha256": "ab"})
    raw_many(
        db,
        "INSERT INTO environments (run_id, host, kind, taken_at, data) VALUES (?, 'h1', ?, "
        "'t0', ?)",
        [
            row
            for i in ids
            for row in (
                (i, "snapshot", freeze),
                (
                    i,
                    "installed",
                    json.dumps({"changes": [{"name": "vllm", "before": "a", "after": "b"}]}),
                ),
            )
        ],
    )


async def _export(audit: AuditLog, flt: ExportFilter | None = None) -> list[Any]:
    lines: list[str] = []
    await export_jsonl(audit, lines.append, flt or ExportFilter(), redact=Redactor())
    return [json.loads(line) for line in lines]


async def test_each_run_is_one_line_with_its_decisions_steps_and_snapshot(
    audit_target: Target,
) -> None:
    db = audit_target
    async with AuditLog.open(db) as audit:
        insert_runs(db, 3)
        insert_runs(db, 1, start=4, service="other")
        raw_rows(
            db,
            "INSERT INTO host_outcomes (run_id, host, status, summary, service_state, at) "
            "VALUES (1, 'h1', 'succeeded', 'ok', 'up', 't2')",
        )
        raw_rows(
            db,
            'INSERT INTO leftover_approvals (run_id, host, question, "user", pids, at) '
            "VALUES (1, 'h1', 'q', 'U0BOB', '[48304, 48305]', 't1')",
        )
        raw_rows(
            db,
            "INSERT INTO rotations (run_id, host, router, server, change, ok, detail, at) "
            "VALUES (2, 'h1', 'lb', 's1', 'out', 1, 'drained', 't3')",
        )
        raw_rows(
            db,
            "INSERT INTO release_switches "
            "(run_id, service, host, from_release, to_release, kind, at) "
            "VALUES (2, 'svc', 'h1', '0.15.1-a', '0.16.0-b', 'switch_back', 't4')",
        )
        rows = await _export(audit)
        assert [r["id"] for r in rows] == [1, 2, 3, 4]
        first = rows[0]
        assert first["export_version"] == 1
        assert (first["service"], first["action"], first["status"]) == (
            "svc",
            "redeploy",
            "succeeded",
        )
        assert [d["user"] for d in first["decisions"]] == ["U0BOB", "U0CAROL"]
        assert [s["step"] for s in first["steps"]] == ["preflight", "stop", "install"]
        assert first["steps"][0]["exit_status"] == 0 and first["steps"][0]["duration_s"] == 1.5
        assert first["snapshots"] == [
            {"host": "h1", "taken_at": "t0", "sha256": "ab", "lock": None}
        ]
        # The freeze itself stays in the database: only its digest is exported.
        assert "pkg1" not in json.dumps(first)
        assert first["package_changes"][0]["changes"] == [
            {"name": "vllm", "before": "a", "after": "b"}
        ]
        assert first["host_outcomes"] == [
            {
                "host": "h1",
                "status": "succeeded",
                "service_state": "up",
                "summary": "ok",
                "at": "t2",
            }
        ]
        assert first["leftover_approvals"] == [
            {"host": "h1", "user": "U0BOB", "pids": [48304, 48305], "at": "t1"}
        ]
        assert first["rotations"] == [] and rows[1]["host_outcomes"] == []
        assert rows[1]["rotations"] == [
            {
                "host": "h1",
                "router": "lb",
                "server": "s1",
                "change": "out",
                "ok": True,
                "detail": "drained",
                "at": "t3",
            }
        ]
        assert first["release_switches"] == []
        assert rows[1]["release_switches"] == [
            {
                "host": "h1",
                "from_release": "0.15.1-a",
                "to_release": "0.16.0-b",
                "kind": "switch_back",
                "at": "t4",
            }
        ]
        assert [r["id"] for r in await _export(audit, ExportFilter(service="other"))] == [4]
        # Runs 1..4 were requested on 2026-11-02..05: since is inclusive, until exclusive.
        window = export_filter(
            service=None, since="2026-11-03", until="2026-11-05T00:00:00Z", follow=False
        )
        assert [r["id"] for r in await _export(audit, window)] == [2, 3]


async def _export_peak(tmp_path: Path, count: int) -> tuple[int, int]:
    """Export ``count`` runs: how much was written, and the most memory held meanwhile."""
    db = tmp_path / f"audit-{count}.db"
    async with AuditLog.open(db) as audit:
        insert_runs(db, count)
        seen = 0
        size = 0
        last = 0

        def write(line: str) -> None:
            nonlocal seen, size, last
            seen += 1
            size += len(line)
            run_id = int(line[line.index('"id":') + 5 : line.index(',"service"')])
            assert run_id == last + 1
            last = run_id

        tracemalloc.start()
        try:
            written = await export_jsonl(audit, write, ExportFilter(), redact=Redactor())
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert written == seen == count
    return size, peak


async def test_memory_stays_bounded_whatever_the_number_of_runs(tmp_path: Path) -> None:
    # Bounded means it does not grow with the log: five times the runs, five times the
    # output, about the same peak (a page of 100 runs and their rows; measured about
    # 1.5 MB either way). Holding every run would make the peak grow with the output.
    small, small_peak = await _export_peak(tmp_path, 1_000)
    big, big_peak = await _export_peak(tmp_path, 5_000)
    assert big > 4.5 * small and big > 5_000_000
    assert big_peak < 1.5 * small_peak + 500_000, (small_peak, big_peak)
    assert big_peak < 6_000_000, f"peak {big_peak} bytes"


class _Stop(Exception):
    pass


async def test_follow_writes_each_run_once_when_it_finishes(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    async with AuditLog.open(db) as audit:
        insert_runs(db, 2)
        insert_runs(db, 1, start=3, status="running")
        naps: list[float] = []
        lines: list[str] = []

        async def sleep(seconds: float) -> None:
            naps.append(seconds)
            if len(naps) == 1:
                # While the exporter sleeps: run 3 ends, 4 ends, 5 waits for approval.
                conn = sqlite3.connect(db)
                with conn:
                    conn.execute("UPDATE runs SET status = 'rolled_back' WHERE id = 3")
                conn.close()
                insert_runs(db, 1, start=4, status="failed")
                insert_runs(db, 1, start=5, status="pending_approval")
            elif len(naps) == 3:
                raise _Stop

        with pytest.raises(_Stop):
            await export_jsonl(
                audit, lines.append, ExportFilter(), redact=Redactor(), follow=True, sleep=sleep
            )
    rows = [json.loads(line) for line in lines]
    assert [(r["id"], r["status"]) for r in rows] == [
        (1, "succeeded"),
        (2, "succeeded"),
        (3, "rolled_back"),
        (4, "failed"),
    ]
    assert naps == [2.0, 2.0, 2.0]


def test_bad_times_are_refused_with_the_option_named() -> None:
    with pytest.raises(InputError, match="--since 'yesterday' is not a time"):
        export_filter(service=None, since="yesterday", until=None, follow=False)
    with pytest.raises(InputError, match="takes no --until"):
        export_filter(service=None, since=None, until="2026-12-01", follow=True)
    with pytest.raises(InputError, match="must be before --until"):
        export_filter(service=None, since="2026-12-02", until="2026-12-01", follow=False)
    # A time with an offset is converted to UTC.
    flt = export_filter(service=None, since="2026-12-03T12:00:00+02:00", until=None, follow=False)
    assert flt.since == "2026-12-03T10:00:00Z"


async def test_cli_exports_a_real_redeploy_as_jsonl(sim_host: SimKit, tmp_path: Path) -> None:
    config = write_toml(tmp_path / "chatops.toml", sim_host.settings_fragment())
    env = {"CHATOPS_CONFIG": str(config), "CHATOPS_DB": str(tmp_path / "audit.db")}
    code, out, err = await cli(
        "redeploy", SERVICE, "--version", "0.31.0", "--yes", cwd=tmp_path, env=env
    )
    assert code == 0, err + out
    code, out, err = await cli("audit", "--format", "jsonl", cwd=tmp_path, env=env)
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 1
    run = json.loads(lines[0])
    assert (run["service"], run["status"], run["version_after"]) == (
        SERVICE,
        "succeeded",
        "0.31.0",
    )
    assert run["decisions"][0]["decision"] == "approve"
    assert [(o["host"], o["status"]) for o in run["host_outcomes"]] == [("gpu-node-1", "succeeded")]
    steps = {s["step"]: s for s in run["steps"]}
    assert steps["reinstall"]["exit_status"] == 0 and steps["reinstall"]["duration_s"] >= 0
    assert steps["reinstall"]["output_tail"]
    assert len(run["snapshots"]) == 1 and len(run["snapshots"][0]["sha256"]) == 64
    installed = next(c for c in run["package_changes"] if c["kind"] == "installed")
    vllm = {"name": "vllm", "before": DEFAULT_VERSION, "after": "0.31.0"}
    assert vllm in installed["changes"]

    code, out, err = await cli(
        "audit", "--format", "jsonl", "--since", "2999-01-01", cwd=tmp_path, env=env
    )
    assert (code, out) == (0, "")
    code, out, err = await cli(
        "audit", "--format", "jsonl", "--service", "nope", cwd=tmp_path, env=env
    )
    assert (code, out) == (0, "")
    code, _, err = await cli("audit", "--format", "csv", cwd=tmp_path, env=env)
    assert code == 2 and "the one format is jsonl" in err
    code, _, err = await cli("audit", "--since", "2026-01-01", cwd=tmp_path, env=env)
    assert code == 2 and "go with --format jsonl" in err


async def test_the_readme_documents_every_exported_field(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    async with AuditLog.open(db) as audit:
        insert_runs(db, 1)
        (run,) = await _export(audit)
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme.split("### Audit export", 1)[1].split("\n## ", 1)[0]
    for key in run:
        assert f"`{key}`" in table, key
    for key in run["steps"][0]:
        assert key in table.split("| `steps` |", 1)[1].split("\n", 1)[0], key


# ---- host text that ends in a secret's key -----------------------------------------------

# A step's output tail is cut to its last characters, so it can end anywhere: here right
# after a secret's key, as `env` or a `set -x` trace prints an assignment.
CUT_TAILS = ("+ export HF_TOKEN=", "DB_PASSWORD=", "Authorization: Bearer ", 'api_key: "')


async def test_host_text_ending_in_a_secret_key_leaves_every_line_valid_json(
    tmp_path: Path,
) -> None:
    # The redactor ran over the serialized line: `token=` at a value's end took the
    # quote and comma after it (`"HF_TOKEN=***started_at":...`), the line was no JSON, and
    # a log shipper dropped the run.
    db = tmp_path / "audit.db"
    async with AuditLog.open(db):
        insert_runs(db, len(CUT_TAILS))
    for run_id, tail in enumerate(CUT_TAILS, 1):
        raw_rows(db, "UPDATE steps SET output_tail = ? WHERE run_id = ?", (tail, run_id))
    raw_rows(
        db,
        "INSERT INTO host_outcomes (run_id, host, status, summary, service_state, at) "
        "VALUES (1, 'h1', 'failed', 'uv said: password=hunter2secret', 'down', 't2')",
    )
    config = write_toml(
        tmp_path / "chatops.toml",
        {
            "hosts": {"h1": {"address": "local"}},
            "services": {"svc": {"hosts": ["h1"], "unit": "u", "python": "/o/bin/python"}},
        },
    )
    env = {"CHATOPS_CONFIG": str(config), "CHATOPS_DB": str(db)}
    code, out, err = await cli("audit", "--format", "jsonl", cwd=tmp_path, env=env)
    assert code == 0, err
    runs = [json.loads(line) for line in out.splitlines()]  # each line parses
    assert [r["id"] for r in runs] == [1, 2, 3, 4]
    for run, tail in zip(runs, CUT_TAILS, strict=True):
        # each tail as masking it alone leaves it ("Bearer" read as the header's value)
        assert {s["output_tail"] for s in run["steps"]} == {Redactor()(tail)}
        assert run["steps"][1]["started_at"] == "t0"  # the next field is whole
    assert runs[0]["host_outcomes"][0]["summary"] == f"uv said: password={MASK}"
    assert "hunter2secret" not in out


SECRET = "Zq8vLm2XpR4tKw9N"  # a literal secret of the settings (a Slack token's, say)
# Host text: pieces that break naive JSON or masking, in any order.
_TEXT = st.lists(
    st.sampled_from([*"ab Z09=:;,'\"{}[]\n\t/@-_.", "token=", "password=", "é", "\u2028", "\x1b"]),
    max_size=12,
).map("".join)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=20,
)


def _paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Where a string could be put: every string leaf, every key, every list."""
    if isinstance(value, dict):
        return [at] + [p for k, v in value.items() for p in _paths(v, (*at, k))]
    if isinstance(value, list):
        return [at] + [p for i, v in enumerate(value) for p in _paths(v, (*at, i))]
    return [at] if isinstance(value, str) else []


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


@settings(max_examples=150, deadline=None)
@given(
    record=st.dictionaries(_TEXT, _JSON, min_size=1, max_size=6),
    pick=st.integers(min_value=0),
    before=_TEXT,
    after=_TEXT,
    shape=st.sampled_from(["{s}", "token={s}", "DB_PASSWORD={s} ", "https://u:{s}@h/"]),
)
def test_every_line_parses_and_no_secret_reaches_it(
    record: dict[str, Any], pick: int, before: str, after: str, shape: str
) -> None:
    # A secret put into any field (a value, a key, an element), with any host text on
    # either side: the line is one JSON object, and the secret is in none of its strings.
    redact = Redactor([SECRET])
    paths = _paths(record)
    path = paths[pick % len(paths)]
    text = f"{before} {shape.format(s=SECRET)} {after}"
    node: Any = record
    for key in path[:-1]:
        node = node[key]
    last = path[-1] if path else None
    if path and isinstance(node[last], str):
        node[last] = text
    elif path and isinstance(node[last], dict):
        node[last][text] = 1
    elif path:
        node[last].append(text)
    else:
        record[text] = text
    line = export_line(record, redact)
    assert line.endswith("\n") and "\n" not in line[:-1]
    parsed = json.loads(line)
    assert isinstance(parsed, dict)
    assert not any(SECRET in s for s in _strings(parsed)), line
    assert SECRET not in line


async def test_doctor_json_stays_one_json_document_whatever_a_check_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # `doctor --json` prints checks whose detail is a host's words (stderr, a command's
    # last lines), cut anywhere: masked after serializing, `token=` at a detail's end
    # took the `", "fix": "` after it and the output was no JSON.
    settings = Settings(
        hosts={"h1": {"address": "local"}},
        services={"svc": {"hosts": ["h1"], "unit": "u", "python": "/o/bin/python"}},
        db_path=tmp_path / "audit.db",
    )
    said = [*CUT_TAILS, "uv said: password=hunter2secret"]
    checks = [Check("h1", "svc", "uv", Outcome.FAIL, text, "fix it") for text in said]

    async def host_checks(*_: object) -> list[Check]:
        return checks

    monkeypatch.setattr(setup_commands, "run_doctor", host_checks)
    code = await setup_commands.doctor(
        settings, None, as_json=True, config=tmp_path / "chatops.toml"
    )
    out = capsys.readouterr().out
    assert code == 1
    rows = json.loads(out)  # one document, every field whole
    from_hosts = [r for r in rows if r["host"] == "h1"]
    assert [r["detail"] for r in from_hosts] == [
        *(Redactor()(t) for t in CUT_TAILS),
        f"uv said: password={MASK}",
    ]
    assert {r["fix"] for r in from_hosts} == {"fix it"}
    assert "hunter2secret" not in out
