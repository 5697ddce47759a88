"""bot.core.table: the one fixed-width table renderer."""

from __future__ import annotations

from bot.core.table import Column, cut, layout, render


def test_columns_are_as_wide_as_their_widest_cell_header_included() -> None:
    cols = (Column("ID"), Column("NAME"), Column("MiB", "right"))
    assert render(cols, [("1", "a", "5"), ("12345", "bc", "100")]).splitlines() == [
        "ID     NAME  MiB",
        "1      a       5",
        "12345  bc    100",
    ]


def test_no_line_ends_in_a_space() -> None:
    cols = (Column("A"), Column("LONG HEADER"))
    text = render(cols, [("x", ""), ("", "")])
    assert text.split("\n") == ["A  LONG HEADER", "x", ""]
    assert all(line == line.rstrip() for line in text.split("\n"))


def test_a_cell_past_its_max_width_is_cut_with_an_ellipsis_and_the_header_is_not() -> None:
    cols = (Column("SERVICE", max_width=5), Column("X"))
    assert render(cols, [("abcdefgh", "1"), ("abc", "2")]).splitlines() == [
        "SERVICE  X",
        "abcd…    1",
        "abc      2",
    ]
    assert render((Column("S", max_width=5),), [("abcdefgh",)]).splitlines() == ["S", "abcd…"]


def test_cut() -> None:
    assert cut("abc", 3) == "abc"
    assert cut("abcd", 3) == "ab…"
    assert cut("abcd", 0) == "…"


def test_a_free_last_column_starts_after_the_fixed_ones_and_gets_the_room_left() -> None:
    cols = (Column("GPU", "right"), Column("NAME"))
    lay = layout(cols, [("0", "H100"), ("10", "B200 SXM")])
    assert lay.widths == (3, 8)
    assert lay.tail_at == 3 + 2 + 8 + 2
    assert lay.room(100) == 100 - lay.tail_at
    assert lay.header("PROCESSES") == "GPU  NAME      PROCESSES"
    assert lay.line(("0", "H100"), "1234 vllm") == "  0  H100      1234 vllm"
    assert lay.line(("", ""), "5678 python") == "               5678 python"
    assert lay.line(("10", "B200 SXM")) == " 10  B200 SXM"
    # Rows measured but set later (a total) count toward the widths too.
    assert layout(cols, [("0", "H100"), ("", "total of all")]).widths == (3, 12)


def test_no_rows_is_just_the_header() -> None:
    assert render((Column("A"), Column("B")), []) == "A  B"
