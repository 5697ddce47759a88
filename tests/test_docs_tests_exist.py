"""Every test docs/reliability.md names exists: a row says which test shows its fault is
handled, and a renamed or deleted test must not leave the page vouching with nothing."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def named_tests(text: str) -> list[tuple[str, str]]:
    """(file, test) for each ``tests/x.py::name`` and each ``::name`` after it on the
    same row (the row's last file)."""
    found: list[tuple[str, str]] = []
    for line in text.splitlines():
        last: str | None = None
        for path, name in re.findall(r"`(tests/[\w/]+\.py)?::(\w+)", line):
            last = path or last
            if last is not None:
                found.append((last, name))
    return found


def test_every_test_the_fault_matrix_names_exists() -> None:
    page = (ROOT / "docs" / "reliability.md").read_text()
    named = named_tests(page)
    assert len(named) > 50
    missing = []
    for path, name in named:
        source = ROOT / path
        if not source.exists() or not re.search(
            rf"^(?:async )?def {name}\(", source.read_text(), re.MULTILINE
        ):
            missing.append(f"{path}::{name}")
    assert missing == []
