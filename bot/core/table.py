"""One fixed-width table renderer for every table the bot prints (issue 18).

The GPU table, the fleet's host lines, ``audit``'s runs, the operator's ``runs`` and the
doctor's report all have the same shape: a row of fixed columns, each as wide as its
widest cell (header included), left or right aligned, two spaces apart; then, on some, a
free last column (processes, a check's detail) that is not padded and gets whatever room
the line has left. Every line ends without trailing spaces: a Slack code block or a
terminal shows them as nothing, and tests comparing text would trip on them.

Pure: what a cell may contain (no control characters, no backticks) is the caller's
business, since each table has its own rule for text that came from a host.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, assert_never

Align = Literal["left", "right"]
ELLIPSIS = "…"
GAP = "  "


@dataclass(frozen=True, slots=True)
class Column:
    header: str
    align: Align = "left"
    # The widest a cell may get; a longer one is cut with an ellipsis (None: never cut),
    # so one odd value cannot push every other row off a Slack code block.
    max_width: int | None = None

    def fit(self, cell: str) -> str:
        return cell if self.max_width is None else cut(cell, self.max_width)


def cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, its end replaced by an ellipsis if cut."""
    return text if len(text) <= width else text[: max(width - 1, 0)] + ELLIPSIS


@dataclass(frozen=True, slots=True)
class Layout:
    """The fixed columns with their widths, ready to set lines in."""

    columns: tuple[Column, ...]
    widths: tuple[int, ...]
    gap: str = GAP

    @property
    def tail_at(self) -> int:
        """Where the free last column starts on a line (after the fixed ones and a gap)."""
        return sum(self.widths) + len(self.gap) * len(self.columns)

    def room(self, limit: int) -> int:
        """How wide the free last column may be for a line of at most ``limit``."""
        return limit - self.tail_at

    def line(self, cells: Sequence[str], tail: str = "") -> str:
        """One line: ``cells`` fitted, padded and aligned, then ``tail`` as it is."""
        return self._set(
            [col.fit(cell) for cell, col in zip(cells, self.columns, strict=True)], tail
        )

    def header(self, tail: str = "") -> str:
        """The headers, never cut (a column is at least as wide as its header)."""
        return self._set([c.header for c in self.columns], tail)

    def _set(self, cells: Sequence[str], tail: str) -> str:
        padded = [
            _pad(cell, width, col.align)
            for cell, col, width in zip(cells, self.columns, self.widths, strict=True)
        ]
        return self.gap.join([*padded, tail] if tail else padded).rstrip()


def layout(columns: Sequence[Column], rows: Iterable[Sequence[str]], *, gap: str = GAP) -> Layout:
    """Size ``columns`` to their headers and to every row's (fitted) cells. The rows may
    include some that are only measured (a total row set later, say)."""
    widths = [len(c.header) for c in columns]
    for row in rows:
        for i, (cell, col) in enumerate(zip(row, columns, strict=True)):
            widths[i] = max(widths[i], len(col.fit(cell)))
    return Layout(tuple(columns), tuple(widths), gap)


def render(columns: Sequence[Column], rows: Sequence[Sequence[str]], *, gap: str = GAP) -> str:
    """The header and one line per row, sized to fit them all."""
    lay = layout(columns, rows, gap=gap)
    return "\n".join([lay.header(), *(lay.line(row) for row in rows)])


def _pad(cell: str, width: int, align: Align) -> str:
    match align:
        case "left":
            return cell.ljust(width)
        case "right":
            return cell.rjust(width)
        case _:
            assert_never(align)
