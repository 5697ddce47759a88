"""A venv's packages: uv's freeze and install reports parsed, compared and described.

Pure. What it reads is what uv 0.13 prints (tests/samples, captured with uv 0.13.9):

* ``uv pip freeze`` writes one requirement per line on **stdout** (``name==version``,
  ``name @ url``, ``-e path``); its ``Using Python ...`` line goes to stderr.
* ``uv pip install`` and its ``--dry-run`` write the change on **stderr**, one package a
  line: `` - name==old`` (uninstalled), `` + name==new`` (installed) and, for a package
  reinstalled at the same version (``--reinstall``/``--force-reinstall``),
  `` ~ name==version``. A package that moves has a ``-`` and a ``+`` line; a new one only
  a ``+``. ``Downloading name (320.8MiB)`` says what a real install fetches.
* A package from a direct URL or a local wheel reads `` + name==version (from URL)``
  (``https://...``, ``file:///...whl``), and in a dry run that has not fetched it yet
  `` + name @ URL`` (no version: a wheel's file name says it). ``parse_entry`` reads all
  three; the freeze lists such a package as ``name @ URL``.
* A venv holding two dist-infos of one package (an interrupted upgrade, a copied
  directory) makes the freeze print both (``pip==21.3.1`` and ``pip==22.1.1``); ``uv pip
  sync`` of that refuses to resolve ("you require pip==21.3.1 and pip==22.1.1"), so such
  a snapshot cannot be restored (``Freeze.duplicates``).

A change of torch, a CUDA wheel (``nvidia-*``), flashinfer, triton or transformers is what
turns a vLLM upgrade into a different CUDA stack, so those are *highlighted* wherever a
change is shown, with the CUDA build of the torch the environment ends up with
(``bot.core.cuda.resolved_build``: the index may resolve PyPI's CUDA 13 default or a
``+cu129`` build) on a line of its own.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from urllib.parse import unquote, urlsplit

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from bot.core.cuda import resolved_build
from bot.core.versions import same_build


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
_HIGHLIGHT_NAMES = frozenset(
    {"torch", "torchvision", "torchaudio", "triton", "transformers", "vllm", "xformers"}
)
_HIGHLIGHT_PREFIXES = ("nvidia-", "flashinfer", "cuda-", "cupy-")

_CHANGE_LINE = re.compile(r"^ ([-+~]) (?P<req>\S.*)$")
# `` + vllm==0.11.0 (from https://...whl)``: where a direct-URL or local wheel came from.
_FROM = re.compile(r"(?P<req>.+?) \(from (?P<url>[A-Za-z][A-Za-z0-9+.-]*:\S+)\)")
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
    """One package whose version changes: ``before`` None = new, ``after`` None = removed.
    ``before_url``/``after_url``: the direct URL (or local file) it came or comes from,
    when uv said one; a change of that alone (the same version from another source, as
    ``--force-reinstall`` does to a wheel installed from a URL) is a change too, and a
    version uv did not say (`` + name @ URL`` of a source URL) is ""."""

    name: str
    before: str | None
    after: str | None
    before_url: str | None = None
    after_url: str | None = None

    @property
    def highlighted(self) -> bool:
        return highlighted(self.name)

    def describe(self) -> str:
        """``torch 2.13.0 → 2.14.0`` / ``orjson (new) 3.13.0`` / ``foo 1.0 (removed)``;
        the source too where the version alone does not show the change."""
        same = self.before == self.after

        def side(version: str | None, url: str | None) -> str:
            # The source only where the version alone does not show the change.
            if (version and not same) or not (same or url):
                return version or ""
            return f"{version or ''} (from {url or 'the index'})".strip()

        before, after = side(self.before, self.before_url), side(self.after, self.after_url)
        if self.before is None:
            return f"{self.name} (new) {after}".rstrip()
        if self.after is None:
            return f"{self.name} {before}".rstrip() + " (removed)"
        return f"{self.name} {before} → {after}"

    def to_json(self) -> dict[str, str | None]:
        out = {"name": self.name, "before": self.before, "after": self.after}
        out |= {
            k: v
            for k, v in (("before_url", self.before_url), ("after_url", self.after_url))
            if v is not None
        }
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Change:
        def opt(key: str) -> str | None:
            value = data.get(key)
            return None if value is None else str(value)

        return cls(
            str(data["name"]), opt("before"), opt("after"), opt("before_url"), opt("after_url")
        )


@dataclass(frozen=True, slots=True)
class PackageDiff:
    """What an install changes (or changed): the moved packages, highlighted first, and
    how many packages of the environment stay as they are (None: not known)."""

    changes: tuple[Change, ...]
    unchanged: int | None = None
    # The CUDA build of the torch the environment holds after the change, as
    # ``CudaBuild.describe`` says it ("torch 2.13.0 (CUDA 13.0, from cuda-toolkit
    # 13.0.3.0)"); None where it holds no torch.
    build: str | None = None

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
        elif self.build is not None:
            out.append(f"  {BUILD_PREFIX}{self.build}")
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
        out: dict[str, object] = {
            "changes": [c.to_json() for c in self.changes],
            "unchanged": self.unchanged,
        }
        if self.build is not None:
            out["build"] = self.build
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> PackageDiff:
        raw = data.get("changes") or []
        assert isinstance(raw, list)
        unchanged, build = data.get("unchanged"), data.get("build")
        return cls(
            tuple(Change.from_json(c) for c in raw),
            int(unchanged) if isinstance(unchanged, int) else None,
            build if isinstance(build, str) else None,
        )


# The line of a change list that says which CUDA build the change leaves (the card shows
# it beside the highlighted changes).
BUILD_PREFIX = "CUDA build: "


def build_of(versions: Mapping[str, str], changes: Iterable[Change]) -> str | None:
    """The CUDA build of the torch in ``versions``, read first from what ``changes``
    install (``bot.core.cuda.resolved_build``); None without torch."""
    build = resolved_build(versions, [c.name for c in changes if c.after is not None])
    return None if build is None else build.describe()


@dataclass(frozen=True, slots=True)
class Entry:
    """One package as uv names it: ``name==version``, ``name==version (from URL)`` or
    ``name @ URL``."""

    name: str  # canonical
    version: str  # "" when uv did not say and no wheel file name does
    url: str | None = None  # the direct URL or local file it comes from

    def requirement(self) -> str:
        """The line of a requirements file that gets exactly this package back: its URL
        when it came from one (an index need not serve that build at all), else its pin."""
        return (
            f"{self.name} @ {self.url}"
            if self.url is not None
            else (f"{self.name}=={self.version}")
        )


def _wheel_version(url: str, name: str) -> str:
    """The version in a wheel URL's file name (``six-1.17.0-py2.py3-none-any.whl``);
    "" for anything else (an sdist, a git URL, another package's wheel)."""
    filename = unquote(urlsplit(url).path.rsplit("/", 1)[-1])
    try:
        wheel_name, version, _, _ = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return ""
    return str(version) if wheel_name == name else ""


# A redeploy parses the same few hundred requirement lines several times (the freeze
# before, the dry run, the install, the freeze after); packaging's parser costs ~30 us a
# line. Entry is frozen, so a remembered one can be shared; the bound keeps memory bounded.
@functools.lru_cache(maxsize=4096)
def parse_entry(text: str) -> Entry | None:
    """A package as an install report or a freeze names it; None for anything else
    (a range, ``-e path``, a line that is no requirement)."""
    text = text.strip()
    m = _FROM.fullmatch(text)
    came_from = m["url"] if m is not None else None
    try:
        req = Requirement(m["req"] if m is not None else text)
    except InvalidRequirement:
        return None
    name = canonicalize_name(req.name)
    if req.url is not None:
        return Entry(name, _wheel_version(req.url, name), req.url) if came_from is None else None
    specs = list(req.specifier)
    if len(specs) != 1 or specs[0].operator not in ("==", "==="):
        return None
    return Entry(name, specs[0].version, came_from)


def _report(text: str) -> Iterable[tuple[str, Entry]]:
    """Each `` - ``/`` + ``/`` ~ `` line of an install report: (its sign, the package)."""
    for line in text.splitlines():
        m = _CHANGE_LINE.match(line.rstrip())
        entry = parse_entry(m["req"]) if m is not None else None
        if m is not None and entry is not None:
            yield m.group(1), entry


def parse_install_set(text: str) -> dict[str, str]:
    """Every package an install (or its dry run) installs, as the requirement that gets
    exactly it (``name==version``, or ``name @ URL`` for one from a URL or a local wheel):
    its `` + `` and `` ~ `` lines (with ``--force-reinstall``, the whole resolution). What
    a prefetch must have in the cache for the install to download nothing."""
    return {e.name: e.requirement() for sign, e in _report(text) if sign in "+~"}


def parse_install_changes(text: str) -> tuple[Change, ...]:
    """The packages whose version (or source URL) an install (or its dry run) changes,
    from uv's `` - ``/`` + `` lines (a `` ~ `` reinstall as it was is no change), in the
    order uv printed them."""
    removed: dict[str, Entry] = {}
    added: dict[str, Entry] = {}
    order: list[str] = []
    for sign, entry in _report(text):
        if entry.name not in order:
            order.append(entry.name)
        if sign == "-":
            removed[entry.name] = entry
        elif sign == "+":
            added[entry.name] = entry
        else:  # "~": reinstalled as it was
            removed.setdefault(entry.name, entry)
            added.setdefault(entry.name, entry)
    out = []
    for n in order:
        old, new = removed.get(n), added.get(n)
        if (
            old is not None
            and new is not None
            and old.url == new.url
            and _same(old.version, new.version)
        ):
            continue
        out.append(
            Change(
                n,
                None if old is None else old.version,
                None if new is None else new.version,
                None if old is None else old.url,
                None if new is None else new.url,
            )
        )
    return tuple(out)


def _same(a: str | None, b: str | None) -> bool:
    """The same build: a diff shows ``0.11.0`` becoming ``0.11.0+cu129`` (another wheel)."""
    if a is None or b is None:
        return a is b
    return same_build(a, b)


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
    # A package listed more than once (two dist-infos of it in the venv): its every
    # version (``@ URL`` for a URL entry), in the freeze's order. ``versions`` keeps one.
    duplicates: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return len(self.versions) + len(self.others)

    @property
    def digest(self) -> str:
        """SHA-256 of the text: the snapshot's name on the host and in the audit log."""
        return hashlib.sha256(self.text.encode()).hexdigest()

    def version_of(self, name: str) -> str | None:
        return self.versions.get(canonicalize_name(name))

    def unrestorable(self) -> str | None:
        """Why ``uv pip sync`` of this text cannot make the venv it again; None when it
        can. A package listed twice cannot be required twice ("Because you require
        pip==21.3.1 and pip==22.1.1, we can conclude that your requirements are
        unsatisfiable", uv 0.13.9)."""
        if not self.duplicates:
            return None
        words = {2: "two", 3: "three"}
        return "; ".join(
            f"{words.get(len(vs), str(len(vs)))} versions of {name} installed ({', '.join(vs)})"
            for name, vs in sorted(self.duplicates.items())
        )

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
    seen: dict[str, list[str]] = {}
    for raw in stdout.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        lines.append(line)
        entry = parse_entry(line)
        if entry is not None:
            seen.setdefault(entry.name, []).append(
                entry.version if entry.url is None else f"@ {entry.url}"
            )
        if entry is None or entry.url is not None:
            others.append(line)
        else:
            versions[entry.name] = entry.version
    # The same pin twice is satisfiable (uv resolves `pip==21.3.1` given twice); two
    # different ones are not.
    return Freeze(
        "".join(f"{x}\n" for x in lines),
        versions,
        tuple(others),
        {n: tuple(dict.fromkeys(vs)) for n, vs in seen.items() if len(set(vs)) > 1},
    )


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
    return PackageDiff(tuple(changes), unchanged, build_of(after.versions, changes))


def planned_diff(before: Freeze, changes: Iterable[Change]) -> PackageDiff:
    """A dry run's changes against the environment they apply to, with its unchanged count."""
    moved = tuple(changes)
    names = {canonicalize_name(c.name) for c in moved}
    return PackageDiff(
        moved,
        sum(1 for n in before.versions if n not in names) + len(before.others),
        build_of(before.applied(moved).versions, moved),
    )


_REPORT_TITLES = {
    EnvKind.PREVIEW: "Package changes (dry run at request time)",
    EnvKind.PLANNED: "Package changes planned (dry run at preflight)",
    EnvKind.INSTALLED: "Package changes the install made",
    EnvKind.RESTORED: "Environment after the rollback",
}


def change_report(
    kind: EnvKind, diff: PackageDiff | None, note: str = "", limit: int | None = None
) -> str | None:
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
