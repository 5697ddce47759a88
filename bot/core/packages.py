"""A venv's packages: uv's freeze and install reports parsed, compared and described.

Pure. What it reads is what uv 0.13 prints (tests/samples, captured with uv 0.13.9):

* ``uv pip freeze`` writes one requirement per line on **stdout** (``name==version``,
  ``name @ url``, ``-e path``); its ``Using Python ...`` line goes to stderr.
* ``uv pip install`` and its ``--dry-run`` write the change on **stderr**, one package a
  line: `` - name==old`` (uninstalled), `` + name==new`` (installed) and, for a package
  reinstalled at the same version (``--reinstall``/``--force-reinstall``),
  `` ~ name==version``. A package that moves has a ``-`` and a ``+`` line; a new one only
  a ``+``. ``Downloading name (320.8MiB)`` says what a real install fetches.

A change of torch, a CUDA wheel (``nvidia-*``), flashinfer, triton or transformers is what
turns a vLLM upgrade into a different CUDA stack, so those are *highlighted* wherever a
change is shown.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version


class EnvKind(StrEnum):
    """What a recorded package set is (the audit log's ``environments.kind``)."""

    PREVIEW = "preview"  # the dry run at request time, shown on the approval card
    PLANNED = "planned"  # the dry run at preflight, just before the change
    SNAPSHOT = "snapshot"  # the whole environment before anything changed
    INSTALLED = "installed"  # what the install really changed (the freeze afterwards)
    RESTORED = "restored"  # after a rollback: how the freeze compares with the snapshot


class Restoration(StrEnum):
    """After a rollback, how a host's environment compares with the snapshot taken before
    the run (a ``restored`` record): whether the install's changes were undone."""

    EQUALS_SNAPSHOT = "equals_snapshot"  # every package as it was: the changes are undone
    DIFFERS_FROM_SNAPSHOT = "differs_from_snapshot"
    UNKNOWN = "unknown"  # the freeze could not be read after the rollback

    @classmethod
    def of(cls, data: Mapping[str, object]) -> Restoration:
        """From a ``restored`` record's data: a ``PackageDiff`` against the snapshot, or
        only a note when the freeze could not be read."""
        if "changes" not in data:
            return cls.UNKNOWN
        return cls.DIFFERS_FROM_SNAPSHOT if data["changes"] else cls.EQUALS_SNAPSHOT


# Names whose change approvers must not miss (canonical names; prefixes end with "-"
# or match the start of the name).
_HIGHLIGHT_NAMES = frozenset({"torch", "torchvision", "torchaudio", "triton", "transformers",
                              "vllm", "xformers"})
_HIGHLIGHT_PREFIXES = ("nvidia-", "flashinfer", "cuda-", "cupy-")

_CHANGE_LINE = re.compile(r"^ ([-+~]) (?P<req>\S.*)$")
_DOWNLOADING = re.compile(r"^Downloading (?P<name>\S+) \((?P<size>[0-9.]+)(?P<unit>[KMG]i?B)\)$")
_UNITS = {"KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "KB": 1000, "MB": 1000**2, "GB": 1000**3}


def rank(name: str) -> int:
    """Where a change is listed: torch and vllm first, the rest of the CUDA stack next,
    everything else after (0, 1, 2)."""
    n = canonicalize_name(name)
    return 0 if n in ("torch", "vllm") else 1 if highlighted(n) else 2


def highlighted(name: str) -> bool:
    """Whether a change of this package changes the CUDA/torch stack under vLLM."""
    n = canonicalize_name(name)
    return n in _HIGHLIGHT_NAMES or n.startswith(_HIGHLIGHT_PREFIXES) or "cuda" in n


@dataclass(frozen=True, slots=True)
class Change:
    """One package whose version changes: ``before`` None = new, ``after`` None = removed."""

    name: str
    before: str | None
    after: str | None

    @property
    def highlighted(self) -> bool:
        return highlighted(self.name)

    def describe(self) -> str:
        """``torch 2.13.0 → 2.14.0`` / ``orjson (new) 3.13.0`` / ``foo 1.0 (removed)``."""
        if self.before is None:
            return f"{self.name} (new) {self.after or ''}".rstrip()
        if self.after is None:
            return f"{self.name} {self.before}".rstrip() + " (removed)"
        return f"{self.name} {self.before} → {self.after}"

    def to_json(self) -> dict[str, str | None]:
        return {"name": self.name, "before": self.before, "after": self.after}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Change:
        def opt(key: str) -> str | None:
            value = data.get(key)
            return None if value is None else str(value)
        return cls(str(data["name"]), opt("before"), opt("after"))


@dataclass(frozen=True, slots=True)
class PackageDiff:
    """What an install changes (or changed): the moved packages, highlighted first, and
    how many packages of the environment stay as they are (None: not known)."""

    changes: tuple[Change, ...]
    unchanged: int | None = None

    @property
    def highlights(self) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if c.highlighted)

    def lines(self, limit: int | None = None) -> list[str]:
        """One line per change, highlighted ones first (marked ``!``), then the count of
        unchanged packages; at most ``limit`` change lines, then how many more."""
        ordered = sorted(self.changes, key=lambda c: (rank(c.name), c.name))
        shown = ordered if limit is None else ordered[:limit]
        out = [f"{'!' if c.highlighted else ' '} {c.describe()}" for c in shown]
        if len(ordered) > len(shown):
            out.append(f"  … and {len(ordered) - len(shown)} more")
        if not self.changes:
            out.append("  no package changes version")
        if self.unchanged is not None:
            noun = "package" if self.unchanged == 1 else "packages"
            out.append(f"  {self.unchanged} other {noun} unchanged")
        return out

    def headline(self) -> str:
        """A short sentence: ``torch 2.13.0 → 2.14.0, vllm 0.32.0 → 0.33.0 and 8 more``."""
        if not self.changes:
            return "no package changes version"
        ordered = sorted(self.highlights or self.changes, key=lambda c: (rank(c.name), c.name))
        first = [c.describe() for c in ordered[:3]]
        more = len(self.changes) - len(first)
        return ", ".join(first) + (f" and {more} more" if more > 0 else "")

    def to_json(self) -> dict[str, object]:
        return {"changes": [c.to_json() for c in self.changes], "unchanged": self.unchanged}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> PackageDiff:
        raw = data.get("changes") or []
        assert isinstance(raw, list)
        unchanged = data.get("unchanged")
        return cls(tuple(Change.from_json(c) for c in raw),
                   int(unchanged) if isinstance(unchanged, int) else None)


def _pinned(requirement: str) -> tuple[str, str] | None:
    """(canonical name, version) of ``name==version``; None for anything else."""
    try:
        req = Requirement(requirement.strip())
    except InvalidRequirement:
        return None
    specs = list(req.specifier)
    if req.url is not None or len(specs) != 1 or specs[0].operator not in ("==", "==="):
        return None
    return canonicalize_name(req.name), specs[0].version


def parse_install_set(text: str) -> dict[str, str]:
    """Every package an install (or its dry run) installs, at the version it installs:
    its `` + `` and `` ~ `` lines (with ``--force-reinstall``, the whole resolution). What
    a prefetch must have in the cache for the install to download nothing."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _CHANGE_LINE.match(line.rstrip())
        pinned = _pinned(m["req"]) if m is not None and m.group(1) in "+~" else None
        if pinned is not None:
            out[pinned[0]] = pinned[1]
    return out


def parse_install_changes(text: str) -> tuple[Change, ...]:
    """The packages whose version an install (or its dry run) changes, from uv's
    `` - ``/`` + `` lines (a `` ~ `` reinstall at the same version is no change), in the
    order uv printed them."""
    removed: dict[str, str] = {}
    added: dict[str, str] = {}
    order: list[str] = []
    for line in text.splitlines():
        m = _CHANGE_LINE.match(line.rstrip())
        if m is None:
            continue
        pinned = _pinned(m["req"])
        if pinned is None:
            continue
        name, version = pinned
        if name not in order:
            order.append(name)
        if m.group(1) == "-":
            removed[name] = version
        elif m.group(1) == "+":
            added[name] = version
        else:  # "~": reinstalled as it was
            removed.setdefault(name, version)
            added.setdefault(name, version)
    return tuple(Change(n, removed.get(n), added.get(n)) for n in order
                 if not _same(removed.get(n), added.get(n)))


def _same(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return a is b
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def downloaded_bytes(text: str) -> int | None:
    """What an install downloaded, from its ``Downloading name (SIZE)`` lines (uv prints
    them for wheels of a few MiB and more); None when it printed none."""
    total, seen = 0.0, False
    for line in text.splitlines():
        m = _DOWNLOADING.match(line.strip())
        if m is not None:
            seen = True
            total += float(m["size"]) * _UNITS[m["unit"]]
    return round(total) if seen else None


@dataclass(frozen=True, slots=True)
class Freeze:
    """``uv pip freeze``'s output: the text as the host printed it (what a rollback
    syncs to) and the pinned versions by canonical name."""

    text: str
    versions: Mapping[str, str]
    # Lines that are no ``name==version`` pin (``-e``, ``name @ url``): kept in ``text``,
    # compared as text.
    others: tuple[str, ...] = ()

    @property
    def count(self) -> int:
        return len(self.versions) + len(self.others)

    @property
    def digest(self) -> str:
        """SHA-256 of the text: the snapshot's name on the host and in the audit log."""
        return hashlib.sha256(self.text.encode()).hexdigest()

    def version_of(self, name: str) -> str | None:
        return self.versions.get(canonicalize_name(name))

    def applied(self, changes: Iterable[Change]) -> Freeze:
        """The pinned set an install with these changes leaves (what a prefetch fetches)."""
        versions = dict(self.versions)
        for c in changes:
            key = canonicalize_name(c.name)
            if c.after is None:
                versions.pop(key, None)
            else:
                versions[key] = c.after
        text = "".join(f"{n}=={v}\n" for n, v in sorted(versions.items()))
        return Freeze(text, versions, self.others)

    def requirements(self) -> str:
        """The pins alone, one per line (local and URL entries have nothing to fetch)."""
        return "".join(f"{n}=={v}\n" for n, v in sorted(self.versions.items()))


def parse_freeze(stdout: str) -> Freeze:
    """``uv pip freeze``'s stdout. Blank lines and comments are skipped; a line that is
    no pin is kept as it is (see ``Freeze.others``)."""
    versions: dict[str, str] = {}
    others: list[str] = []
    lines: list[str] = []
    for raw in stdout.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        lines.append(line)
        pinned = _pinned(line)
        if pinned is None:
            others.append(line)
        else:
            versions[pinned[0]] = pinned[1]
    return Freeze("".join(f"{x}\n" for x in lines), versions, tuple(others))


def diff_freezes(before: Freeze, after: Freeze) -> PackageDiff:
    """What changed from ``before`` to ``after``: every pin whose version differs, was
    added or removed (non-pin lines count as removed/added text), and how many stayed."""
    changes: list[Change] = []
    for name in sorted(set(before.versions) | set(after.versions)):
        old, new = before.versions.get(name), after.versions.get(name)
        if not _same(old, new):
            changes.append(Change(name, old, new))
    # A local or URL entry has no version: the entry itself is what appears or goes.
    changes += [Change(line, "", None) for line in before.others if line not in after.others]
    changes += [Change(line, None, "") for line in after.others if line not in before.others]
    unchanged = sum(1 for n, v in before.versions.items() if _same(v, after.versions.get(n)))
    unchanged += sum(1 for line in before.others if line in after.others)
    return PackageDiff(tuple(changes), unchanged)


def planned_diff(before: Freeze, changes: Iterable[Change]) -> PackageDiff:
    """A dry run's changes against the environment they apply to, with its unchanged count."""
    moved = tuple(changes)
    names = {canonicalize_name(c.name) for c in moved}
    return PackageDiff(moved, sum(1 for n in before.versions if n not in names)
                       + len(before.others))


_REPORT_TITLES = {
    EnvKind.PREVIEW: "Package changes (dry run at request time)",
    EnvKind.PLANNED: "Package changes planned (dry run at preflight)",
    EnvKind.INSTALLED: "Package changes the install made",
    EnvKind.RESTORED: "Environment after the rollback",
}


def change_report(kind: EnvKind, diff: PackageDiff | None, note: str = "",
                  limit: int | None = None) -> str | None:
    """A package set as the thread and the terminal show it; None for a snapshot (the
    whole freeze: kept in the audit log and on the host, not posted)."""
    title = _REPORT_TITLES.get(kind)
    if title is None:
        return None
    if diff is None:
        return f"{title}: unknown ({note or 'not read'})"
    if kind == EnvKind.RESTORED:
        if not diff.changes:
            return f"{title}: equals the snapshot, every package as it was"
        return "\n".join([f"{title}: DIFFERS from the snapshot:", *diff.lines(limit)])
    return "\n".join([f"{title}:", *diff.lines(limit)])
