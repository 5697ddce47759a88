"""``doctor``'s report: one table of every check, and the verdict under it."""

from __future__ import annotations

from collections.abc import Sequence

from bot.core import table
from bot.core.doctor_judges import passed
from bot.core.doctor_types import Check, Outcome

_MARK = {Outcome.OK: "ok", Outcome.WARN: "WARN", Outcome.FAIL: "FAIL", Outcome.SKIP: "skip"}
_COLUMNS = tuple(table.Column(h) for h in ("HOST", "SERVICE", "CHECK", "RESULT"))


def render(checks: Sequence[Check]) -> str:
    """One table: host, service, check, result, detail (and the fix under a failure)."""
    rows = [(c.host, c.service or "-", c.name, _MARK[c.outcome]) for c in checks]
    lay = table.layout(_COLUMNS, rows)
    lines = [lay.header("DETAIL")]
    for c, row in zip(checks, rows, strict=True):
        lines.append(lay.line(row, c.detail))
        if c.fix and c.outcome in (Outcome.FAIL, Outcome.WARN):
            # Under the detail, so a failure's remedy is read with it.
            lines.append(" " * lay.tail_at + "  fix: " + c.fix)
    fails = sum(c.outcome == Outcome.FAIL for c in checks)
    warns = sum(c.outcome == Outcome.WARN for c in checks)
    verdict = (
        "all checks passed"
        if passed(checks) and not warns
        else f"all checks passed, {warns} warning(s)"
        if passed(checks)
        else f"{fails} check(s) failed, {warns} warning(s)"
    )
    return "\n".join(lines) + f"\n\n{verdict}"
