"""``dcgmi diag -r 1``'s table, parsed: each test's result, and the error text DCGM
wraps under a failed one.

The table is ``| name | result |`` rows between ``+---+`` rules and ``|----- Section
----|`` headers; a failed test is followed by an ``Error`` (or ``Warning``) row whose
text continues on rows with an empty name (DCGM 3.x). DCGM 4 prints a row per test and
one ``GPU0: Pass`` row per GPU under it. Results are DCGM's words: ``Pass``, ``Fail``,
``Warn``, ``Skip``, ``Not Run``, sometimes with ``- All`` or ``- GPU 3`` after them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

# The value keeps its leading blanks: DCGM 3 wraps a long message at the column's
# width, and a wrapped row starting with a blank is where a word ended.
_ROW = re.compile(r"^\|\s*(?P<name>[^|]*?)\s*\| (?P<value>[^|]*?)\s*\|\s*$")
_DETAIL_CHARS = 400
# dcgmi diag -r 1 takes seconds, but more than a GPU query: its own bound.
DCGM_TIMEOUT_S = 120.0
_HEADER = re.compile(r"^[|+]-+\s*(?P<section>[A-Za-z][A-Za-z ]*?)\s*-+\+")
_METADATA = "Metadata"


class DiagResult(StrEnum):
    PASS = "pass"  # noqa: S105 - a test result, not a password
    FAIL = "fail"
    WARN = "warn"
    SKIP = "skip"
    NOT_RUN = "not run"


@dataclass(frozen=True, slots=True)
class DiagTest:
    section: str  # "Deployment"
    name: str  # "Persistence Mode"
    result: DiagResult
    detail: str = ""  # the Error/Warning text under it, joined


@dataclass(frozen=True, slots=True)
class DiagReport:
    ran: bool  # the "Successfully ran diagnostic" line and a table were there
    tests: tuple[DiagTest, ...]

    def failed(self) -> tuple[DiagTest, ...]:
        return tuple(t for t in self.tests if t.result == DiagResult.FAIL)

    def warned(self) -> tuple[DiagTest, ...]:
        return tuple(t for t in self.tests if t.result == DiagResult.WARN)


def _result(value: str) -> DiagResult | None:
    word = value.strip().split(" - ")[0].strip().casefold()
    for r in DiagResult:
        if word == r.value:
            return r
    return None


def parse_diag(text: str) -> DiagReport:
    tests: list[DiagTest] = []
    section = ""
    detail: list[str] = []

    def close() -> None:
        if detail and tests:
            last = tests[-1]
            joined = "".join(detail).strip()[:_DETAIL_CHARS]
            tests[-1] = DiagTest(last.section, last.name, last.result, joined)
        detail.clear()

    for line in text.splitlines():
        line = line.rstrip()
        if h := _HEADER.match(line):
            close()
            section = h.group("section")
            continue
        m = _ROW.match(line)
        if m is None or section in ("", _METADATA):
            continue
        name, value = m.group("name"), m.group("value")
        result = _result(value)
        if name in ("Error", "Warning") or (not name and detail):
            detail.append(value)
            continue
        if result is None or not name:
            continue  # DCGM 4's per-GPU rows ("GPU0: Pass") repeat their test's result
        close()
        tests.append(DiagTest(section, name, result))
    close()
    ran = "Successfully ran diagnostic" in text and bool(tests)
    return DiagReport(ran, tuple(tests))
