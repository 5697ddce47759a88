"""The layers of the package, held by a test: an arrow only points down.

core is pure (no I/O libraries, nothing above it); hosts, audit and engine sit on
core; slack and cli are two front ends of the engine and never import each other;
the simulated host imports nothing of the bot (it runs on the "GPU host" side).
``bot/__main__.py`` is the one place that picks a front end.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import bot.audit

ROOT = Path(__file__).resolve().parents[1] / "bot"

# What each layer may import from the bot (besides itself).
ALLOWED: dict[str, set[str]] = {
    "core": {"bot.errors", "bot.settings"},
    "hosts": {"bot.core", "bot.errors", "bot.settings", "bot.retry"},
    "audit": {"bot.core", "bot.errors", "bot.settings", "bot.retry"},
    "engine": {"bot.core", "bot.hosts", "bot.audit", "bot.errors", "bot.settings", "bot.retry"},
    "slack": {
        "bot.core",
        "bot.hosts",
        "bot.audit",
        "bot.engine",
        "bot.errors",
        "bot.settings",
        "bot.logging_setup",
        "bot.retry",
    },
    "cli": {
        "bot.core",
        "bot.hosts",
        "bot.audit",
        "bot.engine",
        "bot.errors",
        "bot.settings",
        "bot.logging_setup",
        "bot.sim",
        "bot.retry",
    },
    "sim": set(),
}
# Libraries that do I/O: the pure core must not need them.
IO_LIBRARIES = {
    "asyncssh",
    "aiosqlite",
    "sqlite3",
    "aiohttp",
    "slack_bolt",
    "slack_sdk",
    "pynvml",
    "subprocess",
    "socket",
}


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def _layer_of(module: str) -> str | None:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "bot" and len(parts) > 1 else None


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_a_layer_imports_only_what_is_below_it(layer: str) -> None:
    allowed = ALLOWED[layer] | {f"bot.{layer}"}
    wrong = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        for module in _imports(path):
            target = _layer_of(module)
            if module == "bot" or (target is not None and target not in allowed):
                wrong.append(f"{path.relative_to(ROOT.parent)} imports {module}")
    assert wrong == []


def test_the_core_does_no_io() -> None:
    wrong = [
        f"{path.relative_to(ROOT.parent)} imports {module}"
        for path in sorted((ROOT / "core").rglob("*.py"))
        for module in _imports(path)
        if module.split(".")[0] in IO_LIBRARIES
    ]
    assert wrong == []


# Packages every layer shares, like the modules below: the settings (one section per
# module where a section grew its own).
SHARED_PACKAGES = {"settings"}


def test_every_module_belongs_to_a_layer() -> None:
    top = {p.stem for p in ROOT.glob("*.py")} - {"__init__", "__main__"}
    # The few modules every layer shares: the error tree, logging, and the one back-off
    # (the core, which never waits, does not need it).
    assert top == {"errors", "logging_setup", "retry"}
    assert {p.name for p in ROOT.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(
        ALLOWED
    ) | SHARED_PACKAGES


def test_the_settings_import_only_the_error_tree() -> None:
    wrong = [
        f"{path.relative_to(ROOT.parent)} imports {module}"
        for path in sorted((ROOT / "settings").rglob("*.py"))
        for module in _imports(path)
        if _layer_of(module) not in (None, "bot.errors", "bot.settings") or module == "bot"
    ]
    assert wrong == []


def test_the_audit_package_exports_what_it_names() -> None:
    # httpx's exported-members test: __all__ is exact and every name resolves.
    assert len(set(bot.audit.__all__)) == len(bot.audit.__all__)
    for name in bot.audit.__all__:
        assert getattr(bot.audit, name) is not None, name
    public = {n for n in vars(bot.audit) if not n.startswith("_")}
    modules = {n for n, v in vars(bot.audit).items() if type(v) is type(bot)}
    assert public - modules - {"annotations"} == set(bot.audit.__all__)
