"""``dcgmi diag``'s table, parsed: each test's result, and the error text DCGM wraps
under a failed one.

The table is ``| name | result |`` rows between ``+---+`` rules and ``|----- Section
----|`` headers. A test whose GPUs did not all end the same prints its first result on
the named row and the others on rows with an empty name (DCGM 3.x: ``Pass - GPUs: 0, 2,
3`` then ``Fail - GPU: 1``, in the order Pass, Fail, Warn, Skip); DCGM 4 prints one
``GPU0: Pass`` row per GPU under the test's row. A test's result is the worst one its
rows show. Under a test come ``Error``/``Warning`` rows (DCGM 4: ``Warning: GPU0``),
whose text continues on rows with an empty name, and ``Info`` rows, which are DCGM's
notes and judge nothing. Results are DCGM's words: ``Pass``, ``Fail``, ``Warn``,
``Skip``, ``Not Run``, sometimes with ``- All`` or ``- GPU 3`` after them; a result row
in any other words is ``unknown``, never a pass.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum, StrEnum, auto
from typing import assert_never

# The value keeps its leading blanks: DCGM 3 wraps a long message at the column's
# width, and a wrapped row starting with a blank is where a word ended.
_ROW = re.compile(r"^\|\s*(?P<name>[^|]*?)\s*\| (?P<value>[^|]*?)\s*\|\s*$")
_DETAIL_CHARS = 400
# dcgmi diag -r 1 takes seconds, but more than a GPU query: its own bound.
DCGM_TIMEOUT_S = 120.0
_HEADER = re.compile(r"^[|+]-+\s*(?P<section>[A-Za-z][A-Za-z ]*?)\s*-+\+")
_METADATA = "Metadata"
# DCGM 4's per-entity row: "GPU0: Pass" (also "CPU0: ..." where CPUs are tested).
_ENTITY = re.compile(r"^[A-Za-z]+\d+:\s*")


class DiagResult(StrEnum):
    PASS = "pass"  # noqa: S105 - a test result, not a password
    FAIL = "fail"
    WARN = "warn"
    SKIP = "skip"
    NOT_RUN = "not run"
    UNKNOWN = "unknown"  # a result row in words DCGM's table does not use


# Worst last. An unknown result ranks under Warn, so that a note DCGM prints under a
# warned test (the Diagnostic's "Code: (...)") keeps it Warn, and over Pass and Skip,
# so that it never reads as one.
_RANK = (
    DiagResult.PASS,
    DiagResult.NOT_RUN,
    DiagResult.SKIP,
    DiagResult.UNKNOWN,
    DiagResult.WARN,
    DiagResult.FAIL,
)


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
        return self._with(DiagResult.FAIL)

    def warned(self) -> tuple[DiagTest, ...]:
        return self._with(DiagResult.WARN)

    def unknown(self) -> tuple[DiagTest, ...]:
        return self._with(DiagResult.UNKNOWN)

    def skipped(self) -> tuple[DiagTest, ...]:
        return tuple(t for t in self.tests if t.result in (DiagResult.SKIP, DiagResult.NOT_RUN))

    def _with(self, result: DiagResult) -> tuple[DiagTest, ...]:
        return tuple(t for t in self.tests if t.result == result)


class _Under(Enum):
    """What a row with an empty name continues."""

    TEST = auto()  # the test's own rows: another of its results
    DETAIL = auto()  # an Error/Warning row's wrapped text
    NOTE = auto()  # an Info row's wrapped text, or rows before any test


def _result(value: str) -> DiagResult:
    word = _ENTITY.sub("", value.strip()).split(" - ")[0].strip().casefold()
    for r in DiagResult:
        if r != DiagResult.UNKNOWN and word == r.value:
            return r
    return DiagResult.UNKNOWN


def _worst(a: DiagResult, b: DiagResult) -> DiagResult:
    return max(a, b, key=_RANK.index)


def _kind(name: str) -> _Under:
    """A named row: a test (``TEST``), an Error/Warning (``DETAIL``) or an Info (``NOTE``)."""
    head = name.split(":")[0]
    if head in ("Error", "Warning"):
        return _Under.DETAIL
    if head == "Info":
        return _Under.NOTE
    return _Under.TEST


def parse_diag(text: str) -> DiagReport:
    tests: list[DiagTest] = []
    section = ""
    under = _Under.NOTE
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
            section, under = h.group("section"), _Under.NOTE
            continue
        m = _ROW.match(line)
        if m is None or section in ("", _METADATA):
            continue
        name, value = m.group("name"), m.group("value")
        if name:
            under = _kind(name)
            if under == _Under.TEST:
                close()
                tests.append(DiagTest(section, name, _result(value)))
        match under:
            case _Under.DETAIL:
                if name and detail:  # a second message under the same test
                    detail.append(" ")
                detail.append(value)
            case _Under.TEST if not name:
                last = tests[-1]
                lowered = _worst(last.result, _result(value))
                tests[-1] = DiagTest(last.section, last.name, lowered, last.detail)
            case _Under.TEST | _Under.NOTE:
                pass
            case unreachable:
                assert_never(unreachable)
    close()
    ran = "Successfully ran diagnostic" in text and bool(tests)
    return DiagReport(ran, tuple(tests))
