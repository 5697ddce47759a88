"""Side-by-side releases (issue 20, item 3), the pure parts: what the host's listing
(``bot.core.remote_releases.RELEASES_LIST``) says, which release is live, and which ones a prune
removes. The venv's path is a symlink into ``<venv>.releases``; each release a venv of
its own, named ``<version>-<sha>`` (``bot.core.remote_releases.release_name``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import PurePosixPath

from bot.core import remote_releases
from bot.settings import ServiceSettings


@dataclass(frozen=True, slots=True)
class Release:
    name: str
    built: float  # when its build ended (seconds since the epoch)

    @property
    def version(self) -> str:
        """The version part of the name (``0.16.0`` of ``0.16.0-0123456789ab``)."""
        head, sep, _ = self.name.rpartition("-")
        return head if sep else self.name


@dataclass(frozen=True, slots=True)
class Releases:
    """The listing: the link's target as it reads (``target``), the live release's name
    when that target is a release of the releases directory (None: the layout is not
    side-by-side, or the link points elsewhere), and every complete release, oldest
    first."""

    target: str
    live: str | None
    releases: tuple[Release, ...]

    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.releases)


def release_of(target: str, venv_dir: str) -> str | None:
    """The release a link's target (as ``readlink`` prints it) names, or None when it is
    no release of ``<venv_dir>.releases``. A relative target is relative to the link's
    own directory."""
    resolved = PurePosixPath(venv_dir).parent / target
    rels = PurePosixPath(f"{venv_dir}.releases")
    return resolved.name if resolved.parent == rels and resolved.name else None


def parse_releases(text: str, venv_dir: str) -> Releases | None:
    """The listing's ``live <target>`` and ``release <mtime> <dir>`` lines; None without
    the ``live`` line (the script failed before it)."""
    rels = PurePosixPath(f"{venv_dir}.releases")
    target: str | None = None
    found: list[Release] = []
    for line in text.splitlines():
        if line.startswith(remote_releases.LIVE_PREFIX) and target is None:
            target = line[len(remote_releases.LIVE_PREFIX) :]
        elif line.startswith(remote_releases.RELEASE_PREFIX):
            stamp, _, where = line[len(remote_releases.RELEASE_PREFIX) :].partition(" ")
            path = PurePosixPath(where)
            try:
                built = float(stamp)
            except ValueError:
                continue
            if path.parent == rels and path.name:
                found.append(Release(path.name, built))
    if target is None:
        return None
    found.sort(key=lambda r: (r.built, r.name))
    return Releases(target, release_of(target, venv_dir), tuple(found))


def layout_refusal(svc: ServiceSettings, layout: Releases | None, why: str) -> str | None:
    """Why ``venv_dir`` is not a side-by-side layout (None: it is)."""
    convert = "convert it first (README: side-by-side releases)"
    if layout is None:
        return f"{svc.venv_dir} is not a side-by-side layout ({why}); {convert}"
    if layout.live is None:
        return (
            f"{svc.venv_dir} points at {layout.target}, not at a release in "
            f"{svc.releases_dir}; {convert}"
        )
    if layout.live not in layout.names():
        return (
            f"{svc.venv_dir} points at {layout.target}, which is not a complete release "
            f"(no {remote_releases.RELEASE_MARK} in it); {convert}"
        )
    return None


# ---- the switch history and a rollback's target -----------------------------------------


class SwitchKind(StrEnum):
    """Why the bot pointed the link at a release: a run's switch to the release it deploys
    (a redeploy's new one, a rollback by hand's target), or the switch back to the release
    that was live when that one failed to start, turn ready or last its watch window."""

    SWITCH = "switch"
    SWITCH_BACK = "switch_back"


@dataclass(frozen=True, slots=True)
class Switch:
    """One switch of one host's link, as the audit log keeps it (oldest first):
    ``before`` the release it pointed at (None: no release of the releases directory),
    ``after`` the release it points at since."""

    before: str | None
    after: str
    run_id: int
    kind: SwitchKind


@dataclass(frozen=True, slots=True)
class Target:
    """Where a rollback by hand goes, and why that release (the plan says both)."""

    name: str
    why: str


def _came_to(s: Switch, live: str) -> bool:
    """Whether ``s`` made ``live`` the live release, from another one (a redeploy of the
    same pinned set switches a release to itself)."""
    return s.kind == SwitchKind.SWITCH and s.after == live and s.before != live


def failed_releases(history: Sequence[Switch]) -> frozenset[str]:
    """The releases the history last saw switched away from because they failed (a
    switch back): the one a failed redeploy keeps for a look. A later switch to one, or
    away from it as the live release, clears it."""
    failed: set[str] = set()
    for s in history:
        if s.kind == SwitchKind.SWITCH_BACK:
            if s.before is not None:
                failed.add(s.before)
        elif s.before is not None:
            failed.discard(s.before)
        failed.discard(s.after)
    return frozenset(failed)


def rollback_target(layout: Releases, history: Sequence[Switch], unread: str = "") -> Target | str:
    """Where a rollback by hand of this host goes, or why there is nowhere (a refusal).

    The release live before the live one: the ``before`` of the last switch *to* the
    live release (a switch back does not count: it returned to a release already live,
    and its ``before`` is the failed one), when that release is still complete here.
    Else the newest complete release built before the live one (by the build's time,
    never a newer one), that the history does not say failed. ``unread``: why the
    history could not be read (it is then taken as empty)."""
    live = layout.live
    names = layout.names()
    if live is None or live not in names:
        return "no live release"
    last = next((s for s in reversed(history) if _came_to(s, live)), None)
    if last is not None and last.before is not None and last.before in names:
        return Target(
            last.before,
            f"the release live before this one, switched away from by run #{last.run_id}",
        )
    if unread:
        lacking = f"the switch history cannot be read ({unread})"
    elif last is None:
        lacking = "no switch to the live release recorded"
    elif last.before is None:
        lacking = f"run #{last.run_id} switched to it from no release"
    else:
        lacking = (
            f"{last.before}, live before this one until run #{last.run_id}, is no longer a "
            "complete release here"
        )
    failed = failed_releases(history)
    older = [r.name for r in layout.releases[: names.index(live)] if r.name not in failed]
    if older:
        return Target(older[-1], f"{lacking}: the newest release built before the live one")
    return f"{lacking}, and no other complete release was built before the live one"


def to_prune(releases: Releases, keep: int, protect: tuple[str | None, ...]) -> tuple[str, ...]:
    """The releases a prune removes so that ``keep`` are left: never the live one nor any
    in ``protect`` (the one this run switched away from, a rollback's way back), then
    the newest others until ``keep`` are kept."""
    kept = {n for n in (releases.live, *protect) if n is not None}
    for r in reversed(releases.releases):
        if len(kept) >= keep:
            break
        kept.add(r.name)
    return tuple(r.name for r in releases.releases if r.name not in kept)


def render_releases(host: str, layout: Releases | None, error: str | None) -> str:
    """One host's releases as ``python -m bot releases`` prints them, newest first: the
    version, when its build ended (UTC), and which one is live."""
    if layout is None:
        return f"== {host}: {error or 'no listing'}"
    head = f"== {host}: live {layout.live or f'(not a release: {layout.target})'}"
    rows = [
        f"  {'*' if r.name == layout.live else ' '} {r.version:<32} "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(r.built))} UTC  {r.name}"
        + ("  (live)" if r.name == layout.live else "")
        for r in reversed(layout.releases)
    ]
    return "\n".join([head, *(rows or ["  (no complete release)"])])
