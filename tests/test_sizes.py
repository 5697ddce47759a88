"""Size limits, held by a test: no module in ``bot/`` over 600 lines, no class over 300, no
function over 80 (issue 18). Past those sizes a file stops saying what it holds and a change
has to read far more than it touches. The simulator (``bot/sim/``) is not the bot and is
left out; there is no allow-list, so a new offender fails here by name.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "bot"
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 300
MAX_FUNCTION_LINES = 80


def _modules() -> list[Path]:
    return [p for p in sorted(ROOT.rglob("*.py")) if (ROOT / "sim") not in p.parents]


def _span(node: ast.stmt) -> int:
    # From the def/class line to the last line of the body (decorators not counted).
    assert node.end_lineno is not None
    return node.end_lineno - node.lineno + 1


def offenders(path: Path, name: str) -> list[str]:
    source = path.read_text()
    found = []
    lines = len(source.splitlines())
    if lines > MAX_MODULE_LINES:
        found.append(f"{name}: module has {lines} lines (max {MAX_MODULE_LINES})")
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.ClassDef) and _span(node) > MAX_CLASS_LINES:
            found.append(
                f"{name}: class {node.name} has {_span(node)} lines (max {MAX_CLASS_LINES})"
            )
        elif (
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and _span(node) > MAX_FUNCTION_LINES
        ):
            found.append(
                f"{name}: function {node.name} has {_span(node)} lines (max {MAX_FUNCTION_LINES})"
            )
    return found


def test_the_walk_sees_the_bot_and_not_the_simulator() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in _modules()}
    assert "core/flows.py" in names and "slack/blocks.py" in names
    assert not any(n.startswith("sim/") for n in names)


def test_the_limits_catch_a_long_module_class_and_function(tmp_path: Path) -> None:
    # The check itself can fail: a file that breaks each limit by one line is named three times.
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    fn = f"def long():\n{body}\n"
    cls = "class Big:\n" + "\n".join(f"    y{i} = {i}" for i in range(MAX_CLASS_LINES)) + "\n"
    pad = "\n" * (MAX_MODULE_LINES - fn.count("\n") - cls.count("\n") + 1)
    path = tmp_path / "probe.py"
    path.write_text(fn + cls + pad)
    found = offenders(path, "probe.py")
    assert [f.split(": ", 1)[1].split(" has ")[0] for f in found] == [
        "module",
        "function long",
        "class Big",
    ]


def test_no_module_class_or_function_is_too_long() -> None:
    found = [
        line
        for path in _modules()
        for line in offenders(path, path.relative_to(ROOT.parent).as_posix())
    ]
    assert found == [], "\n".join(found)
