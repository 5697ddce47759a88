"""The audit export (``audit --format jsonl``) over a large log: wall time, output size and
how much the process grew while it streamed.

    ./dev python bench/audit_export.py [--runs 100000]

The runs are written straight into a fresh SQLite file as tests/test_audit_export.py
writes them (two decisions, three steps, a 200-package snapshot and a change per run).
Memory is the process's peak resident size (``ru_maxrss``) before and after the export;
the runs are inserted by a child process, so the growth is the export's alone (pages of
100 runs), not the insert's nor what a test suite left behind. Reported, not asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bot.audit.export import ExportFilter
from bot.audit.store import AuditLog
from bot.cli.audit_export import export_jsonl
from bot.core.redact import Redactor

# The child that writes the runs: the repository on its path for tests/.
_INSERT = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from pathlib import Path; from tests.test_audit_export import insert_runs; "
    "insert_runs(Path(sys.argv[2]), int(sys.argv[3]))"
)


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


async def main(runs: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-export-") as tmp:
        db = Path(tmp) / "audit.db"
        async with AuditLog.open(db) as audit:
            # In a child process, so this one's peak is the export's alone.
            t0 = time.perf_counter()
            subprocess.run(
                [
                    sys.executable,
                    "-c",
                    _INSERT,
                    str(Path(__file__).resolve().parents[1]),
                    str(db),
                    str(runs),
                ],
                check=True,
            )
            inserted = time.perf_counter() - t0
            size = 0

            def write(line: str) -> None:
                nonlocal size
                size += len(line) + 1

            before = _rss_mib()
            t1 = time.perf_counter()
            written = await export_jsonl(audit, write, ExportFilter(), redact=Redactor())
            took = time.perf_counter() - t1
            after = _rss_mib()
        db_mib = db.stat().st_size / 2**20 if db.exists() else 0.0
    print(f"# {platform.python_implementation()} {platform.python_version()}, {runs:,} runs")
    print(
        "| runs | db MiB | written | output MiB | export s | runs/s "
        "| peak RSS before -> after MiB |"
    )
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {runs:,} | {db_mib:.0f} | {written:,} | {size / 2**20:.0f} | {took:.1f} "
        f"| {written / took:,.0f} | {before:.0f} -> {after:.0f} |"
    )
    print(f"(inserting the runs took {inserted:.1f} s)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100_000)
    asyncio.run(main(ap.parse_args().runs))
